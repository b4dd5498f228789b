//! Variant replay (`loom_engine::replay::replay_variant`) on the memory journal: another model
//! for a step, tools served from the journal, by a double or (without side effects) for real,
//! and a tool with side effects never run.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use loom_core::{
    Event, Message,
    event::Payload,
    model::ModelClient,
    tool::{FnTool, SideEffects, Tool, ToolOutput},
};
use loom_engine::{
    AgentRuntime, BeginRun, BoundTool, Engine, ModelBinding, RunRef,
    replay::{ReplayError, VariantPlan, replay_variant},
};
use loom_journal::MemoryStore;
use loom_testkit::{ManualClock, add_tool, counting_tool, scripted};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

/// An agent offering `add` (no side effect) and `send` (irreversible, counting its calls).
fn agent(model: Arc<dyn ModelClient>, sent: &Arc<AtomicUsize>) -> AgentRuntime {
    let mut agent = AgentRuntime::new("demo", "Tu es un assistant.", binding("fake-1", model));
    let mut send = counting_tool("send", sent.clone());
    send.declarations_mut().side_effects = SideEffects::Irreversible;
    agent.tools = [add_tool(), send]
        .into_iter()
        .map(|t| BoundTool::declared(Arc::new(t)).unwrap())
        .collect();
    agent
}

fn binding(id: &str, model: Arc<dyn ModelClient>) -> ModelBinding {
    ModelBinding::new(id, "FAKE", model)
}

fn engine() -> Engine {
    Engine::new(Arc::new(MemoryStore::new()), Arc::new(ManualClock::new()))
}

