//! `loom serve` end to end: the real binary on a free port (`--port 0`, the address read from
//! stderr), one run over HTTP, a graceful stop on SIGTERM, the refusal under `prod` without
//! keys, `loom keys create` whose key then opens a server under `prod`, a webhook announced
//! by the banner, and a signed webhook.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::{
    loom_bin,
    server::{Server, request, request_with},
};

const SERVE: &[&str] = &["--config", "loom.yaml", "serve", "--port", "0"];
use serde_json::Value;

const CONFIG: &str = "\
version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
        - text: Bonjour depuis le serveur.
agents:
  - name: hello
    description: Says hello.
    main: {model: fake-1}
storage:
  events: {backend: jsonl, path: data}
telemetry:
  logging: {level: WARN}
";

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("loom.yaml"), CONFIG).unwrap();
    dir
}

#[test]
fn loom_serve_answers_a_run_and_stops_on_sigterm() {
    let dir = project();
    let server = Server::start(&loom_bin(), dir.path(), SERVE);
    let address = server.address.clone();
    assert!(address.starts_with("127.0.0.1:"), "{address}");
    assert_ne!(address, "127.0.0.1:0");

    let (status, body) = request(
        &address,
        "POST",
        "/v1/agents/hello/runs",
        r#"{"message": "Salut", "session_id": "s1"}"#,
    );
    assert_eq!(status, 201, "{body}");
    let result: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(result["status"], "completed");
    assert_eq!(result["text"], "Bonjour depuis le serveur.");
    assert!(dir.path().join("data/default/s1.jsonl").exists());

    let (status, body) = request(&address, "GET", "/v1/agents", "");
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        serde_json::json!([{"name": "hello", "description": "Says hello."}])
    );

    // SIGTERM: a graceful stop, exit code 0.
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("Stopping."), "{log}");
}

#[test]
fn loom_serve_is_refused_under_prod_while_keys_do_not_exist() {
    let dir = project();
    let output = Command::new(loom_bin())
        .current_dir(dir.path())
        .args([
            "--config",
            "loom.yaml",
            "--profile",
            "prod",
            "serve",
            "--port",
            "0",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("refused under the prod profile"),
        "{stderr}"
    );
}

#[test]
fn loom_keys_create_prints_a_key_that_opens_the_api_under_prod() {
    let dir = project();
    let output = Command::new(loom_bin())
        .current_dir(dir.path())
        .args([
            "keys",
            "create",
            "ci",
            "--scope",
            "run",
            "--scope",
            "read",
            "--agents",
            "hello",
            "--expires",
            "90d",
            "--rate-limit",
            "50",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    let (key, yaml) = stdout.split_once("\n\n").unwrap();
    let body = key.strip_prefix("lk_").unwrap();
    assert_eq!(body.len(), 43, "{key}");
    assert!(
        !yaml.contains(key),
        "the key itself is never in the entry:\n{yaml}"
    );
    assert!(yaml.contains("hash: \"sha256:"), "{yaml}");
    assert!(yaml.contains("agents: [\"hello\"]"), "{yaml}");
    assert!(yaml.contains("expires: \""), "{yaml}");
    assert!(yaml.contains("rate_limit: {per_minute: 50}"), "{yaml}");
    std::fs::write(dir.path().join("loom.yaml"), format!("{CONFIG}{yaml}")).unwrap();

    let server = Server::start(
        &loom_bin(),
        dir.path(),
        &[
            "--config",
            "loom.yaml",
            "--profile",
            "prod",
            "serve",
            "--port",
            "0",
        ],
    );
    let address = server.address.clone();
    let (status, body) = request(&address, "GET", "/v1/agents", "");
    assert_eq!(status, 401, "{body}");
    let (status, _) = request_with(&address, "GET", "/v1/agents", "X-API-Key: lk_other\r\n", "");
    assert_eq!(status, 401);
    let (status, body) = request_with(
        &address,
        "GET",
        "/v1/agents",
        &format!("X-API-Key: {key}\r\n"),
        "",
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = request_with(
        &address,
        "POST",
        "/v1/agents/hello/runs",
        &format!("Authorization: Bearer {key}\r\n"),
        r#"{"message": "Salut", "session_id": "s1"}"#,
    );
    assert_eq!(status, 201, "{body}");
    assert!(dir.path().join("data/default/s1.jsonl").exists());
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
}

#[test]
fn loom_serve_announces_its_hooks_and_a_delivery_opens_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{CONFIG}server:\n  http: {{base_path: /api}}\ntriggers:\n  - name: orders\n    agent: hello\n    \
         message: \"Commande {{{{ payload.id }}}}\"\n    delivery_header: X-Delivery\n"
    );
    std::fs::write(dir.path().join("loom.yaml"), config).unwrap();
    let server = Server::start(&loom_bin(), dir.path(), SERVE);
    let address = server.address.clone();
    server.wait_log("Hook: POST ");
    let log = server.log();
    let hook = log
        .lines()
        .find_map(|line| line.trim().strip_prefix("Hook: POST "))
        .unwrap();
    assert_eq!(hook, format!("http://{address}/api/v1/hooks/orders"));

    let path = "/api/v1/hooks/orders";
    let (status, body) = request_with(
        &address,
        "POST",
        path,
        "X-Delivery: d-1\r\n",
        r#"{"id": 7}"#,
    );
    assert_eq!(status, 202, "{body}");
    let first: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (first["run_id"].as_str(), first["repeated"].as_bool()),
        (Some("d-1"), Some(false))
    );
    let (status, body) = request_with(
        &address,
        "POST",
        path,
        "X-Delivery: d-1\r\n",
        r#"{"id": 7}"#,
    );
    assert_eq!(status, 200, "{body}");
    let again: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (again["run_id"].as_str(), again["repeated"].as_bool()),
        (Some("d-1"), Some(true))
    );
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
    let journal = std::fs::read_to_string(dir.path().join("data/default/d-1.jsonl")).unwrap();
    let started: Value = serde_json::from_str(journal.lines().next().unwrap()).unwrap();
    assert_eq!(started["payload"]["trigger"], "orders");
    let message = journal
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["type"] == "message.user")
        .unwrap();
    assert_eq!(
        message["payload"]["message"]["blocks"][0]["text"],
        "Commande 7"
    );
}

