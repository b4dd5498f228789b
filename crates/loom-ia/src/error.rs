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
    /// No approval request waits for the decision: nothing waits in the run, or not for the
    /// call named. Nothing was written.
    #[error("{0}")]
    UnknownApproval(String),
    /// No such file in the session (`artifact.stored`), or its bytes are gone.
    #[error("file {0} not found")]
    UnknownArtifact(String),
    /// A read query the journal cannot answer: a filter value out of range or naming nothing.
    #[error("{parameter}: {reason}")]
    InvalidQuery {
        /// The query parameter at fault.
        parameter: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A tool registration was refused.
    #[error("tool registration refused: {0}")]
    Registration(String),
    /// The request was refused: it conflicts with the state of things (the run exists, an
    /// approval request expired, a sub-run cannot be resumed on its own) or with a rule
    /// (judges skipped under `prod`, an undeclared tenant).
    #[error("request refused: {0}")]
    Refused(String),
    /// The tenant may not use the agent: it is not in the tenant's `tenants[].agents`.
    /// Nothing was written.
    #[error("tenant '{tenant}' may not use the agent '{agent}' (tenants[].agents)")]
    AgentNotAllowed {
        /// The tenant.
        tenant: String,
        /// The agent asked for.
        agent: String,
    },
    /// The session named belongs to another agent: a session is continued only by the agent
    /// that opened it (its sub-agents run in it as child runs). Nothing was written.
    #[error(
        "session {session} belongs to the agent '{owner}': the agent '{agent}' cannot add a run \
         to it (a session is continued by the agent that opened it)"
    )]
    SessionOfAnotherAgent {
        /// The session.
        session: String,
        /// The agent that opened it.
        owner: String,
        /// The agent asked for.
        agent: String,
    },
    /// The request is unusable as given (an unusable id, an ill-formed message, a refused
    /// attachment, corrected arguments that do not fit, a trigger payload its templates cannot
    /// render, a delivery id already used elsewhere): sending it again unchanged cannot
    /// succeed. Nothing was written.
    #[error("request refused: {0}")]
    Invalid(String),
    /// No such trigger (`triggers`).
    #[error("unknown trigger '{name}' ({})", known_triggers(.known))]
    UnknownTrigger {
        /// The name asked for.
        name: String,
        /// The declared triggers.
        known: Vec<String>,
    },
    /// A tenant opened as many runs in the last minute as its `quotas.runs_per_minute`: the
    /// run was not opened (nothing written).
    #[error(
        "tenant '{tenant}': {limit} runs per minute exceeded, retry in {} s",
        whole_seconds(.retry_after)
    )]
    QuotaExceeded {
        /// The tenant.
        tenant: String,
        /// Its `quotas.runs_per_minute`.
        limit: u32,
        /// Until a run can be opened again.
        retry_after: std::time::Duration,
    },
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
    /// A sealed journal or file (`storage.encryption`) needs a key the tenant does not have:
    /// none of its keys has the id the content names, or the key's secret is not set (deleted:
    /// crypto-shredding). Nothing was read or written, and nothing recorded was changed. REST
    /// answers 424, the CLI exits with code 2.
    #[error("sealed journal: tenant '{tenant}' has no key {key_id}: {reason}")]
    MissingKey {
        /// The tenant.
        tenant: String,
        /// The key asked for: the 12-hex id sealed content names, or the secret name of the key
        /// that seals new writes.
        key_id: String,
        /// What the tenant has instead.
        reason: String,
    },
    /// The job queue (`storage.queue`) could not take or give a job: the broker is down or
    /// refused. What was journaled before stays; REST answers 503 with `Retry-After`.
    #[error("job queue: {0}")]
    Queue(loom_core::queue::QueueError),
    /// The shared counters (`storage.limits`) cannot be reached, so a limit (a tenant quota
    /// or budget, a key's rate limit) cannot be checked: the request is refused rather than let
    /// through unchecked, and nothing is written. REST answers 503 with `Retry-After`
    /// ([`LIMITS_RETRY_AFTER`]); the CLI exits with code 1.
    #[error("shared limits unavailable while checking {what}: {reason}")]
    LimitsUnavailable {
        /// The limit that could not be checked (`the quota of tenant 'acme'`).
        what: String,
        /// Why.
        reason: String,
    },
    /// The journal could not be read or written.
    #[error(transparent)]
    Journal(StoreError),
    /// The engine failed in a way that is neither of the above.
    #[error(transparent)]
    Engine(EngineError),
}

