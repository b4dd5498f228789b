//! The file model: the types `loom.yaml` and `agents/*.yaml` deserialize into.
//!
//! Every struct refuses unknown keys. Defaults follow the reference implementation. These
//! types only describe the shape of the file; cross-field rules (declared models, prompt files,
//! positive timeouts…) are checked when a [`crate::Config`] is built.

use std::{collections::BTreeMap, fmt, path::PathBuf, str::FromStr};

use loom_core::approval::OnExpiry;
use loom_core::tool::{Approval, SideEffects};
use loom_core::usage::Pricing;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::guards::{Budgets, JudgeSpec, OutputContract, PolicyRef, RoleSpec, SubAgentRef};
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
            agents: Vec::new(),
            storage: StorageConfig::default(),
            execution: ExecutionConfig::default(),
            budgets: Budgets::default(),
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

/// A model declaration, referenced by `id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Identifier used by agents (unique).
    #[schemars(length(min = 1))]
    pub id: String,
    /// Provider SDK.
    pub sdk: Sdk,
    /// API flavour; only with `sdk: openai` (default `chat`).
    #[serde(default)]
    pub api: Option<ModelApi>,
    /// The provider's model name.
    #[schemars(length(min = 1))]
    pub model: String,
    /// Endpoint override.
    #[serde(default)]
    pub base_url: Option<String>,
    /// NAME of the environment variable holding the API key (never the key itself).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Default output-token limit.
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub max_tokens: Option<u32>,
    /// Passed through to the provider (the fake model reads `params.script`).
    #[serde(default)]
    pub params: JsonObject,
    /// What the model can do.
    #[serde(default)]
    pub capabilities: ModelCapabilities,
    /// Prices in dollars per million tokens.
    #[serde(default)]
    pub pricing: Pricing,
    /// Extra HTTP headers sent with every request (values are written here: no secrets).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Time limits of one call, in seconds (`null` disables one).
    #[serde(default)]
    pub timeouts: ModelTimeouts,
    /// Retries of transient failures.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// Breaker over consecutive failures, shared by all runs of the process (`null` removes it).
    #[serde(default = "default_breaker")]
    pub circuit_breaker: Option<CircuitBreaker>,
    /// Anthropic prompt-cache breakpoints (refused for other SDKs).
    #[serde(default)]
    pub cache: Option<PromptCache>,
}

/// Time limits of one model call, in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ModelTimeouts {
    /// Until the first content chunk.
    pub first_token: Option<f64>,
    /// Between two chunks.
    pub idle: Option<f64>,
    /// The whole call.
    pub total: Option<f64>,
}

impl Default for ModelTimeouts {
    fn default() -> Self {
        ModelTimeouts {
            first_token: Some(60.0),
            idle: Some(60.0),
            total: Some(300.0),
        }
    }
}

/// Retries of transient failures: delay after attempt n = min(max_delay, initial_delay ×
/// multiplier^(n-1)) with jitter; a provider's Retry-After replaces it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Attempts in all (1 = no retry).
    #[schemars(range(min = 1))]
    pub max_attempts: u32,
    /// First delay, seconds.
    pub initial_delay: f64,
    /// Growth of the delay (≥ 1).
    pub multiplier: f64,
    /// Longest delay, seconds; a Retry-After above it abandons the model.
    pub max_delay: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_delay: 1.0,
            multiplier: 2.0,
            max_delay: 30.0,
        }
    }
}

/// Anthropic prompt-cache breakpoints.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PromptCache {
    /// Cache the system prompt.
    pub system: bool,
    /// Cache the tool definitions.
    pub tools: bool,
    /// Cache the conversation up to the last user message.
    pub messages: bool,
    /// "5m" (default) or "1h".
    pub ttl: Option<String>,
}

