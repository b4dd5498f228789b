//! [`RedisCounters`]: the [`Counters`] port on Redis, so every process of a service counts one
//! limit.
//!
//! Every key lives under a prefix (`loom:` by default). A sliding window is a sorted set whose
//! members are the slots taken, scored by the Redis server's clock (`TIME`, the same for every
//! host): one Lua script drops the slots older than the window, counts the others and takes a
//! slot (a unique member) or answers how long until the oldest one leaves; the set expires with
//! its window. A sum is a hash `{cost_usd, tokens}`: seeded only when absent (with its expiry),
//! added to only when present. Each operation is one script or one command, atomic in Redis.

use std::{sync::Arc, time::Duration};

use loom_core::{
    BoxFuture,
    counters::{CounterError, Counters, Slot, Sum, Taken},
};
use redis::Script;

use crate::{RedisError, link::Link};

/// The prefix of every key when none is chosen.
pub const DEFAULT_PREFIX: &str = "loom:";

/// Takes a slot: `KEYS[1]` the window, `ARGV` the limit, the window in ms and a unique suffix.
/// Answers `{1, member}` or `{0, ms until the oldest slot leaves}`.
const TAKE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local retry = window
  if oldest[2] then retry = tonumber(oldest[2]) + window - now end
  if retry < 1 then retry = 1 end
  return {0, tostring(retry)}
end
local member = tostring(now) .. '-' .. ARGV[3]
redis.call('ZADD', KEYS[1], now, member)
redis.call('PEXPIRE', KEYS[1], window)
return {1, member}
";

/// Seeds a sum: `KEYS[1]` the hash, `ARGV` dollars, tokens, time to live in ms. Answers what
/// the hash holds afterwards.
const SEED: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'cost_usd', ARGV[1], 'tokens', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return redis.call('HMGET', KEYS[1], 'cost_usd', 'tokens')
";

/// Adds to a sum if it exists: `KEYS[1]` the hash, `ARGV` dollars, tokens. Answers 1 or 0.
const ADD: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HINCRBYFLOAT', KEYS[1], 'cost_usd', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'tokens', ARGV[2])
return 1
";

/// The longest time to live given to Redis (a century, in ms).
const MAX_TTL_MS: u64 = 100 * 365 * 86_400 * 1000;

/// The [`Counters`] port on a Redis server. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RedisCounters {
    link: Arc<Link>,
    prefix: String,
    take: Arc<Script>,
    seed: Arc<Script>,
    add: Arc<Script>,
}

impl RedisCounters {
    /// Counters on the server at `url` (`redis://host:port/db`), keys under [`DEFAULT_PREFIX`].
    /// The URL is checked now; the server is reached at the first operation (an unreachable
    /// server is then [`CounterError::Unavailable`]).
    pub fn new(url: &str) -> Result<RedisCounters, RedisError> {
        RedisCounters::with_prefix(url, DEFAULT_PREFIX)
    }

    /// [`RedisCounters::new`] with every key under `prefix`.
    pub fn with_prefix(url: &str, prefix: &str) -> Result<RedisCounters, RedisError> {
        Ok(RedisCounters {
            link: Arc::new(Link::new(url)?),
            prefix: prefix.to_owned(),
            take: Arc::new(Script::new(TAKE)),
            seed: Arc::new(Script::new(SEED)),
            add: Arc::new(Script::new(ADD)),
        })
    }

