//! Why the engine could not proceed.

use loom_core::{
    ports::StoreError,
    state::{FoldError, ProjectionError},
};

/// Why the engine could not proceed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The journal failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The journal cannot be folded.
    #[error(transparent)]
    Fold(#[from] FoldError),
    /// The journal breaks the state machine.
    #[error(transparent)]
    Projection(#[from] ProjectionError),
    /// A chosen run id already names a run of the tenant (run ids are unique per tenant,
    /// whatever the session).
    #[error("run {run_id} already exists in session {session_id}")]
    RunExists {
        /// Run.
        run_id: String,
        /// The session that holds it.
        session_id: String,
    },
    /// A decision names no waiting approval request: nothing waits for a decision in the run,
    /// or not for the call named. Nothing was written.
    #[error("{0}")]
    UnknownApproval(String),
    /// Another worker drives the run.
    #[error("run {run_id}: driven by {worker_id}, lease valid until {lease_until}")]
    ClaimConflict {
        /// Run.
        run_id: String,
        /// The other worker.
        worker_id: String,
        /// End of its lease.
        lease_until: String,
    },
    /// The run was closed by someone else (a cancel from another process) while driven.
    #[error("run {0} was closed elsewhere")]
    RunMoved(String),
    /// Invalid input (ids, messages, tool schemas).
    #[error("{0}")]
    Invalid(String),
    /// The request itself is unusable as given (unusable ids, an ill-formed message, refused
    /// attachments, corrected arguments that do not fit): refused before anything is written,
    /// and sending it again unchanged cannot succeed.
    #[error("{0}")]
    Unusable(String),
    /// The caller's session state was refused (an undeclared key, a value off its schema or
    /// too large, a required key without value). Nothing was written.
    #[error("state refused: {0}")]
    StateRefused(String),
    /// A run was asked in a session another agent opened: a session is continued by the agent
    /// that opened it (its sub-agents run in it as child runs). Nothing was written.
    #[error(
        "session {session_id} belongs to the agent '{owner}': the agent '{agent}' cannot add a \
         run to it (a session is continued by the agent that opened it)"
    )]
    SessionOfAnotherAgent {
        /// The session.
        session_id: String,
        /// The agent that opened it.
        owner: String,
        /// The agent asked for.
        agent: String,
    },
    /// The journal kept moving under the writer.
    #[error("session {0}: too many write conflicts, giving up")]
    Contention(String),
    /// A step produced no event (a bug: the engine never spins).
    #[error("run {0}: a step made no progress")]
    NoProgress(String),
}
