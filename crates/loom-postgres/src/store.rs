//! [`PgStore`]: the journal in `loom_events`, one transaction per operation, each for one
//! tenant under row-level security.

use chrono::SecondsFormat;
use loom_core::{
    BoxFuture,
    event::{Event, EventReadError},
    journal::row_event,
    journal::{Batch, conflict, safe_id},
    ports::{EventStore, Salvage, SessionSummary, SetAside, StoreError},
    search::RecentSessions,
};
use sqlx::{Postgres, Row, Transaction, postgres::PgRow};
use tracing::warn;

use crate::PgDatabase;

/// The insert of one event row (`ingested` is the table's identity).
pub(crate) const INSERT: &str = "INSERT INTO loom_events (tenant_id, session_id, seq, event_id, \
     ts, run_id, root_run_id, type, category, status, agent, role, facets, event) \
     VALUES ($1, $2, $3, $4, $5::timestamptz, $6, $7, $8, $9, $10, $11, $12, $13::jsonb, $14) \
     RETURNING ingested";

/// Keeps the index of sessions (`loom_sessions`) at the session's last event, in the append's
/// transaction.
const SUMMARY: &str = "INSERT INTO loom_sessions (tenant_id, session_id, last_seq, updated_at, \
     last_ingested) VALUES ($1, $2, $3, $4::timestamptz, $5) \
     ON CONFLICT (tenant_id, session_id) DO UPDATE SET last_seq = EXCLUDED.last_seq, \
     updated_at = EXCLUDED.updated_at, last_ingested = EXCLUDED.last_ingested";

/// The sessions of a tenant from the index, each with its last event (read and checked), most
/// recently written first; `{since}` and `{limit}` are filled per query.
const RECENT: &str = "SELECT s.session_id, e.seq, e.event FROM loom_sessions s \
     JOIN loom_events e ON e.tenant_id = s.tenant_id AND e.session_id = s.session_id \
     AND e.seq = s.last_seq \
     WHERE s.tenant_id = $1 AND ($2::timestamptz IS NULL OR s.updated_at >= $2::timestamptz) \
     ORDER BY s.last_ingested DESC, s.session_id LIMIT $3";

/// The primary key of `loom_events`: a violation means another writer took the seq.
const PRIMARY_KEY: &str = "loom_events_pkey";

/// The unique event id per tenant.
const EVENT_ID_KEY: &str = "loom_events_event_id";

/// An [`EventStore`] in a PostgreSQL database (see the crate documentation for the schema, the
/// row-level security and the guarantees). Same contract as the SQLite journal: events are
/// stored verbatim and checked again on read, seqs are optimistic per session, a batch is
/// written whole or not at all. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PgStore {
    db: PgDatabase,
}

impl PgStore {
    /// The journal of `db`.
    pub fn new(db: PgDatabase) -> PgStore {
        PgStore { db }
    }

    /// The database.
    pub fn database(&self) -> &PgDatabase {
        &self.db
    }

    /// The name of a journal in errors: `<database> (<tenant>/<session>)`.
    pub(crate) fn journal_name(&self, tenant_id: &str, session_id: &str) -> String {
        format!("{} ({tenant_id}/{session_id})", self.db.name())
    }

    /// Reads the event of a row and checks that it belongs to the journal and carries the
    /// row's seq, which must be `expected` when given (reads check contiguity).
    fn decode(
        &self,
        tenant_id: &str,
        session_id: &str,
        row: &PgRow,
        expected: Option<u64>,
    ) -> Result<Event, StoreError> {
        let seq: Option<u64> = row
            .try_get::<i64, _>("seq")
            .ok()
            .and_then(|seq| u64::try_from(seq).ok());
        let line = seq.or(expected).unwrap_or(0);
        let corrupted = |source| StoreError::Corrupted {
            path: self.journal_name(tenant_id, session_id),
            line: usize::try_from(line).unwrap_or(usize::MAX),
            source,
        };
        let Some(seq) = seq else {
            return Err(corrupted(EventReadError::Json(
                "the row's seq is not a positive integer".into(),
            )));
        };
        let text: String = row.try_get("event").map_err(|err| {
            corrupted(EventReadError::Json(format!(
                "the row's event is not text: {err}"
            )))
        })?;
        let event = row_event(tenant_id, session_id, seq, &text).map_err(corrupted)?;
        if let Some(expected) = expected
            && seq != expected
        {
            return Err(corrupted(EventReadError::Invalid {
                event_id: event.event_id.clone(),
                seq: event.seq,
                reason: format!("seq {seq} where {expected} was expected"),
            }));
        }
        Ok(event)
    }

