//! The file model: the types `loom.yaml` and `agents/*.yaml` deserialize into.
//!
//! Every struct refuses unknown keys. Defaults follow the reference implementation. These
//! types only describe the shape of the file; cross-field rules (declared models, prompt files,
//! positive timeouts…) are checked when a [`crate::Config`] is built.

mod agents;
mod execution;
mod mcp;
mod models;
mod sandbox;
mod server;
mod sources;
mod storage;
mod telemetry;
mod tools;

pub use agents::{
    AgentApproval, AgentSpec, DEFAULT_HEARTBEAT_MS, Expose, HttpAuth, HttpExpose, LlmSettings,
    MainRole,
};
pub use execution::{
    AttachmentsExecution, DEFAULT_ATTACHMENT_TYPES, ExecutionConfig, ToolsExecution,
};
pub use mcp::{CircuitBreaker, McpScope, McpServerSpec, McpTransport};
pub use models::{ModelApi, ModelCapabilities, ModelSpec, Sdk};
pub use sandbox::{SandboxBackend, SandboxLimits, SandboxScope, SandboxSpec, SkillRef};
pub use server::{HttpServerConfig, McpAccessConfig, ServerConfig};
pub use sources::ToolSourceSpec;
pub use storage::{
    ArtifactsBackend, ArtifactsStorage, BusBackend, BusStorage, DEFAULT_POSTGRES_ROLE,
    EventsBackend, EventsStorage, IdempotencyBackend, IdempotencyStorage, LimitsBackend,
    LimitsStorage, MigrateMode, PostgresPool, QueueBackend, QueueStorage, StorageConfig,
};
pub use telemetry::{
    CaptureConfig, CaptureExports, ExporterConfig, ExporterKind, LogFormat, LogLevel,
    LoggingConfig, OtlpProtocol, REDACTION_PATTERNS, RedactionConfig, RedactionPattern,
    TelemetryConfig,
};
pub use tools::{
    FolderRight, FolderSpec, SqlBackend, SqlDatabaseSpec, SqlTableSpec, ToolOverrides, ToolRef,
};

use std::{fmt, path::PathBuf, str::FromStr};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::guards::Budgets;
use crate::tenant::TenantSpec;

/// A free JSON object (`params` blocks, profile overrides).
pub type JsonObject = Map<String, Value>;

/// Root of `loom.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "LoomConfig")]
pub struct LoomConfig {
    /// Format version; must be 1.
    pub version: u32,
    /// Profile used when neither `--profile` nor `LOOM_PROFILE` names one.
    #[serde(default)]
    pub profile: Option<Profile>,
    /// Per-profile partial overrides, deep-merged over the root before validation (mappings
    /// merged key by key; lists, `params` and `llm` blocks replaced whole).
    #[serde(default)]
    pub profiles: Profiles,
    /// An env file (`KEY=VALUE` lines) read before the rest of the configuration, relative to
    /// the config file; it must exist. Without it, `.env` beside the config file is read when
    /// there is one. Variables already set in the environment win; `--env-file` replaces it and
    /// `--no-env-file` reads none. Refused inside `profiles`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_file: Option<PathBuf>,
    /// Directory of agent files (`*.yaml`, `*.yml`), relative to the config file.
    #[serde(default = "default_agents_dir")]
    pub agents_dir: PathBuf,
    /// Directory of prompt files (`system_file`), relative to the config file.
    #[serde(default = "default_prompts_dir")]
    pub prompts_dir: PathBuf,
    /// Declared models, referenced by id from agents.
    #[serde(default)]
    pub models: Vec<ModelSpec>,
    /// Declared MCP servers, referenced by name from agents (`tools: [{mcp: <name>}]`).
    #[serde(default)]
    pub mcp_servers: Vec<McpServerSpec>,
    /// Declared tool sources, referenced by name from agents (`tools: [{source: <name>}]`).
    #[serde(default)]
    pub tool_sources: Vec<ToolSourceSpec>,
    /// Inline agents, in addition to those read from `agents_dir`.
    #[serde(default)]
    pub agents: Vec<AgentSpec>,
    /// Where events and data are stored.
    #[serde(default)]
    pub storage: StorageConfig,
    /// Tool execution settings.
    #[serde(default)]
    pub execution: ExecutionConfig,
    /// Default budgets of every agent (each agent's `budget` and each tenant's `budgets` are
    /// merged over them key by key).
    #[serde(default)]
    pub budgets: Budgets,
    /// Long sessions: snapshots, compaction, history caps, session state limits.
    #[serde(default)]
    pub sessions: crate::sessions::SessionsConfig,
    /// Logs.
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// Declared tenants; without the list, only the tenant `default` exists.
    #[serde(default)]
    pub tenants: Vec<TenantSpec>,
    /// Servers started by `loom serve`.
    #[serde(default)]
    pub server: ServerConfig,
    /// API keys of `loom serve`; without any, the API is open.
    #[serde(default)]
    pub security: crate::security::SecurityConfig,
    /// Webhooks of `loom serve` (`POST /v1/hooks/{name}`): each opens a background run.
    #[serde(default)]
    pub triggers: Vec<crate::trigger::TriggerSpec>,
}

impl Default for LoomConfig {
    fn default() -> Self {
        LoomConfig {
            version: 1,
            profile: None,
            profiles: Profiles::default(),
            env_file: None,
            agents_dir: default_agents_dir(),
            prompts_dir: default_prompts_dir(),
            models: Vec::new(),
            mcp_servers: Vec::new(),
            tool_sources: Vec::new(),
            agents: Vec::new(),
            storage: StorageConfig::default(),
            execution: ExecutionConfig::default(),
            budgets: Budgets::default(),
            sessions: crate::sessions::SessionsConfig::default(),
            telemetry: TelemetryConfig::default(),
            tenants: Vec::new(),
            server: ServerConfig::default(),
            security: crate::security::SecurityConfig::default(),
            triggers: Vec::new(),
        }
    }
}

fn default_agents_dir() -> PathBuf {
    PathBuf::from("agents")
}

fn default_prompts_dir() -> PathBuf {
    PathBuf::from("prompts")
}

/// A deployment profile.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// Lax: some setup errors are only warnings.
    Dev,
    /// Strict.
    Prod,
}

impl Profile {
    /// The profile's name as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Dev => "dev",
            Profile::Prod => "prod",
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Profile {
    type Err = String;

    /// Parses `dev` or `prod`; the error is a message naming the accepted values.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "dev" => Ok(Profile::Dev),
            "prod" => Ok(Profile::Prod),
            other => Err(format!(
                "unknown profile '{other}' (expected one of: dev, prod)"
            )),
        }
    }
}

/// Partial overrides per profile: any subset of the root keys (except `profile`/`profiles`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Profiles {
    /// Overrides applied when the active profile is `dev`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev: Option<JsonObject>,
    /// Overrides applied when the active profile is `prod`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prod: Option<JsonObject>,
}
