//! `server`: the REST server (`server.http`) and the MCP server (`server.mcp`).

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
    /// Serve the read-only trace viewer page at `<base_path>/ui` (its data comes from the
    /// `/v1` routes, with the same keys and scopes); `null`: everywhere but under the `prod`
    /// profile.
    pub ui: Option<bool>,
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
            ui: None,
            header_timeout: 10.0,
            body_timeout: 60.0,
            max_connections: 512,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
        }
    }
}
