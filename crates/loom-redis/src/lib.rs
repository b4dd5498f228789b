//! # loom-redis
//!
//! Loom on Redis, for a service of several processes: the event bus (pub/sub on the channel
//! `loom:events`), the shared counters of rate limits, quotas and tenant budget windows, and the
//! idempotency keys of business actions.
