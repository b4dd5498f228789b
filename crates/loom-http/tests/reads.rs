//! The read side of the REST API through a real socket: `GET /runs`, `GET /events`,
//! `GET /traces/{run_id}`, the session routes, `read_content` masking, the SSE stream of a run
//! with its sub-runs (disconnect and resume with `Last-Event-ID`), and tenant isolation, with
//! API keys of two tenants over a configuration built in Rust with scripted fake models.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Frame, PNG, Sse};
use std::time::Duration;

use loom_ia::{
    Attachment, Loom, RunOptions,
    config::{
        AgentSpec, ApiKeySpec, Config, EventsBackend, HttpServerConfig, LoomConfig, ModelSpec,
        Scope, Sdk, SubAgentRef, TenantSpec, ToolRef,
    },
};
use reqwest::{RequestBuilder, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// acme, every scope.
const ADMIN_A: &str = "lk_admin-acme-0000000000000000000000000000000";
/// acme, `read` only: content is masked.
const READ_A: &str = "lk_read-acme-00000000000000000000000000000000";
/// acme, `read` and `read_content`.
const CONTENT_A: &str = "lk_content-acme-00000000000000000000000000000";
/// acme, `run` only.
const RUN_A: &str = "lk_run-acme-000000000000000000000000000000000";
/// acme, `read` and `read_content` on the agents `boss` and `chef` only (not their sub-agents
/// `helper` and `devis`).
const BOSS_A: &str = "lk_boss-acme-00000000000000000000000000000000";
/// acme, `read` and `read_content` on the agent `echo` only.
const ECHO_A: &str = "lk_echo-acme-00000000000000000000000000000000";
/// beta, every scope.
const ADMIN_B: &str = "lk_admin-beta-0000000000000000000000000000000";

/// Waits `ms` milliseconds, then says so.
#[loom_ia::tool]
async fn lent(ms: u64) -> String {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    format!("attendu {ms} ms")
}

/// Sends a quote to a customer (a human approves every call).
#[loom_ia::tool(side_effects = "irreversible", approval = "always")]
fn envoyer(client: String) -> String {
    format!("devis envoyé à {client}")
}

fn hash(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn key(id: &str, secret: &str, tenant: &str, scopes: &[Scope], agents: &[&str]) -> ApiKeySpec {
    ApiKeySpec {
        id: id.into(),
        hash: hash(secret),
        tenant: tenant.into(),
        expires: None,
        scopes: scopes.to_vec(),
        rate_limit: None,
        agents: agents.iter().map(|a| (*a).to_owned()).collect(),
    }
}

fn model(id: &str, script: Value) -> ModelSpec {
    let mut model = ModelSpec::new(id, Sdk::Fake, "FAKE");
    model.params.insert("script".into(), script);
    model
}

fn config(dir: &std::path::Path, keys: bool) -> Config {
    let echo = AgentSpec::new("echo", "fake-echo");
    let mut boss = AgentSpec::new("boss", "fake-boss");
    boss.subagents = vec![SubAgentRef::new("helper")];
    let mut helper = AgentSpec::new("helper", "fake-helper");
    helper.description = "Computes slowly.".into();
    helper.tools = vec![ToolRef::new("lent")];
    let mut devis = AgentSpec::new("devis", "fake-devis");
    devis.description = "Sends quotes.".into();
    devis.tools = vec![ToolRef::new("envoyer")];
    let mut chef = AgentSpec::new("chef", "fake-chef");
    chef.subagents = vec![SubAgentRef::new("devis")];
    let mut raw = LoomConfig {
        models: vec![
            model("fake-echo", json!([{"text": "Bonjour, voici le secret."}])),
            model(
                "fake-boss",
                json!([
                    {"text": "Je délègue.", "tool_calls": [{"name": "helper", "arguments": {"message": "Calcule le secret."}}]},
                    {"text": "Fini : {{ tool_result }}"}
                ]),
            ),
            model(
                "fake-helper",
                json!([
                    {"text": "J'attends.", "tool_calls": [{"name": "lent", "arguments": {"ms": 300}}]},
                    {"text": "Aide : {{ tool_result }}"}
                ]),
            ),
            model(
                "fake-chef",
                json!([
                    {"text": "Je transmets.", "tool_calls": [{"name": "devis", "arguments": {"message": "Envoie le devis."}}]},
                    {"text": "Fait : {{ tool_result }}"}
                ]),
            ),
            model(
                "fake-devis",
                json!([
                    {"text": "J'envoie.", "tool_calls": [{"name": "envoyer", "arguments": {"client": "Martin le secret"}}]},
                    {"text": "Résultat : {{ tool_result }}"}
                ]),
            ),
        ],
        agents: vec![echo, boss, helper, devis, chef],
        ..LoomConfig::default()
    };
    if keys {
        raw.tenants = vec![TenantSpec::new("acme"), TenantSpec::new("beta")];
        raw.security.api_keys = vec![
            key("admin-a", ADMIN_A, "acme", &[Scope::Admin], &[]),
            key("read-a", READ_A, "acme", &[Scope::Read], &[]),
            key(
                "content-a",
                CONTENT_A,
                "acme",
                &[Scope::Read, Scope::ReadContent],
                &[],
            ),
            key("run-a", RUN_A, "acme", &[Scope::Run], &[]),
            key(
                "boss-a",
                BOSS_A,
                "acme",
                &[Scope::Read, Scope::ReadContent],
                &["boss", "chef"],
            ),
            key(
                "echo-a",
                ECHO_A,
                "acme",
                &[Scope::Read, Scope::ReadContent],
                &["echo"],
            ),
            key("admin-b", ADMIN_B, "beta", &[Scope::Admin], &[]),
        ];
    }
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("journal".into());
    Config::new(raw, dir.to_path_buf()).unwrap()
}

struct Server {
    base: String,
    client: reqwest::Client,
    loom: Loom,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start(keys: bool) -> Server {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let loom = Loom::new(config(dir.path(), keys)).unwrap();
        loom.register("lent", lent_tool()).unwrap();
        loom.register("envoyer", envoyer_tool()).unwrap();
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
            _dir: dir,
        }
    }

    fn request(&self, method: reqwest::Method, path: &str, key: Option<&str>) -> RequestBuilder {
        let request = self.client.request(method, format!("{}{path}", self.base));
        match key {
            Some(key) => request.header("Authorization", format!("Bearer {key}")),
            None => request,
        }
    }

    async fn get(&self, path: &str, key: &str) -> (StatusCode, Value) {
        send(self.request(reqwest::Method::GET, path, Some(key))).await
    }

    async fn delete(&self, path: &str, key: &str) -> (StatusCode, Value) {
        send(self.request(reqwest::Method::DELETE, path, Some(key))).await
    }

    /// Runs `agent` to its end in `tenant`'s session `session`, with `attachments`.
    async fn run(
        &self,
        tenant: &str,
        agent: &str,
        session: &str,
        run_id: &str,
        attachments: Vec<Attachment>,
    ) -> loom_ia::RunResult {
        self.loom
            .run(
                agent,
                "Donne-moi le secret.",
                RunOptions {
                    tenant_id: Some(tenant.into()),
                    session_id: Some(session.into()),
                    run_id: Some(run_id.into()),
                    attachments,
                    ..RunOptions::default()
                },
            )
            .await
            .unwrap()
    }

    /// Opens the SSE stream of a run.
    async fn sse(&self, run_id: &str, query: &str, key: &str, last_event_id: Option<&str>) -> Sse {
        let mut request = self.request(
            reqwest::Method::GET,
            &format!("/runs/{run_id}/events{query}"),
            Some(key),
        );
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        Sse::new(response)
    }
}

async fn send(request: RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body)
}

