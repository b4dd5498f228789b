//! A model directory: which files it holds, which architecture and which pooling its
//! configuration names. Read and checked without running anything (no candle needed).
//!
//! The layout is a Hugging Face snapshot as sentence-transformers and FlagEmbedding save it:
//!
//! | file | needed | what is read |
//! |---|---|---|
//! | `config.json` | yes | `model_type`, `hidden_size`, `max_position_embeddings`, `pad_token_id`, `architectures`, `num_labels`/`id2label` |
//! | `tokenizer.json` | yes | the tokenizer (loaded by the models) |
//! | `model.safetensors` or `pytorch_model.bin` | yes | the weights (the first one present) |
//! | `sparse_linear.safetensors` or `sparse_linear.pt` | no | BGE-M3's sparse head (`Linear(hidden, 1)`) |
//! | `1_Pooling/config.json` | no | `pooling_mode_cls_token` / `pooling_mode_mean_tokens` |
//! | `sentence_bert_config.json` | no | `max_seq_length` |

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};

/// The model configuration file.
pub const CONFIG_FILE: &str = "config.json";
/// The tokenizer file.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The weights, safetensors format (preferred).
pub const SAFETENSORS_WEIGHTS_FILE: &str = "model.safetensors";
/// The weights, PyTorch format (read when there is no safetensors file).
pub const PYTORCH_WEIGHTS_FILE: &str = "pytorch_model.bin";
/// BGE-M3's sparse head, safetensors format (preferred).
pub const SPARSE_HEAD_SAFETENSORS_FILE: &str = "sparse_linear.safetensors";
/// BGE-M3's sparse head, PyTorch format.
pub const SPARSE_HEAD_PYTORCH_FILE: &str = "sparse_linear.pt";
/// sentence-transformers' pooling configuration.
pub const POOLING_CONFIG_FILE: &str = "1_Pooling/config.json";
/// sentence-transformers' configuration (maximum sequence length).
pub const SENTENCE_BERT_CONFIG_FILE: &str = "sentence_bert_config.json";

/// The default maximum number of tokens of an embedded text: the `max_length` loom-notes 1.1.0
/// passed to BGE-M3 (lowered further by `sentence_bert_config.json` or the model's positions).
pub const DEFAULT_EMBEDDING_MAX_LENGTH: usize = 1024;
/// The default maximum number of tokens of a (query, passage) pair: FlagReranker's default, which
/// loom-notes 1.1.0 used.
pub const DEFAULT_RERANKING_MAX_LENGTH: usize = 512;
/// The default number of texts per forward pass (loom-notes 1.1.0's `batch_size`).
pub const DEFAULT_BATCH_SIZE: usize = 16;

/// The transformer architectures this crate runs, from `config.json`'s `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `bert` (all-MiniLM-L6-v2 and other sentence-transformers BERT models).
    Bert,
    /// `xlm-roberta` (BGE-M3, bge-reranker-v2-m3, multilingual-e5).
    XlmRoberta,
}

impl Architecture {
    /// The `model_type` of `config.json` naming this architecture.
    pub fn model_type(self) -> &'static str {
        match self {
            Self::Bert => "bert",
            Self::XlmRoberta => "xlm-roberta",
        }
    }

    /// The special tokens whose ids never enter a sparse vector.
    pub fn special_tokens(self) -> &'static [&'static str] {
        match self {
            Self::Bert => &["[CLS]", "[SEP]", "[PAD]", "[UNK]"],
            Self::XlmRoberta => &["<s>", "</s>", "<pad>", "<unk>"],
        }
    }
}

/// How token states become one text vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The first token's hidden state (BGE-M3).
    Cls,
    /// The mean of the hidden states over the attention mask (sentence-transformers MiniLM).
    Mean,
}

/// A weights file and its format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightsFile {
    /// The file.
    pub path: PathBuf,
    /// How it is encoded.
    pub format: WeightsFormat,
}

/// The encoding of a weights file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightsFormat {
    /// safetensors (read into memory, no mmap).
    Safetensors,
    /// A PyTorch `torch.save` archive (`.bin`, `.pt`).
    PyTorch,
}

