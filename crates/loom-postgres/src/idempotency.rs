//! [`PgIdempotency`]: the idempotency keys in `loom_idempotency`, one tenant per transaction.
//!
//! The port names a key without its tenant in [`IdempotencyStore::complete`] and
//! [`IdempotencyStore::release`]; business keys are `<tenant>:<tool>:<business key>` (the
//! port's rule, and how the engine builds them), so the tenant is the key's prefix up to its
//! first `:`. A key without a tenant prefix, or whose prefix is not the tenant reserving it, is
//! refused: one tenant can never touch another's key. Every operation takes a
//! transaction-scoped advisory lock on the key, so processes racing for one key are serialised:
//! exactly one gets [`Reservation::Reserved`]. Expiry is decided by the database's clock, the
//! same for every host.

use std::time::Duration;

use loom_core::{
    BoxFuture,
    ids::is_safe_id,
    ports::{IdempotencyScope, IdempotencyStore, Reservation, StoreError},
    tool::ToolOutput,
};
use sqlx::{Postgres, Row, Transaction};

use crate::PgDatabase;

/// An [`IdempotencyStore`] in a PostgreSQL database. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PgIdempotency {
    db: PgDatabase,
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

impl PgIdempotency {
    /// The idempotency keys of `db`.
    pub fn new(db: PgDatabase) -> PgIdempotency {
        PgIdempotency { db }
    }

    /// A transaction for the key's tenant, holding the key's lock.
    async fn locked(
        &self,
        tenant_id: &str,
        key: &str,
    ) -> Result<Transaction<'static, Postgres>, StoreError> {
        let mut tx = self.db.begin(tenant_id).await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 1))")
            .bind(format!("{tenant_id}/{key}"))
            .execute(&mut *tx)
            .await
            .map_err(|err| self.db.error(err))?;
        Ok(tx)
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
        let mut tx = self.locked(tenant_id, key).await?;
        let outcome = async {
            let row = sqlx::query(
                "SELECT status, result, holder, expires_at <= now() AS expired \
                 FROM loom_idempotency WHERE tenant_id = $1 AND key = $2",
            )
            .bind(tenant_id)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|err| self.db.error(err))?;
            let found = match row {
                None => None,
                Some(row) => {
                    let get = |e| self.db.error(e);
                    let status: String = row.try_get("status").map_err(get)?;
                    let result: Option<String> = row.try_get("result").map_err(get)?;
                    let owner: String = row.try_get("holder").map_err(get)?;
                    let expired: bool = row.try_get("expired").map_err(get)?;
                    (!expired).then_some((status, result, owner))
                }
            };
            match found {
                Some((status, Some(result), _)) if status == "completed" => {
                    let output: ToolOutput = serde_json::from_str(&result).map_err(|err| {
                        StoreError::Invalid(format!(
                            "{}: the recorded result of idempotency key '{key}' cannot be read: \
                             {err}",
                            self.db.name()
                        ))
                    })?;
                    Ok(Reservation::Completed(Box::new(output)))
                }
                Some((_, _, owner)) if owner != holder => Ok(Reservation::Held),
                _ => {
                    sqlx::query(
                        "INSERT INTO loom_idempotency \
                         (tenant_id, key, session_id, status, result, expires_at, holder) \
                         VALUES ($1, $2, $3, 'in_progress', NULL, \
                                 now() + make_interval(secs => $4), $5) \
                         ON CONFLICT (tenant_id, key) DO UPDATE SET \
                         session_id = EXCLUDED.session_id, status = EXCLUDED.status, \
                         result = NULL, expires_at = EXCLUDED.expires_at, \
                         holder = EXCLUDED.holder",
                    )
                    .bind(tenant_id)
                    .bind(key)
                    .bind(scope.session_id)
                    .bind(ttl_seconds(ttl))
                    .bind(holder)
                    .execute(&mut *tx)
                    .await
                    .map_err(|err| self.db.error(err))?;
                    Ok(Reservation::Reserved)
                }
            }
        }
        .await;
        self.db.finish(tx, outcome).await
    }

    async fn complete_now(
        &self,
        key: &str,
        holder: &str,
        output: &ToolOutput,
    ) -> Result<(), StoreError> {
        let tenant_id = tenant_of(key)?;
        let result = serde_json::to_string(output).map_err(|err| {
            StoreError::Invalid(format!(
                "the result for key '{key}' cannot be recorded: {err}"
            ))
        })?;
        let mut tx = self.locked(tenant_id, key).await?;
        let done = sqlx::query(
            "UPDATE loom_idempotency SET status = 'completed', result = $1 \
             WHERE tenant_id = $2 AND key = $3 AND holder = $4",
        )
        .bind(result)
        .bind(tenant_id)
        .bind(key)
        .bind(holder)
        .execute(&mut *tx)
        .await
        .map(|_| ())
        .map_err(|err| self.db.error(err));
        self.db.finish(tx, done).await
    }

    async fn release_now(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        let tenant_id = tenant_of(key)?;
        let mut tx = self.locked(tenant_id, key).await?;
        let done = sqlx::query(
            "DELETE FROM loom_idempotency \
             WHERE tenant_id = $1 AND key = $2 AND holder = $3 AND status = 'in_progress'",
        )
        .bind(tenant_id)
        .bind(key)
        .bind(holder)
        .execute(&mut *tx)
        .await
        .map(|_| ())
        .map_err(|err| self.db.error(err));
        self.db.finish(tx, done).await
    }

    async fn delete_session_now(
        &self,
        tenant_id: &str,
        session_id: &str,
    ) -> Result<u64, StoreError> {
        loom_core::journal::safe_id("tenant", tenant_id)?;
        let mut tx = self.db.begin(tenant_id).await?;
        let done =
            sqlx::query("DELETE FROM loom_idempotency WHERE tenant_id = $1 AND session_id = $2")
                .bind(tenant_id)
                .bind(session_id)
                .execute(&mut *tx)
                .await
                .map(|done| done.rows_affected())
                .map_err(|err| self.db.error(err));
        self.db.finish(tx, done).await
    }
}

/// A time to live in seconds, as `make_interval` takes it (a century at most).
fn ttl_seconds(ttl: Duration) -> f64 {
    ttl.as_secs_f64().min(3.2e9)
}

impl IdempotencyStore for PgIdempotency {
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
