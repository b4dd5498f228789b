//! Sub-agents end to end on the memory journal: a child run in the parent's session, its answer
//! and consumption rolled up, the depth limit, the budget share, cancellation through the tree,
//! approvals surfacing on the root, and a kill in the middle of a child.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use loom_core::{
    Event, Message, RunState, RunStatus,
    approval::Decision,
    event::{Envelope, MessageUser, Payload, RunBudget, RunContext, RunStarted, ToolCompleted},
    model::ModelClient,
    ports::EventStore,
    tool::{Approval, FnTool, SideEffects, ToolKind, ToolOutput, ToolSpec},
};
use loom_engine::{
    AGENT_HINT, AgentRuntime, BeginRun, BoundTool, Engine, ModelBinding, RunRef, SubAgentRuntime,
    descendant_approvals, open_descendants,
};
use loom_journal::MemoryStore;
use loom_testkit::{HangingModel, ManualClock, RecordingModel, add_tool, scripted, wait};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

fn agent(name: &str, model: Arc<dyn ModelClient>, tools: Vec<FnTool>) -> AgentRuntime {
    let mut binding = ModelBinding::new("FAKE", "fake-1", model);
    binding.pricing = loom_core::Pricing {
        input: 3.0,
        output: 15.0,
        ..Default::default()
    };
    let mut agent = AgentRuntime::new(name, format!("Tu es {name}."), binding);
    agent.tools = tools
        .into_iter()
        .map(|t| BoundTool::declared(Arc::new(t)).unwrap())
        .collect();
    agent
}

/// `parent` offers `child` as a sub-agent under the child's name.
fn offering(mut parent: AgentRuntime, child: AgentRuntime) -> AgentRuntime {
    parent.subagents.push(SubAgentRuntime::new(
        child.name.clone(),
        "Finds the facts the task needs.",
        Arc::new(child),
    ));
    parent
}

/// The boss hands the question to the researcher, then quotes its answer.
fn boss_script() -> Value {
    json!([
        {"text": "Je délègue.", "tool_calls": [
            {"name": "researcher", "arguments": {"message": "Combien font 2 + 3 ?"}}
        ]},
        {"text": "Le chercheur dit : {{ tool_result }}"}
    ])
}

/// The researcher adds, then answers with the sum.
fn researcher_script() -> Value {
    json!([
        {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
        {"text": "La somme vaut {{ tool_result }}."}
    ])
}

fn setup() -> (Engine, Arc<MemoryStore>, Arc<ManualClock>) {
    let store = Arc::new(MemoryStore::new());
    let clock = Arc::new(ManualClock::new());
    (Engine::new(store.clone(), clock.clone()), store, clock)
}

fn begin(message: &str) -> BeginRun {
    BeginRun {
        tenant_id: "default".into(),
        session_id: None,
        run_id: None,
        user_id: Some("alice".into()),
        metadata: Map::new(),
        message: Message::user(message),
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

/// The id of the only child run in the journal.
fn child_of(events: &[Event]) -> String {
    let children: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(&e.payload, Payload::RunStarted(s) if s.parent_run_id.is_some()))
        .collect();
    assert_eq!(children.len(), 1, "one child run");
    children[0].run_id.clone()
}

fn started(events: &[Event], run_id: &str) -> RunStarted {
    events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::RunStarted(s) if e.run_id == run_id => Some(s.clone()),
            _ => None,
        })
        .unwrap()
}

fn completed_of(events: &[Event], run_id: &str, tool: &str) -> Vec<ToolCompleted> {
    events
        .iter()
        .filter(|e| e.run_id == run_id)
        .filter_map(|e| match &e.payload {
            Payload::ToolCompleted(c) if c.tool_name == tool => Some(c.clone()),
            _ => None,
        })
        .collect()
}

fn called_of(events: &[Event], run_id: &str, tool: &str) -> Vec<loom_core::event::ToolCalled> {
    events
        .iter()
        .filter(|e| e.run_id == run_id)
        .filter_map(|e| match &e.payload {
            Payload::ToolCalled(c) if c.tool_name == tool => Some(c.clone()),
            _ => None,
        })
        .collect()
}

fn cancelled_of(events: &[Event], run_id: &str) -> (usize, loom_core::event::RunCancelled) {
    events
        .iter()
        .enumerate()
        .find_map(|(i, e)| match &e.payload {
            Payload::RunCancelled(c) if e.run_id == run_id => Some((i, c.clone())),
            _ => None,
        })
        .unwrap()
}