fn kind(body: &Value) -> &str {
    body["error"]["kind"].as_str().unwrap_or_default()
}

fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or_default()
}

/// A PNG attachment; `extra` bytes after its end make its bytes (and its URI) differ.
fn png(name: &str, extra: &[u8]) -> Attachment {
    let mut bytes = PNG.to_vec();
    bytes.extend_from_slice(extra);
    Attachment {
        name: name.into(),
        media_type: "image/png".into(),
        bytes,
    }
}

/// The runs every test reads, in this order: in acme, `r-e1` (echo, with a PNG attachment) in
/// `s-1`, `r-b1` (boss, and its helper sub-run) in `s-2`, `r-e2` (echo) in `s-3`, `r-d1`
/// (devis, paused on an approval) in `s-4`; in beta, `rb-1` (echo, with an attachment) in a
/// session also named `s-1`, and `rb-2` (boss) in `s-b`.
async fn seeded() -> Server {
    let server = Server::start(true).await;
    server
        .run(
            "acme",
            "echo",
            "s-1",
            "r-e1",
            vec![png("plan été.png", b"")],
        )
        .await;
    server.run("acme", "boss", "s-2", "r-b1", Vec::new()).await;
    server.run("acme", "echo", "s-3", "r-e2", Vec::new()).await;
    let paused = server.run("acme", "devis", "s-4", "r-d1", Vec::new()).await;
    assert_eq!(paused.status, loom_ia::RunStatus::Paused);
    server
        .run(
            "beta",
            "echo",
            "s-1",
            "rb-1",
            vec![png("beta.png", b"beta")],
        )
        .await;
    server.run("beta", "boss", "s-b", "rb-2", Vec::new()).await;
    server
}

/// The sub-run the boss opened in `session`.
async fn child_of(server: &Server, tenant: &str, session: &str) -> String {
    let info = server.loom.session(session, Some(tenant)).await.unwrap();
    info.runs
        .iter()
        .find(|r| r.parent_run_id.is_some())
        .unwrap()
        .run_id
        .clone()
}

