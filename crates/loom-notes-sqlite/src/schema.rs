//! The file, its connection settings and its schema migrations.

use std::path::Path;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqliteSynchronous};
use sqlx::{AssertSqlSafe, Row};

use loom_notes_core::StoreError;

/// The database file's name inside the data directory.
pub const DB_FILE: &str = "notes.sqlite";

/// The schema version this build writes and reads, kept in `PRAGMA user_version`.
pub const SCHEMA_VERSION: i64 = 1;

/// How long a writer waits for another process to release the file's write lock.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// The statements taking the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&[&str]] = &[&[
    // `seq` is the insertion order (an upsert keeps it); the other columns are `Document`'s.
    "CREATE TABLE documents (
        seq          INTEGER PRIMARY KEY,
        doc_id       TEXT NOT NULL UNIQUE,
        title        TEXT NOT NULL,
        project      TEXT NOT NULL,
        tags         TEXT NOT NULL,
        source_kind  TEXT NOT NULL,
        source       TEXT,
        added_at     TEXT NOT NULL,
        updated_at   TEXT,
        content_hash TEXT NOT NULL,
        text         TEXT NOT NULL
    )",
    "CREATE INDEX documents_source ON documents (source)",
    "CREATE INDEX documents_hash ON documents (content_hash)",
    "CREATE INDEX documents_project ON documents (project, added_at)",
    // `seq` is the write order; title..added_at are copies of the document's payload; vectors
    // are little-endian: dense f32s, sparse u32 indices and f32 values.
    "CREATE TABLE chunks (
        seq            INTEGER PRIMARY KEY,
        doc_id         TEXT NOT NULL,
        idx            INTEGER NOT NULL,
        point_id       TEXT NOT NULL,
        heading_path   TEXT NOT NULL,
        text           TEXT NOT NULL,
        title          TEXT NOT NULL,
        project        TEXT NOT NULL,
        tags           TEXT NOT NULL,
        source         TEXT,
        added_at       TEXT NOT NULL,
        dense          BLOB NOT NULL,
        sparse_indices BLOB NOT NULL,
        sparse_values  BLOB NOT NULL,
        UNIQUE (doc_id, idx)
    )",
    "CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )",
    "INSERT INTO meta (key, value) VALUES ('generation', '0')",
]];

/// How every connection to `path` is opened: WAL (readers never block the writer), a busy
/// timeout (writers of two processes wait for each other), `NORMAL` sync (durable in WAL at
/// checkpoints, safe against corruption).
pub(crate) fn connect_options(path: &Path) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(BUSY_TIMEOUT)
        .foreign_keys(false)
}

/// Applies the missing migrations in one `BEGIN IMMEDIATE` transaction (two processes opening
/// a new file at once: the second waits, then finds the schema current).
pub(crate) async fn migrate(pool: &SqlitePool, location: &str) -> Result<(), StoreError> {
    let db = |err: sqlx::Error| crate::codec::db_error(location, err);
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(db)?;
    let version: i64 = sqlx::query("PRAGMA user_version")
        .fetch_one(&mut *tx)
        .await
        .and_then(|row| row.try_get(0))
        .map_err(db)?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::Corrupted {
            location: location.to_owned(),
            what: "schema".to_owned(),
            detail: format!(
                "version {version} was written by a newer loom-notes (this one reads {SCHEMA_VERSION})"
            ),
        });
    }
    let start = usize::try_from(version.max(0)).unwrap_or(0);
    for (i, statements) in MIGRATIONS.iter().enumerate().skip(start) {
        for statement in *statements {
            sqlx::query(*statement)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        tracing::info!(file = location, version = i + 1, "notes schema migrated");
    }
    sqlx::query(AssertSqlSafe(format!(
        "PRAGMA user_version = {SCHEMA_VERSION}"
    )))
    .execute(&mut *tx)
    .await
    .map_err(db)?;
    tx.commit().await.map_err(db)
}
