//! Tests of a run's start, transitions and closing events.

use super::*;

// ---------------------------------------------------------------------------------------
// Start
// ---------------------------------------------------------------------------------------

#[test]
fn start_takes_identity_from_the_envelope_and_begins_ready_for_model() {
    let mut journal = Journal::new();
    let first = journal.push(run_started("normal", Some("parent-run"), 2));

    let state = RunState::start(&first).unwrap();

    assert_eq!(state.run_id, RUN);
    assert_eq!(state.session_id, SESSION);
    assert_eq!(state.tenant_id, "default");
    assert_eq!(state.root_run_id, RUN);
    assert_eq!(state.run_span_id, first.span_id);
    assert_eq!(state.parent_run_id.as_deref(), Some("parent-run"));
    assert_eq!(state.depth, 2);
    assert_eq!(state.agent.as_deref(), Some("demo"));
    assert_eq!(state.kind, "normal");
    assert_eq!(state.status, RunStatus::ReadyForModel);
    assert!(!state.finished);
    assert!(state.messages.is_empty() && state.pending_calls.is_empty());
    assert_eq!((state.iterations, state.model_calls, state.step), (0, 0, 0));
    assert_eq!(state.last_seq, 1);
    assert_eq!((state.started_at, state.updated_at), (first.ts, first.ts));
}

#[test]
fn first_event_must_be_run_started() {
    let mut journal = Journal::new();
    let first = journal.push(user("hello"));

    let error = RunState::start(&first).unwrap_err();
    assert_eq!(error.event_id, first.event_id);
    assert_eq!(error.seq, 1);
    assert_eq!(error.event_type, "message.user");
    assert!(error.reason.contains("must be run.started"), "{error}");

    match RunState::fold(RUN, &journal.events) {
        Err(FoldError::Projection(e)) => assert_eq!(e, error),
        other => panic!("expected a projection error, got {other:?}"),
    }
}

#[test]
fn duplicate_run_started_is_refused() {
    let mut journal = Journal::new();
    journal.begin("hello");

    let (event, error) = journal.refused(started());

    assert_eq!(error.event_id, event.event_id);
    assert_eq!(error.reason, "duplicate run.started");
}

#[test]
fn a_closing_event_needs_a_terminal_transition_first() {
    let mut journal = Journal::new();
    journal.begin("hello");

    let (event, error) = journal.refused(run_completed(None));

    assert_eq!(error.event_id, event.event_id);
    assert!(
        error
            .reason
            .contains("a terminal transition must come first"),
        "{error}"
    );
}

#[test]
fn a_refused_event_leaves_the_state_unchanged() {
    let mut journal = Journal::new();
    journal.begin("hello");
    let before = journal.state();

    let mut state = journal.state();
    let event = journal.push(started());
    assert!(state.apply(&event).is_err());

    assert_eq!(state, before);
}

#[test]
fn fold_of_an_unknown_run_is_an_error() {
    let mut journal = Journal::new();
    journal.begin("hello");

    assert_eq!(
        RunState::fold("nobody", &journal.events),
        Err(FoldError::Unknown("nobody".into()))
    );
}

#[test]
fn fold_skips_the_events_of_other_runs() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.switch_to("child-run");
    journal.push(run_started("normal", Some(RUN), 1));
    journal.push(user("sub-question"));
    journal.switch_to(RUN);
    journal.push(user("follow-up"));

    let state = journal.state();

    assert_eq!(state.messages.len(), 2);
    assert_eq!(state.messages[1].text(), "follow-up");
    assert_eq!(state.last_seq, 6);
}

#[test]
fn apply_refuses_an_event_of_another_run() {
    let mut journal = Journal::new();
    journal.begin("hello");
    let mut state = journal.state();
    journal.switch_to("other-run");
    let intruder = journal.push(user("intruder"));

    let error = state.apply(&intruder).unwrap_err();

    assert_eq!(error.run_id, "other-run");
    assert_eq!(error.event_id, intruder.event_id);
    assert_eq!(error.reason, "event of another run");
}

// ---------------------------------------------------------------------------------------
// Transitions and closing events
// ---------------------------------------------------------------------------------------

