//! Session state over REST, through a real socket: the `state` of a run request journaled and
//! read back with `GET /sessions/{id}/state` (scope `read_content`), a refused state answered
//! 422 with nothing written, an unknown session 404.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use loom_ia::{
    Loom,
    config::{
        AgentSpec, Config, EventsBackend, HttpServerConfig, LoomConfig, ModelSpec, Sdk, StateKey,
    },
};
use reqwest::StatusCode;
use serde_json::{Map, Value, json};

fn key(schema: Value, default: Option<Value>) -> StateKey {
    StateKey {
        schema: schema.as_object().unwrap().clone(),
        description: String::new(),
        from: Vec::new(),
        required: false,
        default,
    }
}

fn config(dir: &std::path::Path) -> Config {
    let mut carnet = AgentSpec::new("carnet", "fake-1");
    carnet
        .state
        .insert("client".into(), key(json!({"type": "string"}), None));
    carnet.state.insert(
        "lang".into(),
        key(json!({"type": "string"}), Some(json!("fr"))),
    );
    let mut model = ModelSpec::new("fake-1", Sdk::Fake, "FAKE");
    model
        .params
        .insert("script".into(), json!([{"text": "Noté."}]));
    let mut raw = LoomConfig {
        models: vec![model],
        agents: vec![carnet],
        ..LoomConfig::default()
    };
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("journal".into());
    Config::new(raw, dir.to_path_buf()).unwrap()
}

#[tokio::test]
async fn a_run_requests_state_is_journaled_and_read_back() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let loom = Loom::new(config(dir.path())).unwrap();
    let (listener, address) = loom_http::bind("127.0.0.1", 0).await.unwrap();
    let settings = HttpServerConfig::default();
    tokio::spawn(async move {
        loom_http::serve(loom, listener, &settings, std::future::pending()).await
    });
    let base = format!("http://{address}/v1");
    let client = reqwest::Client::new();
    let post = |body: Value| {
        client
            .post(format!("{base}/agents/carnet/runs"))
            .json(&body)
            .send()
    };
    let get = |path: &str| client.get(format!("{base}{path}")).send();

    let created =
        post(json!({"message": "Bonjour", "session_id": "c1", "state": {"client": "C-42"}}))
            .await
            .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let answer = get("/sessions/c1/state").await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let state: Map<String, Value> = answer.json().await.unwrap();
    assert_eq!(
        Value::Object(state),
        json!({"client": "C-42", "lang": "fr"})
    );

    // Refused before anything is written.
    for (state, expected) in [
        (
            json!({"client": 7}),
            "request refused: session state: client: does not follow its schema",
        ),
        (
            json!({"colour": "blue"}),
            "request refused: session state: colour: not a state key of the agent",
        ),
    ] {
        let refused = post(json!({"message": "Bonjour", "session_id": "c2", "state": state}))
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let body: Value = refused.json().await.unwrap();
        assert_eq!(body["error"]["kind"], "invalid_request", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(expected), "{message}");
    }
    assert_eq!(
        get("/sessions/c2").await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get("/sessions/c2/state").await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    // Not an object.
    let refused = post(json!({"message": "Bonjour", "state": ["client"]}))
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
}
