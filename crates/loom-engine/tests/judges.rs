//! Judges of the final output, end to end on the memory journal: the trigger (caller mode,
//! sample, condition), the call and what the judge saw, the verdict events, repairs,
//! `on_failure`, `on_error`, timeouts, fallbacks and the judge's cost.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use loom_core::{
    Event, Message, Pricing, RunState, RunStatus,
    event::{GuardChecked, JudgeEvaluated, Payload, PolicyDecided},
    model::{ModelClient, ToolChoice},
    ports::EventStore,
};
use loom_engine::{
    AgentRuntime, BeginRun, BoundTool, ContextScope, Criterion, Engine, JUDGE_SYSTEM, JudgeContext,
    JudgeInput, JudgeMode, JudgeRuntime, ModelBinding, PolicyOnError, RunRef, VERDICT_TOOL,
    contract::{OnFailure, RepairSettings, RepairTools},
};
use loom_journal::MemoryStore;
use loom_testkit::{HangingModel, ManualClock, RecordingModel, add_tool, scripted};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

const POLITE: &str = "The answer greets the user.";

fn binding(config_id: &str, model_id: &str, client: Arc<dyn ModelClient>) -> ModelBinding {
    let mut binding = ModelBinding::new(config_id, model_id, client);
    binding.pricing = Pricing {
        input: 3.0,
        output: 15.0,
        ..Default::default()
    };
    binding
}

/// A judge `output` with one blocking criterion `polite` (threshold 0.8).
fn judge(client: Arc<dyn ModelClient>) -> JudgeRuntime {
    JudgeRuntime::new(
        "output",
        binding("JUDGE", "judge-1", client),
        vec![Criterion::new("polite", POLITE)],
    )
    .unwrap()
}

fn agent(orchestrator: Arc<dyn ModelClient>, judge: JudgeRuntime) -> AgentRuntime {
    let mut agent = AgentRuntime::new(
        "demo",
        "Tu es un assistant.",
        binding("FAKE", "fake-1", orchestrator),
    );
    agent.judges = vec![judge];
    agent
}

/// A verdict scoring `polite`.
fn verdict(score: f64, reason: &str) -> Value {
    json!({"tool_calls": [{"name": VERDICT_TOOL, "arguments": {"criteria": [
        {"name": "polite", "score": score, "reason": reason}
    ]}}]})
}

/// A judge that scores 0.9 an output greeting the user ("Bonjour"), 0.2 any other.
fn greeting_judge() -> Arc<dyn ModelClient> {
    greeting_judge_named("judge-1")
}

/// The same judge, answering as the provider model `name`.
fn greeting_judge_named(name: &str) -> Arc<dyn ModelClient> {
    let mut high = verdict(0.9, "greets the user");
    high["with_text"] = json!("Bonjour");
    let mut low = verdict(0.2, "no greeting");
    low["without_text"] = json!("Bonjour");
    scripted(name, json!([high, low]))
}

/// An orchestrator that answers without greeting, and greets in its next answer (to the repair
/// request, which a scripted model does not count as a turn of the user).
fn repairable() -> Arc<dyn ModelClient> {
    scripted(
        "fake-1",
        json!([
            {"text": "Voici le devis."},
            {"text": "Bonjour ! Voici le devis."}
        ]),
    )
}

fn engine() -> (Engine, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    (
        Engine::new(store.clone(), Arc::new(ManualClock::new())),
        store,
    )
}

fn begin(message: &str, judges: JudgeMode) -> BeginRun {
    BeginRun {
        tenant_id: "default".into(),
        session_id: None,
        run_id: Some("run-1".into()),
        user_id: None,
        metadata: Map::new(),
        message: Message::user(message),
        budget: None,
        attachments: Vec::new(),
        judges,
        trigger: None,
        state: Default::default(),
    }
}

