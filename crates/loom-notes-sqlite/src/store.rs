//! [`SqliteStore`]: the [`NoteStore`] on one SQLite file, with the vector cache.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use loom_notes_core::ids::chunk_point_id;
use loom_notes_core::scoring::{self, VectorRow};
use loom_notes_core::{
    ChunkFilter, ChunkPayload, Document, IndexMeta, IndexedChunk, NoteStore, ScoredChunk,
    SparseVector, StoreError,
};
use sqlx::sqlite::{SqlitePool, SqlitePoolOptions};
use sqlx::{Row, Sqlite, Transaction};
use tokio::sync::Mutex;

use crate::codec::{
    CHUNK_COLUMNS, DOCUMENT_COLUMNS, corrupted, db_error, document, f32_blob, kind_name, tags_json,
    u32_blob, vector_row,
};
use crate::schema::{BUSY_TIMEOUT, DB_FILE, connect_options, migrate};

/// Connections of the pool (each one SQLite connection on its own thread).
const MAX_CONNECTIONS: u32 = 4;

/// The in-memory copy of every chunk's vectors and payload, in write order.
#[derive(Debug, Default)]
struct Cache {
    /// The file's generation the copy reflects; `None` before the first load.
    generation: Option<i64>,
    rows: Arc<Vec<VectorRow>>,
}

/// A write's effect on the cache, applied when the cache was current before the write.
enum Change<'a> {
    Put(&'a Document, &'a [IndexedChunk]),
    Delete(&'a str),
    Clear,
}

/// The store on `DATA_DIR/notes.sqlite`. Several stores (in one process or several) can open
/// the same directory; each sees the others' writes at its next read.
#[derive(Debug)]
pub struct SqliteStore {
    path: PathBuf,
    location: String,
    pool: SqlitePool,
    cache: Mutex<Cache>,
    loads: AtomicU64,
}

