//! Tests of the conversation, the session history and the reference journals.

use super::*;

// ---------------------------------------------------------------------------------------
// Conversation
// ---------------------------------------------------------------------------------------

#[test]
fn conversation_groups_a_turns_results_in_call_order() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(responded(asks("three tools", &["c1", "c2", "c3"])));
    for call_id in ["c3", "c1", "c2"] {
        journal.push(called(call_id));
    }
    journal.push(tool_completed("c3", "three"));
    journal.push(tool_completed("c2", "two"));
    journal.push(tool_completed("c1", "one"));

    let state = journal.state();
    // The journal order is kept in `messages`...
    assert_eq!(
        roles(&state.messages),
        [
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Tool,
            Role::Tool
        ]
    );
    // ...the conversation has one tool message in the model's order.
    let conversation = state.conversation();
    assert_eq!(
        roles(&conversation),
        [Role::User, Role::Assistant, Role::Tool]
    );
    assert_eq!(
        results(&conversation[2]),
        [
            ("c1".to_owned(), "one".to_owned()),
            ("c2".to_owned(), "two".to_owned()),
            ("c3".to_owned(), "three".to_owned()),
        ]
    );
}

#[test]
fn conversation_keeps_each_turns_results_apart() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.model_turn(
        RunStatus::ReadyForModel,
        asks("first", &["a2", "a1"]),
        RunStatus::AwaitingTools,
    );
    journal.tool_batch(&["a1", "a2"], RunStatus::ReadyForModel);
    journal.model_turn(
        RunStatus::ReadyForModel,
        asks("second", &["b1"]),
        RunStatus::AwaitingTools,
    );
    journal.tool_batch(&["b1"], RunStatus::ReadyForModel);

    let conversation = journal.state().conversation();

    assert_eq!(
        roles(&conversation),
        [
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Assistant,
            Role::Tool
        ]
    );
    assert_eq!(result_ids(&conversation[2]), ["a2", "a1"]);
    assert_eq!(result_ids(&conversation[4]), ["b1"]);
}

// ---------------------------------------------------------------------------------------
// Session history
// ---------------------------------------------------------------------------------------

#[test]
fn session_history_concatenates_the_runs_of_the_session() {
    let mut journal = Journal::new();
    journal.plain_run("first question", "c1", "first answer");
    journal.switch_to("run-2");
    journal.plain_run("second question", "c2", "second answer");

    let history = session_history(&journal.events).unwrap();

    assert_eq!(
        roles(&history),
        [
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Assistant,
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Assistant
        ]
    );
    assert_eq!(history[0].text(), "first question");
    assert_eq!(history[4].text(), "second question");
    assert_eq!(call_ids(&history[5]), ["c2"]);
    assert_eq!(result_ids(&history[6]), ["c2"]);
}

#[test]
fn session_history_drops_a_call_without_result_from_a_run_failed_mid_batch() {
    let mut journal = Journal::new();
    journal.plain_run("first question", "a1", "first answer");
    journal.switch_to("run-2");
    journal.begin("second question");
    journal.model_turn(
        RunStatus::ReadyForModel,
        asks("two tools", &["b1", "b2"]),
        RunStatus::AwaitingTools,
    );
    journal.step_started(RunStatus::AwaitingTools, Effect::ToolBatch);
    journal.push(called("b1"));
    journal.push(called("b2"));
    journal.push(tool_completed("b1", "one"));
    journal.push(transition(RunStatus::AwaitingTools, RunStatus::Failed));
    journal.push(run_failed("timeout", "b2 never answered"));

    let history = session_history(&journal.events).unwrap();

    assert_eq!(history.len(), 7);
    assert_eq!(history[..4], journal.state_of(RUN).conversation()[..]);
    assert_eq!(history[4].text(), "second question");
    assert_eq!(
        history[5].text(),
        "two tools",
        "the text of the answer stays"
    );
    assert_eq!(call_ids(&history[5]), ["b1"], "b2 has no result");
    assert_eq!(result_ids(&history[6]), ["b1"]);
}

