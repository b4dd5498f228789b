//! The SQLite store: schema, connection settings and the [`EventStore`] implementation.

use std::{
    io,
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
    time::Duration,
};

use chrono::{DateTime, SecondsFormat, Utc};
use loom_core::{
    BoxFuture,
    event::{Event, EventReadError},
    ports::{EventStore, Salvage, SessionSummary, SetAside, StoreError},
    search::{EventFilter, RecentSessions, Searched},
};
use sqlx::{
    Connection, Row, Sqlite,
    pool::PoolConnection,
    sqlite::{
        SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions, SqliteRow,
        SqliteSynchronous,
    },
};
use tokio::sync::MappedMutexGuard;
use tracing::{debug, warn};

use loom_core::journal::{Batch, Decoded, safe_id};

use crate::writer::Writer;

/// The schema version this build writes and reads, kept in `PRAGMA user_version`.
pub const SCHEMA_VERSION: i64 = 1;

/// How long a writer waits for another one to release the file's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections of the pool (each is one SQLite connection on its own thread).
const MAX_CONNECTIONS: u32 = 8;

/// How many times opening retries switching the file to WAL while another process holds it.
const WAL_ATTEMPTS: u32 = 100;

/// The schema, version [`SCHEMA_VERSION`].
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS events (
        tenant_id   TEXT    NOT NULL,
        session_id  TEXT    NOT NULL,
        seq         INTEGER NOT NULL,
        event_id    TEXT    NOT NULL,
        ts          TEXT    NOT NULL,
        run_id      TEXT    NOT NULL,
        root_run_id TEXT    NOT NULL,
        type        TEXT    NOT NULL,
        category    TEXT    NOT NULL,
        status      TEXT    NOT NULL,
        agent       TEXT,
        role        TEXT,
        facets      TEXT    NOT NULL,
        event       TEXT    NOT NULL,
        ingested    INTEGER NOT NULL,
        PRIMARY KEY (tenant_id, session_id, seq)
    )",
    "CREATE INDEX IF NOT EXISTS events_run ON events (tenant_id, run_id, seq)",
    "CREATE INDEX IF NOT EXISTS events_event_id ON events (tenant_id, event_id)",
    "CREATE INDEX IF NOT EXISTS events_ingested ON events (ingested)",
];

/// The idempotency table (same file; created in every file, old ones included).
const IDEMPOTENCY_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS idempotency (
        key        TEXT PRIMARY KEY,
        status     TEXT NOT NULL,
        result     TEXT,
        expires_at TEXT NOT NULL,
        holder     TEXT NOT NULL,
        tenant_id  TEXT,
        session_id TEXT
    )";

/// Columns added to the idempotency table after its first version (the session that reserved
/// a key, so that erasing the session erases its keys): added to older files when missing.
const IDEMPOTENCY_COLUMNS: &[(&str, &str)] = &[
    (
        "tenant_id",
        "ALTER TABLE idempotency ADD COLUMN tenant_id TEXT",
    ),
    (
        "session_id",
        "ALTER TABLE idempotency ADD COLUMN session_id TEXT",
    ),
];

/// Where unreadable rows are kept once set aside ([`EventStore::set_aside`]): created in every
/// file, old ones included.
const SET_ASIDE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS set_aside (
        tenant_id   TEXT    NOT NULL,
        session_id  TEXT    NOT NULL,
        seq         INTEGER NOT NULL,
        event       TEXT    NOT NULL,
        set_aside_at TEXT   NOT NULL
    )";

/// The index behind [`EventStore::last_of_type`]: a session's events of one type by seq.
/// Created in every file, old ones included (adding an index changes nothing an older build
/// reads, so the schema version stays).
const SESSION_TYPE_INDEX: &str =
    "CREATE INDEX IF NOT EXISTS events_session_type ON events (tenant_id, session_id, type, seq)";

/// The indexes behind [`EventStore::search`]: a tenant's events in write order, and a tenant's
/// events of one type in write order, so that a search walks them from its cursor and stops at
/// its limit. Created in every file, old ones included, like [`SESSION_TYPE_INDEX`].
const SEARCH_INDEXES: &[&str] = &[
    "CREATE INDEX IF NOT EXISTS events_tenant_ingested \
     ON events (tenant_id, ingested, session_id, seq)",
    "CREATE INDEX IF NOT EXISTS events_tenant_type \
     ON events (tenant_id, type, ingested, session_id, seq)",
];

