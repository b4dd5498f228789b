//! `local_files`: list, read, write and delete files inside declared folders, and nowhere else.
//!
//! Each call names a declared folder and a path inside it. The checks, in order, each refusal
//! naming its rule ([`rules`](crate::rules)):
//!
//! 1. `declared-folder`: the folder is one of those configured;
//! 2. `no-parent`: the path has no `..` component;
//! 3. `inside-roots`: the path, relative to the folder or absolute, **resolved** (symbolic
//!    links followed with `canonicalize`; for a file that does not exist yet, its deepest
//!    existing ancestor) stays inside the folder's canonical root;
//! 4. `folder-rights`: the folder grants the right the operation needs: `read` to list and
//!    read, `write` to create a file, `overwrite` to replace an existing one, `delete` to
//!    remove one;
//! 5. `size-cap`: reads and writes are capped at 1 MiB ([`READ_CAP_BYTES`],
//!    [`WRITE_CAP_BYTES`]); a larger file is refused, never cut (a cut file written back
//!    would lose its end).
//!
//! The checks say why a path is refused; they do not make the operation safe on their own,
//! since the tree can change between a check and the operation (a directory swapped for a
//! symbolic link leading out). So every operation is done through the folder's directory
//! handle (`cap_std::fs::Dir`, opened once when the tool is built): each path is resolved
//! relative to it and never leaves it (`openat2` with `RESOLVE_BENEATH` on Linux), whatever
//! was swapped in since the check; an escape attempt fails the operation. Files are opened
//! non-blocking and checked on the open handle, so a FIFO swapped in cannot block a call.
//!
//! Approvals are not enforced here: [`Rights::needing_approval`] tells the facade which
//! granted rights ask for one.

use std::{
    collections::{BTreeMap, HashSet},
    fs,
    io::{self, Read, Write},
    path::{Component, Path, PathBuf},
};

use cap_std::{ambient_authority, fs::Dir};

use loom_core::{
    BoxFuture,
    tool::{
        Approval, FnTool, SideEffects, ToolDeclarations, ToolError, ToolKind, ToolOutput, ToolSpec,
    },
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{BuiltinError, refusal, rules};

/// The largest file `read` returns: 1 MiB. Larger files are refused (rule `size-cap`).
pub const READ_CAP_BYTES: u64 = 1024 * 1024;
/// The largest content `write` accepts: 1 MiB (rule `size-cap`).
pub const WRITE_CAP_BYTES: usize = 1024 * 1024;
/// The most entries `list` returns; the rest is announced as cut.
const LIST_CAP: usize = 1000;

/// A right a folder grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Right {
    /// List directories and read files.
    Read,
    /// Create files that do not exist yet.
    Write,
    /// Replace existing files.
    Overwrite,
    /// Delete files.
    Delete,
}

impl Right {
    /// Every right, in order.
    pub const ALL: [Right; 4] = [Right::Read, Right::Write, Right::Overwrite, Right::Delete];

    /// The right's name in configuration and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Right::Read => "read",
            Right::Write => "write",
            Right::Overwrite => "overwrite",
            Right::Delete => "delete",
        }
    }

    /// The approval a right listed without one gets (the reference's defaults): `never` for
    /// `read` and `write`, `always` for `overwrite` and `delete`.
    pub fn default_approval(self) -> Approval {
        match self {
            Right::Read | Right::Write => Approval::Never,
            Right::Overwrite | Right::Delete => Approval::Always,
        }
    }
}

/// The rights a folder grants, each with its approval.
///
/// Deserializes from either configuration form: a list (`[read, write]`, each right with its
/// [default approval](Right::default_approval)) or a map (`{read: never, overwrite: always}`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(from = "RightsForm")]
pub struct Rights {
    granted: BTreeMap<Right, Approval>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RightsForm {
    List(Vec<Right>),
    Map(BTreeMap<Right, Approval>),
}

impl From<RightsForm> for Rights {
    fn from(form: RightsForm) -> Rights {
        match form {
            RightsForm::List(list) => Rights::list(list),
            RightsForm::Map(granted) => Rights { granted },
        }
    }
}

impl Rights {
    /// No right at all.
    pub fn none() -> Rights {
        Rights::default()
    }