#[tokio::test]
async fn a_sub_agent_runs_as_a_child_run_of_the_same_journal() {
    let (engine, store, _) = setup();
    let boss_model = Arc::new(RecordingModel::new(scripted("fake-1", boss_script())));
    let researcher_model = Arc::new(RecordingModel::new(scripted("fake-1", researcher_script())));
    let researcher = agent("researcher", researcher_model.clone(), vec![add_tool()]);
    let boss = offering(agent("boss", boss_model.clone(), Vec::new()), researcher);

    let run = engine
        .begin(&boss, begin("Délègue 2 + 3."), &())
        .await
        .unwrap();
    let state = drive(&engine, &run, &boss).await;
    assert_eq!(state.status, RunStatus::Completed);
    // With a sub-agent offered, results are numbered for `$ref` (the child offers none).
    assert_eq!(
        state.output_text().as_deref(),
        Some("Le chercheur dit : La somme vaut 5.")
    );

    let events = read_all(&store, &run).await;
    let child = child_of(&events);
    // The whole journal, labelled by run: the child runs inside the parent's tool batch.
    let labelled: Vec<String> = events
        .iter()
        .map(|e| {
            let who = if e.run_id == run.run_id { "P" } else { "C" };
            format!("{who} {}", e.event_type)
        })
        .collect();
    assert_eq!(
        labelled,
        [
            "P run.started",
            "P message.user",
            "P run.claimed",
            "P step.started",
            "P model.responded",
            "P step.completed",
            "P run.transitioned",
            "P step.started",
            "P tool.called",
            "C run.started",
            "C message.user",
            "C step.started",
            "C model.responded",
            "C step.completed",
            "C run.transitioned",
            "C step.started",
            "C tool.called",
            "C tool.completed",
            "C step.completed",
            "C run.transitioned",
            "C step.started",
            "C model.responded",
            "C step.completed",
            "C run.transitioned",
            "C run.completed",
            "P tool.completed",
            "P step.completed",
            "P run.transitioned",
            "P step.started",
            "P model.responded",
            "P step.completed",
            "P run.transitioned",
            "P run.completed",
        ]
    );
    // Every event names the root; the child's carry its own agent.
    assert!(events.iter().all(|e| e.root_run_id == run.run_id));
    assert!(
        events
            .iter()
            .filter(|e| e.run_id == child)
            .all(|e| e.agent.as_deref() == Some("researcher"))
    );

    // The child's run.started: parent ids, depth 1, the parent's end user; its span hangs
    // under the parent's call.
    let opened = started(&events, &child);
    let called = called_of(&events, &run.run_id, "researcher");
    assert_eq!(called.len(), 1);
    assert_eq!(opened.parent_run_id.as_deref(), Some(run.run_id.as_str()));
    assert_eq!(
        opened.parent_call_id.as_deref(),
        Some(called[0].call_id.as_str())
    );
    assert_eq!(opened.depth, 1);
    assert_eq!(opened.budget, None, "no share asked, no budget");
    assert_eq!(opened.context.user_id.as_deref(), Some("alice"));
    let call_span = events
        .iter()
        .find(|e| matches!(&e.payload, Payload::ToolCalled(c) if c.tool_name == "researcher"))
        .map(|e| e.span_id.clone());
    let child_start = events.iter().find(|e| e.run_id == child).unwrap();
    assert_eq!(child_start.parent_span_id, call_span);

    // The parent's call names its child and is declared as an agent call.
    assert_eq!(called[0].child_run_id.as_deref(), Some(child.as_str()));
    assert_eq!(called[0].tool_kind, ToolKind::Agent);
    assert!(!called[0].resumed);

    // Only the child's answer comes back, with its consumption.
    let child_state = RunState::fold(&child, &events).unwrap();
    assert_eq!(child_state.status, RunStatus::Completed);
    assert_eq!(child_state.claim, None, "a sub-run takes no lease");
    let done = completed_of(&events, &run.run_id, "researcher");
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].output.visible_text(), "La somme vaut 5.");
    assert!(!done[0].output.is_error);
    assert_eq!(done[0].usage, Some(child_state.usage));
    assert!(child_state.cost_usd > 0.0);
    assert_eq!(done[0].cost_usd, child_state.cost_usd);

    // The parent's total: its own model calls plus the child's, counted once.
    let own: f64 = events
        .iter()
        .filter(|e| e.run_id == run.run_id)
        .filter_map(|e| match &e.payload {
            Payload::ModelResponded(r) => Some(r.cost_usd),
            _ => None,
        })
        .sum();
    assert!((state.cost_usd - (own + child_state.cost_usd)).abs() < 1e-12);
    assert_eq!(state.iterations, 2);
    assert_eq!(
        state.model_calls, 2,
        "the child's model calls stay in its run"
    );
    let Some(Payload::RunCompleted(closing)) = events.last().map(|e| &e.payload) else {
        panic!("the parent closes last")
    };
    assert_eq!(closing.cost_usd, state.cost_usd);

    // The boss saw the sub-agent as a tool, with the hint; the researcher saw only its
    // message, not the boss's conversation.
    let offered = &boss_model.requests()[0].tools;
    let researcher_tool = offered.iter().find(|t| t.name == "researcher").unwrap();
    assert!(
        researcher_tool
            .description
            .starts_with("Finds the facts the task needs.")
    );
    assert!(researcher_tool.description.ends_with(AGENT_HINT));
    assert_eq!(
        researcher_tool.input_schema["properties"]["message"]["minLength"],
        json!(1)
    );
    let first = &researcher_model.requests()[0];
    assert_eq!(first.messages.len(), 1);
    assert_eq!(first.messages[0].text(), "Combien font 2 + 3 ?");
    assert_eq!(first.system, "Tu es researcher.");
}

