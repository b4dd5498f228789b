//! Opening one MCP connection (stdio child process or streamable HTTP) and what it holds.

use std::{
    collections::HashMap,
    process::Stdio,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use loom_core::tool::{ToolKind, ToolSpec};
use process_wrap::tokio::{CommandWrap, KillOnDrop, ProcessGroup};
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::{
    Peer, RoleClient, ServiceExt,
    model::{ClientCapabilities, ClientConfig, Implementation},
    service::RunningService,
    transport::{
        StreamableHttpClientTransport, TokioChildProcess,
        streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use crate::{
    declarations::{AnnotationHints, apply_overrides, declarations_from_annotations},
    error::McpError,
    options::{McpServerOptions, Transport, valid_tool_name},
};

/// Longest stderr line logged at once (longer lines are split).
const MAX_STDERR_LINE: u64 = 8 * 1024;

/// Separator between the server (or alias) and the tool in model-visible names.
pub(crate) const NAME_SEPARATOR: &str = "__";

/// One tool of a connection, ready to be offered.
#[derive(Debug, Clone)]
pub(crate) struct RemoteTool {
    /// The server's own name for it.
    pub(crate) remote_name: String,
    /// The spec offered to the model (prefixed name, declarations).
    pub(crate) spec: ToolSpec,
}

/// A live MCP session.
#[derive(Debug)]
pub(crate) struct Connection {
    /// Unique within the process (logs, and to know which connection a failure was about).
    pub(crate) id: u64,
    pub(crate) peer: Peer<RoleClient>,
    pub(crate) tools: Vec<RemoteTool>,
    service: tokio::sync::Mutex<Option<RunningService<RoleClient, ClientConfig>>>,
    dead: AtomicBool,
    /// The stdio child's process group (its pid), stopped whole when the connection goes.
    process_group: Option<u32>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Dropped without `close` (crash, shutdown of the runtime): rmcp kills the child; kill
        // whatever it started too.
        if self.service.get_mut().is_some() {
            kill_process_group(self.process_group);
        }
    }
}

/// Sends SIGKILL to the group led by the child, if any member is left.
fn kill_process_group(process_group: Option<u32>) {
    #[cfg(unix)]
    if let Some(pgid) = process_group.and_then(|pgid| i32::try_from(pgid).ok())
        && pgid > 1
    {
        use nix::sys::signal::{Signal, killpg};
        match killpg(nix::unistd::Pid::from_raw(pgid), Signal::SIGKILL) {
            Ok(()) => tracing::debug!(
                pgid,
                "killed what was left of the MCP server's process group"
            ),
            Err(nix::errno::Errno::ESRCH) => {}
            Err(error) => {
                tracing::debug!(pgid, %error, "could not signal the MCP server's process group")
            }
        }
    }
    #[cfg(not(unix))]
    let _ = process_group;
}

impl Connection {
    /// Whether calls can still go through it.
    pub(crate) fn is_alive(&self) -> bool {
        !self.dead.load(Ordering::Acquire) && !self.peer.is_transport_closed()
    }

    /// Marks it unusable (the next user reconnects).
    pub(crate) fn mark_dead(&self) {
        self.dead.store(true, Ordering::Release);
    }

    /// Closes the session: for stdio, closes the child's stdin, waits, then signals its
    /// process group. Bounded by `timeout`; dropping the connection also kills the child.
    pub(crate) async fn close(&self, timeout: Duration) {
        self.mark_dead();
        let service = self.service.lock().await.take();
        if let Some(mut service) = service {
            match service.close_with_timeout(timeout).await {
                Ok(Some(_)) => tracing::debug!(connection = self.id, "MCP connection closed"),
                Ok(None) => tracing::warn!(
                    connection = self.id,
                    "MCP connection did not close within {timeout:?}; dropped"
                ),
                Err(error) => {
                    tracing::warn!(connection = self.id, %error, "MCP connection close failed")
                }
            }
            // The server exited (or was killed); stop anything it left in its group.
            kill_process_group(self.process_group);
        }
    }
}

/// Opens a connection, does the MCP handshake and lists the tools, within `connect_timeout`.
pub(crate) async fn connect(options: &McpServerOptions, id: u64) -> Result<Connection, McpError> {
    match tokio::time::timeout(options.connect_timeout, connect_unbounded(options, id)).await {
        Ok(result) => result,
        Err(_) => Err(McpError::ConnectTimeout {
            server: options.name.clone(),
            after: options.connect_timeout,
        }),
    }
}

async fn connect_unbounded(options: &McpServerOptions, id: u64) -> Result<Connection, McpError> {
    let server = &options.name;
    let mut process_group = None;
    let service = match &options.transport {
        Transport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut child = tokio::process::Command::new(command);
            child.args(args).envs(env).kill_on_drop(true);
            // Its own process group, so that stopping it stops whatever it started.
            child.process_group(0);
            if let Some(cwd) = cwd {
                child.current_dir(cwd);
            }
            let mut wrapped = CommandWrap::from(child);
            wrapped.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
            let (transport, stderr) = TokioChildProcess::builder(wrapped)
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|source| McpError::Spawn {
                    server: server.clone(),
                    command: command.clone(),
                    source,
                })?;
            process_group = transport.id();
            tracing::debug!(server = %server, connection = id, pid = ?process_group, "MCP server process started");
            if let Some(stderr) = stderr {
                tokio::spawn(pipe_stderr(server.clone(), stderr));
            }
            client_config()
                .serve(transport)
                .await
                .map_err(|error| McpError::Handshake {
                    server: server.clone(),
                    message: error.to_string(),
                })?
        }
        Transport::Http { url, headers } => {
            loom_tls::install_crypto_provider();
            let mut header_map = HashMap::with_capacity(headers.len());
            for (name, value) in headers {
                let invalid = || McpError::InvalidHeader {
                    server: server.clone(),
                    header: name.clone(),
                };
                let header_name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid())?;
                let mut header_value = HeaderValue::from_str(value).map_err(|_| invalid())?;
                header_value.set_sensitive(true);
                header_map.insert(header_name, header_value);
            }
            let client = reqwest::Client::builder()
                .connect_timeout(options.connect_timeout)
                .build()
                .map_err(|error| McpError::HttpClient {
                    server: server.clone(),
                    message: error.to_string(),
                })?;
            let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .custom_headers(header_map);
            // The call's trace context also goes as the `traceparent` header (`traced.rs`).
            let transport = StreamableHttpClientTransport::with_client(
                crate::traced::TracedClient(client),
                config,
            );
            client_config()
                .serve(transport)
                .await
                .map_err(|error| McpError::Handshake {
                    server: server.clone(),
                    message: error.to_string(),
                })?
        }
    };
    let listed = service
        .peer()
        .list_all_tools()
        .await
        .map_err(|error| McpError::ListTools {
            server: server.clone(),
            message: error.to_string(),
        })?;
    let tools = remote_tools(options, listed);
    tracing::info!(server = %server, connection = id, tools = tools.len(), "MCP server connected");
    Ok(Connection {
        id,
        peer: service.peer().clone(),
        tools,
        service: tokio::sync::Mutex::new(Some(service)),
        dead: AtomicBool::new(false),
        process_group,
    })
}

