//! [`McpServer`]: one configured MCP server as a [`ToolSource`], with its connections (per
//! scope), reconnection delays and circuit breaker.

use std::{
    collections::HashMap,
    fmt,
    sync::{
        Arc, Mutex, MutexGuard, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use loom_core::{
    BoxFuture,
    ports::{SourceContext, SourceError, ToolSource},
    tool::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec},
};
use rmcp::{
    ServiceError,
    model::{CallToolRequestParams, RequestMetaObject},
};
use serde_json::Value;

use crate::{
    breaker::{BACKOFF_CAP, Breaker, backoff_delay},
    connection::{Connection, InUse, connect},
    convert::to_output,
    error::McpError,
    options::{McpServerOptions, Scope},
};

/// The `_meta` key carrying the call's idempotency key.
pub const IDEMPOTENCY_META_KEY: &str = "loom-ia/idempotency_key";

/// The `_meta` key carrying the W3C trace context of the call's span, when traces are exported.
pub(crate) const TRACEPARENT_META_KEY: &str = "traceparent";

/// How long closing one connection may take (stdio: stdin closed, then SIGTERM, then SIGKILL).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(8);

/// Which connection a run uses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum SlotKey {
    Shared,
    Tenant(String),
    Run(String),
}

impl SlotKey {
    fn for_context(scope: Scope, tenant_id: &str, run_id: &str) -> SlotKey {
        match scope {
            Scope::Shared => SlotKey::Shared,
            Scope::Tenant => SlotKey::Tenant(tenant_id.to_owned()),
            Scope::Run => SlotKey::Run(run_id.to_owned()),
        }
    }
}

#[derive(Debug, Default)]
struct SlotState {
    connection: Option<Arc<Connection>>,
    /// Consecutive failures of this slot (reconnection delay).
    failures: u32,
    last_failure: Option<Instant>,
    /// Run scope: the run released it; nothing may reconnect.
    released: bool,
}

/// The connection of one scope key.
#[derive(Debug, Default)]
struct Slot {
    /// Held while connecting, so concurrent users wait for one connection instead of opening
    /// several.
    connecting: tokio::sync::Mutex<()>,
    state: Mutex<SlotState>,
}

impl Slot {
    fn state(&self) -> MutexGuard<'_, SlotState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The live connection, its use begun under the slot's lock.
    fn live_connection(&self) -> Option<InUse> {
        self.state()
            .connection
            .as_ref()
            .filter(|connection| connection.is_alive())
            .map(Connection::begin_use)
    }
}

/// Closes the connection `id` of `slot` once it has been unused for `idle` (never while a use is
/// in flight); it reopens at the next use. Ends when the connection leaves the slot otherwise
/// (lost, released, shut down) or the slot goes.
async fn close_when_idle(slot: Weak<Slot>, id: u64, idle: Duration, server: String) {
    let mut wait = idle;
    loop {
        tokio::time::sleep(wait).await;
        let Some(slot) = slot.upgrade() else {
            return;
        };
        let idle_connection = {
            let mut state = slot.state();
            let Some(connection) = state.connection.as_ref().filter(|c| c.id == id) else {
                return;
            };
            match connection.idle_for(Instant::now()) {
                Some(unused) if unused >= idle => state.connection.take(),
                Some(unused) => {
                    wait = idle - unused;
                    None
                }
                // In use: looked at again once it could have been idle long enough.
                None => {
                    wait = idle;
                    None
                }
            }
        };
        if let Some(connection) = idle_connection {
            tracing::info!(server = %server, connection = id, "closing the MCP connection unused for {idle:?}; it reopens at the next use");
            connection.close(CLOSE_TIMEOUT).await;
            return;
        }
    }
}

struct Inner {
    options: McpServerOptions,
    slots: Mutex<HashMap<SlotKey, Arc<Slot>>>,
    breaker: Option<Mutex<Breaker>>,
    next_id: AtomicU64,
    shut_down: AtomicBool,
}

/// One MCP server used as a tool source.
///
/// Cheap to clone and share: clones use the same connections. Connections follow the
/// [`Scope`]: one per process ([`Scope::Shared`]), one per tenant ([`Scope::Tenant`]), or one
/// per run, opened by [`ToolSource::open`] and closed by [`ToolSource::release`]
/// ([`Scope::Run`]). A connection is reused by every call, never reopened per call; a
/// connection that drops is replaced on next use after a growing delay (0.5 s, 1 s, 2 s …
/// 30 s), under the server's circuit breaker. A shared or tenant connection unused for
/// [`McpServerOptions::idle_timeout`] is closed, and opened again at its next use without
/// counting as a failure.
///
/// Each opening gives the server's latest tool list: after `notifications/tools/list_changed`
/// the list is read again at the next use. The tools a run was given keep working while the
/// server still offers them; a call to one it withdrew is refused with [`McpError::Withdrawn`].
#[derive(Clone)]
pub struct McpServer {
    inner: Arc<Inner>,
}