#[tokio::test]
async fn a_child_at_max_depth_is_not_offered_its_own_sub_agents() {
    let (engine, store, _) = setup();
    let helper = agent(
        "helper",
        scripted("fake-1", json!([{"text": "aidé"}])),
        Vec::new(),
    );
    // The researcher tries its sub-agent anyway, then answers with what it got.
    let researcher_model = Arc::new(RecordingModel::new(scripted(
        "fake-1",
        json!([
            {"tool_calls": [{"name": "helper", "arguments": {"message": "aide-moi"}}]},
            {"text": "Sans aide : {{ tool_result }}"}
        ]),
    )));
    let researcher = offering(
        agent("researcher", researcher_model.clone(), vec![add_tool()]),
        helper,
    );
    let boss = offering(
        agent("boss", scripted("fake-1", boss_script()), Vec::new()),
        researcher,
    );
    let run = engine.begin(&boss, begin("Délègue."), &()).await.unwrap();
    let state = drive(&engine, &run, &boss).await;
    assert_eq!(state.status, RunStatus::Completed);

    let events = read_all(&store, &run).await;
    let child = child_of(&events);
    assert_eq!(started(&events, &child).depth, 1);
    // Depth 1 reached the researcher's max_depth (1): only its own tools are offered.
    let names: Vec<String> = researcher_model.requests()[0]
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(names, ["add"]);
    // The call is refused as an unknown tool, before launch.
    assert!(called_of(&events, &child, "helper").is_empty());
    let refused = completed_of(&events, &child, "helper");
    assert_eq!(refused.len(), 1);
    assert!(refused[0].output.is_error);
    assert_eq!(
        refused[0].output.visible_text(),
        "Unknown tool: 'helper'. Available tools: add."
    );
}