fn run_ids(page: &Value) -> Vec<&str> {
    page["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect()
}

/// Asserts a 422 `invalid_query` whose message starts with `parameter`.
async fn assert_invalid(server: &Server, path: &str, parameter: &str) {
    let (status, body) = server.get(path, CONTENT_A).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {body}");
    assert_eq!(kind(&body), "invalid_query", "{path}: {body}");
    assert!(
        message(&body).starts_with(&format!("{parameter}: ")),
        "{path}: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_listed_most_recent_first_and_filtered() {
    let server = seeded().await;
    let child = child_of(&server, "acme", "s-2").await;

    let (status, page) = server.get("/runs", CONTENT_A).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(
        run_ids(&page),
        vec!["r-d1", "r-e2", child.as_str(), "r-b1", "r-e1"]
    );
    assert_eq!(
        (page["scanned"].clone(), page["truncated"].clone()),
        (json!(4), json!(false))
    );
    let listed = &page["runs"][3];
    assert_eq!(
        (
            listed["session_id"].as_str(),
            listed["agent"].as_str(),
            listed["status"].as_str(),
            listed["depth"].as_u64(),
            listed["iterations"].as_u64()
        ),
        (
            Some("s-2"),
            Some("boss"),
            Some("completed"),
            Some(0),
            Some(2)
        )
    );
    assert_eq!(page["runs"][2]["parent_run_id"], "r-b1");
    assert_eq!(page["runs"][2]["root_run_id"], "r-b1");

    let (_, page) = server.get("/runs?agent=echo", CONTENT_A).await;
    assert_eq!(run_ids(&page), vec!["r-e2", "r-e1"]);
    let (_, page) = server
        .get("/runs?status=paused&status=failed", CONTENT_A)
        .await;
    assert_eq!(run_ids(&page), vec!["r-d1"]);
    let (_, page) = server.get("/runs?limit=2", CONTENT_A).await;
    assert_eq!(run_ids(&page), vec!["r-d1", "r-e2"]);
    assert_eq!(page["truncated"], true);
    let (_, page) = server.get("/runs?sessions=2", CONTENT_A).await;
    assert_eq!(run_ids(&page), vec!["r-d1", "r-e2"]);
    assert_eq!(
        (page["scanned"].clone(), page["truncated"].clone()),
        (json!(2), json!(true))
    );
    // `since` and `until` bound when the runs started.
    let (_, all) = server.get("/runs", CONTENT_A).await;
    let started = all["runs"][3]["started_at"].as_str().unwrap();
    let at = started.replace('+', "%2B");
    let (_, page) = server.get(&format!("/runs?since={at}"), CONTENT_A).await;
    assert_eq!(run_ids(&page), vec!["r-d1", "r-e2", child.as_str(), "r-b1"]);
    let (_, page) = server.get(&format!("/runs?until={at}"), CONTENT_A).await;
    assert_eq!(run_ids(&page), vec!["r-e1"]);
    let (_, page) = server
        .get("/runs?since=2000-01-01&until=2001-01-01", CONTENT_A)
        .await;
    assert_eq!(run_ids(&page), Vec::<&str>::new());

    // A key limited to echo sees only echo's runs, and may not ask for another agent.
    let (_, page) = server.get("/runs", ECHO_A).await;
    assert_eq!(run_ids(&page), vec!["r-e2", "r-e1"]);
    let (status, body) = server.get("/runs?agent=boss", ECHO_A).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::FORBIDDEN, "agent_not_allowed")
    );

    for (path, parameter) in [
        ("/runs?status=done", "status"),
        ("/runs?limit=0", "limit"),
        ("/runs?limit=201", "limit"),
        ("/runs?limit=many", "limit"),
        ("/runs?sessions=0", "sessions"),
        ("/runs?sessions=201", "sessions"),
        ("/runs?since=yesterday", "since"),
        ("/runs?since=2026-02-01&until=2026-01-01", "until"),
        ("/runs?agent=", "agent"),
        ("/runs?agent=echo&agent=boss", "agent"),
        ("/runs?colour=blue", "colour"),
    ] {
        assert_invalid(&server, path, parameter).await;
    }
    let (status, body) = server.get("/runs", RUN_A).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::FORBIDDEN, "missing_scope")
    );
    let (status, body) = send(server.request(reqwest::Method::GET, "/runs", None)).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::UNAUTHORIZED, "missing_key")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_searched_in_write_order() {
    let server = seeded().await;
    let loom = &server.loom;
    let child = child_of(&server, "acme", "s-2").await;
    let journal = loom.session_events("s-2", Some("acme")).await.unwrap();

    // One session: its journal, whole and in order.
    let (status, found) = server
        .get("/events?session_id=s-2&limit=10000", CONTENT_A)
        .await;
    assert_eq!(status, StatusCode::OK, "{found}");
    assert_eq!(found, serde_json::to_value(&journal).unwrap());

    // Every session of the tenant: each session's journal order kept, nothing of beta.
    let (_, all) = server.get("/events?limit=10000", CONTENT_A).await;
    let all = all.as_array().unwrap();
    let mut total = 0;
    for session in ["s-1", "s-2", "s-3", "s-4"] {
        let expected: Vec<u64> = loom
            .session_events(session, Some("acme"))
            .await
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect();
        let seen: Vec<u64> = all
            .iter()
            .filter(|e| e["session_id"] == session)
            .map(|e| e["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(seen, expected, "{session}");
        total += expected.len();
    }
    assert_eq!(all.len(), total);
    assert!(all.iter().all(|e| e["tenant_id"] == "acme"));
    // The default limit is 100.
    let (_, page) = server.get("/events", CONTENT_A).await;
    assert_eq!(page.as_array().unwrap().len(), total.min(100));

    // Filters.
    let select = |filter: &dyn Fn(&Value) -> bool| -> Vec<Value> {
        all.iter().filter(|e| filter(e)).cloned().collect()
    };
    let cases: Vec<(&str, Vec<Value>)> = vec![
        ("run_id=r-b1", select(&|e| e["run_id"] == "r-b1")),
        (
            "type=tool.called&type=tool.completed",
            select(&|e| e["type"] == "tool.called" || e["type"] == "tool.completed"),
        ),
        ("category=model", select(&|e| e["category"] == "model")),
        (
            "status=warning&status=error",
            select(&|e| e["status"] == "warning" || e["status"] == "error"),
        ),
        ("agent=helper", select(&|e| e["agent"] == "helper")),
        ("role=main", select(&|e| e["role"] == "main")),
        (
            "tool_name=lent",
            select(&|e| e["facets"]["tool_name"] == "lent"),
        ),
        (
            "session_id=s-2&agent=helper&type=model.responded",
            select(&|e| e["agent"] == "helper" && e["type"] == "model.responded"),
        ),
    ];
    for (query, expected) in cases {
        assert!(!expected.is_empty(), "{query} selects something");
        let (status, found) = server
            .get(&format!("/events?limit=10000&{query}"), CONTENT_A)
            .await;
        assert_eq!(status, StatusCode::OK, "{query}: {found}");
        assert_eq!(found, Value::Array(expected), "{query}");
    }
    // The model facets of the helper's answers.
    let answer = all
        .iter()
        .find(|e| e["type"] == "model.responded" && e["run_id"] == child.as_str())
        .unwrap();
    for facet in ["model_id", "model"] {
        let value = answer["facets"][facet].as_str().unwrap();
        let (_, found) = server
            .get(&format!("/events?limit=10000&{facet}={value}"), CONTENT_A)
            .await;
        assert_eq!(
            found,
            Value::Array(select(&|e| e["facets"][facet] == value)),
            "{facet}"
        );
    }
    // `since` and `until` bound `ts`.
    let middle = &all[total / 2];
    let ts = middle["ts"].as_str().unwrap();
    let (_, after) = server
        .get(&format!("/events?limit=10000&since={ts}"), CONTENT_A)
        .await;
    let (_, before) = server
        .get(&format!("/events?limit=10000&until={ts}"), CONTENT_A)
        .await;
    let (after, before) = (after.as_array().unwrap(), before.as_array().unwrap());
    assert!(after.iter().all(|e| e["ts"].as_str().unwrap() >= ts));
    assert!(before.iter().all(|e| e["ts"].as_str().unwrap() < ts));
    assert_eq!(after.len() + before.len(), total);

    // Paging with `after`: the pages put together are the whole search.
    let mut pages = Vec::new();
    let mut cursor = String::new();
    loop {
        let (status, page) = server
            .get(&format!("/events?limit=7{cursor}"), CONTENT_A)
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let page = page.as_array().unwrap().clone();
        let Some(last) = page.last() else { break };
        cursor = format!("&after={}", last["event_id"].as_str().unwrap());
        pages.extend(page);
    }
    assert_eq!(pages, *all);

    // A key limited to echo finds only echo's events.
    let (_, found) = server.get("/events?limit=10000", ECHO_A).await;
    assert_eq!(found, Value::Array(select(&|e| e["agent"] == "echo")));
    let (status, body) = server.get("/events?agent=helper", ECHO_A).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::FORBIDDEN, "agent_not_allowed")
    );

    for (path, parameter) in [
        ("/events?type=tool.nope", "type"),
        ("/events?type=", "type"),
        ("/events?category=weather", "category"),
        ("/events?status=fine", "status"),
        ("/events?limit=0", "limit"),
        ("/events?limit=10001", "limit"),
        ("/events?limit=-1", "limit"),
        (
            "/events?after=01a2272a-0000-7000-8000-000000000000",
            "after",
        ),
        ("/events?session_id=..%2Fbeta", "session_id"),
        ("/events?since=2026-13-01", "since"),
        ("/events?until=noon", "until"),
        ("/events?run=r-b1", "run"),
        ("/events?role=main&role=helper", "role"),
    ] {
        assert_invalid(&server, path, parameter).await;
    }
    let (status, _) = server.get("/events", RUN_A).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_show_the_run_tree_to_keys_allowed_on_all_its_agents() {
    let server = seeded().await;
    let (status, trace) = server.get("/traces/r-b1?session_id=s-2", CONTENT_A).await;
    assert_eq!(status, StatusCode::OK, "{trace}");
    assert_eq!(
        (
            trace["run_id"].as_str(),
            trace["agent"].as_str(),
            trace["status"].as_str()
        ),
        (Some("r-b1"), Some("boss"), Some("completed"))
    );
    assert_eq!(trace["output"], "Fini : Aide : attendu 300 ms");
    assert!(trace.get("redacted").is_none());
    assert_eq!(trace["content"], true);
    // The sub-agent's run is in the trace, under the boss's call that opened it.
    let spans = trace["spans"].as_array().unwrap();
    let child = spans
        .iter()
        .find(|s| s["kind"] == "run" && s["run_id"] != "r-b1")
        .unwrap();
    assert_eq!(child["attributes"]["gen_ai.agent.name"], "helper");
    let call = spans
        .iter()
        .find(|s| s["span_id"] == child["parent_span_id"])
        .unwrap();
    assert_eq!(
        (
            &call["kind"],
            &call["run_id"],
            &call["attributes"]["loom.tool_kind"]
        ),
        (&json!("tool"), &json!("r-b1"), &json!("agent"))
    );
    // Without its session, a run of a named session is unknown (as Loom-IA addresses it).
    let (status, body) = server.get("/traces/r-b1", CONTENT_A).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::NOT_FOUND, "unknown_run")
    );

    // Without read_content: no text, no arguments, no result.
    let (status, masked) = server.get("/traces/r-b1?session_id=s-2", READ_A).await;
    assert_eq!(status, StatusCode::OK);
    let text = masked.to_string();
    for content in ["secret", "Fini", "Aide", "délègue"] {
        assert!(!text.contains(content), "{content} in {masked}");
    }
    let redacted: Vec<&str> = masked["redacted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(redacted.contains(&"output"), "{redacted:?}");
    assert!(
        redacted
            .iter()
            .any(|p| p.ends_with(".attributes[\"gen_ai.tool.call.arguments\"]")),
        "{redacted:?}"
    );
    assert_eq!(masked["content"], false);
    assert_eq!(masked["spans"].as_array().unwrap().len(), spans.len());
    assert_eq!(masked["usage"], trace["usage"]);

    // A key on boss only cannot read the tree (its sub-agent is helper); echo's key reads echo.
    let (status, body) = server.get("/traces/r-b1?session_id=s-2", BOSS_A).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::FORBIDDEN, "agent_not_allowed")
    );
    assert!(message(&body).contains("'helper'"), "{body}");
    let (status, _) = server.get("/traces/r-b1?session_id=s-2", ECHO_A).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = server.get("/traces/r-e1?session_id=s-1", ECHO_A).await;
    assert_eq!(status, StatusCode::OK);

    let (status, body) = server.get("/traces/nope", CONTENT_A).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::NOT_FOUND, "unknown_run")
    );
    let (status, _) = server.get("/traces/r-b1?session_id=s-1", CONTENT_A).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_invalid(&server, "/traces/r-b1?session=s-2", "session").await;
    let (status, _) = server.get("/traces/r-b1?session_id=s-2", RUN_A).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_listed_shown_exported_reported_and_erased() {
    let server = seeded().await;
    let loom = &server.loom;

    let (status, sessions) = server.get("/sessions", CONTENT_A).await;
    assert_eq!(status, StatusCode::OK, "{sessions}");
    let ids: Vec<&str> = sessions
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["s-4", "s-3", "s-2", "s-1"]);
    let journal = loom.session_events("s-2", Some("acme")).await.unwrap();
    assert_eq!(sessions[2]["last_seq"], journal.len());
    assert!(sessions[2]["updated_at"].is_string());
    let (status, body) = server.get("/sessions", ECHO_A).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::FORBIDDEN, "agent_not_allowed")
    );

    // One session: its runs (the sub-run too) and nothing waiting.
    let child = child_of(&server, "acme", "s-2").await;
    let (status, info) = server.get("/sessions/s-2", READ_A).await;
    assert_eq!(status, StatusCode::OK, "{info}");
    assert_eq!(info["session_id"], "s-2");
    assert_eq!(info["last_seq"], journal.len());
    let runs = info["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(
        (
            runs[0]["run_id"].as_str(),
            runs[0]["agent"].as_str(),
            runs[0]["parent_run_id"].clone()
        ),
        (Some("r-b1"), Some("boss"), Value::Null)
    );
    assert_eq!(
        (
            runs[1]["run_id"].as_str(),
            runs[1]["agent"].as_str(),
            runs[1]["parent_run_id"].as_str()
        ),
        (Some(child.as_str()), Some("helper"), Some("r-b1"))
    );
    assert!(
        runs.iter()
            .all(|r| r["status"] == "completed" && r["unpiloted"] == false)
    );
    assert_eq!(runs[0]["iterations"], 2);
    assert_eq!(info["pending_approvals"], json!([]));
    assert!(info.get("redacted").is_none());

    // A paused session lists its approval; without read_content, not what it would send.
    let (_, paused) = server.get("/sessions/s-4", CONTENT_A).await;
    assert_eq!(paused["runs"][0]["status"], "paused");
    assert_eq!(paused["runs"][0]["unpiloted"], false);
    assert_eq!(
        paused["pending_approvals"][0]["arguments"],
        json!({"client": "Martin le secret"})
    );
    let (_, masked) = server.get("/sessions/s-4", READ_A).await;
    assert_eq!(masked["pending_approvals"][0]["tool_name"], "envoyer");
    assert_eq!(
        masked["redacted"],
        json!([
            "pending_approvals[0].arguments",
            "pending_approvals[0].reason"
        ])
    );
    assert!(!masked.to_string().contains("secret"));

    // The journal as NDJSON: exactly as stored, or masked.
    let response = server
        .request(
            reqwest::Method::GET,
            "/sessions/s-2/events",
            Some(CONTENT_A),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/x-ndjson"
    );
    assert_eq!(
        response.text().await.unwrap(),
        loom.export_session("s-2", Some("acme")).await.unwrap()
    );
    let (_, masked) =
        send(server.request(reqwest::Method::GET, "/sessions/s-2/events", Some(READ_A))).await;
    let masked = masked.as_str().unwrap().to_owned();
    let lines: Vec<Value> = masked
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), journal.len());
    assert!(!masked.contains("secret"));
    let user = lines.iter().find(|e| e["type"] == "message.user").unwrap();
    assert_eq!(user["redacted"], json!(["payload.message"]));

    // Files: listed (with origin filters), then read with read_content only.
    let (status, files) = server.get("/sessions/s-1/files", CONTENT_A).await;
    assert_eq!(status, StatusCode::OK, "{files}");
    let files = files.as_array().unwrap().clone();
    assert_eq!(files.len(), 1);
    let file = files[0]["file"].as_str().unwrap().to_owned();
    assert!(file.ends_with(".png"), "{file}");
    assert_eq!(
        files[0]["uri"].as_str().unwrap(),
        format!("artifact://acme/s-1/{file}")
    );
    assert_eq!(
        (
            files[0]["name"].as_str(),
            files[0]["media_type"].as_str(),
            files[0]["size"].as_u64(),
            files[0]["origin"].as_str(),
            files[0]["run_id"].as_str()
        ),
        (
            Some("plan été.png"),
            Some("image/png"),
            Some(PNG.len() as u64),
            Some("attachment"),
            Some("r-e1")
        )
    );
    let (_, only) = server
        .get(
            "/sessions/s-1/files?origin=attachment&origin=offload",
            CONTENT_A,
        )
        .await;
    assert_eq!(only, Value::Array(files.clone()));
    let (_, none) = server
        .get("/sessions/s-1/files?origin=offload", CONTENT_A)
        .await;
    assert_eq!(none, json!([]));
    assert_invalid(&server, "/sessions/s-1/files?origin=upload", "origin").await;
    let (_, masked) = server.get("/sessions/s-1/files", READ_A).await;
    assert!(masked[0].get("name").is_none());
    assert_eq!(masked[0]["redacted"], json!(["name"]));
    assert_eq!(masked[0]["file"], file.as_str());

    let response = server
        .request(
            reqwest::Method::GET,
            &format!("/sessions/s-1/files/{file}"),
            Some(CONTENT_A),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "image/png");
    assert_eq!(
        response.headers()["content-disposition"],
        "attachment; filename=\"plan _t_.png\"; filename*=UTF-8''plan%20%C3%A9t%C3%A9.png"
    );
    assert_eq!(response.bytes().await.unwrap().as_ref(), PNG);
    let (status, body) = server
        .get(&format!("/sessions/s-1/files/{file}"), READ_A)
        .await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::FORBIDDEN, "missing_scope")
    );
    assert_eq!(
        message(&body),
        "key 'read-a' lacks the scope 'read_content'"
    );
    for path in [
        "/sessions/s-1/files/0000.png".to_owned(),
        format!("/sessions/s-2/files/{file}"),
    ] {
        let (status, body) = server.get(&path, CONTENT_A).await;
        assert_eq!(
            (status, kind(&body)),
            (StatusCode::NOT_FOUND, "unknown_artifact"),
            "{path}"
        );
    }

    // The report, the reference's shape: the root run and its sub-agent's, each with its own
    // calls, and the sub-agent's rolled up into the root's.
    let (status, report) = server.get("/sessions/s-2/report", READ_A).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["session_id"], "s-2");
    assert_eq!(report["total"]["calls"], 4);
    let runs = report["runs"].as_object().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs["r-b1"]["calls"], 2);
    assert_eq!(runs["r-b1"]["with_sub_runs"]["calls"], 4);
    let helper = runs.values().find(|r| r["agent"] == "helper").unwrap();
    assert_eq!(
        (&helper["parent_run_id"], &helper["calls"]),
        (&json!("r-b1"), &json!(2))
    );
    assert_eq!(report["agents"]["helper"]["calls"], 2);
    assert_eq!(report["roles"]["main"]["calls"], 4);

    // A key limited to boss cannot reach a session where helper ran; echo's key reads echo's.
    for path in [
        "/sessions/s-2",
        "/sessions/s-2/events",
        "/sessions/s-2/files",
        "/sessions/s-2/report",
    ] {
        let (status, body) = server.get(path, BOSS_A).await;
        assert_eq!(
            (status, kind(&body)),
            (StatusCode::FORBIDDEN, "agent_not_allowed"),
            "{path}"
        );
    }
    let (status, _) = server.get("/sessions/s-1", ECHO_A).await;
    assert_eq!(status, StatusCode::OK);

    // Erasure: admin only; journal, files and all, then 404.
    let (status, body) = server.delete("/sessions/s-1", CONTENT_A).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::FORBIDDEN, "missing_scope")
    );
    let events = loom
        .session_events("s-1", Some("acme"))
        .await
        .unwrap()
        .len();
    let (status, deleted) = server.delete("/sessions/s-1", ADMIN_A).await;
    assert_eq!(status, StatusCode::OK, "{deleted}");
    assert_eq!(
        deleted,
        json!({"session_id": "s-1", "events_deleted": events, "files_deleted": 1,
               "idempotency_keys_deleted": 0})
    );
    let (status, body) = server.delete("/sessions/s-1", ADMIN_A).await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::NOT_FOUND, "unknown_session")
    );
    for path in [
        "/sessions/s-1".to_owned(),
        "/sessions/s-1/events".to_owned(),
        "/sessions/s-1/files".to_owned(),
        format!("/sessions/s-1/files/{file}"),
        "/sessions/s-1/report".to_owned(),
        "/sessions/nope".to_owned(),
        "/sessions/..%2Fbeta".to_owned(),
    ] {
        let (status, body) = server.get(&path, CONTENT_A).await;
        assert_eq!(
            (status, kind(&body)),
            (StatusCode::NOT_FOUND, "unknown_session"),
            "{path}"
        );
    }
    // beta's session of the same name is untouched.
    assert!(loom.session_events("s-1", Some("beta")).await.is_ok());
    assert_invalid(&server, "/sessions/s-2?full=true", "full").await;
    let (status, _) = server.get("/sessions", RUN_A).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_without_read_content_are_masked_and_an_open_api_sees_everything() {
    let server = seeded().await;
    let (status, full) = server.get("/runs/r-e1?session_id=s-1", CONTENT_A).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(full["text"], "Bonjour, voici le secret.");
    assert!(full.get("redacted").is_none());
    let (status, masked) = server.get("/runs/r-e1?session_id=s-1", READ_A).await;
    assert_eq!(status, StatusCode::OK);
    // The run's attachment is listed, without its name (a content field, as in its event).
    assert_eq!(
        masked["redacted"],
        json!(["text", "output", "artifacts[0].name"])
    );
    assert_eq!(masked["artifacts"][0]["uri"], full["artifacts"][0]["uri"]);
    assert!(full["artifacts"][0]["name"].is_string(), "{full}");
    assert!(!masked.to_string().contains("secret"));
    assert_eq!(
        (
            masked["status"].clone(),
            masked["usage"].clone(),
            masked["iterations"].clone()
        ),
        (
            full["status"].clone(),
            full["usage"].clone(),
            full["iterations"].clone()
        )
    );
    let (_, paused) = server.get("/runs/r-d1?session_id=s-4", READ_A).await;
    assert_eq!(
        paused["redacted"],
        json!([
            "pending_approvals[0].arguments",
            "pending_approvals[0].reason"
        ])
    );

    // Every event of the search loses its content, and says so.
    let (_, events) = server.get("/events?limit=10000", READ_A).await;
    let events = events.as_array().unwrap();
    assert!(!Value::Array(events.clone()).to_string().contains("secret"));
    for event in events {
        let masked: Vec<&str> = event["redacted"]
            .as_array()
            .map(|r| r.iter().map(|p| p.as_str().unwrap()).collect())
            .unwrap_or_default();
        let expected: &[&str] = match event["type"].as_str().unwrap() {
            "message.user" | "model.responded" => &["payload.message"],
            "tool.called" => &["payload.arguments"],
            "tool.completed" => &["payload.output"],
            "run.completed" => &["payload.output"],
            "approval.requested" => &["payload.arguments", "payload.reason"],
            "artifact.stored" => &["payload.name"],
            _ => &[],
        };
        assert_eq!(masked, expected, "{event}");
    }

    // An open API (no keys) reads everything.
    let open = Server::start(false).await;
    let result = open.run("default", "devis", "s-o", "r-o", Vec::new()).await;
    assert_eq!(result.status, loom_ia::RunStatus::Paused);
    let (_, read) =
        send(open.request(reqwest::Method::GET, "/runs/r-o?session_id=s-o", None)).await;
    assert_eq!(read["status"], "paused");
    assert_eq!(
        read["pending_approvals"][0]["arguments"]["client"],
        "Martin le secret"
    );
    assert!(read.get("redacted").is_none());
    let (_, events) =
        send(open.request(reqwest::Method::GET, "/events?session_id=s-o", None)).await;
    assert!(
        events
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e.get("redacted").is_none())
    );
    let (_, info) = send(open.request(reqwest::Method::GET, "/sessions/s-o", None)).await;
    assert_eq!(
        info["pending_approvals"][0]["reason"]
            .as_str()
            .map(str::is_empty),
        Some(false)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_follows_the_sub_runs_and_resumes_with_last_event_id() {
    let server = Server::start(true).await;
    let (status, accepted) = send(
        server
            .request(reqwest::Method::POST, "/agents/boss/runs", Some(ADMIN_A))
            .json(&json!({"message": "Calcule.", "session_id": "s-live", "run_id": "r-live", "background": true})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");

    // Read until the first event of the sub-run, then disconnect.
    let mut first = server
        .sse("r-live", "?session_id=s-live", CONTENT_A, None)
        .await;
    let mut seen = Vec::new();
    while let Some(frame) = first.next().await {
        let sub = frame.data["run_id"] != "r-live";
        seen.push(frame);
        if sub {
            break;
        }
    }
    drop(first);
    let last = seen.last().unwrap().id.clone().unwrap();
    let rest = server
        .sse(
            "r-live",
            "?session_id=s-live&after_seq=0",
            CONTENT_A,
            Some(&last),
        )
        .await
        .rest()
        .await;
    assert_eq!(rest.last().unwrap().event.as_deref(), Some("run.completed"));
    assert_eq!(rest.last().unwrap().data["run_id"], "r-live");

    // Nothing lost, nothing repeated: the whole session journal (the root and its sub-run).
    let journal = server
        .loom
        .session_events("s-live", Some("acme"))
        .await
        .unwrap();
    let mut all: Vec<u64> = seen.iter().map(Frame::seq).collect();
    all.extend(rest.iter().map(Frame::seq));
    assert_eq!(all, journal.iter().map(|e| e.seq).collect::<Vec<_>>());
    let child = child_of(&server, "acme", "s-live").await;
    let frames: Vec<&Frame> = seen.iter().chain(&rest).collect();
    let sub: Vec<&&Frame> = frames
        .iter()
        .filter(|f| f.data["run_id"] == child.as_str())
        .collect();
    assert_eq!(sub.first().unwrap().event.as_deref(), Some("run.started"));
    assert_eq!(sub.last().unwrap().event.as_deref(), Some("run.completed"));
    for frame in &frames {
        assert_eq!(frame.data["seq"].to_string(), *frame.id.as_ref().unwrap());
        assert_eq!(frame.data["type"].as_str(), frame.event.as_deref());
    }

    // Without the sub-runs: the root's own events only.
    let own = server
        .sse(
            "r-live",
            "?session_id=s-live&subruns=false",
            CONTENT_A,
            None,
        )
        .await
        .rest()
        .await;
    let root = server
        .loom
        .events(
            &server
                .loom
                .locate("r-live", Some("s-live"), Some("acme"))
                .await
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        own.iter().map(Frame::seq).collect::<Vec<_>>(),
        root.iter().map(|e| e.seq).collect::<Vec<_>>()
    );
    // The sub-run's events, masked without read_content.
    let masked = server
        .sse("r-live", "?session_id=s-live", READ_A, None)
        .await
        .rest()
        .await;
    assert_eq!(masked.len(), journal.len());
    let asked = masked
        .iter()
        .find(|f| f.event.as_deref() == Some("message.user") && f.data["run_id"] == child.as_str())
        .unwrap();
    assert_eq!(asked.data["redacted"], json!(["payload.message"]));
    assert!(
        masked
            .iter()
            .all(|f| !f.data.to_string().contains("Calcule"))
    );

    // A key allowed on boss but not on helper: the stream stops at the sub-run.
    let refused = server
        .sse("r-live", "?session_id=s-live", BOSS_A, None)
        .await
        .rest()
        .await;
    let (error, before) = refused.split_last().unwrap();
    assert_eq!(error.event.as_deref(), Some("error"));
    assert_eq!(error.id, None);
    assert_eq!(error.data["error"]["kind"], "agent_not_allowed");
    assert!(
        error.data["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("run {child} runs the agent 'helper'")),
        "{}",
        error.data
    );
    assert!(before.iter().all(|f| f.data["agent"] == "boss"));
    assert_eq!(
        before.iter().map(Frame::seq).collect::<Vec<_>>(),
        journal
            .iter()
            .take_while(|e| e.run_id == "r-live")
            .map(|e| e.seq)
            .collect::<Vec<_>>()
    );
    let own = server
        .sse("r-live", "?session_id=s-live&subruns=false", BOSS_A, None)
        .await
        .rest()
        .await;
    assert_eq!(own.last().unwrap().event.as_deref(), Some("run.completed"));
    // The refusal ends the stream at once, even when the run stays open (here it waits for
    // its sub-run, paused on an approval).
    let waiting = server
        .run("acme", "chef", "s-chef", "r-chef", Vec::new())
        .await;
    assert_eq!(waiting.status, loom_ia::RunStatus::WaitingChild);
    let refused = server
        .sse("r-chef", "?session_id=s-chef", BOSS_A, None)
        .await
        .rest()
        .await;
    let (error, before) = refused.split_last().unwrap();
    assert_eq!(error.data["error"]["kind"], "agent_not_allowed");
    assert!(before.iter().all(|f| f.data["agent"] == "chef"));

    let response = server
        .request(
            reqwest::Method::GET,
            "/runs/r-live/events?subruns=maybe",
            Some(CONTENT_A),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_one_tenant_never_sees_another_tenants_runs_sessions_events_traces_or_files() {
    let server = seeded().await;
    let loom = &server.loom;
    let beta_child = child_of(&server, "beta", "s-b").await;
    let beta_file = loom.session_files("s-1", &[], Some("beta")).await.unwrap()[0]
        .file
        .clone();

    // Tenant beta's own key reads all of it (so the refusals below are about the tenant).
    let beta_paths = [
        "/runs/rb-2?session_id=s-b".to_owned(),
        format!("/runs/{beta_child}?session_id=s-b"),
        "/traces/rb-2?session_id=s-b".to_owned(),
        "/sessions/s-b".to_owned(),
        "/sessions/s-b/events".to_owned(),
        "/sessions/s-b/files".to_owned(),
        "/sessions/s-b/report".to_owned(),
        format!("/sessions/s-1/files/{beta_file}"),
    ];
    for path in &beta_paths {
        let (status, body) = server.get(path, ADMIN_B).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
    }
    let (_, beta_runs) = server.get("/runs", ADMIN_B).await;
    assert_eq!(run_ids(&beta_runs).len(), 3);

    // Tenant acme's admin key: 404 on everything of beta's.
    for path in &beta_paths {
        let (status, body) = server.get(path, ADMIN_A).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
    }
    for path in [
        "/runs/rb-2?session_id=s-b",
        "/runs/rb-1?session_id=s-1",
        "/traces/rb-1?session_id=s-1",
    ] {
        let (status, _) = server.get(path, ADMIN_A).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
    }
    let response = server
        .request(
            reqwest::Method::GET,
            "/runs/rb-2/events?session_id=s-b",
            Some(ADMIN_A),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let (status, _) = server.delete("/sessions/s-b", ADMIN_A).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(loom.session_events("s-b", Some("beta")).await.is_ok());

    // Lists and searches hold only acme's.
    let (_, runs) = server.get("/runs?limit=200&sessions=200", ADMIN_A).await;
    assert!(
        !run_ids(&runs)
            .iter()
            .any(|id| id.starts_with("rb-") || *id == beta_child)
    );
    let (_, sessions) = server.get("/sessions", ADMIN_A).await;
    assert!(
        !sessions
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["session_id"] == "s-b")
    );
    let (_, events) = server.get("/events?limit=10000", ADMIN_A).await;
    assert!(
        events
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["tenant_id"] == "acme")
    );
    for query in [
        "session_id=s-b",
        "run_id=rb-2",
        "session_id=s-1&run_id=rb-1",
    ] {
        let (status, found) = server.get(&format!("/events?{query}"), ADMIN_A).await;
        assert_eq!((status, found), (StatusCode::OK, json!([])), "{query}");
    }
    // A session of the same name holds acme's runs and files only.
    let (_, info) = server.get("/sessions/s-1", ADMIN_A).await;
    assert_eq!(info["runs"][0]["run_id"], "r-e1");
    assert_eq!(info["runs"].as_array().unwrap().len(), 1);
    let (_, files) = server.get("/sessions/s-1/files", ADMIN_A).await;
    assert_eq!(files.as_array().unwrap().len(), 1);
    assert!(
        files[0]["uri"]
            .as_str()
            .unwrap()
            .starts_with("artifact://acme/s-1/")
    );
    let (status, body) = server
        .get(&format!("/sessions/s-1/files/{beta_file}"), ADMIN_A)
        .await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::NOT_FOUND, "unknown_artifact")
    );
    let (_, exported) =
        send(server.request(reqwest::Method::GET, "/sessions/s-1/events", Some(ADMIN_A))).await;
    assert!(
        exported
            .as_str()
            .unwrap()
            .lines()
            .all(|l| serde_json::from_str::<Value>(l).unwrap()["tenant_id"] == "acme")
    );
}

/// The JSON Schema `schema` of the document (its `$ref`s to `#/components/schemas/` resolved in
/// `document`), checking formats (`date-time`).
fn validator(document: &Value, schema: &Value) -> jsonschema::Validator {
    let mut root = schema.clone();
    root["components"] = document["components"].clone();
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(&root)
        .unwrap()
}

fn assert_valid(document: &Value, schema: &Value, body: &Value, what: &str) {
    let validator = validator(document, schema);
    let errors: Vec<String> = validator
        .iter_errors(body)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{what} does not match the document: {errors:?}\n{body}"
    );
}

/// Every read answer is what the document says, with and without `read_content`: the status is
/// documented and the body validates against the documented schema of that status. Masked
/// answers lose content fields the unmasked schema requires (a run's `text`, an approval's
/// `reason`) and gain `redacted`: the document must allow both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_read_answer_masked_or_not_matches_the_document() {
    let server = seeded().await;
    let document: Value = reqwest::get(format!(
        "{}/openapi.json",
        server.base.trim_end_matches("/v1")
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let child = child_of(&server, "acme", "s-2").await;
    let (_, files) = server.get("/sessions/s-1/files", CONTENT_A).await;
    assert!(files[0]["name"].is_string(), "{files}");
    let reads = [
        ("/runs/r-d1?session_id=s-4".to_owned(), "/v1/runs/{run_id}"),
        ("/runs/r-b1?session_id=s-2".to_owned(), "/v1/runs/{run_id}"),
        ("/runs".to_owned(), "/v1/runs"),
        ("/events?limit=10000".to_owned(), "/v1/events"),
        (
            "/traces/r-d1?session_id=s-4".to_owned(),
            "/v1/traces/{run_id}",
        ),
        (
            "/traces/r-b1?session_id=s-2".to_owned(),
            "/v1/traces/{run_id}",
        ),
        (
            format!("/traces/{child}?session_id=s-2"),
            "/v1/traces/{run_id}",
        ),
        ("/sessions".to_owned(), "/v1/sessions"),
        ("/sessions/s-4".to_owned(), "/v1/sessions/{session_id}"),
        ("/sessions/s-2".to_owned(), "/v1/sessions/{session_id}"),
        (
            "/sessions/s-1/files".to_owned(),
            "/v1/sessions/{session_id}/files",
        ),
        (
            "/sessions/s-2/report".to_owned(),
            "/v1/sessions/{session_id}/report",
        ),
    ];
    let mut masked = 0;
    for (path, template) in &reads {
        for key in [READ_A, CONTENT_A] {
            let (status, body) = server.get(path, key).await;
            assert_eq!(status, StatusCode::OK, "{path}: {body}");
            let schema = &document["paths"][template]["get"]["responses"]["200"]["content"]["application/json"]
                ["schema"];
            assert!(schema.is_object(), "{template} documents no JSON answer");
            assert_valid(&document, schema, &body, path);
            let text = body.to_string();
            if key == READ_A && text.contains("\"redacted\"") {
                masked += 1;
            }
            if key == CONTENT_A {
                assert!(!text.contains("\"redacted\""), "{path}: {body}");
            }
        }
    }
    // Masked answers were checked: the paused run, the events, both traces of the paused
    // run's tree or the boss's, the paused session and the named file all lost content.
    assert!(masked >= 6, "only {masked} masked answers");

    // The NDJSON journal: each line is an `Event`, masked or not.
    let schema = &document["paths"]["/v1/sessions/{session_id}/events"]["get"]["responses"]["200"]
        ["content"]["application/x-ndjson"]["schema"];
    for key in [READ_A, CONTENT_A] {
        let response = server
            .request(reqwest::Method::GET, "/sessions/s-4/events", Some(key))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let text = response.text().await.unwrap();
        for line in text.lines() {
            let event: Value = serde_json::from_str(line).unwrap();
            assert_valid(&document, schema, &event, "a journal line");
        }
    }

    // The documented schemas are not trivially loose: an answer without a metadata field
    // the document requires is refused.
    let (_, mut result) = server.get("/runs/r-d1?session_id=s-4", READ_A).await;
    result.as_object_mut().unwrap().remove("status");
    let schema = &document["paths"]["/v1/runs/{run_id}"]["get"]["responses"]["200"]["content"]["application/json"]
        ["schema"];
    assert!(!validator(&document, schema).is_valid(&result));
}
