//! Tests of messages, model answers and tools.

use super::*;

// ---------------------------------------------------------------------------------------
// Messages, model answers and tools
// ---------------------------------------------------------------------------------------

#[test]
fn user_messages_are_appended_in_journal_order() {
    let mut journal = Journal::new();
    journal.begin("first");
    journal.push(user("second"));

    let state = journal.state();
    assert_eq!(roles(&state.messages), [Role::User, Role::User]);
    assert_eq!(state.messages[0].text(), "first");
    assert_eq!(state.messages[1].text(), "second");
}

#[test]
fn orchestrator_answer_appends_a_message_and_counts_an_iteration() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(responded(Message::assistant("hi")));

    let state = journal.state();
    assert_eq!(roles(&state.messages), [Role::User, Role::Assistant]);
    assert_eq!((state.iterations, state.model_calls), (1, 1));
    assert!(state.pending_calls.is_empty());
}

#[test]
fn model_responded_sets_pending_calls_in_call_order() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(responded(asks("three tools", &["b", "a", "c"])));

    let state = journal.state();

    assert_eq!(pending_ids(&state), ["b", "a", "c"]);
    for call in &state.pending_calls {
        assert_eq!(call.name, "calculer");
        assert_eq!(call.arguments, args(&call.call_id));
        assert!(!call.started);
    }
}

#[test]
fn role_answer_adds_cost_and_model_calls_only() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(responded_with(
        asks("ask the role", &["r1"]),
        usage(100, 10),
        0.5,
    ));
    journal.push(called("r1"));
    let before = journal.state();

    journal.push(role_responded("r1", usage(20, 5), 0.25));
    let after = journal.state();

    assert_eq!(after.messages, before.messages);
    assert_eq!(after.iterations, before.iterations);
    assert_eq!(after.pending_calls, before.pending_calls);
    assert_eq!(after.model_calls, before.model_calls + 1);
    assert_eq!(after.cost_usd, 0.75);
    assert_eq!(after.usage, usage(120, 15));
}

#[test]
fn judge_answer_adds_cost_and_model_calls_only() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(responded_with(
        Message::assistant("answer"),
        usage(100, 10),
        0.5,
    ));
    let before = journal.state();

    journal.push(judge_responded("quality", usage(30, 3), 0.125));
    let after = journal.state();

    assert_eq!(after.messages, before.messages);
    assert_eq!(after.iterations, 1);
    assert_eq!(after.model_calls, 2);
    assert_eq!(after.cost_usd, 0.625);
    assert_eq!(after.usage, usage(130, 13));
}

#[test]
fn tool_called_marks_only_its_call_started() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(responded(asks("two tools", &["c1", "c2"])));
    journal.push(called("c2"));

    let state = journal.state();
    let started: Vec<(&str, bool)> = state
        .pending_calls
        .iter()
        .map(|c| (c.call_id.as_str(), c.started))
        .collect();
    assert_eq!(started, [("c1", false), ("c2", true)]);
}

#[test]
fn tool_called_for_an_unknown_call_is_refused() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(responded(asks("one tool", &["c1"])));

    let (event, error) = journal.refused(called("ghost"));

    assert_eq!(error.event_id, event.event_id);
    assert!(error.reason.contains("'ghost'"), "{error}");
}

#[test]
fn tool_completed_for_an_unknown_call_is_refused() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(responded(asks("one tool", &["c1"])));

    let (event, error) = journal.refused(tool_completed("ghost", "?"));

    assert_eq!(error.event_id, event.event_id);
    assert_eq!(error.event_type, "tool.completed");
    assert!(
        error
            .reason
            .contains("tool.completed for unknown call 'ghost'"),
        "{error}"
    );
}

#[test]
fn tool_completed_twice_for_the_same_call_is_refused() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(responded(asks("one tool", &["c1"])));
    journal.push(tool_completed("c1", "87"));

    let (_, error) = journal.refused(tool_completed("c1", "87 again"));

    assert!(error.reason.contains("unknown call 'c1'"), "{error}");
}

#[test]
fn tool_completed_without_tool_called_is_accepted() {
    // A refused call (rejected approval, invalid arguments) writes only tool.completed.
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(responded(asks("one tool", &["c1"])));
    journal.push(tool_completed_with(
        "c1",
        ToolOutput::error("rejected"),
        None,
        0.0,
    ));

    let state = journal.state();
    assert!(state.pending_calls.is_empty());
    assert!(
        results(state.messages.last().unwrap())[0]
            .1
            .contains("rejected")
    );
}

#[test]
fn tool_completed_removes_the_call_and_appends_a_tool_message() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(responded(asks("two tools", &["c1", "c2"])));
    journal.push(called("c1"));
    journal.push(tool_completed("c1", "87"));

    let state = journal.state();

    assert_eq!(pending_ids(&state), ["c2"]);
    let last = state.messages.last().unwrap();
    assert_eq!(last.role, Role::Tool);
    assert_eq!(last.blocks.len(), 1);
    match &last.blocks[0].kind {
        BlockKind::ToolResult { call_id, output } => {
            assert_eq!(call_id, "c1");
            assert_eq!(output, &ToolOutput::text("87"));
        }
        other => panic!("expected a tool result, got {other:?}"),
    }
}

#[test]
fn tool_completed_adds_its_usage_and_cost() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(responded_with(
        asks("delegate", &["c1"]),
        usage(100, 10),
        0.5,
    ));
    journal.push(called("c1"));
    journal.push(tool_completed_with(
        "c1",
        ToolOutput::text("sub-agent answer"),
        Some(usage(40, 4)),
        0.25,
    ));

    let state = journal.state();
    assert_eq!(state.usage, usage(140, 14));
    assert_eq!(state.cost_usd, 0.75);
    assert_eq!(state.model_calls, 1, "a tool result is not a model call");
}

#[test]
fn step_started_sets_the_step_and_step_completed_accumulates_active_time() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(step_started(1, RunStatus::ReadyForModel, Effect::ModelCall));
    journal.push(step_completed(1, 12.5));
    journal.push(step_started(2, RunStatus::ReadyForModel, Effect::ModelCall));
    journal.push(step_completed(2, 30.25));

    let state = journal.state();
    assert_eq!(state.step, 2);
    assert_eq!(state.active_ms, 42.75);
}

#[test]
fn usage_and_cost_accumulate_across_calls() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(responded_with(asks("tool", &["c1"]), usage(100, 10), 0.5));
    journal.push(tool_completed_with(
        "c1",
        ToolOutput::text("ok"),
        Some(usage(7, 3)),
        0.125,
    ));
    journal.push(judge_responded("quality", usage(20, 2), 0.0625));
    journal.push(responded_with(
        Message::assistant("done"),
        Usage {
            cache_read_tokens: 50,
            reasoning_tokens: 5,
            ..usage(200, 20)
        },
        0.25,
    ));

    let state = journal.state();
    assert_eq!(
        state.usage,
        Usage {
            input_tokens: 327,
            output_tokens: 35,
            cache_read_tokens: 50,
            cache_write_tokens: 0,
            reasoning_tokens: 5,
        }
    );
    assert_eq!(state.cost_usd, 0.9375);
    assert_eq!((state.model_calls, state.iterations), (3, 2));
}

#[test]
fn last_seq_and_updated_at_follow_the_last_event() {
    let mut journal = Journal::new();
    journal.begin("hello");
    let last = journal.push(user("again"));

    let state = journal.state();
    assert_eq!(state.last_seq, last.seq);
    assert_eq!(state.updated_at, last.ts);
    assert_eq!(state.started_at, journal.events[0].ts);
}
