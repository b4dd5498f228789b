//! [`RedisIdempotency`]: the idempotency keys of business actions on Redis, with the semantics
//! of the SQL stores (`PgIdempotency`, `SqliteIdempotency`).
//!
//! A record is a hash `<prefix>idem:<key>` `{status, result, holder, tenant, session}` living
//! its time to live (`PEXPIRE`, on the server's clock, the same for every host); a session's
//! keys are listed in the set `<prefix>idem-session:<tenant>:<session>`, so erasing the session
//! erases them. Each operation is one Lua script, atomic in Redis: of processes racing for one
//! key, exactly one gets [`Reservation::Reserved`].
//!
//! As in `PgIdempotency`, a business key starts with its tenant (`<tenant>:<tool>:<key>`): a key
//! without that prefix, or reserved for another tenant, is refused, so one tenant never touches
//! another's key. The scripts reach keys they compute (a session's index, its records), so the
//! server is one Redis, not a cluster.

use std::{sync::Arc, time::Duration};

use loom_core::{
    BoxFuture,
    ids::is_safe_id,
    ports::{IdempotencyScope, IdempotencyStore, Reservation, StoreError},
    tool::ToolOutput,
};
use redis::Script;

use crate::{RedisError, counters::DEFAULT_PREFIX, link::Link};

/// Reserves: `KEYS[1]` the record, `KEYS[2]` the session's index; `ARGV` holder, ttl in ms,
/// tenant, session, key. A reservation living 0 ms is taken and gone at once (as a SQL record
/// expired as soon as written): nothing is recorded. The index lives as long as its longest
/// record. Answers `{"completed", result}`, `{"held", ""}` or `{"reserved", ""}`.
const RESERVE: &str = r"
local rec = redis.call('HMGET', KEYS[1], 'status', 'result', 'holder')
if rec[1] == 'completed' then return {'completed', rec[2] or ''} end
if rec[1] and rec[3] ~= ARGV[1] then return {'held', ''} end
redis.call('DEL', KEYS[1])
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('HSET', KEYS[1], 'status', 'in_progress', 'holder', ARGV[1],
    'tenant', ARGV[3], 'session', ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('SADD', KEYS[2], ARGV[5])
  local left = redis.call('PTTL', KEYS[2])
  if left < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
end
return {'reserved', ''}
";

/// Completes: `KEYS[1]` the record; `ARGV` holder, result. Only the holder's record.
const COMPLETE: &str = r"
if redis.call('HGET', KEYS[1], 'holder') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'status', 'completed', 'result', ARGV[2])
end
return 0
";

/// Releases: `KEYS[1]` the record; `ARGV` holder. Only the holder's record still in progress.
const RELEASE: &str = r"
local rec = redis.call('HMGET', KEYS[1], 'status', 'holder')
if rec[1] == 'in_progress' and rec[2] == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
";

/// Erases a session: `KEYS[1]` its index; `ARGV` the records' prefix, tenant, session. A key
/// the index lists is erased only while its record still belongs to the session (another
/// session may have reserved it since). Answers how many records went.
const DELETE_SESSION: &str = r"
local gone = 0
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local record = ARGV[1] .. key
  local owner = redis.call('HMGET', record, 'tenant', 'session')
  if owner[1] == ARGV[2] and owner[2] == ARGV[3] then
    gone = gone + redis.call('DEL', record)
  end
end
redis.call('DEL', KEYS[1])
return gone
";

/// The longest time to live given to Redis (a century, in ms).
const MAX_TTL_MS: u64 = 100 * 365 * 86_400 * 1000;

/// An [`IdempotencyStore`] on a Redis server. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RedisIdempotency {
    link: Arc<Link>,
    prefix: String,
    scripts: Arc<[Script; 4]>,
}

/// The tenant of a business key: its prefix up to the first `:`.
fn tenant_of(key: &str) -> Result<&str, StoreError> {
    match key.split_once(':') {
        Some((tenant, rest)) if is_safe_id(tenant) && !rest.is_empty() => Ok(tenant),
        _ => Err(StoreError::Invalid(format!(
            "idempotency key {key:?} does not start with its tenant (<tenant>:<tool>:<key>)"
        ))),
    }
}

impl RedisIdempotency {
    /// The idempotency keys on the server at `url`, under [`DEFAULT_PREFIX`]. The URL is checked
    /// now; the server is reached at the first operation.
    pub fn new(url: &str) -> Result<RedisIdempotency, RedisError> {
        RedisIdempotency::with_prefix(url, DEFAULT_PREFIX)
    }

    /// [`RedisIdempotency::new`] with every key under `prefix`.
    pub fn with_prefix(url: &str, prefix: &str) -> Result<RedisIdempotency, RedisError> {
        Ok(RedisIdempotency {
            link: Arc::new(Link::new(url)?),
            prefix: prefix.to_owned(),
            scripts: Arc::new([
                Script::new(RESERVE),
                Script::new(COMPLETE),
                Script::new(RELEASE),
                Script::new(DELETE_SESSION),
            ]),
        })
    }

