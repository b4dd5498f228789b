//! An agent's own endpoints (`expose.http`) through a real socket: `loom_http::serve` on
//! 127.0.0.1:0, driven by reqwest, the streams parsed by a real SSE parser (`sse-stream`) while
//! their raw bytes are kept to count the heartbeat comments. Event names, their order, the
//! single terminal frame, heartbeats, the tool's full payload, the JSON route, the refusals (no
//! key 401, a scope 403, an agent that did not opt in 404, a bad body 400 naming the field),
//! anonymous callers, `/health` and `/ready`; and `GET /v1/runs/{id}/events?deltas=true`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures_util::StreamExt;
use loom_ia::{
    Loom, ToolOutput,
    config::{
        AgentSpec, ApiKeySpec, Config, EventsBackend, HttpAuth, HttpExpose, HttpServerConfig,
        LoomConfig, ModelSpec, Scope, Sdk, ToolRef,
    },
};
use reqwest::StatusCode;
use serde_json::{Value, json};

const RUN_KEY: &str = "lk_run-front-0000000000000000000000000000000";
const NO_CONTENT_KEY: &str = "lk_no-content-000000000000000000000000000000";
const READ_KEY: &str = "lk_read-front-000000000000000000000000000000";

/// Counts a shop's stock of an article: a short view for the model, the whole record for the
/// interface.
#[loom_ia::tool]
async fn stock(article: String) -> ToolOutput {
    // Long enough for a few heartbeats of a 40 ms stream.
    tokio::time::sleep(Duration::from_millis(400)).await;
    ToolOutput::views(
        format!("12 {article}"),
        json!({"article": article, "quantity": 12, "warehouses": [{"name": "Lyon", "quantity": 7}, {"name": "Nantes", "quantity": 5}]}),
    )
}

fn model(id: &str, script: Value) -> ModelSpec {
    let mut model = ModelSpec::new(id, Sdk::Fake, "FAKE");
    model.params.insert("script".into(), script);
    model
}

fn key(id: &str, secret: &str, scopes: &[Scope]) -> ApiKeySpec {
    ApiKeySpec {
        id: id.into(),
        hash: loom_http::key_hash(secret),
        tenant: "default".into(),
        expires: None,
        scopes: scopes.to_vec(),
        agents: Vec::new(),
        rate_limit: None,
    }
}

fn http(auth: HttpAuth, allow_anonymous: bool, heartbeat_ms: Option<u64>) -> Option<HttpExpose> {
    Some(HttpExpose {
        enabled: true,
        auth,
        allow_anonymous,
        heartbeat_ms,
    })
}

fn config(dir: &std::path::Path) -> Config {
    // Keys only, heartbeats every 40 ms.
    let mut shop = AgentSpec::new("shop", "fake-shop");
    shop.tools = vec![ToolRef::new("stock")];
    shop.expose.http = http(HttpAuth::Keys, false, Some(40));
    // Anyone, no authenticator.
    let mut public = AgentSpec::new("public", "fake-echo");
    public.expose.http = http(HttpAuth::None, true, None);
    // Keys accepted, not required.
    let mut mixed = AgentSpec::new("mixed", "fake-echo");
    mixed.expose.http = http(HttpAuth::Keys, true, None);
    let mut broken = AgentSpec::new("broken", "fake-broken");
    broken.expose.http = http(HttpAuth::None, true, None);
    // On `/v1` only.
    let mut plain = AgentSpec::new("plain", "fake-shop");
    plain.tools = vec![ToolRef::new("stock")];
    let mut raw = LoomConfig {
        models: vec![
            model(
                "fake-shop",
                json!([
                    {"text": "Je regarde le stock.", "tool_calls": [{"name": "stock", "arguments": {"article": "vis"}}]},
                    {"text": "Il reste {{ tool_result }} en stock, bonne journée."}
                ]),
            ),
            model("fake-echo", json!([{"text": "Bonjour à vous."}])),
            model("fake-broken", json!([{"error": "auth"}])),
        ],
        agents: vec![shop, public, mixed, broken, plain],
        ..LoomConfig::default()
    };
    raw.security.api_keys = vec![
        key(
            "run",
            RUN_KEY,
            &[Scope::Run, Scope::Read, Scope::ReadContent],
        ),
        key("no-content", NO_CONTENT_KEY, &[Scope::Run, Scope::Read]),
        key("read", READ_KEY, &[Scope::Read]),
    ];
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("journal".into());
    Config::new(raw, dir.to_path_buf()).unwrap()
}

