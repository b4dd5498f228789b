//! Configuration (reference A.3): every `LOOM_NOTES_*` knob the Rust version uses, with the
//! reference's defaults, read from environment-like `(name, value)` pairs.

use std::path::{Path, PathBuf};

use crate::chunk::ChunkSizes;

/// The prefix of every variable read by [`Settings::from_vars`].
pub const PREFIX: &str = "LOOM_NOTES_";

/// Variables of the Python version that this one accepts and ignores (there is no Qdrant here:
/// the store is SQLite, see `loom-notes-sqlite`).
const IGNORED: &[&str] = &[
    "QDRANT_URL",
    "QDRANT_API_KEY",
    "CHUNKS_COLLECTION",
    "DOCUMENTS_COLLECTION",
];

/// A `LOOM_NOTES_*` variable whose value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}: invalid value '{value}' (expected {expected})")]
pub struct SettingsError {
    /// The variable, upper case with its prefix (`LOOM_NOTES_MIN_SCORE`).
    pub variable: String,
    /// The value as given.
    pub value: String,
    /// What was expected (`a number`, `true or false`, ...).
    pub expected: &'static str,
}

/// loom-notes' configuration. Field names are the variables' names without `LOOM_NOTES_`, in
/// lower case.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `DATA_DIR`: where the store lives; `None` = the XDG rule ([`Settings::resolve_data_dir`]).
    pub data_dir: Option<PathBuf>,
    /// `MODEL_DIR` (new in the Rust version): where real model weights are read from.
    pub model_dir: Option<PathBuf>,
    /// `DENSE_MODEL`: the embedder's name, recorded in the index meta (`BAAI/bge-m3`).
    pub dense_model: String,
    /// `DENSE_DIM`: the embedder's dimension (1024; the fake embedder is always 64).
    pub dense_dim: usize,
    /// `RERANKER_MODEL` (`BAAI/bge-reranker-v2-m3`).
    pub reranker_model: String,
    /// `DEVICE`: `auto`, `cpu`, `cuda`, `mps` (real models only).
    pub device: String,
    /// `USE_FP16` (real models on a GPU only).
    pub use_fp16: bool,
    /// `FAKE_MODELS`: use the deterministic fake models of A.8.
    pub fake_models: bool,
    /// `WARMUP_ON_START`: the server loads the models in the background at start.
    pub warmup_on_start: bool,
    /// `CHUNK_TARGET_CHARS` (1800).
    pub chunk_target_chars: usize,
    /// `CHUNK_MAX_CHARS` (2400).
    pub chunk_max_chars: usize,
    /// `CHUNK_OVERLAP_CHARS` (180).
    pub chunk_overlap_chars: usize,
    /// `CHUNK_MIN_CHARS` (200).
    pub chunk_min_chars: usize,
    /// `PREFETCH_LIMIT`: candidates per branch, dense and sparse (15).
    pub prefetch_limit: usize,
    /// `RERANK_CANDIDATES`: the fusion's size, the reranker's input (20).
    pub rerank_candidates: usize,
    /// `MAX_CHUNKS_PER_DOC`: hits per document (2).
    pub max_chunks_per_doc: usize,
    /// `SNIPPET_CHARS`: the extract of a long chunk (300).
    pub snippet_chars: usize,
    /// `FULL_CHUNK_CHARS`: chunks up to this length are shown whole (1000).
    pub full_chunk_chars: usize,
    /// `MIN_SCORE`: the reranker score under which search stops (0.1).
    pub min_score: f64,
    /// `ALLOWED_ROOTS`: the directories `add_file` may read (`:`-separated, blanks dropped;
    /// `~` is expanded when checked).
    pub allowed_roots: Vec<PathBuf>,
    /// `DENY_PATTERNS`: glob patterns added to the built-in deny list (`:`-separated).
    pub deny_patterns: Vec<String>,
    /// `FETCH_TIMEOUT_S` (20.0).
    pub fetch_timeout_s: f64,
    /// `FETCH_MAX_BYTES`: after decompression (5,000,000).
    pub fetch_max_bytes: u64,
    /// `FETCH_ALLOW_PRIVATE`: let `add_url` reach private addresses.
    pub fetch_allow_private: bool,
    /// `USER_AGENT` of `add_url`.
    pub user_agent: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            data_dir: None,
            model_dir: None,
            dense_model: "BAAI/bge-m3".to_owned(),
            dense_dim: 1024,
            reranker_model: "BAAI/bge-reranker-v2-m3".to_owned(),
            device: "auto".to_owned(),
            use_fp16: true,
            fake_models: false,
            warmup_on_start: true,
            chunk_target_chars: 1800,
            chunk_max_chars: 2400,
            chunk_overlap_chars: 180,
            chunk_min_chars: 200,
            prefetch_limit: 15,
            rerank_candidates: 20,
            max_chunks_per_doc: 2,
            snippet_chars: 300,
            full_chunk_chars: 1000,
            min_score: 0.1,
            allowed_roots: Vec::new(),
            deny_patterns: Vec::new(),
            fetch_timeout_s: 20.0,
            fetch_max_bytes: 5_000_000,
            fetch_allow_private: false,
            user_agent: "loom-notes/1.1.0 (+https://github.com/denislamard/loom-notes)".to_owned(),
        }
    }
}

