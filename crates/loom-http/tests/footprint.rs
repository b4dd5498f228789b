//! What the REST server keeps per finished run: nothing beside the journal. Runs over a real
//! socket (synchronous, in the background and followed over SSE, a follow given up after its
//! first frame), then the instance drives no run and watches no session.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Sse;

use loom_ia::{
    Loom, Residents,
    config::{AgentSpec, Config, HttpServerConfig, LoomConfig, ModelSpec, Sdk, ToolRef},
};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Adds two numbers.
#[loom_ia::tool]
fn add(a: f64, b: f64) -> String {
    format!("{}", a + b)
}

/// Runs of each kind.
const EACH: usize = 20;

async fn server() -> (Loom, String, tempfile::TempDir) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let mut model = ModelSpec::new("fake-calc", Sdk::Fake, "FAKE");
    model.params.insert(
        "script".into(),
        json!([
            {"text": "Je calcule.", "tool_calls": [{"name": "add", "arguments": {"a": 12, "b": 30}}]},
            {"text": "Résultat : {{ tool_result }}."}
        ]),
    );
    let mut calc = AgentSpec::new("calc", "fake-calc");
    calc.tools = vec![ToolRef::new("add")];
    // The memory journal: the configuration's default.
    let raw = LoomConfig {
        models: vec![model],
        agents: vec![calc],
        ..LoomConfig::default()
    };
    let loom = Loom::new(Config::new(raw, dir.path().to_path_buf()).unwrap()).unwrap();
    loom.register("add", add_tool()).unwrap();
    let (listener, address) = loom_http::bind("127.0.0.1", 0).await.unwrap();
    let served = loom.clone();
    tokio::spawn(async move {
        loom_http::serve(
            served,
            listener,
            &HttpServerConfig::default(),
            std::future::pending(),
        )
        .await
    });
    (loom, format!("http://{address}/v1"), dir)
}

async fn post(client: &reqwest::Client, base: &str, body: Value) -> (StatusCode, Value) {
    let response = client
        .post(format!("{base}/agents/calc/runs"))
        .json(&body)
        .send()
        .await
        .unwrap();
    (response.status(), response.json().await.unwrap())
}

async fn follow(client: &reqwest::Client, base: &str, run_id: &str) -> Sse {
    let response = client
        .get(format!("{base}/runs/{run_id}/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    Sse::new(response)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_keeps_nothing_per_finished_run() {
    let (loom, base, _dir) = server().await;
    let client = reqwest::Client::new();
    let mut runs = Vec::new();
    for i in 0..EACH {
        let (status, body) = post(&client, &base, json!({"message": format!("sync {i}")})).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert_eq!(body["text"], "Résultat : 42.");
        runs.push(body["run_id"].as_str().unwrap().to_owned());

        let background = json!({"message": format!("background {i}"), "background": true});
        let (status, body) = post(&client, &base, background.clone()).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let run_id = body["run_id"].as_str().unwrap().to_owned();
        let frames = follow(&client, &base, &run_id).await.rest().await;
        assert_eq!(frames.len(), 17, "run {run_id}");
        runs.push(run_id);

        // A follower that leaves after the first frame: its stream ends with the run anyway.
        let (status, body) = post(&client, &base, background).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let run_id = body["run_id"].as_str().unwrap().to_owned();
        let mut sse = follow(&client, &base, &run_id).await;
        assert!(sse.next().await.is_some());
        drop(sse);
        runs.push(run_id);
    }
    for run_id in &runs {
        let done = loom_testkit::wait::until(format!("run {run_id} to complete"), async || {
            let response = client
                .get(format!("{base}/runs/{run_id}"))
                .send()
                .await
                .unwrap();
            let body: Value = response.json().await.unwrap();
            (body["status"] == "completed").then_some(body)
        })
        .await;
        assert_eq!(done["text"], "Résultat : 42.");
    }
    loom_testkit::wait::until(
        "the server to let go of its runs and followers",
        async || {
            let residents = loom.residents();
            if residents == Residents::default() {
                Ok(())
            } else {
                Err(format!("{residents:?}"))
            }
        },
    )
    .await;
}
