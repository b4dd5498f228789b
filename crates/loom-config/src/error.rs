//! The one error type of this crate.

use std::{fmt, path::PathBuf};

/// What went wrong, broadly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConfigErrorKind {
    /// The YAML (or a template) cannot be parsed.
    Syntax,
    /// A key that the format does not know.
    UnknownKey,
    /// The same key twice in one mapping.
    DuplicateKey,
    /// A value of the wrong type or out of its range, or a rule between fields broken.
    Invalid,
    /// A name that refers to nothing (model, agent, tool, profile).
    Reference,
    /// A file named by the configuration does not exist.
    MissingFile,
    /// A prompt template uses an unknown variable or does not render.
    Template,
    /// A file or directory cannot be read.
    Io,
}

/// A configuration error, located as precisely as possible.
///
/// Displays as `{file}:{line}:{column} {key_path}: {message}`, without `:{line}:{column}`
/// when the location is unknown, e.g.
/// `agents/devis.yaml:7:10 main.model: unknown model 'X' (declared models: fake-1)`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file, as shown to the user: the config file as given, other files relative to the
    /// config file's directory when inside it.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// Where in the document: `main.model`, `models[0].pricing.tiers[1].above`, `(root)`.
    pub key_path: String,
    /// What is wrong.
    pub message: String,
    /// The category.
    pub kind: ConfigErrorKind,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let (Some(line), Some(column)) = (self.line, self.column) {
            write!(f, ":{line}:{column}")?;
        }
        write!(f, " {}: {}", self.key_path, self.message)
    }
}
