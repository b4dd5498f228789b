//! Human approval in the run loop, on the memory journal: a call declared `approval: always`
//! pauses the run, a decision written later (by any process) settles it, requests expire,
//! an inline approver decides without pausing, and `on_unknown: pause` asks before running
//! an interrupted call again.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use loom_core::{
    Event, Message, RunState, RunStatus,
    approval::{Decision, PendingApproval},
    content::BlockKind,
    event::Payload,
    model::ModelClient,
    ports::EventStore,
    tool::{Approval, FnTool, OnUnknown, SideEffects, ToolKind, ToolOutput, ToolSpec},
};
use loom_engine::{
    AgentRuntime, ApprovalSettings, BeginRun, BoundTool, Engine, EngineError, ModelBinding, RunRef,
    UNKNOWN_REASON,
};
use loom_journal::MemoryStore;
use loom_testkit::{ManualClock, RecordingModel, add_tool, scripted};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

/// A tool that records the arguments it receives and answers "sent to <to>".
fn send_tool(received: Arc<Mutex<Vec<Value>>>) -> FnTool {
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
        let received = received.clone();
        Box::pin(async move {
            received.lock().unwrap().push(args.clone());
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

fn agent(model: Arc<dyn ModelClient>, tools: Vec<FnTool>) -> AgentRuntime {
    let mut agent = AgentRuntime::new(
        "demo",
        "Tu es un assistant.",
        ModelBinding::new("FAKE", "fake-1", model),
    );
    agent.tools = tools
        .into_iter()
        .map(|t| BoundTool::declared(Arc::new(t)).unwrap())
        .collect();
    agent
}

/// The model asks for `send` (to alice) and `add` in one turn, then answers with the results.
fn script() -> Value {
    json!([
        {"text": "J'envoie.", "tool_calls": [
            {"name": "send", "arguments": {"to": "alice@example.com"}},
            {"name": "add", "arguments": {"a": 1, "b": 2}}
        ]},
        {"text": "Fait : {{ tool_result }}"}
    ])
}

struct Setup {
    store: Arc<MemoryStore>,
    clock: Arc<ManualClock>,
    engine: Engine,
    received: Arc<Mutex<Vec<Value>>>,
    model: Arc<RecordingModel>,
    agent: AgentRuntime,
}

fn setup() -> Setup {
    let store = Arc::new(MemoryStore::new());
    let clock = Arc::new(ManualClock::new());
    let engine = Engine::new(store.clone(), clock.clone());
    let received = Arc::new(Mutex::new(Vec::new()));
    let model = Arc::new(RecordingModel::new(scripted("fake-1", script())));
    let agent = agent(model.clone(), vec![send_tool(received.clone()), add_tool()]);
    Setup {
        store,
        clock,
        engine,
        received,
        model,
        agent,
    }
}

fn begin() -> BeginRun {
    BeginRun {
        tenant_id: "default".into(),
        session_id: None,
        run_id: None,
        user_id: None,
        metadata: Map::new(),
        message: Message::user("Envoie le devis à Alice."),
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

async fn paused_run(s: &Setup) -> (RunRef, RunState) {
    let run = s.engine.begin(&s.agent, begin(), &()).await.unwrap();
    let state = drive(&s.engine, &run, &s.agent).await;
    (run, state)
}

async fn read_all(store: &MemoryStore, run: &RunRef) -> Vec<Event> {
    store
        .read(&run.tenant_id, &run.session_id, 0)
        .await
        .unwrap()
}

fn types(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.event_type.as_str()).collect()
}

fn send_call_id(state: &RunState) -> String {
    state.waiting_approvals()[0].call_id.clone()
}

fn completed_output(events: &[Event], call_id: &str) -> ToolOutput {
    events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::ToolCompleted(p) if p.call_id == call_id => Some(p.output.clone()),
            _ => None,
        })
        .expect("the call has a result")
}

#[tokio::test]
async fn a_call_needing_approval_pauses_the_run_after_the_rest_of_its_batch() {
    let s = setup();
    let (run, state) = paused_run(&s).await;

    assert_eq!(state.status, RunStatus::Paused);
    assert!(!state.finished);
    assert!(s.received.lock().unwrap().is_empty(), "send never ran");
    let events = read_all(&s.store, &run).await;
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
            "approval.requested",
            "step.completed",
            "run.transitioned",
            "run.claimed",
        ]
    );
    // The other call of the batch ran.
    let Payload::ToolCalled(called) = &events[8].payload else {
        unreachable!()
    };
    assert_eq!(called.tool_name, "add");
    let Payload::ApprovalRequested(requested) = &events[10].payload else {
        unreachable!()
    };
    assert_eq!(requested.tool_name, "send");
    assert_eq!(requested.arguments, json!({"to": "alice@example.com"}));
    assert_eq!(requested.scope, "approve");
    assert!(
        requested.reason.contains("irreversible"),
        "{}",
        requested.reason
    );
    let expire_at = requested.expire_at.unwrap();
    let delay = expire_at - events[10].ts;
    assert!((delay - chrono::Duration::hours(24)).num_seconds().abs() <= 1);
    assert_eq!(
        events[10].parent_span_id.as_deref(),
        Some(&*events[7].span_id)
    );
    assert_eq!(events[10].status, loom_core::EventStatus::Warning);
    // awaiting_tools → paused, then the lease is handed back (lease_until = now).
    let Payload::RunTransitioned(paused) = &events[12].payload else {
        unreachable!()
    };
    assert_eq!(
        (paused.from_state, paused.to_state),
        (RunStatus::AwaitingTools, RunStatus::Paused)
    );
    let Payload::RunClaimed(handed) = &events[13].payload else {
        unreachable!()
    };
    assert!(handed.lease_until <= events[13].ts);
    // The result lists what waits.
    let pending = state.pending_approvals();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].tool_name, "send");

    // Driving a run that waits writes nothing.
    let again = drive(&s.engine, &run, &s.agent).await;
    assert_eq!(again.status, RunStatus::Paused);
    assert_eq!(read_all(&s.store, &run).await.len(), events.len());
}

