//! MCP servers built in-process with rmcp's server side, served over streamable HTTP on
//! 127.0.0.1:0: headers on every request, `_meta`, connection counts per scope, cancellation
//! by dropping the call, unreachable ports and the circuit breaker.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use common::*;
use loom_core::{
    ports::ToolSource,
    tool::{SideEffects, ToolContext},
};
use loom_mcp::{CircuitSettings, McpServer, Scope};
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
        PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool as McpTool, ToolAnnotations,
    },
    service::RequestContext,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    },
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(60);

/// Counters shared by every session of a test server.
#[derive(Debug, Default)]
struct Stats {
    sessions_opened: AtomicUsize,
    sessions_closed: AtomicUsize,
    cancelled: AtomicUsize,
    api_keys: Mutex<Vec<Option<String>>>,
    metas: Mutex<Vec<Value>>,
    traceparents: Mutex<Vec<Option<String>>>,
}

/// Counts a session's end when the handler is dropped.
#[derive(Debug)]
struct SessionGuard(Arc<Stats>);

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.0.sessions_closed.fetch_add(1, Ordering::SeqCst);
    }
}

#[derive(Debug, Clone)]
struct TestServer {
    stats: Arc<Stats>,
    _session: Arc<SessionGuard>,
}

fn schema(value: Value) -> Arc<serde_json::Map<String, Value>> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => unreachable!(),
    }
}

impl ServerHandler for TestServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let object = json!({"type": "object", "properties": {"text": {"type": "string"}}});
        Ok(ListToolsResult::with_all_items(vec![
            McpTool::new("echo", "Echoes.", schema(object.clone())),
            McpTool::new(
                "whoami",
                "Returns the X-Api-Key header.",
                schema(json!({"type": "object"})),
            )
            .with_annotations(ToolAnnotations::new().read_only(true)),
            McpTool::new("append", "Adds a line.", schema(object))
                .with_annotations(ToolAnnotations::new().destructive(false).idempotent(true)),
            McpTool::new(
                "wait",
                "Waits until cancelled.",
                schema(json!({"type": "object"})),
            ),
            // Dropped: the prefixed name is not a valid model tool name.
            McpTool::new("has.dot", "Bad name.", schema(json!({"type": "object"}))),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let api_key = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get("x-api-key"))
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        self.stats.api_keys.lock().unwrap().push(api_key.clone());
        let traceparent = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get("traceparent"))
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        self.stats.traceparents.lock().unwrap().push(traceparent);
        self.stats
            .metas
            .lock()
            .unwrap()
            .push(serde_json::to_value(&context.meta).unwrap());
        let text = match request.name.as_ref() {
            "echo" => request
                .arguments
                .as_ref()
                .and_then(|a| a.get("text"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            "whoami" => api_key.unwrap_or_default(),
            "wait" => {
                tokio::select! {
                    _ = context.ct.cancelled() => {
                        self.stats.cancelled.fetch_add(1, Ordering::SeqCst);
                        "cancelled".to_owned()
                    }
                    _ = tokio::time::sleep(Duration::from_secs(30)) => "waited".to_owned(),
                }
            }
            other => {
                return Err(ErrorData::invalid_params(
                    format!("unknown tool {other}"),
                    None,
                ));
            }
        };
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
    }
}

struct Running {
    url: String,
    stats: Arc<Stats>,
    stop: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn serve_on(listener: tokio::net::TcpListener) -> Running {
    let stats = Arc::new(Stats::default());
    let stop = CancellationToken::new();
    let factory_stats = Arc::clone(&stats);
    let service: StreamableHttpService<TestServer, LocalSessionManager> =
        StreamableHttpService::new(
            move || {
                factory_stats.sessions_opened.fetch_add(1, Ordering::SeqCst);
                Ok(TestServer {
                    stats: Arc::clone(&factory_stats),
                    _session: Arc::new(SessionGuard(Arc::clone(&factory_stats))),
                })
            },
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default()
                .with_sse_keep_alive(Some(Duration::from_millis(200)))
                .with_cancellation_token(stop.child_token()),
        );
    let addr = listener.local_addr().unwrap();
    let router = axum::Router::new().nest_service("/mcp", service);
    let shutdown = stop.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move { shutdown.cancelled_owned().await })
            .await;
    });
    Running {
        url: format!("http://{addr}/mcp"),
        stats,
        stop,
    }
}

