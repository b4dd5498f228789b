//! Values read back from a journal are data from outside: a corrupted step duration (huge or
//! negative) never panics the engine. Too large a sum of piloting time ends the run with its
//! timeout; a value that means nothing counts as nothing. Infinite and NaN durations cannot
//! reach a journal at all (JSON cannot hold them, and an event that would not read back is
//! refused); `units::millis` copes with them anyway (its unit test).

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use loom_core::{
    Event, Message, RunStatus,
    event::{Effect, Envelope, Outcome, Payload, StepCompleted, StepStarted},
    ports::EventStore,
};
use loom_engine::{AgentRuntime, BeginRun, Engine, ModelBinding, RunRef};
use loom_journal::MemoryStore;
use loom_testkit::{ManualClock, scripted};
use serde_json::{Map, json};
use tokio_util::sync::CancellationToken;

fn begin() -> BeginRun {
    BeginRun {
        tenant_id: "default".into(),
        session_id: None,
        run_id: None,
        user_id: None,
        metadata: Map::new(),
        message: Message::user("Bonjour ?"),
        judges: Default::default(),
        budget: None,
        attachments: Vec::new(),
        trigger: None,
        state: Default::default(),
    }
}

/// A step of the run, written as if by an earlier driver, whose duration is `duration_ms`.
async fn journal_a_step(store: &MemoryStore, run: &RunRef, duration_ms: f64) {
    try_journal_a_step(store, run, duration_ms).await.unwrap();
}

/// [`journal_a_step`], answering the journal's refusal.
async fn try_journal_a_step(
    store: &MemoryStore,
    run: &RunRef,
    duration_ms: f64,
) -> Result<(), loom_core::ports::StoreError> {
    let events = store
        .read(&run.tenant_id, &run.session_id, 0)
        .await
        .unwrap();
    let started = events.first().unwrap();
    let envelope = |n: u32| Envelope {
        event_id: format!("corrupted-{n}"),
        ts: started.ts,
        tenant_id: run.tenant_id.clone(),
        session_id: run.session_id.clone(),
        run_id: run.run_id.clone(),
        root_run_id: run.run_id.clone(),
        span_id: "step-1".into(),
        parent_span_id: Some(started.span_id.clone()),
        agent: started.agent.clone(),
        role: None,
    };
    let step = vec![
        Event::new(
            envelope(1),
            Payload::StepStarted(StepStarted {
                step_no: 1,
                state: RunStatus::ReadyForModel,
                effect: Effect::ModelCall,
            }),
        ),
        Event::new(
            envelope(2),
            Payload::StepCompleted(StepCompleted {
                step_no: 1,
                duration_ms,
                events_emitted: 0,
                outcome: Outcome::Error,
            }),
        ),
    ];
    let last = events.last().unwrap().seq;
    store.append(step, last).await.map(|_| ())
}

#[tokio::test]
async fn a_corrupted_step_duration_never_panics_the_engine() {
    for (duration_ms, expected) in [
        (f64::MAX, RunStatus::Failed),
        (1e300, RunStatus::Failed),
        (-1e300, RunStatus::Completed),
        (-f64::MAX, RunStatus::Completed),
    ] {
        let store = Arc::new(MemoryStore::new());
        let engine = Engine::new(store.clone(), Arc::new(ManualClock::new()));
        let model = scripted("fake-1", json!([{"text": "Bonjour."}]));
        let mut agent = AgentRuntime::new("demo", "", ModelBinding::new("FAKE", "fake-1", model));
        agent.timeout = Some(Duration::from_secs(60));
        let run = engine.begin(&agent, begin(), &()).await.unwrap();
        journal_a_step(&store, &run, duration_ms).await;

        let state = engine
            .drive(&run, &agent, &(), &CancellationToken::new())
            .await
            .unwrap();
        assert!(state.finished, "{duration_ms}");
        assert_eq!(state.status, expected, "{duration_ms}");
        if expected == RunStatus::Failed {
            assert_eq!(
                state.error_type.as_deref(),
                Some("timeout"),
                "{duration_ms}"
            );
        }
    }
}

/// A duration JSON cannot hold never reaches the journal: the append is refused.
#[tokio::test]
async fn a_duration_json_cannot_hold_is_never_journaled() {
    for duration_ms in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
        let store = Arc::new(MemoryStore::new());
        let engine = Engine::new(store.clone(), Arc::new(ManualClock::new()));
        let model = scripted("fake-1", json!([{"text": "Bonjour."}]));
        let agent = AgentRuntime::new("demo", "", ModelBinding::new("FAKE", "fake-1", model));
        let run = engine.begin(&agent, begin(), &()).await.unwrap();
        let refused = try_journal_a_step(&store, &run, duration_ms).await;
        assert!(refused.is_err(), "{duration_ms}");
        let events = store
            .read(&run.tenant_id, &run.session_id, 0)
            .await
            .unwrap();
        assert!(
            events.iter().all(|e| !e.event_id.starts_with("corrupted")),
            "{duration_ms}"
        );
    }
}