impl ModelSpec {
    /// A model with every optional field at its default.
    pub fn new(id: impl Into<String>, sdk: Sdk, model: impl Into<String>) -> ModelSpec {
        ModelSpec {
            id: id.into(),
            sdk,
            api: None,
            model: model.into(),
            base_url: None,
            api_key_env: None,
            max_tokens: None,
            params: JsonObject::new(),
            capabilities: ModelCapabilities::default(),
            pricing: Pricing::default(),
            headers: BTreeMap::new(),
            timeouts: ModelTimeouts::default(),
            retry: RetryPolicy::default(),
            circuit_breaker: default_breaker(),
            cache: None,
        }
    }

    /// The API flavour in effect (`chat` unless `responses` is asked for).
    pub fn effective_api(&self) -> ModelApi {
        self.api.unwrap_or_default()
    }
}

/// Provider SDK of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Sdk {
    /// Anthropic Messages API.
    Anthropic,
    /// OpenAI (or compatible) API.
    Openai,
    /// Scripted model for tests (`params.script`).
    Fake,
}

impl Sdk {
    /// The SDK's name as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            Sdk::Anthropic => "anthropic",
            Sdk::Openai => "openai",
            Sdk::Fake => "fake",
        }
    }
}

/// OpenAI API flavour.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ModelApi {
    /// Chat Completions.
    #[default]
    Chat,
    /// Responses API.
    Responses,
}

/// Declared capabilities of a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ModelCapabilities {
    /// Can call tools.
    pub tools: bool,
    /// Accepts images.
    pub vision: bool,
    /// Produces reasoning (alias `thinking`).
    #[serde(alias = "thinking")]
    pub reasoning: bool,
    /// Accepts a JSON output schema.
    pub native_json: bool,
    /// Can be forced to call a tool (`tool_choice: required`); needed by the policy
    /// `loom.require_tool`.
    pub forced_tool_choice: bool,
    /// Streams its answers. `false`, for servers that cannot stream: each call is one
    /// non-streamed request whose whole JSON answer is then read as the same chunks.
    pub streaming: bool,
    /// Context window in tokens, when known.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub context_window: Option<u64>,
}

impl Default for ModelCapabilities {
    fn default() -> Self {
        ModelCapabilities {
            tools: true,
            vision: false,
            reasoning: false,
            native_json: false,
            forced_tool_choice: true,
            streaming: true,
            context_window: None,
        }
    }
}

/// An agent: one file in `agents_dir`, or an entry of the root `agents` list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// Unique name (`^[A-Za-z0-9_-]{1,64}$`).
    #[schemars(regex(pattern = r"^[A-Za-z0-9_-]{1,64}$"))]
    pub name: String,
    /// What the agent does.
    #[serde(default)]
    pub description: String,
    /// The orchestrating role.
    pub main: MainRole,
    /// Maximum model turns in a run.
    #[serde(default = "default_max_iterations")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub max_iterations: u32,
    /// Piloting time limit in seconds.
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub timeout: Option<f64>,
    /// Tools the agent may call.
    #[serde(default)]
    pub tools: Vec<ToolRef>,
    /// How long approval requests of its tools wait, and what their expiry does.
    #[serde(default)]
    pub approval: AgentApproval,
    /// Deepest sub-agent nesting below a run of this agent (sub-agents are hidden from a run
    /// at that depth).
    #[serde(default = "default_max_depth")]
    #[schemars(range(min = 1))]
    pub max_depth: u32,
    /// Delegated roles, called by the orchestrator like tools.
    #[serde(default)]
    pub roles: Vec<RoleSpec>,
    /// Other agents of the configuration, called like tools.
    #[serde(default)]
    pub subagents: Vec<SubAgentRef>,
    /// Policies, in the order they run at each point.
    #[serde(default)]
    pub policies: Vec<PolicyRef>,
    /// Contract of the final answer.
    #[serde(default)]
    pub output: Option<OutputContract>,
    /// Judge of the final answer.
    #[serde(default)]
    pub judge: Option<JudgeSpec>,
    /// Budgets merged key by key over the root `budgets` (see `Config::effective_budgets`).
    #[serde(default)]
    pub budget: Option<Budgets>,
    /// Through which access the agent is offered: the REST API (`loom serve`) and the MCP
    /// server (`loom mcp`, `/mcp`). Both by default.
    #[serde(default)]
    pub expose: Expose,
}

