//! loom-notes' domain, with no IO: the data model, the text helpers, chunking, the fake models,
//! the search pipeline, the memory service and the ports through which it reaches its models
//! (embedder, reranker) and its store.
//!
//! The behaviour follows the Python loom-notes 1.1.0 (`../shared/reference/loom-notes.md`,
//! Part A); where this crate differs, the item's documentation says so. The observed quirks of
//! A.13 that the service decides (3–5) are described in [`service`]'s documentation.
//!
//! A service for tests: `MemoryService::with_fake_models(Arc::new(InMemoryStore::new()),
//! Settings::default())`; on disk, `loom_notes_sqlite::open_fake_service(dir, settings)`.

pub mod chunk;
pub mod eval;
pub mod fake;
pub mod ids;
pub mod memory;
pub mod model;
pub mod ports;
pub mod scoring;
pub mod search;
pub mod service;
pub mod settings;
pub mod store;
pub mod text;

pub use chunk::{ChunkSizes, chunk_document, embed_text};
pub use eval::{CaseResult, EvalCase, EvalReport};
pub use fake::{FakeEmbedder, FakeReranker};
pub use memory::InMemoryStore;
pub use model::{Chunk, DocSummary, Document, Hit, IngestResult, SourceKind};
pub use ports::{Embedder, Embedding, ModelError, Reranker, SparseVector};
pub use service::{Extracted, ImportReport, MemoryService, NotesError, SearchQuery};
pub use settings::{Settings, SettingsError};
pub use store::{
    ChunkFilter, ChunkPayload, IndexMeta, IndexedChunk, NoteStore, ScoredChunk, StoreError,
};
