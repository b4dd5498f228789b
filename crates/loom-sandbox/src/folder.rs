//! Host-side `read`, `write` and `list` in one working folder, and nowhere else.
//!
//! The approach of `loom-builtins`' `local_files`: a path is refused when it has a `..`
//! component or is absolute (rule `sandbox-inside-folder`), and every operation goes through
//! the folder's directory handle (`cap_std::fs::Dir`: `openat2` with `RESOLVE_BENEATH` on
//! Linux), so that a symbolic link the sandboxed code planted (`link -> /etc/passwd`) cannot
//! lead out, whatever was swapped in between a check and the operation. Files are opened
//! non-blocking and checked on the open handle, so a FIFO planted in the folder cannot block a
//! read.

use std::{
    io::{self, Read, Write},
    path::{Component, Path, PathBuf},
};

use cap_std::{
    ambient_authority,
    fs::{Dir, OpenOptions, OpenOptionsExt},
};
use loom_core::sandbox::{Entry, EntryKind, SandboxError, rules};

/// The largest file `read` returns and `write` accepts: 1 MiB (rule `sandbox-size-cap`).
pub const FILE_CAP_BYTES: u64 = 1024 * 1024;
/// The most entries `list` returns.
const LIST_CAP: usize = 1000;

/// Refuses a path that is absolute or has a `..` component; returns it relative, without `.`
/// components (`.` for the folder itself).
pub(crate) fn relative(raw: &str) -> Result<PathBuf, SandboxError> {
    let path = Path::new(raw);
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => out.push(name),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(SandboxError::refused(
                    rules::INSIDE_FOLDER,
                    format!(
                        "the path '{raw}' has a '..' component; use a path inside the working folder"
                    ),
                ));
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(SandboxError::refused(
                    rules::INSIDE_FOLDER,
                    format!(
                        "the path '{raw}' is absolute; use a path relative to the working folder"
                    ),
                ));
            }
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    Ok(out)
}

/// An error of an operation through the folder's handle: an escape is a refusal.
fn io_error(raw: &str, error: &io::Error) -> SandboxError {
    if error.kind() == io::ErrorKind::NotFound {
        return SandboxError::NotFound(raw.to_owned());
    }
    // cap-std reports a path that leaves the directory (a symbolic link out, absolute or
    // through `..`) as PermissionDenied "a path led outside of the filesystem"; the kernel's
    // RESOLVE_BENEATH as EXDEV.
    let text = error.to_string();
    if text.contains("outside of the filesystem") || error.raw_os_error() == Some(18) {
        return SandboxError::refused(
            rules::INSIDE_FOLDER,
            format!("the path '{raw}' resolves outside the working folder"),
        );
    }
    SandboxError::Io(format!("'{raw}': {error}"))
}

/// The folder's directory handle.
pub(crate) fn open_dir(folder: &Path) -> Result<Dir, SandboxError> {
    Dir::open_ambient_dir(folder, ambient_authority()).map_err(|error| {
        SandboxError::Io(format!(
            "cannot open the working folder {}: {error}",
            folder.display()
        ))
    })
}

/// The bytes of the regular file at `raw`, at most [`FILE_CAP_BYTES`].
pub(crate) fn read(dir: &Dir, raw: &str) -> Result<Vec<u8>, SandboxError> {
    let path = relative(raw)?;
    let mut options = OpenOptions::new();
    options.read(true);
    options.custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits());
    let mut file = dir
        .open_with(&path, &options)
        .map_err(|e| io_error(raw, &e))?;
    let metadata = file.metadata().map_err(|e| io_error(raw, &e))?;
    if !metadata.is_file() {
        return Err(SandboxError::Invalid(format!(
            "'{raw}' is not a regular file; list it instead"
        )));
    }
    if metadata.len() > FILE_CAP_BYTES {
        return Err(SandboxError::refused(
            rules::SIZE_CAP,
            format!(
                "'{raw}' has {} bytes, over the {FILE_CAP_BYTES}-byte cap of a read; run a \
                 command that prints the part you need",
                metadata.len()
            ),
        ));
    }
    let mut bytes = Vec::new();
    // Bounded even if the file grows after the check.
    Read::by_ref(&mut file)
        .take(FILE_CAP_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(raw, &e))?;
    if bytes.len() as u64 > FILE_CAP_BYTES {
        return Err(SandboxError::refused(
            rules::SIZE_CAP,
            format!("'{raw}' grew over the {FILE_CAP_BYTES}-byte cap of a read"),
        ));
    }
    Ok(bytes)
}