#[test]
fn session_history_pairs_calls_within_each_run_even_when_ids_repeat() {
    // Call ids are only unique within a run (the fake provider restarts at fake_0_0 in
    // each run, as in session-two-runs.jsonl): run 1's result must not keep run 2's
    // unanswered call of the same id.
    let mut journal = Journal::new();
    journal.plain_run("first question", "fake_0_0", "first answer");
    journal.switch_to("run-2");
    journal.begin("second question");
    journal.model_turn(
        RunStatus::ReadyForModel,
        asks("Je calcule.", &["fake_0_0"]),
        RunStatus::AwaitingTools,
    );
    journal.push(transition(RunStatus::AwaitingTools, RunStatus::Failed));
    journal.push(run_failed("timeout", "the tool never answered"));

    let history = session_history(&journal.events).unwrap();

    assert_eq!(history.len(), 6);
    assert_eq!(history[5].role, Role::Assistant);
    assert!(
        call_ids(&history[5]).is_empty(),
        "run 2's call has no result in run 2: {:?}",
        history[5]
    );
}

#[test]
fn session_history_skips_child_and_compaction_runs() {
    let mut journal = Journal::new();
    journal.plain_run("root question", "c1", "root answer");
    journal.switch_to("child-run");
    journal.push(run_started("normal", Some(RUN), 1));
    journal.push(user("child question"));
    journal.switch_to("compaction-run");
    journal.push(run_started("compaction", None, 0));
    journal.push(user("summarize"));

    let history = session_history(&journal.events).unwrap();

    assert_eq!(history.len(), 4);
    assert!(
        history
            .iter()
            .all(|m| !m.text().contains("child") && m.text() != "summarize")
    );
}

#[test]
fn session_history_of_an_empty_journal_is_empty() {
    assert_eq!(session_history::<Event>(&[]), Ok(Vec::new()));
}

