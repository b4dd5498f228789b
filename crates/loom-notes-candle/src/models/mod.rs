//! The candle models: loading (tokenizer, weights) and the parts the embedders and the reranker
//! share (batching, pooling, normalisation, sparse vectors).

mod bert;
mod embedder;
mod load;
mod xlm_roberta;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;

use candle_core::{D, DType, Device, Tensor};
use candle_nn::VarBuilder;
use loom_notes_core::SparseVector;
use serde::de::DeserializeOwned;
use tokenizers::{
    EncodeInput, Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy,
};

pub use bert::BertEmbedder;
pub use load::{load_embedder, load_embedder_with, load_reranker, load_reranker_with};
pub use xlm_roberta::{XlmRobertaEmbedder, XlmRobertaReranker};

use crate::dir::{ModelDir, Pooling, WeightsFile, WeightsFormat, read_json};
use crate::error::{Error, Result};

/// Everything runs on the CPU, in `f32`.
const DTYPE: DType = DType::F32;

/// A model's tokenizer, truncating at the model's maximum length, never padding (batches are
/// padded by [`Batch::new`]).
pub(crate) struct TextTokenizer {
    tokenizer: Tokenizer,
    path: PathBuf,
    max_length: usize,
    /// Ids never put in a sparse vector: the architecture's special tokens and the padding id.
    special_ids: HashSet<u32>,
    pad_id: u32,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("path", &self.path)
            .field("max_length", &self.max_length)
            .field("pad_id", &self.pad_id)
            .finish_non_exhaustive()
    }
}

impl TextTokenizer {
    /// Loads `tokenizer.json` of `dir`, truncating (longest first) at `max_length` tokens.
    pub(crate) fn load(dir: &ModelDir, max_length: usize) -> Result<Self> {
        let path = dir.tokenizer_path();
        let tokenizer_error = |message: String| Error::Tokenizer {
            path: path.clone(),
            message,
        };
        let mut tokenizer =
            Tokenizer::from_file(&path).map_err(|error| tokenizer_error(error.to_string()))?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|error| tokenizer_error(error.to_string()))?;
        let mut special_ids: HashSet<u32> = dir
            .architecture()
            .special_tokens()
            .iter()
            .filter_map(|token| tokenizer.token_to_id(token))
            .collect();
        special_ids.insert(dir.pad_token_id());
        Ok(Self {
            tokenizer,
            path,
            max_length,
            special_ids,
            pad_id: dir.pad_token_id(),
        })
    }

    /// The token ids of each input, with the special tokens the tokenizer adds.
    fn encode<'s, E>(&self, inputs: Vec<E>, model: &str) -> Result<Vec<Vec<u32>>>
    where
        E: Into<EncodeInput<'s>> + Send,
    {
        let encodings =
            self.tokenizer
                .encode_batch(inputs, true)
                .map_err(|error| Error::Inference {
                    model: model.to_owned(),
                    message: format!("tokenization with {}: {error}", self.path.display()),
                })?;
        Ok(encodings
            .into_iter()
            .map(|encoding| encoding.get_ids().to_vec())
            .collect())
    }

    /// The token ids of each text.
    pub(crate) fn encode_texts(&self, texts: &[&str], model: &str) -> Result<Vec<Vec<u32>>> {
        self.encode(texts.to_vec(), model)
    }

    /// The token ids of each (query, passage) pair, as one sequence.
    pub(crate) fn encode_pairs(
        &self,
        query: &str,
        passages: &[&str],
        model: &str,
    ) -> Result<Vec<Vec<u32>>> {
        self.encode(
            passages.iter().map(|passage| (query, *passage)).collect(),
            model,
        )
    }

    /// The maximum number of tokens per sequence.
    pub(crate) fn max_length(&self) -> usize {
        self.max_length
    }

    /// The ids that never enter a sparse vector.
    pub(crate) fn special_ids(&self) -> &HashSet<u32> {
        &self.special_ids
    }
}

/// A padded batch of token sequences, as the model's input tensors.
pub(crate) struct Batch {
    /// `[batch, length]` token ids, padded with the pad id.
    pub(crate) ids: Tensor,
    /// `[batch, length]`, 1 on tokens, 0 on padding.
    pub(crate) mask: Tensor,
    /// `[batch, length]` zeros (single segment).
    pub(crate) type_ids: Tensor,
}

impl Batch {
    /// Pads `sequences` on the right to the longest one.
    pub(crate) fn new(sequences: &[&[u32]], pad_id: u32) -> candle_core::Result<Self> {
        let rows = sequences.len();
        let width = sequences.iter().map(|ids| ids.len()).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(rows * width);
        let mut mask = Vec::with_capacity(rows * width);
        for sequence in sequences {
            ids.extend_from_slice(sequence);
            ids.extend(std::iter::repeat_n(pad_id, width - sequence.len()));
            mask.extend(std::iter::repeat_n(1u32, sequence.len()));
            mask.extend(std::iter::repeat_n(0u32, width - sequence.len()));
        }
        let device = Device::Cpu;
        Ok(Self {
            ids: Tensor::from_vec(ids, (rows, width), &device)?,
            mask: Tensor::from_vec(mask, (rows, width), &device)?,
            type_ids: Tensor::zeros((rows, width), DType::U32, &device)?,
        })
    }
}

/// The indices of `lengths` in batches of at most `batch_size`, longest sequences first, so that
/// each batch pads little.
pub(crate) fn length_sorted_batches(lengths: &[usize], batch_size: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&index| std::cmp::Reverse(lengths[index]));
    order
        .chunks(batch_size.max(1))
        .map(<[usize]>::to_vec)
        .collect()
}

