//! Errors of the facade, classified by kind.

use loom_config::ConfigError;
use loom_core::ports::StoreError;
use loom_engine::EngineError;

/// Why Loom refused or failed. A run that ran and failed is not an error: it is a
/// [`crate::RunResult`] with status `failed`.
#[derive(Debug, thiserror::Error)]
pub enum LoomError {
    /// The configuration (files, or what code registered against it) is wrong.
    #[error("{0}")]
    Config(Box<ConfigError>),
    /// No such agent.
    #[error("unknown agent '{name}' (agents: {known})")]
    UnknownAgent {
        /// The name asked for.
        name: String,
        /// The declared agents.
        known: String,
    },
    /// No such run.
    #[error("run {0} not found")]
    UnknownRun(String),
    /// No such session.
    #[error("session {0} not found")]
    UnknownSession(String),
    /// A tool registration was refused.
    #[error("tool registration refused: {0}")]
    Registration(String),
    /// The request was refused (ids, existing run, unusable message).
    #[error("request refused: {0}")]
    Refused(String),
    /// Another worker drives the run.
    #[error("{0} — this run is driven elsewhere: retry after the lease expires")]
    Conflict(String),
    /// A tenant reached one of its period ceilings: the run was not opened (nothing written).
    #[error("tenant '{tenant}': tenant budget reached for the {period}: {spent} (limit {limit})")]
    BudgetExhausted {
        /// The tenant.
        tenant: String,
        /// The window whose ceiling was reached.
        period: crate::budget::Period,
        /// What the tenant spent in it.
        spent: crate::budget::Amount,
        /// The ceiling.
        limit: crate::budget::Amount,
        /// Until the window ends.
        retry_in: std::time::Duration,
    },
    /// This instance stopped driving the run before it closed, because it is shutting down
    /// ([`crate::Loom::stop`]): the run is open in its journal at a safe point, its lease handed
    /// back, and resumes where it stopped ([`crate::Loom::resume`], [`crate::Loom::recover`],
    /// the next `loom serve`).
    #[error(
        "run {} was interrupted by a shutdown before it closed: it resumes where it stopped",
        .0.run_id
    )]
    Interrupted(loom_engine::RunRef),
    /// The journal could not be read or written.
    #[error(transparent)]
    Journal(StoreError),
    /// The engine failed in a way that is neither of the above.
    #[error(transparent)]
    Engine(EngineError),
}

impl LoomError {
    /// Whether the caller asked for something impossible (CLI exit code 2), as opposed to a
    /// failure while doing it (exit code 1).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            LoomError::Config(_)
                | LoomError::UnknownAgent { .. }
                | LoomError::UnknownRun(_)
                | LoomError::UnknownSession(_)
                | LoomError::Registration(_)
                | LoomError::Refused(_)
                | LoomError::Conflict(_)
                | LoomError::BudgetExhausted { .. }
        )
    }
}

impl From<ConfigError> for LoomError {
    fn from(error: ConfigError) -> LoomError {
        LoomError::Config(Box::new(error))
    }
}

impl From<StoreError> for LoomError {
    fn from(error: StoreError) -> LoomError {
        LoomError::Journal(error)
    }
}

impl From<EngineError> for LoomError {
    fn from(error: EngineError) -> LoomError {
        match error {
            EngineError::Store(store) => LoomError::Journal(store),
            EngineError::RunExists { .. } | EngineError::Invalid(_) => {
                LoomError::Refused(error.to_string())
            }
            EngineError::ClaimConflict { .. } => LoomError::Conflict(error.to_string()),
            EngineError::Fold(loom_core::state::FoldError::Unknown(run)) => {
                LoomError::UnknownRun(run)
            }
            other => LoomError::Engine(other),
        }
    }
}