/// An agent's `expose:` block: where it is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Expose {
    /// Listed by `GET /v1/agents` and runnable with `POST /v1/agents/{name}/runs`.
    pub rest: bool,
    /// A tool of the MCP server.
    pub mcp: bool,
}

impl Default for Expose {
    /// Published everywhere.
    fn default() -> Self {
        Expose {
            rest: true,
            mcp: true,
        }
    }
}

fn default_max_depth() -> u32 {
    1
}

fn default_max_iterations() -> u32 {
    10
}

/// An agent's `approval:` block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentApproval {
    /// Seconds a request waits for a decision (`null`: never expires; default 86400, 24 h).
    #[serde(default = "default_expires_in")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub expires_in: Option<f64>,
    /// What an expired request does: `deny` (the model is told) or `fail` (the run fails).
    #[serde(default)]
    pub on_expiry: OnExpiry,
}

impl Default for AgentApproval {
    fn default() -> Self {
        AgentApproval {
            expires_in: default_expires_in(),
            on_expiry: OnExpiry::Deny,
        }
    }
}

fn default_expires_in() -> Option<f64> {
    Some(86_400.0)
}

impl AgentSpec {
    /// An agent on `model` with every optional field at its default.
    pub fn new(name: impl Into<String>, model: impl Into<String>) -> AgentSpec {
        AgentSpec {
            name: name.into(),
            description: String::new(),
            main: MainRole::new(model),
            max_iterations: default_max_iterations(),
            timeout: None,
            tools: Vec::new(),
            approval: AgentApproval::default(),
            max_depth: default_max_depth(),
            roles: Vec::new(),
            subagents: Vec::new(),
            policies: Vec::new(),
            output: None,
            judge: None,
            budget: None,
            expose: Expose::default(),
        }
    }
}

/// The orchestrating role of an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MainRole {
    /// Id of a declared model.
    #[schemars(length(min = 1))]
    pub model: String,
    /// Models tried in order when the main one fails for good (transient errors after their
    /// retries, quota, context length); a run that switched stays on the fallback.
    #[serde(default)]
    pub fallbacks: Vec<String>,
    /// Inline system prompt (a template over `agent` and `tenant`).
    #[serde(default)]
    pub system: String,
    /// System prompt file, relative to `prompts_dir` (not with `system`).
    #[serde(default)]
    pub system_file: Option<PathBuf>,
    /// Call settings for this role.
    #[serde(default)]
    pub llm: LlmSettings,
}

impl MainRole {
    /// A role on `model` with no system prompt.
    pub fn new(model: impl Into<String>) -> MainRole {
        MainRole {
            model: model.into(),
            fallbacks: Vec::new(),
            system: String::new(),
            system_file: None,
            llm: LlmSettings::default(),
        }
    }
}

/// Per-role call settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LlmSettings {
    /// Output-token limit for this role.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub max_tokens: Option<u32>,
    /// Provider parameters for this role.
    pub params: JsonObject,
}

