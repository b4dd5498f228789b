//! Unit tests of the replay's book and comparison.

use serde_json::json;

use super::compare::first_difference;
use super::*;

fn answer(text: &str, hash: &str) -> ModelResponded {
    ModelResponded {
        model_id: "fake-1".into(),
        model: Some("FAKE".into()),
        provider: "fake".into(),
        message: loom_core::Message::assistant(text),
        usage: loom_core::Usage::default(),
        cost_usd: 0.0,
        stop_reason: loom_core::model::StopReason::End,
        latency_ms: 1.0,
        attempts: 1,
        request_hash: Some(hash.into()),
        request_parts: serde_json::Map::new(),
        call_id: None,
        judge: None,
    }
}

fn book(answers: &[ModelResponded]) -> Recording {
    let recording = Recording::default();
    {
        let mut book = recording.book();
        for (index, a) in answers.iter().enumerate() {
            book.answers.push(Answer {
                index,
                request_hash: a.request_hash.clone(),
                response: a.clone(),
                served: false,
            });
        }
        book.counts.models_recorded = answers.len();
    }
    recording
}

fn text_of(answer: &ModelResponded) -> String {
    answer.message.text()
}

#[test]
fn a_known_request_gets_its_own_answer_and_an_unknown_one_the_next_in_order() {
    let recording = book(&[answer("first", "aaa"), answer("second", "bbb")]);
    assert_eq!(text_of(&recording.answer("bbb").unwrap()), "second");
    assert_eq!(text_of(&recording.answer("zzz").unwrap()), "first");
    assert!(
        recording.answer("aaa").is_none(),
        "every answer is served once"
    );
    assert_eq!(recording.counts().models_served, 2);
}

#[test]
fn a_tool_result_is_served_once_for_its_call_and_tool() {
    let recording = Recording::default();
    recording
        .book()
        .results
        .entry("c1".into())
        .or_default()
        .push_back(("add".into(), ToolOutput::text("5")));
    assert!(recording.result("c1", "other").is_none());
    assert_eq!(recording.result("c1", "add"), Some(ToolOutput::text("5")));
    assert!(recording.result("c1", "add").is_none());
    assert_eq!(recording.counts().tools_served, 1);
}

#[test]
fn the_difference_names_the_request_part_before_the_hash() {
    let want = json!({"type": "model.responded", "payload": {
        "request_hash": "h1", "request_parts": {"system": "s1", "tools": "t"}}});
    let have = json!({"type": "model.responded", "payload": {
        "request_hash": "h2", "request_parts": {"system": "s2", "tools": "t"}}});
    let (path, expected, got) = first_difference(&want, &have).unwrap();
    assert_eq!(path, "payload.request_parts.system");
    assert_eq!((expected, got), (json!("s1"), json!("s2")));
}

#[test]
fn the_difference_is_located_in_arrays_and_absent_fields() {
    let want = json!({"payload": {"message": {"blocks": [{"text": "a"}, {"text": "b"}]}}});
    let have = json!({"payload": {"message": {"blocks": [{"text": "a"}, {"text": "c"}]}}});
    let (path, ..) = first_difference(&want, &have).unwrap();
    assert_eq!(path, "payload.message.blocks[1].text");
    let (path, expected, got) =
        first_difference(&json!({"a": 1}), &json!({"a": 1, "b": 2})).unwrap();
    assert_eq!((path.as_str(), expected, got), ("b", json!(null), json!(2)));
    assert!(first_difference(&want, &want.clone()).is_none());
}

#[test]
fn a_recorded_answer_streams_back_into_the_same_message() {
    let mut recorded = answer("Je calcule.", "h");
    recorded
        .message
        .blocks
        .push(loom_core::Block::new(BlockKind::ToolCall {
            call_id: "c1".into(),
            name: "add".into(),
            arguments: json!({"a": 2, "b": 3}),
        }));
    let mut accumulator = loom_core::model::ResponseAccumulator::new();
    for chunk in chunks(&recorded) {
        accumulator.push(chunk.unwrap());
    }
    let response = accumulator.finish().unwrap();
    assert_eq!(response.message, recorded.message);
}

#[test]
fn a_declared_double_answers_every_call_of_its_tool_and_nothing_else() {
    let recording = Recording::from_doubles([("send".to_owned(), ToolOutput::text("sent"))]);
    assert_eq!(
        recording.result("c1", "send"),
        Some(ToolOutput::text("sent"))
    );
    assert_eq!(
        recording.result("c2", "send"),
        Some(ToolOutput::text("sent"))
    );
    assert!(recording.result("c3", "delete").is_none());
    assert_eq!(recording.counts().tools_served, 2);
}

/// An event of run `run` (root `root`) carrying `payload`.
fn event(run: &str, root: &str, payload: Payload) -> Event {
    Event::new(
        loom_core::event::Envelope {
            event_id: format!("e-{run}-{}", payload.type_name()),
            ts: chrono::Utc::now(),
            tenant_id: "t".into(),
            session_id: "s".into(),
            run_id: run.into(),
            root_run_id: root.into(),
            span_id: "sp".into(),
            parent_span_id: None,
            agent: Some("a".into()),
            role: None,
        },
        payload,
    )
}