async fn run(engine: &Engine, agent: &AgentRuntime, request: BeginRun) -> (RunRef, RunState) {
    let run = engine.begin(agent, request, &()).await.unwrap();
    let state = tokio::time::timeout(
        Duration::from_secs(20),
        engine.drive(&run, agent, &(), &CancellationToken::new()),
    )
    .await
    .expect("the run took too long")
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

fn types(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.event_type.as_str()).collect()
}

fn guards(events: &[Event]) -> Vec<&GuardChecked> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::GuardChecked(g) => Some(g),
            _ => None,
        })
        .collect()
}

fn evaluations(events: &[Event]) -> Vec<&JudgeEvaluated> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::JudgeEvaluated(j) => Some(j),
            _ => None,
        })
        .collect()
}

fn decisions(events: &[Event]) -> Vec<&PolicyDecided> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::PolicyDecided(p) => Some(p),
            _ => None,
        })
        .collect()
}

fn skipped(reason: &str) -> GuardChecked {
    GuardChecked {
        guard: "judge".into(),
        target: "output".into(),
        outcome: "skipped".into(),
        reason: Some(reason.into()),
        attempt: None,
        normalized: false,
        resolution: None,
        policy: Some("loom.judge.output".into()),
        call_id: None,
    }
}

#[tokio::test]
async fn a_passing_judge_writes_its_call_its_scores_and_its_check_before_the_completion() {
    let (engine, store) = engine();
    let recorder = Arc::new(RecordingModel::new(greeting_judge()));
    let agent = agent(
        scripted("fake-1", json!([{"text": "Bonjour ! Voici le devis."}])),
        judge(recorder.clone()),
    );
    let (run, state) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Auto)).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(
        state.output_text().as_deref(),
        Some("Bonjour ! Voici le devis.")
    );
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
            "model.responded",
            "judge.evaluated",
            "guard.checked",
            "run.transitioned",
            "run.completed",
        ]
    );
    let run_span = &events[0].span_id;
    // The judge's call: its own span under the run span, role judge:<name>, judge set.
    let judged = &events[6];
    assert_eq!(judged.role.as_deref(), Some("judge:output"));
    assert_eq!(judged.parent_span_id.as_ref(), Some(run_span));
    assert_ne!(&judged.span_id, run_span);
    assert_ne!(judged.span_id, events[4].span_id);
    let Payload::ModelResponded(responded) = &judged.payload else {
        panic!()
    };
    assert_eq!(responded.judge.as_deref(), Some("output"));
    assert_eq!(responded.model.as_deref(), Some("JUDGE"));
    assert_eq!(responded.call_id, None);
    assert_eq!(judged.facets["judge"], json!("output"));
    // Its scores, then its check: decisions in the run span.
    assert_eq!(
        evaluations(&events),
        [&JudgeEvaluated {
            judge: "output".into(),
            target: "output".into(),
            model_id: "judge-1".into(),
            model: Some("JUDGE".into()),
            criteria: vec![loom_core::event::CriterionScore {
                name: "polite".into(),
                score: 0.9,
                min_score: 0.8,
                blocking: true,
                reason: Some("greets the user".into()),
            }],
            passed: true,
            blocked: false,
            attempt: Some(1),
            policy: Some("loom.judge.output".into()),
            call_id: None,
        }]
    );
    assert_eq!(events[7].status, loom_core::event::EventStatus::Ok);
    assert_eq!(
        guards(&events),
        [&GuardChecked {
            guard: "judge".into(),
            target: "output".into(),
            outcome: "passed".into(),
            reason: None,
            attempt: Some(1),
            normalized: false,
            resolution: None,
            policy: Some("loom.judge.output".into()),
            call_id: None,
        }]
    );
    for event in &events[7..] {
        assert_eq!(&event.span_id, run_span);
        assert_eq!(event.role, None);
    }
    // The completion is caused by the orchestrator's answer, not the judge's.
    let Payload::RunTransitioned(done) = &events[9].payload else {
        panic!()
    };
    assert_eq!(
        done.cause_event_id.as_deref(),
        Some(events[4].event_id.as_str())
    );
    // What the judge was asked.
    let requests = recorder.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.system, JUDGE_SYSTEM);
    assert_eq!(request.tool_choice, ToolChoice::Required);
    assert_eq!(request.tools.len(), 1);
    assert_eq!(request.tools[0].name, VERDICT_TOOL);
    assert_eq!(
        request.tools[0].input_schema["properties"]["criteria"]["items"]["properties"]["name"]["enum"],
        json!(["polite"])
    );
    assert_eq!(request.messages.len(), 1);
    assert_eq!(
        request.messages[0].text(),
        format!(
            "<criteria>\npolite: {POLITE}\n</criteria>\n<output>\nBonjour ! Voici le devis.\n</output>"
        )
    );
    // Every event re-reads cleanly.
    for event in &events {
        assert_eq!(&Event::from_json(&event.to_json()).unwrap(), event);
    }
}