/// Indexes earlier builds created and this one drops: `events_type (tenant_id, type)` is a
/// prefix of `events_tenant_type`, which serves every query it served, and each index is one
/// more b-tree every append writes.
const DROPPED_INDEXES: &[&str] = &["DROP INDEX IF EXISTS events_type"];

/// The index behind erasing a session's keys.
const IDEMPOTENCY_INDEX: &str =
    "CREATE INDEX IF NOT EXISTS idempotency_session ON idempotency (tenant_id, session_id)";

/// The `BEGIN` of a write transaction whose commit is on disk when it returns: every write
/// transaction of this crate but an append that nothing outside depends on.
pub(crate) const BEGIN_FULL: &str = "PRAGMA synchronous = FULL; BEGIN IMMEDIATE";

/// The `BEGIN` of an append that nothing outside depends on
/// ([`loom_core::event::must_sync`] is false): committed to the WAL without waiting for the
/// disk, and made durable by the next FULL commit.
pub(crate) const BEGIN_NORMAL: &str = "PRAGMA synchronous = NORMAL; BEGIN IMMEDIATE";

/// An [`EventStore`] keeping every journal in one SQLite file (see the crate documentation for
/// the schema and the guarantees).
///
/// Cloning is cheap: clones share the connection pool. Several stores — in one process or in
/// several — may open the same file.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    options: SqliteConnectOptions,
    /// Created at first use, inside the caller's tokio runtime.
    pool: OnceLock<SqlitePool>,
    /// The connection every append goes through, in group commits.
    writer: Writer,
    /// The events read last, with their text ([`Decoded`]).
    decoded: Decoded,
}