    /// Ends `tx`: commits on success, rolls back otherwise.
    pub(crate) async fn finish<T>(
        &self,
        tx: Transaction<'static, Postgres>,
        result: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.db.finish(tx, result).await
    }

    async fn append_now(&self, batch: Vec<Event>, expected: u64) -> Result<Vec<Event>, StoreError> {
        let mut batch = match Batch::check(batch)? {
            Ok(batch) => batch,
            Err(empty) => return Ok(empty),
        };
        let (tenant_id, session_id) = (batch.tenant_id.clone(), batch.session_id.clone());
        let mut rows = Vec::with_capacity(batch.len());
        for event in batch.events() {
            rows.push(Columns::of(event)?);
        }
        let mut tx = self.db.begin(&tenant_id).await?;
        // A batch nothing outside depends on commits without waiting for the WAL flush
        // (`synchronous_commit = off` for this transaction only: a crash of Loom's process loses
        // nothing, a crash of the database server may lose it, and the next synchronous commit
        // flushes the WAL up to it); every other commit waits (`loom_core::event::must_sync`).
        let synchronous = if loom_core::event::must_sync(batch.events()) {
            "on"
        } else {
            "off"
        };
        let written = async {
            sqlx::query(
                "SELECT set_config('synchronous_commit', $2, true), \
                 pg_advisory_xact_lock(hashtextextended($1, 0))",
            )
            .bind(format!("{tenant_id}/{session_id}"))
            .bind(synchronous)
            .execute(&mut *tx)
            .await
            .map_err(|err| self.db.error(err))?;
            let last: i64 = sqlx::query(
                "SELECT COALESCE(MAX(seq), 0) FROM loom_events \
                 WHERE tenant_id = $1 AND session_id = $2",
            )
            .bind(&tenant_id)
            .bind(&session_id)
            .fetch_one(&mut *tx)
            .await
            .and_then(|row| row.try_get(0))
            .map_err(|err| self.db.error(err))?;
            let last = u64::try_from(last).unwrap_or(0);
            if last != expected {
                return Err(conflict(&tenant_id, &session_id, expected, last));
            }
            let mut ingested = 0;
            let mut updated_at = String::new();
            batch.assign_seq(last);
            let (events, lines) = batch.into_parts();
            for ((event, line), columns) in events.iter().zip(lines).zip(rows) {
                updated_at.clone_from(&columns.ts);
                match insert(&mut tx, event, columns, line.into_string()).await {
                    Ok(id) => ingested = id,
                    Err(err) => {
                        return Err(self.insert_error(
                            err,
                            &tenant_id,
                            &session_id,
                            expected,
                            event,
                        ));
                    }
                }
            }
            let last_seq = last + events.len() as u64;
            sqlx::query(SUMMARY)
                .bind(&tenant_id)
                .bind(&session_id)
                .bind(to_sql(last_seq))
                .bind(updated_at)
                .bind(ingested)
                .execute(&mut *tx)
                .await
                .map_err(|err| self.db.error(err))?;
            Ok(events)
        }
        .await;
        self.finish(tx, written).await
    }

    /// An insert's failure: another writer's row at the same seq is a [`StoreError::Conflict`],
    /// an event id already in the tenant's journal is refused as invalid.
    fn insert_error(
        &self,
        err: sqlx::Error,
        tenant_id: &str,
        session_id: &str,
        expected: u64,
        event: &Event,
    ) -> StoreError {
        let constraint = err
            .as_database_error()
            .and_then(|db| db.constraint())
            .map(str::to_owned);
        match constraint.as_deref() {
            Some(PRIMARY_KEY) => conflict(tenant_id, session_id, expected, event.seq),
            Some(EVENT_ID_KEY) => StoreError::Invalid(format!(
                "event id {} is already in the journal of tenant {tenant_id}",
                event.event_id
            )),
            _ => self.db.error(err),
        }
    }

