//! The run loop, end to end on the memory journal: event sequences, tools, limits, cancellation,
//! sessions and resumption.

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
    content::BlockKind,
    event::Payload,
    model::{ModelClient, ToolChoice},
    ports::EventStore,
    tool::{FnTool, ToolKind, ToolOutput, ToolSpec},
};
use loom_engine::{
    AgentRuntime, BeginRun, BoundTool, Cancel, Engine, EngineError, ModelBinding, RunRef,
};
use loom_journal::MemoryStore;
use loom_testkit::{
    FakeSource, HangingModel, ManualClock, RecordingModel, add_tool, big_tool, counting_tool,
    failing_tool, panicking_tool, scripted, sleep_tool, wait,
};
use serde_json::{Map, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

fn agent(model: Arc<dyn ModelClient>, tools: Vec<FnTool>) -> AgentRuntime {
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
    agent
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
    store
        .read(&run.tenant_id, &run.session_id, 0)
        .await
        .unwrap()
}

fn types(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| e.event_type.clone()).collect()
}

fn calc_script() -> serde_json::Value {
    json!([
        {"text": "Je calcule.", "tool_calls": [{"name": "add", "arguments": {"a": 12, "b": 7}}]},
        {"text": "Cela fait {{ tool_result }}."}
    ])
}

#[tokio::test]
async fn one_tool_run_writes_the_reference_sequence() {
    let (engine, store) = engine();
    let agent = agent(scripted("fake-1", calc_script()), vec![add_tool()]);
    let (run, state) = run(&engine, &agent, begin("12 + 7 ?")).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().as_deref(), Some("Cela fait 19."));
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
            "run.completed",
        ]
    );
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=17).collect::<Vec<_>>());
    // Spans: steps under the run span, tool events under their step span.
    let run_span = &events[0].span_id;
    assert!(events[3].parent_span_id.as_ref() == Some(run_span));
    assert_eq!(events[8].parent_span_id.as_ref(), Some(&events[7].span_id));
    assert_eq!(events[4].role.as_deref(), Some("main"));
    // Transitions name their cause.
    let Payload::RunTransitioned(t) = &events[6].payload else {
        panic!()
    };
    assert_eq!(
        t.cause_event_id.as_deref(),
        Some(events[4].event_id.as_str())
    );
    let Payload::RunTransitioned(t) = &events[11].payload else {
        panic!()
    };
    assert_eq!(
        t.cause_event_id.as_deref(),
        Some(events[9].event_id.as_str())
    );
    // Every event re-reads cleanly from its own JSON.
    for event in &events {
        assert_eq!(&Event::from_json(&event.to_json()).unwrap(), event);
    }
    // Cost comes from pricing and usage.
    let Payload::RunCompleted(done) = &events[16].payload else {
        panic!()
    };
    assert_eq!(done.iterations, 2);
    assert!(done.usage.input_tokens > 0 && done.cost_usd > 0.0);
    let expected =
        (done.usage.input_tokens as f64 * 3.0 + done.usage.output_tokens as f64 * 15.0) / 1e6;
    assert!((done.cost_usd - expected).abs() < 1e-12);
}

