//! The OpenAPI document against the live server: schemathesis (from PyPI) generates requests
//! from `/openapi.json` of a real `loom serve` (fake models, a JSONL journal in a temporary
//! directory, an API key) and checks that no answer is a server error and that every answer
//! (status, content type, headers, body) is what the document says. Skipped when schemathesis
//! is not installed, except under `LOOM_REQUIRE_SERVICES=1` (CI), where it fails.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
};

use common::loom_bin;

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
storage:
  events: {backend: jsonl, path: data}
telemetry:
  logging: {level: ERROR}
";

/// The schemathesis command line (`python3 -m schemathesis.cli`, as `.ci/run` installs it
/// with pip), when installed.
fn schemathesis() -> Option<Command> {
    let installed = Command::new("python3")
        .args(["-m", "schemathesis.cli", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    installed.then(|| {
        let mut command = Command::new("python3");
        command.args(["-m", "schemathesis.cli"]);
        command
    })
}

#[test]
fn schemathesis_finds_no_server_error_and_no_answer_outside_the_document() {
    let Some(mut st) = schemathesis() else {
        assert!(
            std::env::var("LOOM_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "schemathesis is not installed (python3 -m pip install 'schemathesis>=4,<5')"
        );
        eprintln!("skipped: schemathesis is not installed");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A key with every scope, created by the CLI: the config stores only its hash.
    let output = Command::new(loom_bin())
        .current_dir(dir.path())
        .args(["keys", "create", "schemathesis", "--scope", "admin"])
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(output.status.success(), "{stdout}");
    let (key, entry) = stdout.split_once("\n\n").unwrap();
    std::fs::write(dir.path().join("loom.yaml"), format!("{CONFIG}{entry}")).unwrap();

    let mut server = Command::new(loom_bin())
        .current_dir(dir.path())
        .args(["--config", "loom.yaml", "serve", "--port", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(server.stderr.take().unwrap());
    let mut address = None;
    let mut line = String::new();
    while stderr.read_line(&mut line).unwrap() > 0 {
        if let Some(rest) = line.trim().strip_prefix("Listening on http://") {
            address = Some(rest.to_owned());
            break;
        }
        line.clear();
    }
    let Some(address) = address else {
        let _ = server.kill();
        panic!("no 'Listening on' line on stderr");
    };
    // Keep reading the server's stderr so it never blocks on a full pipe.
    let logs = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
        rest
    });

    let outcome = st
        .current_dir(dir.path())
        .args([
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
        .output()
        .unwrap();
    let _ = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status();
    let status = server.wait().unwrap();
    let logs = logs.join().unwrap();
    let report = String::from_utf8_lossy(&outcome.stdout);
    assert!(
        outcome.status.success(),
        "schemathesis found problems:\n{report}\n{}\nserver log:\n{logs}",
        String::from_utf8_lossy(&outcome.stderr)
    );
    // The run did test every operation.
    assert!(
        report.contains("7 selected") || report.contains("7 total"),
        "{report}"
    );
    assert!(status.success(), "{status:?}: {logs}");
}
