//! Why a Redis store cannot be built or used, classified by kind ([`RedisError`]), shared by
//! every module of the crate.

/// Why Redis cannot be used, classified by kind.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    /// The URL does not parse (its text is not repeated: it may hold a password).
    #[error("the Redis URL is not usable (redis://[user:password@]host:port[/db]): {reason}")]
    Url {
        /// What the parser said, without the URL.
        reason: String,
    },
    /// A name given to the store (a channel, a key prefix) is not usable.
    #[error("{what} {value:?} is not usable: {reason}")]
    Name {
        /// What was named (`channel`, `key prefix`).
        what: &'static str,
        /// The value given.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },
}

/// Whether a Redis failure means the server cannot be reached now (connection refused, lost,
/// timed out): retry later. Anything else is an answer the server gave.
pub(crate) fn is_unavailable(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_timeout()
}