    async fn read_now(
        &self,
        tenant_id: &str,
        session_id: &str,
        after: u64,
    ) -> Result<Vec<Event>, StoreError> {
        safe_id("tenant", tenant_id)?;
        safe_id("session", session_id)?;
        let mut tx = self.db.begin(tenant_id).await?;
        let rows = sqlx::query(
            "SELECT seq, event FROM loom_events \
             WHERE tenant_id = $1 AND session_id = $2 AND seq > $3 ORDER BY seq",
        )
        .bind(tenant_id)
        .bind(session_id)
        .bind(to_sql(after))
        .fetch_all(&mut *tx)
        .await
        .map_err(|err| self.db.error(err));
        let rows = self.finish(tx, rows).await?;
        let mut events = Vec::with_capacity(rows.len());
        let mut expected = after;
        for row in &rows {
            expected = expected.saturating_add(1);
            events.push(self.decode(tenant_id, session_id, row, Some(expected))?);
        }
        Ok(events)
    }

    async fn last_seq_now(&self, tenant_id: &str, session_id: &str) -> Result<u64, StoreError> {
        safe_id("tenant", tenant_id)?;
        safe_id("session", session_id)?;
        let mut tx = self.db.begin(tenant_id).await?;
        let row = sqlx::query(
            "SELECT seq, event FROM loom_events \
             WHERE tenant_id = $1 AND session_id = $2 ORDER BY seq DESC LIMIT 1",
        )
        .bind(tenant_id)
        .bind(session_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|err| self.db.error(err));
        match self.finish(tx, row).await? {
            Some(row) => Ok(self.decode(tenant_id, session_id, &row, None)?.seq),
            None => Ok(0),
        }
    }

    async fn sessions_now(&self, tenant_id: &str) -> Result<Vec<SessionSummary>, StoreError> {
        safe_id("tenant", tenant_id)?;
        let rows = self.recent_rows(tenant_id, None, i64::MAX).await?;
        let mut found = Vec::with_capacity(rows.len());
        for row in &rows {
            let session_id: String = row.try_get("session_id").unwrap_or_default();
            match self.decode(tenant_id, &session_id, row, None) {
                Ok(last) => found.push(SessionSummary {
                    session_id,
                    last_seq: last.seq,
                    updated_at: Some(last.ts),
                }),
                // One unreadable journal must not hide the others.
                Err(err) => {
                    warn!(error = %err, "skipping an unreadable journal in the session list")
                }
            }
        }
        Ok(found)
    }

    /// The rows of [`RECENT`]: at most `limit` sessions.
    async fn recent_rows(
        &self,
        tenant_id: &str,
        since: Option<String>,
        limit: i64,
    ) -> Result<Vec<PgRow>, StoreError> {
        let mut tx = self.db.begin(tenant_id).await?;
        let rows = sqlx::query(RECENT)
            .bind(tenant_id)
            .bind(since)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .map_err(|err| self.db.error(err));
        self.finish(tx, rows).await
    }

    /// [`EventStore::recent_sessions`] from the index of sessions: `limit + 1` rows tell
    /// whether there are more. A last event that does not read back makes the store decline,
    /// so that the caller's scan applies its rules.
    async fn recent_sessions_now(
        &self,
        tenant_id: &str,
        since: Option<chrono::DateTime<chrono::Utc>>,
        limit: usize,
    ) -> Result<Option<RecentSessions>, StoreError> {
        safe_id("tenant", tenant_id)?;
        let since = since.map(|at| at.to_rfc3339_opts(SecondsFormat::Micros, true));
        let rows = self
            .recent_rows(tenant_id, since, to_sql(limit as u64).saturating_add(1))
            .await?;
        let mut sessions = Vec::with_capacity(rows.len().min(limit));
        for row in rows.iter().take(limit) {
            let session_id: String = row.try_get("session_id").unwrap_or_default();
            match self.decode(tenant_id, &session_id, row, None) {
                Ok(last) => sessions.push(SessionSummary {
                    session_id,
                    last_seq: last.seq,
                    updated_at: Some(last.ts),
                }),
                Err(_) => return Ok(None),
            }
        }
        Ok(Some(RecentSessions {
            sessions,
            more: rows.len() > limit,
        }))
    }