impl fmt::Debug for McpServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.inner.options.name)
            .field("scope", &self.inner.options.scope)
            .finish_non_exhaustive()
    }
}

impl McpServer {
    /// A server from its options; nothing is started until the first [`ToolSource::open`].
    pub fn new(options: McpServerOptions) -> McpServer {
        let breaker = options.circuit.map(|settings| {
            Mutex::new(Breaker::new(
                format!("mcp:{}", options.name),
                settings,
                options.connect_timeout + BACKOFF_CAP,
            ))
        });
        McpServer {
            inner: Arc::new(Inner {
                options,
                slots: Mutex::new(HashMap::new()),
                breaker,
                next_id: AtomicU64::new(1),
                shut_down: AtomicBool::new(false),
            }),
        }
    }

    /// The options it was built with.
    pub fn options(&self) -> &McpServerOptions {
        &self.inner.options
    }

    /// Connects (or reuses the connection for `ctx`) and returns the tools with their effective
    /// declarations: what `loom validate` prints. A run-scoped connection opened for this is
    /// closed before returning.
    pub async fn list_tools(&self, ctx: &SourceContext) -> Result<Vec<Arc<dyn Tool>>, SourceError> {
        let tools = self.inner.open(ctx).await?;
        if self.inner.options.scope == Scope::Run {
            self.inner.release(ctx).await;
        }
        Ok(tools)
    }

    /// Closes every connection (stdio children are stopped with their process group) and
    /// refuses any further use. Bounded in time.
    pub async fn shutdown(&self) {
        self.inner.shut_down.store(true, Ordering::Release);
        let slots: Vec<Arc<Slot>> = self.inner.slots().drain().map(|(_, slot)| slot).collect();
        let closing = slots.into_iter().filter_map(|slot| {
            let mut state = slot.state();
            state.released = true;
            state.connection.take()
        });
        futures_util::future::join_all(
            closing.map(|connection| async move { connection.close(CLOSE_TIMEOUT).await }),
        )
        .await;
        tracing::debug!(server = %self.inner.options.name, "MCP server shut down");
    }
}

impl ToolSource for McpServer {
    fn name(&self) -> &str {
        &self.inner.options.name
    }

    fn open<'a>(
        &'a self,
        ctx: &'a SourceContext,
    ) -> BoxFuture<'a, Result<Vec<Arc<dyn Tool>>, SourceError>> {
        Box::pin(self.inner.open(ctx))
    }

    fn release<'a>(&'a self, ctx: &'a SourceContext) -> BoxFuture<'a, ()> {
        Box::pin(self.inner.release(ctx))
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(McpServer::shutdown(self))
    }
}