    fn records(&self) -> String {
        format!("{}idem:", self.prefix)
    }

    fn record(&self, key: &str) -> String {
        format!("{}{key}", self.records())
    }

    fn index(&self, tenant_id: &str, session_id: &str) -> String {
        format!("{}idem-session:{tenant_id}:{session_id}", self.prefix)
    }

    /// The port's error for a client error, naming the server.
    fn error(&self, err: &redis::RedisError) -> StoreError {
        let detail = format!("Redis idempotency store {}: {err}", self.link.shown());
        match RedisError::from_client(err) {
            RedisError::Unavailable(_) => StoreError::Io {
                path: self.link.shown().to_owned(),
                source: std::io::Error::other(detail),
            },
            RedisError::Url(_) | RedisError::Refused(_) | RedisError::Name { .. } => {
                StoreError::Invalid(detail)
            }
        }
    }

    async fn connection(&self) -> Result<redis::aio::ConnectionManager, StoreError> {
        self.link.connection().await.map_err(|err| StoreError::Io {
            path: self.link.shown().to_owned(),
            source: std::io::Error::other(err.to_string()),
        })
    }

    async fn reserve_now(
        &self,
        key: &str,
        holder: &str,
        scope: IdempotencyScope<'_>,
        ttl: Duration,
    ) -> Result<Reservation, StoreError> {
        let tenant_id = tenant_of(key)?;
        if tenant_id != scope.tenant_id {
            return Err(StoreError::Invalid(format!(
                "idempotency key {key:?} belongs to tenant {tenant_id}, not {}",
                scope.tenant_id
            )));
        }
        let ttl_ms = u64::try_from(ttl.as_millis())
            .unwrap_or(MAX_TTL_MS)
            .min(MAX_TTL_MS);
        let mut conn = self.connection().await?;
        let (status, result): (String, String) = self.scripts[0]
            .key(self.record(key))
            .key(self.index(scope.tenant_id, scope.session_id))
            .arg(holder)
            .arg(ttl_ms)
            .arg(scope.tenant_id)
            .arg(scope.session_id)
            .arg(key)
            .invoke_async(&mut conn)
            .await
            .map_err(|err| self.error(&err))?;
        match status.as_str() {
            "reserved" => Ok(Reservation::Reserved),
            "held" => Ok(Reservation::Held),
            "completed" => {
                let output: ToolOutput = serde_json::from_str(&result).map_err(|err| {
                    StoreError::Invalid(format!(
                        "{}: the recorded result of idempotency key '{key}' cannot be read: {err}",
                        self.link.shown()
                    ))
                })?;
                Ok(Reservation::Completed(Box::new(output)))
            }
            other => Err(StoreError::Invalid(format!(
                "{}: idempotency key '{key}': unexpected answer {other:?}",
                self.link.shown()
            ))),
        }
    }

    async fn complete_now(
        &self,
        key: &str,
        holder: &str,
        output: &ToolOutput,
    ) -> Result<(), StoreError> {
        tenant_of(key)?;
        let result = serde_json::to_string(output).map_err(|err| {
            StoreError::Invalid(format!(
                "the result for key '{key}' cannot be recorded: {err}"
            ))
        })?;
        let mut conn = self.connection().await?;
        self.scripts[1]
            .key(self.record(key))
            .arg(holder)
            .arg(result)
            .invoke_async::<i64>(&mut conn)
            .await
            .map(|_| ())
            .map_err(|err| self.error(&err))
    }

    async fn release_now(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        tenant_of(key)?;
        let mut conn = self.connection().await?;
        self.scripts[2]
            .key(self.record(key))
            .arg(holder)
            .invoke_async::<i64>(&mut conn)
            .await
            .map(|_| ())
            .map_err(|err| self.error(&err))
    }

    async fn delete_session_now(
        &self,
        tenant_id: &str,
        session_id: &str,
    ) -> Result<u64, StoreError> {
        loom_core::journal::safe_id("tenant", tenant_id)?;
        let mut conn = self.connection().await?;
        self.scripts[3]
            .key(self.index(tenant_id, session_id))
            .arg(self.records())
            .arg(tenant_id)
            .arg(session_id)
            .invoke_async::<u64>(&mut conn)
            .await
            .map_err(|err| self.error(&err))
    }
}

impl IdempotencyStore for RedisIdempotency {
    fn reserve<'a>(
        &'a self,
        key: &'a str,
        holder: &'a str,
        scope: IdempotencyScope<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        Box::pin(self.reserve_now(key, holder, scope, ttl))
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        holder: &'a str,
        output: &'a ToolOutput,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.complete_now(key, holder, output))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.release_now(key, holder))
    }

    fn delete_session<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.delete_session_now(tenant_id, session_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tenant_of_a_key_is_its_prefix() {
        assert_eq!(tenant_of("acme:relancer:D-1").ok(), Some("acme"));
        for bad in ["nokey", ":x", "a b:x", "acme:"] {
            assert!(
                matches!(tenant_of(bad), Err(StoreError::Invalid(_))),
                "{bad}"
            );
        }
    }
}
