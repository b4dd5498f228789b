//! Run and session budgets (`loom.budget`) on the memory journal: a limit reached writes
//! `budget.exceeded` once per run; `stop` stops the run, which finishes with one last answer
//! without tools; `warn` only journals. Limits come from the agent, tightened by the run's own
//! budget (`run.started.budget`).

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use loom_core::{
    Event, Message, RunStatus,
    event::{BudgetExceeded, Effect, Payload, PolicyDecided, RunBudget},
    model::{ModelClient, ToolChoice},
    policy::{Decision, DecisionKind, FnPolicy, Point},
    ports::EventStore,
    tool::FnTool,
};
use loom_engine::{
    AgentRuntime, BeginRun, BoundPolicy, BoundTool, BudgetLimits, Engine, ModelBinding, OnExceed,
    RunLimits, RunRef, SessionLimits,
};
use loom_journal::MemoryStore;
use loom_testkit::{ManualClock, RecordingModel, add_tool, scripted};
use serde_json::{Map, json};
use tokio_util::sync::CancellationToken;

fn agent(
    model: Arc<dyn ModelClient>,
    tools: Vec<FnTool>,
    budget: Option<BudgetLimits>,
) -> AgentRuntime {
    let mut main = ModelBinding::new("FAKE", "fake-1", model);
    main.pricing = loom_core::Pricing {
        input: 3.0,
        output: 15.0,
        ..Default::default()
    };
    let mut agent = AgentRuntime::new("demo", "Tu es un assistant.", main);
    agent.tools = tools
        .into_iter()
        .map(|t| BoundTool::declared(Arc::new(t)).unwrap())
        .collect();
    agent.budget = budget;
    agent
}

fn run_limit(limits: RunLimits, on_exceed: OnExceed) -> Option<BudgetLimits> {
    Some(BudgetLimits {
        run: limits,
        session: SessionLimits::default(),
        on_exceed,
    })
}

fn calls(n: u64) -> RunLimits {
    RunLimits {
        max_calls: Some(n),
        ..RunLimits::default()
    }
}

fn engine() -> (Engine, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    (
        Engine::new(store.clone(), Arc::new(ManualClock::new())),
        store,
    )
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

async fn run(
    engine: &Engine,
    agent: &AgentRuntime,
    request: BeginRun,
) -> (RunRef, loom_core::RunState) {
    let run = engine.begin(agent, request, &()).await.unwrap();
    let state = engine
        .drive(&run, agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    (run, state)
}

async fn events(store: &MemoryStore, run: &RunRef) -> Vec<Event> {
    let mut events = store
        .read(&run.tenant_id, &run.session_id, 0)
        .await
        .unwrap();
    events.retain(|e| e.run_id == run.run_id);
    events
}

fn types(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.event_type.as_str()).collect()
}

fn exceeded(events: &[Event]) -> Vec<&BudgetExceeded> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::BudgetExceeded(b) => Some(b),
            _ => None,
        })
        .collect()
}

fn decided(events: &[Event]) -> Vec<&PolicyDecided> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::PolicyDecided(p) => Some(p),
            _ => None,
        })
        .collect()
}

/// Calls `add` three times, then answers.
fn looping_script() -> serde_json::Value {
    json!([
        {"text": "Un.", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 1}}]},
        {"text": "Deux.", "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 2}}]},
        {"text": "Trois.", "tool_calls": [{"name": "add", "arguments": {"a": 3, "b": 3}}]},
        {"text": "Fini : {{ tool_result }}."}
    ])
}

