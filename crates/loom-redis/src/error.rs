//! [`RedisError`]: why a Redis adapter could not be built or could not act, classified by kind,
//! shared by every module of the crate.

/// A Redis adapter's error.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    /// The URL is not a Redis URL (`redis://host:port/db`, `rediss://…`, `redis+unix://…`);
    /// the URL itself is not repeated (it may hold a password).
    #[error("not a usable Redis URL: {0}")]
    Url(String),
    /// A name given to the adapter (a channel, a key prefix) is not usable.
    #[error("{what} {value:?} is not usable: {reason}")]
    Name {
        /// What was named (`channel`, `key prefix`).
        what: &'static str,
        /// The value given.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The server cannot be reached, or stopped answering.
    #[error("Redis unavailable: {0}")]
    Unavailable(String),
    /// The server refused a command, or answered what the adapter cannot read.
    #[error("Redis refused: {0}")]
    Refused(String),
}

impl RedisError {
    /// Classifies a client error: the connection's (IO, refusal, timeout, dropped) make the
    /// server unavailable, any other is a refusal.
    pub(crate) fn from_client(error: &redis::RedisError) -> RedisError {
        if is_unavailable(error) {
            RedisError::Unavailable(error.to_string())
        } else {
            RedisError::Refused(error.to_string())
        }
    }
}

/// Whether a Redis failure means the server cannot be reached now (connection refused, lost,
/// timed out): retry later. Anything else is an answer the server gave.
pub(crate) fn is_unavailable(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_timeout()
}
