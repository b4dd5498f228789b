//! Opening one MCP connection (stdio child process, streamable HTTP, or HTTP+SSE) and what it
//! holds: its tool list (read again after the server announces a change) and its use (calls in
//! flight, last use: what the idle timeout reads).

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    process::Stdio,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use loom_core::tool::{ToolKind, ToolSpec};
use process_wrap::tokio::{CommandWrap, KillOnDrop, ProcessGroup};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use rmcp::{
    ClientHandler, Peer, RoleClient, ServiceExt,
    model::{ClientCapabilities, ClientConfig, Implementation},
    service::{NotificationContext, RunningService},
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
    sse::SseTransport,
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

/// The step of connecting under way, named by a connection timeout.
#[derive(Debug)]
pub(crate) struct Stage(Mutex<&'static str>);

impl Stage {
    fn new(first: &'static str) -> Stage {
        Stage(Mutex::new(first))
    }

    /// Records the step now under way.
    pub(crate) fn set(&self, step: &'static str) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = step;
    }

    fn get(&self) -> &'static str {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The tool list a connection last read, and which announced change it reflects.
#[derive(Debug)]
struct Listed {
    /// The value of [`Connection::changes`] read before listing.
    generation: u64,
    tools: Arc<[RemoteTool]>,
}

/// How a connection is used: calls in flight and when the last one ended.
#[derive(Debug)]
struct Usage {
    in_flight: usize,
    last_used: Instant,
}

/// The client side of a session: rmcp's handler, counting `notifications/tools/list_changed`.
#[derive(Debug, Clone)]
struct Client {
    server: String,
    changes: Arc<AtomicU64>,
}

impl ClientHandler for Client {
    fn get_info(&self) -> ClientConfig {
        client_config()
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changes.fetch_add(1, Ordering::AcqRel);
        tracing::info!(
            server = %self.server,
            "the MCP server changed its tool list: read again at the next use, offered from the next run"
        );
    }
}

/// A live MCP session.
#[derive(Debug)]
pub(crate) struct Connection {
    /// Unique within the process (logs, and to know which connection a failure was about).
    pub(crate) id: u64,
    pub(crate) peer: Peer<RoleClient>,
    listed: Mutex<Listed>,
    /// Tool list changes the server announced.
    changes: Arc<AtomicU64>,
    /// Held while the tool list is read again, so that one reading serves everyone waiting.
    relisting: tokio::sync::Mutex<()>,
    usage: Mutex<Usage>,
    service: tokio::sync::Mutex<Option<RunningService<RoleClient, Client>>>,
    dead: AtomicBool,
    /// The stdio child's process group (its pid), stopped whole when the connection goes.
    process_group: Option<u32>,
}

/// A use of a connection (a call, or a run listing its tools): while one exists the connection
/// is never closed for being idle; dropping it marks the connection used now.
#[derive(Debug)]
pub(crate) struct InUse(Arc<Connection>);

impl std::ops::Deref for InUse {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        &self.0
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        let mut usage = self.0.usage();
        usage.in_flight = usage.in_flight.saturating_sub(1);
        usage.last_used = Instant::now();
    }
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
    fn usage(&self) -> MutexGuard<'_, Usage> {
        self.usage.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a use. The caller holds the lock of the slot the connection sits in, so that an
    /// idle check (under the same lock) never closes a connection someone just took.
    pub(crate) fn begin_use(self: &Arc<Self>) -> InUse {
        self.usage().in_flight += 1;
        InUse(Arc::clone(self))
    }

    /// How long it has been unused at `now`; `None` while a use is in flight.
    pub(crate) fn idle_for(&self, now: Instant) -> Option<Duration> {
        let usage = self.usage();
        (usage.in_flight == 0).then(|| now.saturating_duration_since(usage.last_used))
    }

    /// The server's tools, read again first when it announced a change since the last reading.
    pub(crate) async fn tools(
        &self,
        options: &McpServerOptions,
    ) -> Result<Arc<[RemoteTool]>, McpError> {
        if let Some(tools) = self.fresh_tools() {
            return Ok(tools);
        }
        let _relisting = self.relisting.lock().await;
        if let Some(tools) = self.fresh_tools() {
            return Ok(tools);
        }
        let generation = self.changes.load(Ordering::Acquire);
        let listed = self
            .peer
            .list_all_tools()
            .await
            .map_err(|error| McpError::ListTools {
                server: options.name.clone(),
                message: error.to_string(),
            })?;
        let tools: Arc<[RemoteTool]> = remote_tools(options, listed).into();
        let mut last = self.listed.lock().unwrap_or_else(PoisonError::into_inner);
        let had = |tools: &[RemoteTool], name: &str| tools.iter().any(|t| t.remote_name == name);
        let added: Vec<&str> = tools
            .iter()
            .filter(|t| !had(&last.tools, &t.remote_name))
            .map(|t| t.remote_name.as_str())
            .collect();
        let removed: Vec<&str> = last
            .tools
            .iter()
            .filter(|t| !had(&tools, &t.remote_name))
            .map(|t| t.remote_name.as_str())
            .collect();
        tracing::info!(server = %options.name, connection = self.id, ?added, ?removed, tools = tools.len(), "MCP tool list read again");
        *last = Listed {
            generation,
            tools: Arc::clone(&tools),
        };
        Ok(tools)
    }

    /// The last list read, unless the server announced a change since.
    fn fresh_tools(&self) -> Option<Arc<[RemoteTool]>> {
        let listed = self.listed.lock().unwrap_or_else(PoisonError::into_inner);
        (listed.generation == self.changes.load(Ordering::Acquire))
            .then(|| Arc::clone(&listed.tools))
    }

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
    let stage = Stage::new(STARTING);
    match tokio::time::timeout(
        options.connect_timeout,
        connect_unbounded(options, id, &stage),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => Err(McpError::ConnectTimeout {
            server: options.name.clone(),
            after: options.connect_timeout,
            during: stage.get(),
        }),
    }
}

/// The steps of connecting, named by a connection timeout.
const STARTING: &str = "starting the server";
const HANDSHAKE: &str = "the MCP handshake";
const LISTING: &str = "listing the tools";

async fn connect_unbounded(
    options: &McpServerOptions,
    id: u64,
    stage: &Stage,
) -> Result<Connection, McpError> {
    let server = &options.name;
    let changes = Arc::new(AtomicU64::new(0));
    let client = Client {
        server: server.clone(),
        changes: Arc::clone(&changes),
    };
    let handshake_failed = |error: rmcp::service::ClientInitializeError| McpError::Handshake {
        server: server.clone(),
        message: error.to_string(),
    };
    let mut process_group = None;
    let service = match &options.transport {
        Transport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let (transport, pgid) = spawn(server, id, command, args, env, cwd.as_deref())?;
            process_group = pgid;
            stage.set(HANDSHAKE);
            client.serve(transport).await.map_err(handshake_failed)?
        }
        Transport::Http { url, headers } => {
            let (http, headers) = http_client(options, headers)?;
            let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .custom_headers(headers.into_iter().collect::<HashMap<_, _>>());
            // The call's trace context also goes as the `traceparent` header (`traced.rs`).
            let transport = StreamableHttpClientTransport::with_client(
                crate::traced::TracedClient(http),
                config,
            );
            stage.set(HANDSHAKE);
            client.serve(transport).await.map_err(handshake_failed)?
        }
        Transport::Sse { url, headers } => {
            let (http, headers) = http_client(options, headers)?;
            let headers: HeaderMap = headers.into_iter().collect();
            let transport = SseTransport::open(server, http, url, headers, stage).await?;
            stage.set(HANDSHAKE);
            client.serve(transport).await.map_err(handshake_failed)?
        }
    };
    stage.set(LISTING);
    let generation = changes.load(Ordering::Acquire);
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
        listed: Mutex::new(Listed {
            generation,
            tools: tools.into(),
        }),
        changes,
        relisting: tokio::sync::Mutex::new(()),
        usage: Mutex::new(Usage {
            in_flight: 0,
            last_used: Instant::now(),
        }),
        service: tokio::sync::Mutex::new(Some(service)),
        dead: AtomicBool::new(false),
        process_group,
    })
}

