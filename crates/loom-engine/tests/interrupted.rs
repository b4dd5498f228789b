//! A call interrupted mid-flight (the worker killed right after `tool.called`), resumed by
//! another engine once the lease has run out: every `side_effects` × `idempotent` ×
//! `on_unknown` combination, on the memory journal.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use loom_core::{
    BoxFuture, Event, Message, RunState, RunStatus,
    approval::Decision,
    event::Payload,
    ports::{EventStore, SourceContext, SourceError, ToolSource},
    tool::{FnTool, OnUnknown, SideEffects, Tool, ToolOutput},
};
use loom_engine::{
    AgentRuntime, BeginRun, BoundSource, BoundTool, Engine, ModelBinding, RunRef, UNKNOWN_STATE,
};
use loom_journal::MemoryStore;
use loom_testkit::{ManualClock, counting_tool, scripted, sleep_tool};
use serde_json::{Map, json};
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy)]
struct Case {
    side_effects: SideEffects,
    idempotent: bool,
    on_unknown: OnUnknown,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "side_effects={:?} idempotent={} on_unknown={:?}",
            self.side_effects, self.idempotent, self.on_unknown
        )
    }
}

/// What resuming the interrupted call should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expected {
    /// Run it again, marked resumed.
    Rerun,
    /// Tell the model the outcome is unknown.
    UnknownError,
    /// Pause and ask a human.
    Ask,
}

impl Case {
    fn expected(self) -> Expected {
        if self.side_effects == SideEffects::None || self.idempotent {
            Expected::Rerun
        } else if self.on_unknown == OnUnknown::Pause {
            Expected::Ask
        } else {
            Expected::UnknownError
        }
    }
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for side_effects in [
        SideEffects::None,
        SideEffects::Reversible,
        SideEffects::Irreversible,
    ] {
        for idempotent in [false, true] {
            for on_unknown in [OnUnknown::Error, OnUnknown::Pause] {
                cases.push(Case {
                    side_effects,
                    idempotent,
                    on_unknown,
                });
            }
        }
    }
    cases
}

fn agent(tool: FnTool) -> AgentRuntime {
    let model = scripted(
        "fake-1",
        json!([
            {"tool_calls": [{"name": "send", "arguments": {}}]},
            {"text": "fini : {{ tool_result }}"}
        ]),
    );
    let mut agent = AgentRuntime::new(
        "demo",
        "Tu es un assistant.",
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
        message: Message::user("Envoie-le."),
        judges: Default::default(),
        budget: None,
        attachments: Vec::new(),
        trigger: None,
        state: Default::default(),
    }
}

async fn drive(engine: &Engine, run: &RunRef, agent: &AgentRuntime) -> RunState {
    engine
        .drive(run, agent, &(), &CancellationToken::new())
        .await
        .unwrap()
}

async fn read_all(store: &MemoryStore, run: &RunRef) -> Vec<Event> {
    store
        .read(&run.tenant_id, &run.session_id, 0)
        .await
        .unwrap()
}

/// The `resumed` flag of each `tool.called`, in order.
fn calls(events: &[Event]) -> Vec<bool> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ToolCalled(p) => Some(p.resumed),
            _ => None,
        })
        .collect()
}

fn completed_output(events: &[Event]) -> ToolOutput {
    events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::ToolCompleted(p) => Some(p.output.clone()),
            _ => None,
        })
        .expect("the call has a result")
}

struct Crashed {
    store: Arc<MemoryStore>,
    run: RunRef,
    agent: AgentRuntime,
    counter: Arc<AtomicUsize>,
    call_id: String,
    /// An engine whose clock is past the crashed worker's lease (60 s).
    engine: Engine,
}

