//! The life of a connection with real servers written with the official Python SDK
//! (`tests/servers/py_server.py`): closed after `idle_timeout` unused and reopened at the next
//! call, never cut while a call is in flight; and `notifications/tools/list_changed`, after
//! which the next opening offers the new list and a withdrawn tool is refused by name.
//!
//! Needs `pip install mcp`; skipped with a notice when it is missing, failed instead when
//! `LOOM_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{sync::Arc, time::Duration};

use common::*;
use loom_core::{ports::ToolSource, tool::Tool};
use loom_mcp::{McpServer, McpServerOptions, Scope};
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(90);

async fn call_text(tool: &Arc<dyn Tool>, call: &str, arguments: serde_json::Value) -> String {
    let out = tool.call(tool_ctx("r1", call), arguments).await.unwrap();
    assert!(!out.is_error, "{}", out.visible_text());
    out.visible_text()
}

/// A stdio server unused for `idle_timeout` is stopped, and the next call starts it again
/// transparently; a call longer than the timeout is never cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stdio_server_stops_and_restarts_at_the_next_call() {
    let Some(python) = python_with_mcp("an_idle_stdio_server_stops") else {
        return;
    };
    bounded(LIMIT, async {
        let dir = scratch("idle-stdio");
        let starts = dir.join("starts");
        let mut options =
            py_stdio_options("py", &python, &["--connections", starts.to_str().unwrap()]);
        options.idle_timeout = Some(Duration::from_secs(1));
        let server = McpServer::new(options);
        let tools = server.open(&source_ctx("default", "r1")).await.unwrap();
        let pid = find(&tools, "py__pid");
        let slow = find(&tools, "py__slow");

        // A call in flight for 2.5 s, more than twice the timeout: it answers, on the same
        // process, and nothing restarted meanwhile.
        let first: u32 = call_text(&pid, "c1", json!({})).await.parse().unwrap();
        let answer = call_text(&slow, "c2", json!({"seconds": 2.5})).await;
        assert_eq!(answer, "slept 2.5");
        let same: u32 = call_text(&pid, "c3", json!({})).await.parse().unwrap();
        assert_eq!(same, first, "the server restarted during a call");
        assert_eq!(line_count(&starts), 1);

        // Unused for longer than the timeout: the process ends by itself.
        eventually(
            Duration::from_secs(15),
            "the idle server process to end",
            || !process_alive(first),
        )
        .await;
        // The next call, through the tools the run already holds, starts it again.
        let second: u32 = call_text(&pid, "c4", json!({})).await.parse().unwrap();
        assert_ne!(second, first);
        assert_eq!(line_count(&starts), 2);
        server.shutdown().await;
        eventually(Duration::from_secs(15), "the server to stop", || {
            !process_alive(second)
        })
        .await;
    })
    .await;
}

/// Without an idle timeout the connection stays open however long it waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_idle_timeout_the_server_stays() {
    let Some(python) = python_with_mcp("without_an_idle_timeout") else {
        return;
    };
    bounded(LIMIT, async {
        let mut options = py_stdio_options("py", &python, &[]);
        options.idle_timeout = None;
        let server = McpServer::new(options);
        let tools = server.open(&source_ctx("default", "r1")).await.unwrap();
        let pid = find(&tools, "py__pid");
        let first = call_text(&pid, "c1", json!({})).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(call_text(&pid, "c2", json!({})).await, first);
        server.shutdown().await;
    })
    .await;
}

/// Over streamable HTTP and HTTP+SSE, an idle connection closes (the HTTP session is deleted,
/// the SSE stream closed) and the next call opens a new one. On this thread's runtime: the
/// logs it reads are this thread's (`capture_logs`).
#[tokio::test]
async fn idle_http_and_sse_connections_reopen_at_the_next_call() {
    let Some(python) = python_with_mcp("idle_http_and_sse") else {
        return;
    };
    bounded(LIMIT, async {
        let http = start_py_http(&python, &[]).await;
        let sse = start_py_sse(&python, &[]).await;
        for mut options in [
            http_options("py", &http.url, vec![]),
            sse_options("py", &sse.url, vec![]),
        ] {
            options.idle_timeout = Some(Duration::from_millis(500));
            let (captured, _guard) = capture_logs(tracing::Level::INFO);
            let server = McpServer::new(options);
            let tools = server.open(&source_ctx("default", "r1")).await.unwrap();
            let echo = find(&tools, "py__echo");
            assert_eq!(call_text(&echo, "c1", json!({"text": "one"})).await, "one");
            eventually(
                Duration::from_secs(10),
                "the idle connection to close",
                || {
                    captured
                        .text()
                        .contains("closing the MCP connection unused for")
                },
            )
            .await;
            assert_eq!(call_text(&echo, "c2", json!({"text": "two"})).await, "two");
            let connected = captured.text().matches("MCP server connected").count();
            assert_eq!(connected, 2, "{}", captured.text());
            server.shutdown().await;
        }
    })
    .await;
}

