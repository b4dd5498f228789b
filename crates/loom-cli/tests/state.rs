//! Session state end to end through the stock `loom` binary on the fake model: the caller's
//! values (`loom run --state`), a key filled from a built-in tool's result by JSON pointer (and
//! a pointer that finds nothing, refused beside the result), the orchestrator shown the state
//! but the journal never holding that message, a role's template reading it, `loom state`, and
//! refusals (a value off its schema, a duplicate `--state`, an unknown session) with exit code
//! 2 and nothing journaled.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::fs;

use serde_json::{Value, json};

const ROOT: &str = r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: ORCHESTRATOR
    params:
      script:
        - {text: "Je regarde l'heure.", tool_calls: [{name: current_datetime, arguments: {timezone: Europe/Paris}}]}
        - {text: "Je fais la fiche.", tool_calls: [{name: fiche, arguments: {}}]}
        - {text: "{{ tool_result }}"}
  - id: fake-role
    sdk: fake
    model: ROLE
    params:
      script:
        - {with_text: "Client C-42 à Europe/Paris", text: "Fiche de C-42 (Europe/Paris)."}
        - {text: "Fiche sans état."}
storage:
  events: {backend: jsonl, path: data}
telemetry:
  logging: {level: WARN}
"#;

const AGENT: &str = r#"name: secretaire
description: Tient la fiche du client.
main:
  model: fake-1
  system: Tu es la secrétaire.
  context: [session_state]
tools:
  - tool: loom.current_datetime
roles:
  - name: fiche
    description: Writes the customer's card.
    model: fake-role
    context: [{session_state: [client, zone]}]
    input_template: "Client {{ context.session_state.client }} à {{ context.session_state.zone }}"
state:
  client: {schema: {type: string}, description: The customer's id}
  visits: {schema: {type: integer}}
  lang: {schema: {type: string}, default: fr}
  zone:
    schema: {type: string}
    from: [{tool: current_datetime, path: /timezone}]
  ref:
    schema: {type: string}
    from: [{tool: current_datetime, path: /order/ref}]
"#;

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("loom.yaml"), ROOT).unwrap();
    fs::create_dir(dir.path().join("agents")).unwrap();
    fs::write(dir.path().join("agents/secretaire.yaml"), AGENT).unwrap();
    dir
}

fn payloads<'j>(journal: &'j [Value], kind: &str) -> Vec<&'j Value> {
    journal
        .iter()
        .filter(|e| e["type"] == kind)
        .map(|e| &e["payload"])
        .collect()
}

#[test]
fn the_callers_state_and_a_tools_result_fill_the_session_state() {
    let dir = project();
    let out = loom(
        dir.path(),
        &[
            "run",
            "secretaire",
            "Prépare la fiche.",
            "--session",
            "s1",
            "--state",
            "client=C-42",
            "--state",
            "visits=3",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    // The role's template read the state, whose zone came from the tool's result.
    assert_eq!(stdout.trim(), "Fiche de C-42 (Europe/Paris).");

    let journal = journal(dir.path(), "s1");
    let started = payloads(&journal, "run.started");
    assert_eq!(started[0]["state"], json!({"client": "C-42", "visits": 3}));
    let completed = payloads(&journal, "tool.completed");
    let clock = completed
        .iter()
        .find(|p| p["tool_name"] == "current_datetime")
        .unwrap();
    assert_eq!(clock["output"]["state"], json!({"zone": "Europe/Paris"}));
    assert_eq!(
        clock["output"]["state_refused"],
        json!({"ref": "ref: the result of current_datetime has no value at /order/ref"})
    );
    // The orchestrator was shown the state; the journal never holds that message.
    let whole = fs::read_to_string(dir.path().join("data/default/s1.jsonl")).unwrap();
    assert!(!whole.contains("<session_state>"), "{whole}");

    let out = loom(dir.path(), &["state", "s1"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        shown,
        json!({"client": "C-42", "lang": "fr", "visits": 3, "zone": "Europe/Paris"})
    );
    assert!(
        stdout.contains("\n  \"client\": \"C-42\""),
        "indented: {stdout}"
    );

    // A value given again overrides, the rest is kept.
    let out = loom(
        dir.path(),
        &[
            "run",
            "secretaire",
            "Encore.",
            "--session",
            "s1",
            "--state",
            "lang=\"de\"",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = loom(dir.path(), &["state", "s1"]);
    let shown: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(shown["lang"], "de");
    assert_eq!(shown["client"], "C-42");
}

#[test]
fn a_refused_state_exits_2_and_journals_nothing() {
    let dir = project();
    let cases: [(&[&str], &str); 3] = [
        (
            &["--state", "visits=beaucoup"],
            "error: request refused: session state: visits: does not follow its schema",
        ),
        (
            &["--state", "colour=blue"],
            "error: request refused: session state: colour: not a state key of the agent",
        ),
        (
            &["--state", "client=C-1", "--state", "client=C-2"],
            "error: --state: the key 'client' is given twice",
        ),
    ];
    for (extra, expected) in cases {
        let mut args = vec!["run", "secretaire", "Bonjour.", "--session", "s2"];
        args.extend_from_slice(extra);
        let out = loom(dir.path(), &args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.starts_with(expected), "{extra:?}: {stderr}");
    }
    assert!(!dir.path().join("data/default/s2.jsonl").exists());

    let out = loom(dir.path(), &["state", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(text(&out.stderr).trim(), "error: session nope not found");
}