#[tokio::test]
async fn parallel_results_are_journaled_as_they_finish_and_sent_in_call_order() {
    let (engine, store) = engine();
    let model = Arc::new(RecordingModel::new(scripted(
        "fake-1",
        json!([
            {"tool_calls": [
                {"name": "slow", "arguments": {"ms": 150}},
                {"name": "fast", "arguments": {"ms": 1}}
            ]},
            {"text": "fini"}
        ]),
    )));
    let agent = agent(
        model.clone(),
        vec![sleep_tool("slow", 150), sleep_tool("fast", 1)],
    );
    let (run, state) = run(&engine, &agent, begin("go")).await;
    assert_eq!(state.status, RunStatus::Completed);
    let events = events(&store, &run).await;
    let tool_events: Vec<(String, String)> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ToolCalled(p) => Some(("called".into(), p.tool_name.clone())),
            Payload::ToolCompleted(p) => Some(("completed".into(), p.tool_name.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        tool_events,
        [
            ("called".into(), "slow".into()),
            ("called".into(), "fast".into()),
            ("completed".into(), "fast".into()),
            ("completed".into(), "slow".into()),
        ]
    );
    let requests = model.requests();
    let results = requests[1].messages.last().unwrap();
    let order: Vec<&str> = results
        .blocks
        .iter()
        .filter_map(|b| match &b.kind {
            BlockKind::ToolResult { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(order, ["fake_0_0", "fake_0_1"]);
}

#[tokio::test]
async fn max_iterations_leads_to_one_final_answer_without_tools() {
    let (engine, _store) = engine();
    let model = Arc::new(RecordingModel::new(scripted(
        "fake-1",
        json!([
            {"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 1}}]},
            {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 2}}]},
            {"text": "encore", "forced": "Voici ce que j'ai.", "tool_calls": [{"name": "add", "arguments": {"a": 3, "b": 3}}]}
        ]),
    )));
    let mut agent = agent(model.clone(), vec![add_tool()]);
    agent.max_iterations = 2;
    let (_, state) = run(&engine, &agent, begin("boucle")).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.iterations, 3);
    assert_eq!(state.output_text().as_deref(), Some("Voici ce que j'ai."));
    let last = model.requests().pop().unwrap();
    assert_eq!(last.tool_choice, ToolChoice::None);
    assert_eq!(
        last.messages.last().unwrap().text(),
        loom_core::model::FINALIZE_HINT
    );
}

#[tokio::test]
async fn invalid_arguments_and_unknown_tools_are_refused_before_launch() {
    let (engine, store) = engine();
    let model = scripted(
        "fake-1",
        json!([
            {"tool_calls": [
                {"name": "add", "arguments": {"a": "un", "wrong": 2}},
                {"name": "nope", "arguments": {}}
            ]},
            {"text": "désolé"}
        ]),
    );
    let agent = agent(model, vec![add_tool()]);
    let (run, state) = run(&engine, &agent, begin("x")).await;
    assert_eq!(state.status, RunStatus::Completed);
    let events = events(&store, &run).await;
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.payload, Payload::ToolCalled(_)))
    );
    let outputs: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ToolCompleted(p) => {
                assert!(p.output.is_error);
                assert_eq!(e.status, loom_core::EventStatus::Error);
                Some(p.output.visible_text())
            }
            _ => None,
        })
        .collect();
    assert_eq!(outputs.len(), 2);
    assert!(
        outputs[0].starts_with("Arguments do not match the tool's schema:\n- (root): "),
        "{}",
        outputs[0]
    );
    assert!(
        outputs[0].contains("\"b\" is a required property"),
        "{}",
        outputs[0]
    );
    assert!(outputs[0].contains("- /a: "), "{}", outputs[0]);
    assert_eq!(outputs[1], "Unknown tool: 'nope'. Available tools: add.");
}

#[tokio::test]
async fn tool_errors_panics_and_timeouts_become_error_results() {
    let (engine, store) = engine();
    let model = scripted(
        "fake-1",
        json!([
            {"tool_calls": [
                {"name": "broken", "arguments": {}},
                {"name": "crash", "arguments": {}},
                {"name": "slow", "arguments": {"ms": 5000}}
            ]},
            {"text": "ok"}
        ]),
    );
    let mut slow = sleep_tool("slow", 5000);
    slow.declarations_mut().timeout = Some(Duration::from_millis(50));
    let agent = agent(
        model,
        vec![
            failing_tool("broken", "client inconnu : 'X'"),
            panicking_tool("crash"),
            slow,
        ],
    );
    let (run, state) = run(&engine, &agent, begin("x")).await;
    assert_eq!(state.status, RunStatus::Completed);
    let mut outputs: Vec<(String, String)> = events(&store, &run)
        .await
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ToolCompleted(p) => Some((p.tool_name.clone(), p.output.visible_text())),
            _ => None,
        })
        .collect();
    outputs.sort();
    assert_eq!(
        outputs,
        [
            ("broken".into(), "client inconnu : 'X'".into()),
            (
                "crash".into(),
                "The tool crash stopped abnormally: boom".into()
            ),
            ("slow".into(), "Timed out: no answer in 0.05 s.".into()),
        ]
    );
}

#[tokio::test]
async fn agent_timeout_fails_the_run_mid_step() {
    let (engine, store) = engine();
    let mut agent = agent(Arc::new(HangingModel::default()), vec![]);
    agent.timeout = Some(Duration::from_millis(100));
    let (run, state) = run(&engine, &agent, begin("x")).await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("timeout"));
    assert!(
        state
            .error
            .as_deref()
            .unwrap()
            .starts_with("maximum time of 0.1 s exceeded: step 1 was interrupted")
    );
    let events = events(&store, &run).await;
    assert_eq!(
        types(&events)[3..],
        [
            "step.started",
            "step.completed",
            "run.transitioned",
            "run.failed"
        ]
    );
}

