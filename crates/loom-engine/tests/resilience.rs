//! Model-call resilience, end to end on the memory journal: retries with backoff and
//! `Retry-After`, fallbacks and adherence, the circuit breaker shared by the runs of an engine,
//! the three stream timeouts, partial attempts kept out of the journal, and the cost of the
//! model actually used.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use loom_core::{
    Event, Message, Pricing, RunStatus,
    content::BlockKind,
    event::Payload,
    model::{ModelClient, ModelError, ModelErrorKind},
    ports::{Clock, EventStore},
};
use loom_engine::{
    AgentRuntime, BeginRun, BoundTool, CircuitSettings, Engine, ModelBinding, ModelTimeouts,
    Observer, RetryPolicy, RunRef,
};
use loom_journal::MemoryStore;
use loom_testkit::{FlakyModel, ManualClock, RecordingModel, SlowModel, add_tool, scripted};
use serde_json::{Map, json};
use tokio_util::sync::CancellationToken;

/// Every test finishes well within this.
const BOUND: Duration = Duration::from_secs(20);

async fn bounded<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, future)
        .await
        .expect("the test took too long")
}

struct Setup {
    engine: Engine,
    store: Arc<MemoryStore>,
    clock: Arc<ManualClock>,
}

fn setup() -> Setup {
    let store = Arc::new(MemoryStore::new());
    let clock = Arc::new(ManualClock::new());
    Setup {
        engine: Engine::new(store.clone(), clock.clone()),
        store,
        clock,
    }
}

/// Tiny delays: 5 ms, then 10 ms, …
fn quick_retry(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_delay: Duration::from_millis(5),
        multiplier: 2.0,
        max_delay: Duration::from_secs(1),
    }
}

fn binding(config_id: &str, model_id: &str, client: Arc<dyn ModelClient>) -> ModelBinding {
    let mut binding = ModelBinding::new(config_id, model_id, client);
    binding.retry = quick_retry(3);
    binding.pricing = Pricing {
        input: 3.0,
        output: 15.0,
        ..Default::default()
    };
    binding
}

fn agent(main: ModelBinding, fallbacks: Vec<ModelBinding>) -> AgentRuntime {
    let mut agent = AgentRuntime::new("demo", "Tu es un assistant.", main);
    agent.fallbacks = fallbacks;
    agent
}

fn with_add(mut agent: AgentRuntime) -> AgentRuntime {
    let tool = add_tool();
    agent
        .tools
        .push(BoundTool::declared(Arc::new(tool)).unwrap());
    agent
}

fn error(kind: ModelErrorKind, status: u16) -> ModelError {
    ModelError {
        kind,
        message: format!("HTTP {status}: {kind}"),
        http_status: Some(status),
        retry_after: None,
    }
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

async fn run_with(
    engine: &Engine,
    agent: &AgentRuntime,
    message: &str,
    observer: &dyn Observer,
    cancel: &CancellationToken,
) -> (RunRef, loom_core::RunState) {
    let run = engine.begin(agent, begin(message), observer).await.unwrap();
    let state = bounded(engine.drive(&run, agent, observer, cancel))
        .await
        .unwrap();
    (run, state)
}

async fn run(
    engine: &Engine,
    agent: &AgentRuntime,
    message: &str,
) -> (RunRef, loom_core::RunState) {
    run_with(engine, agent, message, &(), &CancellationToken::new()).await
}

async fn events(store: &MemoryStore, run: &RunRef) -> Vec<Event> {
    store
        .read(&run.tenant_id, &run.session_id, 0)
        .await
        .unwrap()
}

fn types(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.event_type.as_str()).collect()
}

fn of_type<'a>(events: &'a [Event], kind: &str) -> Vec<&'a Payload> {
    events
        .iter()
        .filter(|e| e.event_type == kind)
        .map(|e| &e.payload)
        .collect()
}

fn retried(events: &[Event]) -> Vec<loom_core::event::ModelRetried> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ModelRetried(p) => Some(p.clone()),
            _ => None,
        })
        .collect()
}

fn fell_back(events: &[Event]) -> Vec<loom_core::event::ModelFellBack> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ModelFellBack(p) => Some(p.clone()),
            _ => None,
        })
        .collect()
}