struct Server {
    base: String,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start() -> Server {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let loom = Loom::new(config(dir.path())).unwrap();
        loom.register("stock", stock_tool()).unwrap();
        let (listener, address) = loom_http::bind("127.0.0.1", 0).await.unwrap();
        let settings = HttpServerConfig {
            base_path: "/api".into(),
            ..HttpServerConfig::default()
        };
        tokio::spawn(async move {
            loom_http::serve(loom, listener, &settings, std::future::pending()).await
        });
        Server {
            base: format!("http://{address}/api"),
            client: reqwest::Client::new(),
            _dir: dir,
        }
    }

    async fn post(&self, path: &str, key: Option<&str>, body: &str) -> reqwest::Response {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        request.send().await.unwrap()
    }

    async fn json(&self, path: &str, key: Option<&str>, body: &str) -> (StatusCode, Value) {
        let response = self.post(path, key, body).await;
        let status = response.status();
        (status, response.json().await.unwrap())
    }
}

/// A stream read to its end: its events (by a real SSE parser) and its raw text.
struct Read {
    events: Vec<sse_stream::Sse>,
    raw: String,
}

impl Read {
    /// The names of the events, in order.
    fn names(&self) -> Vec<&str> {
        self.events
            .iter()
            .map(|e| e.event.as_deref().expect("every frame is named"))
            .collect()
    }

    /// The JSON data of the events named `name`.
    fn data(&self, name: &str) -> Vec<Value> {
        self.events
            .iter()
            .filter(|e| e.event.as_deref() == Some(name))
            .map(|e| serde_json::from_str(e.data.as_deref().unwrap()).unwrap())
            .collect()
    }
}

async fn read(response: reqwest::Response) -> Read {
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let raw = Arc::new(Mutex::new(Vec::new()));
    let kept = raw.clone();
    let bytes = response.bytes_stream().inspect(move |chunk| {
        if let Ok(chunk) = chunk {
            kept.lock().unwrap().extend_from_slice(chunk);
        }
    });
    let mut parsed = sse_stream::SseStream::from_bytes_stream(bytes);
    let mut events = Vec::new();
    while let Some(event) = tokio::time::timeout(Duration::from_secs(20), parsed.next())
        .await
        .expect("the stream stalled")
    {
        events.push(event.unwrap());
    }
    let raw = String::from_utf8(raw.lock().unwrap().clone()).unwrap();
    Read { events, raw }
}

const FIVE: [&str; 5] = ["text_delta", "tool_call", "tool_result", "error", "final"];