#[tokio::test]
async fn cancellation_closes_the_run_during_a_step() {
    let (engine, store) = engine();
    let agent = agent(Arc::new(HangingModel::default()), vec![]);
    let run = engine.begin(&agent, begin("x"), &()).await.unwrap();
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        trigger.cancel();
    });
    let state = engine.drive(&run, &agent, &(), &cancel).await.unwrap();
    assert_eq!(state.status, RunStatus::Cancelled);
    assert!(state.finished);
    let events = events(&store, &run).await;
    assert_eq!(
        types(&events)[3..],
        [
            "step.started",
            "step.completed",
            "run.transitioned",
            "run.cancelled"
        ]
    );
    let Payload::StepCompleted(step) = &events[4].payload else {
        panic!()
    };
    assert_eq!(step.outcome, loom_core::event::Outcome::Cancelled);
    // A plain token names no one.
    let Payload::RunCancelled(cancelled) = &events[6].payload else {
        panic!()
    };
    assert_eq!(
        (cancelled.reason.as_str(), cancelled.by.as_deref()),
        ("requested", None)
    );
}

/// A run driven here and cancelled through its [`Cancel`] journals who asked, as a run closed
/// by `cancel_idle` does: while it waits for the model, and while a tool runs.
#[tokio::test]
async fn a_driven_run_cancelled_records_who_cancelled_it() {
    let (engine, store) = engine();
    let waiting_model = agent(Arc::new(HangingModel::default()), vec![]);
    let in_a_tool = agent(
        scripted(
            "fake-1",
            json!([{"tool_calls": [{"name": "slow", "arguments": {}}]}, {"text": "fini"}]),
        ),
        vec![sleep_tool("slow", 10_000)],
    );
    for (agent, under_way, by) in [
        (&waiting_model, "step.started", "alice"),
        (&in_a_tool, "tool.called", "bob"),
    ] {
        let run = engine.begin(agent, begin("x"), &()).await.unwrap();
        let cancel = Cancel::new();
        // Cancels once the run is under way, alongside the drive (no task left unjoined).
        let cancel_under_way = async {
            wait::until(format!("the run to write {under_way}"), async || {
                events(&store, &run)
                    .await
                    .iter()
                    .any(|e| e.event_type == under_way)
            })
            .await;
            cancel.cancel(Some(by.to_owned()));
        };
        let (state, ()) = tokio::join!(engine.drive(&run, agent, &(), &cancel), cancel_under_way);
        let state = state.unwrap();
        assert_eq!(state.status, RunStatus::Cancelled);
        let last = events(&store, &run).await.pop().unwrap();
        let Payload::RunCancelled(cancelled) = &last.payload else {
            panic!("{last:?}")
        };
        assert_eq!(
            (cancelled.reason.as_str(), cancelled.by.as_deref()),
            ("requested", Some(by))
        );
    }
}

#[tokio::test]
async fn cancelling_an_idle_run_closes_it_once() {
    let (engine, _store) = engine();
    let agent = agent(scripted("fake-1", calc_script()), vec![add_tool()]);
    let run = engine.begin(&agent, begin("x"), &()).await.unwrap();
    assert!(
        engine
            .cancel_idle(&run, "demo", Some("alice".into()))
            .await
            .unwrap()
    );
    assert!(!engine.cancel_idle(&run, "demo", None).await.unwrap());
    let state = engine
        .drive(&run, &agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(state.status, RunStatus::Cancelled);
}

#[tokio::test]
async fn model_errors_fail_the_run_with_their_kind() {
    let (engine, _store) = engine();
    let agent = agent(scripted("fake-1", json!([{"error": "auth"}])), vec![]);
    let (_, state) = run(&engine, &agent, begin("x")).await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("model.auth"));
}

#[tokio::test]
async fn a_session_rereads_its_conversation() {
    let (engine, store) = engine();
    let model = Arc::new(RecordingModel::new(scripted("fake-1", calc_script())));
    let agent = agent(model.clone(), vec![add_tool()]);
    let mut first = begin("12 + 7 ?");
    first.session_id = Some("s1".into());
    let (run1, _) = run(&engine, &agent, first).await;
    let mut second = begin("Et encore ?");
    second.session_id = Some("s1".into());
    let (run2, state) = run(&engine, &agent, second).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(run1.session_id, run2.session_id);
    let request = &model.requests()[2];
    // user, assistant(call), tool(result), assistant, then the new user message.
    assert_eq!(request.messages.len(), 5);
    assert_eq!(request.messages[4].text(), "Et encore ?");
    let all = events(&store, &run2).await;
    assert_eq!(all.len(), 34);
    assert_eq!(all.last().unwrap().seq, 34);
    // A chosen run id that exists is refused and nothing is written.
    let mut again = begin("x");
    again.session_id = Some("s1".into());
    again.run_id = Some(run1.run_id.clone());
    assert!(matches!(
        engine.begin(&agent, again, &()).await,
        Err(EngineError::RunExists { .. })
    ));
    assert_eq!(events(&store, &run2).await.len(), 34);
}