/// How long a caller refused with [`LoomError::LimitsUnavailable`] is told to wait.
pub const LIMITS_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

impl LoomError {
    /// [`LoomError::LimitsUnavailable`] for a counter that failed while checking `what`.
    pub fn limits_unavailable(
        what: impl Into<String>,
        error: &loom_core::counters::CounterError,
    ) -> LoomError {
        LoomError::LimitsUnavailable {
            what: what.into(),
            reason: error.to_string(),
        }
    }

    /// Whether the error is the server's own failure rather than an answer to the request (a
    /// journal that cannot be read or written, an engine failure, a configuration or a
    /// registration found wrong while serving). Its message may name files and internals:
    /// access paths log it and answer a generic message with an id to find it in the log.
    pub fn is_internal(&self) -> bool {
        matches!(
            self,
            LoomError::Config(_)
                | LoomError::Registration(_)
                | LoomError::Journal(_)
                | LoomError::Engine(_)
        )
    }

    /// Whether the caller asked for something impossible (CLI exit code 2), as opposed to a
    /// failure while doing it (exit code 1).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            LoomError::Config(_)
                | LoomError::UnknownAgent { .. }
                | LoomError::UnknownRun(_)
                | LoomError::UnknownSession(_)
                | LoomError::UnknownApproval(_)
                | LoomError::UnknownArtifact(_)
                | LoomError::InvalidQuery { .. }
                | LoomError::Registration(_)
                | LoomError::Refused(_)
                | LoomError::AgentNotAllowed { .. }
                | LoomError::SessionOfAnotherAgent { .. }
                | LoomError::Invalid(_)
                | LoomError::UnknownTrigger { .. }
                | LoomError::Conflict(_)
                | LoomError::BudgetExhausted { .. }
                | LoomError::QuotaExceeded { .. }
                | LoomError::MissingKey { .. }
        )
    }
}

/// A delay in whole seconds, rounded up, at least 1 (what `Retry-After` says).
pub(crate) fn whole_seconds(delay: &std::time::Duration) -> u64 {
    (delay.as_secs() + u64::from(delay.subsec_nanos() > 0)).max(1)
}

fn known_triggers(known: &[String]) -> String {
    if known.is_empty() {
        "no trigger is declared".to_owned()
    } else {
        format!("triggers: {}", known.join(", "))
    }
}

impl From<ConfigError> for LoomError {
    fn from(error: ConfigError) -> LoomError {
        LoomError::Config(Box::new(error))
    }
}

impl From<loom_core::queue::QueueError> for LoomError {
    fn from(error: loom_core::queue::QueueError) -> LoomError {
        LoomError::Queue(error)
    }
}

impl From<StoreError> for LoomError {
    fn from(error: StoreError) -> LoomError {
        match error {
            StoreError::MissingKey {
                tenant_id,
                key_id,
                reason,
            } => LoomError::MissingKey {
                tenant: tenant_id,
                key_id,
                reason,
            },
            other => LoomError::Journal(other),
        }
    }
}

impl From<EngineError> for LoomError {
    fn from(error: EngineError) -> LoomError {
        match error {
            EngineError::Store(store) => LoomError::from(store),
            EngineError::RunExists { .. } | EngineError::Invalid(_) => {
                LoomError::Refused(error.to_string())
            }
            EngineError::Unusable(message) => LoomError::Invalid(message),
            EngineError::StateRefused(reason) => {
                LoomError::Invalid(format!("session state: {reason}"))
            }
            EngineError::UnknownApproval(message) => LoomError::UnknownApproval(message),
            EngineError::SessionOfAnotherAgent {
                session_id,
                owner,
                agent,
            } => LoomError::SessionOfAnotherAgent {
                session: session_id,
                owner,
                agent,
            },
            EngineError::ClaimConflict { .. } => LoomError::Conflict(error.to_string()),
            EngineError::Fold(loom_core::state::FoldError::Unknown(run)) => {
                LoomError::UnknownRun(run)
            }
            other => LoomError::Engine(other),
        }
    }
}
