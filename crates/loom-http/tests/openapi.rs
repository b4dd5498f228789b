//! The OpenAPI document through a real socket: `loom_http::serve` on 127.0.0.1:0, the document
//! fetched from `<base_path>/openapi.json` with reqwest. It is OpenAPI 3.1, it holds every
//! route of the router (and the router answers every route it holds), each operation names its
//! security and error responses, and the docs follow the profile and `server.http.docs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use loom_ia::{
    Loom, Profile,
    config::{AgentSpec, Config, EventsBackend, HttpServerConfig, LoomConfig, ModelSpec, Sdk},
};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Every route of the API: method and path under `<base_path>`. A route added to the router
/// must be added here (and annotated: the router is built from the annotated handlers).
const ROUTES: &[(&str, &str)] = &[
    ("get", "/api/v1/agents"),
    ("post", "/api/v1/agents/{name}/runs"),
    ("get", "/api/v1/runs/{run_id}"),
    ("get", "/api/v1/runs/{run_id}/events"),
    ("post", "/api/v1/runs/{run_id}/approve"),
    ("post", "/api/v1/runs/{run_id}/reject"),
    ("post", "/api/v1/runs/{run_id}/cancel"),
    ("get", "/api/v1/runs"),
    ("get", "/api/v1/events"),
    ("get", "/api/v1/traces/{run_id}"),
    ("get", "/api/v1/sessions"),
    ("get", "/api/v1/sessions/{session_id}"),
    ("delete", "/api/v1/sessions/{session_id}"),
    ("get", "/api/v1/sessions/{session_id}/events"),
    ("get", "/api/v1/sessions/{session_id}/files"),
    ("get", "/api/v1/sessions/{session_id}/files/{file}"),
    ("get", "/api/v1/sessions/{session_id}/state"),
    ("get", "/api/v1/sessions/{session_id}/report"),
    ("post", "/api/v1/sessions/{session_id}/compact"),
    ("post", "/api/v1/hooks/{name}"),
    ("get", "/api/v1/healthz"),
    ("get", "/api/v1/readyz"),
];

fn config(dir: &std::path::Path, profile: Option<Profile>, keys: bool) -> Config {
    let mut model = ModelSpec::new("fake-echo", Sdk::Fake, "FAKE");
    model
        .params
        .insert("script".into(), json!([{"text": "Bonjour."}]));
    let mut echo = AgentSpec::new("echo", "fake-echo");
    echo.description = "Says hello.".into();
    let mut raw = LoomConfig {
        models: vec![model],
        agents: vec![echo],
        profile,
        ..LoomConfig::default()
    };
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("journal".into());
    if keys {
        // The hash of `lk_test`, scope admin.
        raw.security.api_keys = serde_json::from_value(json!([{
            "id": "test",
            "hash": "sha256:261b46e608d87c826b7fcecf64cd163422257f85f2b38b863043ced7ee009016",
            "scopes": ["admin"],
        }]))
        .unwrap();
    }
    Config::new(raw, dir.to_path_buf()).unwrap()
}

/// Serves `loom` on a free port; the base URL (with the base path `/api`).
async fn serve(loom: Loom, docs: Option<bool>) -> String {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (listener, address) = loom_http::bind("127.0.0.1", 0).await.unwrap();
    let settings = HttpServerConfig {
        base_path: "/api".into(),
        docs,
        ..HttpServerConfig::default()
    };
    tokio::spawn(async move {
        loom_http::serve(loom, listener, &settings, std::future::pending()).await
    });
    format!("http://{address}/api")
}

