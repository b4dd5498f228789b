//! Compaction through the stock `loom` binary, on a JSONL journal and the scripted fake model:
//! a run whose session passed `over_tokens` triggers a compaction (journaled as a `compaction`
//! run, then `session.compacted`) and `loom run` reports it; `loom compact` compacts on demand;
//! a summary that misses markers keeps the original turns and says so; a history cap is
//! journaled as `session.trimmed`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{fs, path::Path};

use common::*;
use serde_json::{Value, json};

const FIRST: &str = "Devis DEV-2041 du 12/03/2026 : 1 842,50 € pour marie@exemple.fr.";

/// A project whose agent `suivi` echoes, with a summarizer answering `summaries` in turn, and
/// `sessions` as given.
fn project(summaries: Value, sessions: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let summaries = summaries
        .as_array()
        .unwrap()
        .iter()
        .map(|s| json!({"text": s}))
        .collect::<Vec<Value>>();
    fs::write(
        dir.path().join("loom.yaml"),
        format!(
            "version: 1\n\
             models:\n  - {{id: main, sdk: fake, model: MAIN}}\n  - {{id: summarizer, sdk: fake, model: SUM, params: {{script: {}}}}}\n\
             storage:\n  events: {{backend: jsonl, path: data}}\n\
             telemetry:\n  logging: {{level: WARN}}\n\
             sessions:\n{sessions}\
             agents:\n  - name: suivi\n    main: {{model: main}}\n",
            Value::Array(summaries)
        ),
    )
    .unwrap();
    dir
}