#[tokio::test]
async fn a_refused_output_is_repaired_by_the_orchestrator_then_judged_again() {
    let (engine, store) = engine();
    let orchestrator = Arc::new(RecordingModel::new(repairable()));
    let agent = agent(orchestrator.clone(), judge(greeting_judge()));
    let (run, state) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Auto)).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(
        state.output_text().as_deref(),
        Some("Bonjour ! Voici le devis.")
    );
    assert!(!state.unverified);
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
            "model.responded",
            "judge.evaluated",
            "guard.checked",
            "policy.decided",
            "message.user",
            "step.started",
            "model.responded",
            "step.completed",
            "model.responded",
            "judge.evaluated",
            "guard.checked",
            "run.transitioned",
            "run.completed",
        ]
    );
    let diagnostic = "The judge output refuses the output:\n- polite (score 0.20, threshold 0.80): no greeting\nFix the output on these points and give it again in full.";
    let evaluated = evaluations(&events);
    assert_eq!(
        (
            evaluated[0].passed,
            evaluated[0].blocked,
            evaluated[0].attempt
        ),
        (false, true, Some(1))
    );
    assert_eq!(events[7].status, loom_core::event::EventStatus::Warning);
    assert_eq!(
        (
            evaluated[1].passed,
            evaluated[1].blocked,
            evaluated[1].attempt
        ),
        (true, false, Some(2))
    );
    let checks = guards(&events);
    assert_eq!(
        (
            checks[0].outcome.as_str(),
            checks[0].resolution.as_deref(),
            checks[0].reason.as_deref(),
            checks[0].attempt
        ),
        (
            "failed",
            Some("retry"),
            Some("polite (score 0.20, threshold 0.80): no greeting"),
            Some(1)
        )
    );
    assert_eq!(
        (checks[1].outcome.as_str(), checks[1].attempt),
        ("passed", Some(2))
    );
    assert_eq!(
        decisions(&events),
        [&PolicyDecided {
            policy: "loom.judge.output".into(),
            point: "on_output".into(),
            decision: "retry".into(),
            reason: Some(diagnostic.into()),
            call_id: None,
            attempt: Some(1),
            tools: Some(true),
            arguments: None,
            output: None,
            error: false,
        }]
    );
    // The orchestrator got the diagnostic back, with its tools (none here) allowed.
    let Payload::MessageUser(repair) = &events[10].payload else {
        panic!()
    };
    assert_eq!(repair.kind, "repair");
    assert_eq!(repair.policy.as_deref(), Some("loom.judge.output"));
    assert!(repair.tools);
    let requests = orchestrator.requests();
    assert_eq!(requests.len(), 2);
    assert!(
        requests[1]
            .messages
            .last()
            .unwrap()
            .text()
            .ends_with(diagnostic)
    );
    assert_eq!(requests[1].tool_choice, ToolChoice::Auto);
    assert_eq!(state.retries.get("loom.judge.output"), Some(&1));
}

