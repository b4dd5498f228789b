//! [`RedisError`]: why a Redis adapter could not be built or could not act, classified by kind.

/// A Redis adapter's error.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    /// The URL is not a Redis URL (`redis://host:port/db`, `rediss://…`, `redis+unix://…`).
    #[error("not a usable Redis URL: {0}")]
    Url(String),
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
        if error.is_io_error()
            || error.is_connection_refusal()
            || error.is_timeout()
            || error.is_connection_dropped()
        {
            RedisError::Unavailable(error.to_string())
        } else {
            RedisError::Refused(error.to_string())
        }
    }
}