    /// These rights, each with its [default approval](Right::default_approval).
    pub fn list(rights: impl IntoIterator<Item = Right>) -> Rights {
        let granted = rights
            .into_iter()
            .map(|right| (right, right.default_approval()))
            .collect();
        Rights { granted }
    }

    /// These rights, none asking for approval.
    pub fn without_approval(rights: impl IntoIterator<Item = Right>) -> Rights {
        let granted = rights
            .into_iter()
            .map(|right| (right, Approval::Never))
            .collect();
        Rights { granted }
    }

    /// Grants `right` with `approval` (builder style).
    pub fn with(mut self, right: Right, approval: Approval) -> Rights {
        self.granted.insert(right, approval);
        self
    }

    /// Whether `right` is granted.
    pub fn allows(&self, right: Right) -> bool {
        self.granted.contains_key(&right)
    }

    /// The approval of `right`, `None` when it is not granted.
    pub fn approval(&self, right: Right) -> Option<Approval> {
        self.granted.get(&right).copied()
    }

    /// The granted rights whose approval is not `never`: the facade refuses them for now.
    pub fn needing_approval(&self) -> Vec<Right> {
        self.granted
            .iter()
            .filter(|(_, approval)| **approval != Approval::Never)
            .map(|(right, _)| *right)
            .collect()
    }

    /// The granted rights, in order.
    pub fn granted(&self) -> impl Iterator<Item = Right> + '_ {
        self.granted.keys().copied()
    }

    /// Whether no right is granted.
    pub fn is_empty(&self) -> bool {
        self.granted.is_empty()
    }

    pub(crate) fn describe(&self) -> String {
        let names: Vec<_> = self.granted().map(Right::as_str).collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    }
}

/// A folder the `local_files` tool may reach.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Folder {
    /// The name the model uses (`^[a-z0-9][a-z0-9_-]{0,31}$`).
    pub name: String,
    /// The folder on disk; it must exist when the tool is built.
    pub path: PathBuf,
    /// What the model may do there.
    pub rights: Rights,
}

impl Folder {
    /// A folder from its parts.
    pub fn new(name: impl Into<String>, path: impl Into<PathBuf>, rights: Rights) -> Folder {
        Folder {
            name: name.into(),
            path: path.into(),
            rights,
        }
    }
}

