//! Long sessions: `session.snapshot` events are written after root runs, a run reads the last
//! snapshot and what follows it instead of the whole journal, and what it is sent and what it
//! counts is the same as from the whole journal.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use loom_core::{Event, Message, RunStatus, event::Payload, model::ModelClient, ports::EventStore};
use loom_engine::{AgentRuntime, BeginRun, BoundTool, Engine, ModelBinding, RunRef};
use loom_journal::MemoryStore;
use loom_testkit::{CountingStore, ManualClock, RecordingModel, add_tool, scripted};
use serde_json::{Map, json};
use tokio_util::sync::CancellationToken;

fn agent(model: Arc<dyn ModelClient>) -> AgentRuntime {
    let main = ModelBinding::new("FAKE", "fake-1", model);
    let mut agent = AgentRuntime::new("demo", "Tu es un assistant.", main);
    agent.tools = vec![BoundTool::declared(Arc::new(add_tool())).unwrap()];
    agent
}

fn calc_script() -> serde_json::Value {
    json!([
        {"text": "Je calcule.", "tool_calls": [{"name": "add", "arguments": {"a": 12, "b": 7}}]},
        {"text": "Cela fait {{ tool_result }}."}
    ])
}

fn begin(message: &str) -> BeginRun {
    BeginRun {
        tenant_id: "default".into(),
        session_id: Some("s1".into()),
        run_id: None,
        user_id: None,
        metadata: Map::new(),
        message: Message::user(message),
        judges: Default::default(),
        budget: None,
        attachments: Vec::new(),
        trigger: None,
        state: Default::default(),
    }
}

async fn run(engine: &Engine, agent: &AgentRuntime, message: &str) -> (RunRef, RunStatus) {
    let run = engine.begin(agent, begin(message), &()).await.unwrap();
    let state = engine
        .drive(&run, agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    (run, state.status)
}

/// `runs` runs in one session, with snapshots every `every` events (none with `None`); returns
/// the journal, the requests the model received and what the reads of the last run returned.
async fn session(runs: usize, every: Option<u32>) -> (Vec<Event>, Arc<RecordingModel>, u64) {
    let store = Arc::new(CountingStore::new(MemoryStore::new()));
    let engine = Engine::new(store.clone(), Arc::new(ManualClock::new())).with_snapshots(every);
    let model = RecordingModel::new(scripted("fake-1", calc_script()));
    let recording = Arc::new(model);
    let agent = agent(recording.clone());
    for turn in 0..runs - 1 {
        let (_, status) = run(&engine, &agent, &format!("Question {turn}")).await;
        assert_eq!(status, RunStatus::Completed);
    }
    store.reset();
    let (_, status) = run(&engine, &agent, "La dernière").await;
    assert_eq!(status, RunStatus::Completed);
    let read = store.returned();
    let journal = store.inner.read("default", "s1", 0).await.unwrap();
    (journal, recording, read)
}

#[tokio::test]
async fn a_run_after_a_snapshot_is_sent_what_the_whole_journal_gives() {
    let (plain, plain_model, plain_read) = session(30, None).await;
    let (snapped, snapped_model, snapped_read) = session(30, Some(20)).await;
    assert!(
        !plain
            .iter()
            .any(|e| matches!(e.payload, Payload::SessionSnapshot(_)))
    );
    let snapshots: Vec<_> = snapped
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::SessionSnapshot(s) => Some(s),
            _ => None,
        })
        .collect();
    assert!(snapshots.len() >= 2, "{} snapshots", snapshots.len());
    // Every request of every run is the same, message for message.
    let plain_requests = plain_model.requests();
    let snapped_requests = snapped_model.requests();
    assert_eq!(plain_requests.len(), snapped_requests.len());
    for (a, b) in plain_requests.iter().zip(&snapped_requests) {
        assert_eq!(a.messages, b.messages);
    }
    // The last run's history holds the 29 earlier turns (4 messages each) and its request.
    assert_eq!(snapped_requests.last().unwrap().messages.len(), 29 * 4 + 3);
    // ...and it read a fraction of the journal that the run without snapshots read whole.
    assert!(
        plain_read > 10 * snapped_read,
        "{plain_read} vs {snapped_read}"
    );
    // A snapshot covers whole runs and counts what they spent.
    let last = snapshots.last().unwrap();
    let covered: Vec<&Event> = snapped.iter().filter(|e| e.seq <= last.up_to_seq).collect();
    assert!(matches!(
        covered.last().unwrap().payload,
        Payload::RunCompleted(_) | Payload::SessionSnapshot(_)
    ));
    let calls = covered
        .iter()
        .filter(|e| matches!(e.payload, Payload::ModelResponded(_)))
        .count() as u64;
    assert_eq!(last.spent.calls, calls);
}