impl SqliteStore {
    /// Opens (creating the directory and the file if needed) `data_dir/notes.sqlite`, in WAL
    /// mode, and applies the schema migrations.
    pub async fn open(data_dir: &Path) -> Result<SqliteStore, StoreError> {
        let path = data_dir.join(DB_FILE);
        let location = path.display().to_string();
        std::fs::create_dir_all(data_dir).map_err(|err| StoreError::Database {
            location: data_dir.display().to_string(),
            source: Box::new(err),
        })?;
        // Switching a new file to WAL needs it to itself and does not wait on the busy
        // timeout: when another process creates the file at the same moment, the first
        // connection is refused as busy, and is tried again.
        let mut attempt = 0;
        let pool = loop {
            attempt += 1;
            let opened = SqlitePoolOptions::new()
                .max_connections(MAX_CONNECTIONS)
                .min_connections(0)
                .idle_timeout(Some(Duration::from_secs(60)))
                .acquire_timeout(BUSY_TIMEOUT + Duration::from_secs(5))
                .connect_with(connect_options(&path))
                .await;
            match opened {
                Ok(pool) => break pool,
                Err(err) if attempt < WAL_ATTEMPTS && is_busy(&err) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(err) => return Err(db_error(&location, err)),
            }
        };
        migrate(&pool, &location).await?;
        tracing::debug!(file = %location, "notes store opened");
        Ok(SqliteStore {
            path,
            location,
            pool,
            cache: Mutex::new(Cache::default()),
            loads: AtomicU64::new(0),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many times the vector cache was loaded from the file (diagnostics: it reloads only
    /// after another connection wrote).
    pub fn cache_loads(&self) -> u64 {
        self.loads.load(Ordering::Relaxed)
    }

    /// Closes the connections; the store must not be used afterwards.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    fn db(&self) -> impl Fn(sqlx::Error) -> StoreError + '_ {
        |err| db_error(&self.location, err)
    }

    async fn generation(&self) -> Result<i64, StoreError> {
        let row = sqlx::query("SELECT value FROM meta WHERE key = 'generation'")
            .fetch_optional(&self.pool)
            .await
            .map_err(self.db())?;
        self.parse_generation(row.as_ref())
    }

    fn parse_generation(&self, row: Option<&sqlx::sqlite::SqliteRow>) -> Result<i64, StoreError> {
        let Some(row) = row else {
            return Ok(0);
        };
        let value: String = row.try_get(0).map_err(self.db())?;
        value.parse().map_err(|_| {
            corrupted(
                &self.location,
                "meta generation".to_owned(),
                format!("{value:?}"),
            )
        })
    }

    /// The chunks as of the file's current generation, reloaded when another connection wrote.
    async fn rows(&self) -> Result<Arc<Vec<VectorRow>>, StoreError> {
        let current = self.generation().await?;
        let mut cache = self.cache.lock().await;
        if cache.generation != Some(current) {
            let (generation, rows) = self.load().await?;
            cache.generation = Some(generation);
            cache.rows = Arc::new(rows);
        }
        Ok(Arc::clone(&cache.rows))
    }

    /// Every chunk and the generation they belong to, read in one snapshot.
    async fn load(&self) -> Result<(i64, Vec<VectorRow>), StoreError> {
        let mut tx = self.pool.begin().await.map_err(self.db())?;
        let row = sqlx::query("SELECT value FROM meta WHERE key = 'generation'")
            .fetch_optional(&mut *tx)
            .await
            .map_err(self.db())?;
        let generation = self.parse_generation(row.as_ref())?;
        let select = format!("SELECT {CHUNK_COLUMNS} FROM chunks ORDER BY seq");
        let rows = sqlx::query(sqlx::AssertSqlSafe(select))
            .fetch_all(&mut *tx)
            .await
            .map_err(self.db())?;
        tx.commit().await.map_err(self.db())?;
        let rows = rows
            .iter()
            .map(|row| vector_row(&self.location, row))
            .collect::<Result<Vec<_>, _>>()?;
        self.loads.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(chunks = rows.len(), generation, "vector cache loaded");
        Ok((generation, rows))
    }

    /// Starts a write: a `BEGIN IMMEDIATE` transaction (writers of every process take turns)
    /// and the generation before it.
    async fn begin_write(&self) -> Result<(Transaction<'static, Sqlite>, i64), StoreError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(self.db())?;
        let row = sqlx::query("SELECT value FROM meta WHERE key = 'generation'")
            .fetch_optional(&mut *tx)
            .await
            .map_err(self.db())?;
        let before = self.parse_generation(row.as_ref())?;
        Ok((tx, before))
    }

    /// Ends a write: bumps the generation and commits, then applies `change` to the cache if it
    /// was current before the write (else the next search reloads it).
    async fn commit_write(
        &self,
        mut tx: Transaction<'static, Sqlite>,
        before: i64,
        change: Change<'_>,
    ) -> Result<(), StoreError> {
        sqlx::query("INSERT OR REPLACE INTO meta (key, value) VALUES ('generation', ?1)")
            .bind((before + 1).to_string())
            .execute(&mut *tx)
            .await
            .map_err(self.db())?;
        tx.commit().await.map_err(self.db())?;
        let mut cache = self.cache.lock().await;
        if cache.generation != Some(before) {
            return Ok(());
        }
        let rows = Arc::make_mut(&mut cache.rows);
        match change {
            Change::Put(doc, chunks) => {
                rows.retain(|row| row.payload.doc_id != doc.doc_id);
                rows.extend(chunks.iter().map(|indexed| VectorRow {
                    payload: ChunkPayload::new(doc, &indexed.chunk),
                    dense: scoring::unit(&indexed.embedding.dense),
                    sparse: indexed.embedding.sparse.clone(),
                }));
            }
            Change::Delete(doc_id) => rows.retain(|row| row.payload.doc_id != doc_id),
            Change::Clear => rows.clear(),
        }
        cache.generation = Some(before + 1);
        Ok(())
    }

    async fn find_one(
        &self,
        sql: &'static str,
        value: &str,
    ) -> Result<Option<Document>, StoreError> {
        let row = sqlx::query(sql)
            .bind(value)
            .fetch_optional(&self.pool)
            .await
            .map_err(self.db())?;
        row.map(|row| document(&self.location, &row)).transpose()
    }
}

/// Inserts or updates `doc` (an update keeps its `seq`, its insertion position) and replaces its
/// chunks.
async fn put_rows(
    tx: &mut Transaction<'static, Sqlite>,
    doc: &Document,
    chunks: &[IndexedChunk],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO documents (doc_id, title, project, tags, source_kind, source, added_at,
                                updated_at, content_hash, text)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT (doc_id) DO UPDATE SET
            title = excluded.title, project = excluded.project, tags = excluded.tags,
            source_kind = excluded.source_kind, source = excluded.source,
            added_at = excluded.added_at, updated_at = excluded.updated_at,
            content_hash = excluded.content_hash, text = excluded.text",
    )
    .bind(&doc.doc_id)
    .bind(&doc.title)
    .bind(&doc.project)
    .bind(tags_json(&doc.tags))
    .bind(kind_name(doc.source_kind))
    .bind(&doc.source)
    .bind(&doc.added_at)
    .bind(&doc.updated_at)
    .bind(&doc.content_hash)
    .bind(&doc.text)
    .execute(&mut **tx)
    .await?;
    sqlx::query("DELETE FROM chunks WHERE doc_id = ?1")
        .bind(&doc.doc_id)
        .execute(&mut **tx)
        .await?;
    let tags = tags_json(&doc.tags);
    for indexed in chunks {
        let chunk = &indexed.chunk;
        let sparse = &indexed.embedding.sparse;
        sqlx::query(
            "INSERT INTO chunks (doc_id, idx, point_id, heading_path, text, title, project, tags,
                                 source, added_at, dense, sparse_indices, sparse_values)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
        )
        .bind(&doc.doc_id)
        .bind(i64::try_from(chunk.index).unwrap_or(i64::MAX))
        .bind(chunk_point_id(&doc.doc_id, chunk.index))
        .bind(&chunk.heading_path)
        .bind(&chunk.text)
        .bind(&doc.title)
        .bind(&doc.project)
        .bind(&tags)
        .bind(&doc.source)
        .bind(&doc.added_at)
        .bind(f32_blob(&indexed.embedding.dense))
        .bind(u32_blob(&sparse.indices))
        .bind(f32_blob(&sparse.values))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

#[async_trait]
impl NoteStore for SqliteStore {
    async fn meta(&self) -> Result<Option<IndexMeta>, StoreError> {
        let row = sqlx::query("SELECT value FROM meta WHERE key = 'index'")
            .fetch_optional(&self.pool)
            .await
            .map_err(self.db())?;
        let Some(row) = row else {
            return Ok(None);
        };
        let json: String = row.try_get(0).map_err(self.db())?;
        serde_json::from_str(&json)
            .map(Some)
            .map_err(|err| corrupted(&self.location, "index meta".to_owned(), err))
    }

    async fn set_meta(&self, meta: &IndexMeta) -> Result<(), StoreError> {
        let json = serde_json::json!({
            "dense_model": meta.dense_model,
            "dense_dim": meta.dense_dim,
            "indexed_at": meta.indexed_at,
        })
        .to_string();
        sqlx::query("INSERT OR REPLACE INTO meta (key, value) VALUES ('index', ?1)")
            .bind(json)
            .execute(&self.pool)
            .await
            .map_err(self.db())?;
        Ok(())
    }

    async fn get(&self, doc_id: &str) -> Result<Option<Document>, StoreError> {
        const SQL: &str = "SELECT doc_id, title, project, tags, source_kind, source, added_at, \
                           updated_at, content_hash, text FROM documents WHERE doc_id = ?1";
        self.find_one(SQL, doc_id).await
    }

    async fn find_by_source(&self, source: &str) -> Result<Option<Document>, StoreError> {
        const SQL: &str = "SELECT doc_id, title, project, tags, source_kind, source, added_at, \
                           updated_at, content_hash, text FROM documents WHERE source = ?1 \
                           ORDER BY seq LIMIT 1";
        self.find_one(SQL, source).await
    }

    async fn find_by_hash(&self, hash: &str) -> Result<Option<Document>, StoreError> {
        const SQL: &str = "SELECT doc_id, title, project, tags, source_kind, source, added_at, \
                           updated_at, content_hash, text FROM documents \
                           WHERE content_hash = ?1 ORDER BY seq LIMIT 1";
        self.find_one(SQL, hash).await
    }

    async fn put(&self, doc: &Document, chunks: &[IndexedChunk]) -> Result<(), StoreError> {
        let (mut tx, before) = self.begin_write().await?;
        put_rows(&mut tx, doc, chunks).await.map_err(self.db())?;
        self.commit_write(tx, before, Change::Put(doc, chunks))
            .await
    }

    async fn delete(&self, doc_id: &str) -> Result<bool, StoreError> {
        let (mut tx, before) = self.begin_write().await?;
        sqlx::query("DELETE FROM chunks WHERE doc_id = ?1")
            .bind(doc_id)
            .execute(&mut *tx)
            .await
            .map_err(self.db())?;
        let done = sqlx::query("DELETE FROM documents WHERE doc_id = ?1")
            .bind(doc_id)
            .execute(&mut *tx)
            .await
            .map_err(self.db())?;
        self.commit_write(tx, before, Change::Delete(doc_id))
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn list(&self, project: Option<&str>, limit: usize) -> Result<Vec<Document>, StoreError> {
        let sql = format!(
            "SELECT {DOCUMENT_COLUMNS} FROM documents WHERE (?1 IS NULL OR project = ?1) \
             ORDER BY added_at DESC, seq LIMIT ?2"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(project)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(self.db())?;
        rows.iter()
            .map(|row| document(&self.location, row))
            .collect()
    }

    async fn projects(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        let rows = sqlx::query("SELECT project, COUNT(*) FROM documents GROUP BY project")
            .fetch_all(&self.pool)
            .await
            .map_err(self.db())?;
        let mut counts = BTreeMap::new();
        for row in rows {
            let project: String = row.try_get(0).map_err(self.db())?;
            let count: i64 = row.try_get(1).map_err(self.db())?;
            counts.insert(project, u64::try_from(count).unwrap_or(0));
        }
        Ok(counts)
    }

    async fn documents(&self) -> Result<Vec<Document>, StoreError> {
        let sql = format!("SELECT {DOCUMENT_COLUMNS} FROM documents ORDER BY seq");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await
            .map_err(self.db())?;
        rows.iter()
            .map(|row| document(&self.location, row))
            .collect()
    }

    async fn dense_top(
        &self,
        query: &[f32],
        filter: &ChunkFilter,
        limit: usize,
    ) -> Result<Vec<ScoredChunk>, StoreError> {
        let rows = self.rows().await?;
        let (query, filter) = (query.to_vec(), filter.clone());
        tokio::task::spawn_blocking(move || scoring::dense_top(&rows, &query, &filter, limit))
            .await
            .map_err(|err| db_error_task(&self.location, err))
    }

    async fn sparse_top(
        &self,
        query: &SparseVector,
        filter: &ChunkFilter,
        limit: usize,
    ) -> Result<Vec<ScoredChunk>, StoreError> {
        let rows = self.rows().await?;
        let (query, filter) = (query.clone(), filter.clone());
        tokio::task::spawn_blocking(move || scoring::sparse_top(&rows, &query, &filter, limit))
            .await
            .map_err(|err| db_error_task(&self.location, err))
    }

    async fn clear_chunks(&self) -> Result<(), StoreError> {
        let (mut tx, before) = self.begin_write().await?;
        sqlx::query("DELETE FROM chunks")
            .execute(&mut *tx)
            .await
            .map_err(self.db())?;
        self.commit_write(tx, before, Change::Clear).await
    }
}

/// How many times opening a new file is tried while another process switches it to WAL
/// (50 ms apart).
const WAL_ATTEMPTS: u32 = 100;

/// Whether SQLite refused because another connection holds the file (`SQLITE_BUSY`,
/// `SQLITE_LOCKED` and their extended codes), classified by the error's code.
fn is_busy(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => {
            matches!(
                db.code().as_deref(),
                Some("5" | "6" | "261" | "262" | "517")
            )
        }
        _ => false,
    }
}

/// The scoring task failed (it panicked or the runtime is shutting down).
fn db_error_task(location: &str, err: tokio::task::JoinError) -> StoreError {
    StoreError::Database {
        location: location.to_owned(),
        source: Box::new(err),
    }
}