fn responded(events: &[Event]) -> Vec<loom_core::event::ModelResponded> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ModelResponded(p) => Some(p.clone()),
            _ => None,
        })
        .collect()
}

fn failed(events: &[Event]) -> loom_core::event::RunFailed {
    events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::RunFailed(p) => Some(p.clone()),
            _ => None,
        })
        .expect("run.failed")
}

fn calc_script() -> serde_json::Value {
    json!([
        {"text": "Je calcule.", "tool_calls": [{"name": "add", "arguments": {"a": 12, "b": 7}}]},
        {"text": "Cela fait {{ tool_result }}."}
    ])
}

fn hello(name: &str) -> Arc<dyn ModelClient> {
    scripted(name, json!([{"text": "Bonjour."}]))
}

#[tokio::test]
async fn a_transient_error_is_retried_then_answers() {
    let s = setup();
    let main = Arc::new(FlakyModel::new(
        hello("fake-1"),
        2,
        error(ModelErrorKind::Transient, 503),
    ));
    let agent = agent(binding("FAKE", "fake-1", main.clone()), vec![]);
    let (run, state) = run(&s.engine, &agent, "Bonjour ?").await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().as_deref(), Some("Bonjour."));
    assert_eq!(main.calls(), 3);
    let events = events(&s.store, &run).await;
    assert_eq!(
        types(&events),
        [
            "run.started",
            "message.user",
            "run.claimed",
            "step.started",
            "model.retried",
            "model.retried",
            "model.responded",
            "step.completed",
            "run.transitioned",
            "run.completed",
        ]
    );
    let retried = retried(&events);
    for (i, retry) in retried.iter().enumerate() {
        let attempt = u32::try_from(i).unwrap() + 1;
        assert_eq!(retry.attempt, attempt);
        assert_eq!(retry.error_kind, "transient");
        assert_eq!(retry.error, "HTTP 503: transient");
        assert_eq!(retry.http_status, Some(503));
        assert_eq!(retry.model.as_deref(), Some("FAKE"));
        assert_eq!(retry.model_id, "fake-1");
        assert!(retry.usage.is_none());
        assert!(!retry.r#final);
        // min(max, 5 ms × 2^(n-1)) × (0.5 + jitter/2)
        let full = 0.005 * 2f64.powi(i32::try_from(i).unwrap());
        assert!(
            retry.delay_s >= full * 0.5 - 1e-9 && retry.delay_s <= full + 1e-9,
            "attempt {attempt}: delay {} outside [{}, {full}]",
            retry.delay_s,
            full * 0.5
        );
    }
    let answer = &responded(&events)[0];
    assert_eq!(answer.attempts, 3);
    assert_eq!(answer.model.as_deref(), Some("FAKE"));
    let Payload::StepCompleted(done) = &events[7].payload else {
        panic!("step.completed expected");
    };
    assert_eq!(done.events_emitted, 3);
}

/// Time slept on tokio's clock since `started`, in a test that pauses it (`start_paused`): the
/// clock then moves only when every task waits, by exactly what they wait for, so this is what
/// the engine waited, however slow the machine.
fn slept_since(started: tokio::time::Instant) -> Duration {
    tokio::time::Instant::now() - started
}