#[test]
fn tool_turn_then_answer_completes_the_run() {
    let mut journal = Journal::new();
    journal.begin("12 × 7 + 3 ?");

    journal.model_turn(
        RunStatus::ReadyForModel,
        asks("Je calcule.", &["c1"]),
        RunStatus::AwaitingTools,
    );
    assert_eq!(journal.state().status, RunStatus::AwaitingTools);

    journal.tool_batch(&["c1"], RunStatus::ReadyForModel);
    assert_eq!(journal.state().status, RunStatus::ReadyForModel);

    journal.model_turn(
        RunStatus::ReadyForModel,
        Message::assistant("87"),
        RunStatus::Completed,
    );
    let state = journal.state();
    assert_eq!(state.status, RunStatus::Completed);
    assert!(!state.finished, "finished waits for the closing event");
    assert_eq!(state.output, None);

    journal.push(run_completed(Some(Message::assistant("87"))));
    let state = journal.state();
    assert_eq!(state.status, RunStatus::Completed);
    assert!(state.finished);
    assert_eq!(state.output_text().as_deref(), Some("87"));
    assert_eq!(state.iterations, 2);
    assert!(state.pending_calls.is_empty());
}

#[test]
fn run_completed_records_structured_output() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.model_turn(
        RunStatus::ReadyForModel,
        Message::assistant("{\"n\":87}"),
        RunStatus::Completed,
    );
    journal.push(run_completed_with_data(
        Some(Message::assistant("{\"n\":87}")),
        Some(json!({ "n": 87 })),
    ));

    assert_eq!(journal.state().output_data, Some(json!({ "n": 87 })));
}

#[test]
fn finalizing_path_completes_from_finalizing() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.model_turn(
        RunStatus::ReadyForModel,
        asks("tool", &["c1"]),
        RunStatus::AwaitingTools,
    );
    journal.tool_batch(&["c1"], RunStatus::Finalizing);
    assert_eq!(journal.state().status, RunStatus::Finalizing);

    journal.model_turn(
        RunStatus::Finalizing,
        Message::assistant("last answer"),
        RunStatus::Completed,
    );
    journal.push(run_completed(Some(Message::assistant("last answer"))));

    let state = journal.state();
    assert_eq!(state.status, RunStatus::Completed);
    assert!(state.finished);
    assert_eq!(state.iterations, 2);
    assert_eq!(state.output_text().as_deref(), Some("last answer"));
}

#[test]
fn failed_transition_then_run_failed_records_the_error() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(transition(RunStatus::ReadyForModel, RunStatus::Failed));
    assert!(!journal.state().finished);

    journal.push(run_failed("model.auth", "invalid API key"));

    let state = journal.state();
    assert_eq!(state.status, RunStatus::Failed);
    assert!(state.finished);
    assert_eq!(state.error_type.as_deref(), Some("model.auth"));
    assert_eq!(state.error.as_deref(), Some("invalid API key"));
    assert_eq!(state.output, None);
}

#[test]
fn cancelled_transition_then_run_cancelled_finishes_the_run() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.model_turn(
        RunStatus::ReadyForModel,
        asks("tool", &["c1"]),
        RunStatus::AwaitingTools,
    );
    journal.push(transition(RunStatus::AwaitingTools, RunStatus::Cancelled));
    journal.push(run_cancelled());

    let state = journal.state();
    assert_eq!(state.status, RunStatus::Cancelled);
    assert!(state.finished);
    assert_eq!((state.error_type, state.error), (None, None));
    assert_eq!(pending_ids(&journal.state()), ["c1"]);
}

#[test]
fn paused_run_resumes_to_awaiting_tools_under_a_new_claim() {
    // §2.3 approval: awaiting_tools→paused, lease handed back, new worker, paused→awaiting_tools.
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.model_turn(
        RunStatus::ReadyForModel,
        asks("tool", &["c1"]),
        RunStatus::AwaitingTools,
    );
    journal.push(transition(RunStatus::AwaitingTools, RunStatus::Paused));
    journal.push(claimed("worker-1", 0));
    assert_eq!(journal.state().status, RunStatus::Paused);

    journal.push(claimed("worker-2", 120));
    journal.push(transition(RunStatus::Paused, RunStatus::AwaitingTools));

    let state = journal.state();
    assert_eq!(state.status, RunStatus::AwaitingTools);
    assert_eq!(state.claim.unwrap().worker_id, "worker-2");
    assert_eq!(pending_ids(&journal.state()), ["c1"]);
}

#[test]
fn waiting_child_returns_to_awaiting_tools() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.model_turn(
        RunStatus::ReadyForModel,
        asks("delegate", &["c1"]),
        RunStatus::AwaitingTools,
    );
    journal.push(transition(
        RunStatus::AwaitingTools,
        RunStatus::WaitingChild,
    ));
    assert_eq!(journal.state().status, RunStatus::WaitingChild);

    journal.push(transition(
        RunStatus::WaitingChild,
        RunStatus::AwaitingTools,
    ));
    assert_eq!(journal.state().status, RunStatus::AwaitingTools);
}