    async fn delete_now(&self, tenant_id: &str, session_id: &str) -> Result<u64, StoreError> {
        safe_id("tenant", tenant_id)?;
        safe_id("session", session_id)?;
        let mut tx = self.db.begin(tenant_id).await?;
        let deleted = async {
            let deleted =
                sqlx::query("DELETE FROM loom_events WHERE tenant_id = $1 AND session_id = $2")
                    .bind(tenant_id)
                    .bind(session_id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
            sqlx::query("DELETE FROM loom_set_aside WHERE tenant_id = $1 AND session_id = $2")
                .bind(tenant_id)
                .bind(session_id)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM loom_sessions WHERE tenant_id = $1 AND session_id = $2")
                .bind(tenant_id)
                .bind(session_id)
                .execute(&mut *tx)
                .await?;
            Ok::<u64, sqlx::Error>(deleted)
        }
        .await
        .map_err(|err| self.db.error(err));
        self.finish(tx, deleted).await
    }

    /// The session holding `run_id`'s `run.started`, by the run index: the row's columns were
    /// written from the event, so a row whose event no longer reads back is found.
    async fn find_run_now(
        &self,
        tenant_id: &str,
        run_id: &str,
    ) -> Result<Option<String>, StoreError> {
        safe_id("tenant", tenant_id)?;
        let mut tx = self.db.begin(tenant_id).await?;
        let row = sqlx::query(
            "SELECT session_id FROM loom_events \
             WHERE tenant_id = $1 AND run_id = $2 AND type = 'run.started' \
             ORDER BY ingested DESC LIMIT 1",
        )
        .bind(tenant_id)
        .bind(run_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|err| self.db.error(err));
        let row = self.finish(tx, row).await?;
        row.map(|row| row.try_get::<String, _>(0))
            .transpose()
            .map_err(|err| self.db.error(err))
    }
}

impl PgStore {
    async fn run_start_now(
        &self,
        tenant_id: &str,
        session_id: &str,
        run_id: &str,
    ) -> Result<Option<u64>, StoreError> {
        safe_id("tenant", tenant_id)?;
        let mut tx = self.db.begin(tenant_id).await?;
        let row = sqlx::query(
            "SELECT min(seq) FROM loom_events \
             WHERE tenant_id = $1 AND run_id = $2 AND session_id = $3",
        )
        .bind(tenant_id)
        .bind(run_id)
        .bind(session_id)
        .fetch_one(&mut *tx)
        .await
        .map_err(|err| self.db.error(err));
        let row = self.finish(tx, row).await?;
        let seq: Option<i64> = row.try_get(0).map_err(|err| self.db.error(err))?;
        Ok(seq.and_then(|seq| u64::try_from(seq).ok()))
    }
}

impl PgStore {
    /// The last event of `kind` before `before`, by the index `loom_events_session_type`: one
    /// row read, and checked.
    async fn last_of_type_now(
        &self,
        tenant_id: &str,
        session_id: &str,
        kind: &str,
        before: u64,
    ) -> Result<Option<Event>, StoreError> {
        safe_id("tenant", tenant_id)?;
        safe_id("session", session_id)?;
        let mut tx = self.db.begin(tenant_id).await?;
        let row = sqlx::query(
            "SELECT seq, event FROM loom_events \
             WHERE tenant_id = $1 AND session_id = $2 AND type = $3 AND seq < $4 \
             ORDER BY seq DESC LIMIT 1",
        )
        .bind(tenant_id)
        .bind(session_id)
        .bind(kind)
        .bind(to_sql(before))
        .fetch_optional(&mut *tx)
        .await
        .map_err(|err| self.db.error(err));
        let row = self.finish(tx, row).await?;
        row.map(|row| self.decode(tenant_id, session_id, &row, None))
            .transpose()
    }
}

/// Inserts `event` (its seq assigned) with its query columns and its journal line `line`;
/// returns its `ingested`.
pub(crate) async fn insert(
    tx: &mut Transaction<'static, Postgres>,
    event: &Event,
    columns: Columns,
    line: String,
) -> Result<i64, sqlx::Error> {
    sqlx::query(INSERT)
        .bind(&event.tenant_id)
        .bind(&event.session_id)
        .bind(to_sql(event.seq))
        .bind(&event.event_id)
        .bind(columns.ts)
        .bind(&event.run_id)
        .bind(&event.root_run_id)
        .bind(&event.event_type)
        .bind(columns.category)
        .bind(columns.status)
        .bind(&event.agent)
        .bind(&event.role)
        .bind(columns.facets)
        .bind(line)
        .fetch_one(&mut **tx)
        .await
        .and_then(|row| row.try_get(0))
}

impl EventStore for PgStore {
    fn append(
        &self,
        batch: Vec<Event>,
        expected_last_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Event>, StoreError>> {
        Box::pin(self.append_now(batch, expected_last_seq))
    }

    fn read<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        Box::pin(self.read_now(tenant_id, session_id, after_seq))
    }