#[tokio::test(start_paused = true)]
async fn retry_after_replaces_the_computed_delay() {
    let s = setup();
    let mut throttled = error(ModelErrorKind::Transient, 429);
    throttled.retry_after = Some(Duration::from_millis(60));
    let main = Arc::new(FlakyModel::new(hello("fake-1"), 1, throttled));
    let agent = agent(binding("FAKE", "fake-1", main.clone()), vec![]);
    let started = tokio::time::Instant::now();
    let (run, state) = run(&s.engine, &agent, "Bonjour ?").await;
    assert!(
        slept_since(started) >= Duration::from_millis(60),
        "the engine did not wait for Retry-After"
    );
    assert_eq!(state.status, RunStatus::Completed);
    let events = events(&s.store, &run).await;
    let retried = retried(&events);
    assert_eq!(retried.len(), 1);
    assert!(
        (retried[0].delay_s - 0.06).abs() < 1e-9,
        "{}",
        retried[0].delay_s
    );
    assert_eq!(retried[0].http_status, Some(429));
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_beyond_max_delay_abandons_the_model() {
    let s = setup();
    let mut throttled = error(ModelErrorKind::Transient, 429);
    throttled.retry_after = Some(Duration::from_secs(120));
    let main = Arc::new(FlakyModel::always(hello("fake-1"), throttled));
    let agent = agent(
        binding("FAKE", "fake-1", main.clone()),
        vec![binding("FB", "fb-1", hello("fb-1"))],
    );
    let started = tokio::time::Instant::now();
    let (run, state) = run(&s.engine, &agent, "Bonjour ?").await;
    assert!(
        slept_since(started) < Duration::from_secs(120),
        "the engine waited for a Retry-After beyond max_delay"
    );
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(main.calls(), 1);
    let events = events(&s.store, &run).await;
    assert!(retried(&events).is_empty());
    let fell = fell_back(&events);
    assert_eq!(fell.len(), 1);
    assert_eq!(fell[0].reason, "transient");
    assert_eq!(responded(&events)[0].model.as_deref(), Some("FB"));
}

#[tokio::test]
async fn exhausted_retries_fall_back_and_the_run_stays_on_the_fallback() {
    let s = setup();
    let main = Arc::new(FlakyModel::always(
        scripted("fake-1", calc_script()),
        error(ModelErrorKind::Overloaded, 529),
    ));
    let mut main_binding = binding("FAKE", "fake-1", main.clone());
    main_binding.retry = quick_retry(2);
    main_binding.pricing = Pricing {
        input: 1000.0,
        output: 1000.0,
        ..Default::default()
    };
    let fallback = Arc::new(RecordingModel::new(scripted("fb-1", calc_script())));
    let mut fb_binding = binding("FB", "fb-1", fallback.clone());
    fb_binding.pricing = Pricing {
        input: 1.0,
        output: 2.0,
        ..Default::default()
    };
    let fb_pricing = fb_binding.pricing.clone();
    let agent = with_add(agent(main_binding, vec![fb_binding]));
    let (run, state) = run(&s.engine, &agent, "12 + 7 ?").await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().as_deref(), Some("Cela fait 19."));
    // Two attempts on main in the first step, none after: the run stayed on the fallback.
    assert_eq!(main.calls(), 2);
    assert_eq!(fallback.requests().len(), 2);
    assert_eq!(state.models.get("main").map(String::as_str), Some("FB"));
    let events = events(&s.store, &run).await;
    assert_eq!(
        types(&events),
        [
            "run.started",
            "message.user",
            "run.claimed",
            "step.started",
            "model.retried",
            "model.fell_back",
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
    let fell = &fell_back(&events)[0];
    assert_eq!(
        (
            fell.slot.as_str(),
            fell.from_model.as_str(),
            fell.to_model.as_str()
        ),
        ("main", "FAKE", "FB")
    );
    assert_eq!(fell.reason, "overloaded");
    assert_eq!(fell.error.as_deref(), Some("HTTP 529: overloaded"));
    // The cost that counts is the fallback's.
    let answers = responded(&events);
    let mut total = 0.0;
    for answer in &answers {
        assert_eq!(answer.model.as_deref(), Some("FB"));
        assert_eq!(answer.model_id, "fb-1");
        assert_eq!(answer.attempts, 1);
        let cost = fb_pricing.cost(&answer.usage);
        assert!(cost > 0.0);
        assert!((answer.cost_usd - cost).abs() < 1e-12);
        total += cost;
    }
    assert!((state.cost_usd - total).abs() < 1e-12);
    // The fallback was asked with its own name.
    assert!(fallback.requests().iter().all(|r| r.model_id == "fb-1"));
}

#[tokio::test]
async fn quota_switches_at_once_without_retrying() {
    let s = setup();
    let main = Arc::new(FlakyModel::always(
        hello("fake-1"),
        error(ModelErrorKind::QuotaExhausted, 402),
    ));
    let agent = agent(
        binding("FAKE", "fake-1", main.clone()),
        vec![binding("FB", "fb-1", hello("fb-1"))],
    );
    let (run, state) = run(&s.engine, &agent, "Bonjour ?").await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(main.calls(), 1);
    let events = events(&s.store, &run).await;
    assert!(retried(&events).is_empty());
    let fell = fell_back(&events);
    assert_eq!(fell.len(), 1);
    assert_eq!(fell[0].reason, "quota_exhausted");
    assert_eq!(responded(&events)[0].model.as_deref(), Some("FB"));
}

#[tokio::test]
async fn auth_fails_at_once_without_retry_nor_fallback() {
    let s = setup();
    let main = Arc::new(FlakyModel::always(
        hello("fake-1"),
        error(ModelErrorKind::Auth, 401),
    ));
    let fallback = Arc::new(RecordingModel::new(hello("fb-1")));
    let agent = agent(
        binding("FAKE", "fake-1", main.clone()),
        vec![binding("FB", "fb-1", fallback.clone())],
    );
    let (run, state) = run(&s.engine, &agent, "Bonjour ?").await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("model.auth"));
    assert_eq!(main.calls(), 1);
    assert!(fallback.requests().is_empty());
    let events = events(&s.store, &run).await;
    assert_eq!(
        types(&events),
        [
            "run.started",
            "message.user",
            "run.claimed",
            "step.started",
            "step.completed",
            "run.transitioned",
            "run.failed",
        ]
    );
    assert_eq!(failed(&events).error, "HTTP 401: auth");
}

#[tokio::test]
async fn the_breaker_opens_across_runs_skips_the_model_then_closes_after_a_trial() {
    let s = setup();
    // Down for two calls, then back.
    let main = Arc::new(FlakyModel::new(
        hello("fake-1"),
        2,
        error(ModelErrorKind::Transient, 503),
    ));
    let mut main_binding = binding("FAKE", "fake-1", main.clone());
    main_binding.retry = quick_retry(1);
    main_binding.circuit = Some(CircuitSettings {
        failures: 2,
        cooldown: Duration::from_secs(60),
    });
    let agent = agent(main_binding, vec![binding("FB", "fb-1", hello("fb-1"))]);
    let mut all = Vec::new();

    // Run 1: one failure, fallback.
    let (r1, state) = run(&s.engine, &agent, "un").await;
    assert_eq!(state.status, RunStatus::Completed);
    let e1 = events(&s.store, &r1).await;
    assert!(of_type(&e1, "circuit.opened").is_empty());
    assert_eq!(fell_back(&e1)[0].reason, "transient");
    all.extend(e1);

    // Run 2 (another clone of the engine shares its breakers): the second failure opens it.
    let (r2, _) = run(&s.engine.clone(), &agent, "deux").await;
    let e2 = events(&s.store, &r2).await;
    let opened = of_type(&e2, "circuit.opened");
    assert_eq!(opened.len(), 1);
    let Payload::CircuitOpened(opened) = opened[0] else {
        unreachable!()
    };
    assert_eq!(
        (opened.target_kind.as_str(), opened.target.as_str()),
        ("model", "FAKE")
    );
    assert_eq!(opened.failures, 2);
    assert!((opened.cooldown_s - 60.0).abs() < 1e-9);
    assert_eq!(opened.error.as_deref(), Some("HTTP 503: transient"));
    let position = |kind: &str| e2.iter().position(|e| e.event_type == kind).unwrap();
    assert!(position("circuit.opened") < position("model.fell_back"));
    assert_eq!(fell_back(&e2)[0].reason, "transient");
    all.extend(e2);
    assert_eq!(main.calls(), 2);

    // Run 3: skipped at once.
    let (r3, state) = run(&s.engine, &agent, "trois").await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(main.calls(), 2);
    let e3 = events(&s.store, &r3).await;
    let fell = fell_back(&e3);
    assert_eq!(fell.len(), 1);
    assert_eq!(fell[0].reason, "circuit_open");
    assert_eq!(
        (fell[0].from_model.as_str(), fell[0].to_model.as_str()),
        ("FAKE", "FB")
    );
    assert!(retried(&e3).is_empty());
    assert_eq!(responded(&e3)[0].model.as_deref(), Some("FB"));
    all.extend(e3);

    // After the cooldown, one trial: it succeeds and closes the breaker.
    s.clock.advance(Duration::from_secs(61));
    let (r4, state) = run(&s.engine, &agent, "quatre").await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(main.calls(), 3);
    let e4 = events(&s.store, &r4).await;
    assert!(fell_back(&e4).is_empty());
    assert_eq!(responded(&e4)[0].model.as_deref(), Some("FAKE"));
    all.extend(e4);
    let (r5, _) = run(&s.engine, &agent, "cinq").await;
    assert_eq!(main.calls(), 4);
    let e5 = events(&s.store, &r5).await;
    assert_eq!(responded(&e5)[0].model.as_deref(), Some("FAKE"));
    all.extend(e5);

    assert_eq!(of_type(&all, "circuit.opened").len(), 1);
    assert!(!s.engine.breakers().is_open("model:FAKE", s.clock.now()));
}

#[tokio::test]
async fn a_chain_entirely_skipped_fails_as_unavailable() {
    let s = setup();
    let settings = Some(CircuitSettings {
        failures: 1,
        cooldown: Duration::from_secs(60),
    });
    let main = Arc::new(FlakyModel::always(
        hello("fake-1"),
        error(ModelErrorKind::Transient, 500),
    ));
    let fallback = Arc::new(FlakyModel::always(
        hello("fb-1"),
        error(ModelErrorKind::Overloaded, 529),
    ));
    let mut main_binding = binding("FAKE", "fake-1", main.clone());
    main_binding.retry = quick_retry(1);
    main_binding.circuit = settings;
    let mut fb_binding = binding("FB", "fb-1", fallback.clone());
    fb_binding.retry = quick_retry(1);
    fb_binding.circuit = settings;
    let agent = agent(main_binding, vec![fb_binding]);

    let (r1, state) = run(&s.engine, &agent, "un").await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("model.overloaded"));
    let e1 = events(&s.store, &r1).await;
    assert_eq!(of_type(&e1, "circuit.opened").len(), 2);

    let (r2, state) = run(&s.engine, &agent, "deux").await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("model.unavailable"));
    assert_eq!((main.calls(), fallback.calls()), (1, 1));
    let e2 = events(&s.store, &r2).await;
    let fell = fell_back(&e2);
    assert_eq!(fell.len(), 1);
    assert_eq!(fell[0].reason, "circuit_open");
    let failure = failed(&e2);
    assert_eq!(failure.error_type, "model.unavailable");
    assert!(failure.error.contains("FAKE, FB"), "{}", failure.error);
}

