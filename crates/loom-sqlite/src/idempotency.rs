//! [`SqliteIdempotency`]: the idempotency store in the journal's SQLite file.
//!
//! One table, `idempotency(key PK, status, result, expires_at, holder, tenant_id, session_id)`:
//! `status` is `in_progress` or `completed`, `result` the recorded [`ToolOutput`] as JSON,
//! `expires_at` RFC 3339 UTC, `tenant_id`/`session_id` the session that reserved the key (NULL
//! in records written before these columns existed). Every operation runs in a `BEGIN IMMEDIATE` transaction, so two processes racing
//! for one key are serialized by SQLite's write lock: exactly one gets
//! [`Reservation::Reserved`].

use std::{path::Path, time::Duration};

use chrono::{DateTime, SecondsFormat, Utc};
use loom_core::{
    BoxFuture,
    ports::{IdempotencyScope, IdempotencyStore, Reservation, StoreError},
    tool::ToolOutput,
};
use sqlx::Row;

use crate::store::{SqliteStore, db_error};

/// An [`IdempotencyStore`] in a SQLite file (the journal's, or one of its own). Cheap to clone.
#[derive(Debug, Clone)]
pub struct SqliteIdempotency {
    store: SqliteStore,
}

impl SqliteIdempotency {
    /// Opens (creating it when missing) the database file at `path`; see [`SqliteStore::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteIdempotency, StoreError> {
        SqliteStore::open(path).map(SqliteIdempotency::of)
    }

    /// [`SqliteIdempotency::open`] inside a tokio runtime; see [`SqliteStore::connect`].
    pub async fn connect(path: impl AsRef<Path>) -> Result<SqliteIdempotency, StoreError> {
        SqliteStore::connect(path).await.map(SqliteIdempotency::of)
    }

    /// The idempotency store in the same file as `store`, sharing its connections.
    pub fn of(store: SqliteStore) -> SqliteIdempotency {
        SqliteIdempotency { store }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.store.path()
    }

    fn error(&self, err: sqlx::Error) -> StoreError {
        db_error(self.store.path(), err)
    }

    async fn reserve_now(
        &self,
        key: &str,
        holder: &str,
        scope: IdempotencyScope<'_>,
        ttl: Duration,
    ) -> Result<Reservation, StoreError> {
        let now = Utc::now();
        let expires_at = chrono::Duration::from_std(ttl)
            .ok()
            .and_then(|ttl| now.checked_add_signed(ttl))
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        let mut tx = self
            .store
            .pool()
            .begin_with(crate::store::BEGIN_FULL)
            .await
            .map_err(|err| self.error(err))?;
        let row = sqlx::query(
            "SELECT status, result, expires_at, holder FROM idempotency WHERE key = ?1",
        )
        .bind(key)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|err| self.error(err))?;
        let found = match row {
            None => None,
            Some(row) => {
                let status: String = row.try_get("status").map_err(|err| self.error(err))?;
                let result: Option<String> =
                    row.try_get("result").map_err(|err| self.error(err))?;
                let expires: String = row.try_get("expires_at").map_err(|err| self.error(err))?;
                let owner: String = row.try_get("holder").map_err(|err| self.error(err))?;
                let expired = DateTime::parse_from_rfc3339(&expires)
                    .map(|at| at.with_timezone(&Utc) <= now)
                    .unwrap_or(true);
                (!expired).then_some((status, result, owner))
            }
        };
        let outcome = match found {
            Some((status, Some(result), _)) if status == "completed" => {
                let output: ToolOutput = serde_json::from_str(&result).map_err(|err| {
                    StoreError::Invalid(format!(
                        "{}: the recorded result of idempotency key '{key}' cannot be read: {err}",
                        self.store.path().display()
                    ))
                })?;
                Reservation::Completed(Box::new(output))
            }
            Some((_, _, owner)) if owner != holder => Reservation::Held,
            _ => {
                sqlx::query(
                    "INSERT OR REPLACE INTO idempotency \
                     (key, status, result, expires_at, holder, tenant_id, session_id) \
                     VALUES (?1, 'in_progress', NULL, ?2, ?3, ?4, ?5)",
                )
                .bind(key)
                .bind(expires_at.to_rfc3339_opts(SecondsFormat::Micros, true))
                .bind(holder)
                .bind(scope.tenant_id)
                .bind(scope.session_id)
                .execute(&mut *tx)
                .await
                .map_err(|err| self.error(err))?;
                Reservation::Reserved
            }
        };
        tx.commit().await.map_err(|err| self.error(err))?;
        Ok(outcome)
    }

    async fn complete_now(
        &self,
        key: &str,
        holder: &str,
        output: &ToolOutput,
    ) -> Result<(), StoreError> {
        let result = serde_json::to_string(output).map_err(|err| {
            StoreError::Invalid(format!(
                "the result for key '{key}' cannot be recorded: {err}"
            ))
        })?;
        let mut tx = self
            .store
            .pool()
            .begin_with(crate::store::BEGIN_FULL)
            .await
            .map_err(|err| self.error(err))?;
        sqlx::query(
            "UPDATE idempotency SET status = 'completed', result = ?1 \
             WHERE key = ?2 AND holder = ?3",
        )
        .bind(result)
        .bind(key)
        .bind(holder)
        .execute(&mut *tx)
        .await
        .map_err(|err| self.error(err))?;
        tx.commit().await.map_err(|err| self.error(err))
    }

    async fn release_now(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        let mut tx = self
            .store
            .pool()
            .begin_with(crate::store::BEGIN_FULL)
            .await
            .map_err(|err| self.error(err))?;
        sqlx::query(
            "DELETE FROM idempotency WHERE key = ?1 AND holder = ?2 AND status = 'in_progress'",
        )
        .bind(key)
        .bind(holder)
        .execute(&mut *tx)
        .await
        .map_err(|err| self.error(err))?;
        tx.commit().await.map_err(|err| self.error(err))
    }

    async fn delete_session_now(
        &self,
        tenant_id: &str,
        session_id: &str,
    ) -> Result<u64, StoreError> {
        let mut tx = self
            .store
            .pool()
            .begin_with(crate::store::BEGIN_FULL)
            .await
            .map_err(|err| self.error(err))?;
        let done = sqlx::query("DELETE FROM idempotency WHERE tenant_id = ?1 AND session_id = ?2")
            .bind(tenant_id)
            .bind(session_id)
            .execute(&mut *tx)
            .await
            .map_err(|err| self.error(err))?;
        tx.commit().await.map_err(|err| self.error(err))?;
        Ok(done.rows_affected())
    }
}

impl IdempotencyStore for SqliteIdempotency {
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
