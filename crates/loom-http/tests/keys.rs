//! API keys through a real socket: 401 (missing, unknown, expired), 403 (scope, agent of the
//! key, agent of the tenant), the key's tenant as the only tenant of a request, Bearer and
//! `X-API-Key`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use loom_ia::{
    Loom,
    config::{
        AgentSpec, ApiKeySpec, Config, EventsBackend, HttpServerConfig, LoomConfig, ModelSpec,
        Scope, Sdk, TenantSpec,
    },
};
use reqwest::{RequestBuilder, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const RUN_A: &str = "lk_run-acme-000000000000000000000000000000000";
const READ_A: &str = "lk_read-acme-00000000000000000000000000000000";
const RUN_B: &str = "lk_run-beta-000000000000000000000000000000000";
const ECHO_A: &str = "lk_echo-acme-00000000000000000000000000000000";
const OLD_A: &str = "lk_old-acme-000000000000000000000000000000000";
const RUN_G: &str = "lk_run-gamma-00000000000000000000000000000000";

fn hash(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn key(id: &str, secret: &str, tenant: &str, scopes: &[Scope]) -> ApiKeySpec {
    ApiKeySpec {
        id: id.into(),
        hash: hash(secret),
        tenant: tenant.into(),
        expires: None,
        scopes: scopes.to_vec(),
        agents: Vec::new(),
        rate_limit: None,
    }
}

fn model(id: &str, text: &str) -> ModelSpec {
    let mut model = ModelSpec::new(id, Sdk::Fake, "FAKE");
    model
        .params
        .insert("script".into(), json!([{ "text": text }]));
    model
}

fn config(dir: &std::path::Path) -> Config {
    let mut echo = AgentSpec::new("echo", "fake-echo");
    echo.description = "Says hello.".into();
    let other = AgentSpec::new("other", "fake-other");
    let mut old = key("old", OLD_A, "acme", &[Scope::Run, Scope::Read]);
    old.expires = Some("2020-01-01".into());
    let mut echo_only = key("echo-only", ECHO_A, "acme", &[Scope::Run, Scope::Read]);
    echo_only.agents = vec!["echo".into()];
    // A tenant that may run `echo` only (`tenants[].agents`), with an unrestricted key.
    let mut gamma = TenantSpec::new("gamma");
    gamma.agents = vec!["echo".into()];
    let mut raw = LoomConfig {
        models: vec![
            model("fake-echo", "Bonjour."),
            model("fake-other", "Autre."),
        ],
        agents: vec![echo, other],
        tenants: vec![TenantSpec::new("acme"), TenantSpec::new("beta"), gamma],
        ..LoomConfig::default()
    };
    raw.security.api_keys = vec![
        key("run-a", RUN_A, "acme", &[Scope::Run, Scope::Read]),
        key("read-a", READ_A, "acme", &[Scope::Read]),
        key("run-b", RUN_B, "beta", &[Scope::Run, Scope::Read]),
        echo_only,
        old,
        key("run-g", RUN_G, "gamma", &[Scope::Run, Scope::Read]),
    ];
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("journal".into());
    Config::new(raw, dir.to_path_buf()).unwrap()
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
        let loom = Loom::new(config(dir.path())).unwrap();
        let (listener, address) = loom_http::bind("127.0.0.1", 0).await.unwrap();
        let settings = HttpServerConfig::default();
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

    fn get(&self, path: &str) -> RequestBuilder {
        self.client.get(format!("{}{path}", self.base))
    }

    fn post(&self, path: &str, body: Value) -> RequestBuilder {
        self.client.post(format!("{}{path}", self.base)).json(&body)
    }
}

fn bearer(request: RequestBuilder, key: &str) -> RequestBuilder {
    request.header("Authorization", format!("Bearer {key}"))
}

async fn send(request: RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap())
}

/// Sends a request that must be refused with 401: every 401 names the scheme to authenticate
/// with (`WWW-Authenticate: Bearer`, RFC 9110).
async fn unauthorized(request: RequestBuilder) -> Value {
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        response
            .headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap()),
        Some("Bearer")
    );
    response.json().await.unwrap()
}

