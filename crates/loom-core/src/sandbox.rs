//! The sandbox port: one working folder per run or session where an agent reads, writes, lists
//! and executes, and nowhere else.
//!
//! A [`Sandbox`] backend (the namespace sandbox of `loom-sandbox`, its HTTP client, a microVM
//! some day) keeps working folders named by a [`Workspace`]: `read`, `write` and `list` act
//! inside the folder only, and `exec` runs a shell command with the folder as its only writable
//! path, under [`Limits`]. Every refusal is a [`SandboxError::Refused`] naming its rule
//! ([`rules`]), and an [`ExecOutcome`] says which limit, if any, ended the command.
//!
//! The types serialize, so a remote backend carries the same contract over HTTP.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{BoxFuture, ids::is_safe_id};

/// The names of the rules a sandbox refuses or stops by, as they appear in messages.
pub mod rules {
    /// A path leaves the working folder (`..`, an absolute path, a symbolic link out).
    pub const INSIDE_FOLDER: &str = "sandbox-inside-folder";
    /// A command ran past its wall-clock time and was killed with its process group.
    pub const WALL_TIME: &str = "sandbox-wall-time";
    /// A command used up its CPU time (`RLIMIT_CPU`).
    pub const CPU_TIME: &str = "sandbox-cpu-time";
    /// A command wrote a file past the file size limit (`RLIMIT_FSIZE`).
    pub const FILE_SIZE: &str = "sandbox-file-size";
    /// A command's output went past `output_bytes`: the rest was counted, not kept.
    pub const OUTPUT_SIZE: &str = "sandbox-output-size";
    /// A file read or written host-side is larger than the cap.
    pub const SIZE_CAP: &str = "sandbox-size-cap";
    /// A call that needs a sandbox (a skill's script) on an agent without one.
    pub const REQUIRED: &str = "sandbox-required";

    /// Every rule, for a remote client to map a rule's name back to its constant.
    pub const ALL: [&str; 7] = [
        INSIDE_FOLDER,
        WALL_TIME,
        CPU_TIME,
        FILE_SIZE,
        OUTPUT_SIZE,
        SIZE_CAP,
        REQUIRED,
    ];

    /// The rule named `name`, `None` when no rule has that name.
    pub fn by_name(name: &str) -> Option<&'static str> {
        ALL.into_iter().find(|rule| *rule == name)
    }
}

/// The limits of one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Wall-clock time before the whole process group is killed, in milliseconds.
    pub wall_ms: u64,
    /// CPU time (`RLIMIT_CPU`, rounded up to whole seconds), in milliseconds.
    pub cpu_ms: u64,
    /// Address space of each process (`RLIMIT_AS`), in MiB.
    pub memory_mb: u64,
    /// Bytes of standard output, and of standard error, kept; the rest is counted only.
    pub output_bytes: u64,
    /// Processes of the sandbox's user (`RLIMIT_NPROC`).
    pub processes: u64,
    /// Largest file a command may write (`RLIMIT_FSIZE`), in MiB.
    pub file_mb: u64,
}

impl Default for Limits {
    /// 30 s of wall time, 10 s of CPU, 512 MiB, 64 KiB of output, 64 processes, 64 MiB files.
    fn default() -> Limits {
        Limits {
            wall_ms: 30_000,
            cpu_ms: 10_000,
            memory_mb: 512,
            output_bytes: 65_536,
            processes: 64,
            file_mb: 64,
        }
    }
}

impl Limits {
    /// Each limit of `self` no larger than the same limit of `cap` (what a remote runner
    /// grants a client asking for `self`).
    pub fn within(self, cap: Limits) -> Limits {
        Limits {
            wall_ms: self.wall_ms.min(cap.wall_ms),
            cpu_ms: self.cpu_ms.min(cap.cpu_ms),
            memory_mb: self.memory_mb.min(cap.memory_mb),
            output_bytes: self.output_bytes.min(cap.output_bytes),
            processes: self.processes.min(cap.processes),
            file_mb: self.file_mb.min(cap.file_mb),
        }
    }
}