#[tokio::test]
async fn the_stream_sends_named_events_in_order_one_terminal_frame_and_heartbeats() {
    let server = Server::start().await;
    let response = server
        .post(
            "/agents/shop/stream",
            Some(RUN_KEY),
            r#"{"message": "Combien de vis ?", "session_id": "s-stream"}"#,
        )
        .await;
    let stream = read(response).await;
    let names = stream.names();
    assert!(names.iter().all(|n| FIVE.contains(n)), "{names:?}");
    // Every data is a JSON object: the name is never inside it.
    for event in &stream.events {
        let data: Value = serde_json::from_str(event.data.as_deref().unwrap()).unwrap();
        assert!(data.is_object(), "{data}");
        assert!(
            data.get("event").is_none() && data.get("type").is_none(),
            "{data}"
        );
        assert!(event.id.is_none(), "{event:?}");
    }
    // Exactly one terminal frame, the last one.
    let terminals: Vec<usize> = names
        .iter()
        .enumerate()
        .filter(|(_, n)| ["final", "error"].contains(n))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(terminals, vec![names.len() - 1], "{names:?}");
    assert_eq!(names.last(), Some(&"final"));

    // The order: the first answer's deltas, the call, its result, the second answer's deltas.
    let call = names.iter().position(|n| *n == "tool_call").unwrap();
    let result = names.iter().position(|n| *n == "tool_result").unwrap();
    assert!(call < result, "{names:?}");
    let before: String = stream.events[..call]
        .iter()
        .filter(|e| e.event.as_deref() == Some("text_delta"))
        .map(|e| {
            serde_json::from_str::<Value>(e.data.as_deref().unwrap()).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(before, "Je regarde le stock.");
    let after: Vec<Value> = stream.events[result..]
        .iter()
        .filter(|e| e.event.as_deref() == Some("text_delta"))
        .map(|e| serde_json::from_str(e.data.as_deref().unwrap()).unwrap())
        .collect();
    assert!(after.len() > 3, "streamed in several deltas: {after:?}");
    let answer: String = after.iter().map(|d| d["text"].as_str().unwrap()).collect();
    assert_eq!(answer, "Il reste 12 vis en stock, bonne journée.");

    // The call and its result; the result carries the full payload the model never saw.
    let call = &stream.data("tool_call")[0];
    assert_eq!(call["tool_name"], "stock");
    assert_eq!(call["arguments"], json!({"article": "vis"}));
    let result = &stream.data("tool_result")[0];
    assert_eq!(result["call_id"], call["call_id"]);
    assert_eq!(result["is_error"], false);
    assert_eq!(result["model_view"], "12 vis");
    assert_eq!(result["full"]["warehouses"][0]["name"], "Lyon");
    assert_eq!(result["full"]["quantity"], 12);

    // The final frame is the run's result.
    let last = &stream.data("final")[0];
    assert_eq!(last["status"], "completed");
    assert_eq!(last["text"], answer);
    assert_eq!(last["session_id"], "s-stream");
    assert_eq!(last["iterations"], 2);
    assert!(
        last["usage"]["input_tokens"].as_u64().unwrap() > 0,
        "{last}"
    );
    assert!(last["run_id"].as_str().is_some_and(|id| !id.is_empty()));

    // Heartbeat comments while the tool worked (400 ms, one every 40 ms), before the end.
    let end = stream.raw.find("event: final").unwrap();
    let heartbeats = stream.raw[..end].matches("\n: heartbeat\n").count()
        + usize::from(stream.raw.starts_with(": heartbeat\n"));
    assert!(
        heartbeats >= 2,
        "{heartbeats} heartbeats in\n{}",
        stream.raw
    );
}

#[tokio::test]
async fn a_failed_run_ends_its_stream_with_one_error_frame() {
    let server = Server::start().await;
    let stream = read(
        server
            .post("/agents/broken/stream", None, r#"{"message": "Salut"}"#)
            .await,
    )
    .await;
    assert_eq!(stream.names(), vec!["error"], "{}", stream.raw);
    let error = &stream.data("error")[0];
    assert_eq!(error["error"]["kind"], "run_failed");
    assert!(
        !error["error"]["message"].as_str().unwrap().is_empty(),
        "{error}"
    );
    assert_eq!(error["result"]["status"], "failed");
    assert_eq!(error["run_id"], error["result"]["run_id"]);

    // A run refused once opened (its run id is taken): an error frame, nothing else.
    let body = r#"{"message": "Salut", "run_id": "twice"}"#;
    let first = read(server.post("/agents/public/stream", None, body).await).await;
    assert_eq!(first.names().last(), Some(&"final"));
    let second = read(server.post("/agents/public/stream", None, body).await).await;
    assert_eq!(second.names(), vec!["error"], "{}", second.raw);
    assert_eq!(second.data("error")[0]["error"]["kind"], "refused");
}

#[tokio::test]
async fn the_run_route_answers_the_result_as_json() {
    let server = Server::start().await;
    let (status, body) = server
        .json(
            "/agents/shop/run",
            Some(RUN_KEY),
            r#"{"message": "Combien de vis ?", "run_id": "r-json", "metadata": {"canal": "web"}}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["run_id"], "r-json");
    assert_eq!(body["status"], "completed");
    assert_eq!(body["text"], "Il reste 12 vis en stock, bonne journée.");
    assert!(
        body["usage"]["output_tokens"].as_u64().unwrap() > 0,
        "{body}"
    );
    assert!(body.get("cost_usd").is_some(), "{body}");
    // Without `read_content`, the content fields are masked as on `/v1`.
    let (status, body) = server
        .json(
            "/agents/shop/run",
            Some(NO_CONTENT_KEY),
            r#"{"message": "Combien ?"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "completed");
    assert!(body.get("text").is_none(), "{body}");
    assert!(
        body["redacted"]
            .as_array()
            .unwrap()
            .contains(&json!("text")),
        "{body}"
    );
}

#[tokio::test]
async fn callers_are_refused_or_served_as_the_agent_says() {
    let server = Server::start().await;
    let body = r#"{"message": "Salut"}"#;
    for route in ["run", "stream"] {
        let shop = format!("/agents/shop/{route}");
        // Keys required: none, unknown, a key without `run`.
        let (status, error) = server.json(&shop, None, body).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{error}");
        assert_eq!(error["error"]["kind"], "missing_key");
        let (status, error) = server.json(&shop, Some("lk_nope"), body).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{error}");
        assert_eq!(error["error"]["kind"], "unknown_key");
        let (status, error) = server.json(&shop, Some(READ_KEY), body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{error}");
        assert_eq!(error["error"]["kind"], "missing_scope");

        // Anonymous allowed: served without a key; a key presented is still checked.
        let public = format!("/agents/public/{route}");
        let response = server.post(&public, None, body).await;
        assert_eq!(response.status(), StatusCode::OK, "{route}");
        let mixed = format!("/agents/mixed/{route}");
        assert_eq!(
            server.post(&mixed, None, body).await.status(),
            StatusCode::OK
        );
        assert_eq!(
            server.post(&mixed, Some(RUN_KEY), body).await.status(),
            StatusCode::OK
        );
        let (status, error) = server.json(&mixed, Some("lk_nope"), body).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{error}");

        // An agent that did not opt in, or does not exist: 404 with a JSON error.
        for agent in ["plain", "nobody"] {
            let (status, error) = server
                .json(&format!("/agents/{agent}/{route}"), Some(RUN_KEY), body)
                .await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{error}");
            assert_eq!(error["error"]["kind"], "unknown_agent");
            assert!(
                error["error"]["message"].as_str().unwrap().contains(agent),
                "{error}"
            );
        }

        // A bad body: 400 naming the field.
        for (bad, names) in [
            (r#"{"mesage": "Salut"}"#, "mesage"),
            (r#"{}"#, "message"),
            (r#"{"message": 3}"#, "message"),
            (r#"{"message": ""}"#, "message"),
            (r#"{"message": "Salut", "metadata": [1]}"#, "metadata"),
            ("not json", "JSON"),
        ] {
            let (status, error) = server.json(&public, None, bad).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {error}");
            assert_eq!(error["error"]["kind"], "bad_request");
            let message = error["error"]["message"].as_str().unwrap();
            assert!(message.contains(names), "{bad}: {message}");
        }
    }
    // The stream is content: `read_content` is needed, the JSON route masks without it.
    let (status, error) = server
        .json("/agents/shop/stream", Some(NO_CONTENT_KEY), body)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("read_content"),
        "{error}"
    );
}

#[tokio::test]
async fn health_and_ready_answer_beside_v1_without_a_key() {
    let server = Server::start().await;
    let health = server
        .client
        .get(format!("{}/health", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    assert_eq!(
        health.json::<Value>().await.unwrap(),
        json!({"status": "ok"})
    );
    let ready = server
        .client
        .get(format!("{}/ready", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
    let ready: Value = ready.json().await.unwrap();
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["checks"][0], json!({"name": "journal", "ok": true}));
    // The same answers as `/v1/readyz`.
    let v1: Value = server
        .client
        .get(format!("{}/v1/readyz", server.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v1, ready);
}

#[tokio::test]
async fn v1_events_carry_text_deltas_only_when_asked() {
    let server = Server::start().await;
    let v1 = |path: &str| format!("{}/v1{path}", server.base);
    let open = |run_id: &'static str| {
        server
            .client
            .post(v1("/agents/plain/runs"))
            .bearer_auth(RUN_KEY)
            .json(&json!({"message": "Combien de vis ?", "run_id": run_id, "background": true}))
            .send()
    };
    // Asked: the second answer (written after the tool's 400 ms) comes as deltas too.
    assert_eq!(
        open("r-deltas").await.unwrap().status(),
        StatusCode::ACCEPTED
    );
    let response = server
        .client
        .get(v1("/runs/r-deltas/events?deltas=true"))
        .bearer_auth(RUN_KEY)
        .send()
        .await
        .unwrap();
    let stream = read(response).await;
    let names = stream.names();
    assert!(names.contains(&"run.completed"), "{names:?}");
    let deltas = stream.data("text_delta");
    assert!(deltas.len() > 3, "{names:?}");
    assert!(
        deltas.iter().all(|d| d["run_id"] == "r-deltas"),
        "{deltas:?}"
    );
    let text: String = deltas.iter().map(|d| d["text"].as_str().unwrap()).collect();
    assert!(
        text.ends_with("Il reste 12 vis en stock, bonne journée."),
        "{text}"
    );
    // Deltas have no id (not journaled); every journal event keeps its seq.
    for event in &stream.events {
        assert_eq!(
            event.id.is_none(),
            event.event.as_deref() == Some("text_delta"),
            "{event:?}"
        );
    }
    // The deltas come from the live channel as the model streams, the journal's events from
    // the follower's reads: a delta may come before an event the run wrote just before it (the
    // route's documentation says so), so only their own order is asserted, by their text.
    assert!(names.contains(&"tool.completed"), "{names:?}");

    // Not asked: the journal's events only, as before.
    assert_eq!(
        open("r-plain").await.unwrap().status(),
        StatusCode::ACCEPTED
    );
    let response = server
        .client
        .get(v1("/runs/r-plain/events"))
        .bearer_auth(RUN_KEY)
        .send()
        .await
        .unwrap();
    let stream = read(response).await;
    assert!(stream.names().contains(&"run.completed"));
    assert!(
        !stream.names().contains(&"text_delta"),
        "{:?}",
        stream.names()
    );
    assert!(stream.events.iter().all(|e| e.id.is_some()));
}