#[tokio::test]
async fn a_context_overflow_moves_to_the_first_larger_window() {
    let s = setup();
    let overflow = || error(ModelErrorKind::ContextOverflow, 400);
    let main = Arc::new(FlakyModel::always(hello("fake-1"), overflow()));
    let small = Arc::new(RecordingModel::new(hello("small-1")));
    let large = Arc::new(RecordingModel::new(hello("large-1")));
    let mut main_binding = binding("FAKE", "fake-1", main.clone());
    main_binding.context_window = Some(8_000);
    let mut small_binding = binding("SMALL", "small-1", small.clone());
    small_binding.context_window = Some(4_000);
    let mut large_binding = binding("LARGE", "large-1", large.clone());
    large_binding.context_window = Some(200_000);
    let chain = agent(
        main_binding.clone(),
        vec![small_binding.clone(), large_binding],
    );
    let (run1, state) = run(&s.engine, &chain, "Bonjour ?").await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(main.calls(), 1);
    assert!(small.requests().is_empty());
    assert_eq!(large.requests().len(), 1);
    let e1 = events(&s.store, &run1).await;
    let fell = fell_back(&e1);
    assert_eq!(fell.len(), 1);
    assert_eq!(
        (fell[0].to_model.as_str(), fell[0].reason.as_str()),
        ("LARGE", "context_overflow")
    );

    // No larger window after it: the run fails.
    let chain = agent(main_binding, vec![small_binding]);
    let (_, state) = run(&s.engine, &chain, "Bonjour ?").await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("model.context_overflow"));
    assert!(small.requests().is_empty());
}

