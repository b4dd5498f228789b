//! An agent (`AgentSpec`): its main role and call settings, where it is published (`expose`) and
//! how long its approval requests wait.

use std::{collections::BTreeMap, path::PathBuf};

use loom_core::approval::OnExpiry;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::guards::{
    Budgets, ContextItem, JudgeSpec, OutputContract, PolicyRef, RoleSpec, SubAgentRef,
};
use crate::state::StateKey;

use super::{JsonObject, SandboxSpec, SkillRef, ToolRef};

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
    /// server (`loom mcp`, `/mcp`), both by default; and its own HTTP endpoints
    /// (`expose.http`), off by default.
    #[serde(default)]
    pub expose: Expose,
    /// Session state: keys set by the caller or filled from tool results, kept across the
    /// runs of a session (limits in `sessions.state`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub state: BTreeMap<String, StateKey>,
    /// A sandbox: the tools `sandbox__read`, `sandbox__write`, `sandbox__list` and
    /// `sandbox__exec` on one working folder per run or session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxSpec>,
    /// Skills (folders holding a `SKILL.md`), loaded at start; the model sees their names and
    /// descriptions and loads one on demand (`skills__load`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<SkillRef>,
}

/// An agent's `expose:` block: where it is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Expose {
    /// Listed by `GET /v1/agents` and runnable with `POST /v1/agents/{name}/runs`.
    pub rest: bool,
    /// A tool of the MCP server.
    pub mcp: bool,
    /// Its own endpoints beside `/v1` (`POST <base_path>/agents/{name}/run` and `/stream`),
    /// when `enabled`; absent: not mounted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpExpose>,
}

impl Default for Expose {
    /// Published on the REST API and the MCP server; no endpoints of its own.
    fn default() -> Self {
        Expose {
            rest: true,
            mcp: true,
            http: None,
        }
    }
}

impl Expose {
    /// The agent's own HTTP endpoints, when they are mounted (`expose.http.enabled`).
    pub fn http_endpoints(&self) -> Option<HttpExpose> {
        self.http.filter(|http| http.enabled)
    }
}

/// An agent's `expose.http:` block: its own endpoints `POST <base_path>/agents/{name}/run`
/// (JSON result) and `POST <base_path>/agents/{name}/stream` (Server-Sent Events), served by
/// `loom serve` beside `/v1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpExpose {
    /// Whether the endpoints are mounted (default `false`: the block alone opens nothing).
    #[serde(default)]
    pub enabled: bool,
    /// Who may call: `keys` (default), an API key of `security.api_keys` with the scope `run`
    /// (and `read_content` for the stream), allowed on the agent; `none`, no authenticator.
    #[serde(default)]
    pub auth: HttpAuth,
    /// Whether a request without a key is served (for the tenant `default`). Required when
    /// there is no usable authenticator (`auth: none`, or `auth: keys` without any declared
    /// key): such an agent is otherwise a configuration error.
    #[serde(default)]
    pub allow_anonymous: bool,
    /// Milliseconds between two heartbeat comments of an idle stream (default 15000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3_600_000))]
    pub heartbeat_ms: Option<u64>,
}

/// Default milliseconds between two heartbeat comments of an agent's stream.
pub const DEFAULT_HEARTBEAT_MS: u64 = 15_000;

impl HttpExpose {
    /// Milliseconds between two heartbeat comments (`heartbeat_ms`, else 15000).
    pub fn heartbeat_ms(&self) -> u64 {
        self.heartbeat_ms.unwrap_or(DEFAULT_HEARTBEAT_MS)
    }
}

/// How an agent's own endpoints authenticate their callers (`expose.http.auth`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HttpAuth {
    /// The server's API keys (`security.api_keys`), as on `/v1`.
    #[default]
    Keys,
    /// No authenticator: only usable with `allow_anonymous: true`.
    None,
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
            state: BTreeMap::new(),
            sandbox: None,
            skills: Vec::new(),
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
    /// What every orchestrator call receives besides the conversation: `session_state` (every
    /// key) or `{session_state: [keys]}`, sent as a last user message that is never journaled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<ContextItem>,
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
            context: Vec::new(),
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