#[tokio::test]
async fn a_grant_from_another_engine_runs_the_call_with_corrected_arguments() {
    let s = setup();
    let (run, state) = paused_run(&s).await;
    let call_id = send_call_id(&state);

    // Another process decides: its own engine over the same journal.
    let other = Engine::new(s.store.clone(), s.clock.clone());
    let corrected = json!({"to": "bob@example.com"});
    // Corrected arguments that break the schema are refused; nothing is written.
    let before = read_all(&s.store, &run).await.len();
    let bad = other
        .settle(
            &run,
            &s.agent,
            Some(&call_id),
            &Decision::Approved {
                by: "denis".into(),
                reason: None,
                arguments: Some(json!({"to": 3})),
            },
        )
        .await;
    assert!(matches!(bad, Err(EngineError::Unusable(m)) if m.contains("schema")));
    let unknown = other
        .settle(&run, &s.agent, Some("nope"), &Decision::approved("denis"))
        .await;
    assert!(matches!(unknown, Err(EngineError::UnknownApproval(m)) if m.contains("'nope'")));
    assert_eq!(read_all(&s.store, &run).await.len(), before);

    let decided = other
        .settle(
            &run,
            &s.agent,
            Some(&call_id),
            &Decision::Approved {
                by: "denis".into(),
                reason: Some("ok".into()),
                arguments: Some(corrected.clone()),
            },
        )
        .await
        .unwrap();
    assert_eq!(decided, std::slice::from_ref(&call_id));
    let state = drive(&other, &run, &s.agent).await;

    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(
        *s.received.lock().unwrap(),
        std::slice::from_ref(&corrected)
    );
    let events = read_all(&s.store, &run).await;
    let tail: Vec<&str> = types(&events)[14..].to_vec();
    assert_eq!(
        tail,
        [
            "approval.granted",
            "run.claimed",
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
            "run.completed",
        ]
    );
    let Payload::ApprovalGranted(granted) = &events[14].payload else {
        unreachable!()
    };
    assert_eq!(granted.by, "denis");
    assert_eq!(granted.arguments.as_ref(), Some(&corrected));
    // The decision is written in the request's span.
    assert_eq!(events[14].span_id, events[10].span_id);
    // The journal keeps the model's arguments; the tool got the corrected ones.
    let called = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::ToolCalled(p) if p.call_id == call_id => Some(p.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(called.arguments, json!({"to": "alice@example.com"}));
    assert!(!called.resumed);
    assert_eq!(
        completed_output(&events, &call_id).visible_text(),
        "sent to bob@example.com"
    );
    // The model's next request shows the call as it ran, followed by a note saying so.
    let last = s.model.requests().pop().unwrap();
    let note = last
        .messages
        .iter()
        .map(|message| message.text())
        .find(|t| t.starts_with("[System note"))
        .unwrap();
    assert_eq!(
        note,
        format!(
            "[System note: the call {call_id} to send ran with arguments corrected by denis: \
             {{\"to\":\"bob@example.com\"}}. The call above shows them; the journal keeps the \
             original ones.]"
        )
    );
    // The model is shown the call as it ran.
    let last_request = s.model.requests().pop().unwrap();
    let shown = last_request
        .messages
        .iter()
        .flat_map(|m| m.blocks.iter())
        .find_map(|b| match &b.kind {
            BlockKind::ToolCall {
                call_id: id,
                arguments,
                ..
            } if *id == call_id => Some(arguments.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(shown, corrected);
    // A second decision is refused: nothing waits any more.
    let again = other
        .settle(&run, &s.agent, None, &Decision::approved("denis"))
        .await;
    assert!(
        matches!(again, Err(EngineError::UnknownApproval(m)) if m.contains("nothing is waiting"))
    );
}

#[tokio::test]
async fn a_rejection_gives_the_model_an_error_result_without_running_the_tool() {
    let s = setup();
    let (run, state) = paused_run(&s).await;
    let call_id = send_call_id(&state);

    s.engine
        .settle(
            &run,
            &s.agent,
            None,
            &Decision::rejected("denis", "pas à Alice"),
        )
        .await
        .unwrap();
    let state = drive(&s.engine, &run, &s.agent).await;

    assert_eq!(state.status, RunStatus::Completed);
    assert!(s.received.lock().unwrap().is_empty());
    let events = read_all(&s.store, &run).await;
    let tail: Vec<&str> = types(&events)[14..20].to_vec();
    assert_eq!(
        tail,
        [
            "approval.rejected",
            "run.claimed",
            "run.transitioned",
            "step.started",
            "tool.completed",
            "step.completed",
        ]
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(&e.payload, Payload::ToolCalled(p) if p.call_id == call_id))
    );
    let output = completed_output(&events, &call_id);
    assert!(output.is_error);
    assert!(
        output
            .visible_text()
            .starts_with("Call to send rejected by denis: pas à Alice."),
        "{}",
        output.visible_text()
    );
    // The model read it.
    let last_request = s.model.requests().pop().unwrap();
    assert!(format!("{:?}", last_request.messages).contains("rejected by denis: pas à Alice"));
}

#[tokio::test]
async fn an_expired_request_is_denied_to_the_model_by_default() {
    let s = setup();
    let (run, state) = paused_run(&s).await;
    let call_id = send_call_id(&state);

    s.clock.advance(Duration::from_secs(86_401));
    // Too late to decide.
    let late = s
        .engine
        .settle(&run, &s.agent, None, &Decision::approved("denis"))
        .await;
    assert!(matches!(late, Err(EngineError::Invalid(m)) if m.contains("expired")));
    let state = drive(&s.engine, &run, &s.agent).await;

    assert_eq!(state.status, RunStatus::Completed);
    assert!(s.received.lock().unwrap().is_empty());
    let events = read_all(&s.store, &run).await;
    let expired = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::ApprovalExpired(p) => Some(p.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(expired.action, "deny");
    let output = completed_output(&events, &call_id);
    assert!(output.is_error);
    assert!(output.visible_text().contains("expired"));
}

#[tokio::test]
async fn an_expired_request_fails_the_run_with_on_expiry_fail() {
    let mut s = setup();
    s.agent.approval = ApprovalSettings {
        expires_in: Some(Duration::from_secs(60)),
        on_expiry: loom_core::approval::OnExpiry::Fail,
    };
    let (run, _) = paused_run(&s).await;

    s.clock.advance(Duration::from_secs(61));
    let state = drive(&s.engine, &run, &s.agent).await;

    assert_eq!(state.status, RunStatus::Failed);
    assert!(state.finished);
    assert_eq!(state.error_type.as_deref(), Some("approval.expired"));
    assert!(state.error.unwrap().contains("send"));
    let events = read_all(&s.store, &run).await;
    let tail: Vec<&str> = types(&events)[14..].to_vec();
    assert_eq!(
        tail,
        [
            "run.claimed",
            "approval.expired",
            "run.transitioned",
            "run.failed"
        ]
    );
}

#[tokio::test]
async fn an_inline_approver_decides_without_pausing() {
    let s = setup();
    let asked: Arc<Mutex<Vec<PendingApproval>>> = Arc::default();
    let seen = asked.clone();
    let approver = move |pending: PendingApproval| {
        seen.lock().unwrap().push(pending.clone());
        async move {
            Decision::Approved {
                by: "script".into(),
                reason: None,
                arguments: Some(json!({"to": "carol@example.com"})),
            }
        }
    };
    let run = s.engine.begin(&s.agent, begin(), &()).await.unwrap();
    let state = s
        .engine
        .drive_with(
            &run,
            &s.agent,
            &(),
            &CancellationToken::new(),
            Some(Arc::new(approver)),
        )
        .await
        .unwrap();

    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(
        *s.received.lock().unwrap(),
        [json!({"to": "carol@example.com"})]
    );
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].tool_name, "send");
    assert_eq!(asked[0].run_id, run.run_id);
    let events = read_all(&s.store, &run).await;
    let types = types(&events);
    assert!(
        !events.iter().any(
            |e| matches!(&e.payload, Payload::RunTransitioned(t) if t.to_state == RunStatus::Paused)
        ),
        "the run never pauses"
    );
    let batch: Vec<&str> = types[7..13].to_vec();
    assert_eq!(
        batch,
        [
            "step.started",
            "approval.requested",
            "approval.granted",
            "tool.called",
            "tool.called",
            "tool.completed",
        ]
    );

    // A rejecting approver: the model gets the error, the tool never runs.
    let s = setup();
    let run = s.engine.begin(&s.agent, begin(), &()).await.unwrap();
    let approver =
        |_: PendingApproval| async { Decision::rejected("script", "interdit par le script") };
    let state = s
        .engine
        .drive_with(
            &run,
            &s.agent,
            &(),
            &CancellationToken::new(),
            Some(Arc::new(approver)),
        )
        .await
        .unwrap();
    assert_eq!(state.status, RunStatus::Completed);
    assert!(s.received.lock().unwrap().is_empty());
    let events = read_all(&s.store, &run).await;
    let call_id = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::ApprovalRejected(p) => Some(p.call_id.clone()),
            _ => None,
        })
        .unwrap();
    assert!(
        completed_output(&events, &call_id)
            .visible_text()
            .contains("rejected by script: interdit par le script")
    );
}

