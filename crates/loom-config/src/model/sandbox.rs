//! An agent's sandbox (`sandbox:`) and skills (`skills:`).

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An agent's `sandbox:` block: the tools `sandbox__read`, `sandbox__write`, `sandbox__list`
/// and `sandbox__exec` on one working folder per run or per session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    /// Where commands run: `local` (bubblewrap on this host) or `remote` (a runner started
    /// with `loom sandbox serve`, at `url`).
    #[serde(default)]
    pub backend: SandboxBackend,
    /// One working folder per `run` (default) or per `session` (kept across its runs).
    #[serde(default)]
    pub scope: SandboxScope,
    /// Root of the working folders (`local`), relative to the config file; by default
    /// `<journal directory>/.sandbox` (`jsonl`), beside the database file (`sqlite`), else
    /// `.loom-sandbox` beside the config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<PathBuf>,
    /// The limits of each command.
    #[serde(default)]
    pub limits: SandboxLimits,
    /// Whether commands may reach the network (default `false`: a network namespace with only
    /// a loopback interface).
    #[serde(default)]
    pub network: bool,
    /// The runner's base URL (`remote`, required), e.g. `http://10.0.0.5:7070`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The environment variable holding the runner's bearer token (`remote`, required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_env: Option<String>,
}

/// Where an agent's commands run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SandboxBackend {
    /// Linux namespaces with bubblewrap, on this host.
    #[default]
    Local,
    /// A runner on another host, over HTTP (`loom sandbox serve`).
    Remote,
}

/// Which working folder a call works in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SandboxScope {
    /// One folder per run.
    #[default]
    Run,
    /// One folder per session, kept across its runs.
    Session,
}

/// The limits of each sandboxed command; an absent limit takes its default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxLimits {
    /// Wall-clock milliseconds before the command's processes are killed (default 30000).
    #[schemars(range(min = 1))]
    pub wall_ms: Option<u64>,
    /// CPU milliseconds, rounded up to whole seconds (default 10000).
    #[schemars(range(min = 1))]
    pub cpu_ms: Option<u64>,
    /// Address space of each process in MiB (default 512).
    #[schemars(range(min = 1))]
    pub memory_mb: Option<u64>,
    /// Bytes of each output stream kept (default 65536); the rest is counted only.
    #[schemars(range(min = 1))]
    pub output_bytes: Option<u64>,
    /// Processes (default 64).
    #[schemars(range(min = 1))]
    pub processes: Option<u64>,
    /// Largest file a command may write, in MiB (default 64).
    #[schemars(range(min = 1))]
    pub file_mb: Option<u64>,
}

/// A skill of an agent: a folder holding a `SKILL.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillRef {
    /// The skill's folder, relative to the config file.
    pub path: PathBuf,
}
