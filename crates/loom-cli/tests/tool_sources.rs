//! Tool sources through binaries. The built-in `openapi` source through the stock `loom`
//! binary, against a real local HTTP API (`tests/openapi_server.py`, Python's standard library)
//! described by an OpenAPI file: a GET operation is read-only and runs at once with the tenant's
//! bearer token; a POST is side-effecting and, declared `approval: always`, waits for a human
//! before anything reaches the API; a declared `side_effects` replaces the method's default; two
//! tenants each send their own secret; an unknown operationId is refused at load, located. And a
//! kind registered in Rust with `App::source`, through the `catalogue` example binary: its tool
//! is offered and called by `run` and `serve`, and an unregistered kind is refused at
//! `validate`, naming the registered kinds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    fs,
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
};

use common::{server::Server, *};
use serde_json::{Value, json};

/// The API server, killed when dropped.
struct Api {
    child: Child,
    port: u16,
}

impl Drop for Api {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_api(dir: &Path) -> Api {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openapi_server.py");
    let mut child = Command::new("python3")
        .arg(script)
        .arg(dir.join("requests.jsonl"))
        .arg("t-shop")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {line:?}"));
    Api { child, port }
}

/// What the API received, in order.
fn requests(dir: &Path) -> Vec<Value> {
    fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

const DOCUMENT: &str = r##"openapi: 3.0.3
info: {title: Shop, version: "1"}
servers:
  - url: http://127.0.0.1:{port}/api
    variables: {port: {default: "PORT"}}
paths:
  /orders/{id}:
    get:
      operationId: getOrder
      summary: One order and its status
      parameters:
        - {name: id, in: path, required: true, schema: {type: string}}
      responses: {"200": {description: the order}}
  /orders:
    post:
      operationId: createOrder
      summary: Place an order
      requestBody:
        required: true
        content:
          application/json:
            schema: {$ref: "#/components/schemas/NewOrder"}
      responses: {"201": {description: created}}
components:
  schemas:
    NewOrder:
      type: object
      required: [item]
      properties: {item: {type: string}}
"##;

/// A project whose model follows `script`, with the shop API as a tool source.
fn project(api: Option<&Api>, script: &str, operations: &str, tools: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let port = api.map_or(9, |api| api.port).to_string();
    fs::write(
        dir.path().join("shop.yaml"),
        DOCUMENT.replace("PORT", &port),
    )
    .unwrap();
    fs::write(dir.path().join(".env"), "SHOP_TOKEN=t-shop\n").unwrap();
    let config = format!(
        r#"version: 1
env_file: .env
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
{script}
tool_sources:
  - name: shop
    kind: openapi
    params:
      document: shop.yaml
      operations: {operations}
      auth: {{type: bearer, secret: SHOP_TOKEN}}
      timeout: 10
{tools}
storage:
  events: {{backend: jsonl, path: data}}
agents:
  - name: a
    main: {{model: fake-1, system: Tu gères les commandes.}}
    tools:
      - source: shop
"#
    );
    fs::write(dir.path().join("loom.yaml"), config).unwrap();
    dir
}

fn python3() -> bool {
    python_has("http.server", "apt-get install python3")
}

#[test]
fn a_get_operation_is_read_only_and_sends_the_tenants_token() {
    if !python3() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let api = start_api(scratch.path());
    let script = r#"        - tool_calls:
            - name: shop__getOrder
              arguments: {id: "A 1/2"}
        - text: "Commande : {{ tool_result }}""#;
    let dir = project(Some(&api), script, "[getOrder, createOrder]", "");
    let out = loom(
        dir.path(),
        &["run", "a", "Où en est A-1 ?", "--run-id", "o1", "--json"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let result: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(result["status"], "completed");
    assert!(
        result["text"].as_str().unwrap().contains("shipped"),
        "{result}"
    );
    let seen = requests(scratch.path());
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["method"], "GET");
    // The path parameter is one segment, percent-encoded.
    assert_eq!(seen[0]["path"], "/api/orders/A%201%2F2");
    assert_eq!(seen[0]["authorization"], "Bearer t-shop");
    let events = journal(dir.path(), "o1");
    let opened = events
        .iter()
        .find(|e| e["type"] == "tool.source_opened")
        .unwrap();
    let tools = &opened["payload"]["tools"];
    assert_eq!(opened["payload"]["source"], "shop");
    assert_eq!(
        (&tools[0]["name"], &tools[0]["side_effects"]),
        (&json!("shop__getOrder"), &json!("none"))
    );
    assert_eq!(
        (&tools[1]["name"], &tools[1]["side_effects"]),
        (&json!("shop__createOrder"), &json!("irreversible"))
    );
    assert_eq!(
        tools[1]["input_schema"]["properties"]["body"]["required"],
        json!(["item"])
    );
    // The token never reaches the journal.
    let journal_text = fs::read_to_string(dir.path().join("data/default/o1.jsonl")).unwrap();
    assert!(!journal_text.contains("t-shop"));
}

/// The model's script that orders screws through the shop's POST operation.
const CREATE_ORDER: &str = r#"        - tool_calls:
            - name: shop__createOrder
              arguments: {body: {item: vis}}
        - text: "Créée : {{ tool_result }}""#;

#[test]
fn a_post_operation_declared_for_approval_waits_for_a_human() {
    if !python3() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let api = start_api(scratch.path());
    let script = CREATE_ORDER;
    let tools = "    tools:\n      createOrder: {approval: always}";
    let dir = project(Some(&api), script, "[createOrder]", tools);
    let out = loom(
        dir.path(),
        &["run", "a", "Commande des vis", "--run-id", "o2", "--json"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let paused: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(paused["status"], "paused");
    assert!(
        requests(scratch.path()).is_empty(),
        "nothing is sent before the approval"
    );
    let out = loom(dir.path(), &["approve", "o2", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let done: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(done["status"], "completed");
    assert!(done["text"].as_str().unwrap().contains("O-9"), "{done}");
    let seen = requests(scratch.path());
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        (&seen[0]["method"], &seen[0]["path"], &seen[0]["body"]),
        (
            &json!("POST"),
            &json!("/api/orders"),
            &json!({"item": "vis"})
        )
    );
}

#[test]
fn an_unknown_operation_id_is_refused_at_load_with_its_location() {
    let dir = project(None, "        - text: ok", "[getOrder, listOrders]", "");
    let out = loom(dir.path(), &["validate"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("tool_sources[0].params.operations[1]"),
        "{stderr}"
    );
    assert!(
        stderr.contains("no operation has the operationId 'listOrders' (operations of the document: getOrder, createOrder)"),
        "{stderr}"
    );
    // And an undeclared secret: refused at load too, naming it, at its key.
    let dir = project(None, "        - text: ok", "[getOrder]", "");
    fs::write(dir.path().join(".env"), "").unwrap();
    let out = loom(dir.path(), &["validate"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("tool_sources[0].params.auth.secret"),
        "{stderr}"
    );
    assert!(stderr.contains("SHOP_TOKEN"), "{stderr}");
}

#[test]
fn a_declared_side_effects_replaces_the_methods_default() {
    if !python3() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let api = start_api(scratch.path());
    let script = CREATE_ORDER;
    // POST is `irreversible` by default; the declaration says the order can be undone.
    let tools = "    tools:\n      createOrder: {side_effects: reversible}";
    let dir = project(Some(&api), script, "[getOrder, createOrder]", tools);
    let out = loom(dir.path(), &["validate"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("shop__createOrder: side_effects reversible"),
        "{stdout}"
    );
    // Each source is shown with its kind.
    assert!(stdout.contains("  · openapi shop: 2 tool(s)"), "{stdout}");
    let out = loom(
        dir.path(),
        &["run", "a", "Commande des vis", "--run-id", "o3", "--json"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = journal(dir.path(), "o3");
    let opened = events
        .iter()
        .find(|e| e["type"] == "tool.source_opened")
        .unwrap();
    let tools = &opened["payload"]["tools"];
    assert_eq!(
        (&tools[0]["name"], &tools[0]["side_effects"]),
        (&json!("shop__getOrder"), &json!("none"))
    );
    assert_eq!(
        (&tools[1]["name"], &tools[1]["side_effects"]),
        (&json!("shop__createOrder"), &json!("reversible"))
    );
    // Declared, not asked: the call ran.
    let completed = events
        .iter()
        .find(|e| e["type"] == "tool.completed")
        .unwrap();
    assert_eq!(completed["payload"]["tool_name"], "shop__createOrder");
    assert_eq!(completed["facets"]["is_error"], false, "{completed}");
    let seen = requests(scratch.path());
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["method"], "POST");
}

/// Two tenants redirect `SHOP_TOKEN`: `acme` to a file, `beta` to another variable.
const TENANTS: &str = "tenants:
  - id: acme
    secrets: {SHOP_TOKEN: {file: acme.token}}
  - id: beta
    secrets: {SHOP_TOKEN: BETA_SHOP_TOKEN}
";

/// Runs the agent `a` for `tenant` (session `run_id`); its journal.
fn run_for(dir: &Path, tenant: &str, run_id: &str) -> Vec<Value> {
    let out = loom(
        dir,
        &[
            "run",
            "a",
            "Où en est A-1 ?",
            "--run-id",
            run_id,
            "--tenant",
            tenant,
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let path = dir
        .join("data")
        .join(tenant)
        .join(format!("{run_id}.jsonl"));
    let journal_text = fs::read_to_string(&path).unwrap();
    assert!(!journal_text.contains("t-shop") && !journal_text.contains("t-beta"));
    journal_text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn each_tenants_run_sends_its_own_secret() {
    if !python3() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    // The API knows acme's token only.
    let api = start_api(scratch.path());
    let script = r#"        - tool_calls:
            - name: shop__getOrder
              arguments: {id: A-1}
        - text: "Commande : {{ tool_result }}""#;
    let dir = project(Some(&api), script, "[getOrder]", "");
    let config = fs::read_to_string(dir.path().join("loom.yaml")).unwrap();
    fs::write(dir.path().join("loom.yaml"), format!("{config}{TENANTS}")).unwrap();
    fs::write(dir.path().join("acme.token"), "t-shop\n").unwrap();
    fs::write(
        dir.path().join(".env"),
        "SHOP_TOKEN=t-default\nBETA_SHOP_TOKEN=t-beta\n",
    )
    .unwrap();

    let acme = run_for(dir.path(), "acme", "t1");
    let beta = run_for(dir.path(), "beta", "t2");
    let seen = requests(scratch.path());
    let sent: Vec<&Value> = seen.iter().map(|r| &r["authorization"]).collect();
    assert_eq!(sent, [&json!("Bearer t-shop"), &json!("Bearer t-beta")]);
    let outcome = |events: &[Value]| {
        let completed = events
            .iter()
            .find(|e| e["type"] == "tool.completed")
            .unwrap();
        (
            completed["facets"]["is_error"].clone(),
            completed["payload"]["output"].to_string(),
        )
    };
    let (error, output) = outcome(&acme);
    assert_eq!(error, false, "{output}");
    assert!(output.contains("shipped"), "{output}");
    // beta's own token reached the API, which refused it: never acme's, nor the default one.
    let (error, output) = outcome(&beta);
    assert_eq!(error, true, "{output}");
    assert!(output.contains("401"), "{output}");
}

/// The `catalogue` example binary: the stock CLI with the kind `catalogue` (`App::source`).
fn catalogue() -> std::path::PathBuf {
    example_bin("catalogue")
}

#[test]
fn a_kind_registered_with_app_source_is_offered_and_called() {
    let dir = copy_example("catalogue");
    let out = run_in(
        &catalogue(),
        dir.path(),
        &[
            "run",
            "vendeur",
            "Combien coûtent 250 vis ?",
            "--run-id",
            "c1",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let result: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(result["status"], "completed");
    assert_eq!(
        result["text"],
        "D'après le catalogue : 250 × vis : 30,00 EUR."
    );
    let events = journal(dir.path(), "c1");
    let opened = events
        .iter()
        .find(|e| e["type"] == "tool.source_opened")
        .expect("the source's offer is journaled");
    assert_eq!(opened["payload"]["source"], "quincaillerie");
    let tools = &opened["payload"]["tools"];
    assert_eq!(
        (&tools[0]["name"], &tools[0]["side_effects"]),
        (&json!("quincaillerie__prix"), &json!("none"))
    );
    let called = events.iter().find(|e| e["type"] == "tool.called").unwrap();
    assert_eq!(
        (
            &called["payload"]["tool_name"],
            &called["payload"]["arguments"]
        ),
        (
            &json!("quincaillerie__prix"),
            &json!({"article": "vis", "quantite": 250})
        )
    );
    let completed = events
        .iter()
        .find(|e| e["type"] == "tool.completed")
        .unwrap();
    assert_eq!(completed["payload"]["tool_name"], "quincaillerie__prix");
    assert_eq!(completed["facets"]["is_error"], false, "{completed}");
    assert!(
        completed["payload"]["output"]
            .to_string()
            .contains("250 × vis : 30,00 EUR"),
        "{completed}"
    );
    // `validate` resolves it too; the stock binary, which lacks the kind, refuses it.
    let out = run_in(&catalogue(), dir.path(), &["validate"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("quincaillerie__prix"), "{stdout}");
    assert!(
        stdout.contains("  · catalogue quincaillerie: 1 tool(s)"),
        "{stdout}"
    );
    let out = loom(dir.path(), &["validate"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("unknown tool source kind 'catalogue' (registered kinds: forge, openapi)"),
        "{stderr}"
    );
}

#[test]
fn a_kind_registered_with_app_source_is_served() {
    let dir = copy_example("catalogue");
    let server = Server::start(
        &catalogue(),
        dir.path(),
        &["--config", "loom.yaml", "serve", "--port", "0"],
    );
    let (status, body) = common::server::request(
        &server.address,
        "POST",
        "/v1/agents/vendeur/runs",
        r#"{"message": "Combien coûtent 250 vis ?", "session_id": "s1"}"#,
    );
    assert_eq!(status, 201, "{body}");
    let result: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(result["status"], "completed", "{body}");
    assert!(
        result["text"]
            .as_str()
            .unwrap()
            .contains("250 × vis : 30,00 EUR"),
        "{body}"
    );
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
}

#[test]
fn an_unregistered_kind_is_refused_at_validate_naming_the_registered_kinds() {
    let dir = copy_example("catalogue");
    let config = fs::read_to_string(dir.path().join("loom.yaml")).unwrap();
    assert!(
        config.contains("kind: catalogue "),
        "examples/catalogue changed"
    );
    fs::write(
        dir.path().join("loom.yaml"),
        config.replace("kind: catalogue ", "kind: inventaire "),
    )
    .unwrap();
    let out = run_in(&catalogue(), dir.path(), &["validate"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("tool_sources[0].kind"), "{stderr}");
    assert!(
        stderr.contains(
            "unknown tool source kind 'inventaire' (registered kinds: catalogue, forge, openapi)"
        ),
        "{stderr}"
    );
}