/// A recorded run: `add(12, 7)`, then the answer. Its session's events and run id.
async fn recorded(agent: &AgentRuntime) -> (Vec<Event>, String) {
    let engine = engine();
    let begin = BeginRun {
        tenant_id: "default".into(),
        session_id: None,
        run_id: None,
        user_id: None,
        metadata: Map::new(),
        message: Message::user("12 + 7 ?"),
        judges: Default::default(),
        budget: None,
        attachments: Vec::new(),
        trigger: None,
        state: Default::default(),
    };
    let run: RunRef = engine.begin(agent, begin, &()).await.unwrap();
    engine
        .drive(&run, agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    let events = engine
        .store()
        .read(&run.tenant_id, &run.session_id, 0)
        .await
        .unwrap();
    (events, run.run_id)
}

fn original_script() -> Value {
    json!([
        {"text": "Je calcule.", "tool_calls": [{"name": "add", "arguments": {"a": 12, "b": 7}}]},
        {"text": "Cela fait {{ tool_result }}."}
    ])
}

fn plan(script: Value) -> VariantPlan {
    let mut plan = VariantPlan::default();
    plan.models
        .insert("main".into(), binding("fake-2", scripted("FAKE", script)));
    plan
}

fn answer(events: &[Event]) -> String {
    events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::RunCompleted(done) => done.output.as_ref().map(Message::text),
            _ => None,
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn another_model_answers_otherwise_with_the_tools_served_from_the_journal() {
    let sent = Arc::new(AtomicUsize::new(0));
    let agent = agent(scripted("FAKE", original_script()), &sent);
    let (session, run_id) = recorded(&agent).await;
    let variant = plan(json!([
        {"text": "Voyons.", "tool_calls": [{"name": "add", "arguments": {"a": 12, "b": 7}}]},
        {"text": "Le total est {{ tool_result }}, sans arrondi."}
    ]));
    let got = replay_variant(&engine(), &agent, &variant, &session, &run_id, None)
        .await
        .unwrap();
    assert_eq!(got.variant_status, "completed");
    assert_eq!(answer(&got.recorded), "Cela fait 19.");
    assert_eq!(answer(&got.replayed), "Le total est 19, sans arrondi.");
    assert_eq!(got.counts.models_called, 2, "{:?}", got.counts);
    assert_eq!(got.counts.models_served, 0);
    assert_eq!(got.counts.tools_served, 1);
    assert!(got.misses.is_empty());
}

#[tokio::test]
async fn without_a_named_step_every_recorded_request_is_served() {
    let sent = Arc::new(AtomicUsize::new(0));
    let agent = agent(scripted("FAKE", original_script()), &sent);
    let (session, run_id) = recorded(&agent).await;
    let got = replay_variant(
        &engine(),
        &agent,
        &VariantPlan::default(),
        &session,
        &run_id,
        None,
    )
    .await
    .unwrap();
    assert_eq!(got.counts.models_served, 2, "{:?}", got.counts);
    assert_eq!(got.counts.models_called, 0);
    assert_eq!(answer(&got.replayed), answer(&got.recorded));
}

#[tokio::test]
async fn a_tool_with_side_effects_is_refused_without_a_double_and_never_run() {
    let sent = Arc::new(AtomicUsize::new(0));
    let agent = agent(scripted("FAKE", original_script()), &sent);
    let (session, run_id) = recorded(&agent).await;
    let sender = json!([
        {"text": "J'envoie.", "tool_calls": [{"name": "send", "arguments": {"to": "x"}}]},
        {"text": "Envoyé : {{ tool_result }}"}
    ]);
    let got = replay_variant(
        &engine(),
        &agent,
        &plan(sender.clone()),
        &session,
        &run_id,
        None,
    )
    .await
    .unwrap();
    assert_eq!(sent.load(Ordering::SeqCst), 0, "the tool never ran");
    assert_eq!(got.counts.tools_refused, 1, "{:?}", got.counts);
    assert_eq!(got.misses.len(), 1);
    assert!(
        got.misses[0].detail.contains("send not executed")
            && got.misses[0].detail.contains("irreversible"),
        "{:?}",
        got.misses
    );

    // With a double, the double answers; the tool still never runs.
    let mut doubled = plan(sender);
    let double: Arc<dyn Tool> = Arc::new(FnTool::new(add_tool().spec().clone(), |_, _| {
        Box::pin(async { Ok(ToolOutput::text("simulé")) })
    }));
    doubled.doubles.insert("send".into(), double);
    let got = replay_variant(&engine(), &agent, &doubled, &session, &run_id, None)
        .await
        .unwrap();
    assert_eq!(sent.load(Ordering::SeqCst), 0, "the tool never ran");
    assert_eq!(got.counts.tools_doubled, 1, "{:?}", got.counts);
    assert!(got.misses.is_empty());
    assert_eq!(answer(&got.replayed), "Envoyé : simulé");
}

#[tokio::test]
async fn a_tool_without_side_effects_runs_for_arguments_the_journal_lacks() {
    let sent = Arc::new(AtomicUsize::new(0));
    let agent = agent(scripted("FAKE", original_script()), &sent);
    let (session, run_id) = recorded(&agent).await;
    let variant = plan(json!([
        {"text": "Je calcule.", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]},
        {"text": "Cela fait {{ tool_result }}."}
    ]));
    let got = replay_variant(&engine(), &agent, &variant, &session, &run_id, None)
        .await
        .unwrap();
    assert_eq!(got.counts.tools_run, 1, "{:?}", got.counts);
    assert_eq!(got.counts.tools_served, 0);
    assert_eq!(answer(&got.replayed), "Cela fait 3.");
}

#[tokio::test]
async fn an_unknown_step_or_double_is_refused() {
    let sent = Arc::new(AtomicUsize::new(0));
    let agent = agent(scripted("FAKE", original_script()), &sent);
    let (session, run_id) = recorded(&agent).await;
    let mut bad = VariantPlan::default();
    bad.models.insert(
        "writer".into(),
        binding("fake-2", scripted("FAKE", json!([]))),
    );
    let error = replay_variant(&engine(), &agent, &bad, &session, &run_id, None)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, ReplayError::UnknownStep { step, .. } if step == "writer"),
        "{error}"
    );
    assert!(error.to_string().contains("its steps: main"), "{error}");

    let mut bad = VariantPlan::default();
    let double: Arc<dyn Tool> = Arc::new(add_tool());
    bad.doubles.insert("mail".into(), double);
    let error = replay_variant(&engine(), &agent, &bad, &session, &run_id, None)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, ReplayError::UnknownDouble { tool, .. } if tool == "mail"),
        "{error}"
    );
}