/// A tool reference of an agent: a tool registered in code or built in (`tool`), or the tools of
/// an MCP server (`mcp`). Exactly one of `tool` and `mcp` is given; the other keys are checked
/// against it (`folders` only with `loom.local_files`, `include` only with `mcp`, …).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolRef {
    /// Registered tool name, or a built-in `loom.current_datetime`, `loom.local_files`,
    /// `loom.fetch_page` (alias `python`, for users of the Python reference).
    #[serde(default, alias = "python")]
    #[schemars(length(min = 1))]
    pub tool: Option<String>,
    /// A declared MCP server whose tools the agent uses (`<server>__<tool>`).
    #[serde(default)]
    #[schemars(regex(pattern = r"^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$"))]
    pub mcp: Option<String>,
    /// With `mcp`: the prefix the model sees instead of the server name (`<alias>__<tool>`).
    #[serde(default)]
    #[schemars(regex(pattern = r"^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$"), length(max = 40))]
    pub alias: Option<String>,
    /// With `mcp`: only these tools (server names, without prefix).
    #[serde(default)]
    pub include: Option<Vec<String>>,
    /// With `mcp`: all tools but these.
    #[serde(default)]
    pub exclude: Option<Vec<String>>,
    /// With `mcp`: fail the run when the server cannot be reached (else its tools are withdrawn).
    #[serde(default)]
    pub required: bool,
    /// With `mcp`: declarations per tool (server names), over the server's own.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolOverrides>,
    /// Description shown to the model instead of the tool's own.
    #[serde(default)]
    pub description: Option<String>,
    /// Per-call timeout in seconds.
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub timeout: Option<f64>,
    /// Side effects of a call.
    #[serde(default)]
    pub side_effects: Option<SideEffects>,
    /// Human approval of calls.
    #[serde(default)]
    pub approval: Option<Approval>,
    /// Whether running a call twice has the effect of running it once.
    #[serde(default)]
    pub idempotent: Option<bool>,
    /// Result size (characters) above which the result is offloaded.
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub offload_over: Option<u64>,
    /// With `loom.local_files`: the folders the tool may use.
    #[serde(default)]
    pub folders: Option<Vec<FolderSpec>>,
    /// With `loom.fetch_page`: allow loopback, private and link-local addresses (default false).
    #[serde(default)]
    pub allow_private: Option<bool>,
    /// With `loom.fetch_page`: largest page read, in bytes after decompression.
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub max_bytes: Option<u64>,
    /// Contract of the tool's results (with `mcp`: set it per tool under `tools`).
    #[serde(default)]
    pub output: Option<OutputContract>,
}

impl ToolRef {
    /// A reference to the tool `tool` without overrides.
    pub fn new(tool: impl Into<String>) -> ToolRef {
        ToolRef {
            tool: Some(tool.into()),
            ..ToolRef::default()
        }
    }

    /// A reference to the tools of the MCP server `server`.
    pub fn mcp(server: impl Into<String>) -> ToolRef {
        ToolRef {
            mcp: Some(server.into()),
            ..ToolRef::default()
        }
    }
}

/// Declarations of one tool fixed by the configuration; absent keys keep the tool's own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolOverrides {
    /// Description shown to the model.
    #[serde(default)]
    pub description: Option<String>,
    /// Side effects of a call.
    #[serde(default)]
    pub side_effects: Option<SideEffects>,
    /// Human approval of calls.
    #[serde(default)]
    pub approval: Option<Approval>,
    /// Whether running a call twice has the effect of running it once.
    #[serde(default)]
    pub idempotent: Option<bool>,
    /// Per-call timeout in seconds.
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub timeout: Option<f64>,
    /// Result size (characters) above which the result is offloaded.
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub offload_over: Option<u64>,
    /// Contract of the tool's results.
    #[serde(default)]
    pub output: Option<OutputContract>,
}

/// A folder `loom.local_files` may use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FolderSpec {
    /// Name the model uses for it.
    #[schemars(regex(pattern = r"^[a-z0-9][a-z0-9_-]{0,31}$"))]
    pub name: String,
    /// Directory, relative to the config file.
    pub path: PathBuf,
    /// What the tool may do there.
    #[schemars(length(min = 1))]
    pub rights: Vec<FolderRight>,
}

/// A right on a folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FolderRight {
    /// List and read files.
    Read,
    /// Create new files.
    Write,
    /// Replace existing files.
    Overwrite,
    /// Delete files.
    Delete,
}