/// A journal cut right after `tool.called` of an irreversible tool declared
/// `on_unknown: pause`, as a crash would leave it; and the agent to resume it.
async fn crashed_mid_call() -> (
    Arc<MemoryStore>,
    RunRef,
    AgentRuntime,
    Arc<Mutex<Vec<Value>>>,
) {
    let received = Arc::new(Mutex::new(Vec::new()));
    let tool = send_tool(received.clone()).with_declarations(loom_core::tool::ToolDeclarations {
        side_effects: SideEffects::Irreversible,
        on_unknown: OnUnknown::Pause,
        ..Default::default()
    });
    let agent = agent(
        scripted(
            "fake-1",
            json!([
                {"tool_calls": [{"name": "send", "arguments": {"to": "alice@example.com"}}]},
                {"text": "fini : {{ tool_result }}"}
            ]),
        ),
        vec![tool],
    );
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::new(store.clone(), Arc::new(ManualClock::new()));
    let run = engine.begin(&agent, begin(), &()).await.unwrap();
    drive(&engine, &run, &agent).await;
    let all = read_all(&store, &run).await;
    let cut = all
        .iter()
        .position(|e| matches!(e.payload, Payload::ToolCalled(_)))
        .unwrap()
        + 1;
    let crashed = Arc::new(MemoryStore::new());
    for event in &all[..cut] {
        let mut fresh = event.clone();
        fresh.seq = 0;
        crashed.append(vec![fresh], event.seq - 1).await.unwrap();
    }
    received.lock().unwrap().clear();
    (crashed, run, agent, received)
}