/// The four requests of two completed runs of the calculator in one session.
async fn requests_of_two_runs() -> Vec<loom_core::model::ModelRequest> {
    let (engine, _) = engine();
    let model = Arc::new(RecordingModel::new(scripted("fake-1", calc_script())));
    let agent = agent(model.clone(), vec![add_tool()]);
    for message in ["12 + 7 ?", "Et encore ?"] {
        let begin = BeginRun {
            session_id: Some("one-session".into()),
            ..begin(message)
        };
        let (_, state) = run(&engine, &agent, begin).await;
        assert_eq!(state.status, RunStatus::Completed);
    }
    let requests = model.requests();
    assert_eq!(requests.len(), 4);
    requests
}

/// A tool's schema is prepared once, when the agent binds the tool, and a model's parameters
/// when the agent binds the model: every request of every run offers that one schema and
/// carries those parameters, not copies of them.
#[tokio::test]
async fn every_request_offers_the_schema_and_parameters_bound_once() {
    let requests = requests_of_two_runs().await;
    let bound = &requests[0].tools[0].input_schema;
    assert_eq!(
        **bound,
        loom_core::tool::Tool::spec(&add_tool()).input_schema
    );
    for request in &requests[1..] {
        assert!(Arc::ptr_eq(bound, &request.tools[0].input_schema));
        assert!(Arc::ptr_eq(&requests[0].params, &request.params));
    }
}

/// A session's history is the same messages in every request of a run: shared, not copied
/// per model call.
#[tokio::test]
async fn the_requests_of_a_run_share_the_session_history() {
    let requests = requests_of_two_runs().await;
    // The second run's two calls: the first run's messages, then its own.
    let history = requests[1].messages.len() + 1;
    let (first, second) = (&requests[2].messages, &requests[3].messages);
    assert_eq!(first[0].text(), "12 + 7 ?");
    assert_eq!(first[history].text(), "Et encore ?");
    for (a, b) in first[..history].iter().zip(&second[..history]) {
        assert!(Arc::ptr_eq(a, b), "{a:?} copied");
    }
}

#[tokio::test]
async fn a_live_claim_of_another_worker_is_a_conflict() {
    let (engine, store) = engine();
    let agent = agent(scripted("fake-1", calc_script()), vec![add_tool()]);
    let run = engine.begin(&agent, begin("x"), &()).await.unwrap();
    // Another worker (another engine over the same journal) holds the run.
    let other = Engine::new(store.clone(), Arc::new(ManualClock::new()));
    let gate = CancellationToken::new();
    gate.cancel();
    let _ = other.drive(&run, &agent, &(), &gate).await.unwrap();
    // The first worker's claim was written then the run cancelled: drive a fresh run instead.
    let run = engine.begin(&agent, begin("y"), &()).await.unwrap();
    let claim = {
        let events = events(&store, &run).await;
        let mut claim = events[0].clone();
        claim.payload = Payload::RunClaimed(loom_core::event::RunClaimed {
            worker_id: "worker-elsewhere".into(),
            lease_until: chrono::Utc::now() + chrono::Duration::hours(1),
        });
        Event::new(
            loom_core::event::Envelope {
                event_id: "01a2272b-0000-7000-8000-000000000001".into(),
                ts: claim.ts,
                tenant_id: claim.tenant_id.clone(),
                session_id: claim.session_id.clone(),
                run_id: claim.run_id.clone(),
                root_run_id: claim.root_run_id.clone(),
                span_id: claim.span_id.clone(),
                parent_span_id: None,
                agent: claim.agent.clone(),
                role: None,
            },
            claim.payload,
        )
    };
    store.append(vec![claim], 2).await.unwrap();
    let before = events(&store, &run).await.len();
    let err = engine
        .drive(&run, &agent, &(), &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        matches!(err, EngineError::ClaimConflict { ref worker_id, .. } if worker_id == "worker-elsewhere")
    );
    assert_eq!(events(&store, &run).await.len(), before);
}

