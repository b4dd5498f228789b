//! The one error type of the crate: a variant per rule.

use std::path::PathBuf;

/// Why a source could not be read: one variant per rule, each message naming the rule's
/// subject and the offending value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// `add_file` is disabled: no allowed root is configured.
    #[error("add_file disabled: no root in LOOM_NOTES_ALLOWED_ROOTS")]
    NoRoots,
    /// The resolved path is inside none of the allowed roots.
    #[error("path outside the allowed roots: {}", target.display())]
    OutsideRoots {
        /// The resolved path (`~`, `..` and symbolic links resolved).
        target: PathBuf,
    },
    /// A component of the path under its root matches a deny pattern.
    #[error("path refused by the pattern '{pattern}': {}", target.display())]
    Denied {
        /// The first matching pattern (built-in or configured).
        pattern: String,
        /// The resolved path.
        target: PathBuf,
    },
    /// The extension is not one of `.md`, `.markdown`, `.txt` (any case).
    #[error(
        "extension not allowed ({}); expected: .markdown, .md, .txt",
        suffix.as_deref().unwrap_or("none")
    )]
    Extension {
        /// The extension found, with its dot, or `None` when the name has none.
        suffix: Option<String>,
    },
    /// The path cannot be resolved (a symbolic link loop, an unreadable link, no working
    /// directory).
    #[error("path cannot be resolved: {} ({reason})", path.display())]
    Unresolvable {
        /// The path as given.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// Nothing exists at the resolved path.
    #[error("file not found: {}", path.display())]
    FileNotFound {
        /// The resolved path.
        path: PathBuf,
    },
    /// The resolved path exists but is not a regular file (a directory, a FIFO, a device...).
    #[error("not a regular file ({kind}): {}", path.display())]
    NotRegularFile {
        /// The resolved path.
        path: PathBuf,
        /// What it is instead (`directory`, `fifo`, `character device`, ...).
        kind: &'static str,
    },
    /// The file is larger than the size cap.
    #[error("file too large: {} is more than {max} bytes", path.display())]
    FileTooLarge {
        /// The resolved path.
        path: PathBuf,
        /// The cap, in bytes.
        max: u64,
    },
    /// The file is empty (or only whitespace).
    #[error("empty file: {}", path.display())]
    EmptyFile {
        /// The resolved path.
        path: PathBuf,
    },
    /// The file is not valid UTF-8.
    #[error("invalid UTF-8 in {}: invalid byte 0x{byte:02x} at position {position}", path.display())]
    InvalidUtf8 {
        /// The resolved path.
        path: PathBuf,
        /// The offset of the first invalid byte.
        position: usize,
        /// That byte.
        byte: u8,
    },
    /// The file could not be opened or read (permissions, I/O error).
    #[error("cannot read {}: {source}", path.display())]
    FileRead {
        /// The resolved path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}