/// A declared folder, its root resolved and opened once.
#[derive(Debug)]
pub(crate) struct Root {
    /// The name the model uses.
    pub(crate) name: String,
    canonical: PathBuf,
    /// The folder's directory handle: every operation goes through it.
    pub(crate) dir: Dir,
    /// What the model may do there.
    pub(crate) rights: Rights,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Op {
    List,
    Read,
    Write,
    Delete,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    op: Op,
    folder: String,
    #[serde(default)]
    path: String,
    #[serde(default)]
    content: Option<String>,
}

/// The `local_files` tool over `folders`.
///
/// Arguments: `{op: "list" | "read" | "write" | "delete", folder, path, content?}`; `path` is
/// relative to the folder (empty for its root) or absolute inside it. `list` returns
/// `{entries: [{name, kind, size}]}`, `read` the file's text, `write` and `delete` what was
/// done. Declared side effects are `reversible` when a folder grants `write`, `overwrite` or
/// `delete`, `none` otherwise.
///
/// # Errors
/// No folder, a name that is invalid or declared twice, a folder granting no right, a path
/// that does not exist or is not a directory.
pub fn local_files(folders: Vec<Folder>) -> Result<FnTool, BuiltinError> {
    let roots = open_roots(folders)?;
    let spec = spec(&roots);
    let roots = std::sync::Arc::new(roots);
    Ok(FnTool::new(spec, move |_ctx, arguments| {
        let roots = roots.clone();
        Box::pin(async move {
            let args: Args = serde_json::from_value(arguments)
                .map_err(|error| ToolError::new(format!("invalid arguments: {error}")))?;
            tokio::task::spawn_blocking(move || run(&roots, args))
                .await
                .map_err(|error| ToolError::new(format!("the file operation failed: {error}")))?
        }) as BoxFuture<'static, _>
    }))
}

/// Checks `folders` (at least one, valid and distinct names, a right each) and opens each
/// folder's root: what `local_files` and `excel` are built on.
pub(crate) fn open_roots(folders: Vec<Folder>) -> Result<Vec<Root>, BuiltinError> {
    if folders.is_empty() {
        return Err(BuiltinError::NoFolder);
    }
    let mut names = HashSet::new();
    let mut roots = Vec::with_capacity(folders.len());
    for folder in folders {
        if !valid_name(&folder.name) {
            return Err(BuiltinError::InvalidFolderName(folder.name));
        }
        if !names.insert(folder.name.clone()) {
            return Err(BuiltinError::DuplicateFolder(folder.name));
        }
        if folder.rights.is_empty() {
            return Err(BuiltinError::NoRight(folder.name));
        }
        let canonical = match fs::canonicalize(&folder.path) {
            Ok(canonical) => canonical,
            Err(source) => {
                return Err(BuiltinError::FolderUnavailable {
                    name: folder.name,
                    path: folder.path,
                    source,
                });
            }
        };
        if !canonical.is_dir() {
            return Err(BuiltinError::NotADirectory {
                name: folder.name,
                path: folder.path,
            });
        }
        let dir = match Dir::open_ambient_dir(&canonical, ambient_authority()) {
            Ok(dir) => dir,
            Err(source) => {
                return Err(BuiltinError::FolderUnavailable {
                    name: folder.name,
                    path: folder.path,
                    source,
                });
            }
        };
        roots.push(Root {
            name: folder.name,
            canonical,
            dir,
            rights: folder.rights,
        });
    }
    Ok(roots)
}

/// The root named `name`, or the `declared-folder` refusal listing the declared ones.
pub(crate) fn find_root<'a>(roots: &'a [Root], name: &str) -> Result<&'a Root, ToolError> {
    roots.iter().find(|root| root.name == name).ok_or_else(|| {
        let names: Vec<&str> = roots.iter().map(|root| root.name.as_str()).collect();
        refusal(
            rules::DECLARED_FOLDER,
            format!(
                "no folder is named '{name}'; the declared folders are: {}",
                names.join(", ")
            ),
        )
    })
}

fn valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let allowed = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    matches!(bytes.first(), Some(first) if allowed(first))
        && bytes.len() <= 32
        && bytes.iter().all(|b| allowed(b) || *b == b'_' || *b == b'-')
}

fn spec(roots: &[Root]) -> ToolSpec {
    let writes = roots.iter().any(|root| {
        [Right::Write, Right::Overwrite, Right::Delete]
            .into_iter()
            .any(|right| root.rights.allows(right))
    });
    let folders: Vec<String> = roots
        .iter()
        .map(|root| format!("{} ({})", root.name, root.rights.describe()))
        .collect();
    let names: Vec<&str> = roots.iter().map(|root| root.name.as_str()).collect();
    ToolSpec {
        name: "local_files".to_owned(),
        description: format!(
            "List, read, write or delete files inside these folders only, with these rights: {}. \
             Paths are relative to the folder. Reading and writing are limited to 1 MiB of \
             UTF-8 text; writing a new file needs 'write', replacing one needs 'overwrite'.",
            folders.join("; ")
        ),
        input_schema: json!({
            "type": "object",
            "properties": {
                "op": {"type": "string", "enum": ["list", "read", "write", "delete"]},
                "folder": {"type": "string", "enum": names},
                "path": {
                    "type": "string",
                    "description": "Path inside the folder; empty for the folder itself."
                },
                "content": {"type": "string", "description": "The text to write (op write)."}
            },
            "required": ["op", "folder"],
            "additionalProperties": false
        }),
        kind: ToolKind::Builtin,
        declarations: ToolDeclarations {
            side_effects: if writes {
                SideEffects::Reversible
            } else {
                SideEffects::None
            },
            idempotent: !writes,
            ..ToolDeclarations::default()
        },
    }
}