fn run(dir: &Path, message: &str, run_id: &str) -> std::process::Output {
    let out = loom(
        dir,
        &[
            "run",
            "suivi",
            message,
            "--session",
            "client",
            "--run-id",
            run_id,
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    out
}

/// The `Compaction :` line of a report, its run id replaced.
fn compaction_line(stderr: &str) -> Option<String> {
    stderr
        .lines()
        .find(|l| l.starts_with("Compaction : "))
        .map(|l| match l.find("(run ") {
            Some(at) => format!("{}(run <id>)", &l[..at]),
            None => l.to_owned(),
        })
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

#[test]
fn a_run_past_over_tokens_triggers_a_compaction_that_loom_run_reports() {
    let dir = project(
        json!(["Quote DEV-2041 of 2026-03-12: 1842,50 € for marie@exemple.fr."]),
        "  compaction: {model: summarizer, over_tokens: 40, keep_last: 1}\n",
    );
    let first = run(dir.path(), FIRST, "r1");
    // One turn only: nothing to summarize yet.
    assert_eq!(compaction_line(&text(&first.stderr)), None);
    let second = run(dir.path(), "Second message.", "r2");
    let third = run(dir.path(), "Third message.", "r3");
    insta::assert_snapshot!(
        "compaction_lines",
        format!(
            "r2: {}\nr3: {}",
            compaction_line(&text(&second.stderr)).unwrap(),
            compaction_line(&text(&third.stderr)).unwrap()
        )
    );

    let events = journal(dir.path(), "client");
    let started: Vec<&Value> = of_type(&events, "run.started")
        .into_iter()
        .filter(|e| e["payload"]["kind"] == "compaction")
        .collect();
    assert_eq!(started.len(), 2, "one after r2, one after r3");
    assert_eq!(started[0]["agent"], "_compaction");
    assert_eq!(started[0]["payload"]["triggered_by"], "r2");
    let compacted = of_type(&events, "session.compacted");
    assert_eq!(compacted.len(), 2);
    assert_eq!(compacted[0]["run_id"], started[0]["run_id"]);
    assert_eq!(compacted[0]["payload"]["fidelity"], "ok");
    assert_eq!(compacted[0]["payload"]["kept"], 1);
    // The summary of r1 was written before r3 opened: r3's JSON result says so.
    let json = loom(
        dir.path(),
        &["run", "suivi", "Fourth.", "--session", "client", "--json"],
    );
    let result: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(result["compaction"]["when"], "after");
    assert_eq!(result["compaction"]["outcome"], "applied");
}

#[test]
fn loom_compact_keeps_the_originals_when_the_summary_misses_markers() {
    let dir = project(
        json!(["A quote was sent.", "A quote DEV-2041 was sent."]),
        "  compaction: {model: summarizer, over_tokens: 100000, hard_tokens: 200000, keep_last: 1}\n",
    );
    run(dir.path(), FIRST, "r1");
    run(dir.path(), "Second message.", "r2");

    let out = loom(dir.path(), &["compact", "client", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let note: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(note["outcome"], "kept");
    assert!(
        text(&out.stderr).contains(
            "\nCompaction : the summary left out details of the originals: the original turns \
             are kept"
        ),
        "{}",
        text(&out.stderr)
    );
    let events = journal(dir.path(), "client");
    assert!(of_type(&events, "session.compacted").is_empty());
    let checks: Vec<&Value> = of_type(&events, "guard.checked")
        .into_iter()
        .filter(|e| e["payload"]["guard"] == "fidelity")
        .collect();
    assert_eq!(checks.len(), 2);
    assert_eq!(
        checks[1]["payload"]["reason"],
        "missing markers: 12/03/2026, 1 842,50 €, marie@exemple.fr"
    );
    assert_eq!(checks[1]["payload"]["resolution"], "fail");
    let failed = of_type(&events, "run.failed");
    assert_eq!(failed[0]["payload"]["error_type"], "guard.fidelity");

    // Without sessions.compaction, compacting is refused; an unknown session is named.
    let out = loom(dir.path(), &["compact", "nobody"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("nobody"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_history_cap_is_journaled_as_session_trimmed() {
    let dir = project(json!([]), "  history: {max_turns: 1}\n");
    run(dir.path(), FIRST, "r1");
    run(dir.path(), "Second message.", "r2");
    run(dir.path(), "Third message.", "r3");
    let events = journal(dir.path(), "client");
    let trimmed = of_type(&events, "session.trimmed");
    assert_eq!(trimmed.len(), 1, "only r3 had a turn too many");
    assert_eq!(trimmed[0]["run_id"], "r3");
    assert_eq!(trimmed[0]["payload"]["reason"], "max_turns");
    assert_eq!(trimmed[0]["payload"]["dropped"], 2);
    let out = loom(dir.path(), &["compact", "client"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("compaction is not configured"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_judge_reads_the_summary_of_a_compacted_session() {
    let dir = project(
        json!(["Quote DEV-2041 of 12/03/2026: 1 842,50 € for marie@exemple.fr."]),
        "  compaction: {model: summarizer, over_tokens: 40, keep_last: 1}\n",
    );
    run(dir.path(), FIRST, "r1");
    run(dir.path(), "Second message.", "r2");
    let events = journal(dir.path(), "client");
    assert_eq!(of_type(&events, "session.compacted").len(), 1);

    // The agent gets a judge that reads the session summary: it passes only when the summary
    // written by the compaction is in its message.
    let summary = "<session_summary>\nQuote DEV-2041 of 12/03/2026";
    let config = fs::read_to_string(dir.path().join("loom.yaml")).unwrap();
    let config = config.replace(
        "models:\n",
        &format!(
            "models:\n  - {{id: juge, sdk: fake, model: JUGE, params: {{script: {}}}}}\n",
            json!([
                {"with_text": summary, "tool_calls": [
                    {"name": "verdict", "arguments": {"criteria": [{"name": "c", "score": 0.9, "reason": "ok"}]}}
                ]},
                {"without_text": summary, "tool_calls": [
                    {"name": "verdict", "arguments": {"criteria": [{"name": "c", "score": 0.1, "reason": "no summary"}]}}
                ]}
            ])
        ),
    ) + "    judge: {model: juge, criteria: [{name: c, rule: r, min_score: 0.8}], \
         context: [user_input, session_summary], on_failure: fail}\n";
    fs::write(dir.path().join("loom.yaml"), config).unwrap();

    run(dir.path(), "Third message.", "r3");
    let events = journal(dir.path(), "client");
    let judged: Vec<&Value> = of_type(&events, "judge.evaluated")
        .into_iter()
        .filter(|e| e["run_id"] == "r3")
        .collect();
    assert_eq!(judged.len(), 1);
    assert_eq!(judged[0]["payload"]["passed"], true, "{}", judged[0]);
}

#[test]
fn compact_session_is_an_mcp_tool_when_compaction_is_configured() {
    if !python_has("mcp.client, httpx2, mcp_types", "pip install 'mcp>=2,<3'") {
        return;
    }
    let dir = project(
        json!(["Quote DEV-2041 of 12/03/2026: 1 842,50 € for marie@exemple.fr."]),
        "  compaction: {model: summarizer, over_tokens: 100000, hard_tokens: 200000, keep_last: 1}\n",
    );
    run(dir.path(), FIRST, "r1");
    run(dir.path(), "Second message.", "r2");
    let server = json!({
        "command": loom_bin(),
        "args": ["--config", dir.path().join("loom.yaml"), "mcp"],
        "cwd": dir.path(),
    });
    let mut arguments = server.clone();
    arguments["calls"] = json!([
        ["compact_session", {"session_id": "client"}],
        ["compact_session", {"session_id": "nobody"}],
        ["compact_session", {"session": "client"}],
    ]);
    let seen = mcp_client("calls", arguments);
    let calls = seen["calls"].as_array().unwrap();
    assert_eq!(calls[0]["is_error"], false, "{}", calls[0]);
    let note = &calls[0]["structured"];
    assert_eq!(note["outcome"], "applied", "{note}");
    assert_eq!(note["kept"], 1);
    assert!(note["tokens_after"].as_u64() < note["tokens_before"].as_u64());
    assert_eq!(calls[1]["is_error"], true);
    assert!(calls[1]["texts"][0].as_str().unwrap().contains("nobody"));
    assert_eq!(calls[2]["is_error"], true);
    assert_eq!(
        calls[2]["texts"][0],
        "unknown argument 'session' (expected session_id)"
    );
    let events = journal(dir.path(), "client");
    let compacted = of_type(&events, "session.compacted");
    assert_eq!(compacted.len(), 1);
    assert_eq!(compacted[0]["run_id"], note["run_id"]);

    // Without sessions.compaction, the tool is not offered.
    let config = fs::read_to_string(dir.path().join("loom.yaml")).unwrap();
    let config = config.replace(
        "  compaction: {model: summarizer, over_tokens: 100000, hard_tokens: 200000, keep_last: 1}\n",
        "  history: {max_turns: 5}\n",
    );
    fs::write(dir.path().join("loom.yaml"), config).unwrap();
    let mut arguments = server;
    arguments["calls"] = json!([["compact_session", {"session_id": "client"}]]);
    let seen = mcp_client("calls", arguments);
    assert!(
        seen["calls"][0]["protocol_error"]
            .as_str()
            .unwrap_or_default()
            .contains("unknown tool 'compact_session'"),
        "{seen}"
    );
}
