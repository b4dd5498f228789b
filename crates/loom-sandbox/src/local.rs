//! [`LocalSandbox`]: working folders under one root on this host, commands in bubblewrap.

use std::{
    os::unix::fs::{DirBuilderExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Arc,
};

use loom_core::{
    BoxFuture,
    sandbox::{Entry, ExecOutcome, ExecRequest, Sandbox, SandboxError, Workspace},
};

use crate::{
    SetupError,
    exec::{self, Programs},
    folder,
};

/// The first host uid of the sandboxed users when Loom runs as root.
const FIRST_UID: u32 = 200_000;
/// How many host uids working folders are spread over.
const UIDS: u32 = 50_000;

/// Working folders under `root` (`<root>/<tenant>/<scope>`), commands run with bubblewrap.
///
/// Run as root, each working folder belongs to an unprivileged host user of its own
/// (uid = gid = 200000 + a hash of the folder's name modulo 50000): `RLIMIT_NPROC` applies to
/// it (root is exempt), one folder's processes cannot touch another's files, and what the
/// command writes belongs to that user. Run as another user, commands run as that user, and
/// `RLIMIT_NPROC` counts that user's other processes too.
#[derive(Debug, Clone)]
pub struct LocalSandbox {
    root: Arc<PathBuf>,
    programs: Programs,
    as_root: bool,
}

impl LocalSandbox {
    /// Working folders under `root`, created if missing; `bwrap` and `prlimit` are found in
    /// `/usr/bin` (then `/bin`).
    ///
    /// The root's ancestors must be traversable by the sandboxed users (a root under `/root`,
    /// mode 0700, is not), since `bwrap` runs as them.
    pub fn new(root: impl Into<PathBuf>) -> Result<LocalSandbox, SetupError> {
        let root = root.into();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&root)
            .map_err(|source| SetupError::Root {
                path: root.clone(),
                source,
            })?;
        let root = std::fs::canonicalize(&root).map_err(|source| SetupError::Root {
            path: root.clone(),
            source,
        })?;
        let programs = Programs {
            bwrap: program("bwrap")?,
            prlimit: program("prlimit")?,
        };
        Ok(LocalSandbox {
            root: Arc::new(root),
            programs,
            as_root: nix::unistd::geteuid().is_root(),
        })
    }

    /// The root of the working folders.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether bubblewrap can create the namespaces a command needs on this host: runs `true`
    /// in a throwaway folder under the root. `Err` says why not (a container without user
    /// namespaces, say).
    pub async fn probe(&self) -> Result<(), SandboxError> {
        let workspace = Workspace::new("probe", "probe")?;
        let outcome = self
            .exec(
                &workspace,
                ExecRequest {
                    command: "true".into(),
                    limits: loom_core::sandbox::Limits::default(),
                    network: false,
                },
            )
            .await?;
        if outcome.exit_code == Some(0) {
            Ok(())
        } else {
            Err(SandboxError::Unavailable(format!(
                "bubblewrap cannot create namespaces here (exit {:?}, signal {:?}): {}",
                outcome.exit_code,
                outcome.signal,
                outcome.stderr.trim()
            )))
        }
    }

    /// The host user of `workspace`'s folder when running as root.
    fn identity(&self, workspace: &Workspace) -> Option<(u32, u32)> {
        if !self.as_root {
            return None;
        }
        // FNV-1a of the folder's name: stable across processes, so a session's folder keeps
        // its owner.
        let mut hash: u32 = 0x811c_9dc5;
        for byte in workspace.to_string().bytes() {
            hash ^= u32::from(byte);
            hash = hash.wrapping_mul(0x0100_0193);
        }
        let uid = FIRST_UID + hash % UIDS;
        Some((uid, uid))
    }

    /// The folder of `workspace`, created (mode 0700, given to its user) if missing.
    fn folder(&self, workspace: &Workspace) -> Result<PathBuf, SandboxError> {
        let tenant = self.root.join(workspace.tenant());
        let folder = tenant.join(workspace.scope());
        let io = |error: std::io::Error| {
            SandboxError::Io(format!(
                "cannot create the working folder {}: {error}",
                folder.display()
            ))
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&tenant)
            .map_err(io)?;
        match std::fs::DirBuilder::new().mode(0o700).create(&folder) {
            Ok(()) => {
                if let Some((uid, gid)) = self.identity(workspace) {
                    std::os::unix::fs::chown(&folder, Some(uid), Some(gid)).map_err(io)?;
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(io(error)),
        }
        let meta = std::fs::symlink_metadata(&folder).map_err(io)?;
        if !meta.is_dir() {
            return Err(SandboxError::Io(format!(
                "{} is not a directory",
                folder.display()
            )));
        }
        if meta.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o700))
                .map_err(io)?;
        }
        Ok(folder)
    }
}

/// `/usr/bin/<name>`, else `/bin/<name>`.
fn program(name: &'static str) -> Result<PathBuf, SetupError> {
    ["/usr/bin", "/bin"]
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.is_file())
        .ok_or(SetupError::Missing(name))
}

/// Runs `work` on the blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, SandboxError> + Send + 'static,
) -> Result<T, SandboxError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| SandboxError::Io(format!("sandbox file task failed: {error}")))?
}

impl Sandbox for LocalSandbox {
    fn read<'a>(
        &'a self,
        workspace: &'a Workspace,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<u8>, SandboxError>> {
        let this = self.clone();
        let workspace = workspace.clone();
        let path = path.to_owned();
        Box::pin(blocking(move || {
            let dir = folder::open_dir(&this.folder(&workspace)?)?;
            folder::read(&dir, &path)
        }))
    }

    fn write<'a>(
        &'a self,
        workspace: &'a Workspace,
        path: &'a str,
        content: Vec<u8>,
    ) -> BoxFuture<'a, Result<u64, SandboxError>> {
        let this = self.clone();
        let workspace = workspace.clone();
        let path = path.to_owned();
        Box::pin(blocking(move || {
            let dir = folder::open_dir(&this.folder(&workspace)?)?;
            folder::write(&dir, &path, &content, this.identity(&workspace))
        }))
    }

    fn list<'a>(
        &'a self,
        workspace: &'a Workspace,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Entry>, SandboxError>> {
        let this = self.clone();
        let workspace = workspace.clone();
        let path = path.to_owned();
        Box::pin(blocking(move || {
            let dir = folder::open_dir(&this.folder(&workspace)?)?;
            folder::list(&dir, &path)
        }))
    }

    fn exec<'a>(
        &'a self,
        workspace: &'a Workspace,
        request: ExecRequest,
    ) -> BoxFuture<'a, Result<ExecOutcome, SandboxError>> {
        Box::pin(async move {
            let this = self.clone();
            let ws = workspace.clone();
            let folder = blocking(move || this.folder(&ws)).await?;
            exec::run(&self.programs, &folder, self.identity(workspace), request).await
        })
    }
}
