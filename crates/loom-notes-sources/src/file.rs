//! `add_file`'s access control and reading (reference A.9, then A.5).
//!
//! Checks, in this order: a root is configured; the resolved target is inside one resolved
//! root; no component of the path under that root matches a deny pattern; the extension is
//! allowed. Then the file is read: it must exist, be a regular file, be under the size cap,
//! be valid UTF-8 and not be blank.
//!
//! Resolution follows Python's `Path.expanduser().resolve()` (non-strict): relative paths are
//! taken against the working directory, symbolic links are followed, `..` removes the
//! previous component of the path resolved so far, and components that do not exist are kept
//! as written. The file is then opened without following a final symbolic link and without
//! blocking (`O_NOFOLLOW | O_NONBLOCK` on Unix), and its type is checked on the open handle,
//! so a FIFO or a device never blocks or streams forever, and a link swapped in for the file
//! after the checks is refused. A directory swapped for a link between the checks and the
//! open is not detected (the same window as the Python version).

use std::{
    collections::VecDeque,
    ffi::OsString,
    fs,
    io::{self, Read},
    path::{Component, Path, PathBuf},
    sync::LazyLock,
};

use regex::Regex;

use crate::{SourceDocument, SourceError, glob::fnmatch_case};

/// The built-in deny patterns (reference A.9 `BASE_DENY`); configured patterns are added to
/// them, never replace them.
pub const BASE_DENY: &[&str] = &[
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "id_rsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".ssh",
    ".aws",
    ".gnupg",
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".git",
    ".venv",
    "node_modules",
    "__pycache__",
];

/// The extensions `add_file` reads, compared case-insensitively.
pub const ALLOWED_EXTENSIONS: &[&str] = &[".markdown", ".md", ".txt"];

/// The default size cap of a file read by [`FileAccess`]: 5 MB.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 5_000_000;

/// The most symbolic links followed while resolving one path (Linux's `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

static TITLE: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"(?m)^#\s+(.+?)\s*$").ok());

/// `add_file`'s gate: which local files may be read, and the reading itself.
#[derive(Debug, Clone)]
pub struct FileAccess {
    roots: Vec<PathBuf>,
    deny: Vec<String>,
    max_bytes: u64,
}

impl FileAccess {
    /// A gate over `allowed_roots` (resolved at each check, `~` expanded) with the built-in
    /// deny list plus `deny_patterns`, and the default size cap
    /// ([`DEFAULT_MAX_FILE_BYTES`]). Blank roots and patterns are dropped.
    pub fn new(allowed_roots: Vec<PathBuf>, deny_patterns: Vec<String>) -> Self {
        let roots = allowed_roots
            .into_iter()
            .filter(|root| !root.as_os_str().is_empty())
            .collect();
        let deny = BASE_DENY
            .iter()
            .map(|pattern| (*pattern).to_owned())
            .chain(
                deny_patterns
                    .into_iter()
                    .map(|pattern| pattern.trim().to_owned())
                    .filter(|pattern| !pattern.is_empty()),
            )
            .collect();
        FileAccess {
            roots,
            deny,
            max_bytes: DEFAULT_MAX_FILE_BYTES,
        }
    }

    /// The same gate with another size cap, in bytes.
    #[must_use]
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The deny patterns in force: the built-in ones, then the configured ones.
    pub fn deny_patterns(&self) -> &[String] {
        &self.deny
    }

    /// Runs the checks of A.9 in order and returns the resolved path of an allowed file,
    /// without reading it.
    ///
    /// # Errors
    /// [`SourceError::NoRoots`], [`SourceError::Unresolvable`],
    /// [`SourceError::OutsideRoots`], [`SourceError::Denied`] or [`SourceError::Extension`].
    pub fn check(&self, path: &str) -> Result<PathBuf, SourceError> {
        if self.roots.is_empty() {
            return Err(SourceError::NoRoots);
        }
        let target = resolve(&expand_user(path))?;
        let mut inside = None;
        for root in &self.roots {
            let root = resolve(&expand_user_path(root))?;
            if let Ok(relative) = target.strip_prefix(&root) {
                inside = Some(relative.to_path_buf());
                break;
            }
        }
        let Some(relative) = inside else {
            return Err(SourceError::OutsideRoots { target });
        };
        for component in relative.components() {
            let name = component.as_os_str().to_string_lossy();
            if let Some(pattern) = self.deny.iter().find(|p| fnmatch_case(&name, p)) {
                return Err(SourceError::Denied {
                    pattern: pattern.clone(),
                    target,
                });
            }
        }
        let suffix = suffix(&target);
        let allowed = suffix
            .as_deref()
            .is_some_and(|s| ALLOWED_EXTENSIONS.contains(&s.to_lowercase().as_str()));
        if !allowed {
            return Err(SourceError::Extension { suffix });
        }
        Ok(target)
    }