/// Where a requested path lands once resolved.
#[derive(Debug)]
pub(crate) struct Resolved {
    /// The real path (symbolic links resolved) of what exists, plus the missing components.
    pub(crate) real: PathBuf,
    /// The same, relative to the folder's root (`.` for the root): what the operation opens
    /// through the folder's handle.
    pub(crate) relative: PathBuf,
    /// Whether the full path exists.
    pub(crate) exists: bool,
}

fn run(roots: &[Root], args: Args) -> Result<ToolOutput, ToolError> {
    let root = find_root(roots, &args.folder)?;
    tracing::debug!(folder = %root.name, op = ?args.op, path = %args.path, "local_files call");
    let needed = match args.op {
        Op::List | Op::Read => Some(Right::Read),
        Op::Delete => Some(Right::Delete),
        // Which of write and overwrite depends on whether the file exists.
        Op::Write if root.rights.allows(Right::Write) || root.rights.allows(Right::Overwrite) => {
            None
        }
        Op::Write => Some(Right::Write),
    };
    if let Some(right) = needed {
        require(root, right, &args.path)?;
    }
    let resolved = resolve(root, &args.path)?;
    let shown = shown_path(root, &resolved.real);
    let result = match args.op {
        Op::List => list(root, &resolved, &shown),
        Op::Read => read(root, &resolved, &shown),
        Op::Write => write(root, &resolved, &shown, args.content),
        Op::Delete => delete(root, &resolved, &shown),
    };
    if let Err(error) = &result {
        tracing::info!(folder = %root.name, op = ?args.op, error = %error, "local_files refused or failed");
    }
    result
}

pub(crate) fn require(root: &Root, right: Right, path: &str) -> Result<(), ToolError> {
    if root.rights.allows(right) {
        return Ok(());
    }
    let what = match right {
        Right::Read => "reading or listing",
        Right::Write => "creating a file",
        Right::Overwrite => "replacing an existing file",
        Right::Delete => "deleting a file",
    };
    Err(refusal(
        rules::FOLDER_RIGHTS,
        format!(
            "{what} ('{path}') needs the right '{}', which the folder '{}' does not grant \
             (it grants: {})",
            right.as_str(),
            root.name,
            root.rights.describe()
        ),
    ))
}

fn outside(root: &Root, path: &str) -> ToolError {
    refusal(
        rules::INSIDE_ROOTS,
        format!(
            "the path '{path}' resolves outside the folder '{}'",
            root.name
        ),
    )
}

/// Resolves `raw` against `root`, refusing `..` and anything whose real location leaves it.
pub(crate) fn resolve(root: &Root, raw: &str) -> Result<Resolved, ToolError> {
    let requested = Path::new(raw);
    if requested
        .components()
        .any(|component| component == Component::ParentDir)
    {
        return Err(refusal(
            rules::NO_PARENT,
            format!("the path '{raw}' has a '..' component; use a path inside the folder"),
        ));
    }
    // Relative paths hang off the root; `join` keeps an absolute path as it is.
    let candidate: PathBuf = root
        .canonical
        .join(requested)
        .components()
        .filter(|component| *component != Component::CurDir)
        .collect();
    // The deepest ancestor that exists (as a link or not), and the names below it.
    let mut existing = candidate;
    let mut missing = Vec::new();
    loop {
        match fs::symlink_metadata(&existing) {
            Ok(_) => break,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                match existing.file_name() {
                    Some(name) => missing.push(name.to_owned()),
                    None => return Err(io_error(raw, &error)),
                }
                if !existing.pop() {
                    return Err(io_error(raw, &error));
                }
            }
            Err(error) => return Err(io_error(raw, &error)),
        }
    }
    let mut real = match fs::canonicalize(&existing) {
        Ok(real) => real,
        // A link whose target is missing: where it leads cannot be checked.
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return Err(refusal(
                rules::INSIDE_ROOTS,
                format!(
                    "the path '{raw}' goes through a symbolic link whose target does not \
                     exist, so it cannot be shown to stay inside the folder '{}'",
                    root.name
                ),
            ));
        }
        Err(error) => return Err(io_error(raw, &error)),
    };
    if !real.starts_with(&root.canonical) {
        return Err(outside(root, raw));
    }
    let exists = missing.is_empty();
    for name in missing.into_iter().rev() {
        real.push(name);
    }
    let relative = match real.strip_prefix(&root.canonical) {
        Ok(inside) if inside.as_os_str().is_empty() => PathBuf::from("."),
        Ok(inside) => inside.to_path_buf(),
        Err(_) => return Err(outside(root, raw)),
    };
    Ok(Resolved {
        real,
        relative,
        exists,
    })
}