/// An MCP server whose tools agents may use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServerSpec {
    /// Name, and prefix of its tools (`<name>__<tool>`).
    #[schemars(regex(pattern = r"^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$"), length(max = 40))]
    pub name: String,
    /// How Loom talks to it.
    pub transport: McpTransport,
    /// stdio: the command to start.
    #[serde(default)]
    pub command: Option<String>,
    /// stdio: its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// stdio: environment variables set for it (values are written here, so no secrets:
    /// use `env_from`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// stdio: environment variables set for it from Loom's environment (`NAME: LOOM_VAR`).
    #[serde(default)]
    pub env_from: BTreeMap<String, String>,
    /// stdio: working directory (default: the config file's directory).
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// http: the streamable HTTP endpoint.
    #[serde(default)]
    pub url: Option<String>,
    /// http: headers whose values come from environment variables (`Authorization: CRM_TOKEN`);
    /// never written to the journal.
    #[serde(default)]
    pub headers_env: BTreeMap<String, String>,
    /// Life of a connection: one per process, per tenant, or per run.
    #[serde(default)]
    pub scope: McpScope,
    /// Seconds to connect and list tools.
    #[serde(default = "default_connect_timeout")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub connect_timeout: f64,
    /// Declarations per tool (server names), over the server's annotations.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolOverrides>,
    /// Breaker over consecutive connection failures (`null` removes it).
    #[serde(default = "default_breaker")]
    pub circuit_breaker: Option<CircuitBreaker>,
}

fn default_connect_timeout() -> f64 {
    10.0
}

fn default_breaker() -> Option<CircuitBreaker> {
    Some(CircuitBreaker::default())
}

/// MCP transports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum McpTransport {
    /// A child process speaking on stdin/stdout.
    Stdio,
    /// Streamable HTTP.
    Http,
}

/// Life of an MCP connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum McpScope {
    /// One per process, shared by all runs.
    #[default]
    Shared,
    /// One per tenant.
    Tenant,
    /// Opened and closed with each run.
    Run,
}

/// A circuit breaker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CircuitBreaker {
    /// Consecutive failures that open it.
    #[serde(default = "default_failures")]
    #[schemars(range(min = 1))]
    pub failures: u32,
    /// Seconds it stays open.
    #[serde(default = "default_cooldown")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub cooldown: f64,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        CircuitBreaker {
            failures: default_failures(),
            cooldown: default_cooldown(),
        }
    }
}

fn default_failures() -> u32 {
    5
}

fn default_cooldown() -> f64 {
    60.0
}

/// Storage settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// The event journal.
    pub events: EventsStorage,
    /// Where files are kept (offloaded results); by default beside the journal.
    pub artifacts: ArtifactsStorage,
    /// The idempotency store shared by every run, needed by tools with a business key
    /// (default: none).
    pub idempotency: Option<IdempotencyStorage>,
    /// Sealing at rest of event payloads and files with each tenant's key (default: none;
    /// needs the `crypto` feature of `loom-ia`).
    pub encryption: Option<crate::at_rest::EncryptionStorage>,
    /// How long a dormant session is kept (default: forever).
    pub retention: crate::at_rest::RetentionStorage,
    /// Whether Loom applies the missing PostgreSQL migrations when it starts (`auto`) or only
    /// checks that they are applied (`check`, the default: a DBA applies `loom storage sql`).
    /// A Loom extension of the reference format.
    pub migrate: MigrateMode,
}

/// What Loom does with the PostgreSQL schema when it starts (`storage.migrate`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MigrateMode {
    /// Apply the migrations the database lacks (as the DSN's user, under an advisory lock).
    Auto,
    /// Refuse to start when a migration is missing, naming it.
    #[default]
    Check,
}

/// The connection pool of a PostgreSQL store (`pool`): sizes, and timeouts in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PostgresPool {
    /// Connections kept open (at least 1).
    pub min_size: u32,
    /// Connections at most (at least `min_size`).
    pub max_size: u32,
    /// The longest a statement may run.
    pub command_timeout: f64,
    /// The longest a statement waits for a lock.
    pub lock_timeout: f64,
    /// The longest a caller waits for a free connection.
    pub acquire_timeout: f64,
}

