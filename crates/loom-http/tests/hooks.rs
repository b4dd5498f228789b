//! Webhooks, per-key rate limits, tenant quotas and multipart runs with attachments, through a
//! real socket: a delivery opens a background run rendered from its payload (202), a
//! redelivery finds it (200), a key over its `rate_limit` and a tenant over its quota get 429
//! with `Retry-After`, and a multipart run carries an image to a vision role, each refusal a
//! 422 naming the file and the limit (413 over `max_body_bytes`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::PNG;
use futures_util::StreamExt;
use loom_ia::{Loom, RunRef};
use reqwest::{RequestBuilder, StatusCode, header::HeaderMap};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const RUN_A: &str = "lk_run-acme-000000000000000000000000000000000";
const READ_A: &str = "lk_read-acme-00000000000000000000000000000000";
const PHOTO_A: &str = "lk_photo-acme-0000000000000000000000000000000";
const LIMITED_A: &str = "lk_limited-acme-00000000000000000000000000000";
const TIGHT: &str = "lk_tight-000000000000000000000000000000000000";

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn hash(key: &str) -> String {
    format!("sha256:{}", sha256_hex(key.as_bytes()))
}

/// `support` echoes its message; `photo` calls its vision role `decrit` when the run carries
/// an image (the role's script answers only when its message lists `photo.png`).
fn yaml() -> String {
    let orchestrator = json!([
        {"text": "Pas d'image.", "without_tool": "decrit"},
        {"tool_calls": [{"name": "decrit", "arguments": {}}], "with_tool": "decrit"},
        {"text": "Image décrite.", "with_tool": "decrit"}
    ]);
    let eyes = json!([{
        "text": "un point rouge",
        "with_text": "<attachments>\n- photo.png (image/png)\n</attachments>"
    }]);
    format!(
        r#"version: 1
models:
  - {{id: fake-echo, sdk: fake, model: ECHO}}
  - id: fake-1
    sdk: fake
    model: FAKE-1
    params: {{script: {orchestrator}}}
  - id: fake-eyes
    sdk: fake
    model: EYES
    capabilities: {{vision: true}}
    params: {{script: {eyes}}}
agents:
  - name: support
    main: {{model: fake-echo}}
  - name: photo
    main: {{model: fake-1}}
    roles:
      - name: decrit
        description: Décrit l'image jointe.
        model: fake-eyes
        system: Tu décris des images.
        context: [attachments]
tenants:
  - id: acme
  - id: tight
    quotas: {{runs_per_minute: 1}}
triggers:
  - name: orders
    agent: support
    message: "Order {{{{ payload.order.id }}}} from {{{{ payload.customer }}}}"
    session: "customer-{{{{ payload.customer }}}}"
    delivery_header: X-Delivery-Id
  - name: ping
    agent: support
    message: "Ping {{{{ payload }}}}"
security:
  api_keys:
    - {{id: run-a, hash: "{run_a}", tenant: acme, scopes: [run, read, read_content]}}
    - {{id: read-a, hash: "{read_a}", tenant: acme, scopes: [read]}}
    - {{id: photo-a, hash: "{photo_a}", tenant: acme, agents: [photo]}}
    - {{id: limited-a, hash: "{limited_a}", tenant: acme, rate_limit: {{per_minute: 2}}}}
    - {{id: tight, hash: "{tight}", tenant: tight}}
execution:
  attachments: {{max_bytes: 200, max_files: 2}}
server:
  http: {{max_body_bytes: 4096}}
storage:
  events: {{backend: jsonl, path: journal}}
"#,
        run_a = hash(RUN_A),
        read_a = hash(READ_A),
        photo_a = hash(PHOTO_A),
        limited_a = hash(LIMITED_A),
        tight = hash(TIGHT),
    )
}

struct Server {
    base: String,
    client: reqwest::Client,
    loom: Loom,
    dir: tempfile::TempDir,
}