pub(crate) fn shown_path(root: &Root, real: &Path) -> String {
    let relative = real.strip_prefix(&root.canonical).unwrap_or(real);
    let text = relative.to_string_lossy();
    if text.is_empty() {
        ".".to_owned()
    } else {
        text.into_owned()
    }
}

pub(crate) fn io_error(path: &str, error: &io::Error) -> ToolError {
    ToolError::new(format!("cannot access '{path}': {error}"))
}

/// Opens the file of `resolved` through the folder's handle with `options`, without blocking
/// (a FIFO opens at once), and checks on the handle that it is a regular file.
pub(crate) fn open_regular(
    root: &Root,
    resolved: &Resolved,
    shown: &str,
    options: &cap_std::fs::OpenOptions,
) -> Result<cap_std::fs::File, ToolError> {
    let mut options = options.clone();
    #[cfg(unix)]
    {
        use cap_std::fs::OpenOptionsExt;
        options.custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits());
    }
    let file = root
        .dir
        .open_with(&resolved.relative, &options)
        .map_err(|error| io_error(shown, &error))?;
    let metadata = file.metadata().map_err(|error| io_error(shown, &error))?;
    if !metadata.is_file() {
        return Err(ToolError::new(format!(
            "'{shown}' is not a file; list it instead"
        )));
    }
    Ok(file)
}

pub(crate) fn not_found(shown: &str) -> ToolError {
    ToolError::new(format!("'{shown}' does not exist"))
}

fn list(root: &Root, resolved: &Resolved, shown: &str) -> Result<ToolOutput, ToolError> {
    if !resolved.exists {
        return Err(not_found(shown));
    }
    let entries = root
        .dir
        .read_dir(&resolved.relative)
        .map_err(|error| io_error(shown, &error))?;
    let mut listed = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|error| io_error(shown, &error))?;
        let metadata = entry.metadata().map_err(|error| io_error(shown, &error))?;
        let kind = if metadata.is_symlink() {
            "symlink"
        } else if metadata.is_dir() {
            "dir"
        } else if metadata.is_file() {
            "file"
        } else {
            "other"
        };
        let size = metadata.is_file().then_some(metadata.len());
        listed.push((entry.file_name().to_string_lossy().into_owned(), kind, size));
    }
    listed.sort();
    let total = listed.len();
    let entries: Vec<Value> = listed
        .into_iter()
        .take(LIST_CAP)
        .map(|(name, kind, size)| json!({"name": name, "kind": kind, "size": size}))
        .collect();
    let mut result = json!({"folder": root.name, "path": shown, "entries": entries});
    if total > LIST_CAP {
        result["truncated"] = json!(format!(
            "{total} entries; only the first {LIST_CAP} are listed"
        ));
    }
    Ok(ToolOutput::json(result))
}

