//! The settings of one MCP server, as the facade builds them from `mcp_servers[]`.

use std::{collections::BTreeMap, fmt, path::PathBuf, time::Duration};

use loom_core::tool::SideEffects;

use crate::error::McpError;

/// Longest server name the reference accepts.
pub const MAX_SERVER_NAME_LEN: usize = 40;

/// How Loom reaches an MCP server.
#[derive(Clone, PartialEq, Eq)]
pub enum Transport {
    /// A child process speaking MCP on its stdin/stdout; its stderr goes to Loom's logs.
    Stdio {
        /// Program to run.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Variables added to the inherited environment.
        env: BTreeMap<String, String>,
        /// Working directory (the facade defaults it to the config file's directory).
        cwd: Option<PathBuf>,
    },
    /// A streamable-HTTP endpoint.
    Http {
        /// The endpoint URL (`http://…/mcp`).
        url: String,
        /// Headers sent with every request; the values were read from the environment by the
        /// caller and are never logged.
        headers: Vec<(String, String)>,
    },
    /// The older HTTP+SSE transport (protocol 2024-11-05): an SSE stream opened with a GET,
    /// whose `endpoint` event names where to POST messages (on the stream's origin only).
    Sse {
        /// The SSE endpoint URL (`http://…/sse`).
        url: String,
        /// Headers sent with the GET and every POST; the values were read from the
        /// environment by the caller and are never logged.
        headers: Vec<(String, String)>,
    },
}

impl Transport {
    /// The URL of an HTTP or SSE transport.
    fn url(&self) -> Option<&str> {
        match self {
            Transport::Stdio { .. } => None,
            Transport::Http { url, .. } | Transport::Sse { url, .. } => Some(url),
        }
    }
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::Stdio {
                command,
                args,
                env,
                cwd,
            } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                // Environment values may be secrets: names only.
                .field("env", &env.keys().collect::<Vec<_>>())
                .field("cwd", cwd)
                .finish(),
            Transport::Http { url, headers } | Transport::Sse { url, headers } => f
                .debug_struct(if matches!(self, Transport::Http { .. }) {
                    "Http"
                } else {
                    "Sse"
                })
                .field("url", url)
                // Header values are secrets (tokens): names only.
                .field(
                    "headers",
                    &headers.iter().map(|(name, _)| name).collect::<Vec<_>>(),
                )
                .finish(),
        }
    }
}

/// How long a connection lives and who shares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    /// One connection per process, reused by every run.
    #[default]
    Shared,
    /// One connection per tenant.
    Tenant,
    /// A connection opened when a run opens the source and closed when it releases it.
    Run,
}

/// The circuit breaker guarding one server (`mcp:<name>`): the core's settings, where a failure
/// is a failed connection or a connection lost mid-call.
pub use loom_core::circuit::CircuitSettings;

/// Server-level overrides of one tool (`mcp_servers[].tools.<tool>`), applied on top of the
/// defaults drawn from its MCP annotations.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolOverrides {
    /// Replaces the server's description.
    pub description: Option<String>,
    /// Replaces the side effects drawn from the annotations.
    pub side_effects: Option<SideEffects>,
    /// Replaces the idempotency drawn from the annotations.
    pub idempotent: Option<bool>,
    /// Per-call timeout.
    pub timeout: Option<Duration>,
    /// Result size (characters) above which a result is moved out of the context.
    pub offload_over: Option<u64>,
}

/// Everything needed to use one MCP server.
#[derive(Debug, Clone, PartialEq)]
pub struct McpServerOptions {
    /// Name, used as the tools' prefix (`<name>__<tool>`): `^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$`,
    /// at most 40 characters.
    pub name: String,
    /// How to reach it.
    pub transport: Transport,
    /// The connection's life.
    pub scope: Scope,
    /// Limit on connecting (spawn or HTTP, handshake and tool listing together).
    pub connect_timeout: Duration,
    /// Protocol-level limit on one call (the engine applies the tool timeout anyway).
    pub call_timeout: Option<Duration>,
    /// A [`Scope::Shared`] or [`Scope::Tenant`] connection unused this long is closed (the
    /// stdio child ends, the HTTP session is deleted, the SSE stream is closed) and opened
    /// again, with its tools listed again, at its next use; never while a call is in flight.
    /// `None` keeps it open. A run's connection closes with its run.
    pub idle_timeout: Option<Duration>,
    /// Circuit breaker; `None` disables it.
    pub circuit: Option<CircuitSettings>,
    /// Per-tool overrides, keyed by the server's own tool name.
    pub overrides: BTreeMap<String, ToolOverrides>,
}