impl Default for PostgresPool {
    fn default() -> PostgresPool {
        PostgresPool {
            min_size: 1,
            max_size: 10,
            command_timeout: 60.0,
            lock_timeout: 10.0,
            acquire_timeout: 30.0,
        }
    }
}

/// The application role of a PostgreSQL store when none is named.
pub const DEFAULT_POSTGRES_ROLE: &str = "loom_app";

fn default_postgres_role() -> String {
    DEFAULT_POSTGRES_ROLE.to_owned()
}

/// The idempotency store (`storage.idempotency`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdempotencyStorage {
    /// Backend.
    pub backend: IdempotencyBackend,
    /// Database file (`sqlite`), relative to the config file; by default the `sqlite` journal's.
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// The environment variable holding the DSN (`postgres`); by default the `postgres`
    /// journal's.
    #[serde(default)]
    pub dsn_env: Option<String>,
    /// The application role (`postgres`); by default the journal's.
    #[serde(default)]
    pub role: Option<String>,
    /// The connection pool (`postgres`); by default the journal's (and its pool, when the DSN
    /// and role are the journal's).
    #[serde(default)]
    pub pool: Option<PostgresPool>,
}

/// Idempotency store backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum IdempotencyBackend {
    /// A table of a SQLite file, shared by every process that opens it; needs the `sqlite`
    /// feature of `loom-ia`.
    Sqlite,
    /// The table `loom_idempotency` of a PostgreSQL database; needs the `postgres` feature of
    /// `loom-ia`.
    Postgres,
}

/// Where artifacts are kept. Without `backend`, they follow the journal: `<events path>/.artifacts`
/// for `jsonl`, `<directory of the database>/.artifacts` for `sqlite`, the table
/// `loom_artifacts` of the database for `postgres`, in memory for `memory`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ArtifactsStorage {
    /// `local` (a directory), `memory`, or `postgres` (the journal's database).
    pub backend: Option<ArtifactsBackend>,
    /// Directory of the `local` backend, relative to the config file.
    pub path: Option<PathBuf>,
}

/// Artifact stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ArtifactsBackend {
    /// Files in a directory.
    Local,
    /// In process memory.
    Memory,
    /// The table `loom_artifacts` of the `postgres` journal's database: shared by every worker
    /// on every host, under the same row-level security, retention and erasure as the journal.
    Postgres,
}

/// The event journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EventsStorage {
    /// Backend.
    pub backend: EventsBackend,
    /// Journal directory (`jsonl`) or database file (`sqlite`), required for both, relative to
    /// the config file.
    pub path: Option<PathBuf>,
    /// The environment variable holding the DSN (`postgres`, required), e.g.
    /// `postgres://loom@db.internal:5432/loom`.
    pub dsn_env: Option<String>,
    /// The role Loom's connections switch to (`postgres`): neither the owner of the tables nor
    /// a superuser, so row-level security applies to it.
    #[serde(default = "default_postgres_role")]
    pub role: String,
    /// The connection pool (`postgres`).
    pub pool: PostgresPool,
}

impl Default for EventsStorage {
    fn default() -> EventsStorage {
        EventsStorage {
            backend: EventsBackend::default(),
            path: None,
            dsn_env: None,
            role: default_postgres_role(),
            pool: PostgresPool::default(),
        }
    }
}

/// Event journal backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventsBackend {
    /// In memory (lost at exit).
    #[default]
    Memory,
    /// JSON lines files in a directory.
    Jsonl,
    /// One SQLite database file (WAL); needs the `sqlite` feature of `loom-ia`.
    Sqlite,
    /// A PostgreSQL database, tenants kept apart by row-level security; needs the `postgres`
    /// feature of `loom-ia`.
    Postgres,
}