fn read(root: &Root, resolved: &Resolved, shown: &str) -> Result<ToolOutput, ToolError> {
    if !resolved.exists {
        return Err(not_found(shown));
    }
    let mut options = cap_std::fs::OpenOptions::new();
    options.read(true);
    let file = open_regular(root, resolved, shown, &options)?;
    let metadata = file.metadata().map_err(|error| io_error(shown, &error))?;
    let too_big = |size: u64| {
        refusal(
            rules::SIZE_CAP,
            format!(
                "'{shown}' is {size} bytes, above the read cap of {READ_CAP_BYTES} bytes (1 MiB)"
            ),
        )
    };
    if metadata.len() > READ_CAP_BYTES {
        return Err(too_big(metadata.len()));
    }
    let mut bytes = Vec::new();
    // One byte more than the cap tells a file that grew since its metadata was read.
    file.take(READ_CAP_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| io_error(shown, &error))?;
    if bytes.len() as u64 > READ_CAP_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        ToolError::new(format!(
            "'{shown}' is not UTF-8 text; this tool reads text files only"
        ))
    })?;
    Ok(ToolOutput::text(text))
}

fn write(
    root: &Root,
    resolved: &Resolved,
    shown: &str,
    content: Option<String>,
) -> Result<ToolOutput, ToolError> {
    let Some(content) = content else {
        return Err(ToolError::new("op 'write' needs 'content'"));
    };
    if content.len() > WRITE_CAP_BYTES {
        return Err(refusal(
            rules::SIZE_CAP,
            format!(
                "the content is {} bytes, above the write cap of {WRITE_CAP_BYTES} bytes (1 MiB)",
                content.len()
            ),
        ));
    }
    let path = &resolved.relative;
    if resolved.exists {
        require(root, Right::Overwrite, shown)?;
        let mut options = cap_std::fs::OpenOptions::new();
        options.write(true);
        let mut file = open_regular(root, resolved, shown, &options)?;
        // Emptied once known to be a regular file inside the folder (never by `open`).
        file.set_len(0).map_err(|error| io_error(shown, &error))?;
        file.write_all(content.as_bytes())
            .map_err(|error| io_error(shown, &error))?;
    } else {
        require(root, Right::Write, shown)?;
        // Through the folder's handle, the missing directories and the file are created inside
        // it even if a directory on the way was swapped for a link since the check.
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            root.dir
                .create_dir_all(parent)
                .map_err(|error| io_error(shown, &error))?;
        }
        // `create_new` never follows a link planted since the check.
        let mut file = root
            .dir
            .open_with(
                path,
                cap_std::fs::OpenOptions::new().write(true).create_new(true),
            )
            .map_err(|error| io_error(shown, &error))?;
        file.write_all(content.as_bytes())
            .map_err(|error| io_error(shown, &error))?;
    }
    Ok(ToolOutput::json(json!({
        "folder": root.name,
        "path": shown,
        "bytes": content.len(),
        "created": !resolved.exists,
    })))
}

fn delete(root: &Root, resolved: &Resolved, shown: &str) -> Result<ToolOutput, ToolError> {
    if !resolved.exists {
        return Err(not_found(shown));
    }
    let is_file = root
        .dir
        .symlink_metadata(&resolved.relative)
        .map_err(|error| io_error(shown, &error))?
        .is_file();
    if !is_file {
        return Err(ToolError::new(format!(
            "'{shown}' is not a file; only files can be deleted"
        )));
    }
    // `remove_file` resolves the parent through the folder's handle and unlinks the name
    // itself: a swapped directory cannot make it delete outside.
    root.dir
        .remove_file(&resolved.relative)
        .map_err(|error| io_error(shown, &error))?;
    Ok(ToolOutput::json(json!({"path": shown, "deleted": true})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folder_names() {
        for ok in ["docs", "a", "0-x_y", "abcdefghijklmnopqrstuvwxyz012345"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "-docs",
            "Docs",
            "do cs",
            "abcdefghijklmnopqrstuvwxyz0123456",
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn rights_parse_in_both_forms() {
        let list: Rights = serde_json::from_str(r#"["read", "overwrite"]"#).unwrap();
        assert!(list.allows(Right::Read) && !list.allows(Right::Write));
        assert_eq!(list.needing_approval(), [Right::Overwrite]);
        let map: Rights = serde_json::from_str(r#"{"read": "never", "delete": "never"}"#).unwrap();
        assert!(map.allows(Right::Delete));
        assert!(map.needing_approval().is_empty());
        assert!(serde_json::from_str::<Rights>(r#"["execute"]"#).is_err());
    }
}
