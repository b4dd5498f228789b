//! loom-notes' in-process models, run on the CPU with [candle] and tokenized with the Hugging Face
//! `tokenizers` crate, loaded from a local model directory (nothing is downloaded).
//!
//! * [`ModelDir`] reads and checks a model directory (`config.json`, `tokenizer.json`, the
//!   weights, the optional sparse head and pooling files) — always available;
//! * with the cargo feature **`candle`** (off by default: it costs a ~20 min build):
//!   `BertEmbedder` (sentence-transformers BERT such as all-MiniLM-L6-v2: mean pooling, L2
//!   normalisation; sparse vector = token counts), `XlmRobertaEmbedder` (BGE-M3: CLS, L2; sparse =
//!   `ReLU(sparse_linear(hidden))`, max per token id), `XlmRobertaReranker`
//!   (bge-reranker-v2-m3: sigmoid of the classifier's logit), and `load_embedder` /
//!   `load_reranker`, which pick the architecture from `config.json`'s `model_type`.
//!
//! Weights are read into memory with the buffered safetensors API (no mmap: the workspace forbids
//! `unsafe`), so loading briefly holds the file twice; BGE-M3's 2.3 GB of `f32` needs ~4.6 GB at
//! load time.
//!
//! [candle]: https://github.com/huggingface/candle

mod dir;
mod error;
#[cfg(feature = "candle")]
mod models;

pub use dir::{
    Architecture, CONFIG_FILE, DEFAULT_BATCH_SIZE, DEFAULT_EMBEDDING_MAX_LENGTH,
    DEFAULT_RERANKING_MAX_LENGTH, LoadOptions, ModelDir, POOLING_CONFIG_FILE, PYTORCH_WEIGHTS_FILE,
    Pooling, Purpose, SAFETENSORS_WEIGHTS_FILE, SENTENCE_BERT_CONFIG_FILE,
    SPARSE_HEAD_PYTORCH_FILE, SPARSE_HEAD_SAFETENSORS_FILE, TOKENIZER_FILE, WeightsFile,
    WeightsFormat,
};
pub use error::{Error, Result};
#[cfg(feature = "candle")]
pub use models::{
    BertEmbedder, XlmRobertaEmbedder, XlmRobertaReranker, load_embedder, load_embedder_with,
    load_reranker, load_reranker_with,
};
