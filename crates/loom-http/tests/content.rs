//! No route leaks content to a key without `read_content`, through a real socket.
//!
//! Every operation of the served OpenAPI document is listed below with a request made by a key
//! that may do what the route needs but lacks `read_content`; a route the document holds and
//! the list does not fails the test, so a new route must say how it answers such a key. One
//! marker is written into everything a run holds as content (the message, the answer, a
//! tool's arguments, an approval's reason, a file's name), and no answer of any route, JSON,
//! NDJSON or Server-Sent Events, may hold it; the routes whose answers carry content fields
//! must say what they removed (`redacted`), and a file's bytes are refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::PNG;
use futures_util::StreamExt;
use loom_ia::{
    Attachment, Loom, RunOptions, RunStatus,
    config::{
        AgentSpec, ApiKeySpec, Config, EventsBackend, HttpServerConfig, LoomConfig, ModelSpec,
        Scope, Sdk, ToolRef, TriggerSpec,
    },
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// What no answer to a key without `read_content` may hold.
const MARKER: &str = "SECRET-7f3a";
/// `run`, `read` and `approve`, not `read_content`.
const WRITER: &str = "lk_writer-0000000000000000000000000000000000";
/// `read` only.
const READER: &str = "lk_reader-0000000000000000000000000000000000";

/// Sends a quote (a human approves every call).
#[loom_ia::tool(side_effects = "irreversible", approval = "always")]
fn envoyer(client: String) -> String {
    format!("devis envoyé à {client}")
}

fn key(id: &str, secret: &str, scopes: &[Scope]) -> ApiKeySpec {
    ApiKeySpec {
        id: id.into(),
        hash: loom_http::key_hash(secret),
        tenant: "acme".into(),
        expires: None,
        scopes: scopes.to_vec(),
        rate_limit: None,
        agents: Vec::new(),
    }
}

fn model(id: &str, script: Value) -> ModelSpec {
    let mut model = ModelSpec::new(id, Sdk::Fake, "FAKE");
    model.params.insert("script".into(), script);
    model
}

fn config(dir: &std::path::Path) -> Config {
    let echo = AgentSpec::new("echo", "fake-echo");
    let mut devis = AgentSpec::new("devis", "fake-devis");
    devis.tools = vec![ToolRef::new("envoyer")];
    let mut raw = LoomConfig {
        models: vec![
            model(
                "fake-echo",
                json!([{"text": format!("La réponse est {MARKER}.")}]),
            ),
            model(
                "fake-devis",
                json!([
                    {"text": format!("J'envoie à {MARKER}."), "tool_calls": [{"name": "envoyer", "arguments": {"client": MARKER}}]},
                    {"text": format!("Fait : {MARKER}.")}
                ]),
            ),
        ],
        agents: vec![echo, devis],
        triggers: vec![TriggerSpec::new("ping", "echo", "Ping {{ payload.text }}")],
        ..LoomConfig::default()
    };
    raw.tenants = vec![loom_ia::config::TenantSpec::new("acme")];
    raw.security.api_keys = vec![
        key("writer", WRITER, &[Scope::Run, Scope::Read, Scope::Approve]),
        key("reader", READER, &[Scope::Read]),
    ];
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("journal".into());
    raw.sessions.compaction = Some(loom_ia::config::CompactionConfig {
        model: "fake-echo".into(),
        over_tokens: 100_000,
        hard_tokens: 200_000,
        keep_last: 6,
        fidelity_check: true,
        blocking: false,
        system_file: None,
    });
    Config::new(raw, dir.to_path_buf()).unwrap()
}

/// One request: method, path under `/v1` (with its ids), key, JSON body.
struct Call {
    method: Method,
    path: String,
    key: &'static str,
    body: Option<Value>,
}

fn call(method: Method, path: &str, key: &'static str, body: Option<Value>) -> Call {
    Call {
        method,
        path: path.to_owned(),
        key,
        body,
    }
}

/// What a key without `read_content` reads of a route.
enum Answer {
    /// Content fields removed and listed in `redacted` (a JSON body, NDJSON lines, SSE data).
    Masked,
    /// No content field in the answer (ids, statuses, counts, names from the configuration).
    Contentless,
    /// Refused with this status (a file's bytes).
    Refused(StatusCode),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_route_answers_content_to_a_key_without_read_content() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let loom = Loom::new(config(dir.path())).unwrap();
    loom.register("envoyer", envoyer_tool()).unwrap();
    // The journal: an answer with a file, and a run paused on an approval.
    let options = |session: &str, run: &str, attachments| RunOptions {
        tenant_id: Some("acme".into()),
        session_id: Some(session.into()),
        run_id: Some(run.into()),
        attachments,
        ..RunOptions::default()
    };
    let file = Attachment {
        name: format!("{MARKER}.png"),
        media_type: "image/png".into(),
        bytes: PNG.to_vec(),
    };
    let answered = loom
        .run(
            "echo",
            format!("Dis {MARKER}"),
            options("s-echo", "r-echo", vec![file]),
        )
        .await
        .unwrap();
    assert_eq!(answered.status, RunStatus::Completed);
    for (session, run) in [("s-devis", "r-devis"), ("s-devis-2", "r-devis-2")] {
        let paused = loom
            .run(
                "devis",
                format!("Envoie à {MARKER}"),
                options(session, run, Vec::new()),
            )
            .await
            .unwrap();
        assert_eq!(paused.status, RunStatus::Paused);
    }
    let files = loom
        .session_files("s-echo", &[], Some("acme"))
        .await
        .unwrap();
    let stored = files[0].file.clone();

    let (listener, address) = loom_http::bind("127.0.0.1", 0).await.unwrap();
    let served = loom.clone();
    tokio::spawn(async move {
        let settings = HttpServerConfig::default();
        loom_http::serve(served, listener, &settings, std::future::pending()).await
    });
    let base = format!("http://{address}");
    let client = reqwest::Client::new();

    let mut routes: Vec<(&str, &str, Answer, Vec<Call>)> = vec![
        (
            "get",
            "/v1/healthz",
            Answer::Contentless,
            vec![call(Method::GET, "/healthz", READER, None)],
        ),
        (
            "get",
            "/v1/readyz",
            Answer::Contentless,
            vec![call(Method::GET, "/readyz", READER, None)],
        ),
        (
            "get",
            "/v1/agents",
            Answer::Contentless,
            vec![call(Method::GET, "/agents", READER, None)],
        ),
        (
            "post",
            "/v1/agents/{name}/runs",
            Answer::Masked,
            vec![call(
                Method::POST,
                "/agents/echo/runs",
                WRITER,
                Some(json!({"message": format!("Encore {MARKER}"), "session_id": "s-sync"})),
            )],
        ),
        (
            "get",
            "/v1/runs/{run_id}",
            Answer::Masked,
            vec![
                call(Method::GET, "/runs/r-echo?session_id=s-echo", READER, None),
                call(
                    Method::GET,
                    "/runs/r-devis?session_id=s-devis",
                    READER,
                    None,
                ),
            ],
        ),
        (
            "get",
            "/v1/runs/{run_id}/events",
            Answer::Masked,
            vec![call(
                Method::GET,
                "/runs/r-echo/events?session_id=s-echo",
                READER,
                None,
            )],
        ),
        (
            "get",
            "/v1/runs",
            Answer::Contentless,
            vec![call(Method::GET, "/runs", READER, None)],
        ),
        (
            "get",
            "/v1/events",
            Answer::Masked,
            vec![call(Method::GET, "/events?limit=10000", READER, None)],
        ),
        (
            "get",
            "/v1/traces/{run_id}",
            Answer::Masked,
            vec![
                call(
                    Method::GET,
                    "/traces/r-echo?session_id=s-echo",
                    READER,
                    None,
                ),
                call(
                    Method::GET,
                    "/traces/r-devis?session_id=s-devis",
                    READER,
                    None,
                ),
            ],
        ),
        (
            "get",
            "/v1/sessions",
            Answer::Contentless,
            vec![call(Method::GET, "/sessions", READER, None)],
        ),
        (
            "get",
            "/v1/sessions/{session_id}",
            Answer::Masked,
            vec![call(Method::GET, "/sessions/s-devis", READER, None)],
        ),
        (
            "get",
            "/v1/sessions/{session_id}/events",
            Answer::Masked,
            vec![call(Method::GET, "/sessions/s-echo/events", READER, None)],
        ),
        (
            "get",
            "/v1/sessions/{session_id}/files",
            Answer::Masked,
            vec![call(Method::GET, "/sessions/s-echo/files", READER, None)],
        ),
        (
            "get",
            "/v1/sessions/{session_id}/files/{file}",
            Answer::Refused(StatusCode::FORBIDDEN),
            vec![call(
                Method::GET,
                &format!("/sessions/s-echo/files/{stored}"),
                READER,
                None,
            )],
        ),
        (
            "get",
            "/v1/sessions/{session_id}/state",
            Answer::Refused(StatusCode::FORBIDDEN),
            vec![call(Method::GET, "/sessions/s-echo/state", READER, None)],
        ),
        (
            "get",
            "/v1/sessions/{session_id}/report",
            Answer::Contentless,
            vec![call(Method::GET, "/sessions/s-echo/report", READER, None)],
        ),
        (
            "post",
            "/v1/hooks/{name}",
            Answer::Contentless,
            vec![call(
                Method::POST,
                "/hooks/ping",
                WRITER,
                Some(json!({"text": MARKER})),
            )],
        ),
        (
            "post",
            "/v1/runs/{run_id}/approve",
            Answer::Contentless,
            vec![call(
                Method::POST,
                "/runs/r-devis/approve",
                WRITER,
                Some(json!({"reason": MARKER})),
            )],
        ),
        (
            "post",
            "/v1/runs/{run_id}/reject",
            Answer::Contentless,
            vec![call(
                Method::POST,
                "/runs/r-devis-2/reject",
                WRITER,
                Some(json!({})),
            )],
        ),
        (
            "post",
            "/v1/runs/{run_id}/cancel",
            Answer::Contentless,
            vec![call(Method::POST, "/runs/r-echo/cancel", WRITER, None)],
        ),
        // What a compaction did, never the summary (a session this short has nothing to
        // summarize; the outcome says so).
        (
            "post",
            "/v1/sessions/{session_id}/compact",
            Answer::Contentless,
            vec![call(Method::POST, "/sessions/s-echo/compact", WRITER, None)],
        ),
        // Erasure needs `admin`, which reads content anyway.
        (
            "delete",
            "/v1/sessions/{session_id}",
            Answer::Refused(StatusCode::FORBIDDEN),
            vec![call(Method::DELETE, "/sessions/s-sync", WRITER, None)],
        ),
    ];

    // The list is the document's: every operation, none more.
    let document: Value = client
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut documented: Vec<(String, String)> = document["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .filter(|method| {
                    ["get", "post", "put", "patch", "delete"].contains(&method.as_str())
                })
                .map(move |method| (method.clone(), path.clone()))
        })
        .collect();
    documented.sort();
    let mut listed: Vec<(String, String)> = routes
        .iter()
        .map(|(method, path, _, _)| ((*method).to_owned(), (*path).to_owned()))
        .collect();
    listed.sort();
    assert_eq!(
        listed, documented,
        "every documented route must say what a key without read_content reads of it"
    );

    for (method, template, answer, calls) in routes.drain(..) {
        for request in calls {
            let mut builder = client
                .request(request.method.clone(), format!("{base}/v1{}", request.path))
                .header("Authorization", format!("Bearer {}", request.key));
            if let Some(body) = &request.body {
                builder = builder.json(body);
            }
            let response = builder.send().await.unwrap();
            let status = response.status();
            let is_sse = response
                .headers()
                .get("content-type")
                .is_some_and(|t| t.to_str().unwrap().starts_with("text/event-stream"));
            let text = if is_sse {
                read_stream(response).await
            } else {
                response.text().await.unwrap()
            };
            let what = format!("{method} {template} ({})", request.path);
            assert!(!text.contains(MARKER), "{what} leaks content: {text}");
            match answer {
                Answer::Refused(expected) => assert_eq!(status, expected, "{what}: {text}"),
                Answer::Contentless => {
                    assert!(status.is_success(), "{what}: {status} {text}");
                }
                Answer::Masked => {
                    assert!(status.is_success(), "{what}: {status} {text}");
                    assert!(
                        text.contains("\"redacted\""),
                        "{what} says nothing of what it removed: {text}"
                    );
                }
            }
        }
    }
}

/// The whole body of a Server-Sent Events answer (the stream ends after the run's last event).
async fn read_stream(response: reqwest::Response) -> String {
    let mut body = response.bytes_stream();
    let mut text = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(30), body.next()).await {
            Ok(Some(chunk)) => text.extend_from_slice(&chunk.unwrap()),
            Ok(None) => break,
            Err(_) => panic!("the event stream did not end"),
        }
    }
    String::from_utf8(text).unwrap()
}