/// Runs the one-tool agent to the end, then rebuilds its journal as a kill right after
/// `tool.called` would have left it; the counter is reset.
async fn crashed_mid_call(case: Case) -> Crashed {
    let counter = Arc::new(AtomicUsize::new(0));
    let mut tool = counting_tool("send", counter.clone());
    let declarations = tool.declarations_mut();
    declarations.side_effects = case.side_effects;
    declarations.idempotent = case.idempotent;
    declarations.on_unknown = case.on_unknown;
    let agent = agent(tool);

    let store = Arc::new(MemoryStore::new());
    let engine = Engine::new(store.clone(), Arc::new(ManualClock::new()));
    let run = engine.begin(&agent, begin(), &()).await.unwrap();
    let state = drive(&engine, &run, &agent).await;
    assert_eq!(state.status, RunStatus::Completed, "{case}: first run");
    assert_eq!(counter.load(Ordering::SeqCst), 1, "{case}: first run");

    let all = read_all(&store, &run).await;
    let cut = all
        .iter()
        .position(|e| matches!(e.payload, Payload::ToolCalled(_)))
        .unwrap()
        + 1;
    let Payload::ToolCalled(called) = &all[cut - 1].payload else {
        unreachable!()
    };
    let call_id = called.call_id.clone();
    let crashed = Arc::new(MemoryStore::new());
    for event in &all[..cut] {
        let mut fresh = event.clone();
        fresh.seq = 0;
        crashed.append(vec![fresh], event.seq - 1).await.unwrap();
    }
    counter.store(0, Ordering::SeqCst);

    let later = Arc::new(ManualClock::new());
    later.advance(Duration::from_secs(120));
    Crashed {
        engine: Engine::new(crashed.clone(), later),
        store: crashed,
        run,
        agent,
        counter,
        call_id,
    }
}

#[tokio::test]
async fn each_combination_resumes_an_interrupted_call_as_declared() {
    let mut table = Vec::new();
    for case in cases() {
        let expected = case.expected();
        table.push(format!("{case} => {expected:?}"));
        let c = crashed_mid_call(case).await;
        let state = drive(&c.engine, &c.run, &c.agent).await;
        let events = read_all(&c.store, &c.run).await;
        match expected {
            Expected::Rerun => {
                assert_eq!(state.status, RunStatus::Completed, "{case}");
                assert_eq!(
                    c.counter.load(Ordering::SeqCst),
                    1,
                    "{case}: runs again once"
                );
                assert_eq!(calls(&events), [false, true], "{case}: tool.called flags");
                let output = completed_output(&events);
                assert!(!output.is_error, "{case}: {}", output.visible_text());
            }
            Expected::UnknownError => {
                assert_eq!(state.status, RunStatus::Completed, "{case}");
                assert_eq!(
                    c.counter.load(Ordering::SeqCst),
                    0,
                    "{case}: must not rerun"
                );
                assert_eq!(calls(&events), [false], "{case}: tool.called flags");
                let output = completed_output(&events);
                assert!(output.is_error, "{case}: the result is an error");
                assert_eq!(output.visible_text(), UNKNOWN_STATE, "{case}");
            }
            Expected::Ask => {
                assert_eq!(state.status, RunStatus::Paused, "{case}");
                assert_eq!(
                    c.counter.load(Ordering::SeqCst),
                    0,
                    "{case}: must not rerun"
                );
                assert_eq!(calls(&events), [false], "{case}: tool.called flags");
                assert!(
                    events.iter().any(|e| matches!(
                        &e.payload,
                        Payload::ApprovalRequested(p) if p.call_id == c.call_id
                    )),
                    "{case}: approval.requested for {}",
                    c.call_id
                );
                assert_eq!(state.waiting_approvals().len(), 1, "{case}");
                assert_eq!(state.waiting_approvals()[0].call_id, c.call_id, "{case}");

                // Granted: the tool is relaunched exactly once and the run completes.
                c.engine
                    .settle(&c.run, &c.agent, None, &Decision::approved("denis"))
                    .await
                    .unwrap();
                let state = drive(&c.engine, &c.run, &c.agent).await;
                assert_eq!(state.status, RunStatus::Completed, "{case}: after grant");
                assert_eq!(c.counter.load(Ordering::SeqCst), 1, "{case}: after grant");
                let events = read_all(&c.store, &c.run).await;
                assert_eq!(calls(&events), [false, true], "{case}: after grant");
                let output = completed_output(&events);
                assert!(!output.is_error, "{case}: {}", output.visible_text());
            }
        }
    }
    println!("{}", table.join("\n"));
}