/// `X-Loom-Signature` of `body` sent at `timestamp`, signed with `secret`.
fn signature(secret: &str, timestamp: i64, body: &str) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{timestamp}.{body}").as_bytes());
    format!("v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// A trigger with a `secret_env` takes only deliveries signed with the secret read from that
/// variable at start, within its window; `loom serve` refuses to start without the variable.
#[test]
fn a_signed_trigger_takes_only_signed_deliveries() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{CONFIG}triggers:\n  - name: orders\n    agent: hello\n    \
         message: \"Commande {{{{ payload.id }}}}\"\n    secret_env: LOOM_E2E_ORDERS_SECRET\n"
    );
    std::fs::write(dir.path().join("loom.yaml"), config).unwrap();
    let refused = Command::new(loom_bin())
        .current_dir(dir.path())
        .env_remove("LOOM_E2E_ORDERS_SECRET")
        .args(SERVE)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("triggers[0].secret_env")
            && stderr.contains("LOOM_E2E_ORDERS_SECRET is absent or empty"),
        "{stderr}"
    );

    let secret = "whsec_e2e_0123456789";
    let server = Server::start_with(
        &loom_bin(),
        dir.path(),
        SERVE,
        &[("LOOM_E2E_ORDERS_SECRET", secret.into())],
    );
    server.wait_log("/v1/hooks/orders (signed with LOOM_E2E_ORDERS_SECRET)");
    let address = server.address.clone();
    let body = r#"{"id": 7}"#;
    let now = chrono::Utc::now().timestamp();
    let deliver = |headers: &str| request_with(&address, "POST", "/v1/hooks/orders", headers, body);
    let (status, answer) = deliver("");
    assert_eq!(status, 401, "{answer}");
    assert!(answer.contains("\"invalid_signature\""), "{answer}");
    let wrong = format!(
        "X-Loom-Timestamp: {now}\r\nX-Loom-Signature: {}\r\n",
        signature("another secret", now, body)
    );
    assert_eq!(deliver(&wrong).0, 401);
    let old = now - 3600;
    let replayed = format!(
        "X-Loom-Timestamp: {old}\r\nX-Loom-Signature: {}\r\n",
        signature(secret, old, body)
    );
    let (status, answer) = deliver(&replayed);
    assert_eq!(status, 401, "{answer}");
    assert!(answer.contains("a replay?"), "{answer}");
    assert!(!dir.path().join("data/default").exists());
    let signed = format!(
        "X-Loom-Timestamp: {now}\r\nX-Loom-Signature: {}\r\n",
        signature(secret, now, body)
    );
    let (status, answer) = deliver(&signed);
    assert_eq!(status, 202, "{answer}");
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
}