/// Writes `content` to `raw`, creating its parent folders; replaces a regular file, refuses
/// anything else. `owner` (uid, gid) is given what was created, so the sandboxed user can
/// change it.
pub(crate) fn write(
    dir: &Dir,
    raw: &str,
    content: &[u8],
    owner: Option<(u32, u32)>,
) -> Result<u64, SandboxError> {
    if content.len() as u64 > FILE_CAP_BYTES {
        return Err(SandboxError::refused(
            rules::SIZE_CAP,
            format!(
                "{} bytes is over the {FILE_CAP_BYTES}-byte cap of a write",
                content.len()
            ),
        ));
    }
    let path = relative(raw)?;
    if path == Path::new(".") {
        return Err(SandboxError::Invalid(
            "a write needs a file path inside the working folder".to_owned(),
        ));
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        dir.create_dir_all(parent).map_err(|e| io_error(raw, &e))?;
        if let Some(owner) = owner {
            let mut at = PathBuf::new();
            for component in parent.components() {
                at.push(component);
                give(dir, &at, owner, raw)?;
            }
        }
    }
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(false);
    options.custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits());
    let mut file = dir
        .open_with(&path, &options)
        .map_err(|e| io_error(raw, &e))?;
    let metadata = file.metadata().map_err(|e| io_error(raw, &e))?;
    if !metadata.is_file() {
        return Err(SandboxError::Invalid(format!(
            "'{raw}' exists and is not a regular file"
        )));
    }
    file.set_len(0).map_err(|e| io_error(raw, &e))?;
    file.write_all(content).map_err(|e| io_error(raw, &e))?;
    file.sync_all().map_err(|e| io_error(raw, &e))?;
    if let Some(owner) = owner {
        give(dir, &path, owner, raw)?;
    }
    Ok(content.len() as u64)
}

