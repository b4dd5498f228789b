//! Loading whichever model a directory holds, by `config.json`'s `model_type`.

use std::path::Path;
use std::sync::Arc;

use loom_notes_core::{Embedder, Reranker};

use super::{BertEmbedder, XlmRobertaEmbedder, XlmRobertaReranker};
use crate::dir::{Architecture, LoadOptions, ModelDir};
use crate::error::Result;

/// Loads the embedder in `dir` with the default options (name = the directory's name).
pub fn load_embedder(dir: impl AsRef<Path>) -> Result<Arc<dyn Embedder>> {
    load_embedder_with(dir, &LoadOptions::default())
}

/// Loads the embedder in `dir`: [`BertEmbedder`] for `model_type` `bert` (MiniLM),
/// [`XlmRobertaEmbedder`] for `xlm-roberta` (BGE-M3).
pub fn load_embedder_with(
    dir: impl AsRef<Path>,
    options: &LoadOptions,
) -> Result<Arc<dyn Embedder>> {
    let dir = ModelDir::open(dir)?;
    Ok(match dir.architecture() {
        Architecture::Bert => Arc::new(BertEmbedder::from_model_dir(&dir, options)?),
        Architecture::XlmRoberta => Arc::new(XlmRobertaEmbedder::from_model_dir(&dir, options)?),
    })
}

/// Loads the reranker in `dir` with the default options (name = the directory's name).
pub fn load_reranker(dir: impl AsRef<Path>) -> Result<Arc<dyn Reranker>> {
    load_reranker_with(dir, &LoadOptions::default())
}

/// Loads the reranker in `dir`: an [`XlmRobertaReranker`] (bge-reranker-v2-m3); other
/// architectures are refused ([`ModelDir::check_reranker`]).
pub fn load_reranker_with(
    dir: impl AsRef<Path>,
    options: &LoadOptions,
) -> Result<Arc<dyn Reranker>> {
    let dir = ModelDir::open(dir)?;
    Ok(Arc::new(XlmRobertaReranker::from_model_dir(&dir, options)?))
}