fn timing_out(
    model: Arc<dyn ModelClient>,
    timeouts: ModelTimeouts,
    max_attempts: u32,
) -> AgentRuntime {
    let mut main = binding("FAKE", "fake-1", model);
    main.timeouts = timeouts;
    main.retry = quick_retry(max_attempts);
    agent(main, vec![])
}

/// The error of the run's failure (which says which timeout cut the call: the stalled models
/// would otherwise answer, and the run complete).
async fn failure_of(agent: &AgentRuntime) -> String {
    let s = setup();
    let (run, state) = run(&s.engine, agent, "Bonjour ?").await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("model.transient"));
    failed(&events(&s.store, &run).await).error
}

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

#[tokio::test]
async fn no_first_chunk_in_time_is_a_transient_error() {
    let stalled = Arc::new(SlowModel::new(hello("fake-1")).before_first(ms(2_000)));
    let timeouts = ModelTimeouts {
        first_token: Some(ms(30)),
        ..ModelTimeouts::none()
    };
    let error = failure_of(&timing_out(stalled, timeouts, 1)).await;
    assert_eq!(error, "timed out: no first chunk in 0.03 s");

    // A usage chunk is not content: it does not stop the clock.
    let stalled = Arc::new(
        SlowModel::new(hello("fake-1"))
            .usage_first()
            .before_first(ms(2_000)),
    );
    let error = failure_of(&timing_out(stalled, timeouts, 1)).await;
    assert_eq!(error, "timed out: no first chunk in 0.03 s");
}