#[tokio::test]
async fn a_deeper_max_depth_opens_grandchildren_under_the_same_root() {
    let (engine, store, _) = setup();
    let helper = agent(
        "helper",
        scripted("fake-1", json!([{"text": "aidé"}])),
        Vec::new(),
    );
    let mut researcher = offering(
        agent(
            "researcher",
            scripted(
                "fake-1",
                json!([
                    {"tool_calls": [{"name": "helper", "arguments": {"message": "aide-moi"}}]},
                    {"text": "Avec aide : {{ tool_result }}"}
                ]),
            ),
            Vec::new(),
        ),
        helper,
    );
    researcher.max_depth = 2;
    let boss = offering(
        agent("boss", scripted("fake-1", boss_script()), Vec::new()),
        researcher,
    );
    let run = engine.begin(&boss, begin("Délègue."), &()).await.unwrap();
    let state = drive(&engine, &run, &boss).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(
        state.output_text().as_deref(),
        Some("Le chercheur dit : Avec aide : aidé")
    );
    let events = read_all(&store, &run).await;
    let runs: Vec<(String, u32, Option<String>)> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::RunStarted(s) => Some((e.run_id.clone(), s.depth, s.parent_run_id.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(runs.len(), 3);
    assert_eq!(
        (runs[1].1, runs[1].2.as_deref()),
        (1, Some(run.run_id.as_str()))
    );
    assert_eq!(
        (runs[2].1, runs[2].2.as_deref()),
        (2, Some(runs[1].0.as_str()))
    );
    assert!(events.iter().all(|e| e.root_run_id == run.run_id));
    // The grandchild's cost rolls up through the child into the root.
    let helper_state = RunState::fold(&runs[2].0, &events).unwrap();
    let child_state = RunState::fold(&runs[1].0, &events).unwrap();
    let own_child: f64 = events
        .iter()
        .filter(|e| e.run_id == runs[1].0)
        .filter_map(|e| match &e.payload {
            Payload::ModelResponded(r) => Some(r.cost_usd),
            _ => None,
        })
        .sum();
    assert!((child_state.cost_usd - (own_child + helper_state.cost_usd)).abs() < 1e-12);
    assert!(open_descendants(&events, &run.run_id).unwrap().is_empty());
}

/// Opens a root run whose `run.started` carries `budget` (as the budget helper will).
async fn begin_with_budget(
    engine: &Engine,
    store: &MemoryStore,
    agent: &AgentRuntime,
    budget: RunBudget,
) -> RunRef {
    let run = RunRef {
        tenant_id: "default".into(),
        session_id: "budgeted".into(),
        run_id: "budgeted".into(),
    };
    let span = engine.ids().uuid();
    let event = |payload| {
        Event::new(
            Envelope {
                event_id: engine.ids().uuid(),
                ts: chrono::Utc::now(),
                tenant_id: run.tenant_id.clone(),
                session_id: run.session_id.clone(),
                run_id: run.run_id.clone(),
                root_run_id: run.run_id.clone(),
                span_id: span.clone(),
                parent_span_id: None,
                agent: Some(agent.name.clone()),
                role: None,
            },
            payload,
        )
    };
    let batch = vec![
        event(Payload::RunStarted(RunStarted {
            kind: "normal".into(),
            context: RunContext {
                tenant_id: "default".into(),
                user_id: None,
                metadata: Map::new(),
            },
            parent_run_id: None,
            parent_call_id: None,
            depth: 0,
            triggered_by: None,
            trigger: None,
            judges: "auto".into(),
            budget: Some(budget),
            state: Map::new(),
        })),
        event(Payload::MessageUser(MessageUser {
            message: Message::user("Délègue."),
            kind: "request".into(),
            policy: None,
            tools: true,
        })),
    ];
    store.append(batch, 0).await.unwrap();
    run
}

#[tokio::test]
async fn the_child_receives_its_share_of_what_remains_of_the_parent_budget() {
    let (engine, store, _) = setup();
    let researcher = agent(
        "researcher",
        scripted("fake-1", researcher_script()),
        vec![add_tool()],
    );
    let mut boss = offering(
        agent("boss", scripted("fake-1", boss_script()), Vec::new()),
        researcher,
    );
    boss.subagents[0].budget_share = Some(0.5);
    let limits = RunBudget {
        max_cost: Some(1.0),
        max_tokens: Some(10_000),
        max_calls: Some(10),
    };
    let run = begin_with_budget(&engine, &store, &boss, limits.clone()).await;
    let state = drive(&engine, &run, &boss).await;
    assert_eq!(state.status, RunStatus::Completed);

    let events = read_all(&store, &run).await;
    let child = child_of(&events);
    // Spent when the call was made: the parent's first model call.
    let first = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::ModelResponded(r) if e.run_id == run.run_id => Some(r.clone()),
            _ => None,
        })
        .unwrap();
    let expected = loom_engine::budget::share(
        &loom_engine::RunLimits::from(&limits),
        loom_engine::budget::Spent {
            cost_usd: first.cost_usd,
            tokens: first.usage.total_tokens(),
            calls: 1,
        },
        0.5,
    )
    .unwrap();
    let opened = started(&events, &child);
    assert_eq!(opened.budget, Some(expected.clone()));
    assert_eq!(expected.max_calls, Some(4), "9 calls remain: half, floored");
    assert_eq!(
        expected.max_tokens,
        Some((10_000 - first.usage.total_tokens()) / 2)
    );
    // The child's state reads it (what budget enforcement uses).
    let child_state = RunState::fold(&child, &events).unwrap();
    assert_eq!(child_state.budget, Some(expected));
}

/// Waits until the journal shows a step of the child run.
async fn until_child_steps(store: &MemoryStore, run: &RunRef) -> String {
    wait::until("a step of the child run", async || {
        let events = read_all(store, run).await;
        events
            .iter()
            .find(|e| matches!(&e.payload, Payload::RunStarted(s) if s.parent_run_id.is_some()))
            .map(|e| e.run_id.clone())
            .filter(|child| {
                events
                    .iter()
                    .any(|e| e.run_id == *child && e.event_type == "step.started")
            })
    })
    .await
}

