//! The crate's error: a model directory that cannot be used, or a model that failed.

use std::path::PathBuf;

use loom_notes_core::ModelError;

/// Why a model directory cannot be loaded, or why a loaded model failed.
///
/// Every variant names the file (or the model) it is about.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The model directory does not exist or is not a directory.
    #[error("model directory {dir}: not found or not a directory")]
    NotADirectory {
        /// The directory given.
        dir: PathBuf,
    },
    /// A file the model needs is not in its directory.
    #[error("model directory {dir}: missing {file}")]
    MissingFile {
        /// The model directory.
        dir: PathBuf,
        /// The missing file (or the accepted alternatives).
        file: String,
    },
    /// A file exists but cannot be read.
    #[error("{path}: cannot read: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// A JSON configuration file is not valid JSON or lacks a field the model needs.
    #[error("{path}: invalid configuration: {message}")]
    InvalidConfig {
        /// The configuration file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// `config.json` names an architecture this crate does not run.
    #[error(
        "{path}: model_type {model_type:?} is not supported (expected \"bert\" or \"xlm-roberta\")"
    )]
    UnsupportedModelType {
        /// The `config.json` file.
        path: PathBuf,
        /// Its `model_type`.
        model_type: String,
    },
    /// A loader for one architecture was given a directory of another.
    #[error("{path}: model_type is {found:?}, this loader needs {expected:?}")]
    WrongArchitecture {
        /// The `config.json` file.
        path: PathBuf,
        /// The `model_type` the loader runs.
        expected: &'static str,
        /// The directory's `model_type`.
        found: &'static str,
    },
    /// A reranker was asked for but the directory holds another kind of model.
    #[error("{path}: not a cross-encoder reranker: {reason}")]
    NotAReranker {
        /// The `config.json` file.
        path: PathBuf,
        /// What disqualifies it.
        reason: String,
    },
    /// An option given by the caller is out of range.
    #[error("invalid model option {option}: {message}")]
    InvalidOption {
        /// The option's name (`max_length`, `batch_size`).
        option: &'static str,
        /// What is wrong with the value.
        message: String,
    },
    /// `tokenizer.json` cannot be loaded or configured.
    #[error("{path}: invalid tokenizer: {message}")]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// The tokenizer library's message.
        message: String,
    },
    /// A weights file cannot be decoded, or lacks a tensor the architecture needs.
    #[error("{path}: invalid weights: {message}")]
    Weights {
        /// The weights file.
        path: PathBuf,
        /// The tensor library's message.
        message: String,
    },
    /// Tokenization or the forward pass of a loaded model failed.
    #[error("model {model}: inference failed: {message}")]
    Inference {
        /// The model's name.
        model: String,
        /// What failed.
        message: String,
    },
}

impl Error {
    /// This error as the ports' [`ModelError`], attributed to `model`.
    pub fn into_model_error(self, model: &str) -> ModelError {
        let message = match self {
            // The model is already the ModelError's subject: do not repeat it.
            Self::Inference { message, .. } => format!("inference failed: {message}"),
            other => other.to_string(),
        };
        ModelError {
            model: model.to_owned(),
            message,
        }
    }
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inference_errors_do_not_repeat_the_model_name() {
        let error = Error::Inference {
            model: "minilm".into(),
            message: "shape mismatch".into(),
        };
        let model_error = error.into_model_error("minilm");
        assert_eq!(
            model_error.to_string(),
            "model minilm: inference failed: shape mismatch"
        );
    }

    #[test]
    fn loading_errors_keep_the_file_they_name() {
        let error = Error::MissingFile {
            dir: PathBuf::from("/models/minilm"),
            file: "tokenizer.json".into(),
        };
        let model_error = error.into_model_error("minilm");
        assert_eq!(model_error.model, "minilm");
        assert_eq!(
            model_error.message,
            "model directory /models/minilm: missing tokenizer.json"
        );
    }
}
