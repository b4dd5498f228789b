//! XLM-RoBERTa models: the BGE-M3 embedder (dense + sparse) and the bge-reranker-v2-m3
//! cross-encoder.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use candle_core::Tensor;
use candle_nn::Linear;
use candle_transformers::models::xlm_roberta::{
    Config, XLMRobertaForSequenceClassification, XLMRobertaModel,
};
use loom_notes_core::{Embedder, Embedding, ModelError, Reranker};

use super::embedder::{EmbedderCore, SparseSource};
use super::{
    Batch, DTYPE, TextTokenizer, inference_error, model_config, read_tensors, run_batches,
    var_builder,
};
use crate::dir::{Architecture, LoadOptions, ModelDir, Pooling, Purpose, WeightsFile};
use crate::error::{Error, Result};

/// An XLM-RoBERTa embedder in BGE-M3's layout.
///
/// * dense: the pooled last hidden state — CLS unless `1_Pooling/config.json` asks for mean
///   pooling (multilingual-e5) — L2-normalised;
/// * sparse, with BGE-M3's head (`sparse_linear.safetensors` or `sparse_linear.pt`, a
///   `Linear(hidden, 1)`): `ReLU(head(hidden state))` for each token, the maximum per token id,
///   without the ids of `<s>`, `</s>`, `<pad>`, `<unk>` and without weights ≤ 0 (FlagEmbedding's
///   `lexical_weights`);
/// * sparse, without a head: the token ids weighted by their counts, like [`super::BertEmbedder`].
pub struct XlmRobertaEmbedder {
    core: EmbedderCore,
    model: XLMRobertaModel,
    sparse_head: Option<Linear>,
}

impl std::fmt::Debug for XlmRobertaEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XlmRobertaEmbedder")
            .field("core", &self.core)
            .field("sparse_head", &self.sparse_head.is_some())
            .finish_non_exhaustive()
    }
}

impl XlmRobertaEmbedder {
    /// Loads the model in `dir` (see [`ModelDir`] for the files).
    pub fn load(dir: impl AsRef<Path>, options: &LoadOptions) -> Result<Self> {
        Self::from_model_dir(&ModelDir::open(dir)?, options)
    }

    /// Loads the model of an opened directory; refused unless its `model_type` is `xlm-roberta`.
    pub fn from_model_dir(dir: &ModelDir, options: &LoadOptions) -> Result<Self> {
        dir.expect_architecture(Architecture::XlmRoberta)?;
        let config: Config = model_config(dir)?;
        let core = EmbedderCore::load(dir, options)?;
        let weights = dir.weights();
        let vb = var_builder(weights)?;
        // BGE-M3 saves the bare XLMRobertaModel; other exports keep the `roberta.` prefix.
        let vb = if vb.contains_tensor("roberta.embeddings.word_embeddings.weight") {
            vb.pp("roberta")
        } else {
            vb
        };
        let model = XLMRobertaModel::new(&config, vb).map_err(|error| Error::Weights {
            path: weights.path.clone(),
            message: error.to_string(),
        })?;
        let sparse_head = dir
            .sparse_head()
            .map(|file| load_sparse_head(file, config.hidden_size))
            .transpose()?;
        tracing::info!(
            model = %core.name,
            dir = %dir.path().display(),
            dim = core.dim,
            max_length = core.tokenizer.max_length(),
            sparse_head = sparse_head.is_some(),
            "XLM-RoBERTa embedder loaded"
        );
        Ok(Self {
            core,
            model,
            sparse_head,
        })
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

    /// Whether the sparse vectors come from BGE-M3's sparse head (else from token counts).
    pub fn has_sparse_head(&self) -> bool {
        self.sparse_head.is_some()
    }

    fn sparse_source(&self) -> SparseSource<'_> {
        match &self.sparse_head {
            Some(head) => SparseSource::Head(head),
            None => SparseSource::TokenCounts,
        }
    }

    fn forward(&self, batch: &Batch) -> candle_core::Result<Tensor> {
        self.model
            .forward(&batch.ids, &batch.mask, &batch.type_ids, None, None, None)
    }
}

impl Embedder for XlmRobertaEmbedder {
    fn model_name(&self) -> &str {
        &self.core.name
    }