/// Execution settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ExecutionConfig {
    /// Tool calls.
    pub tools: ToolsExecution,
    /// Files attached to a run's request (`loom run --attach`).
    pub attachments: AttachmentsExecution,
    /// Seconds a driver holds a run before another may take it over (renewed while working).
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub lease: f64,
    /// Seconds a stopping server (`loom serve` on SIGTERM or Ctrl-C) lets the runs in flight
    /// finish their current step; past it, a step still running is abandoned as a crash would
    /// leave it. Either way the run stays open, its lease handed back, and resumes at the next
    /// start.
    #[schemars(range(min = 0))]
    pub shutdown_timeout: f64,
}

impl Default for ExecutionConfig {
    fn default() -> Self {
        ExecutionConfig {
            tools: ToolsExecution::default(),
            attachments: AttachmentsExecution::default(),
            lease: 60.0,
            shutdown_timeout: 30.0,
        }
    }
}

/// Defaults for tool calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ToolsExecution {
    /// Per-call timeout in seconds (`null`: none).
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub timeout: Option<f64>,
    /// Validate arguments against the tool's input schema.
    pub validate_arguments: bool,
    /// Result size (characters) above which results are offloaded (`null`: never).
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub offload_over: Option<u64>,
}

impl Default for ToolsExecution {
    fn default() -> Self {
        ToolsExecution {
            timeout: Some(30.0),
            validate_arguments: true,
            offload_over: Some(50_000),
        }
    }
}

/// Limits on the files attached to a run (`execution.attachments`), checked before anything
/// is written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AttachmentsExecution {
    /// Largest file, in bytes.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub max_bytes: u64,
    /// Accepted media types (`type/subtype`).
    pub types: Vec<String>,
    /// Most files on one request.
    pub max_files: u32,
}

/// The media types attached by default: the images every vision model reads.
pub const DEFAULT_ATTACHMENT_TYPES: [&str; 4] =
    ["image/jpeg", "image/png", "image/gif", "image/webp"];

impl Default for AttachmentsExecution {
    /// 5 MiB per file, the four common image types, 10 files.
    fn default() -> Self {
        AttachmentsExecution {
            max_bytes: 5_242_880,
            types: DEFAULT_ATTACHMENT_TYPES.map(str::to_owned).to_vec(),
            max_files: 10,
        }
    }
}

/// Servers (`server`): the REST API and the MCP server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// The REST API with SSE (`loom serve`).
    pub http: HttpServerConfig,
    /// The MCP server (`loom mcp` on stdio, `<base_path>/mcp` in `loom serve`).
    pub mcp: McpAccessConfig,
}

/// The MCP server (`server.mcp`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct McpAccessConfig {
    /// Folders a `file://` attachment of an agent tool must be in (relative to the config
    /// file); empty: no `file://` attachment is accepted.
    pub file_roots: Vec<PathBuf>,
    /// Serve MCP over streamable HTTP at `<base_path>/mcp` in `loom serve` (needs at least one
    /// API key: every request must carry one).
    pub http: bool,
    /// Browser origins allowed to call `/mcp` (`scheme://host[:port]`, `:*` for any port, or
    /// `null`; without a port, the scheme's default port only); a request with any other
    /// `Origin` is refused (403). Requests without `Origin` pass.
    pub allowed_origins: Vec<String>,
    /// `Host` values allowed on `/mcp` (`host` or `host:port`); empty: `localhost`,
    /// `127.0.0.1` and `::1` on any port. Protects against DNS rebinding.
    pub allowed_hosts: Vec<String>,
}

