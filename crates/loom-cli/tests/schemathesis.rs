//! The OpenAPI document against the live server: schemathesis (from PyPI) generates requests
//! from `/openapi.json` of a real `loom serve` (fake models, a JSONL journal in a temporary
//! directory, API keys) and checks that no answer is a server error and that every answer
//! (status, content type, headers, body) is what the document says. Skipped when schemathesis
//! is not installed, except under `LOOM_REQUIRE_SERVICES=1` (CI), where it fails.
//!
//! Before the server starts, `loom run` seeds sessions (a run with an attached file, a run
//! with a tool call, a run paused on an approval, a session to erase), and a schemathesis
//! configuration binds the path parameters and the delivery header to those ids (most of the
//! time; otherwise generated values, which exercise the 404s), so the session, trace and file
//! routes answer 200s. Two passes: a key with `read` only first (masked answers, content
//! fields removed and listed in `redacted`, checked against the document), then an `admin`
//! key (every route, the webhook trigger with its delivery header included).

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::{loom_bin, python_has, server::Server};

const CONFIG: &str = "\
version: 1
models:
  - id: fake-hello
    sdk: fake
    model: FAKE
    params:
      script:
        - text: Bonjour depuis le serveur.
  - id: fake-clock
    sdk: fake
    model: FAKE
    params:
      script:
        - text: Je regarde l'heure.
          tool_calls:
            - name: current_datetime
              arguments: {}
        - text: \"Il est {{ tool_result }}.\"
  - id: fake-broken
    sdk: fake
    model: FAKE
    params:
      script:
        - error: auth
  - id: fake-asker
    sdk: fake
    model: FAKE
    params:
      script:
        - text: Je demande.
          tool_calls:
            - name: current_datetime
              arguments: {}
        - text: \"Accordé : {{ tool_result }}.\"
agents:
  - name: hello
    description: Says hello.
    main: {model: fake-hello}
  - name: clock
    description: Tells the time with a tool.
    main: {model: fake-clock}
    tools:
      - tool: loom.current_datetime
  - name: broken
    description: Its model always fails.
    main: {model: fake-broken}
  - name: asker
    description: Asks a human before each tool call.
    main: {model: fake-asker}
    tools:
      - tool: loom.current_datetime
        approval: always
triggers:
  - name: greet
    agent: hello
    message: \"Webhook: {{ payload }}\"
    delivery_header: X-Delivery-Id
execution:
  attachments: {types: [text/plain]}
storage:
  events: {backend: jsonl, path: data}
telemetry:
  logging: {level: ERROR}
";

/// The schemathesis command line (`python3 -m schemathesis.cli`, as `.ci/run` installs it
/// with pip).
fn schemathesis() -> Command {
    let mut command = Command::new("python3");
    command.args(["-m", "schemathesis.cli"]);
    command
}

/// The schemathesis configuration: dictionaries of the seeded ids, bound to the path
/// parameters and the delivery header (with a probability, so generated values still reach the
/// 404s), the approval pointed at the paused run (what is generated depends on the whole
/// document: left to the shared dictionaries, whether a decision reaches it was luck), and the
/// erasure pointed at its own session.
fn st_config(file: &str) -> String {
    format!(
        r#"[dictionaries.sessions]
values = ["s-files", "s-clock", "s-paused"]

[dictionaries.runs]
values = ["r-files", "r-clock", "r-paused"]

[dictionaries.files]
values = ["{file}"]

[dictionaries.names]
values = ["hello", "clock", "broken", "asker", "greet"]

[dictionaries.deliveries]
values = ["d-1", "d-2"]

[dictionaries.doomed]
values = ["doomed"]

[dictionaries.paused]
values = ["r-paused"]

[parameters]
"path.session_id" = {{ dictionary = "sessions", probability = 0.8 }}
"path.run_id" = {{ dictionary = "runs", probability = 0.8 }}
"path.file" = {{ dictionary = "files", probability = 0.8 }}
"path.name" = {{ dictionary = "names", probability = 0.8 }}
"header.X-Delivery-Id" = {{ dictionary = "deliveries", probability = 0.8 }}
"body.session_id" = {{ dictionary = "sessions", probability = 0.5 }}

[[operations]]
include-operation-id = "approve_run"
parameters = {{ "path.run_id" = {{ dictionary = "paused", probability = 0.9 }} }}

[[operations]]
include-operation-id = "delete_session"
parameters = {{ "path.session_id" = {{ dictionary = "doomed", probability = 0.9 }} }}
"#
    )
}

/// Runs `loom` in `dir` and returns its standard output; fails on a non-zero exit.
fn loom(dir: &std::path::Path, args: &[&str]) -> String {
    let (success, stdout) = loom_anyhow(dir, args);
    assert!(success, "loom {args:?}: {stdout}");
    stdout
}

/// Runs `loom` in `dir`: whether it exited with 0, and its standard output then error.
fn loom_anyhow(dir: &std::path::Path, args: &[&str]) -> (bool, String) {
    let output = Command::new(loom_bin())
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    (
        output.status.success(),
        format!("{stdout}{}", String::from_utf8_lossy(&output.stderr)),
    )
}

/// A new key with `scope`: the key, and its entry's lines for `security.api_keys`.
fn key(dir: &std::path::Path, id: &str, scope: &str) -> (String, String) {
    let stdout = loom(dir, &["keys", "create", id, "--scope", scope]);
    let (key, entry) = stdout.split_once("\n\n").unwrap();
    let item = entry
        .split_once("api_keys:\n")
        .unwrap()
        .1
        .lines()
        .take_while(|line| line.starts_with("    "))
        .map(|line| format!("{line}\n"))
        .collect();
    (key.trim().to_owned(), item)
}