fn retried(model: &str, kind: &str) -> Payload {
    Payload::ModelRetried(loom_core::event::ModelRetried {
        model_id: "FAKE".into(),
        model: Some(model.into()),
        provider: "fake".into(),
        attempt: 1,
        error_kind: kind.into(),
        error: format!("scripted {kind} error"),
        http_status: Some(503),
        delay_s: 0.01,
        call_id: None,
        judge: None,
        usage: None,
        cost_usd: 0.0,
        r#final: false,
    })
}

fn fell_back(from: &str, reason: &str) -> Payload {
    Payload::ModelFellBack(loom_core::event::ModelFellBack {
        slot: "main".into(),
        from_model: from.into(),
        to_model: "fake-1".into(),
        reason: reason.into(),
        error: Some(format!("{reason} of {from}")),
        call_id: None,
        judge: None,
    })
}

#[test]
fn recorded_failures_are_served_in_order_to_their_model_before_the_answer() {
    let mut responded = answer("done", "h-fallback");
    responded.model = Some("fake-1".into());
    let events = vec![
        event("r", "r", retried("flaky", "overloaded")),
        event("r", "r", fell_back("flaky", "transient")),
        // A model skipped by its open breaker was never called: nothing to serve.
        event("r", "r", fell_back("other", "circuit_open")),
        event("r", "r", Payload::ModelResponded(responded)),
    ];
    let recording = Recording::from_events(&events);
    assert!(recording.failure("h-flaky", "fake-1").is_none());
    let first = recording.failure("h-flaky", "flaky").unwrap();
    assert_eq!(first.kind, ModelErrorKind::Overloaded);
    assert_eq!(first.message, "scripted overloaded error");
    assert_eq!(first.http_status, Some(503));
    let second = recording.failure("h-flaky", "flaky").unwrap();
    assert_eq!(second.kind, ModelErrorKind::Transient);
    assert_eq!(second.message, "transient of flaky");
    assert!(recording.failure("h-flaky", "flaky").is_none());
    assert!(recording.failure("h-other", "other").is_none());
    assert_eq!(text_of(&recording.answer("h-fallback").unwrap()), "done");
}

#[test]
fn a_failure_recorded_after_the_next_answer_waits_for_it() {
    let events = vec![
        event("r", "r", Payload::ModelResponded(answer("first", "h1"))),
        event("r", "r", retried("flaky", "transient")),
        event("r", "r", Payload::ModelResponded(answer("second", "h2"))),
    ];
    let recording = Recording::from_events(&events);
    assert!(
        recording.failure("h1", "flaky").is_none(),
        "the first call was answered at once"
    );
    assert_eq!(text_of(&recording.answer("h1").unwrap()), "first");
    assert!(recording.failure("h2", "flaky").is_some());
}

#[test]
fn outside_facts_are_placed_by_the_events_written_before_them() {
    let steer = Payload::MessageUser(loom_core::event::MessageUser {
        message: loom_core::Message::user("plus court"),
        kind: loom_core::state::STEER.into(),
        policy: None,
        tools: true,
    });
    let cancelled = |reason: &str, by: &str| {
        Payload::RunCancelled(loom_core::event::RunCancelled {
            reason: reason.into(),
            by: Some(by.into()),
            iterations: 1,
            usage: loom_core::Usage::default(),
            cost_usd: 0.0,
            withdrawn: Vec::new(),
        })
    };
    let to_cancelled = || {
        Payload::RunTransitioned(loom_core::event::RunTransitioned {
            from_state: loom_core::RunStatus::AwaitingTools,
            to_state: loom_core::RunStatus::Cancelled,
            step_no: 1,
            cause_type: "cancel".into(),
            cause_event_id: None,
        })
    };
    let recorded = vec![
        event("r", "r", Payload::ModelResponded(answer("a", "h"))),
        event("r", "r", steer),
        event("r", "r", Payload::ModelResponded(answer("b", "h"))),
        event("child", "r", to_cancelled()),
        event("child", "r", cancelled("parent", "r")),
        event("r", "r", to_cancelled()),
        event("r", "r", cancelled("requested", "alice")),
    ];
    let facts = outside::facts(&recorded, "r");
    assert_eq!(facts.len(), 2, "{facts:?}");
    assert_eq!(facts[0].after, 1);
    assert!(
        matches!(&facts[0].fact, outside::Fact::Steer { run_id, message, .. }
            if run_id == "r" && message.text() == "plus court")
    );
    // The cancellation is the whole block that closes the tree, the child's first.
    assert_eq!(facts[1].after, 3);
    assert_eq!(
        facts[1].fact,
        outside::Fact::Cancel {
            by: Some("alice".into())
        }
    );
}