#[tokio::test]
async fn max_calls_stop_journals_the_limit_then_finishes_without_tools() {
    let (engine, store) = engine();
    let model = Arc::new(RecordingModel::new(scripted("fake-1", looping_script())));
    let agent = agent(
        model.clone(),
        vec![add_tool()],
        run_limit(calls(2), OnExceed::Stop),
    );
    let (run, state) = run(&engine, &agent, begin("Compte.")).await;
    assert_eq!(state.status, RunStatus::Completed);
    let events = events(&store, &run).await;
    assert_eq!(
        types(&events),
        [
            "run.started",
            "message.user",
            "run.claimed",
            "step.started",
            "model.responded",
            "step.completed",
            "run.transitioned",
            "step.started",
            "tool.called",
            "tool.completed",
            "step.completed",
            "run.transitioned",
            "step.started",
            "model.responded",
            "step.completed",
            "run.transitioned",
            "step.started",
            "tool.called",
            "tool.completed",
            "step.completed",
            "run.transitioned",
            // The third call is not made: the budget stops the run inside its step.
            "step.started",
            "budget.exceeded",
            "policy.decided",
            "step.completed",
            "run.transitioned",
            // One last answer, without tools: the overrun is one generation.
            "step.started",
            "model.responded",
            "step.completed",
            "run.transitioned",
            "run.completed",
        ]
    );
    let budget = exceeded(&events);
    assert_eq!(budget.len(), 1);
    assert_eq!(
        (
            budget[0].scope.as_str(),
            budget[0].limit.as_str(),
            budget[0].value,
            budget[0].spent,
            budget[0].action.as_str(),
            budget[0].policy.as_deref()
        ),
        ("run", "max_calls", 2.0, 2.0, "stop", Some("loom.budget"))
    );
    let stop = decided(&events);
    assert_eq!(stop.len(), 1);
    assert_eq!(
        (
            stop[0].policy.as_str(),
            stop[0].point.as_str(),
            stop[0].decision.as_str(),
            stop[0].reason.as_deref()
        ),
        (
            "loom.budget",
            "before_model",
            "stop",
            Some("run budget reached: 2 calls (limit 2 calls)")
        )
    );
    // Both are written inside the stopped step, under its span.
    assert_eq!(events[22].span_id, events[21].span_id);
    assert_eq!(events[23].span_id, events[21].span_id);
    assert_eq!(events[22].status, loom_core::event::EventStatus::Warning);
    let Payload::StepCompleted(done) = &events[24].payload else {
        panic!("{:?}", events[24].payload)
    };
    assert_eq!(done.events_emitted, 2);
    let Payload::RunTransitioned(t) = &events[25].payload else {
        panic!()
    };
    assert_eq!(
        (t.from_state, t.to_state, t.cause_type.as_str()),
        (
            RunStatus::ReadyForModel,
            RunStatus::Finalizing,
            "policy.decided"
        )
    );
    let Payload::StepStarted(last) = &events[26].payload else {
        panic!()
    };
    assert_eq!(last.effect, Effect::Finalize);
    // The finalizing request offered no tool choice, and its answer is the final output.
    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[2].tool_choice, ToolChoice::None);
    assert_eq!(state.model_calls, 3);
    assert_eq!(state.output_text().as_deref(), Some("Trois."));
    assert!(state.exceeded.contains("run.max_calls"));
}

#[tokio::test]
async fn warn_only_journals_once_and_the_calls_go_on() {
    let (engine, store) = engine();
    let agent = agent(
        scripted("fake-1", looping_script()),
        vec![add_tool()],
        run_limit(calls(1), OnExceed::Warn),
    );
    let (run, state) = run(&engine, &agent, begin("Compte.")).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().as_deref(), Some("Fini : 6."));
    assert_eq!(state.model_calls, 4);
    let events = events(&store, &run).await;
    let budget = exceeded(&events);
    assert_eq!(
        budget.len(),
        1,
        "signalled once per run, not before every call"
    );
    assert_eq!(
        (
            budget[0].limit.as_str(),
            budget[0].action.as_str(),
            budget[0].spent
        ),
        ("max_calls", "warn", 1.0)
    );
    assert!(decided(&events).is_empty(), "a warning decides nothing");
    // Journaled in the second model step, before its answer.
    let at = events
        .iter()
        .position(|e| e.event_type == "budget.exceeded")
        .unwrap();
    assert_eq!(events[at - 1].event_type, "step.started");
    assert_eq!(events[at + 1].event_type, "model.responded");
    assert!(
        !events
            .iter()
            .any(|e| matches!(&e.payload, Payload::StepStarted(s) if s.effect == Effect::Finalize))
    );
}

