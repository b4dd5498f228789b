//! Who may add a run to a session: a session belongs to the agent that opened it. Its root
//! runs are that agent's (its sub-agents run there as child runs, opened by the engine), so a
//! caller allowed on another agent cannot name the session and have that agent's model read
//! its history.

use std::borrow::Borrow;

use loom_core::{Event, Payload};

use crate::error::EngineError;

/// Refuses a new root run of `agent` in a session whose journal (`events`: all of it, or what
/// follows a snapshot, which its owner wrote) was opened by another agent
/// ([`EngineError::SessionOfAnotherAgent`], before anything is written). A new session (no
/// event) belongs to whoever opens it. Compaction runs, the engine's own, own nothing.
pub(crate) fn check<E: Borrow<Event>>(
    events: &[E],
    session_id: &str,
    agent: &str,
) -> Result<(), EngineError> {
    match owner(events) {
        Some(owner) if owner != agent => Err(EngineError::SessionOfAnotherAgent {
            session_id: session_id.to_owned(),
            owner: owner.to_owned(),
            agent: agent.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// The agent that owns the session of `events` (all of it, or what follows a snapshot): the
/// agent of its first root run, or of the snapshot the events start from.
pub(crate) fn owner<E: Borrow<Event>>(events: &[E]) -> Option<&str> {
    events
        .iter()
        .map(Borrow::borrow)
        .find_map(|event: &Event| match &event.payload {
            Payload::RunStarted(started)
                if started.parent_run_id.is_none() && started.kind == "normal" =>
            {
                event.agent.as_deref()
            }
            Payload::SessionSnapshot(_) => event.agent.as_deref(),
            _ => None,
        })
}