#[tokio::test]
async fn resuming_after_a_crash_mid_call_reruns_only_safe_tools() {
    for (idempotent_or_pure, expect_rerun) in [(true, true), (false, false)] {
        let (engine, store) = engine();
        let counter = Arc::new(AtomicUsize::new(0));
        let mut tool = counting_tool("send", counter.clone());
        if !idempotent_or_pure {
            tool.declarations_mut().side_effects = loom_core::tool::SideEffects::Irreversible;
        }
        let agent = agent(
            scripted(
                "fake-1",
                json!([{"tool_calls": [{"name": "send", "arguments": {}}]}, {"text": "fini"}]),
            ),
            vec![tool],
        );
        let (run, _) = run(&engine, &agent, begin("x")).await;
        // Rebuild the journal as a crash right after tool.called would have left it.
        let all = events(&store, &run).await;
        let cut = all
            .iter()
            .position(|e| matches!(e.payload, Payload::ToolCalled(_)))
            .unwrap()
            + 1;
        let crashed = MemoryStore::new();
        for event in &all[..cut] {
            let mut fresh = event.clone();
            fresh.seq = 0;
            crashed.append(vec![fresh], event.seq - 1).await.unwrap();
        }
        let crashed = Arc::new(crashed);
        // The crashed worker's lease (60 s) has run out when another process resumes.
        let later = Arc::new(ManualClock::new());
        later.advance(Duration::from_secs(120));
        let resumed = Engine::new(crashed.clone(), later);
        let before = counter.load(Ordering::SeqCst);
        let state = resumed
            .drive(&run, &agent, &(), &CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(state.status, RunStatus::Completed);
        let after: Vec<Event> = crashed.read("default", &run.session_id, 0).await.unwrap();
        let completed = after
            .iter()
            .find_map(|e| match &e.payload {
                Payload::ToolCompleted(p) => Some(p.output.clone()),
                _ => None,
            })
            .unwrap();
        if expect_rerun {
            assert_eq!(counter.load(Ordering::SeqCst), before + 1);
            assert!(
                after
                    .iter()
                    .any(|e| matches!(&e.payload, Payload::ToolCalled(p) if p.resumed))
            );
            assert!(!completed.is_error);
        } else {
            assert_eq!(counter.load(Ordering::SeqCst), before);
            assert!(completed.is_error);
            assert_eq!(completed.visible_text(), loom_engine::UNKNOWN_STATE);
        }
    }
}

#[tokio::test]
async fn the_idempotency_key_is_stable_for_a_call() {
    let (engine, store) = engine();
    let counter = Arc::new(AtomicUsize::new(0));
    let agent = agent(
        scripted(
            "fake-1",
            json!([{"tool_calls": [{"name": "count", "arguments": {}}]}, {"text": "fini"}]),
        ),
        vec![counting_tool("count", counter)],
    );
    let (run, _) = run(&engine, &agent, begin("x")).await;
    let output = events(&store, &run)
        .await
        .iter()
        .find_map(|e| match &e.payload {
            Payload::ToolCompleted(p) => Some(p.output.visible_text()),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        output,
        loom_engine::idempotency_key(&run.run_id, "fake_0_0")
    );
}

#[tokio::test]
async fn the_run_timeout_covers_the_whole_tool_batch() {
    let (engine, _store) = engine();
    let model = scripted(
        "fake-1",
        json!([
            {"tool_calls": [
                {"name": "a", "arguments": {"ms": 150}},
                {"name": "b", "arguments": {"ms": 300}},
                {"name": "c", "arguments": {"ms": 450}}
            ]},
            {"text": "fini"}
        ]),
    );
    // Each wait between two results is shorter than the timeout; the batch as a whole is not.
    let mut agent = agent(
        model,
        vec![
            sleep_tool("a", 150),
            sleep_tool("b", 300),
            sleep_tool("c", 450),
        ],
    );
    agent.timeout = Some(Duration::from_millis(250));
    let (_, state) = run(&engine, &agent, begin("x")).await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("timeout"));
}

#[tokio::test]
async fn the_lease_is_renewed_during_a_long_step() {
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::new(store.clone(), Arc::new(loom_journal_clock()))
        .with_lease(Duration::from_millis(300));
    let model = scripted(
        "fake-1",
        json!([{"tool_calls": [{"name": "slow", "arguments": {"ms": 1300}}]}, {"text": "fini"}]),
    );
    let agent = agent(model, vec![sleep_tool("slow", 1300)]);
    let (run, state) = run(&engine, &agent, begin("x")).await;
    assert_eq!(state.status, RunStatus::Completed);
    let events = events(&store, &run).await;
    let batch_start = events
        .iter()
        .position(|e| matches!(e.payload, Payload::ToolCalled(_)))
        .unwrap();
    let batch_end = events
        .iter()
        .position(|e| matches!(e.payload, Payload::ToolCompleted(_)))
        .unwrap();
    assert!(
        events[batch_start..batch_end]
            .iter()
            .any(|e| matches!(e.payload, Payload::RunClaimed(_))),
        "{:?}",
        types(&events)
    );
    // The lease never lapses while the run is driven: each renewal is written before the
    // lease it renews runs out (a peer's sweep would otherwise take the run mid-step).
    let mut held_until = None;
    for event in &events {
        if let Payload::RunClaimed(claim) = &event.payload {
            if let Some(until) = held_until {
                assert!(
                    event.ts <= until,
                    "the lease ran out at {until} before its renewal at {}",
                    event.ts
                );
            }
            held_until = Some(claim.lease_until);
        }
    }
}

/// Tools of one batch that finish one after another, each sooner than a third of the lease:
/// the lease is still renewed (the renewal is not restarted by each result), so every event
/// of the run is written under a live lease.
#[tokio::test]
async fn the_lease_is_renewed_while_a_batch_finishes_tool_by_tool() {
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::new(store.clone(), Arc::new(loom_journal_clock()))
        .with_lease(Duration::from_millis(300));
    let calls: Vec<_> = (1..=12)
        .map(|i| json!({"name": "slow", "arguments": {"ms": 80 * i}}))
        .collect();
    let model = scripted("fake-1", json!([{"tool_calls": calls}, {"text": "fini"}]));
    let agent = agent(model, vec![sleep_tool("slow", 80)]);
    let (run, state) = run(&engine, &agent, begin("x")).await;
    assert_eq!(state.status, RunStatus::Completed);
    let events = events(&store, &run).await;
    let mut held_until = None;
    for event in &events {
        if let Some(until) = held_until {
            assert!(
                event.ts <= until,
                "{} written at {} after the lease ran out at {until}: {:?}",
                event.event_type,
                event.ts,
                types(&events)
            );
        }
        if let Payload::RunClaimed(claim) = &event.payload {
            held_until = Some(claim.lease_until);
        }
    }
}

/// The system clock: lease expiry is compared with real time in this test.
fn loom_journal_clock() -> impl loom_core::ports::Clock {
    #[derive(Debug)]
    struct Wall;
    impl loom_core::ports::Clock for Wall {
        fn now(&self) -> chrono::DateTime<chrono::Utc> {
            chrono::Utc::now()
        }
    }
    Wall
}

#[tokio::test]
async fn a_run_whose_request_was_not_recorded_fails_instead_of_calling_the_model() {
    let (engine, store) = engine();
    let agent = agent(scripted("fake-1", calc_script()), vec![add_tool()]);
    let run = engine.begin(&agent, begin("x"), &()).await.unwrap();
    // Keep only run.started, as a crash in the middle of the opening batch would.
    let all = events(&store, &run).await;
    let crashed = Arc::new(MemoryStore::new());
    let mut first = all[0].clone();
    first.seq = 0;
    crashed.append(vec![first], 0).await.unwrap();
    let engine = Engine::new(crashed.clone(), Arc::new(ManualClock::new()));
    let state = engine
        .drive(&run, &agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("Interrupted"));
    assert!(
        !events(&crashed, &run)
            .await
            .iter()
            .any(|e| matches!(e.payload, Payload::ModelResponded(_)))
    );
}

/// A tool that waits until `open` is notified, then answers: the test decides when it ends.
fn gated_tool(name: &str, open: Arc<Notify>) -> FnTool {
    FnTool::new(
        ToolSpec {
            name: name.into(),
            description: "Waits for the test.".into(),
            input_schema: json!({"type": "object"}),
            kind: ToolKind::Python,
            declarations: Default::default(),
        },
        move |_, _| {
            let open = open.clone();
            Box::pin(async move {
                open.notified().await;
                Ok(ToolOutput::text("ouvert"))
            })
        },
    )
}

#[tokio::test]
async fn a_cancel_written_by_another_process_ends_the_drive_as_cancelled() {
    let (engine, store) = engine();
    let open = Arc::new(Notify::new());
    let agent = agent(
        scripted(
            "fake-1",
            json!([{"tool_calls": [{"name": "gate", "arguments": {}}]}, {"text": "fini"}]),
        ),
        vec![gated_tool("gate", open.clone())],
    );
    let run = engine.begin(&agent, begin("x"), &()).await.unwrap();
    let other = Engine::new(store.clone(), Arc::new(ManualClock::new()));
    // While the tool runs, the other process cancels the run, then the tool ends; alongside the
    // drive, so its result is checked (no task left unjoined).
    let cancel_in_the_tool = async {
        wait::until("the run to call its tool", async || {
            events(&store, &run)
                .await
                .iter()
                .any(|e| e.event_type == "tool.called")
        })
        .await;
        let cancelled = other.cancel_idle(&run, "demo", Some("bob".into())).await;
        open.notify_one();
        cancelled
    };
    let token = CancellationToken::new();
    let (state, cancelled) =
        tokio::join!(engine.drive(&run, &agent, &(), &token), cancel_in_the_tool);
    assert!(cancelled.unwrap(), "the other process found the run closed");
    let state = state.unwrap();
    assert_eq!(state.status, RunStatus::Cancelled);
    assert!(state.finished);
    let last = events(&store, &run).await.pop().unwrap();
    assert_eq!(last.event_type, "run.cancelled");
}

#[tokio::test]
async fn a_large_result_is_offloaded_and_read_back_with_artifact_read() {
    let store = Arc::new(MemoryStore::new());
    let artifacts = Arc::new(loom_journal::MemoryArtifacts::new());
    let engine =
        Engine::new(store.clone(), Arc::new(ManualClock::new())).with_artifacts(artifacts.clone());
    let model = Arc::new(RecordingModel::new(scripted(
        "fake-1",
        json!([
            {"tool_calls": [{"name": "big", "arguments": {}}]},
            {"text": "fini"}
        ]),
    )));
    let mut agent = agent(model.clone(), vec![big_tool("big", 5_000)]);
    agent.offload_over = Some(3_000);
    let (run, state) = run(&engine, &agent, begin("x")).await;
    assert_eq!(state.status, RunStatus::Completed);
    let events = events(&store, &run).await;
    let stored = events
        .iter()
        .position(|e| e.event_type == "artifact.stored")
        .unwrap();
    assert_eq!(events[stored + 1].event_type, "tool.completed");
    let Payload::ArtifactStored(artifact) = &events[stored].payload else {
        panic!()
    };
    assert_eq!(artifact.origin, "offload");
    assert_eq!(artifact.size, 5_000);
    assert_eq!(artifact.name.as_deref(), Some("big.txt"));
    let Payload::ToolCompleted(done) = &events[stored + 1].payload else {
        panic!()
    };
    assert_eq!(
        done.output.offloaded.as_deref(),
        Some(artifact.uri.as_str())
    );
    assert_eq!(events[stored + 1].facets["offloaded"], true);
    let shown = done.output.visible_text();
    assert!(shown.starts_with(&"abcdefghijklmnopqrstuvwxyz".repeat(2)));
    assert!(
        shown.contains("[Result offloaded: 5000 characters (text)"),
        "{shown}"
    );
    // The next request offers artifact_read, and it pages through the stored text.
    let second = &model.requests()[1];
    assert!(second.tools.iter().any(|t| t.name == "artifact_read"));
    assert!(
        !model.requests()[0]
            .tools
            .iter()
            .any(|t| t.name == "artifact_read")
    );
    let reader =
        loom_engine::artifact_reader(artifacts.clone(), vec![artifact.uri.clone()]).unwrap();
    let ctx = loom_core::tool::ToolContext {
        tenant_id: "default".into(),
        session_id: run.session_id.clone(),
        run_id: run.run_id.clone(),
        call_id: "c".into(),
        idempotency_key: "k".into(),
        traceparent: None,
    };
    let page = reader
        .tool
        .call(
            ctx.clone(),
            json!({"ref": artifact.uri, "offset": 4990, "limit": 100}),
        )
        .await
        .unwrap();
    assert_eq!(
        page.visible_text(),
        "[Characters 4990 to 5000 of 5000; end of the result]\nyzabcdefgh"
    );
    let unknown = reader
        .tool
        .call(ctx, json!({"ref": "artifact://default/x/y.txt"}))
        .await
        .unwrap_err();
    assert!(
        unknown
            .message
            .starts_with("Unknown reference: 'artifact://default/x/y.txt'.")
    );
}

#[tokio::test]
async fn source_tools_are_offered_and_an_unavailable_source_is_journaled() {
    let (engine, store) = engine();
    let up = Arc::new(FakeSource::with_tools(
        "notes",
        vec![add_tool().named("notes__add")],
    ));
    let down = Arc::new(FakeSource::down("crm", "connection refused", true));
    let model = Arc::new(RecordingModel::new(scripted(
        "fake-1",
        json!([
            {"tool_calls": [{"name": "notes__add", "arguments": {"a": 1, "b": 2}}]},
            {"text": "{{ tool_result }}"}
        ]),
    )));
    let mut agent = agent(model.clone(), vec![]);
    agent.sources = vec![
        loom_engine::BoundSource {
            source: up.clone(),
            required: false,
            contracts: Default::default(),
        },
        loom_engine::BoundSource {
            source: down.clone(),
            required: false,
            contracts: Default::default(),
        },
    ];
    let (run, state) = run(&engine, &agent, begin("x")).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().as_deref(), Some("3"));
    let events = events(&store, &run).await;
    assert_eq!(
        types(&events)[2..6],
        [
            "run.claimed",
            "tool.source_opened",
            "circuit.opened",
            "tool.source_unavailable"
        ]
    );
    // What the source offered is journaled, for a replay to offer it again.
    let Payload::ToolSourceOpened(opened) = &events[3].payload else {
        panic!()
    };
    assert_eq!(opened.source, "notes");
    assert_eq!(
        opened
            .tools
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["notes__add"]
    );
    assert_eq!(opened.tools[0].input_schema["type"], "object");
    let Payload::ToolSourceUnavailable(unavailable) = &events[5].payload else {
        panic!()
    };
    assert_eq!(
        (unavailable.source.as_str(), unavailable.required),
        ("crm", false)
    );
    assert_eq!(events[5].status, loom_core::EventStatus::Warning);
    assert_eq!(
        model.requests()[0]
            .tools
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["notes__add"]
    );
    assert_eq!(up.released.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_required_source_that_is_down_fails_the_run() {
    let (engine, store) = engine();
    let mut agent = agent(scripted("fake-1", calc_script()), vec![]);
    agent.sources = vec![loom_engine::BoundSource {
        source: Arc::new(FakeSource::down("crm", "connection refused", false)),
        required: true,
        contracts: Default::default(),
    }];
    let (run, state) = run(&engine, &agent, begin("x")).await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("tool.source_unavailable"));
    let events = events(&store, &run).await;
    assert_eq!(
        types(&events)[2..],
        [
            "run.claimed",
            "tool.source_unavailable",
            "run.transitioned",
            "run.failed"
        ]
    );
    assert_eq!(events[3].status, loom_core::EventStatus::Error);
}

/// A model whose answer is cut by the token cap in the middle of a tool call.
#[derive(Debug)]
struct CutModel;

impl ModelClient for CutModel {
    fn provider(&self) -> &str {
        "fake"
    }

    fn stream(
        &self,
        _request: &loom_core::model::ModelRequest,
    ) -> loom_core::BoxStream<
        'static,
        Result<loom_core::model::ModelChunk, loom_core::model::ModelError>,
    > {
        use loom_core::model::{ModelChunk, StopReason};
        Box::pin(futures_util::stream::iter(vec![
            Ok(ModelChunk::ToolCallStarted {
                index: 0,
                call_id: "c1".into(),
                name: "add".into(),
            }),
            Ok(ModelChunk::ToolArgsDelta {
                index: 0,
                json_fragment: "{\"a\": 1, \"b".into(),
            }),
            Ok(ModelChunk::Stopped {
                reason: StopReason::MaxTokens,
                model_id: "m".into(),
            }),
        ]))
    }
}

#[tokio::test]
async fn a_tool_call_cut_by_max_tokens_never_runs() {
    let (engine, store) = engine();
    let agent = agent(Arc::new(CutModel), vec![add_tool()]);
    let (run, state) = run(&engine, &agent, begin("x")).await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("model.truncated"));
    assert!(
        !events(&store, &run)
            .await
            .iter()
            .any(|e| matches!(e.payload, Payload::ToolCalled(_)))
    );
}