/// What the loaded model is used for: sets the default maximum length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Embedding texts (one sequence).
    Embedding,
    /// Scoring (query, passage) pairs.
    Reranking,
}

/// The caller's choices when loading a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOptions {
    /// The model's name (recorded in `meta.json`); the directory's name when `None`.
    pub name: Option<String>,
    /// The maximum number of tokens per sequence (longer ones are truncated); the purpose's
    /// default when `None` (see [`ModelDir::max_length`]).
    pub max_length: Option<usize>,
    /// The number of sequences per forward pass (at least 1).
    pub batch_size: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            name: None,
            max_length: None,
            batch_size: DEFAULT_BATCH_SIZE,
        }
    }
}

impl LoadOptions {
    /// Checks the options that do not depend on the model (`batch_size` ≥ 1).
    pub fn validate(&self) -> Result<()> {
        if self.batch_size == 0 {
            return Err(Error::InvalidOption {
                option: "batch_size",
                message: "must be at least 1".into(),
            });
        }
        if self
            .name
            .as_deref()
            .is_some_and(|name| name.trim().is_empty())
        {
            return Err(Error::InvalidOption {
                option: "name",
                message: "must not be empty".into(),
            });
        }
        Ok(())
    }
}

/// A checked model directory: its files exist and `config.json` names a supported architecture.
#[derive(Debug, Clone)]
pub struct ModelDir {
    path: PathBuf,
    architecture: Architecture,
    hidden_size: usize,
    max_position_embeddings: usize,
    pad_token_id: u32,
    architectures: Vec<String>,
    num_labels: Option<usize>,
    pooling: Pooling,
    sentence_max_length: Option<usize>,
    weights: WeightsFile,
    sparse_head: Option<WeightsFile>,
}