impl Server {
    async fn start() -> Server {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let config = loom_ia::config::from_yaml_str(&yaml(), dir.path(), None, &|_| None).unwrap();
        let loom = Loom::new(config).unwrap();
        let settings = loom.config().raw().server.http.clone();
        let (listener, address) = loom_http::bind("127.0.0.1", 0).await.unwrap();
        let served = loom.clone();
        tokio::spawn(async move {
            loom_http::serve(served, listener, &settings, std::future::pending()).await
        });
        Server {
            base: format!("http://{address}/v1"),
            client: reqwest::Client::new(),
            loom,
            dir,
        }
    }

    fn get(&self, path: &str, key: &str) -> RequestBuilder {
        self.client
            .get(format!("{}{path}", self.base))
            .bearer_auth(key)
    }

    fn post(&self, path: &str, key: &str) -> RequestBuilder {
        self.client
            .post(format!("{}{path}", self.base))
            .bearer_auth(key)
    }

    /// Waits, through the journal, for the background run to close.
    async fn finished(&self, tenant: &str, session: &str, run_id: &str) {
        let run = RunRef {
            tenant_id: tenant.into(),
            session_id: session.into(),
            run_id: run_id.into(),
        };
        let events: Vec<_> = self.loom.follow(&run, 0).collect().await;
        assert!(events.iter().all(Result::is_ok), "{events:?}");
    }

    /// The journal of a session, as JSON values.
    fn journal(&self, tenant: &str, session: &str) -> Vec<Value> {
        let path = self
            .dir
            .path()
            .join(format!("journal/{tenant}/{session}.jsonl"));
        match std::fs::read_to_string(path) {
            Ok(text) => text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// The sessions tenant `tenant` has in the journal.
    fn sessions(&self, tenant: &str) -> usize {
        std::fs::read_dir(self.dir.path().join(format!("journal/{tenant}"))).map_or(0, |d| {
            d.filter(|e| e.as_ref().unwrap().path().extension() == Some("jsonl".as_ref()))
                .count()
        })
    }
}

async fn send(request: RequestBuilder) -> (StatusCode, HeaderMap, Value) {
    let response = request.send().await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, headers, body)
}

fn kind(body: &Value) -> &str {
    body["error"]["kind"].as_str().unwrap_or_default()
}

fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or_default()
}