    /// The prefix of every key.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    async fn connection(&self) -> Result<redis::aio::ConnectionManager, CounterError> {
        self.link.connection().await.map_err(counter_error)
    }

    async fn take_now(
        &self,
        key: &str,
        limit: u32,
        window: Duration,
    ) -> Result<Taken, CounterError> {
        let mut conn = self.connection().await?;
        let (taken, answer): (i64, String) = self
            .take
            .key(self.key(key))
            .arg(limit)
            .arg(millis(window).max(1))
            .arg(uuid::Uuid::now_v7().simple().to_string())
            .invoke_async(&mut conn)
            .await
            .map_err(|err| counter_error(RedisError::from_client(&err)))?;
        if taken == 1 {
            return Ok(Taken::Slot(Slot {
                key: key.to_owned(),
                member: answer,
            }));
        }
        let retry_ms: u64 = answer.parse().map_err(|_| {
            CounterError::Refused(format!(
                "window {}: the delay {answer:?} is not a number of milliseconds",
                self.key(key)
            ))
        })?;
        Ok(Taken::Full {
            retry_after: Duration::from_millis(retry_ms),
        })
    }

    async fn give_back_now(&self, slot: &Slot) -> Result<(), CounterError> {
        let mut conn = self.connection().await?;
        redis::cmd("ZREM")
            .arg(self.key(&slot.key))
            .arg(&slot.member)
            .query_async::<i64>(&mut conn)
            .await
            .map(|_| ())
            .map_err(|err| counter_error(RedisError::from_client(&err)))
    }

    async fn sum_now(&self, key: &str) -> Result<Option<Sum>, CounterError> {
        let mut conn = self.connection().await?;
        let held: (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(self.key(key))
            .arg("cost_usd")
            .arg("tokens")
            .query_async(&mut conn)
            .await
            .map_err(|err| counter_error(RedisError::from_client(&err)))?;
        self.read_sum(key, held)
    }

    async fn seed_now(&self, key: &str, value: Sum, ttl: Duration) -> Result<Sum, CounterError> {
        let mut conn = self.connection().await?;
        let held: (Option<String>, Option<String>) = self
            .seed
            .key(self.key(key))
            .arg(dollars(value.cost_usd, key)?)
            .arg(value.tokens)
            .arg(millis(ttl).max(1))
            .invoke_async(&mut conn)
            .await
            .map_err(|err| counter_error(RedisError::from_client(&err)))?;
        self.read_sum(key, held)?.ok_or_else(|| {
            CounterError::Refused(format!("sum {}: gone as soon as seeded", self.key(key)))
        })
    }

    async fn add_now(&self, key: &str, amount: Sum) -> Result<bool, CounterError> {
        let mut conn = self.connection().await?;
        let added: i64 = self
            .add
            .key(self.key(key))
            .arg(dollars(amount.cost_usd, key)?)
            .arg(amount.tokens)
            .invoke_async(&mut conn)
            .await
            .map_err(|err| counter_error(RedisError::from_client(&err)))?;
        Ok(added == 1)
    }

    async fn ping_now(&self) -> Result<(), CounterError> {
        let mut conn = self.connection().await?;
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map(|_| ())
            .map_err(|err| counter_error(RedisError::from_client(&err)))
    }

    /// A sum as the hash holds it (`None` when it holds neither field).
    fn read_sum(
        &self,
        key: &str,
        (cost, tokens): (Option<String>, Option<String>),
    ) -> Result<Option<Sum>, CounterError> {
        if cost.is_none() && tokens.is_none() {
            return Ok(None);
        }
        let bad = |field: &str, value: &str| {
            CounterError::Refused(format!(
                "sum {}: {field} holds {value:?}, not a number",
                self.key(key)
            ))
        };
        let cost_usd = match cost.as_deref() {
            None => 0.0,
            Some(text) => text.parse::<f64>().map_err(|_| bad("cost_usd", text))?,
        };
        let tokens = match tokens.as_deref() {
            None => 0,
            Some(text) => text.parse::<u64>().map_err(|_| bad("tokens", text))?,
        };
        Ok(Some(Sum { cost_usd, tokens }))
    }
}

/// A duration in whole milliseconds, at most a century.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(MAX_TTL_MS)
        .min(MAX_TTL_MS)
}

/// Dollars as Redis reads a float; refused when not finite.
fn dollars(value: f64, key: &str) -> Result<String, CounterError> {
    if value.is_finite() {
        Ok(value.to_string())
    } else {
        Err(CounterError::Refused(format!(
            "sum {key}: {value} dollars is not a number Redis can hold"
        )))
    }
}

/// The port's error for an adapter error.
fn counter_error(error: RedisError) -> CounterError {
    match error {
        RedisError::Unavailable(message) => CounterError::Unavailable(message),
        RedisError::Url(message) | RedisError::Refused(message) => CounterError::Refused(message),
        name @ RedisError::Name { .. } => CounterError::Refused(name.to_string()),
    }
}

impl Counters for RedisCounters {
    fn take<'a>(
        &'a self,
        key: &'a str,
        limit: u32,
        window: Duration,
    ) -> BoxFuture<'a, Result<Taken, CounterError>> {
        Box::pin(self.take_now(key, limit, window))
    }

    fn give_back<'a>(&'a self, slot: &'a Slot) -> BoxFuture<'a, Result<(), CounterError>> {
        Box::pin(self.give_back_now(slot))
    }

    fn sum<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Sum>, CounterError>> {
        Box::pin(self.sum_now(key))
    }

    fn seed<'a>(
        &'a self,
        key: &'a str,
        value: Sum,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Sum, CounterError>> {
        Box::pin(self.seed_now(key, value, ttl))
    }

    fn add<'a>(&'a self, key: &'a str, amount: Sum) -> BoxFuture<'a, Result<bool, CounterError>> {
        Box::pin(self.add_now(key, amount))
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), CounterError>> {
        Box::pin(self.ping_now())
    }
}