#[tokio::test]
async fn cancelling_the_parent_while_its_child_runs_cancels_both() {
    let (engine, store, _) = setup();
    let hanging = Arc::new(HangingModel::default());
    let researcher = agent("researcher", hanging.clone(), Vec::new());
    let boss = offering(
        agent("boss", scripted("fake-1", boss_script()), Vec::new()),
        researcher,
    );
    let run = engine.begin(&boss, begin("Délègue."), &()).await.unwrap();
    let token = CancellationToken::new();
    let driving = {
        let (engine, run, boss, token) = (engine.clone(), run.clone(), boss.clone(), token.clone());
        tokio::spawn(async move { engine.drive(&run, &boss, &(), &token).await })
    };
    let child = until_child_steps(&store, &run).await;
    token.cancel();
    let state = tokio::time::timeout(Duration::from_secs(5), driving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(state.status, RunStatus::Cancelled);
    assert!(state.finished);
    assert_eq!(hanging.calls.load(Ordering::SeqCst), 1);

    let events = read_all(&store, &run).await;
    let (child_at, child_cancel) = cancelled_of(&events, &child);
    let (parent_at, parent_cancel) = cancelled_of(&events, &run.run_id);
    assert!(child_at < parent_at, "the child closes before its parent");
    assert_eq!(child_cancel.reason, "parent");
    assert_eq!(child_cancel.by.as_deref(), Some(run.run_id.as_str()));
    assert_eq!(parent_cancel.reason, "requested");
    // The child's interrupted step closed as cancelled, in the child's run.
    assert!(events.iter().any(|e| e.run_id == child
        && matches!(&e.payload, Payload::StepCompleted(s) if s.outcome == loom_core::event::Outcome::Cancelled)));
    // The parent's call got its result before the parent closed.
    let done = completed_of(&events, &run.run_id, "researcher");
    assert_eq!(done.len(), 1);
    assert!(done[0].output.is_error);
    assert_eq!(
        done[0].output.visible_text(),
        "The sub-agent researcher was cancelled."
    );
    // Both folds are closed and consistent.
    assert!(RunState::fold(&child, &events).unwrap().finished);
    assert!(open_descendants(&events, &run.run_id).unwrap().is_empty());
}

/// A tool declared `approval: always` that records its calls.
fn send_tool(sent: Arc<Mutex<Vec<Value>>>) -> FnTool {
    let spec = ToolSpec {
        name: "send".into(),
        description: "Sends an e-mail.".into(),
        input_schema: json!({
            "type": "object",
            "properties": {"to": {"type": "string"}},
            "required": ["to"],
            "additionalProperties": false
        }),
        kind: ToolKind::Python,
        declarations: Default::default(),
    };
    FnTool::new(spec, move |_, args| {
        let sent = sent.clone();
        Box::pin(async move {
            sent.lock().unwrap().push(args.clone());
            let to = args.get("to").and_then(Value::as_str).unwrap_or("?");
            Ok(ToolOutput::text(format!("sent to {to}")))
        })
    })
    .with_declarations(loom_core::tool::ToolDeclarations {
        side_effects: SideEffects::Irreversible,
        approval: Approval::Always,
        ..Default::default()
    })
}

struct Approving {
    engine: Engine,
    store: Arc<MemoryStore>,
    boss: AgentRuntime,
    run: RunRef,
    child: String,
    sent: Arc<Mutex<Vec<Value>>>,
}

/// The boss delegates to a mailer whose `send` needs approval: the tree stops, waiting.
async fn waiting_for_the_child() -> Approving {
    let (engine, store, _) = setup();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let mailer = agent(
        "researcher",
        scripted(
            "fake-1",
            json!([
                {"tool_calls": [{"name": "send", "arguments": {"to": "bob@example.com"}}]},
                {"text": "Courriel : {{ tool_result }}"}
            ]),
        ),
        vec![send_tool(sent.clone())],
    );
    let boss = offering(
        agent("boss", scripted("fake-1", boss_script()), Vec::new()),
        mailer,
    );
    let run = engine
        .begin(&boss, begin("Préviens Bob."), &())
        .await
        .unwrap();
    let state = drive(&engine, &run, &boss).await;
    assert_eq!(state.status, RunStatus::WaitingChild);
    assert!(!state.finished);
    let events = read_all(&store, &run).await;
    let child = child_of(&events);
    Approving {
        engine,
        store,
        boss,
        run,
        child,
        sent,
    }
}

#[tokio::test]
async fn an_approval_in_the_child_is_decided_from_the_root_and_the_child_resumes() {
    let Approving {
        engine,
        store,
        boss,
        run,
        child,
        sent,
    } = waiting_for_the_child().await;
    let events = read_all(&store, &run).await;
    // The child paused; the parent waits for it and handed its lease back.
    let child_state = RunState::fold(&child, &events).unwrap();
    assert_eq!(child_state.status, RunStatus::Paused);
    let parent: Vec<&Event> = events.iter().filter(|e| e.run_id == run.run_id).collect();
    let Payload::RunTransitioned(t) = &parent[parent.len() - 2].payload else {
        panic!("the parent's batch ends with its transition")
    };
    assert_eq!(
        (t.from_state, t.to_state),
        (RunStatus::AwaitingTools, RunStatus::WaitingChild)
    );
    let Payload::RunClaimed(handed) = &parent[parent.len() - 1].payload else {
        panic!("then the lease is handed back")
    };
    assert!(
        handed.lease_until <= parent[parent.len() - 1].ts,
        "a lease ending now"
    );
    assert_eq!(handed.worker_id, engine.worker_id());
    assert!(
        !events
            .iter()
            .any(|e| e.run_id == child && e.event_type == "run.claimed")
    );
    // The request is visible from the root.
    let pending = descendant_approvals(&events, &run.run_id).unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].tool_name, "send");
    assert_eq!(pending[0].run_id, child);

    // Driving the root again while the child still waits writes nothing.
    let again = drive(&engine, &run, &boss).await;
    assert_eq!(again.status, RunStatus::WaitingChild);
    assert_eq!(read_all(&store, &run).await.len(), events.len());

    // Corrected arguments are checked against the child agent's tool, found from the root.
    let refused = engine
        .settle(
            &run,
            &boss,
            Some(&pending[0].call_id),
            &Decision::Approved {
                by: "alice".into(),
                reason: None,
                arguments: Some(json!({"to": 42})),
            },
        )
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("do not match the schema of send"),
        "{refused}"
    );
    assert_eq!(read_all(&store, &run).await.len(), events.len());

    // Approved through the root's id: the decision lands in the child's run.
    let decided = engine
        .settle(
            &run,
            &boss,
            Some(&pending[0].call_id),
            &Decision::Approved {
                by: "alice".into(),
                reason: None,
                arguments: Some(json!({"to": "carol@example.com"})),
            },
        )
        .await
        .unwrap();
    assert_eq!(decided, [pending[0].call_id.clone()]);
    let events = read_all(&store, &run).await;
    let granted = events.last().unwrap();
    assert_eq!(granted.event_type, "approval.granted");
    assert_eq!(granted.run_id, child);
    assert_eq!(granted.root_run_id, run.run_id);
    assert!(
        sent.lock().unwrap().is_empty(),
        "nothing sent before resuming"
    );

    // Resuming the root re-plays the call: the same child resumes, and the parent completes.
    let state = drive(&engine, &run, &boss).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(
        state.output_text().as_deref(),
        Some("Le chercheur dit : Courriel : sent to carol@example.com")
    );
    assert_eq!(*sent.lock().unwrap(), [json!({"to": "carol@example.com"})]);
    let events = read_all(&store, &run).await;
    assert_eq!(child_of(&events), child, "never relaunched");
    let calls = called_of(&events, &run.run_id, "researcher");
    assert_eq!(calls.len(), 2);
    assert!(!calls[0].resumed && calls[1].resumed);
    assert!(
        calls
            .iter()
            .all(|c| c.child_run_id.as_deref() == Some(child.as_str()))
    );
    let child_requests = events
        .iter()
        .filter(|e| e.run_id == child && e.event_type == "message.user")
        .count();
    assert_eq!(child_requests, 1);
    let transitions: Vec<(RunStatus, RunStatus)> = events
        .iter()
        .filter(|e| e.run_id == run.run_id)
        .filter_map(|e| match &e.payload {
            Payload::RunTransitioned(t) => Some((t.from_state, t.to_state)),
            _ => None,
        })
        .collect();
    assert!(transitions.contains(&(RunStatus::WaitingChild, RunStatus::AwaitingTools)));
    assert!(RunState::fold(&child, &events).unwrap().finished);
    let done = completed_of(&events, &run.run_id, "researcher");
    assert_eq!(done.len(), 1);
    assert_eq!(
        done[0].cost_usd,
        RunState::fold(&child, &events).unwrap().cost_usd
    );
}

