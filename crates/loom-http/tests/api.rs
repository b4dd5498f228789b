//! The REST API through a real socket: `loom_http::serve` on 127.0.0.1:0, driven by reqwest,
//! over a configuration built in Rust with scripted fake models. Every route, each status
//! code it answers, and SSE (resume with `Last-Event-ID`, end after the terminal event).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Frame, Sse};
use std::time::Duration;

use loom_ia::{
    Loom, TenantBudget,
    config::{
        AgentSpec, Config, EventsBackend, HttpServerConfig, LoomConfig, ModelSpec, Sdk, ToolRef,
    },
};
use reqwest::StatusCode;
use serde_json::{Value, json};

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

fn model(id: &str, script: Value) -> ModelSpec {
    let mut model = ModelSpec::new(id, Sdk::Fake, "FAKE");
    model.params.insert("script".into(), script);
    model
}

fn config(dir: &std::path::Path) -> Config {
    let mut echo = AgentSpec::new("echo", "fake-echo");
    echo.description = "Says hello.".into();
    let mut calc = AgentSpec::new("calc", "fake-calc");
    calc.tools = vec![ToolRef::new("lent")];
    let mut devis = AgentSpec::new("devis", "fake-devis");
    devis.tools = vec![ToolRef::new("envoyer")];
    let broken = AgentSpec::new("broken", "fake-broken");
    // Offered over MCP only.
    let mut interne = AgentSpec::new("interne", "fake-echo");
    interne.expose.rest = false;
    let mut raw = LoomConfig {
        models: vec![
            model("fake-echo", json!([{"text": "Bonjour."}])),
            model(
                "fake-calc",
                json!([
                    {"text": "J'attends.", "tool_calls": [{"name": "lent", "arguments": {"ms": 400}}], "with_text": "vite"},
                    {"text": "J'attends.", "tool_calls": [{"name": "lent", "arguments": {"ms": 5000}}], "with_text": "long"},
                    {"text": "Fini : {{ tool_result }}."}
                ]),
            ),
            model(
                "fake-devis",
                json!([
                    {"text": "J'envoie.", "tool_calls": [{"name": "envoyer", "arguments": {"client": "Martin"}}]},
                    {"text": "Résultat : {{ tool_result }}"}
                ]),
            ),
            model("fake-broken", json!([{"error": "auth"}])),
        ],
        agents: vec![echo, calc, devis, broken, interne],
        ..LoomConfig::default()
    };
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
    async fn start() -> Server {
        Server::start_with(|loom| loom).await
    }

    async fn start_with(adapt: impl FnOnce(Loom) -> Loom) -> Server {
        Server::start_until(adapt, std::future::pending()).await.0
    }

    /// Serves until `shutdown` resolves; the handle resolves when the server has stopped.
    async fn start_until(
        adapt: impl FnOnce(Loom) -> Loom,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> (Server, tokio::task::JoinHandle<std::io::Result<()>>) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let loom = Loom::new(config(dir.path())).unwrap();
        loom.register("lent", lent_tool()).unwrap();
        loom.register("envoyer", envoyer_tool()).unwrap();
        let loom = adapt(loom);
        let (listener, address) = loom_http::bind("127.0.0.1", 0).await.unwrap();
        let settings = HttpServerConfig {
            base_path: "/api".into(),
            max_body_bytes: 4096,
            ..HttpServerConfig::default()
        };
        let served = loom.clone();
        let handle =
            tokio::spawn(
                async move { loom_http::serve(served, listener, &settings, shutdown).await },
            );
        let server = Server {
            base: format!("http://{address}/api/v1"),
            client: reqwest::Client::new(),
            loom,
            _dir: dir,
        };
        (server, handle)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap())
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let response = self.post_raw(path, body).await;
        let status = response.status();
        (status, response.json().await.unwrap())
    }

    async fn post_raw(&self, path: &str, body: Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// Opens the SSE stream of a run.
    async fn sse(&self, run_id: &str, query: &str, last_event_id: Option<&str>) -> Sse {
        let mut request = self
            .client
            .get(format!("{}/runs/{run_id}/events{query}", self.base));
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

fn ids(frames: &[Frame]) -> Vec<u64> {
    frames
        .iter()
        .map(|f| f.id.as_deref().unwrap().parse().unwrap())
        .collect()
}

fn kind(body: &Value) -> &str {
    body["error"]["kind"].as_str().unwrap()
}

#[tokio::test]
async fn agents_are_listed_under_the_base_path() {
    let server = Server::start().await;
    let (status, body) = server.get("/agents").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!([
            {"name": "echo", "description": "Says hello."},
            {"name": "calc", "description": ""},
            {"name": "devis", "description": ""},
            {"name": "broken", "description": ""}
        ])
    );
    // An agent kept off the REST API is neither listed nor runnable.
    let (status, body) = server
        .post("/agents/interne/runs", json!({"message": "Salut"}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(kind(&body), "unknown_agent");
    assert_eq!(body["error"]["message"], "unknown agent 'interne'");
    // Outside `<base_path>/v1` nothing is served.
    let response = server
        .client
        .get(server.base.replace("/api/v1", "/v1/agents"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let body: Value = response.json().await.unwrap();
    assert_eq!(kind(&body), "not_found");
}

#[tokio::test]
async fn a_synchronous_run_is_created_and_read_back() {
    let server = Server::start().await;
    let (status, created) = server
        .post(
            "/agents/echo/runs",
            json!({"message": "Salut", "session_id": "s1", "run_id": "r1", "user_id": "u1",
                   "metadata": {"canal": "web"}, "judges": "auto"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["status"], "completed");
    assert_eq!(created["text"], "Bonjour.");
    assert_eq!(
        (created["run_id"].as_str(), created["session_id"].as_str()),
        (Some("r1"), Some("s1"))
    );

    let (status, read) = server.get("/runs/r1?session_id=s1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read, created);
    // The metadata reached the journal.
    let run = server.loom.locate("r1", Some("s1"), None).await.unwrap();
    let events = server.loom.events(&run).await.unwrap();
    let started = serde_json::to_value(&events[0]).unwrap();
    assert_eq!(
        started["payload"]["context"]["metadata"]["canal"], "web",
        "{started}"
    );

    // The same run id again: 409, in its session or in any other of the tenant (run ids are
    // unique per tenant), naming the session that holds it; nothing is written.
    for (session, message) in [
        (
            json!("s1"),
            "request refused: run r1 already exists in session s1",
        ),
        (
            json!("s2"),
            "request refused: run r1 already exists in session s1",
        ),
        (
            Value::Null,
            "request refused: run r1 already exists in session s1",
        ),
    ] {
        let (status, body) = server
            .post(
                "/agents/echo/runs",
                json!({"message": "Encore", "session_id": session, "run_id": "r1"}),
            )
            .await;
        assert_eq!(
            (status, kind(&body), body["error"]["message"].as_str()),
            (StatusCode::CONFLICT, "refused", Some(message)),
            "{session}: {body}"
        );
    }
    for session in ["s2", "r1"] {
        let (status, body) = server.get(&format!("/sessions/{session}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{session}: {body}");
    }
}

/// A run is read in the session `session_id` names, else in the session named after it (as
/// Loom-IA addresses it): a run of a named session asked without its session is unknown, on
/// every read route that takes `session_id` (result, events, trace).
#[tokio::test]
async fn a_run_of_a_named_session_is_read_with_its_session() {
    let server = Server::start().await;
    for body in [
        json!({"message": "Salut", "session_id": "rest-s", "run_id": "rest-1"}),
        json!({"message": "Salut", "run_id": "alone-1"}),
    ] {
        let (status, created) = server.post("/agents/echo/runs", body).await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
    }
    for path in ["/runs/rest-1", "/runs/rest-1/events", "/traces/rest-1"] {
        let response = server
            .client
            .get(format!("{}{path}", server.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(
            (kind(&body), body["error"]["message"].as_str()),
            ("unknown_run", Some("run rest-1 not found")),
            "{path}"
        );
        // With its session, or in another session than its own: found, and not.
        let response = server
            .client
            .get(format!("{}{path}?session_id=rest-s", server.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let (status, _) = server.get(&format!("{path}?session_id=alone-1")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
    }
    // A run opened without a session is its own session: found without `session_id`.
    let (status, read) = server.get("/runs/alone-1").await;
    assert_eq!(
        (status, read["session_id"].as_str()),
        (StatusCode::OK, Some("alone-1"))
    );
    let (status, trace) = server.get("/traces/alone-1").await;
    assert_eq!(
        (status, trace["run_id"].as_str()),
        (StatusCode::OK, Some("alone-1"))
    );
    let frames = server.sse("alone-1", "", None).await.rest().await;
    assert_eq!(
        frames.last().unwrap().event.as_deref(),
        Some("run.completed")
    );
    // A run id no session can be named after is unknown, not an unusable session id.
    let (status, body) = server.get("/runs/no%20such").await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::NOT_FOUND, "unknown_run"),
        "{body}"
    );
}

/// `GET /sessions/{id}/events`: the journal as written, one event per line, as NDJSON.
#[tokio::test]
async fn a_session_journal_is_its_lines_as_written() {
    let server = Server::start().await;
    for run in ["j-1", "j-2"] {
        let (status, created) = server
            .post(
                "/agents/echo/runs",
                json!({"message": "Salut", "session_id": "journal-s", "run_id": run}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
    }
    let response = server
        .client
        .get(format!("{}/sessions/journal-s/events", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/x-ndjson"
    );
    let body = response.text().await.unwrap();
    let written =
        std::fs::read_to_string(server._dir.path().join("journal/default/journal-s.jsonl"))
            .unwrap();
    assert_eq!(body, written);
    assert_eq!(body.lines().count(), 2 * 8);
}

/// A synchronous request whose client goes away mid-run: the run goes on and closes.
#[tokio::test]
async fn a_synchronous_run_outlives_a_client_that_goes_away() {
    let server = Server::start().await;
    let request = server
        .client
        .post(format!("{}/agents/calc/runs", server.base))
        .json(&json!({"message": "vite", "run_id": "r-gone"}))
        .send();
    let client = tokio::spawn(request);
    // The client goes away once the run exists (a client that leaves before leaves nothing to
    // outlive it: a fixed client timeout raced the server on a loaded machine).
    loom_testkit::wait::until("the run to start", async || {
        let (status, body) = server.get("/runs/r-gone").await;
        if status == StatusCode::OK {
            Ok(())
        } else {
            Err(format!("{status} {body}"))
        }
    })
    .await;
    assert!(
        !client.is_finished(),
        "the request was answered before its client could go away"
    );
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    let completed = loom_testkit::wait::until("the run to go on without its client", async || {
        let (status, body) = server.get("/runs/r-gone").await;
        if status == StatusCode::OK && body["status"] == "completed" {
            Ok(body)
        } else {
            Err(format!("{status} {body}"))
        }
    })
    .await;
    assert_eq!(completed["text"], "Fini : attendu 400 ms.");
}

#[tokio::test]
async fn a_failed_run_is_still_created() {
    let server = Server::start().await;
    let (status, body) = server
        .post("/agents/broken/runs", json!({"message": "Salut"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["status"], "failed");
    assert!(body["error"].is_string(), "{body}");
}

#[tokio::test]
async fn unknown_things_are_404_and_bad_requests_are_422_or_413() {
    let server = Server::start().await;
    let (status, body) = server
        .post("/agents/nope/runs", json!({"message": "x"}))
        .await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::NOT_FOUND, "unknown_agent")
    );
    assert!(body["error"]["message"].as_str().unwrap().contains("nope"));
    let (status, body) = server.get("/runs/nope").await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::NOT_FOUND, "unknown_run")
    );
    for path in [
        "/runs/nope/approve",
        "/runs/nope/reject",
        "/runs/nope/cancel",
    ] {
        let (status, body) = server.post(path, json!({})).await;
        assert_eq!(
            (status, kind(&body)),
            (StatusCode::NOT_FOUND, "unknown_run"),
            "{path}"
        );
    }
    let response = server
        .client
        .get(format!("{}/runs/nope/events", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);

    for bad in [
        json!({}),
        json!({"message": ""}),
        json!({"message": 3}),
        json!({"message": "x", "judges": "sometimes"}),
        json!({"message": "x", "colour": "blue"}),
    ] {
        let (status, body) = server.post("/agents/echo/runs", bad.clone()).await;
        assert_eq!(
            (status, kind(&body)),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_body"),
            "{bad}"
        );
    }
    let response = server
        .client
        .post(format!("{}/agents/echo/runs", server.base))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body: Value = response.json().await.unwrap();
    assert_eq!(kind(&body), "invalid_body");

    let (status, body) = server
        .post("/agents/echo/runs", json!({"message": "x".repeat(5000)}))
        .await;
    assert_eq!(
        (status, kind(&body)),
        (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large")
    );

    // A parameter the route does not document is refused, as on every route.
    let (status, body) = server.get("/runs/nope?after_seq=abc").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        body["error"]["message"],
        "after_seq: unknown parameter (expected: session_id)"
    );
    let response = server
        .client
        .get(format!("{}/runs/nope/events?after_seq=abc", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body: Value = response.json().await.unwrap();
    assert_eq!(kind(&body), "invalid_query");
}

#[tokio::test]
async fn an_exhausted_tenant_budget_is_429_with_retry_after() {
    let server = Server::start_with(|loom| {
        loom.with_tenant_budget(
            "default",
            TenantBudget {
                max_tokens_per_day: Some(1),
                ..TenantBudget::default()
            },
        )
    })
    .await;
    let (status, _) = server
        .post("/agents/echo/runs", json!({"message": "Salut"}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let response = server
        .post_raw("/agents/echo/runs", json!({"message": "Encore"}))
        .await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=86_400).contains(&retry), "{retry}");
    let body: Value = response.json().await.unwrap();
    assert_eq!(kind(&body), "budget_exhausted");
}

#[tokio::test]
async fn approve_and_reject_decide_and_the_run_goes_on() {
    let server = Server::start().await;
    let (status, paused) = server
        .post("/agents/devis/runs", json!({"message": "Envoie le devis."}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(paused["status"], "paused");
    let run_id = paused["run_id"].as_str().unwrap().to_owned();
    let call_id = paused["pending_approvals"][0]["call_id"]
        .as_str()
        .unwrap()
        .to_owned();

    let (status, body) = server
        .post(
            &format!("/runs/{run_id}/approve"),
            json!({"call_id": call_id, "by": "denis", "reason": "ok", "arguments": {"client": "Dupont"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"run_id": run_id, "calls": [call_id]}));
    // The run is driven on in the background: follow it to its end.
    let frames = server.sse(&run_id, "", None).await.rest().await;
    assert_eq!(
        frames.last().unwrap().event.as_deref(),
        Some("run.completed")
    );
    let (_, done) = server.get(&format!("/runs/{run_id}")).await;
    assert_eq!(done["text"], "Résultat : devis envoyé à Dupont");
    // Nothing waits any more: no such approval, 404.
    let (status, body) = server
        .post(&format!("/runs/{run_id}/approve"), json!({}))
        .await;
    assert_eq!(
        (status, kind(&body), body["error"]["message"].as_str()),
        (
            StatusCode::NOT_FOUND,
            "unknown_approval",
            Some(format!("run {run_id}: nothing is waiting for a decision").as_str())
        )
    );

    let (_, paused) = server
        .post("/agents/devis/runs", json!({"message": "Envoie le devis."}))
        .await;
    let run_id = paused["run_id"].as_str().unwrap().to_owned();
    // A call id no request waits for: 404 for both decisions, and nothing is written.
    for decision in ["approve", "reject"] {
        let (status, body) = server
            .post(
                &format!("/runs/{run_id}/{decision}"),
                json!({"call_id": "nope", "by": "denis"}),
            )
            .await;
        assert_eq!(
            (status, kind(&body)),
            (StatusCode::NOT_FOUND, "unknown_approval"),
            "{decision}: {body}"
        );
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("no approval is waiting for call 'nope'"),
            "{body}"
        );
    }
    let (_, still) = server.get(&format!("/runs/{run_id}")).await;
    assert_eq!(still["status"], "paused");
    let (status, body) = server
        .post(
            &format!("/runs/{run_id}/reject"),
            json!({"by": "denis", "reason": "pas encore"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["calls"].as_array().unwrap().len(), 1);
    let frames = server.sse(&run_id, "", None).await.rest().await;
    assert_eq!(
        frames.last().unwrap().event.as_deref(),
        Some("run.completed")
    );
    let (_, done) = server.get(&format!("/runs/{run_id}")).await;
    assert!(
        done["text"]
            .as_str()
            .unwrap()
            .contains("rejected by denis: pas encore"),
        "{done}"
    );
}

#[tokio::test]
async fn a_background_run_is_202_and_followed_until_completed() {
    let server = Server::start().await;
    let (status, accepted) = server
        .post(
            "/agents/calc/runs",
            json!({"message": "vite", "background": true}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let run_id = accepted["run_id"].as_str().unwrap().to_owned();
    assert!(accepted["session_id"].is_string());
    // The run's status when it was accepted (it goes on in the background).
    assert!(accepted["status"].is_string(), "{accepted}");
    assert_ne!(accepted["status"], "failed");

    let frames = server.sse(&run_id, "", None).await.rest().await;
    let types: Vec<&str> = frames.iter().map(|f| f.event.as_deref().unwrap()).collect();
    assert_eq!(types.first(), Some(&"run.started"));
    assert_eq!(types.last(), Some(&"run.completed"));
    assert!(types.contains(&"tool.completed"), "{types:?}");
    // Each frame is the event itself: `id` its seq, `event` its type.
    for frame in &frames {
        assert_eq!(frame.data["seq"].to_string(), *frame.id.as_ref().unwrap());
        assert_eq!(frame.data["type"].as_str(), frame.event.as_deref());
        assert_eq!(frame.data["run_id"], run_id.as_str());
    }
    let (_, done) = server.get(&format!("/runs/{run_id}")).await;
    assert_eq!(done["text"], "Fini : attendu 400 ms.");
}

#[tokio::test]
async fn an_sse_client_resumes_with_last_event_id_exactly_after_what_it_saw() {
    let server = Server::start().await;
    let (_, accepted) = server
        .post(
            "/agents/calc/runs",
            json!({"message": "vite", "background": true}),
        )
        .await;
    let run_id = accepted["run_id"].as_str().unwrap().to_owned();
    let session = accepted["session_id"].as_str().unwrap().to_owned();

    // Read two events, then disconnect.
    let mut first = server
        .sse(&run_id, &format!("?session_id={session}"), None)
        .await;
    let seen = vec![first.next().await.unwrap(), first.next().await.unwrap()];
    drop(first);
    let last = seen[1].id.clone().unwrap();
    // `Last-Event-ID` wins over `after_seq`.
    let rest = server
        .sse(
            &run_id,
            &format!("?session_id={session}&after_seq=0"),
            Some(&last),
        )
        .await
        .rest()
        .await;
    assert_eq!(rest.last().unwrap().event.as_deref(), Some("run.completed"));

    let run = server
        .loom
        .locate(&run_id, Some(&session), None)
        .await
        .unwrap();
    let journal: Vec<u64> = server
        .loom
        .events(&run)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    let mut all = ids(&seen);
    all.extend(ids(&rest));
    assert_eq!(all, journal, "nothing lost, nothing repeated");

    // After the end, `after_seq` replays from there and a resume after the terminal event is
    // empty.
    let third = journal[2];
    let tail = server
        .sse(&run_id, &format!("?after_seq={third}"), None)
        .await
        .rest()
        .await;
    assert_eq!(ids(&tail), journal[3..].to_vec());
    let end = journal.last().unwrap().to_string();
    assert!(
        server
            .sse(&run_id, "", Some(&end))
            .await
            .rest()
            .await
            .is_empty()
    );

    let response = server
        .client
        .get(format!("{}/runs/{run_id}/events", server.base))
        .header("Last-Event-ID", "abc")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body: Value = response.json().await.unwrap();
    assert_eq!(kind(&body), "invalid_header");
}

#[tokio::test]
async fn a_running_run_is_cancelled() {
    let server = Server::start().await;
    let (status, accepted) = server
        .post(
            "/agents/calc/runs",
            json!({"message": "long", "background": true}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let run_id = accepted["run_id"].as_str().unwrap().to_owned();
    let mut events = server.sse(&run_id, "", None).await;
    // Wait until the slow tool is called.
    while let Some(frame) = events.next().await {
        if frame.event.as_deref() == Some("tool.called") {
            break;
        }
    }
    // No body at all: `by` defaults.
    let response = server
        .client
        .post(format!("{}/runs/{run_id}/cancel", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body, json!({"run_id": run_id, "cancelled": true}));
    let rest = events.rest().await;
    let closing = rest.last().unwrap();
    assert_eq!(closing.event.as_deref(), Some("run.cancelled"));
    // The pilot of this server closed it, naming who cancelled (the default).
    assert_eq!(closing.data["payload"]["by"], "api");
    assert_eq!(closing.data["payload"]["reason"], "requested");
    let (_, result) = server.get(&format!("/runs/{run_id}")).await;
    assert_eq!(result["status"], "cancelled");
    // Already closed: nothing to cancel.
    let (status, body) = server
        .post(&format!("/runs/{run_id}/cancel"), json!({"by": "denis"}))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["cancelled"], false);
}

#[tokio::test]
async fn a_graceful_shutdown_leaves_the_runs_in_flight_open_and_answers_them_503() {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (server, handle) = Server::start_until(|loom| loom, async move {
        let _ = stopped.await;
    })
    .await;
    let server = std::sync::Arc::new(server);
    // A synchronous run whose tool takes 400 ms.
    let request = {
        let server = server.clone();
        tokio::spawn(async move {
            server
                .post(
                    "/agents/calc/runs",
                    json!({"message": "vite", "session_id": "s-stop", "run_id": "r-stop"}),
                )
                .await
        })
    };
    let mut events = loom_testkit::wait::until("the run's event stream", async || {
        let response = server
            .client
            .get(format!(
                "{}/runs/r-stop/events?session_id=s-stop",
                server.base
            ))
            .send()
            .await
            .unwrap();
        match response.status() {
            StatusCode::OK => Ok(Sse::new(response)),
            status => Err(status),
        }
    })
    .await;
    while let Some(frame) = events.next().await {
        if frame.event.as_deref() == Some("tool.called") {
            break;
        }
    }
    stop.send(()).unwrap();
    // The open SSE stream ends, the tool's step finishes, the in-flight request is answered
    // 503 `interrupted` with the run's ids, and the server stops.
    let _ = events.rest().await;
    let (status, body) = tokio::time::timeout(Duration::from_secs(30), request)
        .await
        .expect("the in-flight request was not answered")
        .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["kind"], "interrupted");
    assert_eq!(body["error"]["run_id"], "r-stop");
    assert_eq!(body["error"]["session_id"], "s-stop");
    tokio::time::timeout(Duration::from_secs(30), handle)
        .await
        .expect("the server did not stop")
        .unwrap()
        .unwrap();
    // The journal: the step's result is written, the run is open, its lease handed back.
    let run = server
        .loom
        .locate("r-stop", Some("s-stop"), None)
        .await
        .unwrap();
    let journal = server.loom.events(&run).await.unwrap();
    let types: Vec<&str> = journal.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        types[types.len() - 3..],
        ["tool.completed", "step.completed", "run.claimed"]
    );
    assert!(!journal.iter().any(|e| e.payload.is_closing()));

    // Another instance over the same journal finishes it.
    let next = Loom::new(config(server._dir.path())).unwrap();
    next.register("lent", lent_tool()).unwrap();
    let result = next.resume(&run).await.unwrap();
    assert_eq!(result.status.to_string(), "completed");
    assert_eq!(result.text, "Fini : attendu 400 ms.");
}