    /// Checks `path` (A.9), then reads it (A.5 `add_file`): the text trimmed, the title from
    /// the first `# heading` line anywhere in it (else the file stem), the source the
    /// resolved absolute path.
    ///
    /// Blocking file I/O: async callers run it with `tokio::task::spawn_blocking`.
    ///
    /// # Errors
    /// Any refusal of [`check`](Self::check), then [`SourceError::FileNotFound`],
    /// [`SourceError::NotRegularFile`], [`SourceError::FileTooLarge`],
    /// [`SourceError::InvalidUtf8`], [`SourceError::EmptyFile`] or [`SourceError::FileRead`].
    pub fn read(&self, path: &str) -> Result<SourceDocument, SourceError> {
        let target = self.check(path)?;
        let bytes = read_capped(&target, self.max_bytes)?;
        let text = match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(error) => {
                let position = error.utf8_error().valid_up_to();
                let byte = error.as_bytes().get(position).copied().unwrap_or_default();
                return Err(SourceError::InvalidUtf8 {
                    path: target,
                    position,
                    byte,
                });
            }
        };
        let text = text.trim();
        if text.is_empty() {
            return Err(SourceError::EmptyFile { path: target });
        }
        let title = title_of(text).unwrap_or_else(|| {
            target
                .file_stem()
                .map(|stem| stem.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
        tracing::debug!(path = %target.display(), chars = text.len(), "add_file read");
        Ok(SourceDocument {
            title,
            text: text.to_owned(),
            source: target.to_string_lossy().into_owned(),
        })
    }
}

/// The first `# heading` of a text (`^#\s+(.+?)\s*$`, multiline).
pub(crate) fn title_of(text: &str) -> Option<String> {
    let regex = TITLE.as_ref()?;
    regex
        .captures(text)
        .and_then(|captures| captures.get(1))
        .map(|title| title.as_str().to_owned())
}

/// Python's `Path.suffix`: the last `.xxx` of the name, `None` when the name has none (a
/// name ending with a dot or starting with its only dot has none).
fn suffix(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_string_lossy().into_owned();
    let dot = name.rfind('.')?;
    (dot > 0 && dot + 1 < name.len()).then(|| name[dot..].to_owned())
}

/// `~` and `~/...` expanded with `HOME` (other forms are kept as written).
fn expand_user(path: &str) -> PathBuf {
    expand_user_path(Path::new(path))
}

fn expand_user_path(path: &Path) -> PathBuf {
    let mut components = path.components();
    match components.next() {
        Some(Component::Normal(first)) if first == "~" => match std::env::var_os("HOME") {
            Some(home) if !home.is_empty() => PathBuf::from(home).join(components.as_path()),
            _ => path.to_path_buf(),
        },
        _ => path.to_path_buf(),
    }
}

/// Python's non-strict `resolve()`: absolute, symbolic links followed, `..` applied to the
/// path resolved so far, missing components kept as written.
fn resolve(path: &Path) -> Result<PathBuf, SourceError> {
    let unresolvable = |reason: String| SourceError::Unresolvable {
        path: path.to_path_buf(),
        reason,
    };
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|error| unresolvable(format!("no working directory: {error}")))?
            .join(path)
    };
    let mut pending: VecDeque<OsString> = VecDeque::new();
    push_front(&mut pending, &absolute);
    let mut resolved = PathBuf::from("/");
    let mut links = 0;
    while let Some(part) = pending.pop_front() {
        match part.to_str() {
            Some("/") => resolved = PathBuf::from("/"),
            Some(".") => {}
            Some("..") => {
                resolved.pop();
            }
            _ => {
                let candidate = resolved.join(&part);
                match fs::symlink_metadata(&candidate) {
                    Ok(meta) if meta.file_type().is_symlink() => {
                        links += 1;
                        if links > MAX_LINKS {
                            return Err(unresolvable(format!(
                                "more than {MAX_LINKS} symbolic links (a loop?)"
                            )));
                        }
                        let link = fs::read_link(&candidate).map_err(|error| {
                            unresolvable(format!(
                                "cannot read the link {}: {error}",
                                candidate.display()
                            ))
                        })?;
                        push_front(&mut pending, &link);
                    }
                    _ => resolved = candidate,
                }
            }
        }
    }
    Ok(resolved)
}