#[tokio::test]
async fn cancelling_a_root_that_waits_for_its_child_cancels_the_child_first() {
    let Approving {
        engine,
        store,
        boss,
        run,
        child,
        sent,
    } = waiting_for_the_child().await;
    let cancelled = engine
        .cancel_idle(&run, &boss.name, Some("ops".into()))
        .await
        .unwrap();
    assert!(cancelled);
    let events = read_all(&store, &run).await;
    let (child_at, child_cancel) = cancelled_of(&events, &child);
    let (parent_at, parent_cancel) = cancelled_of(&events, &run.run_id);
    assert!(child_at < parent_at);
    assert_eq!(child_cancel.reason, "parent");
    assert_eq!(child_cancel.by.as_deref(), Some(run.run_id.as_str()));
    assert_eq!(child_cancel.withdrawn.len(), 1, "its request is withdrawn");
    assert_eq!(parent_cancel.reason, "requested");
    assert_eq!(parent_cancel.by.as_deref(), Some("ops"));
    // One write: child transition and closing, then the parent's.
    let tail: Vec<(bool, &str)> = events[events.len() - 4..]
        .iter()
        .map(|e| (e.run_id == child, e.event_type.as_str()))
        .collect();
    assert_eq!(
        tail,
        [
            (true, "run.transitioned"),
            (true, "run.cancelled"),
            (false, "run.transitioned"),
            (false, "run.cancelled"),
        ]
    );
    assert!(sent.lock().unwrap().is_empty());
    // Nothing waits any more.
    assert!(
        engine
            .settle(
                &run,
                &boss,
                None,
                &Decision::Approved {
                    by: "alice".into(),
                    reason: None,
                    arguments: None
                }
            )
            .await
            .is_err()
    );
    assert!(
        descendant_approvals(&events, &run.run_id)
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_child_whose_result_never_reached_its_root_still_counts_in_the_roots_spend() {
    let Approving {
        engine,
        store,
        boss,
        run,
        child,
        ..
    } = waiting_for_the_child().await;
    let waiting = read_all(&store, &run).await;
    let own = RunState::fold(&run.run_id, &waiting).unwrap();
    let sub = RunState::fold(&child, &waiting).unwrap();
    assert!(sub.usage.total_tokens() > 0);
    // What session and tenant budgets count for the root: its own calls, and the child's
    // tokens although no result carried them to the root yet (its calls stay the child's).
    let expected = (
        own.usage.total_tokens() + sub.usage.total_tokens(),
        u64::from(own.model_calls),
    );
    let root_spent = |events: &[Event]| {
        let runs = loom_engine::budget::root_runs_spent(events).unwrap();
        assert_eq!(runs.len(), 1, "sub-runs are not listed");
        assert_eq!(runs[0].run_id, run.run_id);
        (runs[0].spent.tokens, runs[0].spent.calls)
    };
    assert_eq!(root_spent(&waiting), expected);
    // Still counted once the tree is cancelled from outside its driver.
    assert!(engine.cancel_idle(&run, &boss.name, None).await.unwrap());
    assert_eq!(root_spent(&read_all(&store, &run).await), expected);
}

#[tokio::test]
async fn an_answered_child_counts_once_in_its_roots_spend() {
    let Approving {
        engine,
        store,
        boss,
        run,
        child,
        ..
    } = waiting_for_the_child().await;
    let decision = Decision::Approved {
        by: "alice".into(),
        reason: None,
        arguments: None,
    };
    engine.settle(&run, &boss, None, &decision).await.unwrap();
    let state = drive(&engine, &run, &boss).await;
    assert_eq!(state.status, RunStatus::Completed);
    let events = read_all(&store, &run).await;
    let sub = RunState::fold(&child, &events).unwrap();
    assert!(sub.finished);
    // The child's tokens came with its result: the root's fold holds them, counted once.
    let runs = loom_engine::budget::root_runs_spent(&events).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].spent.tokens, state.usage.total_tokens());
    assert!(state.usage.total_tokens() > sub.usage.total_tokens());
}