impl SqliteStore {
    /// Opens (creating it, its directory and the schema when missing) the database file at
    /// `path`, in WAL mode, for a caller outside any async runtime (a synchronous program, a
    /// test): it blocks until the file is set up, on a short-lived helper thread. Inside a tokio
    /// runtime use [`SqliteStore::connect`], which does not block a worker thread. Fails when
    /// the file cannot be created or opened, is not a SQLite database, cannot use WAL, or was
    /// written by a newer schema.
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let io_err = |source| StoreError::Io {
            path: path.display().to_string(),
            source,
        };
        create_parent(&path)?;
        let options = connect_options(&path);
        let setup = {
            let options = options.clone();
            let path = path.clone();
            std::thread::Builder::new()
                .name("loom-sqlite-open".into())
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_time()
                        .build()
                        .map_err(|source| StoreError::Io {
                            path: path.display().to_string(),
                            source,
                        })?;
                    runtime.block_on(set_up(options, &path))
                })
                .map_err(io_err)?
        };
        setup
            .join()
            .map_err(|_| io_err(io::Error::other("the schema setup thread panicked")))??;
        Ok(SqliteStore::with(path, options))
    }

    /// [`SqliteStore::open`] for a caller inside a tokio runtime: the directory is created on
    /// the blocking pool and the file set up through the connection's own thread, so no worker
    /// thread of the runtime waits. Fails like `open`.
    pub async fn connect(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let parent = path.clone();
        tokio::task::spawn_blocking(move || create_parent(&parent))
            .await
            .map_err(|err| StoreError::Io {
                path: path.display().to_string(),
                source: io::Error::other(err),
            })??;
        let options = connect_options(&path);
        let store = SqliteStore::with(path, options);
        // Set up on the connection that becomes the writer's, which keeps it: closing the only
        // connection to the file would checkpoint the WAL into it and delete it, only for the
        // first append to create it again (two syncs and two files a short-lived process need
        // not pay); and a run whose reads find the writer idle opens no other connection.
        let mut conn = SqliteConnection::connect_with(&store.inner.options)
            .await
            .map_err(|err| store.db_error(err))?;
        set_up_on(&mut conn, store.path()).await?;
        store.inner.writer.adopt(conn).await;
        Ok(store)
    }

    fn with(path: PathBuf, options: SqliteConnectOptions) -> SqliteStore {
        SqliteStore {
            inner: Arc::new(Inner {
                path,
                options,
                pool: OnceLock::new(),
                writer: Writer::default(),
                decoded: Decoded::default(),
            }),
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Closes the connections (waiting for those in use to be returned). The last connection to
    /// the file checkpoints the WAL into it. The store must not be used afterwards.
    pub async fn close(&self) {
        self.inner.writer.close().await;
        if let Some(pool) = self.inner.pool.get() {
            pool.close().await;
        }
    }

    /// The connection pool, created at first use (it needs the tokio runtime).
    pub(crate) fn pool(&self) -> &SqlitePool {
        self.inner.pool.get_or_init(|| {
            SqlitePoolOptions::new()
                .max_connections(MAX_CONNECTIONS)
                .min_connections(0)
                .idle_timeout(Some(Duration::from_secs(60)))
                .acquire_timeout(BUSY_TIMEOUT + Duration::from_secs(5))
                .connect_lazy_with(self.inner.options.clone())
        })
    }

    /// A connection to read on: the writer's while no append needs it (its page cache holds
    /// what the process last wrote, and a short-lived `loom run` then opens one connection in
    /// all), else one of the pool's.
    pub(crate) async fn reader(&self) -> Result<Reader<'_>, StoreError> {
        if let Some(writer) = self.inner.writer.idle() {
            return Ok(Reader::Writer(writer));
        }
        let conn = self
            .pool()
            .acquire()
            .await
            .map_err(|err| self.db_error(err))?;
        Ok(Reader::Pool(conn))
    }

    /// Wraps a database error with the file's path.
    pub(crate) fn db_error(&self, err: sqlx::Error) -> StoreError {
        db_error(&self.inner.path, err)
    }

    /// The name of a journal in errors: `<file> (<tenant>/<session>)`.
    pub(crate) fn journal_name(&self, tenant_id: &str, session_id: &str) -> String {
        format!("{} ({tenant_id}/{session_id})", self.inner.path.display())
    }

    /// Reads the event of a row (`event` column) and checks that it belongs to the journal and
    /// carries the row's seq, which must be `expected` when given (reads check contiguity).
    pub(crate) fn decode(
        &self,
        tenant_id: &str,
        session_id: &str,
        row: &SqliteRow,
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
        let text: &str = row.try_get("event").map_err(|err| {
            corrupted(EventReadError::Json(format!(
                "the row's event is not text: {err}"
            )))
        })?;
        let decoded = &self.inner.decoded;
        let event = match decoded.get(text) {
            Some(event) => event,
            None => {
                let event = std::sync::Arc::new(Event::from_json(text).map_err(corrupted)?);
                decoded.put(text, &event);
                event
            }
        };
        let invalid = |reason: String| {
            corrupted(EventReadError::Invalid {
                event_id: event.event_id.clone(),
                seq: event.seq,
                reason,
            })
        };
        if event.tenant_id != tenant_id || event.session_id != session_id {
            return Err(invalid(format!(
                "belongs to journal {}/{}",
                event.tenant_id, event.session_id
            )));
        }
        if event.seq != seq {
            return Err(invalid(format!("stored in the row of seq {seq}")));
        }
        if let Some(expected) = expected
            && seq != expected
        {
            return Err(invalid(format!("seq {seq} where {expected} was expected")));
        }
        Ok(std::sync::Arc::unwrap_or_clone(event))
    }

    async fn append_now(&self, batch: Vec<Event>, expected: u64) -> Result<Vec<Event>, StoreError> {
        let batch = match Batch::check(batch)? {
            Ok(batch) => batch,
            Err(empty) => return Ok(empty),
        };
        let mut rows = Vec::with_capacity(batch.len());
        for event in batch.events() {
            rows.push(Columns::of(event)?);
        }
        // Through the writer, in the next group commit (see the `writer` module). A group
        // nothing outside depends on is committed without waiting for the disk (WAL
        // `synchronous = NORMAL`: durable against a process crash, and on disk with the next
        // FULL commit, which syncs the whole WAL); every other commit is FULL.
        self.inner
            .writer
            .append(&self.inner.options, &self.inner.path, batch, rows, expected)
            .await
    }

    async fn read_now(
        &self,
        tenant_id: &str,
        session_id: &str,
        after: u64,
    ) -> Result<Vec<Event>, StoreError> {
        safe_id("tenant", tenant_id)?;
        safe_id("session", session_id)?;
        let rows = sqlx::query(
            "SELECT seq, event FROM events \
             WHERE tenant_id = ?1 AND session_id = ?2 AND seq > ?3 ORDER BY seq",
        )
        .bind(tenant_id)
        .bind(session_id)
        .bind(to_sql(after))
        .fetch_all(&mut *self.reader().await?)
        .await
        .map_err(|err| self.db_error(err))?;
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
        let row = sqlx::query(
            "SELECT seq, event FROM events \
             WHERE tenant_id = ?1 AND session_id = ?2 ORDER BY seq DESC LIMIT 1",
        )
        .bind(tenant_id)
        .bind(session_id)
        .fetch_optional(&mut *self.reader().await?)
        .await
        .map_err(|err| self.db_error(err))?;
        match row {
            Some(row) => Ok(self.decode(tenant_id, session_id, &row, None)?.seq),
            None => Ok(0),
        }
    }

    async fn delete_now(&self, tenant_id: &str, session_id: &str) -> Result<u64, StoreError> {
        safe_id("tenant", tenant_id)?;
        safe_id("session", session_id)?;
        let mut tx = self
            .pool()
            .begin_with(crate::store::BEGIN_FULL)
            .await
            .map_err(|err| self.db_error(err))?;
        // The journal, and the rows set aside from it.
        let deleted = async {
            let deleted =
                sqlx::query("DELETE FROM events WHERE tenant_id = ?1 AND session_id = ?2")
                    .bind(tenant_id)
                    .bind(session_id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
            sqlx::query("DELETE FROM set_aside WHERE tenant_id = ?1 AND session_id = ?2")
                .bind(tenant_id)
                .bind(session_id)
                .execute(&mut *tx)
                .await?;
            Ok::<u64, sqlx::Error>(deleted)
        }
        .await
        .map_err(|err| self.db_error(err));
        let deleted = match deleted {
            Ok(deleted) => deleted,
            Err(err) => {
                if let Err(undo) = tx.rollback().await {
                    warn!(path = %self.inner.path.display(), error = %undo, "rollback failed");
                }
                return Err(err);
            }
        };
        tx.commit().await.map_err(|err| self.db_error(err))?;
        // An erased journal leaves nothing of itself in memory either.
        self.inner.decoded.clear();
        if deleted > 0 {
            self.checkpoint().await;
        }
        Ok(deleted)
    }

    /// The session holding `run_id`'s `run.started`, by the run index (`events_run`): the row's
    /// columns were written from the event, so a row whose event no longer reads back is found.
    async fn find_run_now(
        &self,
        tenant_id: &str,
        run_id: &str,
    ) -> Result<Option<String>, StoreError> {
        safe_id("tenant", tenant_id)?;
        let row = sqlx::query(
            "SELECT session_id FROM events \
             WHERE tenant_id = ?1 AND run_id = ?2 AND type = 'run.started' \
             ORDER BY ingested DESC LIMIT 1",
        )
        .bind(tenant_id)
        .bind(run_id)
        .fetch_optional(self.pool())
        .await
        .map_err(|err| self.db_error(err))?;
        row.map(|row| row.try_get::<String, _>(0))
            .transpose()
            .map_err(|err| self.db_error(err))
    }

    async fn run_start_now(
        &self,
        tenant_id: &str,
        session_id: &str,
        run_id: &str,
    ) -> Result<Option<u64>, StoreError> {
        safe_id("tenant", tenant_id)?;
        let row = sqlx::query(
            "SELECT min(seq) FROM events WHERE tenant_id = ?1 AND run_id = ?2 AND session_id = ?3",
        )
        .bind(tenant_id)
        .bind(run_id)
        .bind(session_id)
        .fetch_one(&mut *self.reader().await?)
        .await
        .map_err(|err| self.db_error(err))?;
        let seq: Option<i64> = row.try_get(0).map_err(|err| self.db_error(err))?;
        Ok(seq.and_then(|seq| u64::try_from(seq).ok()))
    }

    /// The last event of `kind` before `before`, by the index `events_session_type`: one row
    /// read, and checked.
    async fn last_of_type_now(
        &self,
        tenant_id: &str,
        session_id: &str,
        kind: &str,
        before: u64,
    ) -> Result<Option<Event>, StoreError> {
        safe_id("tenant", tenant_id)?;
        safe_id("session", session_id)?;
        let row = sqlx::query(
            "SELECT seq, event FROM events INDEXED BY events_session_type \
             WHERE tenant_id = ?1 AND session_id = ?2 AND type = ?3 AND seq < ?4 \
             ORDER BY seq DESC LIMIT 1",
        )
        .bind(tenant_id)
        .bind(session_id)
        .bind(kind)
        .bind(to_sql(before))
        .fetch_optional(&mut *self.reader().await?)
        .await
        .map_err(|err| self.db_error(err))?;
        row.map(|row| self.decode(tenant_id, session_id, &row, None))
            .transpose()
    }

    /// Copies the WAL into the file and truncates it, so that erased rows do not linger in it.
    /// Best effort: a reader holding an older snapshot keeps the WAL until it finishes.
    async fn checkpoint(&self) {
        let result = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .fetch_one(self.pool())
            .await
            .and_then(|row| row.try_get::<i64, _>(0));
        match result {
            Ok(0) => {}
            Ok(_) => debug!(
                path = %self.inner.path.display(),
                "WAL checkpoint incomplete after a delete (a reader is active); SQLite finishes it later"
            ),
            Err(err) => warn!(
                path = %self.inner.path.display(),
                error = %err,
                "WAL checkpoint after a delete failed"
            ),
        }
    }
}

impl EventStore for SqliteStore {
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

    fn run_start<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(self.run_start_now(tenant_id, session_id, run_id))
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

    /// One query in write order on the file's indexes (see the `search` module).
    fn search<'a>(
        &'a self,
        filter: &'a EventFilter,
    ) -> BoxFuture<'a, Result<Option<Searched>, StoreError>> {
        Box::pin(self.search_now(filter))
    }

    /// The session list's query, filtered and cut (see the `search` module).
    fn recent_sessions<'a>(
        &'a self,
        tenant_id: &'a str,
        since: Option<DateTime<Utc>>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Option<RecentSessions>, StoreError>> {
        Box::pin(self.recent_sessions_now(tenant_id, since, limit))
    }
}