#[tokio::test]
async fn a_repair_without_tools_when_the_judge_says_so() {
    let (engine, store) = engine();
    let orchestrator = Arc::new(RecordingModel::new(repairable()));
    let mut judge = judge(greeting_judge());
    judge.repair = RepairSettings {
        max_attempts: 1,
        tools: RepairTools::None,
    };
    let mut agent = agent(orchestrator.clone(), judge);
    agent.tools = vec![
        BoundTool::new(
            Arc::new(add_tool()),
            Default::default(),
            "Adds two numbers.".into(),
        )
        .unwrap(),
    ];
    let (run, state) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Auto)).await;
    assert_eq!(state.status, RunStatus::Completed);
    let events = events(&store, &run).await;
    assert_eq!(decisions(&events)[0].tools, Some(false));
    let requests = orchestrator.requests();
    assert_eq!(requests[1].tool_choice, ToolChoice::None);
}

#[tokio::test]
async fn repairs_exhausted_the_run_fails_with_guard_judge() {
    let (engine, store) = engine();
    let agent = agent(
        scripted(
            "fake-1",
            json!([{"text": "Voici le devis."}, {"text": "Voici encore le devis."}]),
        ),
        judge(greeting_judge()),
    );
    let (run, state) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Auto)).await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("guard.judge"));
    assert_eq!(
        state.error.as_deref(),
        Some(
            "final answer refused by the judge output: polite (score 0.20, threshold 0.80): no greeting"
        )
    );
    let events = events(&store, &run).await;
    let tail: Vec<&str> = types(&events)[events.len() - 5..].to_vec();
    assert_eq!(
        tail,
        [
            "model.responded",
            "judge.evaluated",
            "guard.checked",
            "run.transitioned",
            "run.failed"
        ]
    );
    let checks = guards(&events);
    assert_eq!(checks.len(), 2);
    assert_eq!(
        (
            checks[1].outcome.as_str(),
            checks[1].resolution.as_deref(),
            checks[1].attempt
        ),
        ("failed", Some("fail"), Some(2))
    );
    let failed_check = events
        .iter()
        .rfind(|e| e.event_type == "guard.checked")
        .unwrap();
    assert_eq!(failed_check.status, loom_core::event::EventStatus::Error);
    // One repair was asked, then the judge's verdict stood.
    assert_eq!(decisions(&events).len(), 1);
    assert_eq!(state.iterations, 2);
}

#[tokio::test]
async fn on_failure_unverified_keeps_the_output_and_flags_the_run() {
    let (engine, store) = engine();
    let mut judge = judge(greeting_judge());
    judge.repair.max_attempts = 0;
    judge.on_failure = OnFailure::Unverified;
    let agent = agent(
        scripted("fake-1", json!([{"text": "Voici le devis."}])),
        judge,
    );
    let (run, state) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Auto)).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert!(state.unverified);
    assert_eq!(state.output_text().as_deref(), Some("Voici le devis."));
    let events = events(&store, &run).await;
    let checks = guards(&events);
    assert_eq!(
        (checks[0].outcome.as_str(), checks[0].resolution.as_deref()),
        ("failed", Some("unverified"))
    );
    let Payload::RunCompleted(done) = &events.last().unwrap().payload else {
        panic!()
    };
    assert!(done.unverified && !done.fallback);
    assert_eq!(
        events.last().unwrap().status,
        loom_core::event::EventStatus::Warning
    );
    assert!(decisions(&events).is_empty());
}

#[tokio::test]
async fn on_failure_fallback_replaces_the_output() {
    let (engine, store) = engine();
    let mut judge = judge(greeting_judge());
    judge.repair.max_attempts = 0;
    judge.on_failure = OnFailure::Fallback;
    judge.fallback_message = Some("Un conseiller vous répondra.".into());
    let agent = agent(
        scripted("fake-1", json!([{"text": "Voici le devis."}])),
        judge,
    );
    let (run, state) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Auto)).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert!(state.fallback);
    assert_eq!(
        state.output_text().as_deref(),
        Some("Un conseiller vous répondra.")
    );
    let events = events(&store, &run).await;
    assert_eq!(
        types(&events)[6..],
        [
            "model.responded",
            "judge.evaluated",
            "guard.checked",
            "policy.decided",
            "run.transitioned",
            "run.completed"
        ]
    );
    assert_eq!(guards(&events)[0].resolution.as_deref(), Some("fallback"));
    let replace = decisions(&events)[0];
    assert_eq!(
        (replace.decision.as_str(), replace.point.as_str()),
        ("replace", "on_output")
    );
    assert_eq!(
        replace.output,
        Some(serde_json::to_value(Message::assistant("Un conseiller vous répondra.")).unwrap())
    );
    let Payload::RunCompleted(done) = &events.last().unwrap().payload else {
        panic!()
    };
    assert!(done.fallback);
}