impl ModelDir {
    /// Reads and checks the directory `dir`: `config.json` (valid, supported `model_type`),
    /// `tokenizer.json` and a weights file must be present; the optional files are parsed when
    /// present.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let path = dir.as_ref().to_path_buf();
        if !path.is_dir() {
            return Err(Error::NotADirectory { dir: path });
        }
        let config_path = required_file(&path, CONFIG_FILE)?;
        let config = read_json(&config_path)?;
        let model_type = config
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(&config_path, "missing string field model_type"))?;
        let architecture = match model_type {
            "bert" => Architecture::Bert,
            "xlm-roberta" => Architecture::XlmRoberta,
            other => {
                return Err(Error::UnsupportedModelType {
                    path: config_path,
                    model_type: other.to_owned(),
                });
            }
        };
        let hidden_size = positive_field(&config, &config_path, "hidden_size")?;
        let max_position_embeddings =
            positive_field(&config, &config_path, "max_position_embeddings")?;
        let pad_token_id = match config.get("pad_token_id") {
            None | Some(Value::Null) => match architecture {
                Architecture::Bert => 0,
                Architecture::XlmRoberta => 1,
            },
            Some(value) => value
                .as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| invalid(&config_path, "pad_token_id is not a token id"))?,
        };
        if architecture == Architecture::XlmRoberta
            && max_position_embeddings <= pad_token_id as usize + 3
        {
            return Err(invalid(
                &config_path,
                "max_position_embeddings leaves no position after pad_token_id",
            ));
        }
        let architectures = match config.get("architectures") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| {
                    item.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| invalid(&config_path, "architectures holds a non-string"))
                })
                .collect::<Result<_>>()?,
            Some(_) => return Err(invalid(&config_path, "architectures is not an array")),
        };
        let num_labels = match (config.get("num_labels"), config.get("id2label")) {
            (Some(value), _) => Some(
                value
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| invalid(&config_path, "num_labels is not a count"))?,
            ),
            (None, Some(Value::Object(labels))) => Some(labels.len()),
            (None, Some(_)) => return Err(invalid(&config_path, "id2label is not an object")),
            (None, None) => None,
        };
        required_file(&path, TOKENIZER_FILE)?;
        let weights = first_present(&path, SAFETENSORS_WEIGHTS_FILE, PYTORCH_WEIGHTS_FILE)
            .ok_or_else(|| Error::MissingFile {
                dir: path.clone(),
                file: format!("{SAFETENSORS_WEIGHTS_FILE} (or {PYTORCH_WEIGHTS_FILE})"),
            })?;
        let sparse_head = first_present(
            &path,
            SPARSE_HEAD_SAFETENSORS_FILE,
            SPARSE_HEAD_PYTORCH_FILE,
        );
        let pooling = read_pooling(&path)?.unwrap_or(match architecture {
            Architecture::Bert => Pooling::Mean,
            Architecture::XlmRoberta => Pooling::Cls,
        });
        let sentence_max_length = read_sentence_max_length(&path)?;
        Ok(Self {
            path,
            architecture,
            hidden_size,
            max_position_embeddings,
            pad_token_id,
            architectures,
            num_labels,
            pooling,
            sentence_max_length,
            weights,
            sparse_head,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory's own name (the default model name), or its whole path when it has none.
    pub fn default_name(&self) -> String {
        self.path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.path.display().to_string())
    }

    /// The model's name: the one in `options`, else [`Self::default_name`].
    pub fn name(&self, options: &LoadOptions) -> String {
        options.name.clone().unwrap_or_else(|| self.default_name())
    }

    /// `config.json`'s path.
    pub fn config_path(&self) -> PathBuf {
        self.path.join(CONFIG_FILE)
    }

    /// `tokenizer.json`'s path.
    pub fn tokenizer_path(&self) -> PathBuf {
        self.path.join(TOKENIZER_FILE)
    }

    /// The architecture named by `model_type`.
    pub fn architecture(&self) -> Architecture {
        self.architecture
    }

    /// `hidden_size`: the length of the dense vectors.
    pub fn hidden_size(&self) -> usize {
        self.hidden_size
    }

    /// `pad_token_id` (0 for BERT, 1 for XLM-R when absent).
    pub fn pad_token_id(&self) -> u32 {
        self.pad_token_id
    }

    /// `config.json`'s `architectures` (empty when absent).
    pub fn architectures(&self) -> &[String] {
        &self.architectures
    }

    /// The number of classifier outputs (`num_labels`, else the size of `id2label`), if given.
    pub fn num_labels(&self) -> Option<usize> {
        self.num_labels
    }

    /// The pooling from `1_Pooling/config.json`; without it, mean for BERT and CLS for XLM-R.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// The weights file (`model.safetensors`, else `pytorch_model.bin`).
    pub fn weights(&self) -> &WeightsFile {
        &self.weights
    }

    /// BGE-M3's sparse head (`sparse_linear.safetensors`, else `sparse_linear.pt`), if present.
    pub fn sparse_head(&self) -> Option<&WeightsFile> {
        self.sparse_head.as_ref()
    }

    /// The longest sequence the position embeddings allow: `max_position_embeddings` for BERT;
    /// for XLM-R, whose positions start after the padding id, `max_position_embeddings -
    /// pad_token_id - 1` (8192 for BGE-M3).
    pub fn position_limit(&self) -> usize {
        match self.architecture {
            Architecture::Bert => self.max_position_embeddings,
            Architecture::XlmRoberta => {
                self.max_position_embeddings - self.pad_token_id as usize - 1
            }
        }
    }

    /// The maximum number of tokens per sequence: `requested` when given (refused above
    /// [`Self::position_limit`] or below 4); otherwise, for embedding, the smallest of
    /// `sentence_bert_config.json`'s `max_seq_length`, the position limit and
    /// [`DEFAULT_EMBEDDING_MAX_LENGTH`]; for reranking, the smallest of the position limit and
    /// [`DEFAULT_RERANKING_MAX_LENGTH`].
    pub fn max_length(&self, purpose: Purpose, requested: Option<usize>) -> Result<usize> {
        let limit = self.position_limit();
        if let Some(requested) = requested {
            if requested > limit {
                return Err(Error::InvalidOption {
                    option: "max_length",
                    message: format!(
                        "{requested} exceeds the {limit} positions of the model in {}",
                        self.path.display()
                    ),
                });
            }
            if requested < 4 {
                return Err(Error::InvalidOption {
                    option: "max_length",
                    message: format!("{requested} leaves no room for text (at least 4)"),
                });
            }
            return Ok(requested);
        }
        Ok(match purpose {
            Purpose::Embedding => self
                .sentence_max_length
                .unwrap_or(limit)
                .min(limit)
                .min(DEFAULT_EMBEDDING_MAX_LENGTH),
            Purpose::Reranking => limit.min(DEFAULT_RERANKING_MAX_LENGTH),
        })
    }

    /// Checks that the directory holds a model of `expected` architecture.
    pub fn expect_architecture(&self, expected: Architecture) -> Result<()> {
        if self.architecture == expected {
            Ok(())
        } else {
            Err(Error::WrongArchitecture {
                path: self.config_path(),
                expected: expected.model_type(),
                found: self.architecture.model_type(),
            })
        }
    }

    /// Checks that the directory holds a cross-encoder this crate runs as a reranker: XLM-R with
    /// `XLMRobertaForSequenceClassification` in `architectures` and a single label.
    pub fn check_reranker(&self) -> Result<()> {
        let path = self.config_path();
        if self.architecture != Architecture::XlmRoberta {
            return Err(Error::NotAReranker {
                path,
                reason: "only xlm-roberta cross-encoders are supported".into(),
            });
        }
        if !self
            .architectures
            .iter()
            .any(|name| name == "XLMRobertaForSequenceClassification")
        {
            return Err(Error::NotAReranker {
                path,
                reason: "architectures does not list XLMRobertaForSequenceClassification".into(),
            });
        }
        match self.num_labels {
            None | Some(1) => Ok(()),
            Some(n) => Err(Error::NotAReranker {
                path,
                reason: format!("{n} labels, a relevance score needs exactly 1"),
            }),
        }
    }
}