#[tokio::test]
async fn silence_between_chunks_is_a_transient_error() {
    let stalled = Arc::new(SlowModel::new(hello("fake-1")).between(ms(2_000)));
    let timeouts = ModelTimeouts {
        first_token: Some(ms(1_000)),
        idle: Some(ms(30)),
        total: None,
    };
    let error = failure_of(&timing_out(stalled, timeouts, 1)).await;
    assert_eq!(error, "timed out: idle for 0.03 s between chunks");
}

#[tokio::test]
async fn a_call_longer_than_its_total_is_a_transient_error() {
    // Each gap (20 ms) is within `idle`; the call as a whole is not within `total`.
    let slow = Arc::new(
        SlowModel::new(scripted(
            "fake-1",
            json!([{"text": "un deux trois quatre cinq six sept huit"}]),
        ))
        .between(ms(20)),
    );
    let timeouts = ModelTimeouts {
        first_token: Some(ms(1_000)),
        idle: Some(ms(1_000)),
        total: Some(ms(70)),
    };
    let error = failure_of(&timing_out(slow, timeouts, 1)).await;
    assert_eq!(error, "timed out: total time of 0.07 s exceeded");
}

#[tokio::test]
async fn a_timed_out_attempt_is_retried() {
    let s = setup();
    let stalled = Arc::new(
        SlowModel::new(hello("fake-1"))
            .before_first(ms(2_000))
            .only_first(1),
    );
    let timeouts = ModelTimeouts {
        first_token: Some(ms(30)),
        ..ModelTimeouts::default()
    };
    let agent = timing_out(stalled.clone(), timeouts, 2);
    let (run, state) = run(&s.engine, &agent, "Bonjour ?").await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(stalled.calls(), 2);
    let events = events(&s.store, &run).await;
    let retried = retried(&events);
    assert_eq!(retried.len(), 1);
    assert_eq!(retried[0].error_kind, "transient");
    assert_eq!(retried[0].error, "timed out: no first chunk in 0.03 s");
    assert_eq!(responded(&events)[0].attempts, 2);
}

/// Records what a live display would see.
#[derive(Default)]
struct Display(Mutex<Vec<String>>);

impl Observer for Display {
    fn text_delta(&self, _run_id: &str, text: &str) {
        self.0.lock().unwrap().push(format!("text:{text}"));
    }

    fn reset(&self, _run_id: &str) {
        self.0.lock().unwrap().push("reset".into());
    }
}

#[tokio::test]
async fn a_partially_streamed_attempt_never_reaches_the_journal() {
    let s = setup();
    let main = Arc::new(
        FlakyModel::new(
            scripted("fake-1", json!([{"text": "Réponse complète."}])),
            1,
            error(ModelErrorKind::Transient, 502),
        )
        .with_partial_text("Début perdu "),
    );
    let agent = agent(binding("FAKE", "fake-1", main), vec![]);
    let display = Display::default();
    let (run, state) = run_with(
        &s.engine,
        &agent,
        "Bonjour ?",
        &display,
        &CancellationToken::new(),
    )
    .await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().as_deref(), Some("Réponse complète."));
    assert_eq!(
        *display.0.lock().unwrap(),
        [
            "text:Début perdu ",
            "reset",
            "text:Réponse ",
            "text:complète."
        ]
    );
    let events = events(&s.store, &run).await;
    for event in &events {
        let json = serde_json::to_string(event).unwrap();
        assert!(!json.contains("Début perdu"), "leaked into {json}");
    }
    assert_eq!(retried(&events).len(), 1);
}