/// An engine whose clock is past the crashed worker's lease.
fn later_engine(store: Arc<MemoryStore>) -> Engine {
    let later = Arc::new(ManualClock::new());
    later.advance(Duration::from_secs(120));
    Engine::new(store, later)
}

#[tokio::test]
async fn an_interrupted_unsafe_call_with_on_unknown_pause_asks_before_running_again() {
    // Granted: the call runs again once, marked resumed.
    let (store, run, agent, received) = crashed_mid_call().await;
    let engine = later_engine(store.clone());
    let state = drive(&engine, &run, &agent).await;
    assert_eq!(state.status, RunStatus::Paused);
    assert_eq!(state.waiting_approvals()[0].reason, UNKNOWN_REASON);
    assert!(received.lock().unwrap().is_empty());

    engine
        .settle(&run, &agent, None, &Decision::approved("denis"))
        .await
        .unwrap();
    let state = drive(&engine, &run, &agent).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(received.lock().unwrap().len(), 1);
    let events = read_all(&store, &run).await;
    let relaunched: Vec<bool> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ToolCalled(p) => Some(p.resumed),
            _ => None,
        })
        .collect();
    assert_eq!(relaunched, [false, true]);
    assert_eq!(state.approvals.len(), 1);
    assert!(state.approvals[0].launched);

    // Rejected: the model is told, nothing runs.
    let (store, run, agent, received) = crashed_mid_call().await;
    let engine = later_engine(store.clone());
    drive(&engine, &run, &agent).await;
    engine
        .settle(
            &run,
            &agent,
            None,
            &Decision::rejected("denis", "déjà envoyé"),
        )
        .await
        .unwrap();
    let state = drive(&engine, &run, &agent).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert!(received.lock().unwrap().is_empty());
    let events = read_all(&store, &run).await;
    let call_id = state.approvals[0].call_id.clone();
    let output = completed_output(&events, &call_id);
    assert!(output.is_error);
    assert!(output.visible_text().contains("déjà envoyé"));
}

