//! loom-notes' domain, with no IO: the data model, and the ports through which the memory
//! service reaches its models (embedder, reranker) and its store.
//!
//! The behaviour follows the Python loom-notes 1.1.0 (`../shared/reference/loom-notes.md`,
//! Part A); where this crate differs, the item's documentation says so.

pub mod model;
pub mod ports;

pub use model::{Chunk, DocSummary, Document, Hit, IngestResult, SourceKind};
pub use ports::{Embedder, Embedding, ModelError, Reranker, SparseVector};
