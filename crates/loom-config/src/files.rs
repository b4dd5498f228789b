//! Reading the files a configuration names (agent files, prompt files, schema files): regular
//! files only, under their folder, at most [`MAX_FILE_BYTES`].
//!
//! A careless or hostile configuration must not make loading hang (a FIFO), grow without
//! bound (a link to `/dev/zero`), or send a file from elsewhere to a model
//! (`system_file: ../../../etc/passwd`, a link leading out of `prompts_dir`). So a named file:
//!
//! 1. is a relative path without `..` (checked on the text);
//! 2. resolves, symbolic links followed, inside its folder's resolved path;
//! 3. is a regular file (checked before it is opened, and again on the open handle);
//! 4. holds at most [`MAX_FILE_BYTES`] bytes (its size, then what is read: one byte more
//!    than the limit is an error, never a cut file) of UTF-8 text.

use std::{
    fmt, fs,
    io::{self, Read},
    path::{Component, Path, PathBuf},
};

/// The largest agent, prompt or schema file a configuration may name: 1 MiB.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Why a named file was not read.
#[derive(Debug)]
pub(crate) enum FileProblem {
    /// No such file.
    NotFound,
    /// An absolute path, or one with a `..` component.
    Escapes,
    /// The path resolves (through a symbolic link) outside the folder.
    Outside,
    /// A FIFO, a device, a socket or a directory.
    NotRegular,
    /// Larger than [`MAX_FILE_BYTES`].
    TooLarge(u64),
    /// Not UTF-8 text.
    NotText,
    /// Any other input/output error.
    Io(io::Error),
}

impl fmt::Display for FileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileProblem::NotFound => f.write_str("not found"),
            FileProblem::Escapes => {
                f.write_str("an absolute path or a '..' component would leave the folder")
            }
            FileProblem::Outside => f.write_str("it resolves outside the folder"),
            FileProblem::NotRegular => {
                f.write_str("not a regular file (a directory, FIFO, device or socket)")
            }
            FileProblem::TooLarge(size) => write!(
                f,
                "{size} bytes, above the limit of {MAX_FILE_BYTES} bytes (1 MiB)"
            ),
            FileProblem::NotText => f.write_str("not UTF-8 text"),
            FileProblem::Io(error) => write!(f, "{error}"),
        }
    }
}

/// Reads `relative` under `dir` under the rules of this module.
pub(crate) fn read_under(dir: &Path, relative: &Path) -> Result<String, FileProblem> {
    if relative
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(FileProblem::Escapes);
    }
    let folder = fs::canonicalize(dir).map_err(not_found_or_io)?;
    let real = fs::canonicalize(dir.join(relative)).map_err(not_found_or_io)?;
    if !real.starts_with(&folder) {
        return Err(FileProblem::Outside);
    }
    read_regular(&real)
}

/// Reads the regular file `path` (symbolic links followed), at most [`MAX_FILE_BYTES`].
pub(crate) fn read_regular(path: &Path) -> Result<String, FileProblem> {
    // Before opening: opening a FIFO blocks until a writer comes.
    let metadata = fs::metadata(path).map_err(not_found_or_io)?;
    if !metadata.is_file() {
        return Err(FileProblem::NotRegular);
    }
    if metadata.len() > MAX_FILE_BYTES {
        return Err(FileProblem::TooLarge(metadata.len()));
    }
    let file = fs::File::open(path).map_err(not_found_or_io)?;
    // The handle is what is read: it must still be a regular file.
    if !file.metadata().map_err(FileProblem::Io)?.is_file() {
        return Err(FileProblem::NotRegular);
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(FileProblem::Io)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(FileProblem::TooLarge(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|_| FileProblem::NotText)
}

fn not_found_or_io(error: io::Error) -> FileProblem {
    if error.kind() == io::ErrorKind::NotFound {
        FileProblem::NotFound
    } else {
        FileProblem::Io(error)
    }
}

/// The path of `path` inside `dir`, for messages (`path` itself when it is not inside).
pub(crate) fn inside(dir: &Path, path: &Path) -> PathBuf {
    path.strip_prefix(dir).unwrap_or(path).to_path_buf()
}
