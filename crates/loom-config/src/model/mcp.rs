//! `mcp_servers`: an MCP server (`McpServerSpec`), its transport and connection scope, and the
//! circuit breaker shared with models.

use std::{collections::BTreeMap, path::PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ToolOverrides;

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
    /// http: the streamable HTTP endpoint; sse: the SSE endpoint of the older HTTP+SSE
    /// transport.
    #[serde(default)]
    pub url: Option<String>,
    /// http, sse: headers whose values come from environment variables
    /// (`Authorization: CRM_TOKEN`); never written to the journal.
    #[serde(default)]
    pub headers_env: BTreeMap<String, String>,
    /// Life of a connection: one per process, per tenant, or per run.
    #[serde(default)]
    pub scope: McpScope,
    /// Seconds to connect and list tools.
    #[serde(default = "default_connect_timeout")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub connect_timeout: f64,
    /// Seconds a `shared` or `tenant` connection may stay unused before it is closed (reopened
    /// at the next use); default 300. Not for `scope: run` (a run's connection closes with it).
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0, "default" = 300.0))]
    pub idle_timeout: Option<f64>,
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

pub(super) fn default_breaker() -> Option<CircuitBreaker> {
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
    /// The older HTTP+SSE transport (protocol 2024-11-05): a GET opens an SSE stream whose
    /// `endpoint` event names where to POST messages.
    Sse,
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