#[tokio::test]
async fn a_parent_that_fails_while_its_child_waits_closes_the_child_first() {
    let Approving {
        engine,
        store,
        mut boss,
        run,
        child,
        ..
    } = waiting_for_the_child().await;
    // The agent's time is already spent: driving on fails the parent before any step.
    boss.timeout = Some(Duration::ZERO);
    engine
        .settle(
            &run,
            &boss,
            None,
            &Decision::Rejected {
                by: "alice".into(),
                reason: None,
            },
        )
        .await
        .unwrap();
    let state = drive(&engine, &run, &boss).await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("timeout"));
    let events = read_all(&store, &run).await;
    let (child_at, child_cancel) = cancelled_of(&events, &child);
    let failed_at = events
        .iter()
        .position(|e| e.run_id == run.run_id && e.event_type == "run.failed")
        .unwrap();
    assert!(child_at < failed_at);
    assert_eq!(child_cancel.reason, "parent");
    assert!(RunState::fold(&child, &events).unwrap().finished);
}

#[tokio::test]
async fn a_child_that_fails_gives_its_parent_an_error_result() {
    let (engine, store, _) = setup();
    let researcher = agent(
        "researcher",
        scripted("fake-1", json!([{"error": "auth"}])),
        Vec::new(),
    );
    let boss = offering(
        agent("boss", scripted("fake-1", boss_script()), Vec::new()),
        researcher,
    );
    let run = engine.begin(&boss, begin("Délègue."), &()).await.unwrap();
    let state = drive(&engine, &run, &boss).await;
    assert_eq!(state.status, RunStatus::Completed, "the parent carries on");
    let events = read_all(&store, &run).await;
    let child = child_of(&events);
    assert_eq!(
        RunState::fold(&child, &events).unwrap().status,
        RunStatus::Failed
    );
    let done = completed_of(&events, &run.run_id, "researcher");
    assert!(done[0].output.is_error);
    assert!(
        done[0]
            .output
            .visible_text()
            .starts_with("The sub-agent researcher failed (model.auth): "),
        "{}",
        done[0].output.visible_text()
    );
}