impl McpServerOptions {
    /// Options with the reference defaults: shared scope, 10 s to connect, no call timeout,
    /// closed after 300 s unused, breaker `{failures: 5, cooldown: 60 s}`, no overrides.
    pub fn new(name: impl Into<String>, transport: Transport) -> McpServerOptions {
        McpServerOptions {
            name: name.into(),
            transport,
            scope: Scope::Shared,
            connect_timeout: Duration::from_secs(10),
            call_timeout: None,
            idle_timeout: Some(Duration::from_secs(300)),
            circuit: Some(CircuitSettings::default()),
            overrides: BTreeMap::new(),
        }
    }

    /// Checks the name (and, for HTTP and SSE, that the URL is absolute http/https).
    pub fn validate(&self) -> Result<(), McpError> {
        if !valid_server_name(&self.name) {
            return Err(McpError::InvalidName {
                name: self.name.clone(),
            });
        }
        if let Some(url) = self.transport.url()
            && !is_http_url(url)
        {
            return Err(McpError::InvalidUrl {
                server: self.name.clone(),
                url: url.to_owned(),
            });
        }
        Ok(())
    }
}

/// Whether `url` reads (by the `url` crate, through reqwest) as an absolute `http` or `https`
/// URL with a host.
fn is_http_url(url: &str) -> bool {
    reqwest::Url::parse(url).is_ok_and(|url| {
        matches!(url.scheme(), "http" | "https") && url.host_str().is_some_and(|h| !h.is_empty())
    })
}

/// Whether `name` is a valid server name: `^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$` (hence no `__`),
/// at most [`MAX_SERVER_NAME_LEN`] characters.
pub fn valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SERVER_NAME_LEN
        && name.split('_').all(|part| {
            !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// Whether `name` can be offered to a model: `^[A-Za-z0-9_-]{1,64}$`.
pub fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names() {
        for good in ["files", "my-server", "a_b", "A1_b-2_c"] {
            assert!(valid_server_name(good), "{good}");
        }
        for bad in ["", "a__b", "_a", "a_", "a b", "a.b", &"x".repeat(41)] {
            assert!(!valid_server_name(bad), "{bad}");
        }
    }

    #[test]
    fn tool_names() {
        assert!(valid_tool_name("files__read-file"));
        assert!(!valid_tool_name("files__read.file"));
        assert!(!valid_tool_name(&"x".repeat(65)));
    }

    /// An HTTP server's URL is read by the url crate: a prefix is not enough.
    #[test]
    fn an_http_url_is_absolute_with_a_host() {
        assert!(is_http_url("https://crm.example/mcp"));
        assert!(is_http_url("http://127.0.0.1:8931/mcp"));
        for bad in [
            "ftp://crm.example",
            "http://",
            "https:// crm.example",
            "crm.example/mcp",
        ] {
            assert!(!is_http_url(bad), "{bad}");
        }
    }

    #[test]
    fn debug_hides_secrets() {
        let transport = Transport::Http {
            url: "https://example.invalid/mcp".into(),
            headers: vec![("Authorization".into(), "Bearer s3cret".into())],
        };
        let shown = format!("{transport:?}");
        assert!(shown.contains("Authorization"));
        assert!(!shown.contains("s3cret"));
        let transport = Transport::Sse {
            url: "https://example.invalid/sse".into(),
            headers: vec![("Authorization".into(), "Bearer s3cret".into())],
        };
        let shown = format!("{transport:?}");
        assert!(shown.starts_with("Sse"), "{shown}");
        assert!(shown.contains("Authorization"));
        assert!(!shown.contains("s3cret"));
    }
}