#[tokio::test]
async fn the_fallback_gets_its_own_settings_and_no_reasoning_of_other_models() {
    let s = setup();
    let script = json!([
        {"reasoning": "Il faut additionner.", "text": "Je calcule.",
         "tool_calls": [{"name": "add", "arguments": {"a": 12, "b": 7}}]},
        {"text": "Cela fait {{ tool_result }}."}
    ]);
    // Main answers the first call, then fails for good.
    let main = Arc::new(
        FlakyModel::always(
            scripted("fake-1", script.clone()),
            error(ModelErrorKind::Transient, 500),
        )
        .after(1),
    );
    let mut main_binding = binding("FAKE", "fake-1", main.clone());
    main_binding.retry = quick_retry(1);
    let fallback = Arc::new(RecordingModel::new(scripted("fb-1", script)));
    let mut fb_binding = binding("FB", "fb-1", fallback.clone());
    fb_binding.max_tokens = Some(321);
    std::sync::Arc::make_mut(&mut fb_binding.params).insert("temperature".into(), json!(0.2));
    let agent = with_add(agent(main_binding, vec![fb_binding]));
    let (run, state) = run(&s.engine, &agent, "12 + 7 ?").await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().as_deref(), Some("Cela fait 19."));
    let requests = fallback.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.model_id, "fb-1");
    assert_eq!(request.max_tokens, Some(321));
    assert_eq!(request.params.get("temperature"), Some(&json!(0.2)));
    let blocks: Vec<&BlockKind> = request
        .messages
        .iter()
        .flat_map(|m| m.blocks.iter().map(|b| &b.kind))
        .collect();
    assert!(
        !blocks
            .iter()
            .any(|b| matches!(b, BlockKind::Reasoning { .. })),
        "{blocks:?}"
    );
    assert!(
        blocks
            .iter()
            .any(|b| matches!(b, BlockKind::ToolCall { .. }))
    );
    // The journal keeps main's reasoning, and the run's answer comes from the fallback.
    let events = events(&s.store, &run).await;
    let answers = responded(&events);
    assert!(
        answers[0]
            .message
            .blocks
            .iter()
            .any(|b| matches!(b.kind, BlockKind::Reasoning { .. }))
    );
    assert_eq!(answers[1].model.as_deref(), Some("FB"));
}

#[tokio::test(start_paused = true)]
async fn cancellation_and_the_run_timeout_cut_a_retry_delay() {
    let mut throttled = error(ModelErrorKind::Transient, 429);
    throttled.retry_after = Some(Duration::from_secs(30));
    let mut main = binding(
        "FAKE",
        "fake-1",
        Arc::new(FlakyModel::always(hello("fake-1"), throttled)),
    );
    main.retry.max_delay = Duration::from_secs(60);
    let agent = agent(main, vec![]);

    let s = setup();
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(100)).await;
        trigger.cancel();
    });
    let started = tokio::time::Instant::now();
    let (cancelled, state) = run_with(&s.engine, &agent, "Bonjour ?", &(), &cancel).await;
    assert!(
        slept_since(started) < Duration::from_secs(30),
        "the cancellation did not cut the retry delay"
    );
    assert_eq!(state.status, RunStatus::Cancelled);
    let events = events(&s.store, &cancelled).await;
    assert_eq!(retried(&events).len(), 1);
    assert!(types(&events).ends_with(&[
        "model.retried",
        "step.completed",
        "run.transitioned",
        "run.cancelled"
    ]));

    let mut agent = agent;
    agent.timeout = Some(ms(100));
    let s = setup();
    let started = tokio::time::Instant::now();
    let (_, state) = run(&s.engine, &agent, "Bonjour ?").await;
    assert!(
        slept_since(started) < Duration::from_secs(30),
        "the run timeout did not cut the retry delay"
    );
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("timeout"));
}