#[test]
fn transition_from_another_state_is_refused_with_the_event_named() {
    let mut journal = Journal::new();
    journal.begin("hello");

    let (event, error) = journal.refused(transition(
        RunStatus::AwaitingTools,
        RunStatus::ReadyForModel,
    ));

    assert_eq!(error.run_id, RUN);
    assert_eq!(error.event_id, event.event_id);
    assert_eq!(error.seq, event.seq);
    assert_eq!(error.event_type, "run.transitioned");
    assert!(
        error.reason.contains("awaiting_tools") && error.reason.contains("ready_for_model"),
        "{error}"
    );
    let text = error.to_string();
    assert!(text.contains(&event.event_id), "{text}");
    assert!(text.contains(&format!("seq {}", event.seq)), "{text}");
}

#[test]
fn mismatched_transition_in_a_journal_fails_the_fold() {
    let mut journal = Journal::new();
    journal.begin("hello");
    let bad = journal.push(transition(RunStatus::Finalizing, RunStatus::Completed));

    match RunState::fold(RUN, &journal.events) {
        Err(FoldError::Projection(e)) => {
            assert_eq!((e.event_id, e.seq), (bad.event_id, bad.seq));
        }
        other => panic!("expected a projection error, got {other:?}"),
    }
}

#[test]
fn events_after_the_closing_event_are_refused() {
    let mut journal = Journal::new();
    journal.plain_run("q", "c1", "a");

    let (event, error) = journal.refused(user("one more thing"));
    assert_eq!(error.event_id, event.event_id);
    assert!(error.reason.contains("after the run closed"), "{error}");

    let mut journal = Journal::new();
    journal.plain_run("q", "c1", "a");
    let (_, error) = journal.refused(run_completed(Some(Message::assistant("again"))));
    assert!(error.reason.contains("after the run closed"), "{error}");
}

#[test]
fn run_claimed_after_the_closing_event_is_recorded() {
    let mut journal = Journal::new();
    journal.plain_run("q", "c1", "a");
    let claim = journal.push(claimed("worker-9", 300));

    let state = journal.state();

    assert!(state.finished);
    assert_eq!(
        state.claim,
        Some(Claim {
            worker_id: "worker-9".into(),
            lease_until: ts(0) + TimeDelta::seconds(300),
        })
    );
    assert_eq!(state.last_seq, claim.seq);
    assert_eq!(state.updated_at, claim.ts);
}

#[test]
fn after_a_terminal_transition_only_the_matching_closing_event_is_accepted() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(transition(RunStatus::ReadyForModel, RunStatus::Completed));

    let (_, error) = journal.refused(run_failed("timeout", "too late"));
    assert!(
        error.reason.contains("after the state completed"),
        "{error}"
    );

    journal.events.pop();
    let (_, error) = journal.refused(run_cancelled());
    assert!(
        error.reason.contains("after the state completed"),
        "{error}"
    );

    journal.events.pop();
    let (_, error) = journal.refused(step_started(1, RunStatus::Completed, Effect::ModelCall));
    assert!(
        error.reason.contains("after the state completed"),
        "{error}"
    );

    journal.events.pop();
    journal.push(run_completed(None));
    assert!(journal.state().finished);
}

#[test]
fn run_failed_state_accepts_only_run_failed() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(transition(RunStatus::ReadyForModel, RunStatus::Failed));

    let (_, error) = journal.refused(run_completed(None));
    assert!(error.reason.contains("after the state failed"), "{error}");

    journal.events.pop();
    journal.push(run_failed("timeout", "too late"));
    assert!(journal.state().finished);
}

#[test]
fn run_claimed_between_terminal_transition_and_closing_event_is_accepted() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(transition(RunStatus::ReadyForModel, RunStatus::Cancelled));
    journal.push(claimed("worker-2", 30));
    journal.push(run_cancelled());

    let state = journal.state();
    assert!(state.finished);
    assert_eq!(state.claim.unwrap().worker_id, "worker-2");
}

#[test]
fn transition_out_of_a_terminal_state_is_refused() {
    let mut journal = Journal::new();
    journal.begin("hello");
    journal.push(transition(RunStatus::ReadyForModel, RunStatus::Failed));

    let (_, error) = journal.refused(transition(RunStatus::Failed, RunStatus::ReadyForModel));

    assert!(error.reason.contains("after the state failed"), "{error}");
}