#[tokio::test]
async fn a_run_outside_the_sample_is_not_judged_and_says_why() {
    let (engine, store) = engine();
    let recorder = Arc::new(RecordingModel::new(greeting_judge()));
    let mut judge = judge(recorder.clone());
    judge.when.sample = 0.0;
    let agent = agent(
        scripted("fake-1", json!([{"text": "Voici le devis."}])),
        judge,
    );
    let (run, state) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Auto)).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert!(recorder.requests().is_empty());
    let events = events(&store, &run).await;
    assert_eq!(guards(&events), [&skipped("sampled_out")]);
    assert!(evaluations(&events).is_empty());
    assert_eq!(state.model_calls, 1);
}

#[tokio::test]
async fn force_overrides_the_sample() {
    let (engine, store) = engine();
    let recorder = Arc::new(RecordingModel::new(greeting_judge()));
    let mut judge = judge(recorder.clone());
    judge.when.sample = 0.0;
    let agent = agent(
        scripted("fake-1", json!([{"text": "Bonjour, voici le devis."}])),
        judge,
    );
    let (run, state) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Force)).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(recorder.requests().len(), 1);
    let events = events(&store, &run).await;
    let Payload::RunStarted(started) = &events[0].payload else {
        panic!()
    };
    assert_eq!(started.judges, "force");
    assert_eq!(events[0].facets["judges"], json!("force"));
    assert_eq!(state.judges, "force");
    assert_eq!(guards(&events)[0].outcome, "passed");
}

#[tokio::test]
async fn a_caller_skip_leaves_a_skipped_trace() {
    let (engine, store) = engine();
    let recorder = Arc::new(RecordingModel::new(greeting_judge()));
    let agent = agent(
        scripted("fake-1", json!([{"text": "Voici le devis."}])),
        judge(recorder.clone()),
    );
    let (run, state) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Skip)).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().as_deref(), Some("Voici le devis."));
    assert!(recorder.requests().is_empty());
    let events = events(&store, &run).await;
    assert_eq!(
        types(&events)[5..],
        [
            "step.completed",
            "guard.checked",
            "run.transitioned",
            "run.completed"
        ]
    );
    assert_eq!(guards(&events), [&skipped("caller_skip")]);
    assert_eq!(events[6].status, loom_core::event::EventStatus::Ok);
}

