//! # loom-sandbox
//!
//! The sandbox of an agent (`sandbox:` in its YAML): one working folder per run or per session
//! where it reads, writes, lists and executes, behind the [`Sandbox`](loom_core::sandbox::Sandbox)
//! port of `loom-core`.
//!
//! - [`LocalSandbox`]: working folders under a root on this host; `read`, `write` and `list`
//!   are done host-side through the folder's directory handle (nothing leaves it: `..`,
//!   absolute paths and symbolic links out are refused by rule `sandbox-inside-folder`), and
//!   `exec` runs `/bin/sh -c` in Linux namespaces with bubblewrap, under resource limits and a
//!   wall-clock kill (see the `exec` module's documentation for what the command sees);
//! - [`sandbox_tools`]: the agent's tools `sandbox__read`, `sandbox__write`, `sandbox__list`
//!   and `sandbox__exec` on any backend;
//! - [`skill_tools`]: `skills__load`, `skills__read` and `skills__run` over an agent's skills,
//!   whose scripts run only in its sandbox;
//! - [`forge`]: the tool source `forge`, where a model defines tools whose examples run in
//!   the sandbox before they are published in the tenant's catalog;
//! - with the feature `remote`: [`remote::RemoteSandbox`], the same contract over HTTP, and
//!   [`remote::router`], the runner it talks to (`loom sandbox serve`).
//!
//! **Architecture invariant:** an adapter depends on `loom-core` only among loom crates; the
//! backend is a port, so a microVM backend would implement the same trait.

mod exec;
mod folder;
pub mod forge;
mod local;
#[cfg(feature = "remote")]
pub mod remote;
mod skills;
mod tools;

use std::path::PathBuf;

pub use exec::MOUNT_POINT;
pub use folder::FILE_CAP_BYTES;
pub use local::LocalSandbox;
pub use skills::{SKILLS_PREFIX, SkillDoc, skill_tools};
pub use tools::{PREFIX, Scope, Settings, exec_output, sandbox_tools, tool_error};

/// An error setting a sandbox up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// The root of the working folders cannot be created or resolved.
    #[error("cannot create the sandbox root {path}: {source}")]
    Root {
        /// The root as given.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A program the local backend needs is missing (`bwrap` from the `bubblewrap` package,
    /// `prlimit` from `util-linux`).
    #[error(
        "the sandbox needs '{0}' in /usr/bin or /bin, and it is missing (bwrap is in the Debian package 'bubblewrap', prlimit in 'util-linux')"
    )]
    Missing(&'static str),
    /// The remote backend's settings are unusable.
    #[error("remote sandbox: {0}")]
    Remote(String),
}