#[tokio::test]
async fn rejecting_an_interrupted_call_gives_an_error_result_without_running_it() {
    let case = Case {
        side_effects: SideEffects::Irreversible,
        idempotent: false,
        on_unknown: OnUnknown::Pause,
    };
    let c = crashed_mid_call(case).await;
    let state = drive(&c.engine, &c.run, &c.agent).await;
    assert_eq!(state.status, RunStatus::Paused, "{case}");
    c.engine
        .settle(
            &c.run,
            &c.agent,
            None,
            &Decision::rejected("denis", "déjà envoyé"),
        )
        .await
        .unwrap();
    let state = drive(&c.engine, &c.run, &c.agent).await;
    assert_eq!(
        state.status,
        RunStatus::Completed,
        "{case}: after rejection"
    );
    assert_eq!(c.counter.load(Ordering::SeqCst), 0, "{case}: never reruns");
    let events = read_all(&c.store, &c.run).await;
    assert_eq!(calls(&events), [false], "{case}: no new tool.called");
    let output = completed_output(&events);
    assert!(output.is_error, "{case}: the result is an error");
    assert!(
        output.visible_text().contains("déjà envoyé"),
        "{case}: {}",
        output.visible_text()
    );
}

/// A tool source that takes `opening` of the engine's clock to open (a slow MCP server
/// starting) and gives no tool.
#[derive(Debug)]
struct SlowSource {
    clock: Arc<ManualClock>,
    opening: Duration,
}

impl ToolSource for SlowSource {
    fn name(&self) -> &str {
        "lent"
    }

    fn open<'a>(
        &'a self,
        _ctx: &'a SourceContext,
    ) -> BoxFuture<'a, Result<Vec<Arc<dyn Tool>>, SourceError>> {
        Box::pin(async move {
            self.clock.advance(self.opening);
            Ok(Vec::new())
        })
    }

    fn release<'a>(&'a self, _ctx: &'a SourceContext) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// Taken over once the killed worker's lease has run out, the run's first events are the
/// reference's: its claim, the step, then the interrupted call's outcome. With a lease of
/// 2 s, the reference renews every second: a source that takes 0.9 s to open, then a call
/// run again in 50 ms, are no reason for another claim.
#[tokio::test(start_paused = true)]
async fn a_run_taken_over_claims_once_then_steps_into_the_interrupted_call() {
    let case = Case {
        side_effects: SideEffects::None,
        idempotent: false,
        on_unknown: OnUnknown::Error,
    };
    let mut c = crashed_mid_call(case).await;
    let before = read_all(&c.store, &c.run).await.len();
    let clock = Arc::new(ManualClock::new());
    clock.advance(Duration::from_secs(120));
    let engine = Engine::new(c.store.clone(), clock.clone()).with_lease(Duration::from_secs(2));
    let mut slow = sleep_tool("send", 50);
    slow.declarations_mut().side_effects = SideEffects::None;
    c.agent.tools = vec![BoundTool::declared(Arc::new(slow)).unwrap()];
    c.agent.sources = vec![BoundSource {
        source: Arc::new(SlowSource {
            clock,
            opening: Duration::from_millis(900),
        }),
        required: false,
        contracts: Default::default(),
    }];
    let state = drive(&engine, &c.run, &c.agent).await;
    assert_eq!(state.status, RunStatus::Completed);
    let events = read_all(&c.store, &c.run).await;
    let resumed: Vec<&str> = events[before..]
        .iter()
        .map(|e| e.event_type.as_str())
        .collect();
    assert_eq!(
        resumed[..6],
        [
            "run.claimed",
            "tool.source_opened",
            "step.started",
            "tool.called",
            "tool.completed",
            "step.completed"
        ],
        "{resumed:?}"
    );
    assert_eq!(calls(&events), [false, true]);
    assert_eq!(
        resumed.iter().filter(|t| **t == "run.claimed").count(),
        1,
        "{resumed:?}"
    );
}
