//! # loom-redis
//!
//! Loom on Redis, for a service of several processes: the event bus (pub/sub on the channel
//! `loom:events`), the shared counters of rate limits, quotas and tenant budget windows, and the
//! idempotency keys of business actions.

mod bus;
mod counters;
mod error;
mod idempotency;
mod link;

pub use bus::{DEFAULT_CHANNEL, RedisBus};
pub use counters::{DEFAULT_PREFIX, RedisCounters};
pub use error::RedisError;
pub use idempotency::RedisIdempotency;