/// Starts a stdio server in its own process group (so that stopping it stops whatever it
/// started), its stderr copied to the logs; the transport and the group's id.
fn spawn(
    server: &str,
    id: u64,
    command: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&Path>,
) -> Result<(TokioChildProcess, Option<u32>), McpError> {
    let mut child = tokio::process::Command::new(command);
    child.args(args).envs(env).kill_on_drop(true);
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
            server: server.to_owned(),
            command: command.to_owned(),
            source,
        })?;
    let process_group = transport.id();
    tracing::debug!(server = %server, connection = id, pid = ?process_group, "MCP server process started");
    if let Some(stderr) = stderr {
        tokio::spawn(pipe_stderr(server.to_owned(), stderr));
    }
    Ok((transport, process_group))
}

/// The HTTP client of an HTTP or SSE server (no overall timeout: a stream lives long) and its
/// headers, marked sensitive.
fn http_client(
    options: &McpServerOptions,
    headers: &[(String, String)],
) -> Result<(reqwest::Client, Vec<(HeaderName, HeaderValue)>), McpError> {
    let server = &options.name;
    loom_tls::install_crypto_provider();
    let mut header_list = Vec::with_capacity(headers.len());
    for (name, value) in headers {
        let invalid = || McpError::InvalidHeader {
            server: server.clone(),
            header: name.clone(),
        };
        let header_name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid())?;
        let mut header_value = HeaderValue::from_str(value).map_err(|_| invalid())?;
        header_value.set_sensitive(true);
        header_list.push((header_name, header_value));
    }
    let client = reqwest::Client::builder()
        .connect_timeout(options.connect_timeout)
        .build()
        .map_err(|error| McpError::HttpClient {
            server: server.clone(),
            message: error.to_string(),
        })?;
    Ok((client, header_list))
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
