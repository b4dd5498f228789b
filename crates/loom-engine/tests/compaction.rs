//! Compaction and history caps on the memory journal: a compaction journaled as a
//! `kind: compaction` run then `session.compacted`, its summary in the next run's history; a
//! summary that misses markers retried once, then refused (the originals kept); a run paused
//! for approval resumed after a compaction; history caps that cut whole turns; the summary in
//! a role's context.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use loom_core::{
    Event, Message, Role, RunState, RunStatus,
    approval::Decision,
    event::Payload,
    model::{ModelClient, ModelRequest},
    ports::EventStore,
    state::compaction::{Caps, SUMMARY_PREFIX},
    tool::{Approval, FnTool, SideEffects, ToolKind, ToolOutput, ToolSpec},
};
use loom_engine::{
    AgentRuntime, BeginRun, BoundTool, COMPACTION_SYSTEM, Compaction, Compactor, Engine,
    ModelBinding, RoleContext, RoleRuntime, RunRef,
};
use loom_journal::MemoryStore;
use loom_testkit::{ManualClock, RecordingModel, add_tool, scripted};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

const SESSION: &str = "long";
const FIRST: &str = "Devis DEV-2041 du 12/03/2026 : 1 842,50 € pour marie@exemple.fr.";

struct Setup {
    store: Arc<MemoryStore>,
    engine: Engine,
    main: Arc<RecordingModel>,
    agent: AgentRuntime,
}

/// An agent that echoes, except for a request starting with "Envoie", for which it calls
/// `send` (approval needed), and one starting with "Ajoute", for which it calls `add`.
fn setup(caps: Caps) -> Setup {
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::new(store.clone(), Arc::new(ManualClock::new())).with_history_caps(caps);
    let main = Arc::new(RecordingModel::new(scripted(
        "fake-main",
        json!([
            {"with_text": "Envoie", "text": "J'envoie.", "tool_calls": [{"name": "send", "arguments": {}}]},
            {"with_text": "Envoie", "text": "Fait : {{ tool_result }}"},
            {"with_text": "Ajoute", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]},
            {"with_text": "Ajoute", "text": "Somme : {{ tool_result }}"},
            {"without_text": "Envoie", "text": "Noté."}
        ]),
    )));
    let mut agent = AgentRuntime::new(
        "demo",
        "Tu es un assistant.",
        ModelBinding::new("FAKE", "fake-1", main.clone()),
    );
    agent.tools = vec![
        BoundTool::declared(Arc::new(send_tool())).unwrap(),
        BoundTool::declared(Arc::new(add_tool())).unwrap(),
    ];
    Setup {
        store,
        engine,
        main,
        agent,
    }
}

fn send_tool() -> FnTool {
    FnTool::new(
        ToolSpec {
            name: "send".into(),
            description: "Sends the quote.".into(),
            input_schema: json!({"type": "object"}),
            kind: ToolKind::Python,
            declarations: Default::default(),
        },
        |_, _| Box::pin(async { Ok(ToolOutput::text("sent")) }),
    )
    .with_declarations(loom_core::tool::ToolDeclarations {
        side_effects: SideEffects::Irreversible,
        approval: Approval::Always,
        ..Default::default()
    })
}

fn compactor(script: Value) -> (Compactor, Arc<RecordingModel>) {
    let model = Arc::new(RecordingModel::new(scripted("summarizer", script)));
    let compactor = Compactor::new(
        ModelBinding::new(
            "SUMMARIZER",
            "summarizer",
            model.clone() as Arc<dyn ModelClient>,
        ),
        None,
        1,
        true,
    );
    (compactor, model)
}

fn begin(text: &str) -> BeginRun {
    BeginRun {
        tenant_id: "default".into(),
        session_id: Some(SESSION.into()),
        run_id: None,
        user_id: None,
        metadata: Map::new(),
        message: Message::user(text),
        judges: Default::default(),
        budget: None,
        attachments: Vec::new(),
        trigger: None,
        state: Default::default(),
    }
}

async fn run(s: &Setup, text: &str) -> (RunRef, RunState) {
    let run = s.engine.begin(&s.agent, begin(text), &()).await.unwrap();
    let state = s
        .engine
        .drive(&run, &s.agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    (run, state)
}

async fn journal(store: &MemoryStore) -> Vec<Event> {
    store.read("default", SESSION, 0).await.unwrap()
}

fn types_of(events: &[Event], run_id: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.run_id == run_id)
        .map(|e| e.event_type.clone())
        .collect()
}

/// The texts of the last request's history and message, one per message.
fn last_request_texts(model: &RecordingModel) -> Vec<String> {
    let requests: Vec<ModelRequest> = model.requests();
    requests
        .last()
        .unwrap()
        .messages
        .iter()
        .map(|message| message.text())
        .collect()
}

