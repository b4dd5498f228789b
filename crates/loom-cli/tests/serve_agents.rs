//! An agent's own endpoints (`expose.http`) through the real `loom serve` binary: each mount
//! logged once at WARN with its security state, `POST /agents/{name}/stream` read by reqwest
//! and a real SSE parser (`sse-stream`: the five names, the order, one terminal frame),
//! `POST /agents/{name}/run`, the refusals (401 without a key, 404, 400), an anonymous agent,
//! `/health` and `/ready`, `?deltas=true` on `/v1`; and a configuration whose agent opts in
//! without an authenticator, refused with a located message.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{process::Command, time::Duration};

use common::{loom_bin, server::Server};
use futures_util::StreamExt;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const SERVE: &[&str] = &["--config", "loom.yaml", "serve", "--port", "0"];
const KEY: &str = "lk_front-0000000000000000000000000000000000000";

const MODELS: &str = "\
version: 1
models:
  - id: fake-clock
    sdk: fake
    model: FAKE
    params:
      script:
        - text: Je regarde l'heure.
          tool_calls:
            - name: current_datetime
              arguments: {}
        - text: \"Voici l'heure exacte : {{ tool_result }}.\"
  - id: fake-hello
    sdk: fake
    model: FAKE
    params:
      script:
        - text: Bonjour à vous.
storage:
  events: {backend: jsonl, path: data}
telemetry:
  logging: {level: WARN}
";

