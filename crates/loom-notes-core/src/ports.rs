//! The models' ports: an embedder (dense and sparse vectors) and a reranker (a cross-encoder).
//!
//! Both are synchronous (CPU work); the service calls them off the async runtime. They are
//! object-safe and used as `Arc<dyn Embedder>` / `Arc<dyn Reranker>`.

use std::fmt::Debug;

/// A sparse vector: indices sorted ascending, one value each.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SparseVector {
    /// Token ids or hash buckets, sorted ascending, without duplicates.
    pub indices: Vec<u32>,
    /// The weight of each index (> 0).
    pub values: Vec<f32>,
}

/// The dense and sparse embeddings of one text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Embedding {
    /// L2-normalized (or all zeros), of length [`Embedder::dim`].
    pub dense: Vec<f32>,
    /// Lexical weights.
    pub sparse: SparseVector,
}

/// A model failed (weights unreadable, input too long for it, inference error).
#[derive(Debug, thiserror::Error)]
#[error("model {model}: {message}")]
pub struct ModelError {
    /// The model's name.
    pub model: String,
    /// What went wrong.
    pub message: String,
}

/// Turns texts into dense and sparse vectors.
pub trait Embedder: Send + Sync + Debug {
    /// The name recorded in the data directory's `meta.json` (`fake-64`, `BAAI/bge-m3`).
    fn model_name(&self) -> &str;
    /// The length of the dense vectors.
    fn dim(&self) -> usize;
    /// Embeds documents' chunks (one embedding per text, in order).
    fn embed(&self, texts: &[&str]) -> Result<Vec<Embedding>, ModelError>;
    /// Embeds a query.
    fn embed_query(&self, text: &str) -> Result<Embedding, ModelError>;
}

/// Scores passages against a query, each in 0..=1.
pub trait Reranker: Send + Sync + Debug {
    /// The model's name.
    fn model_name(&self) -> &str;
    /// One score per passage, in order.
    fn score(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>, ModelError>;
}
