//! No orphan servers: when the Loom process is killed with SIGKILL (no cleanup runs), a stdio
//! MCP server it started sees its stdin close and exits by itself.
//!
//! The test re-runs this test binary as a helper process (`orphan_helper_process` with
//! `LOOM_MCP_ORPHAN_HELPER` set) that opens the Python test server, writes the server's pid, and
//! waits to be killed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{process::Stdio, time::Duration};

use common::*;
use loom_core::ports::ToolSource;
use loom_mcp::McpServer;
use serde_json::json;

const HELPER_ENV: &str = "LOOM_MCP_ORPHAN_HELPER";

/// Only does something when run as the helper by `sigkill_of_loom_does_not_orphan_the_server`.
#[test]
fn orphan_helper_process() {
    let Ok(pid_file) = std::env::var(HELPER_ENV) else {
        return;
    };
    let python = python_command();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = McpServer::new(py_stdio_options("py", &python, &[]));
        let tools = server.open(&source_ctx("default", "r1")).await.unwrap();
        let pid = find(&tools, "py__pid")
            .call(tool_ctx("r1", "c"), json!({}))
            .await
            .unwrap()
            .visible_text();
        let tmp = format!("{pid_file}.tmp");
        std::fs::write(&tmp, pid).unwrap();
        std::fs::rename(&tmp, &pid_file).unwrap();
        // Wait to be killed (bounded, in case the parent test died first).
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
}

#[test]
fn sigkill_of_loom_does_not_orphan_the_server() {
    if std::env::var(HELPER_ENV).is_ok() {
        return;
    }
    let Some(python) = python_with_mcp("sigkill_of_loom_does_not_orphan_the_server") else {
        return;
    };
    let dir = scratch("orphan");
    let pid_file = dir.join("server.pid");
    let mut helper = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "orphan_helper_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER_ENV, &pid_file)
        .env("LOOM_TEST_PYTHON", &python)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server_pid: u32 = runtime.block_on(async {
        eventually(
            Duration::from_secs(30),
            "the helper starts the server",
            || pid_file.exists(),
        )
        .await;
        std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    });
    assert!(process_alive(server_pid));

    // kill -9 of "Loom": nothing of ours runs any more.
    helper.kill().unwrap();
    helper.wait().unwrap();

    let exited = runtime.block_on(loom_testkit::wait::poll_within(
        "the MCP server to exit",
        Duration::from_secs(10),
        async || !process_alive(server_pid),
    ));
    let exited = exited.is_ok();
    if !exited {
        // Do not leave it behind, then fail.
        let _ = std::process::Command::new("kill")
            .args(["-9", &server_pid.to_string()])
            .status();
    }
    assert!(exited, "the MCP server outlived the killed Loom process");
}