#[tokio::test]
async fn profiles_tenants_and_conditions_are_checked_in_code() {
    let recorder = Arc::new(RecordingModel::new(greeting_judge()));
    let base = judge(recorder.clone());
    let orchestrator = || scripted("fake-1", json!([{"text": "Bonjour, voici le devis."}]));
    let cases: Vec<(JudgeRuntime, &str)> = vec![
        (
            JudgeRuntime {
                when: loom_engine::JudgeWhen {
                    profiles: Some(vec!["prod".into()]),
                    ..Default::default()
                },
                profile: Some("dev".into()),
                ..base.clone()
            },
            "other_profile",
        ),
        (
            JudgeRuntime {
                when: loom_engine::JudgeWhen {
                    tenants: Some(vec!["dupont".into()]),
                    ..Default::default()
                },
                ..base.clone()
            },
            "tenant_filtered",
        ),
        (
            JudgeRuntime {
                when: loom_engine::JudgeWhen {
                    condition: Some(Arc::new(|input: &JudgeInput| {
                        input.output.contains("facture")
                    })),
                    ..Default::default()
                },
                ..base.clone()
            },
            "condition_false",
        ),
    ];
    for (judge, reason) in cases {
        let (engine, store) = engine();
        let agent = agent(orchestrator(), judge);
        let (run, state) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Auto)).await;
        assert_eq!(state.status, RunStatus::Completed);
        assert_eq!(guards(&events(&store, &run).await), [&skipped(reason)]);
    }
    assert!(recorder.requests().is_empty());
    // The condition sees the output and the run; when it holds, the judge runs.
    let (engine, store) = engine();
    let seen = Arc::new(std::sync::Mutex::new(None));
    let keep = seen.clone();
    let judge = JudgeRuntime {
        when: loom_engine::JudgeWhen {
            condition: Some(Arc::new(move |input: &JudgeInput| {
                *keep.lock().unwrap() = Some(input.clone());
                input.output.contains("devis")
            })),
            tenants: Some(vec!["default".into()]),
            profiles: Some(vec!["prod".into()]),
            sample: 1.0,
        },
        profile: Some("prod".into()),
        ..base
    };
    let agent = agent(orchestrator(), judge);
    let (run, _) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Auto)).await;
    assert_eq!(guards(&events(&store, &run).await)[0].outcome, "passed");
    let input = seen.lock().unwrap().clone().unwrap();
    assert_eq!(
        (
            input.judge.as_str(),
            input.run_id.as_str(),
            input.user_input.as_str(),
            input.output.as_str(),
            input.attempt,
            input.iterations
        ),
        (
            "output",
            "run-1",
            "Le devis ?",
            "Bonjour, voici le devis.",
            1,
            1
        )
    );
    assert_eq!(input.profile.as_deref(), Some("prod"));
    assert_eq!(recorder.requests().len(), 1);
}

#[tokio::test]
async fn a_failing_judge_model_blocks_the_run_by_default() {
    let (engine, store) = engine();
    let agent = agent(
        scripted("fake-1", json!([{"text": "Bonjour, voici le devis."}])),
        judge(scripted("judge-1", json!([{"error": "auth"}]))),
    );
    let (run, state) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Auto)).await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("guard.judge"));
    assert_eq!(
        state.error.as_deref(),
        Some("judge output failed: model.auth: scripted auth error")
    );
    let events = events(&store, &run).await;
    assert_eq!(
        types(&events)[6..],
        [
            "guard.checked",
            "policy.decided",
            "run.transitioned",
            "run.failed"
        ]
    );
    let check = guards(&events)[0];
    assert_eq!(
        (
            check.outcome.as_str(),
            check.resolution.as_deref(),
            check.reason.as_deref()
        ),
        (
            "failed",
            Some("fail"),
            Some("judge_error: model.auth: scripted auth error")
        )
    );
    let decided = decisions(&events)[0];
    assert_eq!((decided.decision.as_str(), decided.error), ("fail", true));
}

#[tokio::test]
async fn a_failing_judge_lets_the_output_through_under_on_error_allow() {
    let (engine, store) = engine();
    let mut judge = judge(scripted("judge-1", json!([{"error": "auth"}])));
    judge.on_error = PolicyOnError::Allow;
    let agent = agent(
        scripted("fake-1", json!([{"text": "Voici le devis."}])),
        judge,
    );
    let (run, state) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Auto)).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().as_deref(), Some("Voici le devis."));
    assert!(!state.unverified);
    let events = events(&store, &run).await;
    let check = guards(&events)[0];
    assert_eq!(
        (
            check.outcome.as_str(),
            check.reason.as_deref(),
            check.attempt
        ),
        (
            "skipped",
            Some("judge_error: model.auth: scripted auth error"),
            None
        )
    );
    let decided = decisions(&events)[0];
    assert_eq!(
        (decided.decision.as_str(), decided.error),
        ("continue", true)
    );
}

