//! Real MCP servers written with the official Python SDK (`tests/servers/py_server.py`), over
//! stdio and streamable HTTP: listing, prefixing, declarations, calls with `_meta`, results,
//! crashes, reconnection, scopes, cancellation, unreachable servers, stderr and shutdown.
//!
//! Needs `pip install mcp`; skipped with a notice when it is missing, failed instead when
//! `LOOM_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use common::*;
use loom_core::{
    BlockKind,
    ports::ToolSource,
    tool::{SideEffects, Tool, ToolKind},
};
use loom_mcp::{McpServer, Scope, ToolOverrides, Transport};
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_lists_prefixed_tools_with_declarations_and_overrides() {
    let Some(python) = python_with_mcp("stdio_lists_prefixed_tools") else {
        return;
    };
    bounded(LIMIT, async {
        let mut options = py_stdio_options("py", &python, &[]);
        options.overrides = BTreeMap::from([
            (
                "echo".to_owned(),
                ToolOverrides {
                    description: Some("Says it back.".into()),
                    side_effects: Some(SideEffects::None),
                    idempotent: Some(true),
                    timeout: Some(Duration::from_secs(7)),
                    offload_over: None,
                },
            ),
            (
                "send_mail".to_owned(),
                ToolOverrides {
                    idempotent: Some(true),
                    ..ToolOverrides::default()
                },
            ),
        ]);
        let server = McpServer::new(options);
        assert_eq!(server.name(), "py");
        let tools = server
            .list_tools(&source_ctx("default", "r1"))
            .await
            .unwrap();
        let mut names: Vec<_> = tools.iter().map(|t| t.spec().name.clone()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "py__add",
                "py__crash",
                "py__document",
                "py__echo",
                "py__fail",
                "py__image",
                "py__lock",
                "py__pid",
                "py__send_mail",
                "py__slow",
                "py__sound",
                "py__unlock"
            ]
        );
        for tool in &tools {
            assert_eq!(tool.spec().kind, ToolKind::Mcp);
            assert_eq!(tool.spec().input_schema["type"], "object");
        }
        let add = find(&tools, "py__add");
        assert_eq!(add.spec().description, "Adds two integers.");
        assert_eq!(
            add.spec().input_schema["properties"]["a"]["type"],
            "integer"
        );
        // readOnlyHint ⇒ none.
        assert_eq!(add.spec().declarations.side_effects, SideEffects::None);
        assert!(!add.spec().declarations.idempotent);
        // No annotation ⇒ irreversible.
        let crash = find(&tools, "py__crash");
        assert_eq!(
            crash.spec().declarations.side_effects,
            SideEffects::Irreversible
        );
        // destructiveHint ⇒ irreversible; the server override makes it idempotent.
        let send_mail = find(&tools, "py__send_mail");
        assert_eq!(
            send_mail.spec().declarations.side_effects,
            SideEffects::Irreversible
        );
        assert!(send_mail.spec().declarations.idempotent);
        // idempotentHint ⇒ idempotent.
        let pid = find(&tools, "py__pid");
        assert!(pid.spec().declarations.idempotent);
        assert_eq!(pid.spec().declarations.side_effects, SideEffects::None);
        // Overrides on an unannotated tool.
        let echo = find(&tools, "py__echo");
        assert_eq!(echo.spec().description, "Says it back.");
        assert_eq!(echo.spec().declarations.side_effects, SideEffects::None);
        assert!(echo.spec().declarations.idempotent);
        assert_eq!(
            echo.spec().declarations.timeout,
            Some(Duration::from_secs(7))
        );
        server.shutdown().await;
    })
    .await;
}