/// `Retry-After` in seconds.
fn retry_after(headers: &HeaderMap) -> u64 {
    headers["retry-after"].to_str().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_opens_a_run_and_a_redelivery_finds_it() {
    let server = Server::start().await;
    let payload = json!({"order": {"id": 42}, "customer": "martin"});
    let (status, _, first) = send(
        server
            .post("/hooks/orders", RUN_A)
            .header("X-Delivery-Id", "evt-1")
            .json(&payload),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{first}");
    assert_eq!(first["trigger"], "orders");
    assert_eq!(first["run_id"], "evt-1");
    assert_eq!(first["session_id"], "customer-martin");
    assert_eq!(first["repeated"], false);
    assert!(first["status"].is_string(), "{first}");

    // The run goes on in the background, in the key's tenant, and completes.
    server.finished("acme", "customer-martin", "evt-1").await;
    let (status, _, result) =
        send(server.get("/runs/evt-1?session_id=customer-martin", RUN_A)).await;
    assert_eq!(status, StatusCode::OK, "{result}");
    assert_eq!(result["status"], "completed");
    // The message was rendered from the payload's fields.
    assert_eq!(result["text"], "Echo: Order 42 from martin");
    let journal = server.journal("acme", "customer-martin");
    assert_eq!(journal[0]["payload"]["trigger"], "orders");
    assert_eq!(journal[0]["facets"]["trigger"], "orders");
    let lines = journal.len();

    // The sender retries the same delivery (header name in another case): its first run.
    let (status, _, again) = send(
        server
            .post("/hooks/orders", RUN_A)
            .header("x-delivery-id", "evt-1")
            .json(&payload),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        again,
        json!({"trigger": "orders", "run_id": "evt-1", "session_id": "customer-martin",
               "status": "completed", "repeated": true})
    );
    assert_eq!(server.journal("acme", "customer-martin").len(), lines);

    // An empty body is the payload null; without a delivery header every call opens a run.
    let (status, _, ping) = send(server.post("/hooks/ping", RUN_A)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{ping}");
    let run_id = ping["run_id"].as_str().unwrap().to_owned();
    assert_eq!(ping["session_id"], run_id.as_str());
    server.finished("acme", &run_id, &run_id).await;
    let (_, _, result) = send(server.get(&format!("/runs/{run_id}"), RUN_A)).await;
    assert_eq!(result["text"], "Echo: Ping None");
    let (status, _, other) = send(
        server
            .post("/hooks/ping", RUN_A)
            .header("content-type", "application/json")
            .body("[1, 2]"),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_ne!(other["run_id"], run_id.as_str());
    let other_id = other["run_id"].as_str().unwrap();
    server.finished("acme", other_id, other_id).await;
    let (_, _, result) = send(server.get(&format!("/runs/{other_id}"), RUN_A)).await;
    assert_eq!(result["text"], "Echo: Ping [1, 2]");

    // The document lists the configured delivery header, and the answers (202, 200) are
    // `Triggered` as it describes them.
    let document: Value = server
        .client
        .get(format!(
            "{}/openapi.json",
            server.base.trim_end_matches("/v1")
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let operation = &document["paths"]["/v1/hooks/{name}"]["post"];
    let header = operation["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["in"] == "header")
        .unwrap();
    assert_eq!(header["name"], "X-Delivery-Id");
    assert!(
        header["description"].as_str().unwrap().contains("`orders`"),
        "{header}"
    );
    let mut schema = json!({"$ref": "#/components/schemas/Triggered"});
    schema["components"] = document["components"].clone();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for (status, answer) in [("202", &first), ("200", &again), ("202", &ping)] {
        assert_eq!(
            operation["responses"][status]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/Triggered"
        );
        assert!(validator.is_valid(answer), "{answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_deliveries_say_why_and_write_nothing() {
    let server = Server::start().await;
    let orders = json!({"order": {"id": 1}, "customer": "martin"});

    let (status, _, body) = send(server.post("/hooks/nope", RUN_A).json(&orders)).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::NOT_FOUND, "unknown_trigger")
    );
    assert_eq!(
        message(&body),
        "unknown trigger 'nope' (triggers: orders, ping)"
    );

    let (status, _, body) = send(server.post("/hooks/orders", RUN_A).body("{not json")).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_body")
    );
    assert!(
        message(&body).starts_with("the payload is not JSON: "),
        "{body}"
    );

    // A field the template needs is missing from the payload.
    let (status, _, body) = send(
        server
            .post("/hooks/orders", RUN_A)
            .json(&json!({"customer": "martin"})),
    )
    .await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request")
    );
    assert!(
        message(&body).starts_with(
            "request refused: trigger 'orders': triggers[0].message: cannot render the template: "
        ),
        "{body}"
    );
    let (status, _, body) = send(
        server
            .post("/hooks/orders", RUN_A)
            .header("X-Delivery-Id", "../x")
            .json(&orders),
    )
    .await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
        "{body}"
    );
    assert_eq!(server.sessions("acme"), 0, "nothing written");

    // A delivery id names one run: reused for another session, it is refused.
    let (status, _, _) = send(
        server
            .post("/hooks/orders", RUN_A)
            .header("X-Delivery-Id", "evt-7")
            .json(&orders),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    server.finished("acme", "customer-martin", "evt-7").await;
    let (status, _, body) = send(
        server
            .post("/hooks/orders", RUN_A)
            .header("X-Delivery-Id", "evt-7")
            .json(&json!({"order": {"id": 2}, "customer": "dupont"})),
    )
    .await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request")
    );
    assert_eq!(
        message(&body),
        "request refused: trigger 'orders': delivery 'evt-7' is already the run id of another \
         session (customer-martin): a delivery id names one run"
    );
    assert!(server.journal("acme", "customer-dupont").is_empty());

    // Keys: none, no `run` scope, or not allowed on the trigger's agent.
    let response = server
        .client
        .post(format!("{}/hooks/ping", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    let (status, _, body) = send(server.post("/hooks/ping", READ_A)).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::FORBIDDEN, "missing_scope")
    );
    let (status, _, body) = send(server.post("/hooks/ping", PHOTO_A)).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::FORBIDDEN, "agent_not_allowed")
    );
    assert_eq!(
        message(&body),
        "key 'photo-a' is not allowed on the agent 'support'"
    );

    // A payload over server.http.max_body_bytes.
    let big = json!({"order": {"id": 1}, "customer": "x".repeat(5000)});
    let (status, _, body) = send(server.post("/hooks/orders", RUN_A).json(&big)).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_its_rate_limit_is_429_with_retry_after() {
    let server = Server::start().await;
    // Every /v1 request made with the key counts, whatever the route.
    let (status, _, _) = send(server.get("/agents", LIMITED_A)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, body) = send(server.post("/hooks/ping", LIMITED_A)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let (status, headers, body) = send(server.get("/agents", LIMITED_A)).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::TOO_MANY_REQUESTS, "rate_limited")
    );
    let seconds = retry_after(&headers);
    assert!((1..=60).contains(&seconds), "{seconds}");
    assert_eq!(
        message(&body),
        format!("key 'limited-a': 2 requests per minute exceeded, retry in {seconds} s")
    );
    let (status, _, _) = send(server.get("/runs/x", LIMITED_A)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // Another key of the same tenant is not limited by it.
    let (status, _, _) = send(server.get("/agents", RUN_A)).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_quota_is_429_with_retry_after() {
    let server = Server::start().await;
    let (status, _, body) = send(
        server
            .post("/agents/support/runs", TIGHT)
            .json(&json!({"message": "Un", "session_id": "s1"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    for request in [
        server
            .post("/agents/support/runs", TIGHT)
            .json(&json!({"message": "Deux", "session_id": "s2"})),
        server.post("/hooks/ping", TIGHT),
    ] {
        let (status, headers, body) = send(request).await;
        assert_eq!(
            (status, kind(&body)),
            (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded"),
            "{body}"
        );
        let seconds = retry_after(&headers);
        assert!((1..=60).contains(&seconds), "{seconds}");
        assert_eq!(
            message(&body),
            format!("tenant 'tight': 1 runs per minute exceeded, retry in {seconds} s")
        );
    }
    assert_eq!(
        server.sessions("tight"),
        1,
        "nothing written for the refused runs"
    );
    // Tenant acme has no quota.
    for session in ["a1", "a2"] {
        let (status, _, _) = send(
            server
                .post("/agents/support/runs", RUN_A)
                .json(&json!({"message": "Un", "session_id": session})),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
    }
}

/// A part of a multipart body.
enum Part<'a> {
    Text(&'a str, &'a str),
    File {
        field: &'a str,
        file: Option<&'a str>,
        media_type: Option<&'a str>,
        bytes: &'a [u8],
    },
}

fn file<'a>(file: &'a str, media_type: &'a str, bytes: &'a [u8]) -> Part<'a> {
    Part::File {
        field: "attachments",
        file: Some(file),
        media_type: Some(media_type),
        bytes,
    }
}

/// A `multipart/form-data` request to `path`.
fn multipart(server: &Server, path: &str, parts: &[Part<'_>]) -> RequestBuilder {
    const BOUNDARY: &str = "loom-test-7d3f0a";
    let mut body = Vec::new();
    for part in parts {
        body.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        match part {
            Part::Text(name, value) => {
                body.extend_from_slice(
                    format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}")
                        .as_bytes(),
                );
            }
            Part::File {
                field,
                file,
                media_type,
                bytes,
            } => {
                let filename = file
                    .map(|f| format!("; filename=\"{f}\""))
                    .unwrap_or_default();
                body.extend_from_slice(
                    format!("Content-Disposition: form-data; name=\"{field}\"{filename}\r\n")
                        .as_bytes(),
                );
                if let Some(media_type) = media_type {
                    body.extend_from_slice(format!("Content-Type: {media_type}\r\n").as_bytes());
                }
                body.extend_from_slice(b"\r\n");
                body.extend_from_slice(bytes);
            }
        }
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    server
        .post(path, RUN_A)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multipart_run_carries_its_image_to_a_vision_role() {
    let server = Server::start().await;
    let (status, _, result) = send(multipart(
        &server,
        "/agents/photo/runs",
        &[
            Part::Text("message", "Que montre la photo ?"),
            Part::Text("session_id", "p1"),
            Part::Text("run_id", "r1"),
            Part::Text("user_id", "alice"),
            Part::Text("metadata", r#"{"canal": "mobile"}"#),
            file("photo.png", "image/png", PNG),
        ],
    ))
    .await;
    assert_eq!(status, StatusCode::CREATED, "{result}");
    assert_eq!(result["status"], "completed");
    assert_eq!(result["text"], "Image décrite.");

    let journal = server.journal("acme", "p1");
    let types: Vec<&str> = journal[..3]
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["run.started", "artifact.stored", "message.user"]);
    let context = &journal[0]["payload"]["context"];
    assert_eq!(
        (&context["user_id"], &context["metadata"]["canal"]),
        (&json!("alice"), &json!("mobile"))
    );
    let uri = format!("artifact://acme/p1/{}.png", sha256_hex(PNG));
    // The run's result lists the uploaded file.
    assert_eq!(
        result["artifacts"],
        json!([{"uri": uri, "origin": "attachment", "media_type": "image/png",
                "size": PNG.len(), "name": "photo.png"}])
    );
    assert_eq!(journal[1]["payload"]["uri"], uri.as_str());
    assert_eq!(journal[1]["payload"]["name"], "photo.png");
    assert_eq!(journal[1]["payload"]["media_type"], "image/png");
    let stored = server.dir.path().join(format!(
        "journal/.artifacts/acme/p1/{}.png",
        sha256_hex(PNG)
    ));
    assert_eq!(
        std::fs::read(stored).unwrap(),
        PNG,
        "the bytes arrived intact"
    );
    // The vision role was offered and called: its script answers only to a message listing
    // the image.
    let called = journal
        .iter()
        .find(|e| e["type"] == "tool.called")
        .expect("the role was called");
    assert_eq!(called["payload"]["tool_name"], "decrit");
    let completed = journal
        .iter()
        .find(|e| e["type"] == "tool.completed")
        .unwrap();
    assert_eq!(
        completed["payload"]["output"]["blocks"][0]["text"],
        "un point rouge"
    );

    // Without an image the role is not offered.
    let (status, _, result) = send(multipart(
        &server,
        "/agents/photo/runs",
        &[Part::Text("message", "Et sans photo ?")],
    ))
    .await;
    assert_eq!(status, StatusCode::CREATED, "{result}");
    assert_eq!(result["text"], "Pas d'image.");

    // In the background: 202, and the run completes.
    let (status, _, accepted) = send(multipart(
        &server,
        "/agents/photo/runs",
        &[
            file("photo.png", "image/png", PNG),
            Part::Text("message", "Et en tâche de fond ?"),
            Part::Text("background", "true"),
            Part::Text("session_id", "p2"),
        ],
    ))
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let run_id = accepted["run_id"].as_str().unwrap();
    server.finished("acme", "p2", run_id).await;
    let (_, _, result) = send(server.get(&format!("/runs/{run_id}?session_id=p2"), RUN_A)).await;
    assert_eq!(result["text"], "Image décrite.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_uploads_name_the_file_and_the_limit_and_write_nothing() {
    let server = Server::start().await;
    let big: Vec<u8> = [PNG, &[0u8; 200]].concat();
    let cases: Vec<(Vec<Part<'_>>, &str, &str)> = vec![
        (
            vec![file("big.png", "image/png", &big)],
            "invalid_request",
            "request refused: attachment 'big.png' is 270 bytes, more than the limit of 200 \
             bytes (execution.attachments.max_bytes)",
        ),
        (
            vec![file("notes.txt", "text/plain", b"bonjour")],
            "invalid_request",
            "request refused: attachment 'notes.txt': type text/plain is not accepted \
             (execution.attachments.types: image/jpeg, image/png, image/gif, image/webp)",
        ),
        (
            vec![file("blob", "application/octet-stream", &[1, 2, 3])],
            "invalid_request",
            "request refused: attachment 'blob': unsupported type (recognised neither from \
             its content nor from its extension; execution.attachments.types: image/jpeg, \
             image/png, image/gif, image/webp)",
        ),
        (
            vec![file("fake.png", "image/png", b"not an image")],
            "invalid_request",
            "request refused: attachment 'fake.png' is declared image/png but its content is \
             not an image of that type",
        ),
        (
            vec![
                file("a.png", "image/png", PNG),
                file("b.png", "image/png", PNG),
                file("c.png", "image/png", PNG),
            ],
            "invalid_request",
            "request refused: 3 attachments, more than the limit of 2 \
             (execution.attachments.max_files)",
        ),
        (
            vec![Part::File {
                field: "attachments",
                file: None,
                media_type: None,
                bytes: PNG,
            }],
            "invalid_body",
            "an 'attachments' part must be a file (with a file name)",
        ),
        (
            vec![Part::Text("colour", "blue")],
            "invalid_body",
            "form fields: unknown field `colour`",
        ),
        (
            vec![Part::Text("metadata", "{nope")],
            "invalid_body",
            "the form field 'metadata' is not JSON: ",
        ),
        (
            vec![Part::Text("background", "maybe")],
            "invalid_body",
            "the form field 'background' must be true or false, not 'maybe'",
        ),
        (
            vec![Part::Text("session_id", "s"), Part::Text("session_id", "t")],
            "invalid_body",
            "the form field 'session_id' is given twice",
        ),
        (
            vec![Part::Text("session_id", "../x")],
            "invalid_request",
            "request refused: session id '../x' is not usable",
        ),
    ];
    for (mut parts, expected_kind, expected) in cases {
        parts.insert(0, Part::Text("message", "Regarde."));
        let (status, _, body) = send(multipart(&server, "/agents/photo/runs", &parts)).await;
        assert_eq!(
            (status, kind(&body)),
            (StatusCode::UNPROCESSABLE_ENTITY, expected_kind),
            "{body}"
        );
        assert!(message(&body).starts_with(expected), "{expected}\n{body}");
    }
    // A multipart body without a message is refused like a JSON one.
    let (status, _, body) = send(multipart(
        &server,
        "/agents/photo/runs",
        &[Part::Text("user_id", "alice")],
    ))
    .await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_body")
    );
    // Over server.http.max_body_bytes: 413.
    let huge = vec![0u8; 5000];
    let (status, _, body) = send(multipart(
        &server,
        "/agents/photo/runs",
        &[
            Part::Text("message", "Regarde."),
            file("huge.png", "image/png", &huge),
        ],
    ))
    .await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large"),
        "{body}"
    );
    assert_eq!(server.sessions("acme"), 0, "nothing written");
}
