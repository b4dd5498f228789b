//! The tree of runs under a run (its sub-agents' child runs, theirs…), read from the session's
//! journal: which descendants are open, what they wait for, and how they close with their
//! ancestor.

use std::{borrow::Borrow, sync::Arc};

use chrono::{DateTime, Utc};
use loom_core::{
    Event, RunState, RunStatus,
    approval::{ApprovalRecord, PendingApproval},
    event::Payload,
    state::FoldError,
};

use crate::{
    error::EngineError,
    events::{Events, RunRef},
};

/// The descendants of `run_id` (children, their children…) that have not closed, folded from
/// the session's `events`, most recently started first: the order in which a closing parent
/// cancels them.
pub fn open_descendants<E: Borrow<Event>>(
    events: &[E],
    run_id: &str,
) -> Result<Vec<RunState>, FoldError> {
    let mut tree: Vec<&str> = vec![run_id];
    for event in events {
        let event = event.borrow();
        if let Payload::RunStarted(started) = &event.payload
            && let Some(parent) = &started.parent_run_id
            && tree.contains(&parent.as_str())
            && !tree.contains(&event.run_id.as_str())
        {
            tree.push(&event.run_id);
        }
    }
    let mut open = Vec::new();
    for id in tree.into_iter().skip(1).rev() {
        let state = RunState::fold(id, events)?;
        if !state.finished && !state.status.is_terminal() {
            open.push(state);
        }
    }
    Ok(open)
}

/// The approval requests waiting in the open descendants of `run_id`, in the order their runs
/// started: what a root run waiting for its children shows as its own pending approvals.
pub fn descendant_approvals<E: Borrow<Event>>(
    events: &[E],
    run_id: &str,
) -> Result<Vec<PendingApproval>, FoldError> {
    Ok(open_descendants(events, run_id)?
        .iter()
        .rev()
        .flat_map(RunState::pending_approvals)
        .collect())
}

/// Whether a run waiting for its children cannot move now: it has child runs, and each is
/// paused on a request that waits and has not expired, or is itself blocked on its children.
pub(crate) fn blocked(events: &[Arc<Event>], state: &RunState, now: DateTime<Utc>) -> bool {
    let children: Vec<&str> = state
        .pending_calls
        .iter()
        .filter_map(|c| c.child_run_id.as_deref())
        .collect();
    !children.is_empty()
        && children.iter().all(|id| match RunState::fold(id, events) {
            Ok(child) if !child.finished => match child.status {
                RunStatus::Paused => {
                    child.approvals.iter().any(ApprovalRecord::is_pending)
                        && !child.approvals.iter().any(|a| a.is_stale(now))
                }
                RunStatus::WaitingChild => blocked(events, &child, now),
                _ => false,
            },
            _ => false,
        })
}

/// The cancellation of every open descendant of `run_id` (most recent first, reason `parent`,
/// by `run_id`), read from the session's `journal`: what precedes the closing of `run_id` in
/// the same write. `events` gives the ids and the clock.
pub(crate) fn closing(
    events: &Events<'_>,
    journal: &[Arc<Event>],
    run_id: &str,
) -> Result<Vec<Event>, EngineError> {
    let mut batch = Vec::new();
    for child in open_descendants(journal, run_id)? {
        let run = RunRef {
            tenant_id: child.tenant_id.clone(),
            session_id: child.session_id.clone(),
            run_id: child.run_id.clone(),
        };
        let agent = child.agent.clone().unwrap_or_default();
        let child_events = events.of(&run, &agent, &child.root_run_id);
        batch.extend(child_events.cancellation(&child, "parent", Some(run_id.to_owned())));
    }
    Ok(batch)
}