/// One vector per row of `hidden` (`[batch, length, hidden]`), by `pooling` over `mask`.
pub(crate) fn pool(
    hidden: &Tensor,
    mask: &Tensor,
    pooling: Pooling,
) -> candle_core::Result<Tensor> {
    match pooling {
        Pooling::Cls => hidden.get_on_dim(1, 0),
        Pooling::Mean => {
            let mask = mask.to_dtype(hidden.dtype())?.unsqueeze(2)?;
            let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
            let counts = mask.sum(1)?.clamp(1e-9, f64::MAX)?;
            summed.broadcast_div(&counts)
        }
    }
}

/// Divides each row of `vectors` (`[batch, dim]`) by its L2 norm (at least 1e-12, as
/// `torch.nn.functional.normalize`).
pub(crate) fn l2_normalize(vectors: &Tensor) -> candle_core::Result<Tensor> {
    let norms = vectors
        .sqr()?
        .sum_keepdim(D::Minus1)?
        .sqrt()?
        .clamp(1e-12, f64::MAX)?;
    vectors.broadcast_div(&norms)
}

/// A sparse vector from token ids: weight = the number of occurrences, special ids left out.
pub(crate) fn token_count_sparse(ids: &[u32], special: &HashSet<u32>) -> SparseVector {
    let mut weights: BTreeMap<u32, f32> = BTreeMap::new();
    for &id in ids.iter().filter(|id| !special.contains(id)) {
        *weights.entry(id).or_insert(0.0) += 1.0;
    }
    into_sparse(weights)
}

/// A sparse vector from per-token weights: the maximum weight of each token id, special ids and
/// weights ≤ 0 left out (FlagEmbedding's `_process_token_weights`).
pub(crate) fn max_weight_sparse(
    ids: &[u32],
    weights: &[f32],
    special: &HashSet<u32>,
) -> SparseVector {
    let mut maxima: BTreeMap<u32, f32> = BTreeMap::new();
    for (&id, &weight) in ids.iter().zip(weights) {
        if special.contains(&id) || weight.is_nan() || weight <= 0.0 {
            continue;
        }
        let entry = maxima.entry(id).or_insert(weight);
        if weight > *entry {
            *entry = weight;
        }
    }
    into_sparse(maxima)
}

fn into_sparse(weights: BTreeMap<u32, f32>) -> SparseVector {
    let (indices, values) = weights.into_iter().unzip();
    SparseVector { indices, values }
}

/// All the tensors of a weights file, read into memory (safetensors without mmap, or a PyTorch
/// archive).
pub(crate) fn read_tensors(file: &WeightsFile) -> Result<HashMap<String, Tensor>> {
    let weights_error = |error: candle_core::Error| Error::Weights {
        path: file.path.clone(),
        message: error.to_string(),
    };
    match file.format {
        WeightsFormat::Safetensors => {
            let bytes = std::fs::read(&file.path).map_err(|source| Error::Io {
                path: file.path.clone(),
                source,
            })?;
            candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).map_err(weights_error)
        }
        WeightsFormat::PyTorch => Ok(candle_core::pickle::read_all(&file.path)
            .map_err(weights_error)?
            .into_iter()
            .collect()),
    }
}

/// A variable builder over all the tensors of `file`, converted to `f32` when fetched.
pub(crate) fn var_builder(file: &WeightsFile) -> Result<VarBuilder<'static>> {
    Ok(VarBuilder::from_tensors(
        read_tensors(file)?,
        DTYPE,
        &Device::Cpu,
    ))
}

/// `config.json` of `dir` as an architecture's configuration.
pub(crate) fn model_config<T: DeserializeOwned>(dir: &ModelDir) -> Result<T> {
    let path = dir.config_path();
    let value = read_json(&path)?;
    serde_json::from_value(value).map_err(|error| Error::InvalidConfig {
        path,
        message: error.to_string(),
    })
}

/// Runs `forward` over the sequences in length-sorted batches and gives each result back in
/// the input order.
pub(crate) fn run_batches<T>(
    sequences: &[Vec<u32>],
    batch_size: usize,
    model: &str,
    mut forward: impl FnMut(&[&[u32]]) -> Result<Vec<T>>,
) -> Result<Vec<T>> {
    let lengths: Vec<usize> = sequences.iter().map(Vec::len).collect();
    let mut results: Vec<Option<T>> = std::iter::repeat_with(|| None)
        .take(sequences.len())
        .collect();
    for batch in length_sorted_batches(&lengths, batch_size) {
        let rows: Vec<&[u32]> = batch
            .iter()
            .map(|&index| sequences[index].as_slice())
            .collect();
        let outputs = forward(&rows)?;
        if outputs.len() != rows.len() {
            return Err(Error::Inference {
                model: model.to_owned(),
                message: format!("{} outputs for a batch of {}", outputs.len(), rows.len()),
            });
        }
        for (index, output) in batch.into_iter().zip(outputs) {
            results[index] = Some(output);
        }
    }
    Ok(results.into_iter().flatten().collect())
}

/// A candle error during inference, attributed to `model`.
pub(crate) fn inference_error(model: &str) -> impl Fn(candle_core::Error) -> Error + '_ {
    move |error| Error::Inference {
        model: model.to_owned(),
        message: error.to_string(),
    }
}

#[cfg(test)]
mod tests;