/// A connection lent to a read ([`SqliteStore::reader`]).
#[derive(Debug)]
pub(crate) enum Reader<'a> {
    /// The writer's, idle.
    Writer(MappedMutexGuard<'a, SqliteConnection>),
    /// One of the pool's.
    Pool(PoolConnection<Sqlite>),
}

impl std::ops::Deref for Reader<'_> {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        match self {
            Reader::Writer(conn) => conn,
            Reader::Pool(conn) => conn,
        }
    }
}

impl std::ops::DerefMut for Reader<'_> {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        match self {
            Reader::Writer(conn) => conn,
            Reader::Pool(conn) => conn,
        }
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
        Ok(Columns {
            ts: event.ts.to_rfc3339_opts(SecondsFormat::Micros, true),
            category: text(serde_json::to_value(event.category).map_err(unserializable)?),
            status: text(serde_json::to_value(event.status).map_err(unserializable)?),
            facets: serde_json::to_string(&event.facets).map_err(unserializable)?,
        })
    }
}

/// A serialized value as a text column holds it: a string as itself, anything else as JSON.
pub(crate) fn text(value: serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text,
        other => other.to_string(),
    }
}

/// Creates the directory of the database file `path` when missing.
fn create_parent(path: &Path) -> Result<(), StoreError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            path: dir.display().to_string(),
            source,
        })?;
    }
    Ok(())
}