#[test]
fn session_history_reports_a_broken_run() {
    let mut journal = Journal::new();
    journal.begin("hello");
    let bad = journal.push(tool_completed("ghost", "?"));

    match session_history(&journal.events) {
        Err(FoldError::Projection(e)) => assert_eq!(e.event_id, bad.event_id),
        other => panic!("expected a projection error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Reference journals
// ---------------------------------------------------------------------------------------

#[test]
fn reference_plain_run_folds_to_its_recorded_outcome() {
    let Some(events) = read_journal(PLAIN_RUN) else {
        return;
    };
    assert_eq!(events.len(), 17);

    let state = RunState::fold("plain-run-1", &events).unwrap();

    assert_eq!(state.status, RunStatus::Completed);
    assert!(state.finished);
    assert_eq!(state.iterations, 2);
    assert_eq!(state.model_calls, 2);
    assert_eq!(
        (state.usage.input_tokens, state.usage.output_tokens),
        (496, 93)
    );
    assert_eq!(
        state.output_text().as_deref(),
        Some("12 fois 7, plus 3, font 87.")
    );
    assert!(state.pending_calls.is_empty());
    assert_eq!(state.last_seq, 17);
    assert!(state.claim.is_some());
    assert_eq!(
        roles(&state.conversation()),
        [Role::User, Role::Assistant, Role::Tool, Role::Assistant]
    );
}

#[test]
fn reference_plain_run_totals_match_its_run_completed() {
    let Some(events) = read_journal(PLAIN_RUN) else {
        return;
    };
    let state = RunState::fold("plain-run-1", &events).unwrap();
    let Some(Payload::RunCompleted(done)) = events.last().map(|e| &e.payload) else {
        panic!("the reference run ends with run.completed");
    };

    assert_eq!(state.usage, done.usage);
    assert_eq!(state.iterations, done.iterations);
    assert_eq!(state.cost_usd, done.cost_usd);
    assert_eq!(state.output, done.output);
}

#[test]
fn reference_terminal_role_answer_is_the_roles_result() {
    let Some(events) = read_journal(TERMINAL_ROLE) else {
        return;
    };
    let state = RunState::fold("j3-run", &events).unwrap();
    let Some(Payload::RunCompleted(done)) = events.last().map(|e| &e.payload) else {
        panic!("the reference run ends with run.completed");
    };
    assert!(done.output.is_none());
    assert!(done.output_event_id.is_some());
    assert_eq!(state.status, RunStatus::Completed);
    // The journal's answer is null: the state exposes the terminal role's result.
    assert_eq!(
        state.output_text().as_deref(),
        Some(
            "Objet : votre devis D-2026-042\n\nBonjour Madame Martin, devis D-2026-042 de 1 840 €."
        )
    );
    // The role's model calls are counted once (run totals = every model.responded).
    assert_eq!(state.usage, done.usage);
    assert_eq!(state.iterations, done.iterations);
    assert_eq!(state.model_calls, 6);
    assert_eq!(state.priced_calls.len(), 2);
}

#[test]
fn a_role_call_is_priced_once() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(responded_with(asks("a role", &["c1"]), usage(100, 10), 0.5));
    journal.push(called("c1"));
    journal.push(role_responded("c1", usage(20, 5), 0.25));
    // The role's tool.completed restates its model's consumption.
    journal.push(tool_completed_with(
        "c1",
        ToolOutput::text("role answer"),
        Some(usage(20, 5)),
        0.25,
    ));
    let state = journal.state();
    assert_eq!(state.usage, usage(120, 15));
    assert_eq!(state.cost_usd, 0.75);
    assert_eq!(state.iterations, 1);
    assert_eq!(state.model_calls, 2);
}

#[test]
fn reference_session_folds_each_run() {
    let Some(events) = read_journal(SESSION_TWO_RUNS) else {
        return;
    };

    for run_id in ["sess-a-run1", "sess-a-run2"] {
        let state = RunState::fold(run_id, &events).unwrap();
        let Some(Payload::RunCompleted(done)) = events
            .iter()
            .rev()
            .find(|e| e.run_id == run_id)
            .map(|e| &e.payload)
        else {
            panic!("{run_id} ends with run.completed");
        };
        assert_eq!(state.status, RunStatus::Completed, "{run_id}");
        assert!(state.finished, "{run_id}");
        assert_eq!(state.iterations, 2, "{run_id}");
        assert_eq!(state.usage, done.usage, "{run_id}");
        assert_eq!(
            state.output_text().as_deref(),
            Some("12 fois 7, plus 3, font 87."),
            "{run_id}"
        );
    }
}

#[test]
fn reference_session_history_puts_the_first_run_before_the_second() {
    let Some(events) = read_journal(SESSION_TWO_RUNS) else {
        return;
    };
    let second_start = events
        .iter()
        .position(|e| e.run_id == "sess-a-run2")
        .unwrap();
    let first = RunState::fold("sess-a-run1", &events).unwrap();

    // What the second run is given when it starts: the first run's 4 messages.
    let before_second = session_history(&events[..second_start]).unwrap();
    assert_eq!(before_second.len(), 4);
    assert_eq!(before_second, first.conversation());
    assert_eq!(before_second[0].text(), "Combien font 12 × 7 + 3 ?");

    // The whole session: the first run's messages, then the second run's.
    let whole = session_history(&events).unwrap();
    assert_eq!(whole.len(), 8);
    assert_eq!(whole[..4], before_second[..]);
    assert_eq!(whole[4].text(), "Et encore ?");
    assert_eq!(call_ids(&whole[5]), ["fake_0_0"]);
    assert_eq!(result_ids(&whole[6]), ["fake_0_0"]);
}

#[test]
fn session_history_replaces_compacted_runs_by_their_summary() {
    let mut journal = Journal::new();
    journal.plain_run("first question", "c1", "first answer");
    journal.switch_to("run-2");
    journal.plain_run("second question", "c2", "second answer");
    let up_to_seq = journal.events.last().unwrap().seq;
    journal.switch_to("run-3");
    journal.plain_run("third question", "c3", "third answer");
    // The compaction run is not a turn of the history, and its summary replaces runs 1-2.
    journal.switch_to("compact-1");
    journal.push(run_started("compaction", None, 0));
    journal.push(user("Summarize"));
    journal.push(Payload::SessionCompacted(crate::event::SessionCompacted {
        up_to_seq,
        summary: "Two questions answered: DEV-2041 for 1 842,50 €.".into(),
        kept: 1,
        tokens_before: 400,
        tokens_after: 120,
        cost_usd: 0.0,
        fidelity: "ok".into(),
        run_id: Some("compact-1".into()),
        missing: Vec::new(),
    }));

    let history = session_history(&journal.events).unwrap();

    assert_eq!(
        roles(&history),
        [
            Role::User,
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Assistant
        ]
    );
    assert_eq!(
        history[0].text(),
        "[Summary of the earlier exchanges of this conversation.]\nTwo questions answered: \
         DEV-2041 for 1 842,50 €."
    );
    assert_eq!(history[1].text(), "third question");
    let groups = session_groups(&journal.events).unwrap();
    assert!(groups[0].summary);
    assert_eq!(groups[1].run_id, "run-3");
    assert!(groups[1].succeeded);
    // Before the compaction was written, the history is whole.
    let before = &journal.events[..journal.events.len() - 1];
    assert_eq!(session_history(before).unwrap().len(), 12);
}