#[tokio::test]
async fn max_cost_and_max_tokens_reached_together_stop_on_the_first() {
    let (engine, store) = engine();
    let limits = RunLimits {
        max_cost: Some(0.000_01),
        max_tokens: Some(1),
        max_calls: None,
    };
    let agent = agent(
        scripted("fake-1", looping_script()),
        vec![add_tool()],
        run_limit(limits, OnExceed::Stop),
    );
    let (run, state) = run(&engine, &agent, begin("Compte.")).await;
    assert_eq!(state.status, RunStatus::Completed);
    let events = events(&store, &run).await;
    let first = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::ModelResponded(r) => Some(r.clone()),
            _ => None,
        })
        .unwrap();
    let budget = exceeded(&events);
    assert_eq!(budget.len(), 2);
    assert_eq!(
        (budget[0].limit.as_str(), budget[0].value, budget[0].spent),
        ("max_cost", 0.000_01, first.cost_usd)
    );
    assert_eq!(
        (budget[1].limit.as_str(), budget[1].value, budget[1].spent),
        ("max_tokens", 1.0, first.usage.total_tokens() as f64)
    );
    let stop = decided(&events);
    assert_eq!(stop.len(), 1);
    assert_eq!(
        stop[0].reason.as_deref(),
        Some(
            format!(
                "run budget reached: {:.5} $ (limit 0.00001 $)",
                first.cost_usd
            )
            .as_str()
        )
    );
    // Stopped before the second call: the first answer's tool call ran, then one last answer.
    assert_eq!(state.model_calls, 2);
    assert_eq!(state.output_text().as_deref(), Some("Deux."));
}

#[tokio::test]
async fn max_tokens_alone_names_tokens() {
    let (engine, store) = engine();
    let limits = RunLimits {
        max_tokens: Some(10),
        ..RunLimits::default()
    };
    let agent = agent(
        scripted("fake-1", looping_script()),
        vec![add_tool()],
        run_limit(limits, OnExceed::Stop),
    );
    let (run, state) = run(&engine, &agent, begin("Compte.")).await;
    let events = events(&store, &run).await;
    let spent = exceeded(&events)[0].spent;
    assert!(spent >= 10.0);
    assert_eq!(
        decided(&events)[0].reason.as_deref(),
        Some(format!("run budget reached: {spent} tokens (limit 10 tokens)").as_str())
    );
    assert!(state.usage.total_tokens() as f64 > spent);
}

#[tokio::test]
async fn the_session_budget_counts_the_session_s_earlier_runs() {
    let (engine, store) = engine();
    let plain = json!([{"text": "Bonjour."}, {"text": "Encore bonjour."}]);
    let free = agent(scripted("fake-1", plain.clone()), Vec::new(), None);
    let mut first = begin("Salut.");
    first.session_id = Some("s1".into());
    let (_, earlier) = run(&engine, &free, first).await;
    let used = earlier.usage.total_tokens();
    assert!(used > 0);

    let budget = Some(BudgetLimits {
        run: RunLimits::default(),
        session: SessionLimits {
            max_cost: None,
            max_tokens: Some(used),
        },
        on_exceed: OnExceed::Stop,
    });
    let limited = agent(scripted("fake-1", plain), Vec::new(), budget);
    let mut second = begin("Re.");
    second.session_id = Some("s1".into());
    let (run2, state) = run(&engine, &limited, second).await;
    assert_eq!(state.status, RunStatus::Completed);
    let events2 = events(&store, &run2).await;
    let hit = exceeded(&events2);
    assert_eq!(hit.len(), 1);
    assert_eq!(
        (
            hit[0].scope.as_str(),
            hit[0].limit.as_str(),
            hit[0].value,
            hit[0].spent
        ),
        ("session", "max_tokens", used as f64, used as f64)
    );
    assert_eq!(
        decided(&events2)[0].reason.as_deref(),
        Some(format!("session budget reached: {used} tokens (limit {used} tokens)").as_str())
    );
    // Stopped before its first call: its only answer is the finalizing one.
    assert_eq!(state.model_calls, 1);
    assert_eq!(
        types(&events2)[3..8],
        [
            "step.started",
            "budget.exceeded",
            "policy.decided",
            "step.completed",
            "run.transitioned"
        ]
    );

    // Another session starts from nothing.
    let mut other = begin("Salut.");
    other.session_id = Some("s2".into());
    let (run3, state3) = run(&engine, &limited, other).await;
    assert!(exceeded(&events(&store, &run3).await).is_empty());
    assert_eq!(state3.model_calls, 1);
}

