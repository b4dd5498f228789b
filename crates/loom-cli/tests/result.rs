//! One `RunResult` through every door: `loom run --json`, `loom approve --json`, `loom resume
//! --json`, the REST API (`POST /v1/agents/{name}/runs`, `GET /v1/runs/{id}`) and the MCP
//! server's structured content (an agent call, `run_status`) give the same object, with every
//! field of the reference's `RunResult` (`report`, `verdicts`, `skipped_judges`, `artifacts`
//! as objects, `data`, pending approvals with their `scope`), fields without a value left out.
//! Each test works on the stock `loom` binary in its own temporary directory.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{
    copy_example, example_bin, loom, loom_bin, mcp_client, python_has, repo,
    server::{Server, request},
    text,
};
use std::{
    fs,
    path::Path,
    process::{Command, Output},
};

use serde_json::{Value, json};

/// An agent whose tool needs approval, with an output contract (so `data`) and a judge (so
/// `verdicts`, or `skipped_judges` with `--judges skip`).
const CONFIG: &str = "\
version: 1
models:
  - id: fake-fiche
    sdk: fake
    model: FAKE
    params:
      script:
        - text: Je regarde l'heure.
          tool_calls:
            - name: current_datetime
              arguments: {}
        - text: '{\"numero\": \"D-2026-042\", \"montant_ttc\": 1840.0}'
  - id: fake-juge
    sdk: fake
    model: JUGE
    params:
      script:
        - tool_calls:
            - name: verdict
              arguments: {criteria: [{name: complet, score: 0.9, reason: tout y est}]}
agents:
  - name: fiche
    description: Rend la fiche d'un devis en JSON.
    main: {model: fake-fiche}
    tools:
      - tool: loom.current_datetime
        approval: always
    output:
      schema:
        type: object
        required: [numero, montant_ttc]
        properties:
          numero: {type: string}
          montant_ttc: {type: number}
    judge:
      model: fake-juge
      criteria:
        - name: complet
          rule: La fiche donne le numéro et le montant.
          min_score: 0.5
storage:
  events: {backend: jsonl, path: data}
telemetry:
  logging: {level: ERROR}
";

/// The fields of the reference's `RunResult` a paused run without error writes (`output`,
/// `data`, `error_type`, `error` and `redacted` have no value then and are left out).
const PAUSED_KEYS: [&str; 15] = [
    "run_id",
    "session_id",
    "agent",
    "status",
    "text",
    "iterations",
    "usage",
    "cost_usd",
    "artifacts",
    "unverified",
    "fallback",
    "report",
    "verdicts",
    "skipped_judges",
    "pending_approvals",
];

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("loom.yaml"), CONFIG).unwrap();
    fs::copy(
        repo().join("examples/guichet/documents/plan.png"),
        dir.path().join("plan.png"),
    )
    .unwrap();
    dir
}