    fn last_seq<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.last_seq_now(tenant_id, session_id))
    }

    fn sessions<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SessionSummary>, StoreError>> {
        Box::pin(self.sessions_now(tenant_id))
    }

    fn delete<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.delete_now(tenant_id, session_id))
    }

    fn find_run<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
        Box::pin(self.find_run_now(tenant_id, run_id))
    }

    fn salvage<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Salvage, StoreError>> {
        Box::pin(self.salvage_now(tenant_id, session_id))
    }

    fn set_aside<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        lines: Vec<SetAside>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.set_aside_now(tenant_id, session_id, lines))
    }

    fn search<'a>(
        &'a self,
        filter: &'a loom_core::search::EventFilter,
    ) -> BoxFuture<'a, Result<Option<loom_core::search::Searched>, StoreError>> {
        Box::pin(self.search_now(filter))
    }

    fn recent_sessions<'a>(
        &'a self,
        tenant_id: &'a str,
        since: Option<chrono::DateTime<chrono::Utc>>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Option<RecentSessions>, StoreError>> {
        Box::pin(self.recent_sessions_now(tenant_id, since, limit))
    }

    fn last_of_type<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        event_type: &'a str,
        before_seq: u64,
    ) -> BoxFuture<'a, Result<Option<Event>, StoreError>> {
        Box::pin(self.last_of_type_now(tenant_id, session_id, event_type, before_seq))
    }

    fn run_start<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(self.run_start_now(tenant_id, session_id, run_id))
    }
}

/// The query columns of an event that are not plain strings of it.
#[derive(Debug)]
pub(crate) struct Columns {
    pub(crate) ts: String,
    pub(crate) category: String,
    pub(crate) status: String,
    pub(crate) facets: String,
}

impl Columns {
    pub(crate) fn of(event: &Event) -> Result<Columns, StoreError> {
        let unserializable = |err: serde_json::Error| {
            StoreError::Invalid(format!(
                "event {} cannot be serialized: {err}",
                event.event_id
            ))
        };
        let text = |value: serde_json::Value| match value {
            serde_json::Value::String(text) => text,
            other => other.to_string(),
        };
        Ok(Columns {
            ts: event.ts.to_rfc3339_opts(SecondsFormat::Micros, true),
            category: text(serde_json::to_value(event.category).map_err(unserializable)?),
            status: text(serde_json::to_value(event.status).map_err(unserializable)?),
            facets: serde_json::to_string(&event.facets).map_err(unserializable)?,
        })
    }
}

/// A seq or count as PostgreSQL's `bigint` (saturating: seqs never come near `i64::MAX`).
pub(crate) fn to_sql(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