    fn dim(&self) -> usize {
        self.core.dim
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Embedding>, ModelError> {
        self.core
            .embed(texts, self.sparse_source(), |batch| self.forward(batch))
            .map_err(|error| error.into_model_error(&self.core.name))
    }

    fn embed_query(&self, text: &str) -> Result<Embedding, ModelError> {
        self.core
            .embed_one(text, self.sparse_source(), |batch| self.forward(batch))
            .map_err(|error| error.into_model_error(&self.core.name))
    }
}

/// BGE-M3's sparse head: `weight` `[1, hidden]` and `bias` `[1]` (bare, or under
/// `sparse_linear.`).
fn load_sparse_head(file: &WeightsFile, hidden_size: usize) -> Result<Linear> {
    let mut tensors = read_tensors(file)?;
    let invalid = |message: String| Error::Weights {
        path: file.path.clone(),
        message,
    };
    let take = |tensors: &mut HashMap<String, Tensor>, name: &str| {
        tensors
            .remove(name)
            .or_else(|| tensors.remove(&format!("sparse_linear.{name}")))
            .ok_or_else(|| invalid(format!("no tensor {name} (nor sparse_linear.{name})")))
    };
    let weight = take(&mut tensors, "weight")?;
    let bias = take(&mut tensors, "bias")?;
    let to_f32 = |tensor: Tensor| {
        tensor.to_dtype(DTYPE).map_err(|error| Error::Weights {
            path: file.path.clone(),
            message: error.to_string(),
        })
    };
    if weight.dims() != [1, hidden_size] || bias.dims() != [1] {
        return Err(Error::Weights {
            path: file.path.clone(),
            message: format!(
                "the sparse head must be a Linear({hidden_size}, 1): weight {:?} and bias {:?}",
                weight.dims(),
                bias.dims()
            ),
        });
    }
    Ok(Linear::new(to_f32(weight)?, Some(to_f32(bias)?)))
}

/// A cross-encoder reranker in bge-reranker-v2-m3's layout
/// (`XLMRobertaForSequenceClassification`, one label): each (query, passage) pair is one
/// sequence (`<s> query </s></s> passage </s>`, truncated longest-first), the score is the
/// sigmoid of its logit, as FlagReranker's `compute_score(normalize=True)`.
pub struct XlmRobertaReranker {
    name: String,
    batch_size: usize,
    tokenizer: TextTokenizer,
    model: XLMRobertaForSequenceClassification,
}

impl std::fmt::Debug for XlmRobertaReranker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XlmRobertaReranker")
            .field("name", &self.name)
            .field("batch_size", &self.batch_size)
            .field("tokenizer", &self.tokenizer)
            .finish_non_exhaustive()
    }
}

impl XlmRobertaReranker {
    /// Loads the model in `dir` (see [`ModelDir`] for the files).
    pub fn load(dir: impl AsRef<Path>, options: &LoadOptions) -> Result<Self> {
        Self::from_model_dir(&ModelDir::open(dir)?, options)
    }

    /// Loads the model of an opened directory; refused unless it is a single-label
    /// `XLMRobertaForSequenceClassification` ([`ModelDir::check_reranker`]).
    pub fn from_model_dir(dir: &ModelDir, options: &LoadOptions) -> Result<Self> {
        dir.check_reranker()?;
        options.validate()?;
        let config: Config = model_config(dir)?;
        let max_length = dir.max_length(Purpose::Reranking, options.max_length)?;
        let tokenizer = TextTokenizer::load(dir, max_length)?;
        let weights = dir.weights();
        let model = XLMRobertaForSequenceClassification::new(1, &config, var_builder(weights)?)
            .map_err(|error| Error::Weights {
                path: weights.path.clone(),
                message: error.to_string(),
            })?;
        let name = dir.name(options);
        tracing::info!(
            model = %name,
            dir = %dir.path().display(),
            max_length,
            "XLM-RoBERTa reranker loaded"
        );
        Ok(Self {
            name,
            batch_size: options.batch_size,
            tokenizer,
            model,
        })
    }

    /// The number of tokens beyond which a (query, passage) pair is truncated.
    pub fn max_length(&self) -> usize {
        self.tokenizer.max_length()
    }

    fn score_pairs(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>> {
        if passages.is_empty() {
            return Ok(Vec::new());
        }
        let started = Instant::now();
        let sequences = self.tokenizer.encode_pairs(query, passages, &self.name)?;
        let failed = inference_error(&self.name);
        let scores = run_batches(&sequences, self.batch_size, &self.name, |rows| {
            let batch = Batch::new(rows, self.tokenizer.pad_id).map_err(&failed)?;
            let logits = self
                .model
                .forward(&batch.ids, &batch.mask, &batch.type_ids)
                .and_then(|logits| logits.squeeze(1))
                .and_then(|logits| logits.to_vec1::<f32>())
                .map_err(&failed)?;
            Ok(logits.into_iter().map(sigmoid).collect())
        })?;
        tracing::debug!(
            model = %self.name,
            passages = passages.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "reranked"
        );
        Ok(scores)
    }
}

impl Reranker for XlmRobertaReranker {
    fn model_name(&self) -> &str {
        &self.name
    }

    fn score(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>, ModelError> {
        self.score_pairs(query, passages)
            .map_err(|error| error.into_model_error(&self.name))
    }
}

pub(super) fn sigmoid(logit: f32) -> f32 {
    1.0 / (1.0 + (-logit).exp())
}
