//! The decisions of the loop: what the state calls for, computed from the state alone (and
//! the clock, for expiries) and written outside any step, in the run's root span (convention 6:
//! `decide(state) -> events`, then the events are appended and applied).
//!
//! A repair a policy or a guard asked for; the way out of a pause (expired requests, every
//! request settled) and of a wait for children; a pause when a call waits for a human; the
//! next state once every call of a turn has its result; the closing event of a terminal state
//! whose closing event is missing; a stop before the next effect (cancellation, timeout).

use loom_core::{
    Event, Message, Role, RunState, RunStatus,
    approval::{ApprovalRecord, OnExpiry},
    event::{ApprovalExpired, MessageUser, Payload, RunCompleted, RunFailed},
    state::REPAIR,
    tool::ToolOutput,
};

use crate::{events::completed_payload, hooks, io::Io, units::fmt_secs};

/// What the decisions read of the agent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// Orchestrator model calls before the run is made to finish.
    pub(crate) max_iterations: u32,
    /// What an expired approval request does.
    pub(crate) on_expiry: OnExpiry,
}

/// The repair a policy or a guard asked for: the refused answer's open calls are closed
/// without running, then the diagnostic goes to the model as a user message (and back to the
/// model, or to finalizing once the iterations are spent, when the answer had calls).
pub(crate) fn repair(io: &Io<'_>, rules: &Rules, state: &RunState) -> Option<Vec<Event>> {
    let repair = state.pending_repair.as_ref()?;
    let span = state.run_span_id.clone();
    let mut batch: Vec<Event> = state
        .pending_calls
        .iter()
        .map(|call| {
            let call_span = io.events().uuid();
            io.event(
                &call_span,
                Some(&span),
                None,
                completed_payload(
                    call,
                    ToolOutput::error(hooks::not_run_refused(&repair.policy)),
                    0.0,
                ),
            )
        })
        .collect();
    batch.push(io.event(
        &span,
        None,
        None,
        Payload::MessageUser(MessageUser {
            message: Message::user(hooks::repair_text(&repair.policy, &repair.feedback)),
            kind: REPAIR.into(),
            policy: Some(repair.policy.clone()),
            tools: repair.tools,
        }),
    ));
    if state.status == RunStatus::AwaitingTools {
        let to = if state.iterations >= rules.max_iterations {
            RunStatus::Finalizing
        } else {
            RunStatus::ReadyForModel
        };
        batch.push(
            io.events()
                .transition(state, to, "policy.decided", io.last_ids.policy.clone()),
        );
    }
    Some(batch)
}

/// Whether the run is paused for a human, or waits for children that are, and nothing can
/// move it now.
pub(crate) fn waiting(
    io: &Io<'_>,
    rules: &Rules,
    state: &RunState,
    children_blocked: bool,
) -> bool {
    match state.status {
        RunStatus::Paused => !state.finished && resumed(io, rules, state).is_none(),
        RunStatus::WaitingChild => !state.finished && children_blocked,
        _ => false,
    }
}

/// The decision of a paused run: expire the requests past their deadline (failing the run
/// when `on_expiry` is `fail`); with every request settled, back to the tool batch;
/// otherwise nothing (the run keeps waiting).
fn resumed(io: &Io<'_>, rules: &Rules, state: &RunState) -> Option<Vec<Event>> {
    let now = io.events().now();
    let stale: Vec<&ApprovalRecord> = state.approvals.iter().filter(|a| a.is_stale(now)).collect();
    if !stale.is_empty() {
        let action = rules.on_expiry;
        let mut batch: Vec<Event> = stale
            .iter()
            .map(|a| {
                io.event(
                    &a.span_id,
                    a.parent_span_id.as_deref(),
                    None,
                    Payload::ApprovalExpired(ApprovalExpired {
                        call_id: a.call_id.clone(),
                        tool_name: a.tool_name.clone(),
                        action: action.as_str().to_owned(),
                        expire_at: a.expire_at,
                    }),
                )
            })
            .collect();
        if action == OnExpiry::Fail {
            let tools: Vec<&str> = stale.iter().map(|a| a.tool_name.as_str()).collect();
            batch.extend(io.events().failure(
                state,
                "approval.expired",
                "approval.expired",
                &format!("approval not obtained in time ({})", tools.join(", ")),
            ));
        }
        return Some(batch);
    }
    if state.approvals.iter().any(ApprovalRecord::is_pending) {
        return None;
    }
    Some(vec![io.events().transition(
        state,
        RunStatus::AwaitingTools,
        "model.responded",
        io.last_ids.model.clone(),
    )])
}