impl Inner {
    fn name(&self) -> &str {
        &self.options.name
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<SlotKey, Arc<Slot>>> {
        self.slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn breaker(&self) -> Option<MutexGuard<'_, Breaker>> {
        self.breaker
            .as_ref()
            .map(|b| b.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    fn source_error(&self, error: &McpError) -> SourceError {
        SourceError {
            message: error.to_string(),
            circuit: self.breaker().and_then(|mut breaker| breaker.take_notice()),
        }
    }

    async fn open(
        self: &Arc<Self>,
        ctx: &SourceContext,
    ) -> Result<Vec<Arc<dyn Tool>>, SourceError> {
        if let Err(error) = self.options.validate() {
            return Err(self.source_error(&error));
        }
        let key = SlotKey::for_context(self.options.scope, &ctx.tenant_id, &ctx.run_id);
        let listed = match self.connection(&key, true).await {
            Ok(connection) => match connection.tools(&self.options).await {
                Ok(tools) => Ok(tools),
                Err(error) => {
                    self.connection_lost(&key, &connection, &error);
                    Err(error)
                }
            },
            Err(error) => Err(error),
        };
        let tools = match listed {
            Ok(tools) => tools,
            Err(error) => {
                if let SlotKey::Run(_) = key {
                    // The run will not use it: forget the slot rather than wait for a release.
                    let mut slots = self.slots();
                    if slots
                        .get(&key)
                        .is_some_and(|slot| slot.state().connection.is_none())
                    {
                        slots.remove(&key);
                    }
                }
                return Err(self.source_error(&error));
            }
        };
        Ok(tools
            .iter()
            .map(|tool| {
                Arc::new(McpTool {
                    spec: tool.spec.clone(),
                    remote_name: tool.remote_name.clone(),
                    server: Arc::clone(self),
                    key: key.clone(),
                }) as Arc<dyn Tool>
            })
            .collect())
    }

    async fn release(&self, ctx: &SourceContext) {
        if self.options.scope != Scope::Run {
            return;
        }
        let key = SlotKey::Run(ctx.run_id.clone());
        let Some(slot) = self.slots().remove(&key) else {
            return;
        };
        let connection = {
            let mut state = slot.state();
            state.released = true;
            state.connection.take()
        };
        if let Some(connection) = connection {
            tracing::debug!(server = %self.name(), run_id = %ctx.run_id, connection = connection.id, "closing the run's MCP connection");
            connection.close(CLOSE_TIMEOUT).await;
        }
    }

    /// The live connection for `key`, connecting when there is none (or it died or was closed
    /// for being idle), its use begun.
    async fn connection(&self, key: &SlotKey, create: bool) -> Result<InUse, McpError> {
        let server = self.name().to_owned();
        if self.shut_down.load(Ordering::Acquire) {
            return Err(McpError::ShutDown { server });
        }
        let slot = {
            let mut slots = self.slots();
            match slots.get(key) {
                Some(slot) => Arc::clone(slot),
                None if create => Arc::clone(slots.entry(key.clone()).or_default()),
                None => return Err(McpError::Released { server }),
            }
        };
        if let Some(connection) = slot.live_connection() {
            return Ok(connection);
        }
        let _connecting = slot.connecting.lock().await;
        // Someone else may have connected while we waited.
        let due = {
            let mut state = slot.state();
            if state.released {
                return Err(McpError::Released { server });
            }
            if let Some(connection) = state.connection.as_ref() {
                if connection.is_alive() {
                    return Ok(connection.begin_use());
                }
                // Died while idle: count it like a failure, then reconnect.
                tracing::warn!(server = %server, connection = connection.id, "MCP connection found closed; reconnecting");
                state.connection = None;
                state.failures += 1;
                state.last_failure = Some(Instant::now());
                drop(state);
                if let Some(mut breaker) = self.breaker() {
                    breaker.failure(Instant::now(), "connection closed by the server");
                }
                state = slot.state();
            }
            state
                .last_failure
                .map(|at| at + backoff_delay(state.failures))
        };
        let delay = due.map_or(Duration::ZERO, |due| {
            due.saturating_duration_since(Instant::now())
        });
        if delay > self.options.connect_timeout {
            // Too long to wait for here; say why (the breaker first), without using its trial.
            return Err(
                match self.breaker().and_then(|b| b.open_for(Instant::now())) {
                    Some(remaining) => McpError::CircuitOpen { server, remaining },
                    None => McpError::Backoff {
                        server,
                        remaining: delay,
                    },
                },
            );
        }
        if let Some(mut breaker) = self.breaker()
            && let Err(refusal) = breaker.admit(Instant::now())
        {
            return Err(McpError::CircuitOpen {
                server,
                remaining: refusal.remaining,
            });
        }
        if !delay.is_zero() {
            tracing::debug!(server = %server, ?delay, "waiting before reconnecting");
            tokio::time::sleep(delay).await;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        match connect(&self.options, id).await {
            Ok(connection) => {
                let connection = Arc::new(connection);
                let mut state = slot.state();
                state.failures = 0;
                state.last_failure = None;
                if state.released || self.shut_down.load(Ordering::Acquire) {
                    // Released while connecting: dropping it stops the process.
                    connection.mark_dead();
                    return Err(McpError::Released { server });
                }
                state.connection = Some(Arc::clone(&connection));
                let in_use = connection.begin_use();
                drop(state);
                if let Some(mut breaker) = self.breaker() {
                    breaker.success();
                }
                if let (Some(idle), false) =
                    (self.options.idle_timeout, matches!(key, SlotKey::Run(_)))
                {
                    tokio::spawn(close_when_idle(
                        Arc::downgrade(&slot),
                        connection.id,
                        idle,
                        server,
                    ));
                }
                Ok(in_use)
            }
            Err(error) => {
                tracing::warn!(server = %server, %error, "MCP connection failed");
                {
                    let mut state = slot.state();
                    state.failures = state.failures.saturating_add(1);
                    state.last_failure = Some(Instant::now());
                }
                if error.is_connection_failure()
                    && let Some(mut breaker) = self.breaker()
                {
                    breaker.failure(Instant::now(), &error.to_string());
                }
                Err(error)
            }
        }
    }

    /// A call lost its connection: mark it dead so that the next user reconnects after a delay.
    fn connection_lost(&self, key: &SlotKey, connection: &Connection, error: &McpError) {
        connection.mark_dead();
        tracing::warn!(server = %self.name(), connection = connection.id, %error, "MCP connection lost");
        let slot = self.slots().get(key).cloned();
        if let Some(slot) = slot {
            let mut state = slot.state();
            if state.connection.as_ref().map(|c| c.id) == Some(connection.id) {
                state.connection = None;
                state.failures = state.failures.saturating_add(1);
                state.last_failure = Some(Instant::now());
            }
        }
        if let Some(mut breaker) = self.breaker() {
            breaker.failure(Instant::now(), &error.to_string());
        }
    }

    async fn call(
        &self,
        tool: &McpTool,
        ctx: ToolContext,
        arguments: Value,
    ) -> Result<ToolOutput, McpError> {
        let server = self.name().to_owned();
        let arguments = match arguments {
            Value::Object(map) => Some(map),
            Value::Null => None,
            _ => {
                return Err(McpError::BadArguments {
                    tool: tool.spec.name.clone(),
                });
            }
        };
        // Shared and tenant connections come back on their own; a run's only while it is open.
        let create = !matches!(tool.key, SlotKey::Run(_));
        let connection = self.connection(&tool.key, create).await?;
        // A tool the server withdrew since the run opened it (`tools/list_changed`).
        let offered = match connection.tools(&self.options).await {
            Ok(tools) => tools,
            Err(error) => {
                self.connection_lost(&tool.key, &connection, &error);
                return Err(error);
            }
        };
        if !offered.iter().any(|t| t.remote_name == tool.remote_name) {
            return Err(McpError::Withdrawn {
                server,
                tool: tool.remote_name.clone(),
            });
        }
        let mut params = CallToolRequestParams::new(tool.remote_name.clone());
        params.arguments = arguments;
        let mut meta = RequestMetaObject::new();
        meta.insert(
            IDEMPOTENCY_META_KEY.to_owned(),
            Value::String(ctx.idempotency_key),
        );
        // Trace context, where the MCP semantic conventions of OpenTelemetry carry it.
        if let Some(traceparent) = ctx.traceparent {
            meta.insert(TRACEPARENT_META_KEY.to_owned(), Value::String(traceparent));
        }
        params.meta = Some(meta);
        // Dropping this future (engine timeout, cancellation) sends `notifications/cancelled`
        // and leaves the connection usable.
        let call = connection.peer.call_tool(params);
        let result = match self.options.call_timeout {
            Some(limit) => match tokio::time::timeout(limit, call).await {
                Ok(result) => result,
                Err(_) => {
                    return Err(McpError::CallTimeout {
                        server,
                        tool: tool.remote_name.clone(),
                        after: limit,
                    });
                }
            },
            None => call.await,
        };
        match result {
            Ok(result) => {
                if let Some(mut breaker) = self.breaker() {
                    breaker.success();
                }
                Ok(to_output(&server, result))
            }
            Err(ServiceError::McpError(data)) => Err(McpError::Refused {
                server,
                tool: tool.remote_name.clone(),
                message: data.message.to_string(),
            }),
            Err(ServiceError::Timeout { timeout }) => Err(McpError::CallTimeout {
                server,
                tool: tool.remote_name.clone(),
                after: timeout,
            }),
            Err(error @ (ServiceError::TransportClosed | ServiceError::TransportSend(_))) => {
                let error = McpError::ConnectionLost {
                    server,
                    message: if connection.peer.is_transport_closed() {
                        format!("the server closed the connection ({error})")
                    } else {
                        error.to_string()
                    },
                };
                self.connection_lost(&tool.key, &connection, &error);
                Err(error)
            }
            Err(other) => Err(McpError::Protocol {
                server,
                tool: tool.remote_name.clone(),
                message: other.to_string(),
            }),
        }
    }
}

/// One tool of an MCP server, bound to the connection of the run that opened it.
struct McpTool {
    spec: ToolSpec,
    remote_name: String,
    server: Arc<Inner>,
    key: SlotKey,
}

impl fmt::Debug for McpTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpTool")
            .field("name", &self.spec.name)
            .field("server", &self.server.options.name)
            .finish_non_exhaustive()
    }
}

impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(
        &self,
        ctx: ToolContext,
        arguments: Value,
    ) -> BoxFuture<'_, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            self.server
                .call(self, ctx, arguments)
                .await
                .map_err(ToolError::from)
        })
    }
}
