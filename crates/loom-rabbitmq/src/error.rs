//! The errors of the RabbitMQ job queue, classified by kind (never by message text), and how
//! they map onto the port's [`QueueError`].

use loom_core::queue::QueueError;

/// Why an operation on the RabbitMQ job queue failed.
#[derive(Debug, thiserror::Error)]
pub enum RabbitError {
    /// The options given to [`crate::RabbitQueue::connect`] are not usable (an empty or
    /// malformed prefix, zero attempts).
    #[error("invalid RabbitMQ queue options: {0}")]
    Options(String),
    /// A job cannot be carried as a message (a key longer than AMQP allows).
    #[error("job not publishable: {0}")]
    Job(String),
    /// The broker cannot be reached, or the connection or channel was lost: retry later.
    #[error("RabbitMQ unavailable while {what}: {detail}")]
    Unavailable {
        /// What was being done.
        what: String,
        /// What the client or broker said.
        detail: String,
    },
    /// The broker refused the operation: a queue declared with other arguments (another
    /// `max_attempts`, a classic queue where a quorum queue is expected), a missing queue, a
    /// permission, a message it would not take.
    #[error("RabbitMQ refused {what}: {detail}")]
    Refused {
        /// What was being done.
        what: String,
        /// What the broker said.
        detail: String,
    },
}

impl RabbitError {
    /// Classifies a client error met while doing `what`: a channel-level AMQP error (precondition
    /// failed, not found, access refused, …) is a refusal; everything else (IO, connection-level
    /// errors, closed channels, missed heartbeats) means the broker is unavailable.
    pub(crate) fn from_lapin(what: impl Into<String>, error: &lapin::Error) -> RabbitError {
        let what = what.into();
        let detail = error.to_string();
        if error.is_amqp_soft_error() {
            RabbitError::Refused { what, detail }
        } else {
            RabbitError::Unavailable { what, detail }
        }
    }

    /// Whether retrying after a reconnection may help.
    pub(crate) fn is_unavailable(&self) -> bool {
        matches!(self, RabbitError::Unavailable { .. })
    }
}

impl From<RabbitError> for QueueError {
    fn from(error: RabbitError) -> QueueError {
        match error {
            RabbitError::Unavailable { .. } => QueueError::Unavailable(error.to_string()),
            RabbitError::Options(_) | RabbitError::Job(_) | RabbitError::Refused { .. } => {
                QueueError::Refused(error.to_string())
            }
        }
    }
}
