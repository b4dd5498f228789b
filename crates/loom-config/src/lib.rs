//! # loom-config
//!
//! Loading and validating a Loom configuration: the root `loom.yaml`, one agent per file in
//! `agents_dir` (`*.yaml`, `*.yml`, sorted by file name) and the system prompts of
//! `prompts_dir`.
//!
//! Loading happens in two stages:
//!
//! 1. **File model.** The YAML text is parsed (serde-saphyr; duplicate keys refused, merge
//!    keys `<<` allowed) into a tree that remembers the line and column of every key and
//!    value. The active profile (`--profile` > `LOOM_PROFILE` > `profile:`) has its
//!    `profiles.<name>` block deep-merged over the root, then the tree is deserialized into
//!    the plain serde types of this crate ([`LoomConfig`], [`ModelSpec`], [`AgentSpec`]…),
//!    which refuse unknown keys everywhere (sections of the reference format that Loom does
//!    not implement yet, such as `sessions`, are unknown keys too, with that reason). Agent files are read the same way.
//! 2. **Validated [`Config`].** Rules between fields are checked (declared models, unique
//!    names, `system` xor `system_file`, prompt files present, template variables known,
//!    positive limits, pricing tiers, roles and their templates, sub-agents, policies, judges,
//!    output contracts, budgets, tenants…), and every refusal is reported as a [`ConfigError`]
//!    located at the offending value through the tree of stage 1:
//!    `agents/devis.yaml:7:10 main.model: unknown model 'X' (declared models: fake-1)`.
//!    Doubtful but working setups (a judge on the model it judges, a money budget over a
//!    model without `pricing`) are kept as [`Config::warnings`]; the `prod` profile refuses
//!    them.
//!
//! The same types can be built in Rust and validated the same way with [`Config::new`].
//! [`json_schema`] describes the file model (what `loom schema` prints).
//!
//! Registered tools are not known here: the facade resolves [`ToolRef::tool`] names (and the
//! hooks of [`PolicyRef`]s and the conditions of [`JudgeWhen`]) and reports failures with
//! [`Config::error_at_agent`].
//!
//! Delegation and guards are declared here and run elsewhere: [`RoleSpec`] and
//! [`SubAgentRef`] (tools of an orchestrator), [`PolicyRef`], [`JudgeSpec`] and
//! [`OutputContract`] (checks of outputs), [`Budgets`] (merged with
//! [`Config::effective_budgets`]) and [`TenantSpec`] ([`Config::check_tenant`]).

mod access;
mod at_rest;
mod config;
mod document;
mod env_file;
mod error;
mod files;
mod guards;
mod model;
mod prompt;
mod security;
mod sessions;
mod state;
mod tenant;
mod trigger;
mod yaml;

use std::path::{Path, PathBuf};

pub use access::{HostPattern, LOOPBACK_HOSTS, OriginPattern, PortPattern};
pub use at_rest::{EncryptionStorage, RetentionStorage};
pub use config::{
    APPROVAL_POLICY, BUILTIN_TOOLS, COMPACTION_AGENT, Config, DEFAULT_TENANT, MAX_SKILL_FILES,
    MCP_CONTROL_TOOLS, Skill, UnknownTenant,
};
pub use document::YamlDocument;
pub use env_file::{EnvFile, EnvVars, LoadOptions};
pub use error::{ConfigError, ConfigErrorKind};
pub use files::MAX_FILE_BYTES;
pub use guards::{
    Budgets, ContextItem, ContextName, ContextScope, Criterion, HookPoint, JudgeSpec, JudgeWhen,
    LastTurnsContext, OnError, OnExceed, OnFailure, OutputContract, PolicyRef, REQUIRE_TOOL_POLICY,
    RepairSettings, RepairTools, RoleSpec, RunBudgetSpec, SessionBudgetSpec, SessionStateContext,
    SubAgentRef, TenantBudgetSpec, ToolResultsContext, default_input_schema,
};
pub use model::{
    AgentApproval, AgentSpec, ArtifactsBackend, ArtifactsStorage, AttachmentsExecution,
    CaptureConfig, CircuitBreaker, DEFAULT_ATTACHMENT_TYPES, DEFAULT_HEARTBEAT_MS, EventsBackend,
    EventsStorage, ExecutionConfig, Expose, FolderRight, FolderSpec, HttpAuth, HttpExpose,
    HttpServerConfig, IdempotencyBackend, IdempotencyStorage, JsonObject, LlmSettings, LogFormat,
    LogLevel, LoggingConfig, LoomConfig, MainRole, McpAccessConfig, McpScope, McpServerSpec,
    McpTransport, ModelApi, ModelCapabilities, ModelSpec, Profile, Profiles, Sdk, ServerConfig,
    SqlBackend, SqlDatabaseSpec, SqlTableSpec, StorageConfig, TelemetryConfig, ToolOverrides,
    ToolRef, ToolSourceSpec, ToolsExecution,
};
pub use model::{
    BusBackend, BusStorage, DEFAULT_POSTGRES_ROLE, LimitsBackend, LimitsStorage, MigrateMode,
    PostgresPool, QueueBackend, QueueStorage,
};
pub use model::{
    CaptureExports, ExporterConfig, ExporterKind, OtlpProtocol, REDACTION_PATTERNS,
    RedactionConfig, RedactionPattern,
};
pub use model::{SandboxBackend, SandboxLimits, SandboxScope, SandboxSpec, SkillRef};
pub use security::{ApiKeySpec, RateLimit, Scope, SecurityConfig, is_key_hash, parse_expiry};
pub use sessions::{CompactionConfig, HistoryCaps, SessionsConfig, StateLimits};
pub use state::{OnMissing, StateKey, StateSource};
pub use tenant::{
    CaptureOverride, Quotas, SecretSource, TenantSpec, TenantStorage, TenantTelemetry,
};
pub use trigger::{
    DEFAULT_SIGNATURE_TOLERANCE, RenderedTrigger, TRIGGER_VARIABLES, TriggerSpec, is_trigger_name,
};

