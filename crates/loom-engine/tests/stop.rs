//! Stopping an engine without closing its runs (`StopSignal`): a requested stop lets the step
//! in progress write its events, then hands the lease back and leaves the run open; an
//! interrupt abandons the step as a crash would. Either way, another engine finishes the run.

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
    model::ModelClient,
    ports::EventStore,
    tool::{FnTool, ToolKind, ToolOutput, ToolSpec},
};
use loom_engine::{AgentRuntime, BeginRun, BoundTool, Engine, ModelBinding, SubAgentRuntime};
use loom_journal::MemoryStore;
use loom_testkit::{ManualClock, scripted};
use serde_json::{Map, json};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

fn agent(model: Arc<dyn ModelClient>, tools: Vec<FnTool>) -> AgentRuntime {
    let main = ModelBinding::new("FAKE", "fake-1", model);
    let mut agent = AgentRuntime::new("demo", "Tu es un assistant.", main);
    agent.tools = tools
        .into_iter()
        .map(|t| BoundTool::declared(Arc::new(t)).unwrap())
        .collect();
    agent
}

fn begin(message: &str) -> BeginRun {
    BeginRun {
        tenant_id: "default".into(),
        session_id: None,
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

/// A tool that says when it starts, then waits until a permit is released; counts its calls.
struct Gate {
    started: Arc<Notify>,
    permits: Arc<Semaphore>,
    calls: Arc<AtomicUsize>,
}

impl Gate {
    fn new() -> Gate {
        Gate {
            started: Arc::new(Notify::new()),
            permits: Arc::new(Semaphore::new(0)),
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn tool(&self) -> FnTool {
        let (started, permits, calls) = (
            self.started.clone(),
            self.permits.clone(),
            self.calls.clone(),
        );
        FnTool::new(
            ToolSpec {
                name: "gate".into(),
                description: "Waits for the test.".into(),
                input_schema: json!({"type": "object"}),
                kind: ToolKind::Python,
                declarations: Default::default(),
            },
            move |_, _| {
                let (started, permits, calls) = (started.clone(), permits.clone(), calls.clone());
                Box::pin(async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    started.notify_one();
                    permits.acquire().await.unwrap().forget();
                    Ok(ToolOutput::text("ouvert"))
                })
            },
        )
    }
}

fn script() -> serde_json::Value {
    json!([
        {"text": "J'attends.", "tool_calls": [{"name": "gate", "arguments": {}}]},
        {"text": "Fini : {{ tool_result }}."}
    ])
}

/// A run of `agent` on a fresh memory journal, driven in a task until its gate tool has
/// started (the test decides when it may go on).
struct Driving {
    store: Arc<MemoryStore>,
    clock: Arc<ManualClock>,
    engine: Engine,
    run: loom_engine::RunRef,
    task: tokio::task::JoinHandle<Result<loom_core::RunState, loom_engine::EngineError>>,
}

async fn drive_into_the_gate(agent: &AgentRuntime, gate: &Gate, message: &str) -> Driving {
    let store = Arc::new(MemoryStore::new());
    let clock = Arc::new(ManualClock::new());
    let engine = Engine::new(store.clone(), clock.clone());
    let run = engine.begin(agent, begin(message), &()).await.unwrap();
    let task = {
        let (engine, run, agent) = (engine.clone(), run.clone(), agent.clone());
        tokio::spawn(async move {
            engine
                .drive(&run, &agent, &(), &CancellationToken::new())
                .await
        })
    };
    gate.started.notified().await;
    Driving {
        store,
        clock,
        engine,
        run,
        task,
    }
}

async fn journal(store: &MemoryStore, session: &str) -> Vec<Event> {
    store.read("default", session, 0).await.unwrap()
}

/// The last event is this worker handing its lease back, and the run did not close.
fn handed_back_and_open(events: &[Event], worker: &str) {
    let last = events.last().unwrap();
    let Payload::RunClaimed(claim) = &last.payload else {
        panic!("last event: {}", last.event_type)
    };
    assert_eq!(claim.worker_id, worker);
    assert!(claim.lease_until <= last.ts, "the lease is not handed back");
    assert!(
        !events.iter().any(|e| e.payload.is_closing()),
        "the run was closed"
    );
}

#[tokio::test]
async fn a_requested_stop_lets_the_step_finish_then_leaves_the_run_open() {
    let gate = Gate::new();
    let agent = agent(scripted("fake-1", script()), vec![gate.tool()]);
    let Driving {
        store,
        clock,
        engine,
        run,
        task: driving,
    } = drive_into_the_gate(&agent, &gate, "x").await;
    engine.stop_signal().request();
    // The step in progress goes on: its result is written before the run lets go.
    gate.permits.add_permits(1);
    let state = driving.await.unwrap().unwrap();
    assert!(!state.finished);
    assert_eq!(state.status, RunStatus::AwaitingTools);

    let events = journal(&store, &run.session_id).await;
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        types[types.len() - 4..],
        [
            "tool.called",
            "tool.completed",
            "step.completed",
            "run.claimed"
        ]
    );
    handed_back_and_open(&events, engine.worker_id());

    // An engine that stopped drives no more: the same run is left as it is.
    let again = engine
        .drive(&run, &agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    assert!(!again.finished);
    assert_eq!(journal(&store, &run.session_id).await.len(), events.len());

    // Another worker takes it at once (the lease was handed back) and finishes it, without
    // calling the tool again.
    let next = Engine::new(store.clone(), clock);
    let state = next
        .drive(&run, &agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().unwrap(), "Fini : ouvert.");
    assert_eq!(gate.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_interrupt_abandons_the_step_as_a_crash_would_and_hands_the_lease_back() {
    let gate = Gate::new();
    let agent = agent(scripted("fake-1", script()), vec![gate.tool()]);
    let Driving {
        store,
        clock,
        engine,
        run,
        task: driving,
    } = drive_into_the_gate(&agent, &gate, "x").await;
    engine.stop_signal().request();
    engine.stop_signal().interrupt();
    // The tool never gets its permit: the step is abandoned where it is.
    let state = tokio::time::timeout(Duration::from_secs(30), driving)
        .await
        .expect("the interrupted drive did not return")
        .unwrap()
        .unwrap();
    assert!(!state.finished);

    let events = journal(&store, &run.session_id).await;
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types[types.len() - 2..], ["tool.called", "run.claimed"]);
    assert!(!types.contains(&"tool.completed"));
    handed_back_and_open(&events, engine.worker_id());

    // Resumed elsewhere: the call (a pure tool) runs again, and the run completes.
    gate.permits.add_permits(1);
    let next = Engine::new(store.clone(), clock);
    let state = next
        .drive(&run, &agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(gate.calls.load(Ordering::SeqCst), 2);
    let events = journal(&store, &run.session_id).await;
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.payload, Payload::ToolCalled(p) if p.resumed))
    );
}

#[tokio::test]
async fn a_stop_before_the_first_step_claims_nothing() {
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::new(store.clone(), Arc::new(ManualClock::new()));
    let gate = Gate::new();
    let agent = agent(scripted("fake-1", script()), vec![gate.tool()]);
    let run = engine.begin(&agent, begin("x"), &()).await.unwrap();
    let opened = journal(&store, &run.session_id).await.len();
    engine.stop_signal().request();
    let state = engine
        .drive(&run, &agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    assert!(!state.finished);
    assert_eq!(state.status, RunStatus::ReadyForModel);
    assert_eq!(journal(&store, &run.session_id).await.len(), opened);
}

#[tokio::test]
async fn a_stopped_child_leaves_its_parents_call_open_and_both_resume() {
    let gate = Gate::new();
    let mut researcher = agent(
        scripted(
            "fake-1",
            json!([
                {"tool_calls": [{"name": "gate", "arguments": {}}]},
                {"text": "Trouvé : {{ tool_result }}."}
            ]),
        ),
        vec![gate.tool()],
    );
    researcher.name = "researcher".into();
    let mut boss = agent(
        scripted(
            "fake-1",
            json!([
                {"text": "Je délègue.", "tool_calls": [
                    {"name": "researcher", "arguments": {"message": "Cherche."}}
                ]},
                {"text": "Le chercheur dit : {{ tool_result }}"}
            ]),
        ),
        Vec::new(),
    );
    boss.subagents.push(SubAgentRuntime::new(
        "researcher",
        "Finds things.",
        Arc::new(researcher),
    ));
    let Driving {
        store,
        clock,
        engine,
        run,
        task: driving,
    } = drive_into_the_gate(&boss, &gate, "Délègue.").await;
    engine.stop_signal().request();
    gate.permits.add_permits(1);
    let state = driving.await.unwrap().unwrap();
    assert!(!state.finished);
    assert_eq!(state.status, RunStatus::AwaitingTools);

    let events = journal(&store, &run.session_id).await;
    let child = events
        .iter()
        .find(|e| matches!(&e.payload, Payload::RunStarted(s) if s.parent_run_id.is_some()))
        .unwrap()
        .run_id
        .clone();
    // The child's step wrote its result, then the child stopped, open.
    assert!(events.iter().any(|e| e.run_id == child
        && matches!(&e.payload, Payload::ToolCompleted(c) if c.tool_name == "gate")));
    let of_child: Vec<Event> = events
        .iter()
        .filter(|e| e.run_id == child)
        .cloned()
        .collect();
    assert!(!of_child.iter().any(|e| e.payload.is_closing()));
    // The parent's call has no result; the parent's last event hands its lease back.
    assert!(
        !events
            .iter()
            .any(|e| e.run_id == run.run_id && matches!(&e.payload, Payload::ToolCompleted(_)))
    );
    let of_root: Vec<Event> = events
        .iter()
        .filter(|e| e.run_id == run.run_id)
        .cloned()
        .collect();
    handed_back_and_open(&of_root, engine.worker_id());

    // Driven again elsewhere: the parent's call resumes the same child, which finishes.
    let next = Engine::new(store.clone(), clock);
    let state = next
        .drive(&run, &boss, &(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(
        state.output_text().unwrap(),
        "Le chercheur dit : Trouvé : ouvert."
    );
    assert_eq!(gate.calls.load(Ordering::SeqCst), 1);
    let events = journal(&store, &run.session_id).await;
    let children = events
        .iter()
        .filter(|e| matches!(&e.payload, Payload::RunStarted(s) if s.parent_run_id.is_some()))
        .count();
    assert_eq!(children, 1, "the child run is resumed, not opened again");
}