/// Seeds the journal through the CLI: a run with an attached file (`s-files`), a run with a
/// tool call (`s-clock`), a run paused on an approval (`s-paused`), a session to erase
/// (`doomed`). Returns the stored file's name (`<sha256>.<ext>`).
fn seed(dir: &std::path::Path) -> String {
    std::fs::write(dir.join("notes.txt"), "Des notes pour la session.\n").unwrap();
    let run = |line: &'static str| {
        let mut args = vec!["--config", "loom.yaml", "run"];
        args.extend(line.split(' '));
        args
    };
    loom(
        dir,
        &run("hello Notes --session s-files --run-id r-files --attach notes.txt"),
    );
    loom(dir, &run("clock Heure --session s-clock --run-id r-clock"));
    loom(
        dir,
        &run("hello Oublie-moi --session doomed --run-id r-doomed"),
    );
    // A paused run exits non-zero: it is not finished.
    let (_, paused) = loom_anyhow(
        dir,
        &run("asker Heure --session s-paused --run-id r-paused"),
    );
    assert!(paused.contains("paused"), "{paused}");
    let files: Vec<String> = std::fs::read_dir(dir.join("data/.artifacts/default/s-files"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

/// One schemathesis pass over the whole document with `key`: its report, and how long it took.
fn pass(address: &str, dir: &std::path::Path, key: &str, select: &[&str]) -> (bool, String) {
    let outcome = schemathesis()
        .current_dir(dir)
        .args([
            "--config-file",
            "schemathesis.toml",
            "run",
            &format!("http://{address}/openapi.json"),
            "--url",
            &format!("http://{address}"),
            "--header",
            &format!("Authorization: Bearer {key}"),
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,\
             response_schema_conformance,response_headers_conformance",
            "--phases",
            "examples,coverage,fuzzing",
            "--max-examples",
            "25",
            "--seed",
            "7",
            "--workers",
            "1",
            "--request-timeout",
            "20",
            "--generation-database",
            "none",
            "--no-color",
        ])
        .args(select)
        .output()
        .unwrap();
    let report = format!(
        "{}\n{}",
        String::from_utf8_lossy(&outcome.stdout),
        String::from_utf8_lossy(&outcome.stderr)
    );
    (outcome.status.success(), report)
}

/// The operations of the document (each is tested by every pass).
const OPERATIONS: usize = 22;

#[test]
fn schemathesis_finds_no_server_error_and_no_answer_outside_the_document() {
    if !python_has(
        "schemathesis",
        "python3 -m pip install 'schemathesis>=4,<5'",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Keys created by the CLI (the config stores only their hashes): every scope, and `read`
    // only (content is masked).
    let (admin, admin_entry) = key(dir.path(), "schemathesis", "admin");
    let (reader, reader_entry) = key(dir.path(), "reader", "read");
    std::fs::write(
        dir.path().join("loom.yaml"),
        format!("{CONFIG}security:\n  api_keys:\n{admin_entry}{reader_entry}"),
    )
    .unwrap();
    let file = seed(dir.path());
    std::fs::write(dir.path().join("schemathesis.toml"), st_config(&file)).unwrap();

    let server = Server::start(
        &loom_bin(),
        dir.path(),
        &["--config", "loom.yaml", "serve", "--port", "0"],
    );
    let address = server.address.clone();

    // The read-only pass first, while the paused run still waits for its approval; then the
    // admin key on everything but the erasure, and last the erasure alone (it may erase any
    // seeded session, so the approvals must have had their chance before it).
    let read = pass(&address, dir.path(), &reader, &[]);
    // The approvals alone first, while the run waits (a cancel of the admin pass may close
    // it: whether one comes first depends on the whole document).
    let approvals = pass(
        &address,
        dir.path(),
        &admin,
        &["--include-operation-id", "approve_run"],
    );
    let admin_pass = pass(
        &address,
        dir.path(),
        &admin,
        &[
            "--exclude-operation-id",
            "delete_session",
            "--exclude-operation-id",
            "approve_run",
        ],
    );
    // The approval pass reached the paused run with a decision (a 200 of approve).
    let paused =
        std::fs::read_to_string(dir.path().join("data/default/s-paused.jsonl")).unwrap_or_default();
    let decided = paused.contains("\"type\":\"approval.granted\"")
        || paused.contains("\"type\":\"approval.rejected\"");
    let erasure = pass(
        &address,
        dir.path(),
        &admin,
        &["--include-operation-id", "delete_session"],
    );
    let passes = [
        ("read", OPERATIONS, read),
        ("admin (approvals)", 1, approvals),
        ("admin", OPERATIONS - 2, admin_pass),
        ("admin (erasure)", 1, erasure),
    ];
    let (code, logs) = server.stop();
    for (scope, operations, (passed, report)) in &passes {
        assert!(
            passed,
            "schemathesis found problems with the {scope} key:\n{report}\nserver log:\n{logs}"
        );
        // The run did test every operation.
        assert!(
            report.contains(&format!("{operations} selected"))
                || report.contains(&format!("{operations} total")),
            "{report}"
        );
    }
    assert_eq!(code, Some(0), "{logs}");
    assert!(decided, "no approval decision reached s-paused: {paused}");
}