fn kind(body: &Value) -> &str {
    body["error"]["kind"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_unknown_and_expired_keys_are_401() {
    let server = Server::start().await;
    for path in ["/agents", "/runs/r1", "/runs/r1/events"] {
        let body = unauthorized(server.get(path)).await;
        assert_eq!(kind(&body), "missing_key", "{path}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("'Authorization: Bearer …' or 'X-API-Key'"),
            "{body}"
        );
    }
    for request in [
        server.post("/agents/echo/runs", json!({"message": "hi"})),
        server.post("/runs/r1/approve", json!({})),
        server.post("/runs/r1/cancel", json!({})),
    ] {
        let body = unauthorized(request).await;
        assert_eq!(kind(&body), "missing_key", "{body}");
    }
    let body = unauthorized(bearer(server.get("/agents"), "lk_nobody")).await;
    assert_eq!(kind(&body), "unknown_key");
    assert_eq!(body["error"]["message"], "API key refused");
    // A wrong scheme is no key.
    let body = unauthorized(
        server
            .get("/agents")
            .header("Authorization", format!("Basic {RUN_A}")),
    )
    .await;
    assert_eq!(kind(&body), "missing_key");
    let body = unauthorized(bearer(server.get("/agents"), OLD_A)).await;
    assert_eq!(kind(&body), "expired_key");
    assert_eq!(
        body["error"]["message"],
        "key 'old' expired on 2020-01-01T00:00:00Z"
    );
    // The right key, both ways.
    let (status, _) = send(bearer(server.get("/agents"), RUN_A)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = send(server.get("/agents").header("X-API-Key", READ_A)).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_and_agents_are_403_and_the_key_decides_the_tenant() {
    let server = Server::start().await;
    // read only: no run, no approval, no cancellation.
    let (status, body) = send(
        server
            .post("/agents/echo/runs", json!({"message": "hi"}))
            .header("X-API-Key", READ_A),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(kind(&body), "missing_scope");
    assert_eq!(
        body["error"]["message"],
        "key 'read-a' lacks the scope 'run'"
    );
    for path in ["/runs/x/approve", "/runs/x/reject"] {
        let (status, body) = send(bearer(server.post(path, json!({})), RUN_A)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert_eq!(
            body["error"]["message"],
            "key 'run-a' lacks the scope 'approve'"
        );
    }
    let (status, _) = send(bearer(server.post("/runs/x/cancel", json!({})), READ_A)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = send(bearer(
        server.post(
            "/agents/echo/runs",
            json!({"message": "hi", "judges": "skip"}),
        ),
        RUN_A,
    ))
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(
        body["error"]["message"],
        "key 'run-a' lacks the scope 'admin'"
    );

    // A run opened with tenant acme's key lands in acme's journal.
    let (status, body) = send(bearer(
        server.post(
            "/agents/echo/runs",
            json!({"message": "hi", "session_id": "s1"}),
        ),
        RUN_A,
    ))
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let run_id = body["run_id"].as_str().unwrap().to_owned();
    assert!(
        server
            .loom
            .locate(&run_id, Some("s1"), Some("acme"))
            .await
            .is_ok()
    );
    assert!(
        server
            .loom
            .locate(&run_id, Some("s1"), Some("default"))
            .await
            .is_err()
    );
    assert!(server.dir.path().join("journal/acme").exists());
    // Nothing in the body names another tenant.
    let (status, _) = send(bearer(
        server.post(
            "/agents/echo/runs",
            json!({"message": "hi", "tenant_id": "beta"}),
        ),
        RUN_A,
    ))
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    // Read with another key of the same tenant (X-API-Key), not with tenant beta's key.
    let path = format!("/runs/{run_id}?session_id=s1");
    let (status, body) = send(server.get(&path).header("X-API-Key", READ_A)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["run_id"], run_id.as_str());
    let (status, body) = send(bearer(server.get(&path), RUN_B)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, _) = send(bearer(server.get(&format!("/runs/{run_id}")), RUN_B)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = send(bearer(
        server.post(
            &format!("/runs/{run_id}/cancel"),
            json!({"session_id": "s1"}),
        ),
        RUN_B,
    ))
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = send(bearer(
        server.get(&format!("/runs/{run_id}/events?session_id=s1")),
        RUN_B,
    ))
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A key limited to `echo`: lists only echo, 403 on the other agent and its runs.
    let (status, body) = send(bearer(server.get("/agents"), ECHO_A)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!([{"name": "echo", "description": "Says hello."}])
    );
    let (_, body) = send(bearer(server.get("/agents"), RUN_A)).await;
    assert_eq!(body.as_array().unwrap().len(), 2);
    let (status, body) = send(bearer(
        server.post("/agents/other/runs", json!({"message": "hi"})),
        ECHO_A,
    ))
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(kind(&body), "agent_not_allowed");
    assert_eq!(
        body["error"]["message"],
        "key 'echo-only' is not allowed on the agent 'other'"
    );
    let (status, body) = send(bearer(
        server.post(
            "/agents/other/runs",
            json!({"message": "hi", "session_id": "s2"}),
        ),
        RUN_A,
    ))
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let other_run = body["run_id"].as_str().unwrap().to_owned();
    let (status, body) = send(bearer(
        server.get(&format!("/runs/{other_run}?session_id=s2")),
        ECHO_A,
    ))
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(kind(&body), "agent_not_allowed");
    let (status, _) = send(bearer(server.get(&path), ECHO_A)).await;
    assert_eq!(status, StatusCode::OK);
}

/// A tenant limited to some agents (`tenants[].agents`) is refused the others like a key
/// limited to them: 403 `agent_not_allowed`, nothing journaled; its agents run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_outside_the_tenants_agents_is_403() {
    let server = Server::start().await;
    let (status, body) = send(bearer(server.get("/agents"), RUN_G)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!([{"name": "echo", "description": "Says hello."}])
    );
    for background in [false, true] {
        let (status, body) = send(bearer(
            server.post(
                "/agents/other/runs",
                json!({"message": "hi", "background": background}),
            ),
            RUN_G,
        ))
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert_eq!(kind(&body), "agent_not_allowed");
        assert_eq!(
            body["error"]["message"],
            "tenant 'gamma' may not use the agent 'other' (tenants[].agents)"
        );
    }
    assert!(!server.dir.path().join("journal/gamma").exists());
    let (status, body) = send(bearer(
        server.post("/agents/echo/runs", json!({"message": "hi"})),
        RUN_G,
    ))
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // The key has no `read_content`: the result is masked, as `GET /runs/{run_id}` masks it.
    assert_eq!(body["status"], "completed");
    assert_eq!(body["redacted"], json!(["text", "output"]));
}