/// The calls every transport must get right.
async fn check_calls(tools: &[Arc<dyn Tool>]) {
    let echo = find(tools, "py__echo");
    let out = echo
        .call(tool_ctx("r1", "c1"), json!({"text": "hi"}))
        .await
        .unwrap();
    assert!(!out.is_error);
    assert_eq!(out.visible_text(), "hi");
    assert_eq!(out.data, Some(json!({"result": "hi"})));

    let send_mail = find(tools, "py__send_mail");
    let ctx = tool_ctx("r1", "c2");
    let key = ctx.idempotency_key.clone();
    let out = send_mail
        .call(ctx, json!({"to": "ada@example.org"}))
        .await
        .unwrap();
    assert!(
        out.visible_text().contains(&format!("key={key}")),
        "the server must receive the idempotency key in _meta: {}",
        out.visible_text()
    );

    let fail = find(tools, "py__fail");
    let out = fail
        .call(tool_ctx("r1", "c3"), json!({"reason": "because"}))
        .await
        .unwrap();
    assert!(out.is_error);
    assert!(
        out.visible_text().contains("failed on purpose: because"),
        "{}",
        out.visible_text()
    );

    let image = find(tools, "py__image");
    let out = image.call(tool_ctx("r1", "c4"), json!({})).await.unwrap();
    assert!(!out.is_error);
    match &out.blocks[..] {
        [block] => match &block.kind {
            BlockKind::InlineData {
                media_type, data, ..
            } => {
                assert_eq!(media_type, "image/png");
                assert!(data.starts_with("iVBORw0KGgo"), "{data}");
            }
            other => panic!("expected inline data, got {other:?}"),
        },
        other => panic!("expected one block, got {other:?}"),
    }

    let add = find(tools, "py__add");
    let out = add
        .call(tool_ctx("r1", "c5"), json!({"a": 2, "b": 40}))
        .await
        .unwrap();
    assert!(out.visible_text().contains("42"), "{}", out.visible_text());

    // Arguments the server rejects: an error the model can read, not a broken connection.
    let out = add.call(tool_ctx("r1", "c6"), json!({"a": "x"})).await;
    match out {
        Ok(out) => assert!(out.is_error),
        Err(error) => assert!(error.message.contains("py"), "{error}"),
    }
    let out = echo
        .call(tool_ctx("r1", "c7"), json!({"text": "still here"}))
        .await
        .unwrap();
    assert_eq!(out.visible_text(), "still here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_calls_end_to_end() {
    let Some(python) = python_with_mcp("stdio_calls_end_to_end") else {
        return;
    };
    bounded(LIMIT, async {
        let server = McpServer::new(py_stdio_options("py", &python, &[]));
        let tools = server.open(&source_ctx("default", "r1")).await.unwrap();
        check_calls(&tools).await;
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_calls_end_to_end() {
    let Some(python) = python_with_mcp("http_calls_end_to_end") else {
        return;
    };
    bounded(LIMIT, async {
        let http = start_py_http(&python, &[]).await;
        let server = McpServer::new(http_options(
            "py",
            &http.url,
            vec![("X-Api-Key".into(), "secret-value".into())],
        ));
        let tools = server.open(&source_ctx("default", "r1")).await.unwrap();
        assert_eq!(tools.len(), 12);
        check_calls(&tools).await;
        server.shutdown().await;
    })
    .await;
}

/// The older HTTP+SSE transport (protocol 2024-11-05) against the SDK's own SSE server: the
/// same calls, the trace context, and the session closed with the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_calls_end_to_end() {
    let Some(python) = python_with_mcp("sse_calls_end_to_end") else {
        return;
    };
    bounded(LIMIT, async {
        let sse = start_py_sse(&python, &[]).await;
        let server = McpServer::new(sse_options(
            "py",
            &sse.url,
            vec![("X-Api-Key".into(), "secret-value".into())],
        ));
        let tools = server.open(&source_ctx("default", "r1")).await.unwrap();
        assert_eq!(tools.len(), 12);
        check_calls(&tools).await;
        // A slow call's answer comes back on the stream while other calls go through.
        let slow = find(&tools, "py__slow");
        let echo = find(&tools, "py__echo");
        let (slow_out, echo_out) = tokio::join!(
            slow.call(tool_ctx("r1", "s1"), json!({"seconds": 0.5})),
            echo.call(tool_ctx("r1", "s2"), json!({"text": "meanwhile"}))
        );
        assert_eq!(slow_out.unwrap().visible_text(), "slept 0.5");
        assert_eq!(echo_out.unwrap().visible_text(), "meanwhile");
        server.shutdown().await;
        // Closed: a call through the old tools is refused, nothing hangs.
        let error = echo
            .call(tool_ctx("r1", "s3"), json!({"text": "x"}))
            .await
            .expect_err("shut down");
        assert!(error.message.contains("shut down"), "{error}");
    })
    .await;
}

/// The SSE server dies: the connection is lost, and the next run's opening reports the stream
/// that cannot be opened, naming its URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_server_gone_is_a_clear_error() {
    let Some(python) = python_with_mcp("sse_server_gone") else {
        return;
    };
    bounded(LIMIT, async {
        let mut sse = start_py_sse(&python, &[]).await;
        let mut options = sse_options("py", &sse.url, vec![]);
        options.connect_timeout = Duration::from_secs(3);
        let server = McpServer::new(options);
        let tools = server.open(&source_ctx("default", "r1")).await.unwrap();
        let error = find(&tools, "py__crash")
            .call(tool_ctx("r1", "c1"), json!({}))
            .await
            .expect_err("a crash mid-call is an error");
        assert!(
            error
                .message
                .contains("connection to MCP server 'py' lost during the call"),
            "{error}"
        );
        let _ = sse.child.wait().await;
        // After the reconnection delay, the stream cannot be opened.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let error = server
            .open(&source_ctx("default", "r2"))
            .await
            .expect_err("server is down");
        assert!(
            error.message.contains(&format!(
                "MCP server 'py': cannot open the SSE stream at {}",
                sse.url
            )),
            "{error}"
        );
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_crash_mid_call_is_an_error_then_reconnects() {
    let Some(python) = python_with_mcp("stdio_crash_mid_call") else {
        return;
    };
    bounded(LIMIT, async {
        let dir = scratch("crash");
        let connections = dir.join("connections");
        let server = McpServer::new(py_stdio_options(
            "py",
            &python,
            &["--connections", connections.to_str().unwrap()],
        ));
        let ctx = source_ctx("default", "r1");
        let tools = server.open(&ctx).await.unwrap();
        let pid_tool = find(&tools, "py__pid");
        let first_pid = pid_tool
            .call(tool_ctx("r1", "c0"), json!({}))
            .await
            .unwrap()
            .visible_text();

        let error = find(&tools, "py__crash")
            .call(tool_ctx("r1", "c1"), json!({}))
            .await
            .expect_err("a crash mid-call is an error");
        assert!(
            error
                .message
                .contains("connection to MCP server 'py' lost during the call"),
            "{error}"
        );
        assert_eq!(line_count(&connections), 1);

        // The next call reconnects (after the first reconnection delay).
        let second_pid = pid_tool
            .call(tool_ctx("r1", "c2"), json!({}))
            .await
            .unwrap()
            .visible_text();
        assert_ne!(first_pid, second_pid, "a new process");
        assert_eq!(line_count(&connections), 2);
        // And open gives tools on the live connection without opening another.
        let again = server.open(&ctx).await.unwrap();
        assert_eq!(again.len(), tools.len());
        assert_eq!(line_count(&connections), 2);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_crash_mid_call_is_an_error_not_a_hang() {
    let Some(python) = python_with_mcp("http_crash_mid_call") else {
        return;
    };
    bounded(LIMIT, async {
        let http = start_py_http(&python, &[]).await;
        let mut options = http_options("py", &http.url, vec![]);
        options.connect_timeout = Duration::from_secs(3);
        let server = McpServer::new(options);
        let tools = server.open(&source_ctx("default", "r1")).await.unwrap();
        let error = find(&tools, "py__crash")
            .call(tool_ctx("r1", "c1"), json!({}))
            .await
            .expect_err("a crash mid-call is an error");
        assert!(
            error
                .message
                .contains("connection to MCP server 'py' lost during the call"),
            "{error}"
        );
        // The server is gone: opening again fails (the test's bound catches a hang).
        let error = server
            .open(&source_ctx("default", "r2"))
            .await
            .expect_err("server is down");
        assert!(error.message.contains("py"), "{error}");
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_call_dropped_by_the_engine_leaves_the_connection_usable() {
    let Some(python) = python_with_mcp("slow_call_dropped") else {
        return;
    };
    bounded(LIMIT, async {
        let dir = scratch("slow");
        let connections = dir.join("connections");
        let server = McpServer::new(py_stdio_options(
            "py",
            &python,
            &["--connections", connections.to_str().unwrap()],
        ));
        let tools = server.open(&source_ctx("default", "r1")).await.unwrap();
        let slow = find(&tools, "py__slow");
        // What the engine does with a tool timeout.
        let timed_out = tokio::time::timeout(
            Duration::from_millis(300),
            slow.call(tool_ctx("r1", "c1"), json!({"seconds": 30})),
        )
        .await;
        assert!(timed_out.is_err(), "the slow call is cut by the timeout");
        let out = find(&tools, "py__echo")
            .call(tool_ctx("r1", "c2"), json!({"text": "after"}))
            .await
            .unwrap();
        assert_eq!(out.visible_text(), "after");
        assert_eq!(line_count(&connections), 1, "same connection");
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_timeout_is_an_error_and_keeps_the_connection() {
    let Some(python) = python_with_mcp("call_timeout") else {
        return;
    };
    bounded(LIMIT, async {
        let mut options = py_stdio_options("py", &python, &[]);
        options.call_timeout = Some(Duration::from_millis(300));
        let server = McpServer::new(options);
        let tools = server.open(&source_ctx("default", "r1")).await.unwrap();
        let error = find(&tools, "py__slow")
            .call(tool_ctx("r1", "c1"), json!({"seconds": 30}))
            .await
            .expect_err("timeout");
        assert!(error.message.contains("did not answer"), "{error}");
        let out = find(&tools, "py__slow")
            .call(tool_ctx("r1", "c2"), json!({"seconds": 0.01}))
            .await
            .unwrap();
        assert!(out.visible_text().contains("slept"));
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_decide_how_many_processes() {
    let Some(python) = python_with_mcp("scopes") else {
        return;
    };
    bounded(LIMIT, async {
        let dir = scratch("scopes");

        // Shared: one process for every run and tenant, reused by every call.
        let shared_file = dir.join("shared");
        let shared = McpServer::new(py_stdio_options(
            "py",
            &python,
            &["--connections", shared_file.to_str().unwrap()],
        ));
        let mut pids = Vec::new();
        for (tenant, run) in [("t1", "r1"), ("t1", "r2"), ("t2", "r3")] {
            let tools = shared.open(&source_ctx(tenant, run)).await.unwrap();
            for call in ["a", "b"] {
                let out = find(&tools, "py__pid")
                    .call(tool_ctx(run, call), json!({}))
                    .await
                    .unwrap();
                pids.push(out.visible_text());
            }
            shared.release(&source_ctx(tenant, run)).await;
        }
        pids.dedup();
        assert_eq!(pids.len(), 1, "one process: {pids:?}");
        assert_eq!(line_count(&shared_file), 1);
        shared.shutdown().await;

        // Tenant: one per tenant.
        let tenant_file = dir.join("tenant");
        let per_tenant = McpServer::new(with_scope(
            py_stdio_options(
                "py",
                &python,
                &["--connections", tenant_file.to_str().unwrap()],
            ),
            Scope::Tenant,
        ));
        for (tenant, run) in [("t1", "r1"), ("t1", "r2"), ("t2", "r3"), ("t2", "r4")] {
            per_tenant.open(&source_ctx(tenant, run)).await.unwrap();
        }
        assert_eq!(line_count(&tenant_file), 2);
        per_tenant.shutdown().await;

        // Run: opened by open, closed by release.
        let run_file = dir.join("run");
        let per_run = McpServer::new(with_scope(
            py_stdio_options(
                "py",
                &python,
                &["--connections", run_file.to_str().unwrap()],
            ),
            Scope::Run,
        ));
        let ctx1 = source_ctx("t1", "r1");
        let ctx2 = source_ctx("t1", "r2");
        let tools1 = per_run.open(&ctx1).await.unwrap();
        let tools2 = per_run.open(&ctx2).await.unwrap();
        assert_eq!(line_count(&run_file), 2);
        // Reused within the run.
        per_run.open(&ctx1).await.unwrap();
        assert_eq!(line_count(&run_file), 2);
        let pid1: u32 = find(&tools1, "py__pid")
            .call(tool_ctx("r1", "a"), json!({}))
            .await
            .unwrap()
            .visible_text()
            .parse()
            .unwrap();
        assert!(process_alive(pid1));
        per_run.release(&ctx1).await;
        eventually(Duration::from_secs(10), "run 1's server exits", || {
            !process_alive(pid1)
        })
        .await;
        let error = find(&tools1, "py__pid")
            .call(tool_ctx("r1", "b"), json!({}))
            .await
            .expect_err("the run's connection is closed");
        assert!(error.message.contains("already closed"), "{error}");
        // The other run is untouched.
        find(&tools2, "py__pid")
            .call(tool_ctx("r2", "a"), json!({}))
            .await
            .unwrap();
        per_run.release(&ctx2).await;
        assert_eq!(line_count(&run_file), 2);
        per_run.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_commands_fail_quickly() {
    bounded(LIMIT, async {
        // A program that does not exist.
        let mut options = loom_mcp::McpServerOptions::new(
            "missing",
            Transport::Stdio {
                command: "/nonexistent/loom-mcp-test-server".into(),
                args: vec![],
                env: BTreeMap::new(),
                cwd: None,
            },
        );
        options.connect_timeout = Duration::from_secs(5);
        let server = McpServer::new(options);
        let error = server
            .open(&source_ctx("default", "r1"))
            .await
            .expect_err("no such program");
        assert!(error.message.contains("cannot start"), "{error}");
        assert!(error.circuit.is_none());

        // A program that never speaks MCP: cut at connect_timeout, and killed.
        let mut options = loom_mcp::McpServerOptions::new(
            "mute",
            Transport::Stdio {
                command: "sleep".into(),
                args: vec!["30".into()],
                env: BTreeMap::new(),
                cwd: None,
            },
        );
        options.connect_timeout = Duration::from_millis(500);
        let server = McpServer::new(options);
        let error = server
            .open(&source_ctx("default", "r1"))
            .await
            .expect_err("no handshake");
        assert!(
            error.message.contains("did not answer within 500ms"),
            "{error}"
        );

        // A program that exits at once.
        let mut options = loom_mcp::McpServerOptions::new(
            "gone",
            Transport::Stdio {
                command: "true".into(),
                args: vec![],
                env: BTreeMap::new(),
                cwd: None,
            },
        );
        options.connect_timeout = Duration::from_secs(5);
        let server = McpServer::new(options);
        let error = server
            .open(&source_ctx("default", "r1"))
            .await
            .expect_err("exited");
        // Unreachable at once, not cut by the 5 s connect timeout.
        assert!(error.message.contains("unreachable"), "{error}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_server_name_is_refused() {
    let server = McpServer::new(loom_mcp::McpServerOptions::new(
        "bad__name",
        Transport::Stdio {
            command: "true".into(),
            args: vec![],
            env: BTreeMap::new(),
            cwd: None,
        },
    ));
    let error = server
        .open(&source_ctx("default", "r1"))
        .await
        .expect_err("invalid name");
    assert!(error.message.contains("invalid MCP server name"), "{error}");
}

/// Opens a stdio server and calls it on a runtime of this thread, which has no subscriber: its
/// stderr line is logged nowhere.
fn talk_to_a_server_without_logs(python: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(bounded(LIMIT, async {
        let server = McpServer::new(py_stdio_options("py", python, &[]));
        let tools = server.open(&source_ctx("default", "r0")).await.unwrap();
        find(&tools, "py__echo")
            .call(tool_ctx("r0", "c"), json!({"text": "x"}))
            .await
            .unwrap();
        server.shutdown().await;
    }));
}

/// The server's stderr reaches the logs (target `loom_mcp::stderr`), never the protocol.
///
/// The logs are captured on this thread while other threads, without a subscriber, log the
/// same line from their own servers (as the other tests of this file do, in parallel): one of
/// them does it here first, after the capture started.
#[test]
fn stderr_goes_to_the_logs_not_the_protocol() {
    let Some(python) = python_with_mcp("stderr_goes_to_the_logs") else {
        return;
    };
    let (captured, _guard) = capture_logs(tracing::Level::INFO);
    let other = python.clone();
    std::thread::spawn(move || talk_to_a_server_without_logs(&other))
        .join()
        .unwrap();
    assert!(
        !captured.text().contains("py_server starting"),
        "another thread's line was captured:\n{}",
        captured.text()
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(bounded(LIMIT, async {
        let server = McpServer::new(py_stdio_options("py", &python, &[]));
        let tools = server.open(&source_ctx("default", "r1")).await.unwrap();
        find(&tools, "py__echo")
            .call(tool_ctx("r1", "c"), json!({"text": "x"}))
            .await
            .unwrap();
        eventually(
            Duration::from_secs(30),
            "the server's stderr line in the logs",
            || captured.text().contains("py_server starting (stderr line)"),
        )
        .await;
        server.shutdown().await;
    }));
    let logs = captured.text();
    let line = logs
        .lines()
        .find(|line| line.contains("py_server starting"))
        .unwrap();
    assert!(line.contains("loom_mcp::stderr"), "{line}");
    assert!(line.contains("server=py"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_the_process_group() {
    let Some(python) = python_with_mcp("shutdown_stops_the_process_group") else {
        return;
    };
    bounded(LIMIT, async {
        let dir = scratch("group");
        let grandchild_file = dir.join("grandchild");
        let server = McpServer::new(py_stdio_options(
            "py",
            &python,
            &["--grandchild", grandchild_file.to_str().unwrap()],
        ));
        let tools = server.open(&source_ctx("default", "r1")).await.unwrap();
        let pid: u32 = find(&tools, "py__pid")
            .call(tool_ctx("r1", "c"), json!({}))
            .await
            .unwrap()
            .visible_text()
            .parse()
            .unwrap();
        let grandchild: u32 = std::fs::read_to_string(&grandchild_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(process_alive(pid) && process_alive(grandchild));
        server.shutdown().await;
        eventually(Duration::from_secs(10), "the server exits", || {
            !process_alive(pid)
        })
        .await;
        eventually(Duration::from_secs(10), "its child exits too", || {
            !process_alive(grandchild)
        })
        .await;
        let error = server
            .open(&source_ctx("default", "r2"))
            .await
            .expect_err("shut down");
        assert!(error.message.contains("shut down"), "{error}");
    })
    .await;
}