#[tokio::test]
async fn a_compaction_is_journaled_and_its_summary_replaces_the_turns() {
    let s = setup(Caps::default());
    run(&s, FIRST).await;
    run(&s, "Second message.").await;
    let (third, _) = run(&s, "Third message.").await;
    let summary =
        "Quote DEV-2041 of 2026-03-12, 1842,50 €, for marie@exemple.fr; then a second message.";
    let (compactor, summarizer) = compactor(json!([{"text": summary}]));

    let outcome = s
        .engine
        .compact("default", SESSION, &compactor, Some(&third.run_id), &())
        .await
        .unwrap();

    let Compaction::Applied(compacted) = outcome else {
        panic!("expected a compaction, got {outcome:?}");
    };
    assert_eq!(compacted.summary, summary);
    assert_eq!((compacted.kept, compacted.fidelity.as_str()), (1, "ok"));
    assert!(compacted.tokens_after < compacted.tokens_before);
    // The summarizer read the two first turns, with its own system prompt and no tools.
    let request = &summarizer.requests()[0];
    assert_eq!(request.system, COMPACTION_SYSTEM);
    assert!(request.tools.is_empty());
    let asked = request.messages[0].text();
    assert!(asked.contains(&format!("User: {FIRST}")), "{asked}");
    assert!(asked.contains("User: Second message."));
    assert!(!asked.contains("Third message."), "the last turn is kept");

    // The compaction run, then the session event, in the same journal.
    let events = journal(&s.store).await;
    let run_id = compacted.run_id.clone().unwrap();
    assert_eq!(
        types_of(&events, &run_id),
        [
            "run.started",
            "message.user",
            "run.claimed",
            "step.started",
            "model.responded",
            "step.completed",
            "guard.checked",
            "run.transitioned",
            "run.completed",
            "session.compacted"
        ]
    );
    let started = events.iter().find(|e| e.run_id == run_id).unwrap();
    assert_eq!(started.agent.as_deref(), Some("_compaction"));
    match &started.payload {
        Payload::RunStarted(p) => {
            assert_eq!(p.kind, "compaction");
            assert_eq!(p.triggered_by.as_deref(), Some(third.run_id.as_str()));
        }
        other => panic!("{other:?}"),
    }
    let third_start = events
        .iter()
        .find(|e| e.run_id == third.run_id)
        .unwrap()
        .seq;
    assert_eq!(compacted.up_to_seq, third_start - 1);

    // The next run is sent the summary, then the kept turn, then its message.
    run(&s, "Fourth message.").await;
    assert_eq!(
        last_request_texts(&s.main),
        [
            format!("{SUMMARY_PREFIX}\n{summary}"),
            "Third message.".into(),
            "Noté.".into(),
            "Fourth message.".into()
        ]
    );
    // Nothing new to summarize with one turn kept beyond the summary... until another turn.
    let again = s
        .engine
        .compact("default", SESSION, &compactor, None, &())
        .await
        .unwrap();
    assert!(matches!(again, Compaction::Applied(_)), "{again:?}");
}

#[tokio::test]
async fn a_summary_missing_markers_is_retried_once_then_the_originals_are_kept() {
    let s = setup(Caps::default());
    run(&s, FIRST).await;
    run(&s, "Second message.").await;
    let (compactor, summarizer) = compactor(json!([
        {"text": "A quote was sent."},
        {"text": "A quote DEV-2041 was sent."}
    ]));

    let outcome = s
        .engine
        .compact("default", SESSION, &compactor, None, &())
        .await
        .unwrap();

    let Compaction::Kept { run_id, missing } = outcome else {
        panic!("expected the originals kept, got {outcome:?}");
    };
    assert_eq!(missing, ["12/03/2026", "1 842,50 €", "marie@exemple.fr"]);
    // The retry named every missing marker to the model.
    let retry = summarizer.requests()[1].messages.last().unwrap().text();
    assert!(
        retry.contains("DEV-2041, 12/03/2026, 1 842,50 €, marie@exemple.fr"),
        "{retry}"
    );
    let events = journal(&s.store).await;
    assert_eq!(
        types_of(&events, &run_id)[6..],
        [
            "guard.checked",
            "policy.decided",
            "message.user",
            "step.started",
            "model.responded",
            "step.completed",
            "guard.checked",
            "run.transitioned",
            "run.failed"
        ]
    );
    let checks: Vec<(String, Option<String>)> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::GuardChecked(g) if g.guard == "fidelity" => {
                Some((g.outcome.clone(), g.resolution.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        checks,
        [
            ("failed".into(), Some("retry".into())),
            ("failed".into(), Some("fail".into()))
        ]
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.payload, Payload::SessionCompacted(_)))
    );
    // Nothing replaced the history: the next run is sent the original turns.
    run(&s, "Third message.").await;
    assert_eq!(last_request_texts(&s.main)[0], FIRST);
}