impl Settings {
    /// Reads `LOOM_NOTES_*` variables (names case-insensitive) over the defaults; a bad value
    /// is an error naming the variable and the value. Other variables are ignored, and so are
    /// the Qdrant-only ones of the Python version (`QDRANT_URL`, `QDRANT_API_KEY`,
    /// `CHUNKS_COLLECTION`, `DOCUMENTS_COLLECTION`), with a warning.
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, SettingsError> {
        let mut settings = Settings::default();
        for (name, value) in vars {
            let upper = name.to_ascii_uppercase();
            let Some(key) = upper.strip_prefix(PREFIX) else {
                continue;
            };
            settings.set(key, &value)?;
        }
        Ok(settings)
    }

    /// Reads the process environment ([`Settings::from_vars`] over `std::env::vars_os`, names
    /// or values that are not UTF-8 skipped).
    pub fn from_env() -> Result<Settings, SettingsError> {
        Settings::from_vars(std::env::vars_os().filter_map(|(name, value)| {
            Some((name.into_string().ok()?, value.into_string().ok()?))
        }))
    }

    fn set(&mut self, key: &str, value: &str) -> Result<(), SettingsError> {
        let v = Value { key, value };
        match key {
            "DATA_DIR" => self.data_dir = Some(v.path()?),
            "MODEL_DIR" => self.model_dir = Some(v.path()?),
            "DENSE_MODEL" => self.dense_model = value.to_owned(),
            "DENSE_DIM" => self.dense_dim = v.count()?,
            "RERANKER_MODEL" => self.reranker_model = value.to_owned(),
            "DEVICE" => self.device = value.to_owned(),
            "USE_FP16" => self.use_fp16 = v.bool()?,
            "FAKE_MODELS" => self.fake_models = v.bool()?,
            "WARMUP_ON_START" => self.warmup_on_start = v.bool()?,
            "CHUNK_TARGET_CHARS" => self.chunk_target_chars = v.count()?,
            "CHUNK_MAX_CHARS" => self.chunk_max_chars = v.count()?,
            "CHUNK_OVERLAP_CHARS" => self.chunk_overlap_chars = v.count()?,
            "CHUNK_MIN_CHARS" => self.chunk_min_chars = v.count()?,
            "PREFETCH_LIMIT" => self.prefetch_limit = v.count()?,
            "RERANK_CANDIDATES" => self.rerank_candidates = v.count()?,
            "MAX_CHUNKS_PER_DOC" => self.max_chunks_per_doc = v.count()?,
            "SNIPPET_CHARS" => self.snippet_chars = v.count()?,
            "FULL_CHUNK_CHARS" => self.full_chunk_chars = v.count()?,
            "MIN_SCORE" => self.min_score = v.number()?,
            "ALLOWED_ROOTS" => self.allowed_roots = v.list().map(PathBuf::from).collect(),
            "DENY_PATTERNS" => self.deny_patterns = v.list().map(str::to_owned).collect(),
            "FETCH_TIMEOUT_S" => self.fetch_timeout_s = v.positive_number()?,
            "FETCH_MAX_BYTES" => self.fetch_max_bytes = v.count()? as u64,
            "FETCH_ALLOW_PRIVATE" => self.fetch_allow_private = v.bool()?,
            "USER_AGENT" => self.user_agent = value.to_owned(),
            ignored if IGNORED.contains(&ignored) => {
                tracing::warn!(
                    variable = %format!("{PREFIX}{ignored}"),
                    "ignored: loom-notes stores its index in SQLite, not Qdrant"
                );
            }
            _ => {}
        }
        Ok(())
    }