fn client_config() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("loom", env!("CARGO_PKG_VERSION")),
    )
}

/// The server's tools as Loom specs: prefixed names (invalid ones dropped with a warning),
/// declarations from annotations then the server-level overrides.
fn remote_tools(options: &McpServerOptions, listed: Vec<rmcp::model::Tool>) -> Vec<RemoteTool> {
    let server = &options.name;
    let mut tools = Vec::with_capacity(listed.len());
    for tool in listed {
        let remote_name = tool.name.to_string();
        let name = format!("{server}{NAME_SEPARATOR}{remote_name}");
        if !valid_tool_name(&name) {
            tracing::warn!(
                server = %server,
                tool = %remote_name,
                "MCP tool dropped: '{name}' does not match ^[A-Za-z0-9_-]{{1,64}}$"
            );
            continue;
        }
        let mut declarations =
            declarations_from_annotations(tool.annotations.as_ref().map(AnnotationHints::from));
        let overrides = options.overrides.get(&remote_name);
        if let Some(overrides) = overrides {
            apply_overrides(&mut declarations, overrides);
        }
        let description = overrides
            .and_then(|o| o.description.clone())
            .or_else(|| tool.description.as_deref().map(str::to_owned))
            .or_else(|| tool.title.clone())
            .unwrap_or_default();
        tools.push(RemoteTool {
            remote_name,
            spec: ToolSpec {
                name,
                description,
                input_schema: Value::Object(tool.input_schema.as_ref().clone()),
                kind: ToolKind::Mcp,
                declarations,
            },
        });
    }
    for overridden in options.overrides.keys() {
        if !tools.iter().any(|tool| &tool.remote_name == overridden) {
            tracing::warn!(
                server = %server,
                tool = %overridden,
                "mcp_servers[].tools names a tool the server does not offer"
            );
        }
    }
    tools
}

/// Copies the child's stderr to the logs, line by line, never into the protocol stream.
async fn pipe_stderr(server: String, stderr: tokio::process::ChildStderr) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader)
            .take(MAX_STDERR_LINE)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) => break,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end();
                if !text.is_empty() {
                    tracing::info!(target: "loom_mcp::stderr", server = %server, "{text}");
                }
            }
            Err(error) => {
                tracing::debug!(server = %server, %error, "reading the MCP server's stderr failed");
                break;
            }
        }
    }
}