fn config() -> String {
    let hash = hex::encode(Sha256::digest(KEY.as_bytes()));
    format!(
        "{MODELS}agents:
  - name: clock
    main: {{model: fake-clock}}
    tools:
      - tool: loom.current_datetime
    expose:
      http: {{enabled: true, auth: keys, heartbeat_ms: 1000}}
  - name: hello
    main: {{model: fake-hello}}
    expose:
      http: {{enabled: true, auth: none, allow_anonymous: true}}
  - name: quiet
    main: {{model: fake-hello}}
security:
  api_keys:
    - {{id: front, hash: \"sha256:{hash}\", scopes: [run, read, read_content]}}
"
    )
}

fn project(config: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("loom.yaml"), config).unwrap();
    dir
}

/// `log` without its terminal colours.
fn plain(log: &str) -> String {
    let mut out = String::new();
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // `ESC [ … m`
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The events of a stream, read to its end: `(name, data)`.
async fn read_events(response: reqwest::Response) -> Vec<(String, Value)> {
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut stream = sse_stream::SseStream::from_bytes_stream(response.bytes_stream());
    let mut events = Vec::new();
    while let Some(event) = tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .expect("the stream stalled")
    {
        let event = event.unwrap();
        let data = serde_json::from_str(event.data.as_deref().unwrap()).unwrap();
        events.push((event.event.unwrap(), data));
    }
    events
}

#[tokio::test(flavor = "multi_thread")]
async fn loom_serve_mounts_agent_endpoints_that_stream_and_answer() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = project(&config());
    let server = Server::start(&loom_bin(), dir.path(), SERVE);
    let base = format!("http://{}", server.address);
    let client = reqwest::Client::new();

    // Each mount is logged once at WARN, with its security state.
    let log = plain(&server.log());
    for (agent, state) in [
        ("clock", "security=\"authenticated: API key required\""),
        (
            "hello",
            "security=\"anonymous: no authenticator, anyone may run the agent\"",
        ),
    ] {
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(&format!("agent={agent} access=\"http\"")))
            .collect();
        assert_eq!(lines.len(), 1, "{agent}: {log}");
        assert!(
            lines[0].contains("WARN") && lines[0].contains(state),
            "{}",
            lines[0]
        );
        assert!(
            lines[0].contains(&format!("endpoints=/agents/{agent}/{{run,stream}}")),
            "{}",
            lines[0]
        );
    }
    assert!(!log.contains("agent=quiet access=\"http\""), "{log}");

    // The stream: the five names only, in order, one terminal frame.
    let response = client
        .post(format!("{base}/agents/clock/stream"))
        .bearer_auth(KEY)
        .json(&json!({"message": "Quelle heure est-il ?", "session_id": "s-clock"}))
        .send()
        .await
        .unwrap();
    let events = read_events(response).await;
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    let five = ["text_delta", "tool_call", "tool_result", "error", "final"];
    assert!(names.iter().all(|n| five.contains(n)), "{names:?}");
    let terminals = names
        .iter()
        .filter(|n| ["final", "error"].contains(n))
        .count();
    assert_eq!(terminals, 1, "{names:?}");
    assert_eq!(names.last(), Some(&"final"), "{names:?}");
    let call = names.iter().position(|n| *n == "tool_call").unwrap();
    let result = names.iter().position(|n| *n == "tool_result").unwrap();
    assert!(names[..call].contains(&"text_delta"), "{names:?}");
    assert!(call < result, "{names:?}");
    assert!(
        names[result..]
            .iter()
            .filter(|n| **n == "text_delta")
            .count()
            > 3,
        "{names:?}"
    );
    assert_eq!(events[call].1["tool_name"], "current_datetime");
    assert_eq!(events[result].1["call_id"], events[call].1["call_id"]);
    let streamed: String = events[result..]
        .iter()
        .filter(|(name, _)| name == "text_delta")
        .map(|(_, data)| data["text"].as_str().unwrap())
        .collect();
    let last = &events.last().unwrap().1;
    assert_eq!(last["status"], "completed");
    assert_eq!(last["text"], streamed.as_str());
    assert!(
        streamed.starts_with("Voici l'heure exacte : "),
        "{streamed}"
    );
    // The run is journaled like any other.
    assert!(dir.path().join("data/default/s-clock.jsonl").exists());

    // Without a key: 401. An agent that did not opt in: 404. A bad body: 400.
    let refused = |path: &str, body: Value| client.post(format!("{base}{path}")).json(&body).send();
    let response = refused("/agents/clock/run", json!({"message": "Salut"}))
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(
        response.json::<Value>().await.unwrap()["error"]["kind"],
        "missing_key"
    );
    let response = refused("/agents/quiet/stream", json!({"message": "Salut"}))
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(
        response.json::<Value>().await.unwrap()["error"]["kind"],
        "unknown_agent"
    );
    let response = refused("/agents/hello/run", json!({"msg": "Salut"}))
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    assert!(
        error["error"]["message"].as_str().unwrap().contains("msg"),
        "{error}"
    );

    // Anonymous allowed: the JSON result.
    let response = refused(
        "/agents/hello/run",
        json!({"message": "Salut", "run_id": "r-hello"}),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 200);
    let result: Value = response.json().await.unwrap();
    assert_eq!(result["run_id"], "r-hello");
    assert_eq!(result["status"], "completed");
    assert_eq!(result["text"], "Bonjour à vous.");
    assert!(
        result["usage"]["output_tokens"].as_u64().unwrap() > 0,
        "{result}"
    );

    // Liveness and readiness, without a key.
    let health = client.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(
        health.json::<Value>().await.unwrap(),
        json!({"status": "ok"})
    );
    let ready = client.get(format!("{base}/ready")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let ready: Value = ready.json().await.unwrap();
    assert_eq!(ready["status"], "ready");
    assert!(
        ready["checks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["ok"] == true),
        "{ready}"
    );

    // `/v1` keeps its behaviour; its run events add text deltas when asked.
    let response = client
        .post(format!("{base}/v1/agents/clock/runs"))
        .bearer_auth(KEY)
        .json(&json!({"message": "Quelle heure ?", "run_id": "r-v1", "background": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let followed = client
        .get(format!("{base}/v1/runs/r-v1/events?deltas=true"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    let followed = read_events(followed).await;
    let names: Vec<&str> = followed.iter().map(|(name, _)| name.as_str()).collect();
    assert!(names.contains(&"run.completed"), "{names:?}");
    assert!(names.contains(&"model.responded"), "{names:?}");
    // The run may have streamed its first answer before the client followed: the second one,
    // after the tool's result, is there whole or in part.
    assert!(names.contains(&"text_delta"), "{names:?}");

    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
}

#[test]
fn an_agent_exposed_without_an_authenticator_is_refused_with_its_location() {
    let dir = project(&format!(
        "{MODELS}agents:
  - name: front
    main: {{model: fake-hello}}
    expose:
      http: {{enabled: true}}
"
    ));
    for args in [&["--config", "loom.yaml", "validate"][..], SERVE] {
        let output = Command::new(loom_bin())
            .current_dir(dir.path())
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}: {stderr}");
        assert!(
            stderr.contains(
                "loom.yaml:27:13 agents[0].expose.http.auth: agent 'front' opts in to its own \
                 HTTP endpoints (expose.http.enabled) but auth: keys needs at least one API key \
                 in security.api_keys, and none is declared: declare a key, or set \
                 expose.http.allow_anonymous: true to serve anyone"
            ),
            "{args:?}: {stderr}"
        );
    }
}