#[tokio::test]
async fn an_unusable_verdict_is_a_judge_error() {
    let (engine, store) = engine();
    let unknown = json!([{"tool_calls": [{"name": VERDICT_TOOL, "arguments": {"criteria": [
        {"name": "tone", "score": 0.9, "reason": "fine"}
    ]}}]}]);
    let agent = agent(
        scripted("fake-1", json!([{"text": "Bonjour."}])),
        judge(scripted("judge-1", unknown)),
    );
    let (run, state) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Auto)).await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(
        state.error.as_deref(),
        Some(
            "judge output failed: unusable verdict: the verdict scores an unknown criterion 'tone'"
        )
    );
    // The judge's answer is journaled (and paid for) even though it could not be used.
    let events = events(&store, &run).await;
    assert_eq!(
        types(&events)[6..],
        [
            "model.responded",
            "guard.checked",
            "policy.decided",
            "run.transitioned",
            "run.failed"
        ]
    );
    assert_eq!(state.model_calls, 2);
}

#[tokio::test]
async fn a_judge_out_of_time_is_a_judge_error() {
    let (engine, store) = engine();
    let hanging = Arc::new(HangingModel::default());
    let mut judge = judge(hanging.clone());
    judge.timeout = Some(Duration::from_millis(50));
    judge.main.circuit = None;
    let agent = agent(scripted("fake-1", json!([{"text": "Bonjour."}])), judge);
    let (run, state) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Auto)).await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("guard.judge"));
    assert_eq!(
        state.error.as_deref(),
        Some("judge output failed: no verdict within 0.05 s")
    );
    assert_eq!(hanging.calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(
        guards(&events(&store, &run).await)[0].reason.as_deref(),
        Some("judge_error: no verdict within 0.05 s")
    );
}

#[tokio::test]
async fn the_run_timeout_cuts_a_judge_like_any_decision() {
    let (engine, store) = engine();
    let mut judge = judge(Arc::new(HangingModel::default()));
    judge.timeout = Some(Duration::from_secs(30));
    judge.main.circuit = None;
    let mut agent = agent(scripted("fake-1", json!([{"text": "Bonjour."}])), judge);
    agent.timeout = Some(Duration::from_millis(200));
    let (run, state) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Auto)).await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("timeout"));
    assert!(
        state
            .error
            .as_deref()
            .unwrap()
            .contains("a decision (policies, judges) taken after step 1 was interrupted"),
        "{:?}",
        state.error
    );
    assert!(guards(&events(&store, &run).await).is_empty());
}

#[tokio::test]
async fn a_judge_falls_back_on_its_own_chain() {
    let (engine, store) = engine();
    let mut judge = judge(scripted("judge-1", json!([{"error": "quota_exhausted"}])));
    judge.fallbacks = vec![binding(
        "JUDGE2",
        "judge-2",
        greeting_judge_named("judge-2"),
    )];
    let agent = agent(
        scripted("fake-1", json!([{"text": "Bonjour, voici le devis."}])),
        judge,
    );
    let (run, state) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Auto)).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(
        state.models.get("judge:output").map(String::as_str),
        Some("JUDGE2")
    );
    assert_eq!(state.models.get("main"), None);
    let events = events(&store, &run).await;
    let fell = events
        .iter()
        .find(|e| e.event_type == "model.fell_back")
        .unwrap();
    assert_eq!(fell.role.as_deref(), Some("judge:output"));
    let Payload::ModelFellBack(fell_back) = &fell.payload else {
        panic!()
    };
    assert_eq!(
        (
            fell_back.slot.as_str(),
            fell_back.from_model.as_str(),
            fell_back.to_model.as_str(),
            fell_back.judge.as_deref()
        ),
        ("judge:output", "JUDGE", "JUDGE2", Some("output"))
    );
    let evaluated = evaluations(&events)[0];
    assert_eq!(
        (evaluated.model_id.as_str(), evaluated.model.as_deref()),
        ("judge-2", Some("JUDGE2"))
    );
}