    /// The chunking sizes (`CHUNK_*`).
    pub fn chunk_sizes(&self) -> ChunkSizes {
        ChunkSizes {
            target: self.chunk_target_chars,
            max: self.chunk_max_chars,
            overlap: self.chunk_overlap_chars,
            min: self.chunk_min_chars,
        }
    }

    /// The data directory: [`Settings::data_dir`] when set, else `$XDG_DATA_HOME/loom-notes`
    /// when `xdg_data_home` is absolute, else `~/.local/share/loom-notes` (`None` without a
    /// home directory).
    pub fn resolve_data_dir(
        &self,
        xdg_data_home: Option<&Path>,
        home: Option<&Path>,
    ) -> Option<PathBuf> {
        if let Some(dir) = &self.data_dir {
            return Some(dir.clone());
        }
        if let Some(xdg) = xdg_data_home.filter(|p| p.is_absolute()) {
            return Some(xdg.join("loom-notes"));
        }
        home.map(|home| home.join(".local/share/loom-notes"))
    }
}

/// One variable's value being parsed.
struct Value<'a> {
    key: &'a str,
    value: &'a str,
}

impl Value<'_> {
    fn error(&self, expected: &'static str) -> SettingsError {
        SettingsError {
            variable: format!("{PREFIX}{}", self.key),
            value: self.value.to_owned(),
            expected,
        }
    }

    fn path(&self) -> Result<PathBuf, SettingsError> {
        let trimmed = self.value.trim();
        if trimmed.is_empty() {
            return Err(self.error("a path"));
        }
        Ok(PathBuf::from(trimmed))
    }

    fn count(&self) -> Result<usize, SettingsError> {
        self.value
            .trim()
            .parse()
            .map_err(|_| self.error("a non-negative integer"))
    }

    fn number(&self) -> Result<f64, SettingsError> {
        self.value
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite())
            .ok_or_else(|| self.error("a number"))
    }

    fn positive_number(&self) -> Result<f64, SettingsError> {
        self.number()
            .ok()
            .filter(|x| *x > 0.0)
            .ok_or_else(|| self.error("a number of seconds above 0"))
    }

    /// Pydantic's boolean strings.
    fn bool(&self) -> Result<bool, SettingsError> {
        match self.value.trim().to_ascii_lowercase().as_str() {
            "1" | "on" | "t" | "true" | "y" | "yes" => Ok(true),
            "0" | "off" | "f" | "false" | "n" | "no" => Ok(false),
            _ => Err(self.error("true or false")),
        }
    }

    /// `:`-separated, blank entries dropped.
    fn list(&self) -> impl Iterator<Item = &str> {
        self.value
            .split(':')
            .map(str::trim)
            .filter(|e| !e.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_are_the_reference_ones() {
        let s = Settings::default();
        assert_eq!(s.chunk_sizes(), ChunkSizes::default());
        assert_eq!((s.prefetch_limit, s.rerank_candidates), (15, 20));
        assert_eq!((s.max_chunks_per_doc, s.snippet_chars), (2, 300));
        assert_eq!((s.full_chunk_chars, s.min_score), (1000, 0.1));
        assert_eq!((s.dense_model.as_str(), s.dense_dim), ("BAAI/bge-m3", 1024));
        assert_eq!(s.fetch_max_bytes, 5_000_000);
        assert!(!s.fake_models && !s.fetch_allow_private && s.warmup_on_start);
        assert_eq!(Settings::from_vars(Vec::new()), Ok(Settings::default()));
    }

    #[test]
    fn names_are_case_insensitive_and_values_parsed() {
        let s = Settings::from_vars(vars(&[
            ("loom_notes_min_score", "0.25"),
            ("LOOM_NOTES_Fake_Models", "YES"),
            ("LOOM_NOTES_CHUNK_TARGET_CHARS", " 300 "),
            ("LOOM_NOTES_ALLOWED_ROOTS", "/a::~/notes: "),
            ("LOOM_NOTES_DENY_PATTERNS", "*.secret"),
            ("LOOM_NOTES_DATA_DIR", "/tmp/x"),
            ("LOOM_NOTES_QDRANT_URL", "http://localhost:6333"),
            ("LOOM_NOTES_UNKNOWN", "whatever"),
            ("HOME", "/root"),
        ]))
        .expect("valid settings");
        assert_eq!(s.min_score, 0.25);
        assert!(s.fake_models);
        assert_eq!(s.chunk_target_chars, 300);
        assert_eq!(
            s.allowed_roots,
            vec![PathBuf::from("/a"), PathBuf::from("~/notes")]
        );
        assert_eq!(s.deny_patterns, vec!["*.secret"]);
        assert_eq!(s.data_dir, Some(PathBuf::from("/tmp/x")));
    }

    #[test]
    fn a_bad_value_names_the_variable_and_the_value() {
        let err = Settings::from_vars(vars(&[("loom_notes_prefetch_limit", "many")]))
            .expect_err("not a count");
        assert_eq!(err.variable, "LOOM_NOTES_PREFETCH_LIMIT");
        assert_eq!(
            err.to_string(),
            "LOOM_NOTES_PREFETCH_LIMIT: invalid value 'many' (expected a non-negative integer)"
        );
        let err = Settings::from_vars(vars(&[("LOOM_NOTES_FAKE_MODELS", "maybe")]))
            .expect_err("not a bool");
        assert_eq!(err.expected, "true or false");
        assert!(Settings::from_vars(vars(&[("LOOM_NOTES_MIN_SCORE", "nan")])).is_err());
        assert!(Settings::from_vars(vars(&[("LOOM_NOTES_FETCH_TIMEOUT_S", "0")])).is_err());
        assert!(Settings::from_vars(vars(&[("LOOM_NOTES_DATA_DIR", " ")])).is_err());
    }

    #[test]
    fn data_dir_follows_the_xdg_rule() {
        let s = Settings::default();
        let home = Path::new("/home/u");
        assert_eq!(
            s.resolve_data_dir(Some(Path::new("/xdg")), Some(home)),
            Some(PathBuf::from("/xdg/loom-notes"))
        );
        assert_eq!(
            s.resolve_data_dir(Some(Path::new("relative")), Some(home)),
            Some(PathBuf::from("/home/u/.local/share/loom-notes"))
        );
        assert_eq!(s.resolve_data_dir(None, None), None);
        let s = Settings {
            data_dir: Some(PathBuf::from("/d")),
            ..Settings::default()
        };
        assert_eq!(
            s.resolve_data_dir(Some(Path::new("/xdg")), Some(home)),
            Some(PathBuf::from("/d"))
        );
    }
}