async fn serve() -> Running {
    serve_on(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_meta_and_declarations_over_http() {
    bounded(LIMIT, async {
        let running = serve().await;
        let server = McpServer::new(http_options(
            "inproc",
            &running.url,
            vec![("X-Api-Key".into(), "k-123".into())],
        ));
        let tools = server.open(&source_ctx("default", "r1")).await.unwrap();
        let mut names: Vec<_> = tools.iter().map(|t| t.spec().name.clone()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "inproc__append",
                "inproc__echo",
                "inproc__wait",
                "inproc__whoami"
            ],
            "has.dot is dropped"
        );
        let append = find(&tools, "inproc__append");
        assert_eq!(
            append.spec().declarations.side_effects,
            SideEffects::Reversible
        );
        assert!(append.spec().declarations.idempotent);
        assert_eq!(
            find(&tools, "inproc__whoami")
                .spec()
                .declarations
                .side_effects,
            SideEffects::None
        );

        let whoami = find(&tools, "inproc__whoami");
        for call in ["c1", "c2"] {
            let out = whoami.call(tool_ctx("r1", call), json!({})).await.unwrap();
            assert_eq!(out.visible_text(), "k-123");
        }
        // Trace context, when the engine gives one, reaches the server in `_meta`.
        let traced = ToolContext {
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            ..tool_ctx("r1", "c3")
        };
        let out = find(&tools, "inproc__echo")
            .call(traced, json!({"text": "hello"}))
            .await
            .unwrap();
        assert_eq!(out.visible_text(), "hello");
        let metas = running.stats.metas.lock().unwrap().clone();
        assert_eq!(metas.len(), 3);
        assert_eq!(metas[2]["loom-ia/idempotency_key"], "key-r1-c3");
        assert_eq!(
            metas[2]["traceparent"],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        assert!(
            metas[0].get("traceparent").is_none(),
            "none without trace context"
        );
        // … and as the W3C `traceparent` HTTP header of that call's request, only that one.
        assert_eq!(
            running.stats.traceparents.lock().unwrap().clone(),
            vec![
                None,
                None,
                Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned())
            ]
        );
        assert!(
            running
                .stats
                .api_keys
                .lock()
                .unwrap()
                .iter()
                .all(|key| key.as_deref() == Some("k-123"))
        );

        // A JSON-RPC error from the server is an error result; the connection stays.
        let error = find(&tools, "inproc__append")
            .call(tool_ctx("r1", "c4"), json!({"text": "x"}))
            .await
            .expect_err("the server refuses");
        assert!(
            error.message.contains("refused the call to 'append'"),
            "{error}"
        );
        assert!(whoami.call(tool_ctx("r1", "c5"), json!({})).await.is_ok());
        assert_eq!(running.stats.sessions_opened.load(Ordering::SeqCst), 1);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_count_connections() {
    bounded(LIMIT, async {
        // Shared: one session for every run.
        let running = serve().await;
        let shared = McpServer::new(http_options("inproc", &running.url, vec![]));
        for (tenant, run) in [("t1", "r1"), ("t2", "r2"), ("t1", "r3")] {
            let tools = shared.open(&source_ctx(tenant, run)).await.unwrap();
            find(&tools, "inproc__echo")
                .call(tool_ctx(run, "c"), json!({"text": "x"}))
                .await
                .unwrap();
            shared.release(&source_ctx(tenant, run)).await;
        }
        assert_eq!(running.stats.sessions_opened.load(Ordering::SeqCst), 1);
        shared.shutdown().await;

        // Tenant: one per tenant.
        let running = serve().await;
        let per_tenant = McpServer::new(with_scope(
            http_options("inproc", &running.url, vec![]),
            Scope::Tenant,
        ));
        for (tenant, run) in [("t1", "r1"), ("t2", "r2"), ("t1", "r3")] {
            per_tenant.open(&source_ctx(tenant, run)).await.unwrap();
        }
        assert_eq!(running.stats.sessions_opened.load(Ordering::SeqCst), 2);
        per_tenant.shutdown().await;

        // Run: opened per run, closed on release.
        let running = serve().await;
        let per_run = McpServer::new(with_scope(
            http_options("inproc", &running.url, vec![]),
            Scope::Run,
        ));
        let tools = per_run.open(&source_ctx("t1", "r1")).await.unwrap();
        for call in ["a", "b", "c"] {
            find(&tools, "inproc__echo")
                .call(tool_ctx("r1", call), json!({"text": "x"}))
                .await
                .unwrap();
        }
        per_run.open(&source_ctx("t1", "r2")).await.unwrap();
        assert_eq!(running.stats.sessions_opened.load(Ordering::SeqCst), 2);
        per_run.release(&source_ctx("t1", "r1")).await;
        let stats = Arc::clone(&running.stats);
        eventually(Duration::from_secs(10), "run 1's session closes", || {
            stats.sessions_closed.load(Ordering::SeqCst) >= 1
        })
        .await;
        per_run.release(&source_ctx("t1", "r2")).await;
        eventually(Duration::from_secs(10), "run 2's session closes", || {
            stats.sessions_closed.load(Ordering::SeqCst) >= 2
        })
        .await;
        assert_eq!(running.stats.sessions_opened.load(Ordering::SeqCst), 2);
        per_run.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_call_cancels_it_without_poisoning_the_connection() {
    bounded(LIMIT, async {
        let running = serve().await;
        let server = McpServer::new(http_options("inproc", &running.url, vec![]));
        let tools = server.open(&source_ctx("default", "r1")).await.unwrap();
        let wait = find(&tools, "inproc__wait");
        let cut = tokio::time::timeout(
            Duration::from_millis(200),
            wait.call(tool_ctx("r1", "c1"), json!({})),
        )
        .await;
        assert!(cut.is_err());
        let stats = Arc::clone(&running.stats);
        eventually(
            Duration::from_secs(10),
            "the server sees the cancellation",
            || stats.cancelled.load(Ordering::SeqCst) == 1,
        )
        .await;
        let out = find(&tools, "inproc__echo")
            .call(tool_ctx("r1", "c2"), json!({"text": "still fine"}))
            .await
            .unwrap();
        assert_eq!(out.visible_text(), "still fine");
        assert_eq!(running.stats.sessions_opened.load(Ordering::SeqCst), 1);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_port_fails_quickly() {
    bounded(LIMIT, async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let mut options = http_options("down", &format!("http://{addr}/mcp"), vec![]);
        options.connect_timeout = Duration::from_secs(5);
        let server = McpServer::new(options);
        let error = server
            .open(&source_ctx("default", "r1"))
            .await
            .expect_err("nothing listens");
        // Refused at once: unreachable, not cut by the 5 s connect timeout.
        assert!(
            error.message.contains("MCP server 'down' is unreachable"),
            "{error}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaker_opens_reports_once_then_lets_one_trial_through() {
    bounded(LIMIT, async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let mut options = http_options("down", &format!("http://{addr}/mcp"), vec![]);
        options.connect_timeout = Duration::from_secs(3);
        options.circuit = Some(CircuitSettings {
            failures: 2,
            cooldown: Duration::from_millis(1500),
        });
        let server = McpServer::new(options);
        let ctx = source_ctx("default", "r1");

        let first = server.open(&ctx).await.expect_err("down");
        assert!(first.circuit.is_none());
        // The second failure (after the first reconnection delay) opens the breaker.
        let second = server.open(&ctx).await.expect_err("down");
        let notice = second.circuit.expect("the opening is reported");
        assert_eq!(notice.target, "mcp:down");
        assert_eq!(notice.failures, 2);
        assert_eq!(notice.cooldown_s, 1.5);
        assert!(notice.error.contains("unreachable"), "{}", notice.error);
        // While open: refused without a connection attempt, and the opening is not reported
        // again.
        let third = server.open(&ctx).await.expect_err("open");
        assert!(third.circuit.is_none());
        assert!(
            third.message.contains("circuit breaker is open"),
            "{}",
            third.message
        );

        // The server comes back on the same port; after the cooldown one trial goes through.
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let running = serve_on(listener).await;
        tokio::time::sleep(Duration::from_millis(1600)).await;
        let tools = server.open(&ctx).await.expect("the trial succeeds");
        assert!(!tools.is_empty());
        assert_eq!(running.stats.sessions_opened.load(Ordering::SeqCst), 1);
        server.shutdown().await;
    })
    .await;
}

/// A shared connection unused for `idle_timeout` has its HTTP session deleted; the next call
/// opens a new session transparently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_is_deleted_and_reopened_at_the_next_call() {
    bounded(LIMIT, async {
        let running = serve().await;
        let mut options = http_options("inproc", &running.url, vec![]);
        options.idle_timeout = Some(Duration::from_millis(400));
        let server = McpServer::new(options);
        let tools = server.open(&source_ctx("t1", "r1")).await.unwrap();
        let echo = find(&tools, "inproc__echo");
        echo.call(tool_ctx("r1", "a"), json!({"text": "x"}))
            .await
            .unwrap();
        let stats = Arc::clone(&running.stats);
        eventually(
            Duration::from_secs(10),
            "the idle session to be deleted",
            || stats.sessions_closed.load(Ordering::SeqCst) == 1,
        )
        .await;
        assert_eq!(running.stats.sessions_opened.load(Ordering::SeqCst), 1);
        let out = echo
            .call(tool_ctx("r1", "b"), json!({"text": "again"}))
            .await
            .unwrap();
        assert!(!out.is_error);
        assert_eq!(running.stats.sessions_opened.load(Ordering::SeqCst), 2);
        server.shutdown().await;
    })
    .await;
}