/// The decision the state calls for, written outside any step.
pub(crate) fn next(io: &Io<'_>, rules: &Rules, state: &RunState) -> Option<Vec<Event>> {
    let span = state.run_span_id.clone();
    let closing = |payload| vec![io.event(&span, None, None, payload)];
    match state.status {
        RunStatus::Paused => resumed(io, rules, state),
        // Back to the batch, which re-plays the calls of the waiting children: each child
        // run is resumed where it stopped.
        RunStatus::WaitingChild => Some(vec![io.events().transition(
            state,
            RunStatus::AwaitingTools,
            "model.responded",
            io.last_ids.model.clone(),
        )]),
        RunStatus::AwaitingTools if state.approvals.iter().any(ApprovalRecord::is_pending) => {
            Some(vec![io.events().transition(
                state,
                RunStatus::Paused,
                "model.responded",
                io.last_ids.model.clone(),
            )])
        }
        RunStatus::Completed => Some(closing(completed(state))),
        RunStatus::Failed => Some(closing(Payload::RunFailed(RunFailed {
            error_type: state
                .error_type
                .clone()
                .unwrap_or_else(|| "Interrupted".into()),
            error: "run interrupted after it failed".into(),
            iterations: state.iterations,
            usage: state.usage,
            cost_usd: state.cost_usd,
        }))),
        RunStatus::Cancelled => {
            let (reason, by) = io.cancel_cause(state);
            Some(vec![io.events().cancelled(state, reason, by)])
        }
        RunStatus::AwaitingTools if state.pending_calls.is_empty() => {
            let to = if state.iterations >= rules.max_iterations {
                RunStatus::Finalizing
            } else {
                RunStatus::ReadyForModel
            };
            Some(vec![io.events().transition(
                state,
                to,
                "tool.completed",
                io.last_ids.tool.clone(),
            )])
        }
        _ => None,
    }
}

fn completed(state: &RunState) -> Payload {
    let output = state
        .messages
        .iter()
        .rev()
        .find(|m| m.role == loom_core::Role::Assistant)
        .cloned();
    Payload::RunCompleted(RunCompleted {
        output,
        output_event_id: None,
        iterations: state.iterations,
        usage: state.usage,
        cost_usd: state.cost_usd,
        data: None,
        unverified: false,
        fallback: false,
    })
}

/// The decision that stops the run before its next effect, if any: a cancellation, the
/// run's timeout already spent, or a request lost while opening (a crash kept `run.started`
/// but not its message: nothing to answer).
pub(crate) fn stopping(io: &Io<'_>, state: &RunState) -> Option<Vec<Event>> {
    if io.cancel().is_cancelled() {
        return Some(io.cancellation(state));
    }
    if let Some(limit) = io.timeout() {
        let spent = io.piloted(state);
        if spent >= limit {
            let message = format!(
                "maximum time of {} s exceeded: {:.1} s of piloting already spent before the next step",
                fmt_secs(limit),
                spent.as_secs_f64()
            );
            return Some(io.events().failure(state, "timeout", "timeout", &message));
        }
    }
    if !state.messages.iter().any(|m| m.role == Role::User) {
        return Some(io.events().failure(
            state,
            "message.user",
            "Interrupted",
            "the run's request was not recorded (the run was interrupted while opening)",
        ));
    }
    None
}
