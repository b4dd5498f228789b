//! loom-notes' store on SQLite: `DATA_DIR/notes.sqlite` holds the documents (the source of
//! truth), their chunks with dense and sparse vectors, and a meta table (the index's model and a
//! write generation).
//!
//! Search is exact brute force in Rust over an in-memory copy of the chunks' vectors
//! (reference C.3), refreshed only when the file changed: every write bumps a generation
//! counter in the meta table inside its transaction; a search compares it with the copy's and
//! reloads when another connection (another process: the CLI while the server runs) wrote. The
//! store's own writes update the copy in place.
//!
//! The file is in WAL mode with a busy timeout, so the CLI and the MCP server can use one data
//! directory at the same time; writes are serialized by `BEGIN IMMEDIATE` transactions.

mod codec;
mod schema;
mod store;

use std::path::Path;
use std::sync::Arc;

use loom_notes_core::{Embedder, MemoryService, Reranker, Settings, StoreError};

pub use schema::{DB_FILE, SCHEMA_VERSION};
pub use store::SqliteStore;

/// A service over `SqliteStore::open(data_dir)` with these models.
pub async fn open_service(
    data_dir: &Path,
    embedder: Arc<dyn Embedder>,
    reranker: Arc<dyn Reranker>,
    settings: Settings,
) -> Result<MemoryService, StoreError> {
    let store = SqliteStore::open(data_dir).await?;
    Ok(MemoryService::new(
        embedder,
        reranker,
        Arc::new(store),
        settings,
    ))
}

/// A service over `SqliteStore::open(data_dir)` with the fake models (tests, `--fake`).
pub async fn open_fake_service(
    data_dir: &Path,
    settings: Settings,
) -> Result<MemoryService, StoreError> {
    let store = SqliteStore::open(data_dir).await?;
    Ok(MemoryService::with_fake_models(Arc::new(store), settings))
}
