//! What the BERT and XLM-R embedders share: tokenizing, batching, pooling, normalising and the
//! sparse vectors.

use std::time::Instant;

use candle_core::{Module, Tensor};
use candle_nn::Linear;
use loom_notes_core::{Embedding, SparseVector};

use super::{
    Batch, TextTokenizer, inference_error, l2_normalize, max_weight_sparse, pool, run_batches,
    token_count_sparse,
};
use crate::dir::{LoadOptions, ModelDir, Pooling, Purpose};
use crate::error::{Error, Result};

/// Where an embedder's sparse vectors come from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SparseSource<'a> {
    /// The token ids, weight = count (models without a sparse head).
    TokenCounts,
    /// BGE-M3's head: `ReLU(head(hidden))` per token, maximum per token id.
    Head(&'a Linear),
}

/// The part of an embedder that does not depend on its transformer.
#[derive(Debug)]
pub(crate) struct EmbedderCore {
    pub(crate) name: String,
    pub(crate) dim: usize,
    pub(crate) pooling: Pooling,
    pub(crate) batch_size: usize,
    pub(crate) tokenizer: TextTokenizer,
}

impl EmbedderCore {
    /// Checks `options` and loads the tokenizer of `dir`.
    pub(crate) fn load(dir: &ModelDir, options: &LoadOptions) -> Result<Self> {
        options.validate()?;
        let max_length = dir.max_length(Purpose::Embedding, options.max_length)?;
        Ok(Self {
            name: dir.name(options),
            dim: dir.hidden_size(),
            pooling: dir.pooling(),
            batch_size: options.batch_size,
            tokenizer: TextTokenizer::load(dir, max_length)?,
        })
    }

    /// Embeds `texts`: `forward` maps a batch to its hidden states `[batch, length, hidden]`.
    pub(crate) fn embed(
        &self,
        texts: &[&str],
        sparse: SparseSource<'_>,
        forward: impl Fn(&Batch) -> candle_core::Result<Tensor>,
    ) -> Result<Vec<Embedding>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let started = Instant::now();
        let sequences = self.tokenizer.encode_texts(texts, &self.name)?;
        let embeddings = run_batches(&sequences, self.batch_size, &self.name, |rows| {
            self.embed_batch(rows, sparse, &forward)
        })?;
        tracing::debug!(
            model = %self.name,
            texts = texts.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "embedded"
        );
        Ok(embeddings)
    }

    fn embed_batch(
        &self,
        rows: &[&[u32]],
        sparse: SparseSource<'_>,
        forward: &impl Fn(&Batch) -> candle_core::Result<Tensor>,
    ) -> Result<Vec<Embedding>> {
        let failed = inference_error(&self.name);
        let batch = Batch::new(rows, self.tokenizer.pad_id).map_err(&failed)?;
        let hidden = forward(&batch).map_err(&failed)?;
        let dense = pool(&hidden, &batch.mask, self.pooling)
            .and_then(|pooled| l2_normalize(&pooled))
            .and_then(|normalized| normalized.to_vec2::<f32>())
            .map_err(&failed)?;
        if let Some(row) = dense.iter().find(|row| row.len() != self.dim) {
            return Err(Error::Inference {
                model: self.name.clone(),
                message: format!(
                    "the model gives vectors of {} values, its config.json says hidden_size {}",
                    row.len(),
                    self.dim
                ),
            });
        }
        let sparse: Vec<SparseVector> = match sparse {
            SparseSource::TokenCounts => rows
                .iter()
                .map(|ids| token_count_sparse(ids, self.tokenizer.special_ids()))
                .collect(),
            SparseSource::Head(head) => {
                let weights = head
                    .forward(&hidden)
                    .and_then(|logits| logits.relu())
                    .and_then(|weights| weights.squeeze(2))
                    .and_then(|weights| weights.to_vec2::<f32>())
                    .map_err(&failed)?;
                rows.iter()
                    .zip(&weights)
                    .map(|(ids, weights)| {
                        max_weight_sparse(ids, weights, self.tokenizer.special_ids())
                    })
                    .collect()
            }
        };
        Ok(dense
            .into_iter()
            .zip(sparse)
            .map(|(dense, sparse)| Embedding { dense, sparse })
            .collect())
    }

    /// The token ids of `text`, special tokens included, truncated at the maximum length.
    pub(crate) fn token_ids(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .tokenizer
            .encode_texts(&[text], &self.name)?
            .pop()
            .unwrap_or_default())
    }

    /// Embeds one query (the same function as documents: neither model has a query prefix).
    pub(crate) fn embed_one(
        &self,
        text: &str,
        sparse: SparseSource<'_>,
        forward: impl Fn(&Batch) -> candle_core::Result<Tensor>,
    ) -> Result<Embedding> {
        self.embed(&[text], sparse, forward)?
            .pop()
            .ok_or_else(|| Error::Inference {
                model: self.name.clone(),
                message: "no embedding for the query".into(),
            })
    }
}