/// With API keys declared, a signed trigger needs no key (the services that send webhooks
/// cannot add one): the signature authenticates the delivery, whose run opens in the trigger's
/// `tenant`. A key does not stand in for the signature, an unsigned trigger still needs a key,
/// and an unknown trigger answers 401 to a caller without one (its existence is not told).
#[test]
fn a_signed_trigger_needs_no_key_and_runs_in_its_tenant() {
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    let key = "lk_hooks-test-000000000000000000000000000000";
    let hash = format!(
        "sha256:{}",
        hex::encode(sha2::Sha256::digest(key.as_bytes()))
    );
    let config = format!(
        "{CONFIG}tenants:\n  - {{id: default}}\n  - {{id: acme}}\n\
         security:\n  api_keys:\n    - {{id: ops, hash: \"{hash}\", tenant: default, scopes: [run, read]}}\n\
         triggers:\n  - name: orders\n    agent: hello\n    \
         message: \"Commande {{{{ payload.id }}}}\"\n    secret_env: LOOM_E2E_ACME_SECRET\n    tenant: acme\n\
         \x20 - name: notes\n    agent: hello\n    message: \"Note {{{{ payload.id }}}}\"\n"
    );
    std::fs::write(dir.path().join("loom.yaml"), config).unwrap();
    let secret = "whsec_acme_0123456789";
    let server = Server::start_with(
        &loom_bin(),
        dir.path(),
        SERVE,
        &[("LOOM_E2E_ACME_SECRET", secret.into())],
    );
    server.wait_log("/v1/hooks/orders (signed with LOOM_E2E_ACME_SECRET)");
    let address = server.address.clone();
    let body = r#"{"id": 7}"#;
    let now = chrono::Utc::now().timestamp();
    let post = |path: &str, headers: &str| request_with(&address, "POST", path, headers, body);

    // The document says the route takes a request without a key (a signed delivery); the
    // others still need one.
    let (status, document) = request(&address, "GET", "/openapi.json", "");
    assert_eq!(status, 200, "{document}");
    let document: Value = serde_json::from_str(&document).unwrap();
    assert_eq!(
        document["paths"]["/v1/hooks/{name}"]["post"]["security"],
        serde_json::json!([{"bearer": []}, {"api_key": []}, {}])
    );
    assert_eq!(
        document["paths"]["/v1/agents"]["get"]["security"],
        serde_json::json!([{"bearer": []}, {"api_key": []}])
    );

    // Unsigned, with a valid key: the key does not replace the signature.
    let (status, answer) = post("/v1/hooks/orders", &format!("X-API-Key: {key}\r\n"));
    assert_eq!(status, 401, "{answer}");
    assert!(answer.contains("\"invalid_signature\""), "{answer}");
    // An unsigned trigger and an unknown one need a key.
    let (status, answer) = post("/v1/hooks/notes", "");
    assert_eq!(status, 401, "{answer}");
    assert!(answer.contains("\"missing_key\""), "{answer}");
    let (status, answer) = post("/v1/hooks/nope", "");
    assert_eq!(status, 401, "{answer}");
    assert!(!dir.path().join("data/acme").exists());

    // Signed, without any key: accepted, in the trigger's tenant.
    let signed = format!(
        "X-Loom-Timestamp: {now}\r\nX-Loom-Signature: {}\r\n",
        signature(secret, now, body)
    );
    let (status, answer) = post("/v1/hooks/orders", &signed);
    assert_eq!(status, 202, "{answer}");
    let triggered: Value = serde_json::from_str(&answer).unwrap();
    let run_id = triggered["run_id"].as_str().unwrap();
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
    let session = triggered["session_id"].as_str().unwrap();
    let journal = dir.path().join(format!("data/acme/{session}.jsonl"));
    let text = std::fs::read_to_string(&journal).unwrap();
    assert!(text.contains(run_id), "{text}");
    assert!(text.contains("Commande 7"), "{text}");
    assert!(!dir.path().join("data/default").exists());
}
