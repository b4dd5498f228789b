//! Trace context over HTTP through the stock `loom` binary: with an OTLP exporter declared, a
//! `loom.fetch_page` call sends its span's W3C `traceparent` as an HTTP header — the trace id
//! derived from the root run, the span id from the tool call's journal span, as the exported
//! spans are — to a local page server that records it; without an exporter, no header.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::{
    fs,
    io::{Read, Write},
    net::TcpListener,
    path::Path,
    sync::{Arc, Mutex},
};

use serde_json::Value;
use sha2::{Digest, Sha256};

/// A page server on 127.0.0.1 recording the `traceparent` header of each request.
fn page_server() -> (u16, Arc<Mutex<Vec<Option<String>>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut head = Vec::new();
            let mut buffer = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buffer[..n]),
                }
            }
            let head = String::from_utf8_lossy(&head).into_owned();
            let trace = head.lines().find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("traceparent")
                    .then(|| value.trim().to_owned())
            });
            recorded.lock().unwrap().push(trace);
            let body =
                "<html><head><title>Tarifs</title></head><body><p>TVA 10 %</p></body></html>";
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, seen)
}

fn project(port: u16, exporter: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let telemetry = if exporter {
        // Nothing listens there: the export fails with a warning, the run is unaffected.
        "telemetry:\n  logging: {level: ERROR}\n  exporters:\n    - {type: otel, endpoint_env: \
         TEST_OTLP_ENDPOINT, timeout: 2}\n"
    } else {
        "telemetry:\n  logging: {level: ERROR}\n"
    };
    fs::write(
        dir.path().join("loom.yaml"),
        format!(
            r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
        - tool_calls:
            - name: fetch_page
              arguments: {{url: "http://127.0.0.1:{port}/tarifs"}}
        - text: "lu"
storage:
  events: {{backend: jsonl, path: data}}
{telemetry}agents:
  - name: lecteur
    main: {{model: fake-1}}
    tools:
      - tool: loom.fetch_page
        allow_private: true
"#
        ),
    )
    .unwrap();
    dir
}

fn run(dir: &Path, run_id: &str) {
    let out = std::process::Command::new(loom_bin())
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .env("TEST_OTLP_ENDPOINT", "http://127.0.0.1:9/")
        .args(["run", "lecteur", "lis les tarifs", "--run-id", run_id])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Every event of the journals under `dir/data`.
fn events(dir: &Path) -> Vec<Value> {
    let mut events = Vec::new();
    let mut stack = vec![dir.join("data")];
    while let Some(path) = stack.pop() {
        for entry in fs::read_dir(&path).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "jsonl") {
                let text = fs::read_to_string(&path).unwrap();
                events.extend(
                    text.lines()
                        .map(|l| serde_json::from_str::<Value>(l).unwrap()),
                );
            }
        }
    }
    events
}

/// The first `bytes` bytes of SHA-256 over `parts`, each followed by a NUL, in hex.
fn digest(parts: &[&str], bytes: usize) -> String {
    let text: String = parts.iter().map(|p| format!("{p}\0")).collect();
    Sha256::digest(text.as_bytes())[..bytes]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn fetch_page_sends_the_calls_traceparent_header_when_traces_are_exported() {
    let (port, seen) = page_server();
    let dir = project(port, true);
    run(dir.path(), "t-1");
    let journal = events(dir.path());
    let called = journal.iter().find(|e| e["type"] == "tool.called").unwrap();
    let completed = journal
        .iter()
        .find(|e| e["type"] == "tool.completed")
        .unwrap();
    assert!(
        completed.to_string().contains("TVA 10 %"),
        "the page was read: {completed}"
    );
    let expected = format!(
        "00-{}-{}-01",
        digest(&["loom/trace", "default", "t-1"], 16),
        digest(&["loom/span", called["span_id"].as_str().unwrap()], 8)
    );
    assert_eq!(seen.lock().unwrap().clone(), vec![Some(expected)]);

    // Without an exporter, no trace context leaves the process.
    let (port, seen) = page_server();
    let dir = project(port, false);
    run(dir.path(), "t-2");
    assert_eq!(seen.lock().unwrap().clone(), vec![None]);
}