#[tokio::test]
async fn the_document_is_openapi_3_1_with_every_route_of_the_router() {
    let dir = tempfile::tempdir().unwrap();
    let loom = Loom::new(config(dir.path(), None, false)).unwrap();
    let base = serve(loom, None).await;
    let client = reqwest::Client::new();
    let response = client
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    let document: Value = response.json().await.unwrap();
    assert!(
        document["openapi"].as_str().unwrap().starts_with("3.1."),
        "{}",
        document["openapi"]
    );
    assert_eq!(document["info"]["title"], "Loom REST API");

    let paths = document["paths"].as_object().unwrap();
    let mut documented: Vec<(String, String)> = paths
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .filter(|k| ["get", "post", "put", "patch", "delete"].contains(&k.as_str()))
                .map(move |method| (method.clone(), path.clone()))
        })
        .collect();
    documented.sort();
    let mut expected: Vec<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    expected.sort();
    assert_eq!(documented, expected);

    for (method, path) in &documented {
        let operation = &paths[path][method];
        if operation["tags"] == json!(["operations"]) {
            // Liveness and readiness: never a key, and nothing a key could cause.
            assert_eq!(operation["security"], json!([{}]), "{method} {path}");
            continue;
        }
        // Security: bearer or X-API-Key, and (no key declared here) no key at all.
        let security = operation["security"].as_array().unwrap();
        assert!(security.contains(&json!({"bearer": []})), "{method} {path}");
        assert!(
            security.contains(&json!({"api_key": []})),
            "{method} {path}"
        );
        assert!(
            security.contains(&json!({})),
            "{method} {path}: the API is open"
        );
        // The errors a key can cause, with the error body; no key is declared, so no 401.
        assert_eq!(
            operation["responses"]["403"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/Error",
            "{method} {path} 403"
        );
        assert!(
            operation["responses"].get("401").is_none(),
            "{method} {path}"
        );
        // The router serves every documented route: a concrete request is answered by its
        // handler, never by the fallback (`not_found`, "no route for …").
        let url = format!(
            "{}{}",
            base.trim_end_matches("/api"),
            path.replace("{name}", "echo")
                .replace("{run_id}", "nope")
                .replace("{session_id}", "nope")
                .replace("{file}", "nope")
        );
        let request = match method.as_str() {
            "get" => client.get(&url),
            "delete" => client.delete(&url),
            _ => client.post(&url).json(&json!({"message": "Salut"})),
        };
        let response = request.send().await.unwrap();
        let status = response.status();
        let body = response.text().await.unwrap();
        assert!(
            !body.contains("\"not_found\""),
            "{method} {path} is documented but not routed: {status} {body}"
        );
    }

    // The schemas the responses name are in the document, the facade's from schemars.
    let schemas = document["components"]["schemas"].as_object().unwrap();
    for name in [
        "RunResult",
        "RunStatus",
        "Message",
        "Usage",
        "Error",
        "RunRequest",
    ] {
        assert!(schemas.contains_key(name), "{name} missing");
    }
    assert_eq!(
        paths["/api/v1/agents/{name}/runs"]["post"]["responses"]["201"]["content"]["application/json"]
            ["schema"]["$ref"],
        "#/components/schemas/RunResult"
    );
    assert_eq!(
        document["components"]["securitySchemes"]["bearer"],
        json!({"type": "http", "scheme": "bearer", "bearerFormat": "lk_…",
               "description": "An API key of `security.api_keys` in `Authorization: Bearer <key>`."})
    );

    // The interactive docs.
    let response = client.get(format!("{base}/docs")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let page = response.text().await.unwrap();
    assert!(page.contains("Loom REST API"), "{page}");
}

#[tokio::test]
async fn with_keys_every_operation_requires_one_and_the_docs_need_none() {
    let dir = tempfile::tempdir().unwrap();
    let loom = Loom::new(config(dir.path(), None, true)).unwrap();
    let base = serve(loom, None).await;
    let client = reqwest::Client::new();
    let document: Value = client
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for item in document["paths"].as_object().unwrap().values() {
        for operation in item.as_object().unwrap().values() {
            if operation["tags"] == json!(["operations"]) {
                assert_eq!(operation["security"], json!([{}]), "{operation}");
                continue;
            }
            assert_eq!(
                operation["security"],
                json!([{"bearer": []}, {"api_key": []}])
            );
            assert_eq!(
                operation["responses"]["401"]["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/Error",
                "{operation}"
            );
            // Every 401 says the scheme, and the document says so.
            assert_eq!(
                operation["responses"]["401"]["headers"]["WWW-Authenticate"]["schema"]["enum"],
                json!(["Bearer"]),
                "{operation}"
            );
        }
    }
    // Liveness and readiness need none.
    for probe in ["healthz", "readyz"] {
        let response = client
            .get(format!("{base}/v1/{probe}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{probe}");
    }
    // The routes themselves do need the key.
    let response = client
        .get(format!("{base}/v1/agents"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
}

#[tokio::test]
async fn the_docs_are_hidden_under_prod_or_docs_false_and_shown_with_docs_true() {
    for (profile, docs, served) in [
        (Some(Profile::Prod), None, false),
        (None, Some(false), false),
        (Some(Profile::Prod), Some(true), true),
        (Some(Profile::Dev), None, true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let loom = Loom::new(config(dir.path(), profile, true)).unwrap();
        let base = serve(loom, docs).await;
        for page in ["openapi.json", "docs"] {
            let response = reqwest::get(format!("{base}/{page}")).await.unwrap();
            let expected = if served {
                StatusCode::OK
            } else {
                StatusCode::NOT_FOUND
            };
            assert_eq!(
                response.status(),
                expected,
                "{page} with profile {profile:?}, docs {docs:?}"
            );
        }
    }
}

/// The JSON Schema of `T` as the document writes it (draft 2020-12, serialize contract).
fn schema_of<T: schemars::JsonSchema>() -> Value {
    schemars::generate::SchemaSettings::draft2020_12()
        .for_serialize()
        .into_generator()
        .into_root_schema_for::<T>()
        .to_value()
}

fn conforms<T: schemars::JsonSchema + serde::Serialize>(name: &str, value: &T) {
    let schema = schema_of::<T>();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let json = serde_json::to_value(value).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&json)
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors.is_empty(),
        "{name} does not match its schema: {errors:?}\n{json}"
    );
}

/// The facade's schemas describe what it serializes: a run with a tool call, its result, its
/// trace and its usage report (the last two for the routes that will serve them).
#[tokio::test]
async fn the_facade_types_match_their_schemas() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = ModelSpec::new("fake-clock", Sdk::Fake, "FAKE");
    model.params.insert(
        "script".into(),
        json!([
            {"text": "Je regarde.", "tool_calls": [{"name": "current_datetime", "arguments": {}}]},
            {"text": "Il est {{ tool_result }}."}
        ]),
    );
    let mut clock = AgentSpec::new("clock", "fake-clock");
    clock.tools = vec![loom_ia::config::ToolRef::new("loom.current_datetime")];
    let mut raw = LoomConfig {
        models: vec![model],
        agents: vec![clock],
        ..LoomConfig::default()
    };
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("journal".into());
    let loom = Loom::new(Config::new(raw, dir.path().to_path_buf()).unwrap()).unwrap();
    let result = loom
        .run("clock", "Quelle heure ?", loom_ia::RunOptions::default())
        .await
        .unwrap();
    assert_eq!(result.status.to_string(), "completed", "{result:?}");
    conforms("RunResult", &result);
    let run = result.run_ref("default");
    conforms("Trace", &loom.trace(&run).await.unwrap());
    conforms("UsageReport", &loom.report(&run).await.unwrap());
}

/// Routes are registered only through `routes!` (annotated handlers): no module but `lib.rs`
/// (which mounts the document and the docs page), `openapi.rs`, `mcp.rs` (the MCP endpoint,
/// not a REST route) and `ui.rs` (the viewer's page files, not a REST route) adds a route by hand, so a route cannot be served without being in the
/// document.
#[test]
fn no_route_is_added_outside_the_document() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".rs")
            || ["lib.rs", "openapi.rs", "mcp.rs", "ui.rs"].contains(&name.as_str())
        {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for call in [".route(", ".route_service(", ".nest_service(", "routing::"] {
            assert!(
                !text.contains(call),
                "{name} registers a route with `{call}`: annotate the handler with \
                 #[utoipa::path] and register it with `.routes(routes!(handler))`"
            );
        }
    }
}

/// A key's `rate_limit` can refuse any request: the document says so on every operation, and
/// only when some key has one.
#[test]
fn a_rate_limited_key_puts_a_429_on_every_operation() {
    let dir = tempfile::tempdir().unwrap();
    let settings = HttpServerConfig::default();
    let without = loom_http::openapi_document(
        &Loom::new(config(dir.path(), None, true)).unwrap(),
        &settings,
    );
    assert!(
        without["paths"]["/v1/agents"]["get"]["responses"]
            .get("429")
            .is_none()
    );

    let mut limited = config(dir.path(), None, true).raw().clone();
    limited.security.api_keys[0].rate_limit =
        Some(serde_json::from_value(json!({"per_minute": 2})).unwrap());
    let limited = Config::new(limited, dir.path().to_path_buf()).unwrap();
    let document = loom_http::openapi_document(&Loom::new(limited).unwrap(), &settings);
    let mut operations = 0;
    for item in document["paths"].as_object().unwrap().values() {
        for operation in item.as_object().unwrap().values() {
            let refused = &operation["responses"]["429"];
            assert!(
                refused["description"]
                    .as_str()
                    .unwrap()
                    .contains("`rate_limit` is reached"),
                "{operation}"
            );
            assert!(
                refused["headers"].get("Retry-After").is_some(),
                "{operation}"
            );
            assert_eq!(
                refused["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/Error"
            );
            operations += 1;
        }
    }
    assert_eq!(operations, ROUTES.len());
    // A route that had a 429 of its own keeps it, and says both.
    let create = &document["paths"]["/v1/agents/{name}/runs"]["post"]["responses"]["429"];
    let text = create["description"].as_str().unwrap();
    assert!(
        text.contains("budget") && text.contains("rate_limit"),
        "{text}"
    );
}

/// With `storage.encryption`, every operation documents the `424` of a sealed journal whose key
/// the tenant lacks, and the error kinds list `missing_encryption_key`; without it, none does.
#[test]
fn an_encrypted_journal_puts_a_424_on_every_operation() {
    let dir = tempfile::tempdir().unwrap();
    let settings = HttpServerConfig::default();
    let plain = loom_http::openapi_document(
        &Loom::new(config(dir.path(), None, true)).unwrap(),
        &settings,
    );
    assert!(
        plain["paths"]["/v1/agents"]["get"]["responses"]
            .get("424")
            .is_none()
    );
    let kinds = &plain["components"]["schemas"]["ErrorKind"]["enum"];
    assert!(
        kinds
            .as_array()
            .unwrap()
            .contains(&json!("missing_encryption_key")),
        "{kinds}"
    );

    let mut sealed = config(dir.path(), None, true).raw().clone();
    sealed.storage.encryption = Some(loom_ia::config::EncryptionStorage {
        keys: vec!["journal_key".into()],
    });
    let sealed = Config::new(sealed, dir.path().to_path_buf()).unwrap();
    let document = loom_http::openapi_document(&Loom::new(sealed).unwrap(), &settings);
    let mut operations = 0;
    for item in document["paths"].as_object().unwrap().values() {
        for operation in item.as_object().unwrap().values() {
            let refused = &operation["responses"]["424"];
            assert!(
                refused["description"]
                    .as_str()
                    .unwrap()
                    .contains("`missing_encryption_key`"),
                "{operation}"
            );
            assert_eq!(
                refused["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/Error"
            );
            operations += 1;
        }
    }
    assert_eq!(operations, ROUTES.len());
}
