//! Helpers shared by the integration tests: the Python SDK check, server options, contexts,
//! bounded waits.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    future::Future,
    io::Write,
    path::PathBuf,
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use loom_core::{
    ports::SourceContext,
    tool::{Tool, ToolContext},
};
use loom_mcp::{McpServerOptions, Scope, Transport};
use tokio::io::{AsyncBufReadExt, BufReader};

/// The Python interpreter: `LOOM_TEST_PYTHON`, else `python3`.
pub fn python_command() -> String {
    std::env::var("LOOM_TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

/// The Python interpreter when the official MCP SDK is importable. Otherwise: fails when
/// `LOOM_REQUIRE_SERVICES=1`, else prints a skip notice and returns `None`.
pub fn python_with_mcp(test: &str) -> Option<String> {
    let python = python_command();
    let works = std::process::Command::new(&python)
        .args(["-c", "import mcp.server.mcpserver, uvicorn"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|status| status.success())
        .unwrap_or(false);
    if works {
        return Some(python);
    }
    let message = format!(
        "`{python} -c 'import mcp.server.mcpserver'` failed: install the official MCP Python SDK \
         with `pip install mcp` (or point LOOM_TEST_PYTHON at a python that has it)"
    );
    if std::env::var("LOOM_REQUIRE_SERVICES").as_deref() == Ok("1") {
        panic!("{test}: {message}");
    }
    eprintln!("SKIPPED {test}: {message}");
    None
}

/// `tests/servers/<file>`.
pub fn server_script(file: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/servers")
        .join(file)
        .display()
        .to_string()
}

/// Options for the Python test server over stdio.
pub fn py_stdio_options(name: &str, python: &str, extra: &[&str]) -> McpServerOptions {
    let mut args = vec![server_script("py_server.py"), "--log-stderr".to_owned()];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let mut options = McpServerOptions::new(
        name,
        Transport::Stdio {
            command: python.to_owned(),
            args,
            env: BTreeMap::from([("PYTHONUNBUFFERED".to_owned(), "1".to_owned())]),
            cwd: None,
        },
    );
    options.connect_timeout = Duration::from_secs(20);
    options
}

/// Options for an HTTP+SSE server (`url`: its SSE endpoint).
pub fn sse_options(name: &str, url: &str, headers: Vec<(String, String)>) -> McpServerOptions {
    let mut options = McpServerOptions::new(
        name,
        Transport::Sse {
            url: url.to_owned(),
            headers,
        },
    );
    options.connect_timeout = Duration::from_secs(10);
    options
}

/// Options for an HTTP server.
pub fn http_options(name: &str, url: &str, headers: Vec<(String, String)>) -> McpServerOptions {
    let mut options = McpServerOptions::new(
        name,
        Transport::Http {
            url: url.to_owned(),
            headers,
        },
    );
    options.connect_timeout = Duration::from_secs(10);
    options
}

/// A Python test server serving streamable HTTP or HTTP+SSE; killed when dropped.
pub struct PyHttp {
    pub child: tokio::process::Child,
    pub url: String,
}

/// Starts `py_server.py --http --port 0` and reads the port it prints.
pub async fn start_py_http(python: &str, extra: &[&str]) -> PyHttp {
    start_py_served(python, "--http", "/mcp", extra).await
}

/// Starts `py_server.py --sse --port 0` (the older HTTP+SSE transport; `url` is the stream's).
pub async fn start_py_sse(python: &str, extra: &[&str]) -> PyHttp {
    start_py_served(python, "--sse", "/sse", extra).await
}

async fn start_py_served(python: &str, mode: &str, path: &str, extra: &[&str]) -> PyHttp {
    let mut child = tokio::process::Command::new(python)
        .arg(server_script("py_server.py"))
        .args([mode, "--port", "0"])
        .args(extra)
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start the Python HTTP server");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("the Python HTTP server prints its port within 20 s")
        .unwrap()
        .expect("a PORT line");
    let port: u16 = line
        .strip_prefix("PORT ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    // Keep draining stdout so the server never blocks on it.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    PyHttp {
        child,
        url: format!("http://127.0.0.1:{port}{path}"),
    }
}

pub fn source_ctx(tenant: &str, run: &str) -> SourceContext {
    SourceContext {
        tenant_id: tenant.to_owned(),
        session_id: format!("session-{run}"),
        run_id: run.to_owned(),
    }
}

pub fn tool_ctx(run: &str, call: &str) -> ToolContext {
    ToolContext {
        tenant_id: "default".to_owned(),
        session_id: format!("session-{run}"),
        run_id: run.to_owned(),
        call_id: call.to_owned(),
        idempotency_key: format!("key-{run}-{call}"),
        traceparent: None,
    }
}

pub fn find(tools: &[Arc<dyn Tool>], name: &str) -> Arc<dyn Tool> {
    tools
        .iter()
        .find(|tool| tool.spec().name == name)
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "no tool {name} in {:?}",
                tools
                    .iter()
                    .map(|t| t.spec().name.clone())
                    .collect::<Vec<_>>()
            )
        })
}

/// Runs a test body with an overall limit, so nothing can hang CI.
pub async fn bounded<T>(limit: Duration, body: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, body)
        .await
        .unwrap_or_else(|_| panic!("test did not finish within {limit:?}"))
}

/// Polls `condition` until it holds, or panics after `limit` naming `what`
/// ([`loom_testkit::wait`]).
pub async fn eventually(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    if let Err(timed_out) = loom_testkit::wait::poll_within(what, limit, async || condition()).await
    {
        panic!("{timed_out}");
    }
}

/// Whether a process is still running (a zombie counts as exited).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // Field 3 (after the parenthesised name) is the state.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .unwrap_or("?");
            state != "Z" && state != "X"
        }
        Err(_) => false,
    }
}

/// Lines of a file (0 when absent).
pub fn line_count(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

/// A scratch directory under the target dir, unique per test.
pub fn scratch(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("loom-mcp-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Everything logged on the capturing thread (see [`capture_logs`]).
#[derive(Clone, Default)]
pub struct Captured(pub Arc<Mutex<Vec<u8>>>);

/// Captures what the calling thread logs at `level` and above, as text, until the guard is
/// dropped (a thread default: other threads, and so other tests, keep logging nowhere). Run
/// the code under test on a current-thread runtime of this thread.
///
/// `tracing` caches, per callsite and for the whole process, whether any subscriber wants it;
/// while a single `Dispatch` exists, it asks the default subscriber of whichever thread
/// reaches the callsite first. A test thread without a subscriber reaching the
/// `loom_mcp::stderr` line first would cache "never" for every thread, and this capture would
/// miss its own line (tokio-rs/tracing#3611, #2874). So an inert second `Dispatch` is kept for
/// the life of the test binary first: with two, `tracing` asks every registered one.
pub fn capture_logs(level: tracing::Level) -> (Captured, tracing::subscriber::DefaultGuard) {
    static SECOND_DISPATCH: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
    SECOND_DISPATCH
        .get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(level)
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    (captured, guard)
}

impl Captured {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Scope shorthand.
pub fn with_scope(mut options: McpServerOptions, scope: Scope) -> McpServerOptions {
    options.scope = scope;
    options
}