/// Queues the components of `path` before the pending ones (`/` first when absolute).
fn push_front(pending: &mut VecDeque<OsString>, path: &Path) {
    for component in path.components().rev() {
        let part = match component {
            Component::RootDir => OsString::from("/"),
            Component::CurDir => OsString::from("."),
            Component::ParentDir => OsString::from(".."),
            Component::Normal(name) => name.to_os_string(),
            // Windows drive prefixes: kept as a component.
            Component::Prefix(prefix) => prefix.as_os_str().to_os_string(),
        };
        pending.push_front(part);
    }
}

/// Opens `path` without following a final link and without blocking, checks on the handle
/// that it is a regular file under `max` bytes, and reads at most `max` bytes of it.
fn read_capped(path: &Path, max: u64) -> Result<Vec<u8>, SourceError> {
    let file = open_no_follow(path).map_err(|error| match error.kind() {
        io::ErrorKind::NotFound => SourceError::FileNotFound {
            path: path.to_path_buf(),
        },
        _ if is_link_refusal(&error) => SourceError::NotRegularFile {
            path: path.to_path_buf(),
            kind: "symbolic link",
        },
        _ => SourceError::FileRead {
            path: path.to_path_buf(),
            source: error,
        },
    })?;
    let meta = file.metadata().map_err(|source| SourceError::FileRead {
        path: path.to_path_buf(),
        source,
    })?;
    if !meta.file_type().is_file() {
        return Err(SourceError::NotRegularFile {
            path: path.to_path_buf(),
            kind: kind_of(&meta.file_type()),
        });
    }
    if meta.len() > max {
        return Err(SourceError::FileTooLarge {
            path: path.to_path_buf(),
            max,
        });
    }
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| SourceError::FileRead {
            path: path.to_path_buf(),
            source,
        })?;
    // The file grew between the size check and the read.
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > max {
        return Err(SourceError::FileTooLarge {
            path: path.to_path_buf(),
            max,
        });
    }
    Ok(bytes)
}

#[cfg(unix)]
fn open_no_follow(path: &Path) -> io::Result<fs::File> {
    use nix::fcntl::OFlag;
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW).bits())
        .open(path)
}

#[cfg(not(unix))]
fn open_no_follow(path: &Path) -> io::Result<fs::File> {
    let meta = fs::symlink_metadata(path)?;
    if !meta.file_type().is_file() {
        return Err(io::Error::other(format!(
            "{} is a {}",
            path.display(),
            kind_of(&meta.file_type())
        )));
    }
    fs::File::open(path)
}

/// `O_NOFOLLOW` on a link fails with `ELOOP`.
fn is_link_refusal(error: &io::Error) -> bool {
    #[cfg(unix)]
    {
        error.raw_os_error() == Some(nix::errno::Errno::ELOOP as i32)
    }
    #[cfg(not(unix))]
    {
        let _ = error;
        false
    }
}

fn kind_of(file_type: &fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "fifo";
        }
        if file_type.is_char_device() {
            return "character device";
        }
        if file_type.is_block_device() {
            return "block device";
        }
        if file_type.is_socket() {
            return "socket";
        }
    }
    if file_type.is_dir() {
        "directory"
    } else if file_type.is_symlink() {
        "symbolic link"
    } else {
        "special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffix_is_python_like() {
        assert_eq!(suffix(Path::new("/a/b.MD")).as_deref(), Some(".MD"));
        assert_eq!(suffix(Path::new("/a/x.tar.md")).as_deref(), Some(".md"));
        assert_eq!(suffix(Path::new("/a/.md")), None);
        assert_eq!(suffix(Path::new("/a/README")), None);
        assert_eq!(suffix(Path::new("/a/end.")), None);
    }

    #[test]
    fn title_is_the_first_level_one_heading_anywhere() {
        assert_eq!(
            title_of("intro\n# Real Title  \nbody").as_deref(),
            Some("Real Title")
        );
        assert_eq!(title_of("## Sub\n# Top").as_deref(), Some("Top"));
        assert_eq!(title_of("#NoSpace\ntext"), None);
        assert_eq!(title_of("no heading"), None);
    }

    #[test]
    fn lexical_parts_of_resolution() {
        assert_eq!(
            resolve(Path::new("/nonexistent-loom/a/../b/./c.md")).ok(),
            Some(PathBuf::from("/nonexistent-loom/b/c.md"))
        );
        assert_eq!(resolve(Path::new("/../..")).ok(), Some(PathBuf::from("/")));
    }
}