/// The name of a working folder: `<tenant>/<scope id>`, each a safe id
/// (`[A-Za-z0-9][A-Za-z0-9._-]{0,127}`), so that it maps to a directory without any path
/// interpretation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Workspace {
    tenant: String,
    scope: String,
}

impl Workspace {
    /// The working folder `scope` of `tenant`; `Err` names the part that is not a safe id.
    pub fn new(tenant: &str, scope: &str) -> Result<Workspace, SandboxError> {
        for (what, id) in [("tenant", tenant), ("scope", scope)] {
            if !is_safe_id(id) {
                return Err(SandboxError::Invalid(format!(
                    "unsafe working folder {what} {id:?} (expected [A-Za-z0-9][A-Za-z0-9._-]{{0,127}})"
                )));
            }
        }
        Ok(Workspace {
            tenant: tenant.to_owned(),
            scope: scope.to_owned(),
        })
    }

    /// The tenant part.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The scope part (`run-<run id>` or `session-<session id>`).
    pub fn scope(&self) -> &str {
        &self.scope
    }
}

impl fmt::Display for Workspace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.scope)
    }
}

impl TryFrom<String> for Workspace {
    type Error = SandboxError;

    fn try_from(text: String) -> Result<Workspace, SandboxError> {
        match text.split_once('/') {
            Some((tenant, scope)) => Workspace::new(tenant, scope),
            None => Err(SandboxError::Invalid(format!(
                "working folder {text:?} is not <tenant>/<scope>"
            ))),
        }
    }
}

impl From<Workspace> for String {
    fn from(workspace: Workspace) -> String {
        workspace.to_string()
    }
}

/// A command to run in a working folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// A shell command line (`/bin/sh -c`), run with the working folder as its directory.
    pub command: String,
    /// Its limits.
    pub limits: Limits,
    /// Whether it may reach the network (otherwise it has a network namespace of its own,
    /// with only a loopback interface).
    pub network: bool,
}

/// What a command did.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ExecOutcome {
    /// The command line.
    pub command: String,
    /// Its exit code, `None` when a signal ended it.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
    /// The limit that ended it, by rule name ([`rules::WALL_TIME`], [`rules::CPU_TIME`],
    /// [`rules::FILE_SIZE`]), when one did.
    pub limit: Option<String>,
    /// Standard output, cut at `output_bytes` (lossy UTF-8).
    pub stdout: String,
    /// Standard error, cut at `output_bytes` (lossy UTF-8).
    pub stderr: String,
    /// Bytes the command wrote to standard output, kept or not.
    pub stdout_bytes: u64,
    /// Bytes the command wrote to standard error, kept or not.
    pub stderr_bytes: u64,
    /// Whether standard output was cut ([`rules::OUTPUT_SIZE`]).
    pub stdout_truncated: bool,
    /// Whether standard error was cut ([`rules::OUTPUT_SIZE`]).
    pub stderr_truncated: bool,
    /// Wall-clock duration, in milliseconds.
    pub duration_ms: u64,
}

/// What a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (not followed).
    Link,
    /// Anything else (a FIFO, a socket).
    Other,
}

/// One entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Its path relative to the working folder.
    pub path: String,
    /// What it is.
    pub kind: EntryKind,
    /// Its size in bytes (files only; 0 otherwise).
    pub size: u64,
}

/// An error of a sandbox operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
#[non_exhaustive]
pub enum SandboxError {
    /// Refused by a rule of the sandbox; the message names it.
    #[error("refused by rule '{rule}': {message}")]
    Refused {
        /// The rule ([`rules`]).
        rule: String,
        /// What was refused, and why.
        message: String,
    },
    /// The path does not exist in the working folder.
    #[error("'{0}' does not exist in the working folder")]
    NotFound(String),
    /// A request that cannot be served as given (a bad name, a directory read as a file).
    #[error("{0}")]
    Invalid(String),
    /// The sandbox cannot run at all (bubblewrap missing, namespaces refused, runner down).
    #[error("the sandbox is unavailable: {0}")]
    Unavailable(String),
    /// An input/output error in the working folder.
    #[error("sandbox i/o error: {0}")]
    Io(String),
}