/// How every connection to the file `path` is opened.
fn connect_options(path: &Path) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .foreign_keys(false)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(BUSY_TIMEOUT)
        .pragma("secure_delete", "ON")
        // Statement journals (a multi-row `INSERT` inside a transaction keeps one, to undo
        // itself alone) and sorts stay in memory instead of temporary files under /var/tmp.
        .pragma("temp_store", "MEMORY")
}

/// A seq or count as SQLite's signed integer (saturating: seqs never come near `i64::MAX`).
pub(crate) fn to_sql(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Wraps a database error with the file's path.
pub(crate) fn db_error(path: &Path, err: sqlx::Error) -> StoreError {
    let source = match err {
        sqlx::Error::Io(source) => source,
        other => io::Error::other(other),
    };
    StoreError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Sets the file up on a connection of its own, closed afterwards (for [`SqliteStore::open`],
/// whose runtime ends with it).
async fn set_up(options: SqliteConnectOptions, path: &Path) -> Result<(), StoreError> {
    let mut conn = SqliteConnection::connect_with(&options)
        .await
        .map_err(|err| db_error(path, err))?;
    let result = set_up_on(&mut conn, path).await;
    if let Err(err) = conn.close().await {
        debug!(path = %path.display(), error = %err, "closing the setup connection failed");
    }
    result
}

/// Whether the file already holds this build's schema, in one read: its version, every table
/// and index this build creates, the idempotency table's later columns, and none of the dropped
/// indexes. Most opens find it so, and then take no write lock at all (a short-lived `loom run`
/// opens the file once per process).
async fn schema_is_current(conn: &mut SqliteConnection) -> Result<bool, sqlx::Error> {
    let names: Vec<&str> = created().filter_map(created_name).collect();
    let dropped: Vec<&str> = DROPPED_INDEXES
        .iter()
        .filter_map(|sql| sql.rsplit(' ').next())
        .collect();
    let quoted = |names: &[&str]| {
        names
            .iter()
            .map(|name| format!("'{name}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let columns: Vec<&str> = IDEMPOTENCY_COLUMNS.iter().map(|(name, _)| *name).collect();
    let sql = format!(
        "SELECT (SELECT user_version FROM pragma_user_version), \
                (SELECT count(*) FROM sqlite_master WHERE name IN ({})), \
                (SELECT count(*) FROM sqlite_master WHERE name IN ({})), \
                (SELECT count(*) FROM pragma_table_info('idempotency') WHERE name IN ({}))",
        quoted(&names),
        quoted(&dropped),
        quoted(&columns),
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_one(&mut *conn)
        .await?;
    let count = |i: usize| row.try_get::<i64, _>(i);
    Ok(count(0)? == SCHEMA_VERSION
        && usize::try_from(count(1)?) == Ok(names.len())
        && count(2)? == 0
        && usize::try_from(count(3)?) == Ok(columns.len()))
}

/// Every `CREATE` statement of the schema.
fn created() -> impl Iterator<Item = &'static str> {
    SCHEMA
        .iter()
        .copied()
        .chain([
            IDEMPOTENCY_SCHEMA,
            IDEMPOTENCY_INDEX,
            SET_ASIDE_SCHEMA,
            SESSION_TYPE_INDEX,
        ])
        .chain(SEARCH_INDEXES.iter().copied())
}

/// The name a `CREATE … IF NOT EXISTS <name> …` statement creates.
fn created_name(sql: &str) -> Option<&str> {
    let (_, rest) = sql.split_once("IF NOT EXISTS ")?;
    rest.split_whitespace().next()
}

/// Sets the file up through `conn`: WAL mode, then the schema, under the write lock (unless the
/// file already holds it).
async fn set_up_on(conn: &mut SqliteConnection, path: &Path) -> Result<(), StoreError> {
    {
        use_wal(conn, path).await?;
        if schema_is_current(conn)
            .await
            .map_err(|err| db_error(path, err))?
        {
            return Ok(());
        }
        let mut tx = conn
            .begin_with(crate::store::BEGIN_FULL)
            .await
            .map_err(|err| db_error(path, err))?;
        let version: i64 = sqlx::query("PRAGMA user_version")
            .fetch_one(&mut *tx)
            .await
            .and_then(|row| row.try_get(0))
            .map_err(|err| db_error(path, err))?;
        match version {
            0 => {
                for statement in SCHEMA {
                    sqlx::query(*statement)
                        .execute(&mut *tx)
                        .await
                        .map_err(|err| db_error(path, err))?;
                }
                sqlx::query("PRAGMA user_version = 1")
                    .execute(&mut *tx)
                    .await
                    .map_err(|err| db_error(path, err))?;
            }
            SCHEMA_VERSION => {}
            newer => {
                return Err(StoreError::Invalid(format!(
                    "{} holds journal schema version {newer}; this build reads version \
                     {SCHEMA_VERSION}",
                    path.display()
                )));
            }
        }
        sqlx::query(IDEMPOTENCY_SCHEMA)
            .execute(&mut *tx)
            .await
            .map_err(|err| db_error(path, err))?;
        let columns: Vec<String> = sqlx::query("SELECT name FROM pragma_table_info('idempotency')")
            .fetch_all(&mut *tx)
            .await
            .map_err(|err| db_error(path, err))?
            .iter()
            .map(|row| row.try_get::<String, _>(0))
            .collect::<Result<_, _>>()
            .map_err(|err| db_error(path, err))?;
        for (column, add) in IDEMPOTENCY_COLUMNS {
            if !columns.iter().any(|name| name == column) {
                sqlx::query(*add)
                    .execute(&mut *tx)
                    .await
                    .map_err(|err| db_error(path, err))?;
            }
        }
        sqlx::query(IDEMPOTENCY_INDEX)
            .execute(&mut *tx)
            .await
            .map_err(|err| db_error(path, err))?;
        sqlx::query(SET_ASIDE_SCHEMA)
            .execute(&mut *tx)
            .await
            .map_err(|err| db_error(path, err))?;
        for index in std::iter::once(&SESSION_TYPE_INDEX)
            .chain(SEARCH_INDEXES)
            .chain(DROPPED_INDEXES)
        {
            sqlx::query(*index)
                .execute(&mut *tx)
                .await
                .map_err(|err| db_error(path, err))?;
        }
        tx.commit().await.map_err(|err| db_error(path, err))
    }
}

/// Switches the file to WAL (a persistent setting). The switch needs the file to itself and
/// does not wait on the busy timeout, so it is retried while another process holds the file.
async fn use_wal(conn: &mut SqliteConnection, path: &Path) -> Result<(), StoreError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mode = sqlx::query("PRAGMA journal_mode = WAL")
            .fetch_one(&mut *conn)
            .await
            .and_then(|row| row.try_get::<String, _>(0));
        match mode {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => return Ok(()),
            Ok(mode) => {
                return Err(StoreError::Io {
                    path: path.display().to_string(),
                    source: io::Error::other(format!(
                        "SQLite cannot use WAL on this file (journal mode stays {mode:?})"
                    )),
                });
            }
            Err(err) if attempt >= WAL_ATTEMPTS => return Err(db_error(path, err)),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    impl SqliteStore {
        /// The append writer.
        pub(crate) fn writer(&self) -> &Writer {
            &self.inner.writer
        }
    }

    async fn pragma(conn: &mut SqliteConnection, sql: &'static str) -> String {
        let row = sqlx::query(sql).fetch_one(&mut *conn).await.unwrap();
        row.try_get::<String, _>(0)
            .or_else(|_| row.try_get::<i64, _>(0).map(|n| n.to_string()))
            .unwrap()
    }

    #[tokio::test]
    async fn connections_are_durable_erase_securely_and_wait_for_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("loom.db")).unwrap();
        let mut conn = store.pool().acquire().await.unwrap();
        assert_eq!(pragma(&mut conn, "PRAGMA journal_mode").await, "wal");
        // FULL
        assert_eq!(pragma(&mut conn, "PRAGMA synchronous").await, "2");
        assert_eq!(pragma(&mut conn, "PRAGMA secure_delete").await, "1");
        // MEMORY
        assert_eq!(pragma(&mut conn, "PRAGMA temp_store").await, "2");
        assert_eq!(pragma(&mut conn, "PRAGMA busy_timeout").await, "30000");
        assert_eq!(pragma(&mut conn, "PRAGMA user_version").await, "1");
    }

    /// A store connected in a runtime reads on the writer's connection while no append needs
    /// it (one connection in all), and on the pool's while one does.
    #[tokio::test]
    async fn reads_borrow_the_idle_writer_and_the_pool_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::connect(dir.path().join("loom.db"))
            .await
            .unwrap();
        let claim = loom_testkit::conformance::event("t", "s", "a");
        store.append_now(vec![claim], 0).await.unwrap();
        assert_eq!(store.read_now("t", "s", 0).await.unwrap().len(), 1);
        assert_eq!(store.last_seq_now("t", "s").await.unwrap(), 1);
        assert_eq!(store.pool().size(), 0);
        let busy = store.inner.writer.idle().unwrap();
        assert_eq!(store.read_now("t", "s", 0).await.unwrap().len(), 1);
        assert_eq!(store.pool().size(), 1);
        drop(busy);
    }

    /// A row read again is cloned from the events decoded last only while its text is the
    /// same: a row rewritten behind the store's back reads as it now is, and an erased journal
    /// leaves nothing kept.
    #[tokio::test]
    async fn a_row_read_again_is_decoded_again_once_its_text_changed() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("loom.db")).unwrap();
        let claim = loom_testkit::conformance::event("t", "s", "a");
        store.append_now(vec![claim], 0).await.unwrap();
        let first = store.read_now("t", "s", 0).await.unwrap();
        assert_eq!(store.read_now("t", "s", 0).await.unwrap(), first);
        let mut changed = first[0].clone();
        changed.event_id = "rewritten".into();
        sqlx::query("UPDATE events SET event = ?1 WHERE seq = 1")
            .bind(changed.to_json())
            .execute(store.pool())
            .await
            .unwrap();
        assert_eq!(
            store.read_now("t", "s", 0).await.unwrap(),
            vec![changed.clone()]
        );
        let kept = || store.inner.decoded.get(&changed.to_json());
        assert!(kept().is_some());
        store.delete_now("t", "s").await.unwrap();
        assert!(kept().is_none());
    }

    #[test]
    fn every_created_object_is_named() {
        let names: Vec<&str> = created().filter_map(created_name).collect();
        assert_eq!(names.len(), created().count());
        assert!(names.contains(&"events") && names.contains(&"events_tenant_type"));
    }

    /// A file set up is found current (the next open takes no write lock); one missing an index
    /// or holding a dropped one is not, and is set up again.
    #[tokio::test]
    async fn only_a_file_missing_part_of_the_schema_is_set_up_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("loom.db");
        let store = SqliteStore::open(&path).unwrap();
        let mut conn = store.pool().acquire().await.unwrap();
        assert!(schema_is_current(&mut conn).await.unwrap());
        for change in [
            "DROP INDEX events_tenant_type",
            "CREATE INDEX events_type ON events (tenant_id, type)",
            "PRAGMA user_version = 0",
        ] {
            sqlx::query(change).execute(&mut *conn).await.unwrap();
            assert!(!schema_is_current(&mut conn).await.unwrap(), "{change}");
            set_up_on(&mut conn, &path).await.unwrap();
            assert!(schema_is_current(&mut conn).await.unwrap(), "{change}");
        }
    }

    #[tokio::test]
    async fn each_write_transaction_sets_its_own_sync_level() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("loom.db")).unwrap();
        let mut conn = store.pool().acquire().await.unwrap();
        for (begin, level) in [(BEGIN_NORMAL, "1"), (BEGIN_FULL, "2"), (BEGIN_NORMAL, "1")] {
            let mut tx = conn.begin_with(begin).await.unwrap();
            assert_eq!(
                pragma(&mut tx, "PRAGMA synchronous").await,
                level,
                "{begin}"
            );
            tx.commit().await.unwrap();
        }
        drop(conn);
        // A claim (nothing outside depends on it) is appended NORMAL, a run's start FULL; both
        // read back.
        let claim = loom_testkit::conformance::event("t", "s", "a");
        assert!(!loom_core::event::must_sync(std::slice::from_ref(&claim)));
        store.append_now(vec![claim], 0).await.unwrap();
        let started = loom_testkit::conformance::started("t", "s", "s", Default::default());
        assert!(loom_core::event::must_sync(std::slice::from_ref(&started)));
        store.append_now(vec![started], 1).await.unwrap();
        assert_eq!(store.read_now("t", "s", 0).await.unwrap().len(), 2);
    }
}