#[tokio::test]
async fn a_snapshot_waits_for_a_run_that_has_not_closed() {
    use loom_core::tool::{Approval, FnTool, SideEffects, ToolKind, ToolOutput, ToolSpec};
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::new(store.clone(), Arc::new(ManualClock::new())).with_snapshots(Some(1));
    // A run that pauses for an approval, then closed runs after it.
    let spec = ToolSpec {
        name: "send".into(),
        description: "Sends an e-mail.".into(),
        input_schema: json!({"type": "object"}),
        kind: ToolKind::Python,
        declarations: Default::default(),
    };
    let send = FnTool::new(spec, |_, _| {
        Box::pin(async { Ok(ToolOutput::text("sent")) })
    })
    .with_declarations(loom_core::tool::ToolDeclarations {
        side_effects: SideEffects::Irreversible,
        approval: Approval::Always,
        ..Default::default()
    });
    let script = json!([
        {"text": "J'envoie.", "tool_calls": [{"name": "send", "arguments": {}}]},
        {"text": "C'est fait."}
    ]);
    let mut pausing = agent(scripted("fake-1", script));
    pausing.tools = vec![BoundTool::declared(Arc::new(send)).unwrap()];
    let recording = Arc::new(RecordingModel::new(scripted("fake-1", calc_script())));
    let calc = agent(recording.clone());
    for turn in 0..2 {
        run(&engine, &calc, &format!("Avant {turn}")).await;
    }
    let (paused, status) = run(&engine, &pausing, "Envoie le devis").await;
    assert_eq!(status, RunStatus::Paused);
    for turn in 0..3 {
        run(&engine, &calc, &format!("Après {turn}")).await;
    }
    let journal = store.read("default", "s1", 0).await.unwrap();
    let start = journal
        .iter()
        .find(|e| e.run_id == paused.run_id)
        .unwrap()
        .seq;
    let covered: Vec<u64> = journal
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::SessionSnapshot(s) => Some(s.up_to_seq),
            _ => None,
        })
        .collect();
    // Snapshots were written, and none covers the paused run's start.
    assert!(!covered.is_empty());
    assert!(
        covered.iter().all(|up_to| *up_to < start),
        "{covered:?} vs {start}"
    );
    // The last run was sent the history the whole journal gives, the paused run's part
    // included, though it began before a snapshot.
    let last = recording
        .requests()
        .into_iter()
        .find(|r| r.messages.last().unwrap().text() == "Après 2")
        .unwrap();
    let last_start = journal
        .iter()
        .position(|e| e.event_type == "run.started" && e.seq > start + 40)
        .unwrap();
    let last_start = journal
        .iter()
        .rposition(|e| e.event_type == "run.started")
        .unwrap()
        .max(last_start);
    let expected = loom_core::state::session_history(&journal[..last_start]).unwrap();
    let sent: Vec<&Message> = last.messages[..last.messages.len() - 1]
        .iter()
        .map(|message| &**message)
        .collect();
    assert_eq!(sent, expected.iter().collect::<Vec<_>>());
    // Approved, the paused run resumes from its window and completes; a snapshot can then
    // cover it.
    engine
        .settle(
            &paused,
            &pausing,
            None,
            &loom_core::approval::Decision::approved("denis"),
        )
        .await
        .unwrap();
    let state = engine
        .drive(&paused, &pausing, &(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(state.status, RunStatus::Completed);
    run(&engine, &calc, "Enfin").await;
    let journal = store.read("default", "s1", 0).await.unwrap();
    assert!(journal.iter().any(|e| matches!(
        &e.payload,
        Payload::SessionSnapshot(s) if s.up_to_seq > start
    )));
}

/// The check after a run reads nothing of a session that has not written `snapshot_every`
/// events since its last snapshot: no snapshot can be due, whatever the events say.
#[tokio::test]
async fn a_session_shorter_than_snapshot_every_is_not_read_for_a_snapshot() {
    for (every, due) in [(1000, false), (5, true)] {
        let store = Arc::new(CountingStore::new(MemoryStore::new()));
        // The run itself writes no snapshot; the check is then made with `every`.
        let plain = Engine::new(store.clone(), Arc::new(ManualClock::new())).with_snapshots(None);
        let agent = agent(scripted("fake-1", calc_script()));
        let (run, status) = run(&plain, &agent, "Question").await;
        assert_eq!(status, RunStatus::Completed);
        let written = store.inner.last_seq("default", "s1").await.unwrap();
        assert!(written > 5 && written < 1000, "{written} events");
        let engine =
            Engine::new(store.clone(), Arc::new(ManualClock::new())).with_snapshots(Some(every));
        store.reset();
        assert_eq!(
            engine.snapshot_if_due(&run).await.unwrap(),
            due,
            "every {every}"
        );
        let read = store.returned();
        if due {
            assert_eq!(read, written, "every {every}: the whole session is read");
        } else {
            assert_eq!(read, 0, "every {every}: nothing is read");
        }
    }
}