/// The REST server (`server.http`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HttpServerConfig {
    /// Address to listen on.
    pub host: String,
    /// Port to listen on (`0`: a free port, printed at start).
    pub port: u16,
    /// Prefix of every route (`""`, or a path starting with `/`); routes live under
    /// `<base_path>/v1`.
    pub base_path: String,
    /// Largest request body accepted, in bytes (larger → 413).
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub max_body_bytes: u64,
    /// Serve the OpenAPI document (`<base_path>/openapi.json`) and the interactive docs
    /// (`<base_path>/docs`) without a key; `null`: everywhere but under the `prod` profile.
    pub docs: Option<bool>,
    /// Seconds a client has to send a request's headers (also how long an idle connection
    /// stays open between requests); past it the connection is closed.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub header_timeout: f64,
    /// Seconds a client has to send a request's body once its headers are in; past it the
    /// request is answered `408` and the connection closed.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub body_timeout: f64,
    /// Most connections served at once; the next ones wait in the listen backlog until one
    /// closes.
    #[schemars(range(min = 1))]
    pub max_connections: u32,
    /// `Host` values the API answers while it is open (no `security.api_keys`): `host` (any
    /// port) or `host:port`; empty: `localhost`, `127.0.0.1` and `::1`. Protects a developer's
    /// open server against DNS rebinding; with keys, the key protects the API.
    pub allowed_hosts: Vec<String>,
    /// Browser origins allowed on the open API besides the server's own (same syntax as
    /// `server.mcp.allowed_origins`); a request with another `Origin` is refused (403).
    /// Requests without `Origin` pass. With keys, the key protects the API.
    pub allowed_origins: Vec<String>,
}

impl Default for HttpServerConfig {
    fn default() -> Self {
        HttpServerConfig {
            host: "127.0.0.1".to_owned(),
            port: 8000,
            base_path: String::new(),
            max_body_bytes: 134_217_728,
            docs: None,
            header_timeout: 10.0,
            body_timeout: 60.0,
            max_connections: 512,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
        }
    }
}

/// Telemetry settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// Logs.
    pub logging: LoggingConfig,
    /// What is captured beyond the events themselves.
    pub capture: CaptureConfig,
}

/// Capture settings (`telemetry.capture`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CaptureConfig {
    /// Journal the raw HTTP exchange of every model attempt as a `model.exchanged` event (API
    /// keys redacted, file bytes replaced by their size).
    pub raw_exchanges: bool,
    /// Bytes kept of each request and response body in `model.exchanged` (the size and SHA-256
    /// are always those of the full body).
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub raw_max_bytes: u64,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            raw_exchanges: false,
            raw_max_bytes: 262_144,
        }
    }
}

impl CaptureConfig {
    /// The body limit of raw-exchange capture, when it is on.
    pub fn raw_limit(&self) -> Option<usize> {
        self.raw_exchanges
            .then(|| usize::try_from(self.raw_max_bytes).unwrap_or(usize::MAX))
    }
}

/// Log settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingConfig {
    /// ERROR, WARNING (or WARN), INFO, DEBUG or TRACE, case-insensitive.
    #[schemars(regex(
        pattern = r"^([Ee][Rr][Rr][Oo][Rr]|[Ww][Aa][Rr][Nn]([Ii][Nn][Gg])?|[Ii][Nn][Ff][Oo]|[Dd][Ee][Bb][Uu][Gg]|[Tt][Rr][Aa][Cc][Ee])$"
    ))]
    pub level: String,
    /// Output format.
    pub format: LogFormat,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            level: "INFO".to_owned(),
            format: LogFormat::Console,
        }
    }
}

impl LoggingConfig {
    /// The parsed level; `None` when `level` is not a known name.
    pub fn level(&self) -> Option<LogLevel> {
        LogLevel::parse(&self.level)
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable.
    #[default]
    Console,
    /// One JSON object per line.
    Json,
}

/// A log level, parsed from [`LoggingConfig::level`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and above (`WARNING` or `WARN`).
    Warn,
    /// Informational and above.
    Info,
    /// Debug and above.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevel {
    /// Parses a level name, case-insensitively.
    pub fn parse(text: &str) -> Option<LogLevel> {
        match text.to_ascii_uppercase().as_str() {
            "ERROR" => Some(LogLevel::Error),
            "WARNING" | "WARN" => Some(LogLevel::Warn),
            "INFO" => Some(LogLevel::Info),
            "DEBUG" => Some(LogLevel::Debug),
            "TRACE" => Some(LogLevel::Trace),
            _ => None,
        }
    }
}