#[tokio::test]
async fn a_kill_in_the_middle_of_a_child_resumes_the_same_child() {
    let (engine, store, _) = setup();
    let researcher = agent(
        "researcher",
        scripted("fake-1", researcher_script()),
        vec![add_tool()],
    );
    let boss = offering(
        agent("boss", scripted("fake-1", boss_script()), Vec::new()),
        researcher,
    );
    let run = engine
        .begin(&boss, begin("Délègue 2 + 3."), &())
        .await
        .unwrap();
    let finished = drive(&engine, &run, &boss).await;
    assert_eq!(finished.status, RunStatus::Completed);
    let all = read_all(&store, &run).await;
    let child = child_of(&all);

    // The worker died right after the child's tool result was journaled.
    let cut = all
        .iter()
        .position(|e| e.run_id == child && e.event_type == "tool.completed")
        .unwrap()
        + 1;
    let crashed = Arc::new(MemoryStore::new());
    for event in &all[..cut] {
        let mut fresh = event.clone();
        fresh.seq = 0;
        crashed.append(vec![fresh], event.seq - 1).await.unwrap();
    }
    let later = Arc::new(ManualClock::new());
    later.advance(Duration::from_secs(120));
    let engine = Engine::new(crashed.clone(), later);
    // A fresh researcher that counts its model calls.
    let counted = Arc::new(RecordingModel::new(scripted("fake-1", researcher_script())));
    let researcher = agent("researcher", counted.clone(), vec![add_tool()]);
    let boss = offering(
        agent("boss", scripted("fake-1", boss_script()), Vec::new()),
        researcher,
    );
    let resumed = drive(&engine, &run, &boss).await;
    assert_eq!(resumed.status, RunStatus::Completed);
    assert_eq!(resumed.output_text(), finished.output_text());
    let events = read_all(&crashed, &run).await;
    assert_eq!(child_of(&events), child, "the same child, never relaunched");
    // The child went on from its journal: one model call, its second turn.
    assert_eq!(counted.requests().len(), 1);
    let calls = called_of(&events, &run.run_id, "researcher");
    assert_eq!(calls.len(), 2);
    assert!(calls[1].resumed);
    assert_eq!(calls[1].child_run_id.as_deref(), Some(child.as_str()));
    let child_state = RunState::fold(&child, &events).unwrap();
    assert_eq!(child_state.status, RunStatus::Completed);
    assert_eq!(child_state.iterations, 2);
    assert_eq!(
        events
            .iter()
            .filter(|e| e.run_id == child && e.event_type == "run.claimed")
            .count(),
        0
    );
}

#[tokio::test]
async fn a_parent_out_of_time_stops_its_running_child_first() {
    let (engine, store, _) = setup();
    let researcher = agent("researcher", Arc::new(HangingModel::default()), Vec::new());
    let mut boss = offering(
        agent("boss", scripted("fake-1", boss_script()), Vec::new()),
        researcher,
    );
    boss.timeout = Some(Duration::from_millis(200));
    let run = engine.begin(&boss, begin("Délègue."), &()).await.unwrap();
    let state = tokio::time::timeout(Duration::from_secs(5), drive(&engine, &run, &boss))
        .await
        .unwrap();
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("timeout"));
    let events = read_all(&store, &run).await;
    let child = child_of(&events);
    let (child_at, child_cancel) = cancelled_of(&events, &child);
    let failed_at = events
        .iter()
        .position(|e| e.run_id == run.run_id && e.event_type == "run.failed")
        .unwrap();
    assert!(child_at < failed_at);
    assert_eq!(
        (child_cancel.reason.as_str(), child_cancel.by.as_deref()),
        ("parent", Some(run.run_id.as_str()))
    );
    // The call has its result, with what the child consumed (nothing: it never answered).
    let done = completed_of(&events, &run.run_id, "researcher");
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].cost_usd, 0.0);
    assert!(open_descendants(&events, &run.run_id).unwrap().is_empty());
}
