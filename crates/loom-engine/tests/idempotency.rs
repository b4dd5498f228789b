//! Business idempotency keys: a second run with the same key reuses the recorded result, the
//! tool runs once; a different key runs; a key held by another run is refused.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use loom_core::{
    Event, Message, RunStatus,
    event::Payload,
    ports::{IdempotencyScope, IdempotencyStore, Reservation},
    tool::{FnTool, SideEffects},
};
use loom_engine::{AgentRuntime, BeginRun, BoundTool, Engine, ModelBinding, RunRef};
use loom_journal::{MemoryIdempotency, MemoryStore};
use loom_testkit::{ManualClock, counting_tool, scripted};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

fn relance(counter: Arc<AtomicUsize>) -> FnTool {
    let mut tool = counting_tool("relancer", counter).with_business_key(|args: &Value| {
        args.get("numero")
            .and_then(Value::as_str)
            .map(|n| format!("relance:{n}"))
    });
    tool.declarations_mut().side_effects = SideEffects::Irreversible;
    tool
}

fn agent(numero: &str, tool: FnTool) -> AgentRuntime {
    let model = scripted(
        "fake-1",
        json!([
            {"tool_calls": [{"name": "relancer", "arguments": {"numero": numero}}]},
            {"text": "fini"}
        ]),
    );
    let mut agent = AgentRuntime::new(
        "demo",
        "Tu relances.",
        ModelBinding::new("FAKE", "fake-1", model),
    );
    agent.tools = vec![BoundTool::declared(Arc::new(tool)).unwrap()];
    agent
}

fn begin() -> BeginRun {
    BeginRun {
        tenant_id: "default".into(),
        session_id: None,
        run_id: None,
        user_id: None,
        metadata: Map::new(),
        message: Message::user("Relance le devis."),
        judges: Default::default(),
        budget: None,
        attachments: Vec::new(),
        trigger: None,
        state: Default::default(),
    }
}

async fn run(engine: &Engine, agent: &AgentRuntime) -> (RunRef, Vec<Event>) {
    let run = engine.begin(agent, begin(), &()).await.unwrap();
    let state = engine
        .drive(&run, agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(state.status, RunStatus::Completed);
    let events = engine
        .store()
        .read(&run.tenant_id, &run.session_id, 0)
        .await
        .unwrap();
    (run, events)
}

fn types(events: &[Event]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e.event_type.as_str())
        .filter(|t| t.starts_with("tool.") || t.starts_with("idempotency."))
        .collect()
}

fn output(events: &[Event]) -> loom_core::tool::ToolOutput {
    events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::ToolCompleted(p) => Some(p.output.clone()),
            _ => None,
        })
        .unwrap()
}

fn engine(store: Arc<MemoryIdempotency>) -> Engine {
    Engine::new(Arc::new(MemoryStore::new()), Arc::new(ManualClock::new())).with_idempotency(store)
}

#[tokio::test]
async fn a_second_run_with_the_same_business_key_reuses_the_result() {
    let keys = Arc::new(MemoryIdempotency::new());
    let engine = engine(keys.clone());
    let counter = Arc::new(AtomicUsize::new(0));

    let (_, first) = run(&engine, &agent("D-1", relance(counter.clone()))).await;
    assert_eq!(counter.load(Ordering::SeqCst), 1);
    assert_eq!(
        types(&first),
        ["tool.called", "idempotency.recorded", "tool.completed"]
    );
    let recorded = first
        .iter()
        .find(|e| e.event_type == "idempotency.recorded")
        .unwrap();
    assert_eq!(recorded.category, loom_core::Category::Idempotency);
    assert_eq!(recorded.status, loom_core::EventStatus::Ok);
    assert_eq!(recorded.facets["key"], "default:relancer:relance:D-1");
    assert_eq!(recorded.facets["tool_name"], "relancer");

    let (_, second) = run(&engine, &agent("D-1", relance(counter.clone()))).await;
    assert_eq!(counter.load(Ordering::SeqCst), 1, "the tool ran once");
    assert_eq!(
        types(&second),
        ["tool.called", "idempotency.reused", "tool.completed"]
    );
    let Payload::IdempotencyReused(reused) = &second
        .iter()
        .find(|e| e.event_type == "idempotency.reused")
        .unwrap()
        .payload
    else {
        panic!("not a reuse");
    };
    assert_eq!(reused.key, "default:relancer:relance:D-1");
    assert_eq!(reused.call_id, "fake_0_0");
    assert_eq!(output(&second), output(&first));

    // Another quote is another action.
    let (_, third) = run(&engine, &agent("D-2", relance(counter.clone()))).await;
    assert_eq!(counter.load(Ordering::SeqCst), 2);
    assert!(types(&third).contains(&"idempotency.recorded"));
    assert_eq!(keys.len(), 2);
}

#[tokio::test]
async fn a_key_held_by_another_run_is_refused_and_failures_are_not_recorded() {
    let keys = Arc::new(MemoryIdempotency::new());
    keys.reserve(
        "default:relancer:relance:D-1",
        "someone-else",
        IdempotencyScope {
            tenant_id: "default",
            session_id: "elsewhere",
        },
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let engine = engine(keys.clone());
    let counter = Arc::new(AtomicUsize::new(0));
    let (_, events) = run(&engine, &agent("D-1", relance(counter.clone()))).await;
    assert_eq!(counter.load(Ordering::SeqCst), 0);
    let refused = output(&events);
    assert!(refused.is_error);
    assert!(
        refused
            .visible_text()
            .contains("in progress in another run (key default:relancer:relance:D-1)"),
        "{}",
        refused.visible_text()
    );

    // A tool that fails gives its key back: the next run may try again.
    let failing = loom_testkit::failing_tool("relancer", "SMTP down")
        .with_business_key(|_| Some("relance:D-3".into()));
    let (_, events) = run(&engine, &agent("D-3", failing)).await;
    assert!(output(&events).is_error);
    assert!(!types(&events).contains(&"idempotency.recorded"));
    assert_eq!(
        keys.reserve(
            "default:relancer:relance:D-3",
            "next",
            IdempotencyScope {
                tenant_id: "default",
                session_id: "elsewhere",
            },
            Duration::from_secs(60)
        )
        .await
        .unwrap(),
        Reservation::Reserved
    );
}

#[tokio::test]
async fn without_a_store_the_business_key_is_ignored() {
    let engine = Engine::new(Arc::new(MemoryStore::new()), Arc::new(ManualClock::new()));
    let counter = Arc::new(AtomicUsize::new(0));
    run(&engine, &agent("D-1", relance(counter.clone()))).await;
    run(&engine, &agent("D-1", relance(counter.clone()))).await;
    assert_eq!(counter.load(Ordering::SeqCst), 2);
}