#[tokio::test]
async fn cancelling_a_paused_run_withdraws_its_requests() {
    let s = setup();
    let (run, state) = paused_run(&s).await;
    let call_id = send_call_id(&state);

    assert!(
        s.engine
            .cancel_idle(&run, "demo", Some("denis".into()))
            .await
            .unwrap()
    );

    let events = read_all(&s.store, &run).await;
    let Some(Payload::RunCancelled(cancelled)) = events.last().map(|e| &e.payload) else {
        panic!("the run ends cancelled");
    };
    assert_eq!(cancelled.withdrawn, [call_id]);
    // A decision that comes too late finds nothing waiting.
    let late = s
        .engine
        .settle(&run, &s.agent, None, &Decision::approved("denis"))
        .await;
    assert!(matches!(late, Err(EngineError::UnknownApproval(_))));
}

#[tokio::test]
async fn the_same_call_rejected_once_is_not_asked_again_in_the_run() {
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::new(store.clone(), Arc::new(ManualClock::new()));
    let received = Arc::new(Mutex::new(Vec::new()));
    let model = scripted(
        "fake-1",
        json!([
            {"text": "J'envoie.", "tool_calls": [{"name": "send", "arguments": {"to": "alice@example.com"}}]},
            {"text": "Je réessaie.", "tool_calls": [{"name": "send", "arguments": {"to": "alice@example.com"}}]},
            {"text": "Tant pis : {{ tool_result }}"}
        ]),
    );
    let agent = agent(model, vec![send_tool(received.clone())]);
    let run = engine.begin(&agent, begin(), &()).await.unwrap();
    let state = drive(&engine, &run, &agent).await;
    assert_eq!(state.status, RunStatus::Paused);
    let call_id = send_call_id(&state);
    engine
        .settle(
            &run,
            &agent,
            Some(&call_id),
            &Decision::Rejected {
                by: "denis".into(),
                reason: Some("pas maintenant".into()),
            },
        )
        .await
        .unwrap();
    let state = drive(&engine, &run, &agent).await;
    // The identical second call is refused without a second request.
    assert_eq!(state.status, RunStatus::Completed);
    let events = read_all(&store, &run).await;
    assert_eq!(
        types(&events)
            .iter()
            .filter(|t| **t == "approval.requested")
            .count(),
        1
    );
    assert_eq!(
        completed_output(&events, "fake_1_0").visible_text(),
        "Call to send not run: the same call, with the same arguments, was already refused at \
         approval (by denis). It is not asked again."
    );
    assert!(received.lock().unwrap().is_empty());
}
