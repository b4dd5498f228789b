//! Files attached to a run on the memory journal: the opening batch (`artifact.stored`, then
//! `message.user` with `artifact` blocks), refusals that write nothing, images sent inline to
//! vision models only (never in the journal) with a request hash that does not depend on it,
//! and vision roles offered only to a run that carries an image.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use base64::Engine as _;
use loom_core::{
    Block, BlockKind, Event, Message, Role, RunState, RunStatus,
    event::Payload,
    model::{ModelClient, ModelRequest},
    ports::{ArtifactStore, EventStore},
};
use loom_engine::{
    AgentRuntime, Attachment, AttachmentLimits, BeginRun, Engine, EngineError, ModelBinding,
    RoleContext, RoleRuntime, RunRef, request_hash,
};
use loom_journal::{MemoryArtifacts, MemoryStore};
use loom_testkit::{ManualClock, RecordingModel, scripted};
use serde_json::{Map, json};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

/// A 1×1 PNG.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0xf0,
    0x1f, 0x00, 0x05, 0x00, 0x01, 0xff, 0x89, 0x99, 0x3d, 0x1d, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
    0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

fn photo() -> Attachment {
    Attachment {
        name: "photo.png".into(),
        media_type: "image/png".into(),
        bytes: PNG.to_vec(),
    }
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn binding(id: &str, model: Arc<dyn ModelClient>, vision: bool) -> ModelBinding {
    let mut binding = ModelBinding::new(id, id.to_lowercase(), model);
    binding.vision = vision;
    binding
}

struct Setup {
    engine: Engine,
    store: Arc<MemoryStore>,
    artifacts: Arc<MemoryArtifacts>,
}

fn setup() -> Setup {
    let store = Arc::new(MemoryStore::new());
    let artifacts = Arc::new(MemoryArtifacts::new());
    let engine =
        Engine::new(store.clone(), Arc::new(ManualClock::new())).with_artifacts(artifacts.clone());
    Setup {
        engine,
        store,
        artifacts,
    }
}

fn begin(session: &str, text: &str, attachments: Vec<Attachment>) -> BeginRun {
    BeginRun {
        tenant_id: "default".into(),
        session_id: Some(session.into()),
        run_id: None,
        user_id: None,
        metadata: Map::new(),
        message: Message::user(text),
        judges: Default::default(),
        budget: None,
        attachments,
        trigger: None,
        state: Default::default(),
    }
}

async fn drive(engine: &Engine, agent: &AgentRuntime, request: BeginRun) -> (RunRef, RunState) {
    let run = engine.begin(agent, request, &()).await.unwrap();
    let state = engine
        .drive(&run, agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    (run, state)
}

async fn events(store: &MemoryStore, run: &RunRef) -> Vec<Event> {
    store
        .read(&run.tenant_id, &run.session_id, 0)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.run_id == run.run_id)
        .collect()
}

fn artifact_of(uri: &str) -> Block {
    Block::new(BlockKind::Artifact {
        uri: uri.into(),
        media_type: "image/png".into(),
        size: PNG.len() as u64,
        name: Some("photo.png".into()),
    })
}

fn inline() -> Block {
    Block::new(BlockKind::InlineData {
        media_type: "image/png".into(),
        data: base64::engine::general_purpose::STANDARD.encode(PNG),
        name: Some("photo.png".into()),
    })
}

/// The request as the journal knows it: inline images back to their references.
fn as_journaled(request: &ModelRequest, reference: &Block) -> ModelRequest {
    let mut request = request.clone();
    for message in request.messages.iter_mut().map(std::sync::Arc::make_mut) {
        for block in &mut message.blocks {
            if matches!(block.kind, BlockKind::InlineData { .. }) {
                *block = reference.clone();
            }
        }
    }
    request
}

fn responded(events: &[Event]) -> Vec<loom_core::event::ModelResponded> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ModelResponded(p) => Some(p.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn attachments_are_stored_and_referenced_in_the_opening_batch() {
    let Setup {
        engine,
        store,
        artifacts,
    } = setup();
    let model = scripted("fake", json!([{"text": "A small picture."}]));
    let agent = AgentRuntime::new("demo", "", binding("MAIN", model, false));
    let (run, state) = drive(&engine, &agent, begin("s1", "What is this?", vec![photo()])).await;
    assert_eq!(state.status, RunStatus::Completed);

    let events = events(&store, &run).await;
    let kinds: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        kinds[..4],
        [
            "run.started",
            "artifact.stored",
            "message.user",
            "run.claimed"
        ]
    );
    assert_eq!(events[1].seq + 1, events[2].seq);
    let uri = format!("artifact://default/s1/{}.png", sha256(PNG));
    let Payload::ArtifactStored(stored) = &events[1].payload else {
        panic!("artifact.stored")
    };
    assert_eq!(stored.uri, uri);
    assert_eq!(stored.origin, "attachment");
    assert_eq!(stored.media_type, "image/png");
    assert_eq!(stored.size, PNG.len() as u64);
    assert_eq!(stored.name.as_deref(), Some("photo.png"));
    assert_eq!(stored.call_id, None);
    assert_eq!(
        events[1].span_id, events[0].span_id,
        "in the run's root span"
    );
    assert_eq!(events[1].facets["origin"], "attachment");
    let Payload::MessageUser(user) = &events[2].payload else {
        panic!("message.user")
    };
    assert_eq!(
        user.message.blocks,
        [Block::text("What is this?"), artifact_of(&uri)]
    );
    // The bytes are in the artifact store, never in the journal.
    assert_eq!(artifacts.get(&uri).await.unwrap().as_deref(), Some(PNG));
    let journal: String = events.iter().map(|e| e.to_json()).collect();
    let encoded = base64::engine::general_purpose::STANDARD.encode(PNG);
    assert!(!journal.contains(&encoded));
    assert!(!journal.contains("inline_data"));
}

#[tokio::test]
async fn a_refused_attachment_writes_and_stores_nothing() {
    let Setup {
        engine,
        store,
        artifacts,
    } = setup();
    let engine = engine.with_attachment_limits(AttachmentLimits {
        max_bytes: 50,
        ..AttachmentLimits::default()
    });
    let model = scripted("fake", json!([{"text": "never"}]));
    let agent = AgentRuntime::new("demo", "", binding("MAIN", model, false));
    let refused = |request| async {
        match engine.begin(&agent, request, &()).await {
            Err(EngineError::Unusable(message)) => message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    };
    assert_eq!(
        refused(begin("s1", "Look.", vec![photo()])).await,
        "attachment 'photo.png' is 70 bytes, more than the limit of 50 bytes \
         (execution.attachments.max_bytes)"
    );
    let pdf = Attachment {
        name: "devis.pdf".into(),
        media_type: "application/pdf".into(),
        bytes: b"%PDF-1.7".to_vec(),
    };
    assert_eq!(
        refused(begin("s1", "Look.", vec![pdf])).await,
        "attachment 'devis.pdf': type application/pdf is not accepted \
         (execution.attachments.types: image/jpeg, image/png, image/gif, image/webp)"
    );
    let small = Attachment {
        bytes: b"GIF89a".to_vec(),
        media_type: "image/gif".into(),
        name: "dot.gif".into(),
    };
    assert_eq!(
        refused(begin("s1", "Look.", vec![small; 11])).await,
        "11 attachments, more than the limit of 10 (execution.attachments.max_files)"
    );
    assert!(store.read("default", "s1", 0).await.unwrap().is_empty());
    assert_eq!(artifacts.delete_session("default", "s1").await.unwrap(), 0);

    // Without an artifact store, attachments are refused too.
    let bare = Engine::new(store.clone(), Arc::new(ManualClock::new()));
    let Err(EngineError::Invalid(message)) = bare
        .begin(&agent, begin("s2", "Look.", vec![photo()]), &())
        .await
    else {
        panic!("refused")
    };
    assert_eq!(
        message,
        "attachments need an artifact store, and this engine has none"
    );
    assert!(store.read("default", "s2", 0).await.unwrap().is_empty());
}

#[tokio::test]
async fn an_existing_run_id_stores_no_attachment() {
    let Setup {
        engine, artifacts, ..
    } = setup();
    let model = scripted("fake", json!([{"text": "ok"}, {"text": "ok"}]));
    let agent = AgentRuntime::new("demo", "", binding("MAIN", model, false));
    let mut first = begin("s1", "Hi.", Vec::new());
    first.run_id = Some("r1".into());
    engine.begin(&agent, first, &()).await.unwrap();
    let mut again = begin("s1", "Look.", vec![photo()]);
    again.run_id = Some("r1".into());
    assert!(matches!(
        engine.begin(&agent, again, &()).await,
        Err(EngineError::RunExists { .. })
    ));
    assert_eq!(artifacts.delete_session("default", "s1").await.unwrap(), 0);
}

#[tokio::test]
async fn images_go_inline_to_vision_models_only_and_the_hash_ignores_it() {
    let Setup { engine, store, .. } = setup();
    let uri = format!("artifact://default/s1/{}.png", sha256(PNG));
    let reference = artifact_of(&uri);

    let seeing = Arc::new(RecordingModel::new(scripted(
        "eyes",
        json!([{"text": "A red dot."}]),
    )));
    let agent = AgentRuntime::new("demo", "", binding("EYES", seeing.clone(), true));
    let (run, state) = drive(&engine, &agent, begin("s1", "What is this?", vec![photo()])).await;
    assert_eq!(state.status, RunStatus::Completed);
    let request = &seeing.requests()[0];
    assert_eq!(
        request.messages[0].blocks,
        [Block::text("What is this?"), inline()]
    );
    let journaled = responded(&events(&store, &run).await);
    let (hash, parts) = request_hash(&as_journaled(request, &reference));
    assert_eq!(journaled[0].request_hash.as_deref(), Some(hash.as_str()));
    assert_eq!(journaled[0].request_parts, parts);
    // The state (and so the journal) keeps the reference.
    assert_eq!(state.messages[0].blocks[1], reference);

    let blind = Arc::new(RecordingModel::new(scripted(
        "blind",
        json!([{"text": "I cannot see it."}]),
    )));
    let agent = AgentRuntime::new("demo", "", binding("EYES", blind.clone(), false));
    let (run, _) = drive(&engine, &agent, begin("s2", "What is this?", vec![photo()])).await;
    let other = format!("artifact://default/s2/{}.png", sha256(PNG));
    assert_eq!(
        blind.requests()[0].messages[0].blocks,
        [Block::text("What is this?"), artifact_of(&other)]
    );
    // Same model name and content, another session: only the reference's session differs.
    let journaled = responded(&events(&store, &run).await);
    let (hash, _) = request_hash(&blind.requests()[0]);
    assert_eq!(journaled[0].request_hash.as_deref(), Some(hash.as_str()));
}

#[tokio::test]
async fn an_image_missing_from_the_store_stays_a_reference() {
    let Setup { engine, .. } = setup();
    let seeing = Arc::new(RecordingModel::new(scripted(
        "eyes",
        json!([{"text": "Nothing to see."}]),
    )));
    let agent = AgentRuntime::new("demo", "", binding("EYES", seeing.clone(), true));
    let lost = Block::new(BlockKind::Artifact {
        uri: "artifact://default/s1/0000.png".into(),
        media_type: "image/png".into(),
        size: 3,
        name: Some("lost.png".into()),
    });
    let mut request = begin("s1", "", Vec::new());
    request.message = Message {
        role: Role::User,
        blocks: vec![Block::text("And this?"), lost.clone()],
    };
    let (_, state) = drive(&engine, &agent, request).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(
        seeing.requests()[0].messages[0].blocks,
        [Block::text("And this?"), lost]
    );
}

#[tokio::test]
async fn a_vision_role_sees_the_attached_image_inline() {
    let Setup { engine, store, .. } = setup();
    let main = Arc::new(RecordingModel::new(scripted(
        "main",
        json!([
            {"text": "No image.", "without_tool": "describe"},
            {"tool_calls": [{"name": "describe", "arguments": {}}], "with_tool": "describe"},
            {"text": "Seen: {{ tool_result }}", "with_tool": "describe"}
        ]),
    )));
    let eyes = Arc::new(RecordingModel::new(scripted(
        "eyes",
        json!([{"text": "a red dot", "with_text": "- photo.png (image/png)"}]),
    )));
    let mut describe = RoleRuntime::new(
        "describe",
        "Describes the attached image.",
        "You describe images.",
        binding("EYES", eyes.clone(), true),
    );
    describe.context = vec![RoleContext::Attachments];
    let mut agent = AgentRuntime::new("demo", "", binding("MAIN", main.clone(), false));
    agent.roles = vec![describe];

    let (_, state) = drive(&engine, &agent, begin("s1", "Hello.", Vec::new())).await;
    assert_eq!(state.output_text().as_deref(), Some("No image."));
    assert!(main.requests()[0].tools.is_empty());
    assert!(eyes.requests().is_empty());

    let (run, state) = drive(&engine, &agent, begin("s2", "What is it?", vec![photo()])).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().as_deref(), Some("Seen: a red dot"));
    let offered: Vec<String> = main.requests()[1]
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(offered, ["describe"]);
    // The orchestrator cannot see: it keeps the reference; the role sees the image.
    let uri = format!("artifact://default/s2/{}.png", sha256(PNG));
    assert_eq!(main.requests()[1].messages[0].blocks[1], artifact_of(&uri));
    let role_request = &eyes.requests()[0];
    assert_eq!(role_request.messages.len(), 1);
    assert_eq!(role_request.messages[0].blocks[1], inline());
    let journaled: Vec<_> = responded(&events(&store, &run).await)
        .into_iter()
        .filter(|r| r.call_id.is_some())
        .collect();
    let (hash, _) = request_hash(&as_journaled(role_request, &artifact_of(&uri)));
    assert_eq!(journaled[0].request_hash.as_deref(), Some(hash.as_str()));
}