fn invalid(path: &Path, message: &str) -> Error {
    Error::InvalidConfig {
        path: path.to_path_buf(),
        message: message.to_owned(),
    }
}

fn required_file(dir: &Path, name: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::MissingFile {
            dir: dir.to_path_buf(),
            file: name.to_owned(),
        })
    }
}

fn first_present(dir: &Path, safetensors: &str, pytorch: &str) -> Option<WeightsFile> {
    [
        (safetensors, WeightsFormat::Safetensors),
        (pytorch, WeightsFormat::PyTorch),
    ]
    .into_iter()
    .map(|(name, format)| WeightsFile {
        path: dir.join(name),
        format,
    })
    .find(|file| file.path.is_file())
}

pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let value: Value = serde_json::from_str(&text).map_err(|error| Error::InvalidConfig {
        path: path.to_path_buf(),
        message: error.to_string(),
    })?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(invalid(path, "not a JSON object"))
    }
}

fn positive_field(config: &Value, path: &Path, field: &str) -> Result<usize> {
    config
        .get(field)
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            invalid(
                path,
                &format!("{field} is missing or not a positive integer"),
            )
        })
}

fn read_pooling(dir: &Path) -> Result<Option<Pooling>> {
    let path = dir.join(POOLING_CONFIG_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let config = read_json(&path)?;
    let flag = |field: &str| config.get(field).and_then(Value::as_bool).unwrap_or(false);
    if flag("pooling_mode_cls_token") {
        Ok(Some(Pooling::Cls))
    } else if flag("pooling_mode_mean_tokens") {
        Ok(Some(Pooling::Mean))
    } else {
        Err(invalid(
            &path,
            "neither pooling_mode_cls_token nor pooling_mode_mean_tokens is true (only CLS and mean pooling are supported)",
        ))
    }
}

fn read_sentence_max_length(dir: &Path) -> Result<Option<usize>> {
    let path = dir.join(SENTENCE_BERT_CONFIG_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let config = read_json(&path)?;
    match config.get("max_seq_length") {
        None | Some(Value::Null) => Ok(None),
        Some(_) => positive_field(&config, &path, "max_seq_length").map(Some),
    }
}

#[cfg(test)]
mod tests;