/// What a `--json` command printed, after checking its exit code.
fn json_out(out: &Output, code: i32) -> Value {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn keys(value: &Value) -> Vec<&str> {
    value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect()
}

fn sorted(mut keys: Vec<&str>) -> Vec<&str> {
    keys.sort_unstable();
    keys
}

#[test]
fn the_cli_doors_give_the_same_result_with_every_field() {
    let dir = project();
    let paused = json_out(
        &loom(
            dir.path(),
            &[
                "run",
                "fiche",
                "La fiche du devis D-2026-042 ?",
                "--run-id",
                "r1",
                "--attach",
                "plan.png",
                "--json",
            ],
        ),
        1,
    );
    assert_eq!(paused["status"], "paused");
    assert_eq!(sorted(keys(&paused)), sorted(PAUSED_KEYS.to_vec()));
    // The attachment is an artifact of the run, described.
    let size = fs::metadata(dir.path().join("plan.png")).unwrap().len();
    let artifact = &paused["artifacts"][0];
    assert_eq!(
        sorted(keys(artifact)),
        ["media_type", "name", "origin", "size", "uri"]
    );
    assert_eq!(
        (
            &artifact["origin"],
            &artifact["media_type"],
            &artifact["size"],
            &artifact["name"]
        ),
        (
            &json!("attachment"),
            &json!("image/png"),
            &json!(size),
            &json!("plan.png")
        )
    );
    assert!(
        artifact["uri"]
            .as_str()
            .unwrap()
            .starts_with("artifact://default/r1/"),
        "{artifact}"
    );
    // A pending approval carries the request's fields, `scope` included; `policy` has no value
    // (the tool's declaration asked), so it is left out.
    let pending = &paused["pending_approvals"][0];
    assert_eq!(
        sorted(keys(pending)),
        [
            "arguments",
            "call_id",
            "expire_at",
            "reason",
            "run_id",
            "scope",
            "session_id",
            "tenant_id",
            "tool_name"
        ]
    );
    assert_eq!(pending["scope"], "approve");
    assert_eq!(pending["tool_name"], "current_datetime");
    // No judge ran yet; the report counts the model call.
    assert_eq!(paused["verdicts"], json!([]));
    assert_eq!(paused["skipped_judges"], json!([]));
    assert_ne!(paused["report"], json!({}));

    let out = loom(dir.path(), &["approve", "r1", "--json"]);
    let approved = json_out(&out, 0);
    // The summary for people names the files and the verdicts.
    let stderr = text(&out.stderr);
    let file_line = format!(
        "File       : {} (image/png, {size} bytes)\n",
        artifact["uri"].as_str().unwrap()
    );
    assert!(stderr.contains(&file_line), "{stderr}");
    assert!(
        stderr.contains("Judge      : output (final answer), attempt 1 — accepted: complet 0.90\n"),
        "{stderr}"
    );
    assert_eq!(approved["status"], "completed");
    assert_eq!(
        approved["data"],
        json!({"numero": "D-2026-042", "montant_ttc": 1840.0})
    );
    assert_eq!(approved["output"]["role"], "assistant");
    assert_eq!(approved["artifacts"], paused["artifacts"]);
    assert_eq!(approved["pending_approvals"], json!([]));
    let verdict = &approved["verdicts"][0];
    assert_eq!(
        (
            &verdict["judge"],
            &verdict["target"],
            &verdict["passed"],
            &verdict["blocked"]
        ),
        (
            &json!("output"),
            &json!("output"),
            &json!(true),
            &json!(false)
        )
    );
    assert_eq!(
        verdict["criteria"],
        json!([{"name": "complet", "score": 0.9, "min_score": 0.5, "blocking": true, "reason": "tout y est"}])
    );
    assert_ne!(approved["report"], paused["report"]);

    // Read again, the run is the same object.
    let resumed = json_out(&loom(dir.path(), &["resume", "r1", "--json"]), 0);
    assert_eq!(resumed, approved);

    // Judges skipped by the caller are listed, with why.
    json_out(
        &loom(
            dir.path(),
            &[
                "run",
                "fiche",
                "La fiche ?",
                "--run-id",
                "r2",
                "--judges",
                "skip",
                "--json",
            ],
        ),
        1,
    );
    let out = loom(dir.path(), &["approve", "r2", "--json"]);
    let skipped = json_out(&out, 0);
    assert!(
        text(&out.stderr).contains(
            "Judge      : output (final answer) — not judged: skipped by the caller (--judges skip)\n"
        ),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(skipped["verdicts"], json!([]));
    assert_eq!(
        skipped["skipped_judges"],
        json!([{"judge": "output", "target": "output", "reason": "caller_skip"}])
    );
    assert_eq!(skipped["artifacts"], json!([]));
}

/// `POST /v1/agents/{name}/runs`, `GET /v1/runs/{id}`, and `loom resume --json` of the same
/// runs agree; so do the MCP server's agent call and `run_status`.
#[test]
fn rest_and_mcp_give_the_cli_result() {
    let dir = project();
    let server = Server::start(
        &loom_bin(),
        dir.path(),
        &["--config", "loom.yaml", "serve", "--port", "0"],
    );
    let address = server.address.clone();
    let (status, created) = request(
        &address,
        "POST",
        "/v1/agents/fiche/runs",
        r#"{"message": "La fiche ?", "run_id": "h1"}"#,
    );
    assert_eq!(status, 201, "{created}");
    let created: Value = serde_json::from_str(&created).unwrap();
    assert_eq!(created["status"], "paused");
    assert_eq!(sorted(keys(&created)), sorted(PAUSED_KEYS.to_vec()));
    let (status, read) = request(&address, "GET", "/v1/runs/h1", "");
    assert_eq!(status, 200, "{read}");
    assert_eq!(serde_json::from_str::<Value>(&read).unwrap(), created);
    let (status, body) = request(
        &address,
        "POST",
        "/v1/runs/h1/approve",
        r#"{"by": "denis"}"#,
    );
    assert_eq!(status, 200, "{body}");
    // The approved run goes on in the background.
    let done = loom_testkit::wait::blocking_until("run h1 to complete", || {
        let (status, body) = request(&address, "GET", "/v1/runs/h1", "");
        let read: Value = serde_json::from_str(&body).unwrap_or_default();
        if status == 200 && read["status"] == "completed" {
            Ok(read)
        } else {
            Err(format!("{status} {body}"))
        }
    });
    assert!(
        done["data"].is_object() && done["verdicts"][0].is_object(),
        "{done}"
    );
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(
        json_out(&loom(dir.path(), &["resume", "h1", "--json"]), 0),
        done
    );

    if !python_has("mcp.client, httpx2, mcp_types", "pip install 'mcp>=2,<3'") {
        return;
    }
    let observed = mcp_calls(
        dir.path(),
        json!([
            ["fiche", {"message": "La fiche ?", "session_id": "m1"}],
            ["run_status", {"run_id": "h1"}]
        ]),
    );
    let (call, status) = (&observed["calls"][0], &observed["calls"][1]);
    assert_eq!(status["structured"], done, "{observed}");
    let paused = &call["structured"];
    assert_eq!(paused["status"], "paused", "{observed}");
    assert_eq!(sorted(keys(paused)), sorted(PAUSED_KEYS.to_vec()));
    let run_id = paused["run_id"].as_str().unwrap();
    assert_eq!(
        &json_out(
            &loom(dir.path(), &["resume", run_id, "--session", "m1", "--json"]),
            1
        ),
        paused
    );
}

/// A Rust tool that returns an image (`guichet`'s `plan_des_locaux`, an `Image`): the image is
/// stored beside the journal, journaled by URI, and listed in the run's result.
#[test]
fn a_rust_tools_image_is_an_artifact_of_the_run() {
    let dir = copy_example("guichet");
    let out = Command::new(example_bin("guichet"))
        .current_dir(dir.path())
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .args(["--config", "loom.yaml", "run", "interne", "Le plan ?"])
        .args(["--run-id", "plan-1", "--json"])
        .output()
        .unwrap();
    let result = json_out(&out, 0);
    let plan = fs::read(repo().join("examples/guichet/documents/plan.png")).unwrap();
    let artifact = &result["artifacts"][0];
    let uri = artifact["uri"].as_str().unwrap();
    assert_eq!(
        artifact,
        &json!({"uri": uri, "origin": "tool_output", "media_type": "image/png",
                "size": plan.len(), "name": "plan.png"})
    );
    assert_eq!(result["text"], format!("Voici le plan : {uri}"));
    let stored = dir
        .path()
        .join("data/.artifacts")
        .join(uri.trim_start_matches("artifact://"));
    assert_eq!(fs::read(stored).unwrap(), plan);
    let journal = fs::read_to_string(dir.path().join("data/default/plan-1.jsonl")).unwrap();
    let types: Vec<String> = journal
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let stored_at = types.iter().position(|t| t == "artifact.stored").unwrap();
    assert_eq!(
        types[stored_at - 1..=stored_at + 1],
        ["tool.called", "artifact.stored", "tool.completed"]
    );
    assert!(!journal.contains("inline_data"));
}

/// Runs the `calls` scenario of `mcp_client.py` against `loom mcp` in `dir`.
fn mcp_calls(dir: &Path, calls: Value) -> Value {
    mcp_client(
        "calls",
        json!({
            "command": loom_bin(),
            "args": ["--config", dir.join("loom.yaml"), "mcp"],
            "cwd": dir,
            "calls": calls,
        }),
    )
}