impl SandboxError {
    /// A refusal by `rule`.
    pub fn refused(rule: &'static str, message: impl Into<String>) -> SandboxError {
        SandboxError::Refused {
            rule: rule.to_owned(),
            message: message.into(),
        }
    }

    /// The rule of a refusal, `None` for any other error or an unknown rule name.
    pub fn rule(&self) -> Option<&'static str> {
        match self {
            SandboxError::Refused { rule, .. } => rules::by_name(rule),
            _ => None,
        }
    }
}

/// The sandbox port. Object-safe: the tools hold `Arc<dyn Sandbox>`.
pub trait Sandbox: Send + Sync + fmt::Debug {
    /// The bytes of the file at `path` (relative to the working folder).
    fn read<'a>(
        &'a self,
        workspace: &'a Workspace,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<u8>, SandboxError>>;

    /// Writes `content` to `path`, creating the folders on the way; returns the bytes written.
    fn write<'a>(
        &'a self,
        workspace: &'a Workspace,
        path: &'a str,
        content: Vec<u8>,
    ) -> BoxFuture<'a, Result<u64, SandboxError>>;

    /// The entries under `path` (`""` for the folder itself), recursively, links not followed.
    fn list<'a>(
        &'a self,
        workspace: &'a Workspace,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Entry>, SandboxError>>;

    /// Runs `request` in the working folder.
    fn exec<'a>(
        &'a self,
        workspace: &'a Workspace,
        request: ExecRequest,
    ) -> BoxFuture<'a, Result<ExecOutcome, SandboxError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_is_two_safe_ids() {
        let workspace = Workspace::new("acme", "run-1").unwrap();
        assert_eq!(workspace.to_string(), "acme/run-1");
        let back: Workspace = serde_json::from_str("\"acme/run-1\"").unwrap();
        assert_eq!(back, workspace);
        for (tenant, scope) in [("..", "x"), ("a", "../etc"), ("a/b", "c"), ("", "c")] {
            assert!(
                Workspace::new(tenant, scope).is_err(),
                "{tenant:?} {scope:?}"
            );
        }
        assert!(serde_json::from_str::<Workspace>("\"acme/../x\"").is_err());
        assert!(serde_json::from_str::<Workspace>("\"acme\"").is_err());
    }

    #[test]
    fn a_refusal_names_its_rule_and_round_trips() {
        let error = SandboxError::refused(rules::INSIDE_FOLDER, "'../x' has a '..'");
        assert_eq!(
            error.to_string(),
            "refused by rule 'sandbox-inside-folder': '../x' has a '..'"
        );
        assert_eq!(error.rule(), Some(rules::INSIDE_FOLDER));
        let json = serde_json::to_string(&error).unwrap();
        let back: SandboxError = serde_json::from_str(&json).unwrap();
        assert_eq!(back, error);
        let forged = SandboxError::Refused {
            rule: "made-up".into(),
            message: String::new(),
        };
        assert_eq!(forged.rule(), None);
        assert_eq!(SandboxError::NotFound("x".into()).rule(), None);
        for error in [
            SandboxError::NotFound("x".into()),
            SandboxError::Unavailable("down".into()),
            SandboxError::Invalid("bad".into()),
            SandboxError::Io("disk".into()),
        ] {
            let json = serde_json::to_string(&error).unwrap();
            assert_eq!(serde_json::from_str::<SandboxError>(&json).unwrap(), error);
        }
    }

    #[test]
    fn limits_within_a_cap_take_the_smaller_of_each() {
        let asked = Limits {
            wall_ms: 1_000_000,
            processes: 8,
            ..Limits::default()
        };
        let granted = asked.within(Limits::default());
        assert_eq!(granted.wall_ms, 30_000);
        assert_eq!(granted.processes, 8);
    }
}
