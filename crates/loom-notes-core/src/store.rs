//! The store port: documents (the source of truth) and their embedded chunks, with the two
//! candidate searches of the pipeline (dense and sparse top-N under a payload filter).
//!
//! Implementations: `loom-notes-sqlite` (SQLite, brute-force scoring in Rust). The trait is
//! object-safe; the service holds an `Arc<dyn NoteStore>`.

use std::collections::BTreeMap;
use std::fmt::Debug;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::model::{Chunk, Document};
use crate::ports::{Embedding, SparseVector};

/// The model an index was built with (the Python version's `meta.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexMeta {
    /// The embedder's name (`fake-64`, `BAAI/bge-m3`).
    pub dense_model: String,
    /// The dense dimension.
    pub dense_dim: usize,
    /// When the index was created or last rebuilt (ISO-8601 UTC).
    pub indexed_at: String,
}

/// What a chunk carries besides its vectors (the Python `memory` collection's payload): its
/// document's title, project, tags, source and `added_at` are copies, so a hit needs no lookup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkPayload {
    /// The document.
    pub doc_id: String,
    /// The chunk's position in it.
    pub index: usize,
    /// `Title > Section`.
    pub heading_path: String,
    /// The chunk's text.
    pub text: String,
    /// The document's title.
    pub title: String,
    /// The document's project.
    pub project: String,
    /// The document's tags.
    pub tags: Vec<String>,
    /// The document's source.
    pub source: Option<String>,
    /// The document's `added_at`.
    pub added_at: String,
}

impl ChunkPayload {
    /// The payload of `chunk`, a chunk of `doc`.
    pub fn new(doc: &Document, chunk: &Chunk) -> Self {
        ChunkPayload {
            doc_id: doc.doc_id.clone(),
            index: chunk.index,
            heading_path: chunk.heading_path.clone(),
            text: chunk.text.clone(),
            title: doc.title.clone(),
            project: doc.project.clone(),
            tags: doc.tags.clone(),
            source: doc.source.clone(),
            added_at: doc.added_at.clone(),
        }
    }
}

/// A chunk ready to be stored: the chunk and its embedding.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexedChunk {
    /// The chunk.
    pub chunk: Chunk,
    /// Its vectors.
    pub embedding: Embedding,
}

/// A candidate of one search branch.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoredChunk {
    /// The chunk and its payload.
    pub chunk: ChunkPayload,
    /// Cosine similarity (dense) or dot product (sparse).
    pub score: f32,
}

/// Which chunks a search considers: the project, if given, must be equal, and every tag must be
/// among the chunk's tags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChunkFilter {
    /// The project (already cleaned), or any.
    pub project: Option<String>,
    /// Tags that must all be present (already cleaned).
    pub tags: Vec<String>,
}

impl ChunkFilter {
    /// Whether a chunk of `project` with `tags` passes.
    pub fn matches(&self, project: &str, tags: &[String]) -> bool {
        self.project.as_deref().is_none_or(|p| p == project)
            && self.tags.iter().all(|t| tags.contains(t))
    }
}

/// The store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened, read or written.
    #[error("store {location}: {source}")]
    Database {
        /// The file or the store's name.
        location: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Something stored cannot be read back (bad JSON, a vector of the wrong length).
    #[error("store {location}: corrupted {what}: {detail}")]
    Corrupted {
        /// The file or the store's name.
        location: String,
        /// What is corrupted (`document 1e09…`, `chunk 1e09…:3`).
        what: String,
        /// Why.
        detail: String,
    },
}

/// The store port. Reads see every write made before them, including other processes' writes on
/// the same data (the CLI and the server share one data directory).
#[async_trait]
pub trait NoteStore: Send + Sync + Debug {
    /// The model the index was built with, `None` before the first start.
    async fn meta(&self) -> Result<Option<IndexMeta>, StoreError>;
    /// Records the model the index is built with.
    async fn set_meta(&self, meta: &IndexMeta) -> Result<(), StoreError>;
    /// A document by id.
    async fn get(&self, doc_id: &str) -> Result<Option<Document>, StoreError>;
    /// The first document (in insertion order) whose `source` is exactly `source`.
    async fn find_by_source(&self, source: &str) -> Result<Option<Document>, StoreError>;
    /// The first document (in insertion order) whose `content_hash` is `hash`.
    async fn find_by_hash(&self, hash: &str) -> Result<Option<Document>, StoreError>;
    /// Writes a document and its chunks in one transaction: the document is inserted or
    /// replaced (keeping its insertion position), its old chunks are all removed.
    async fn put(&self, doc: &Document, chunks: &[IndexedChunk]) -> Result<(), StoreError>;
    /// Deletes a document and its chunks; whether it existed.
    async fn delete(&self, doc_id: &str) -> Result<bool, StoreError>;
    /// Up to `limit` documents of `project` (or all), newest `added_at` first (ties in
    /// insertion order).
    async fn list(&self, project: Option<&str>, limit: usize) -> Result<Vec<Document>, StoreError>;
    /// The number of documents per project, by project name.
    async fn projects(&self) -> Result<BTreeMap<String, u64>, StoreError>;
    /// Every document, in insertion order.
    async fn documents(&self) -> Result<Vec<Document>, StoreError>;
    /// The `limit` chunks passing `filter` most similar to `query` by cosine (a zero vector
    /// scores 0); ties: the most recently written chunk first.
    async fn dense_top(
        &self,
        query: &[f32],
        filter: &ChunkFilter,
        limit: usize,
    ) -> Result<Vec<ScoredChunk>, StoreError>;
    /// The `limit` chunks passing `filter` with the highest dot product with `query`, among the
    /// chunks sharing at least one index with it; ties: the most recently written chunk first.
    async fn sparse_top(
        &self,
        query: &SparseVector,
        filter: &ChunkFilter,
        limit: usize,
    ) -> Result<Vec<ScoredChunk>, StoreError>;
    /// Removes every chunk (documents stay): the start of a reindex.
    async fn clear_chunks(&self) -> Result<(), StoreError>;
}
