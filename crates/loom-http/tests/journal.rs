//! What a caller writes in the journal, through a real socket: values bounded before they are
//! journaled (the outside probe's deeply nested `metadata`), one unreadable line costing its
//! session only (listings, lookups, the tenant budget, the erasure), and sessions bound to the
//! agent that opened them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use loom_ia::{
    Loom, TenantBudget,
    config::{
        AgentSpec, ApiKeySpec, Config, EventsBackend, HttpServerConfig, LoomConfig, ModelSpec,
        Scope, Sdk, TenantSpec,
    },
};
use reqwest::{RequestBuilder, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// acme, every scope.
const ADMIN: &str = "lk_admin-acme-0000000000000000000000000000000";
/// acme, `run` only: the outside probe's key.
const RUN: &str = "lk_run-acme-000000000000000000000000000000000";
/// acme, `read` only.
const READ: &str = "lk_read-acme-00000000000000000000000000000000";
/// acme, `run` and `read` on the agent `chef` only.
const CHEF: &str = "lk_chef-acme-00000000000000000000000000000000";

fn hash(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn key(id: &str, secret: &str, scopes: &[Scope], agents: &[&str]) -> ApiKeySpec {
    ApiKeySpec {
        id: id.into(),
        hash: hash(secret),
        tenant: "acme".into(),
        expires: None,
        scopes: scopes.to_vec(),
        rate_limit: None,
        agents: agents.iter().map(|a| (*a).to_owned()).collect(),
    }
}

fn config(dir: &std::path::Path) -> Config {
    // Without a script the fake model echoes the last user message.
    let mut raw = LoomConfig {
        models: vec![ModelSpec::new("fake", Sdk::Fake, "FAKE")],
        agents: vec![
            AgentSpec::new("chef", "fake"),
            AgentSpec::new("devis", "fake"),
        ],
        tenants: vec![TenantSpec::new("acme")],
        ..LoomConfig::default()
    };
    raw.security.api_keys = vec![
        key("admin", ADMIN, &[Scope::Admin], &[]),
        key("run", RUN, &[Scope::Run], &[]),
        key("read", READ, &[Scope::Read], &[]),
        key("chef", CHEF, &[Scope::Run, Scope::Read], &["chef"]),
    ];
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("journal".into());
    Config::new(raw, dir.to_path_buf()).unwrap()
}

struct Server {
    base: String,
    client: reqwest::Client,
    dir: tempfile::TempDir,
}

impl Server {
    /// A server whose tenant `acme` has a daily budget (so that opening a run reads every
    /// session of the tenant).
    async fn start() -> Server {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let loom = Loom::new(config(dir.path())).unwrap().with_tenant_budget(
            "acme",
            TenantBudget {
                max_tokens_per_day: Some(10_000_000),
                ..TenantBudget::default()
            },
        );
        let (listener, address) = loom_http::bind("127.0.0.1", 0).await.unwrap();
        let settings = HttpServerConfig::default();
        tokio::spawn(async move {
            loom_http::serve(loom, listener, &settings, std::future::pending()).await
        });
        Server {
            base: format!("http://{address}/v1"),
            client: reqwest::Client::new(),
            dir,
        }
    }

    fn get(&self, path: &str, key: &str) -> RequestBuilder {
        self.client
            .get(format!("{}{path}", self.base))
            .header("X-API-Key", key)
    }

    fn post(&self, path: &str, key: &str, body: Value) -> RequestBuilder {
        self.client
            .post(format!("{}{path}", self.base))
            .header("X-API-Key", key)
            .json(&body)
    }

    fn delete(&self, path: &str, key: &str) -> RequestBuilder {
        self.client
            .delete(format!("{}{path}", self.base))
            .header("X-API-Key", key)
    }

    /// Runs `agent` (synchronously) in `session`, returning the run id.
    async fn run(&self, agent: &str, session: &str, key: &str) -> String {
        let (status, body) = send(self.post(
            &format!("/agents/{agent}/runs"),
            key,
            json!({"message": "Bonjour", "session_id": session}),
        ))
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["run_id"].as_str().unwrap().to_owned()
    }

    fn journal_file(&self, session: &str) -> std::path::PathBuf {
        self.dir
            .path()
            .join("journal")
            .join("acme")
            .join(format!("{session}.jsonl"))
    }
}

async fn send(request: RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn kind(body: &Value) -> &str {
    body["error"]["kind"].as_str().unwrap_or_default()
}

/// An object nested `levels` deep (itself the first level).
fn nested(levels: usize) -> Value {
    (0..levels).fold(json!(1), |inner, _| json!({ "a": inner }))
}

/// The outside probe: a key with only `run` sends `metadata` nested 125 levels deep (about
/// 320 bytes, under the JSON reader's limit on its own, past it inside the journaled event).
/// It is refused before anything is written, naming the field and the limit, and the tenant
/// stays readable; 64 levels, the limit, are accepted and read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outside_probe_is_refused_and_the_tenant_stays_readable() {
    let server = Server::start().await;
    let before = server.run("chef", "s0", ADMIN).await;

    let (status, body) = send(server.post(
        "/agents/chef/runs",
        RUN,
        json!({"message": "Bonjour", "session_id": "probe", "metadata": nested(125)}),
    ))
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(kind(&body), "invalid_request");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("metadata is nested more than 64 levels deep"),
        "{message}"
    );
    assert!(!server.journal_file("probe").exists(), "nothing is written");

    let too_long = "x".repeat(loom_ia::core::limits::MAX_MESSAGE_BYTES + 1);
    let (status, body) = send(server.post(
        "/agents/chef/runs",
        RUN,
        json!({"message": too_long, "session_id": "long"}),
    ))
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("message is 1048577 bytes, more than the limit of 1048576 bytes"),
        "{body}"
    );

    let (status, body) = send(server.post(
        "/agents/chef/runs",
        RUN,
        json!({"message": "Bonjour", "session_id": "deep", "metadata": nested(64)}),
    ))
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let deep = body["run_id"].as_str().unwrap().to_owned();

    // Everything that reads the tenant still answers.
    let (status, body) = send(server.get("/runs", READ)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let listed: Vec<&str> = body["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert!(listed.contains(&deep.as_str()) && listed.contains(&before.as_str()));
    let (status, body) = send(server.get("/events", READ)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for (run, session) in [(&deep, "deep"), (&before, "s0")] {
        let (status, body) =
            send(server.get(&format!("/runs/{run}?session_id={session}"), READ)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    server.run("chef", "after", ADMIN).await;
}

/// A session holding a line that cannot be read (written before the journal refused it, or
/// damaged on disk) costs that session only: listings and searches leave it out, other runs
/// are found, the tenant's budget still lets runs open, a lookup of its run says the journal
/// is corrupted rather than that the run is unknown, and an admin can erase it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_line_costs_its_session_only() {
    let server = Server::start().await;
    let good = server.run("chef", "good", ADMIN).await;
    let bad = server.run("chef", "bad", ADMIN).await;
    // The outside probe's line, as it was journaled before the fix.
    let path = server.journal_file("bad");
    let text = std::fs::read_to_string(&path).unwrap();
    let deep = format!("\"metadata\":{}", nested(125));
    let poisoned = text.replacen("\"metadata\":{}", &deep, 1);
    assert_ne!(poisoned, text);
    std::fs::write(&path, poisoned).unwrap();

    let (status, body) = send(server.get("/runs", READ)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let listed: Vec<&str> = body["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [good.as_str()]);
    let (status, body) = send(server.get("/events?type=run.started", READ)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body.as_array().unwrap().len(), 1, "{body}");
    let (status, body) = send(server.get(&format!("/runs/{good}?session_id=good"), READ)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The run of the unreadable session is not "unknown": its journal is what fails.
    let (status, body) = send(server.get(&format!("/runs/{bad}?session_id=bad"), READ)).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::INTERNAL_SERVER_ERROR, "journal"),
        "{body}"
    );
    // The tenant has a budget: opening a run reads every session of the tenant.
    server.run("chef", "next", ADMIN).await;
    // A chosen run id is looked up in the journal's run index, which the unreadable line does
    // not stop (Loom-IA scans every session, so one corrupted session fails every chosen id):
    // a new id opens, and the id of the run whose journal is unreadable is still taken.
    let (status, body) = send(server.post(
        "/agents/chef/runs",
        ADMIN,
        json!({"message": "Bonjour", "session_id": "chosen", "run_id": "chosen-1"}),
    ))
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = send(server.post(
        "/agents/chef/runs",
        ADMIN,
        json!({"message": "Bonjour", "session_id": "chosen", "run_id": bad}),
    ))
    .await;
    assert_eq!(
        (status, body["error"]["message"].as_str()),
        (
            StatusCode::CONFLICT,
            Some(format!("request refused: run {bad} already exists in session bad").as_str())
        ),
        "{body}"
    );

    let (status, body) = send(server.delete("/sessions/bad", ADMIN)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["events_deleted"], 8, "{body}");
    let (status, body) = send(server.get(&format!("/runs/{bad}?session_id=bad"), READ)).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::NOT_FOUND, "unknown_run")
    );
}

/// A session belongs to the agent that opened it: a key limited to `chef` cannot add a run of
/// `chef` to a session of `devis` (whose history `chef`'s model would then read); nothing is
/// written. `chef` continues its own sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_continued_only_by_the_agent_that_opened_it() {
    let server = Server::start().await;
    server.run("devis", "quotes", ADMIN).await;
    let before = std::fs::read(server.journal_file("quotes")).unwrap();

    let (status, body) = send(server.post(
        "/agents/chef/runs",
        CHEF,
        json!({"message": "Que dit l'historique ?", "session_id": "quotes"}),
    ))
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(kind(&body), "agent_not_allowed");
    assert_eq!(
        body["error"]["message"],
        "session quotes belongs to the agent 'devis': the agent 'chef' cannot add a run to it \
         (a session is continued by the agent that opened it)"
    );
    assert_eq!(
        std::fs::read(server.journal_file("quotes")).unwrap(),
        before
    );

    // Its own session, twice.
    server.run("chef", "mine", CHEF).await;
    server.run("chef", "mine", CHEF).await;
    let (status, body) = send(server.get("/sessions/mine", READ)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["runs"].as_array().unwrap().len(), 2);
}
