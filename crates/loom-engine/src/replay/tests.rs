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
        for a in answers {
            book.answers.push(Answer {
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
