//! BERT sentence embedders (sentence-transformers layout, e.g. all-MiniLM-L6-v2).

use std::path::Path;

use candle_transformers::models::bert::{BertModel, Config};
use loom_notes_core::{Embedder, Embedding, ModelError};

use super::embedder::{EmbedderCore, SparseSource};
use super::{Batch, model_config, var_builder};
use crate::dir::{Architecture, LoadOptions, ModelDir, Pooling};
use crate::error::{Error, Result};

/// A BERT sentence embedder: the dense vector is the pooled last hidden state (mean over the
/// attention mask unless `1_Pooling/config.json` asks for CLS), L2-normalised, as
/// sentence-transformers computes it for all-MiniLM-L6-v2.
///
/// A BERT model has no sparse head: the sparse vector is made from the tokenizer's ids, each
/// weighted by its number of occurrences (`[CLS]`, `[SEP]`, `[PAD]`, `[UNK]` left out), so that
/// the hybrid search keeps a lexical branch.
pub struct BertEmbedder {
    core: EmbedderCore,
    model: BertModel,
}

impl std::fmt::Debug for BertEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BertEmbedder")
            .field("core", &self.core)
            .finish_non_exhaustive()
    }
}

impl BertEmbedder {
    /// Loads the model in `dir` (see [`ModelDir`] for the files).
    pub fn load(dir: impl AsRef<Path>, options: &LoadOptions) -> Result<Self> {
        Self::from_model_dir(&ModelDir::open(dir)?, options)
    }

    /// Loads the model of an opened directory; refused unless its `model_type` is `bert`.
    pub fn from_model_dir(dir: &ModelDir, options: &LoadOptions) -> Result<Self> {
        dir.expect_architecture(Architecture::Bert)?;
        let config: Config = model_config(dir)?;
        let core = EmbedderCore::load(dir, options)?;
        let weights = dir.weights();
        let model =
            BertModel::load(var_builder(weights)?, &config).map_err(|error| Error::Weights {
                path: weights.path.clone(),
                message: error.to_string(),
            })?;
        tracing::info!(
            model = %core.name,
            dir = %dir.path().display(),
            dim = core.dim,
            max_length = core.tokenizer.max_length(),
            "BERT embedder loaded"
        );
        Ok(Self { core, model })
    }

    /// The number of tokens beyond which a text is truncated.
    pub fn max_length(&self) -> usize {
        self.core.tokenizer.max_length()
    }

    /// The token ids the model sees for `text` (special tokens included, truncated at
    /// [`Self::max_length`]).
    pub fn token_ids(&self, text: &str) -> Result<Vec<u32>> {
        self.core.token_ids(text)
    }

    /// How token states are pooled.
    pub fn pooling(&self) -> Pooling {
        self.core.pooling
    }

    fn forward(&self, batch: &Batch) -> candle_core::Result<candle_core::Tensor> {
        self.model
            .forward(&batch.ids, &batch.type_ids, Some(&batch.mask))
    }
}

impl Embedder for BertEmbedder {
    fn model_name(&self) -> &str {
        &self.core.name
    }

    fn dim(&self) -> usize {
        self.core.dim
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Embedding>, ModelError> {
        self.core
            .embed(texts, SparseSource::TokenCounts, |batch| {
                self.forward(batch)
            })
            .map_err(|error| error.into_model_error(&self.core.name))
    }

    fn embed_query(&self, text: &str) -> Result<Embedding, ModelError> {
        self.core
            .embed_one(text, SparseSource::TokenCounts, |batch| self.forward(batch))
            .map_err(|error| error.into_model_error(&self.core.name))
    }
}