#[tokio::test]
async fn a_run_paused_for_approval_resumes_after_a_compaction() {
    let s = setup(Caps::default());
    run(&s, FIRST).await;
    run(&s, "Second message.").await;
    let (paused, state) = run(&s, "Envoie le devis.").await;
    assert_eq!(state.status, RunStatus::Paused);
    let (compactor, _) =
        compactor(json!([{"text": "DEV-2041, 12/03/2026, 1 842,50 €, marie@exemple.fr."}]));

    let outcome = s
        .engine
        .compact("default", SESSION, &compactor, None, &())
        .await
        .unwrap();
    let Compaction::Applied(compacted) = outcome else {
        panic!("{outcome:?}");
    };
    // Only the first turn: the second is kept, and the paused run is still open.
    let events = journal(&s.store).await;
    let second_start = events
        .iter()
        .filter(|e| e.event_type == "run.started")
        .nth(1)
        .unwrap()
        .seq;
    assert_eq!(compacted.up_to_seq, second_start - 1);

    s.engine
        .settle(&paused, &s.agent, None, &Decision::approved("denis"))
        .await
        .unwrap();
    let state = s
        .engine
        .drive(&paused, &s.agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().as_deref(), Some("Fait : sent"));
    // The resumed run kept the history it started with.
    assert_eq!(last_request_texts(&s.main)[0], FIRST);
    // The next run reads the summary, the second turn and the resumed one.
    run(&s, "Fourth message.").await;
    let texts = last_request_texts(&s.main);
    assert!(texts[0].starts_with(SUMMARY_PREFIX));
    assert_eq!(texts[1], "Second message.");
    assert_eq!(texts[3], "Envoie le devis.");
}

#[tokio::test]
async fn history_caps_cut_whole_turns_and_journal_it_once() {
    let s = setup(Caps {
        max_turns: Some(1),
        ..Caps::default()
    });
    run(&s, "Ajoute un et deux.").await;
    run(&s, "Ajoute encore.").await;
    let (third, state) = run(&s, "Third message.").await;
    assert_eq!(state.status, RunStatus::Completed);

    // Only the last turn, its call and its result together.
    let request = s.main.requests().last().unwrap().clone();
    let roles: Vec<Role> = request.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Assistant,
            Role::User
        ]
    );
    assert_eq!(request.messages[0].text(), "Ajoute encore.");
    let events = journal(&s.store).await;
    let trimmed: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e.payload, Payload::SessionTrimmed(_)))
        .collect();
    assert_eq!(
        trimmed.len(),
        1,
        "only run 3 had two earlier turns: {trimmed:?}"
    );
    match &trimmed[0].payload {
        Payload::SessionTrimmed(t) => {
            assert_eq!(t.reason, "max_turns");
            assert_eq!(t.dropped, 4);
            assert_eq!(trimmed[0].run_id, third.run_id);
        }
        other => panic!("{other:?}"),
    }
    // Driving the closed run again writes nothing more.
    s.engine
        .drive(&third, &s.agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(journal(&s.store).await.len(), events.len());
}

#[tokio::test]
async fn a_role_reads_the_session_summary() {
    let s = setup(Caps::default());
    run(&s, FIRST).await;
    run(&s, "Second message.").await;
    let summary = "DEV-2041, 12/03/2026, 1 842,50 €, marie@exemple.fr.";
    let (compactor, _) = compactor(json!([{"text": summary}]));
    let outcome = s
        .engine
        .compact("default", SESSION, &compactor, None, &())
        .await
        .unwrap();
    assert!(matches!(outcome, Compaction::Applied(_)));

    let role_model = Arc::new(RecordingModel::new(scripted(
        "fake-role",
        json!([{"text": "ok"}]),
    )));
    // The same summary as a template variable.
    let mut templated = RoleRuntime::new(
        "recap_t",
        "Recaps from a template.",
        "You recap.",
        ModelBinding::new("ROLE", "fake-role", role_model.clone()),
    );
    templated.context = vec![RoleContext::SessionSummary];
    templated.input_template = Some("Earlier: {{ context.session_summary }}".into());
    let mut recap = RoleRuntime::new(
        "recap",
        "Recaps.",
        "You recap.",
        ModelBinding::new("ROLE", "fake-role", role_model.clone()),
    );
    recap.context = vec![RoleContext::SessionSummary];
    let main = scripted(
        "fake-main",
        json!([
            {"tool_calls": [{"name": "recap"}]},
            {"tool_calls": [{"name": "recap_t"}]},
            {"text": "done"}
        ]),
    );
    let mut agent = AgentRuntime::new(
        "demo",
        "Tu es un assistant.",
        ModelBinding::new("FAKE", "fake-1", main),
    );
    agent.roles = vec![recap, templated];
    let run = s.engine.begin(&agent, begin("Recap."), &()).await.unwrap();
    let state = s
        .engine
        .drive(&run, &agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(
        role_model.requests()[0].messages[0].text(),
        format!(
            "<session_summary>\n{summary}\n</session_summary>\n\n<arguments>\n{{}}\n</arguments>"
        )
    );
    assert_eq!(
        role_model.requests()[1].messages[0].text(),
        format!("Earlier: {summary}")
    );
}