/// Gives `path` (inside `dir`, links not followed) to `owner`.
fn give(dir: &Dir, path: &Path, (uid, gid): (u32, u32), raw: &str) -> Result<(), SandboxError> {
    let file = dir
        .open_with(
            path,
            OpenOptions::new().read(true).custom_flags(
                (nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits(),
            ),
        )
        .map_err(|e| io_error(raw, &e))?;
    let std_file = file.into_std();
    std::os::unix::fs::fchown(&std_file, Some(uid), Some(gid)).map_err(|e| io_error(raw, &e))
}

/// The entries under `raw`, recursively, sorted, links not followed, at most `LIST_CAP`.
pub(crate) fn list(dir: &Dir, raw: &str) -> Result<Vec<Entry>, SandboxError> {
    let path = relative(raw)?;
    let start = if path == Path::new(".") {
        dir.try_clone().map_err(|e| io_error(raw, &e))?
    } else {
        dir.open_dir(&path).map_err(|e| io_error(raw, &e))?
    };
    let prefix = if path == Path::new(".") {
        PathBuf::new()
    } else {
        path
    };
    let mut entries = Vec::new();
    let mut pending = vec![(start, prefix)];
    while let Some((current, at)) = pending.pop() {
        for item in current.entries().map_err(|e| io_error(raw, &e))? {
            let item = item.map_err(|e| io_error(raw, &e))?;
            let name = at.join(item.file_name());
            let file_type = item.file_type().map_err(|e| io_error(raw, &e))?;
            let (kind, size) = if file_type.is_symlink() {
                (EntryKind::Link, 0)
            } else if file_type.is_dir() {
                (EntryKind::Dir, 0)
            } else if file_type.is_file() {
                let size = item.metadata().map(|m| m.len()).unwrap_or(0);
                (EntryKind::File, size)
            } else {
                (EntryKind::Other, 0)
            };
            if kind == EntryKind::Dir {
                let sub = item.open_dir().map_err(|e| io_error(raw, &e))?;
                pending.push((sub, name.clone()));
            }
            entries.push(Entry {
                path: name.to_string_lossy().into_owned(),
                kind,
                size,
            });
            if entries.len() >= LIST_CAP {
                entries.sort_by(|a, b| a.path.cmp(&b.path));
                return Ok(entries);
            }
        }
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder() -> (tempfile::TempDir, Dir) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = open_dir(tmp.path()).unwrap();
        (tmp, dir)
    }

    #[test]
    fn parent_and_absolute_paths_are_refused_by_name() {
        let (_tmp, dir) = folder();
        for raw in ["../x", "a/../../x", "/etc/passwd"] {
            for error in [
                read(&dir, raw).unwrap_err(),
                write(&dir, raw, b"x", None).unwrap_err(),
                list(&dir, raw).unwrap_err(),
            ] {
                assert_eq!(error.rule(), Some(rules::INSIDE_FOLDER), "{raw}: {error}");
            }
        }
    }

    #[test]
    fn a_link_out_is_refused_and_a_link_inside_is_followed() {
        let (tmp, dir) = folder();
        std::os::unix::fs::symlink("/etc/hostname", tmp.path().join("out")).unwrap();
        std::os::unix::fs::symlink("../../../../etc", tmp.path().join("up")).unwrap();
        let error = read(&dir, "out").unwrap_err();
        assert_eq!(error.rule(), Some(rules::INSIDE_FOLDER), "{error}");
        let error = read(&dir, "up/hostname").unwrap_err();
        assert_eq!(error.rule(), Some(rules::INSIDE_FOLDER), "{error}");
        let error = write(&dir, "out", b"x", None).unwrap_err();
        assert_eq!(error.rule(), Some(rules::INSIDE_FOLDER), "{error}");
        write(&dir, "real.txt", b"inside", None).unwrap();
        std::os::unix::fs::symlink("real.txt", tmp.path().join("in")).unwrap();
        assert_eq!(read(&dir, "in").unwrap(), b"inside");
    }

    #[test]
    fn write_then_list_then_read() {
        let (_tmp, dir) = folder();
        assert_eq!(write(&dir, "a/b/c.txt", b"hello", None).unwrap(), 5);
        write(&dir, "a/b/c.txt", b"hi", None).unwrap();
        assert_eq!(read(&dir, "./a/b/c.txt").unwrap(), b"hi");
        let listed: Vec<(String, EntryKind, u64)> = list(&dir, "")
            .unwrap()
            .into_iter()
            .map(|e| (e.path, e.kind, e.size))
            .collect();
        assert_eq!(
            listed,
            vec![
                ("a".into(), EntryKind::Dir, 0),
                ("a/b".into(), EntryKind::Dir, 0),
                ("a/b/c.txt".into(), EntryKind::File, 2)
            ]
        );
        assert!(matches!(
            read(&dir, "missing").unwrap_err(),
            SandboxError::NotFound(_)
        ));
        assert!(matches!(
            read(&dir, "a").unwrap_err(),
            SandboxError::Invalid(_)
        ));
    }

    #[test]
    fn a_fifo_does_not_block_a_read_and_big_files_are_refused() {
        let (tmp, dir) = folder();
        nix::unistd::mkfifo(&tmp.path().join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(matches!(
            read(&dir, "pipe").unwrap_err(),
            SandboxError::Invalid(_)
        ));
        let big = vec![b'x'; FILE_CAP_BYTES as usize + 1];
        assert_eq!(
            write(&dir, "big", &big, None).unwrap_err().rule(),
            Some(rules::SIZE_CAP)
        );
        std::fs::write(tmp.path().join("big"), &big).unwrap();
        assert_eq!(read(&dir, "big").unwrap_err().rule(), Some(rules::SIZE_CAP));
    }
}