#[tokio::test]
async fn a_run_s_own_budget_tightens_the_agent_s_limits() {
    let (engine, store) = engine();
    let agent = agent(
        scripted("fake-1", looping_script()),
        vec![add_tool()],
        run_limit(calls(3), OnExceed::Stop),
    );
    // A sub-agent's share (or a caller's budget) tighter than the agent's: it wins.
    let mut request = begin("Compte.");
    request.budget = Some(RunBudget {
        max_cost: None,
        max_tokens: None,
        max_calls: Some(1),
    });
    let (run1, state) = run(&engine, &agent, request).await;
    let events1 = events(&store, &run1).await;
    let Payload::RunStarted(started) = &events1[0].payload else {
        panic!()
    };
    assert_eq!(started.budget.as_ref().and_then(|b| b.max_calls), Some(1));
    assert_eq!(state.budget.as_ref().and_then(|b| b.max_calls), Some(1));
    assert_eq!(
        decided(&events1)[0].reason.as_deref(),
        Some("run budget reached: 1 call (limit 1 call)")
    );
    assert_eq!(state.model_calls, 2);

    // A looser one does not lift the agent's limit.
    let mut request = begin("Compte.");
    request.budget = Some(RunBudget {
        max_cost: None,
        max_tokens: None,
        max_calls: Some(10),
    });
    let (run2, state) = run(&engine, &agent, request).await;
    assert_eq!(
        decided(&events(&store, &run2).await)[0].reason.as_deref(),
        Some("run budget reached: 3 calls (limit 3 calls)")
    );
    assert_eq!(state.model_calls, 4);

    // Without agent budgets, the run's own budget applies, and stops.
    let free = self::agent(scripted("fake-1", looping_script()), vec![add_tool()], None);
    let mut request = begin("Compte.");
    request.budget = Some(RunBudget {
        max_cost: None,
        max_tokens: None,
        max_calls: Some(2),
    });
    let (run3, state) = run(&engine, &free, request).await;
    let events3 = events(&store, &run3).await;
    assert_eq!(exceeded(&events3)[0].action, "stop");
    assert_eq!(state.model_calls, 3);
}

/// A user `before_model` policy that counts its calls and replaces the request by itself.
fn counting_policy(asked: Arc<AtomicUsize>) -> BoundPolicy {
    let policy = FnPolicy::new(
        [Point::BeforeModel],
        [DecisionKind::Replace],
        move |subject, _| {
            asked.fetch_add(1, Ordering::SeqCst);
            match subject {
                loom_core::policy::Subject::Request(request) => Ok(Decision::Replace {
                    value: loom_core::policy::Replacement::Request(request.clone()),
                    reason: Some("same request".into()),
                }),
                _ => Ok(Decision::Continue),
            }
        },
    );
    BoundPolicy::new("mine", Arc::new(policy)).unwrap()
}

#[tokio::test]
async fn the_budget_decides_before_the_agent_s_policies() {
    // Stop: the agent's policy is not asked in the stopped step.
    let (engine, store) = engine();
    let asked = Arc::new(AtomicUsize::new(0));
    let mut stopping = agent(
        scripted("fake-1", looping_script()),
        vec![add_tool()],
        run_limit(calls(1), OnExceed::Stop),
    );
    stopping.policies = vec![counting_policy(asked.clone())];
    let (run1, _) = run(&engine, &stopping, begin("Compte.")).await;
    assert_eq!(
        asked.load(Ordering::SeqCst),
        1,
        "asked before the first call only"
    );
    let events1 = events(&store, &run1).await;
    let policies: Vec<(&str, &str)> = decided(&events1)
        .iter()
        .map(|p| (p.policy.as_str(), p.decision.as_str()))
        .collect();
    assert_eq!(policies, [("mine", "replace"), ("loom.budget", "stop")]);

    // Warn: the warning comes first, then the agent's decision, in the same step.
    let asked = Arc::new(AtomicUsize::new(0));
    let mut warning = agent(
        scripted("fake-1", looping_script()),
        vec![add_tool()],
        run_limit(calls(1), OnExceed::Warn),
    );
    warning.policies = vec![counting_policy(asked.clone())];
    let (run2, state) = run(&engine, &warning, begin("Compte.")).await;
    assert_eq!(asked.load(Ordering::SeqCst), 4);
    assert_eq!(state.model_calls, 4);
    let events2 = events(&store, &run2).await;
    let at = events2
        .iter()
        .position(|e| e.event_type == "budget.exceeded")
        .unwrap();
    assert_eq!(events2[at + 1].event_type, "policy.decided");
    assert_eq!(events2[at + 1].span_id, events2[at].span_id);
    assert_eq!(events2[at + 2].event_type, "model.responded");
}