/// The tools of the opening for `run`.
async fn names(server: &McpServer, run: &str) -> Vec<String> {
    let tools = server.open(&source_ctx("default", run)).await.unwrap();
    let mut names: Vec<String> = tools.iter().map(|t| t.spec().name.clone()).collect();
    names.sort();
    names
}

/// `unlock` adds `secret` and announces it: the run that called it keeps its list, a later
/// opening offers `secret`; `lock` withdraws it, and a call through a list that still has it is
/// refused, naming the tool.
async fn check_list_changes(options: McpServerOptions) {
    let server = McpServer::new(options);
    let first = server.open(&source_ctx("default", "r1")).await.unwrap();
    assert!(!first.iter().any(|t| t.spec().name == "py__secret"));
    assert_eq!(
        call_text(&find(&first, "py__unlock"), "c1", json!({})).await,
        "unlocked"
    );
    // The notification travels on its own: a later opening sees it.
    let mut attempt = 0;
    let second = loom_testkit::wait::until("a later opening to offer py__secret", async || {
        attempt += 1;
        let tools = server
            .open(&source_ctx("default", &format!("r2-{attempt}")))
            .await
            .unwrap();
        tools
            .iter()
            .any(|t| t.spec().name == "py__secret")
            .then_some(tools)
    })
    .await;
    let secret = find(&second, "py__secret");
    assert_eq!(
        call_text(&secret, "c2", json!({})).await,
        "the secret is 42"
    );
    assert_eq!(
        call_text(&find(&second, "py__lock"), "c3", json!({})).await,
        "locked"
    );
    // Withdrawn: the run still holds the tool, the call is refused by name, the connection
    // stays usable.
    let mut attempt = 0;
    let error = loom_testkit::wait::until("the withdrawn tool's call to be refused", async || {
        attempt += 1;
        match secret
            .call(tool_ctx("r2", &format!("c4-{attempt}")), json!({}))
            .await
        {
            Err(error) => Ok(error),
            Ok(out) => Err(format!("still answered: {}", out.visible_text())),
        }
    })
    .await;
    assert_eq!(
        error.message,
        "MCP server 'py' no longer offers the tool 'secret': it changed its tool list after this run opened it"
    );
    assert!(
        !names(&server, "r3")
            .await
            .contains(&"py__secret".to_owned())
    );
    assert_eq!(
        call_text(&find(&second, "py__echo"), "c5", json!({"text": "ok"})).await,
        "ok"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_tool_list_is_offered_from_the_next_opening_over_stdio() {
    let Some(python) = python_with_mcp("a_changed_tool_list_stdio") else {
        return;
    };
    bounded(
        LIMIT,
        check_list_changes(py_stdio_options("py", &python, &[])),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_tool_list_is_offered_from_the_next_opening_over_sse() {
    let Some(python) = python_with_mcp("a_changed_tool_list_sse") else {
        return;
    };
    bounded(LIMIT, async {
        let sse = start_py_sse(&python, &[]).await;
        check_list_changes(sse_options("py", &sse.url, vec![])).await;
    })
    .await;
}

/// Tenant connections are closed when idle too; run connections close with their run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tenant_connection_closes_too() {
    let Some(python) = python_with_mcp("an_idle_tenant_connection") else {
        return;
    };
    bounded(LIMIT, async {
        let mut options = with_scope(py_stdio_options("py", &python, &[]), Scope::Tenant);
        options.idle_timeout = Some(Duration::from_millis(500));
        let server = McpServer::new(options);
        let tools = server.open(&source_ctx("acme", "r1")).await.unwrap();
        let pid = find(&tools, "py__pid");
        let first: u32 = call_text(&pid, "c1", json!({})).await.parse().unwrap();
        eventually(
            Duration::from_secs(15),
            "the idle server process to end",
            || !process_alive(first),
        )
        .await;
        let second: u32 = call_text(&pid, "c2", json!({})).await.parse().unwrap();
        assert_ne!(second, first);
        server.shutdown().await;
    })
    .await;
}