#[tokio::test]
async fn the_judge_costs_count_in_the_run_but_not_as_iterations() {
    let (engine, store) = engine();
    let agent = agent(repairable(), judge(greeting_judge()));
    let (run, state) = run(&engine, &agent, begin("Le devis ?", JudgeMode::Auto)).await;
    assert_eq!(state.status, RunStatus::Completed);
    let events = events(&store, &run).await;
    let (mut orchestrator, mut judges) = (0.0, 0.0);
    for event in &events {
        if let Payload::ModelResponded(p) = &event.payload {
            assert!(p.cost_usd > 0.0);
            if p.judge.is_some() {
                judges += p.cost_usd;
            } else {
                orchestrator += p.cost_usd;
            }
        }
    }
    assert!(judges > 0.0);
    let Payload::RunCompleted(done) = &events.last().unwrap().payload else {
        panic!()
    };
    assert_eq!(done.iterations, 2);
    assert!((done.cost_usd - (orchestrator + judges)).abs() < 1e-12);
    assert_eq!((state.iterations, state.model_calls), (2, 4));
}

#[tokio::test]
async fn the_judge_sees_the_declared_context() {
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::new(store.clone(), Arc::new(ManualClock::new()));
    let recorder = Arc::new(RecordingModel::new(greeting_judge()));
    let mut judge = judge(recorder.clone());
    judge.context = vec![
        JudgeContext::UserInput,
        JudgeContext::ToolResults {
            tools: vec!["add".into()],
            scope: ContextScope::Run,
        },
        JudgeContext::LastTurns(1),
        JudgeContext::CallerContext,
    ];
    let orchestrator = scripted(
        "fake-1",
        json!([
            {"text": "Bonjour, c'est noté.", "with_text": "Premier"},
            {"text": "Bonjour, deuxième.", "with_text": "Deuxième"},
            {"tool_calls": [{"name": "add", "arguments": {"a": 12, "b": 7}}], "with_text": "Combien"},
            {"text": "Bonjour, cela fait {{ tool_result }}.", "with_text": "Combien"}
        ]),
    );
    let mut agent = agent(orchestrator, judge);
    agent.tools = vec![
        BoundTool::new(
            Arc::new(add_tool()),
            Default::default(),
            "Adds two numbers.".into(),
        )
        .unwrap(),
    ];
    let mut metadata = Map::new();
    metadata.insert("canal".into(), json!("web"));
    for (i, message) in ["Premier tour.", "Deuxième tour.", "Combien font 12 + 7 ?"]
        .into_iter()
        .enumerate()
    {
        let request = BeginRun {
            tenant_id: "default".into(),
            session_id: Some("s1".into()),
            run_id: Some(format!("run-{i}")),
            user_id: Some("alice".into()),
            metadata: metadata.clone(),
            message: Message::user(message),
            budget: None,
            attachments: Vec::new(),
            judges: JudgeMode::Auto,
            trigger: None,
            state: Default::default(),
        };
        let (_, state) = run(&engine, &agent, request).await;
        assert_eq!(state.status, RunStatus::Completed, "{message}");
    }
    let requests = recorder.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(
        requests[2].messages[0].text(),
        format!(
            "<criteria>\npolite: {POLITE}\n</criteria>\n\
             <user_input>\nCombien font 12 + 7 ?\n</user_input>\n\
             <tool_results>\nadd: 19\n</tool_results>\n\
             <last_turns>\nuser: Deuxième tour.\nassistant: Bonjour, deuxième.\n</last_turns>\n\
             <caller_context>\n{{\"tenant_id\":\"default\",\"user_id\":\"alice\",\"metadata\":{{\"canal\":\"web\"}}}}\n</caller_context>\n\
             <output>\nBonjour, cela fait 19.\n</output>"
        )
    );
    // The first run of the session: no earlier turn, no tool result.
    assert!(
        requests[0].messages[0].text().contains(
            "<tool_results>\n(none)\n</tool_results>\n<last_turns>\n(none)\n</last_turns>"
        )
    );
}

#[test]
fn skip_is_refused_under_prod() {
    assert!(JudgeMode::Skip.check(Some("prod")).is_err());
    assert!(JudgeMode::Auto.check(Some("prod")).is_ok());
    assert!(JudgeMode::Skip.check(None).is_ok());
}
