//! The session-state fold: the caller's values, successful results' writes, the order within a
//! turn, defaults, and a fold resumed from a saved value.

use super::*;

fn with_state(pairs: &[(&str, Value)]) -> Map<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

fn started_with(state: &[(&str, Value)]) -> Payload {
    match started() {
        Payload::RunStarted(mut started) => {
            started.state = with_state(state);
            Payload::RunStarted(started)
        }
        other => other,
    }
}

fn writes(call_id: &str, state: &[(&str, Value)]) -> Payload {
    let mut output = ToolOutput::json(json!({"ok": true}));
    output.state = with_state(state);
    tool_completed_with(call_id, output, None, 0.0)
}

fn defaults() -> Vec<(String, Value)> {
    vec![
        ("lang".to_owned(), json!("fr")),
        ("client".to_owned(), json!(null)),
    ]
}

#[test]
fn the_callers_state_and_successful_results_write_over_the_defaults() {
    let mut journal = Journal::new();
    journal.push(started_with(&[("client", json!("C-1"))]));
    journal.push(user("devis"));
    journal.push(responded(asks("", &["c1"])));
    journal.push(called("c1"));
    journal.push(writes("c1", &[("cart", json!([1, 2]))]));
    let mut failed = ToolOutput::error("boom");
    failed.state = with_state(&[("lang", json!("en"))]);
    journal.push(tool_completed_with("c1", failed, None, 0.0));
    let state = SessionState::fold(&journal.events, defaults());
    assert_eq!(
        Value::Object(state.values()),
        json!({"cart": [1, 2], "client": "C-1", "lang": "fr"}),
        "an error result writes nothing; defaults stay under what was written"
    );
    assert_eq!(state.get("lang"), Some(&json!("fr")));
    assert!(!state.has("missing"));
    assert_eq!(state.up_to_seq(), 6);
}

#[test]
fn within_a_turn_the_call_the_model_wrote_last_wins_whatever_finished_first() {
    let mut journal = Journal::new();
    journal.begin("two lookups");
    journal.push(responded(asks("", &["c1", "c2"])));
    // c2 finishes first, then c1: c2 (written last by the model) keeps the key.
    journal.push(writes("c2", &[("client", json!("from c2"))]));
    journal.push(writes(
        "c1",
        &[("client", json!("from c1")), ("lang", json!("de"))],
    ));
    let state = SessionState::fold(&journal.events, defaults());
    assert_eq!(state.get("client"), Some(&json!("from c2")));
    assert_eq!(state.get("lang"), Some(&json!("de")));
    // The next turn writes over it, whatever its rank.
    journal.push(responded(asks("", &["c3"])));
    journal.push(writes("c3", &[("client", json!("from c3"))]));
    let state = SessionState::fold(&journal.events, defaults());
    assert_eq!(state.get("client"), Some(&json!("from c3")));
}

#[test]
fn a_saved_state_resumed_with_the_events_after_it_equals_the_whole_fold() {
    let mut journal = Journal::new();
    journal.begin("first");
    journal.push(responded(asks("", &["c1", "c2"])));
    journal.push(writes("c2", &[("client", json!("late rank"))]));
    let cut = journal.events.len();
    journal.push(writes("c1", &[("client", json!("early rank"))]));
    journal.push(run_completed(None));
    journal.switch_to("run-2");
    journal.push(started_with(&[("lang", json!("it"))]));
    let whole = SessionState::fold(&journal.events, defaults());

    let saved = SessionState::fold(&journal.events[..cut], defaults());
    let text = serde_json::to_string(&saved).expect("serializable");
    assert!(!text.contains("\"fr\""), "defaults are never saved: {text}");
    let mut resumed: SessionState = serde_json::from_str(&text).expect("deserializable");
    resumed = resumed.with_defaults(defaults());
    // Fed from the start: the events it already holds are skipped.
    for event in &journal.events {
        resumed.apply(event);
    }
    assert_eq!(resumed, whole);
    assert_eq!(resumed.get("client"), Some(&json!("late rank")));
    assert_eq!(resumed.get("lang"), Some(&json!("it")));
}

#[test]
fn a_tool_result_message_carries_no_state_writes() {
    let mut journal = Journal::new();
    journal.begin("q");
    journal.push(responded(asks("", &["c1"])));
    journal.push(called("c1"));
    journal.push(writes("c1", &[("client", json!("C-9"))]));
    let state = journal.state();
    let last = state.messages.last().expect("a tool message");
    let stripped = last.blocks.iter().all(|b| match &b.kind {
        BlockKind::ToolResult { output, .. } => output.state.is_empty(),
        _ => true,
    });
    assert!(stripped, "{last:?}");
}