/// Loads and validates the configuration at `path` (usually `loom.yaml`).
///
/// `profile` is the explicit override (`--profile`); otherwise `env("LOOM_PROFILE")`, then
/// `profile:` in the file, choose the active profile. `env` is the only way this crate reads
/// the environment. The env file is `env_file:`, else `.env` beside `path` when there is one
/// ([`EnvFile::Beside`]; see [`load_with`]). Errors display `path` as given and other files
/// relative to its directory.
pub fn load(
    path: &Path,
    profile: Option<Profile>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let options = LoadOptions {
        profile,
        env_file: EnvFile::Beside,
    };
    load_with(path, &options, env)
}

/// [`load`] with the env file chosen ([`LoadOptions`]: `--env-file F`, `--no-env-file`).
///
/// The env file's variables fill in what `env` lacks: `LOOM_PROFILE` here, and for the
/// facade the variables a configuration names (`api_key_env`, `env_from`, …), through
/// [`Config::env_file`]; a variable `env` has wins. An env file that is named (`--env-file`,
/// `env_file:`) must exist; `.env` beside the configuration is read only when it exists.
pub fn load_with(
    path: &Path,
    options: &LoadOptions,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let text = files::read_regular(path).map_err(|problem| {
        let kind = match problem {
            files::FileProblem::NotFound => ConfigErrorKind::MissingFile,
            files::FileProblem::Io(_) => ConfigErrorKind::Io,
            _ => ConfigErrorKind::Invalid,
        };
        ConfigError {
            file: path.to_path_buf(),
            line: None,
            column: None,
            key_path: "(root)".to_owned(),
            message: format!("cannot read config file: {problem}"),
            kind,
        }
    })?;
    let base_dir = config::normalize_base(path.parent().map(Path::to_path_buf).unwrap_or_default());
    let origin = config::Origin {
        file: path.to_path_buf(),
        display: path.to_path_buf(),
        base_dir,
    };
    config::build_from_text(&text, origin, options, env)
}

/// Loads and validates a configuration from YAML text, as if it were `base_dir/loom.yaml`
/// (errors name it `loom.yaml`; agent and prompt files are read under `base_dir`). Same
/// profile rules and validation as [`load`].
pub fn from_yaml_str(
    text: &str,
    base_dir: &Path,
    profile: Option<Profile>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let base_dir = config::normalize_base(base_dir.to_path_buf());
    let origin = config::Origin {
        file: base_dir.join("loom.yaml"),
        display: PathBuf::from("loom.yaml"),
        base_dir,
    };
    let options = LoadOptions {
        profile,
        env_file: EnvFile::Beside,
    };
    config::build_from_text(text, origin, &options, env)
}

/// The JSON Schema (draft 2020-12) of `loom.yaml`, i.e. of [`LoomConfig`].
pub fn json_schema() -> serde_json::Value {
    schemars::schema_for!(LoomConfig).to_value()
}