#[tokio::test]
async fn a_read_only_call_is_not_synced_before_it_runs_and_a_call_that_may_act_is() {
    use loom_core::tool::SideEffects;
    for side_effects in [
        SideEffects::None,
        SideEffects::Reversible,
        SideEffects::Irreversible,
    ] {
        let store = Arc::new(loom_testkit::CountingStore::new(MemoryStore::new()));
        let engine = Engine::new(store.clone(), Arc::new(ManualClock::new()));
        let mut tool = add_tool();
        tool.declarations_mut().side_effects = side_effects;
        let agent = agent(scripted("fake-1", calc_script()), vec![tool]);
        let (run, state) = run(&engine, &agent, begin("12 + 7 ?")).await;
        assert_eq!(state.status, RunStatus::Completed);
        // The event records the declaration the call was launched under.
        let journal = store.read("default", &run.session_id, 0).await.unwrap();
        let recorded = journal
            .iter()
            .find_map(|e| match &e.payload {
                Payload::ToolCalled(call) => Some(call.side_effects),
                _ => None,
            })
            .unwrap();
        assert_eq!(recorded, Some(side_effects));
        let mut expected = vec![
            vec!["run.started".to_string(), "message.user".to_string()],
            vec!["run.transitioned".to_string(), "run.completed".to_string()],
        ];
        if side_effects != SideEffects::None {
            expected.insert(1, vec!["tool.called".to_string()]);
        }
        assert_eq!(store.synced_batches(), expected, "{side_effects:?}");
    }
}
