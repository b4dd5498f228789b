//! End-to-end on the SQLite journal: the `devis` example binary run with
//! `storage.events: {backend: sqlite, path: data/loom.db}` completes, `inspect` and `report`
//! read it back, and the same run on the JSONL journal journals the same events.
//!
//! `cargo test --test sqlite` alone does not build the example binary (and `--example devis`
//! builds it as a test harness only): run `cargo build -p loom-cli --example devis` first, or a
//! plain `cargo test -p loom-cli`, which builds it.
// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::{
    fs,
    path::Path,
    process::{Command, Output},
};

use serde_json::Value;

const QUESTION: &str = "Quel prix TTC pour un devis de 1 250 € HT en rénovation (TVA à 10 %) ?";
const ANSWER: &str = "Pour ce devis de rénovation, le prix est de 1\u{202f}375 € TTC (1\u{202f}250 € HT + 125 € de TVA à 10 %).";

/// A copy of examples/devis (config, agents, prompts) in a fresh directory, its journal switched
/// to SQLite when `sqlite`.
fn devis_project(sqlite: bool) -> tempfile::TempDir {
    let dir = copy_example("devis");
    if sqlite {
        let config = dir.path().join("loom.yaml");
        let yaml = fs::read_to_string(&config).unwrap();
        let jsonl = "    backend: jsonl\n    path: data ";
        assert!(yaml.contains(jsonl), "examples/devis/loom.yaml changed");
        fs::write(
            config,
            yaml.replace(jsonl, "    backend: sqlite\n    path: data/loom.db "),
        )
        .unwrap();
    }
    dir
}

fn run_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(devis_bin())
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .args(["--config", "loom.yaml"])
        .args(args)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Replaces what varies between runs (durations) in rendered output.
fn stable(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut line = line.to_owned();
        for unit in [" ms", " s"] {
            while let Some(end) = line
                .find(unit)
                .filter(|&i| i > 0 && line[..i].chars().last().is_some_and(|c| c.is_ascii_digit()))
            {
                let start = line[..end]
                    .rfind(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .map_or(0, |i| i + 1);
                line.replace_range(start..end + unit.len(), "[time]");
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The journal of run `run_id`, read through the facade (the journal the config declares), as
/// JSON.
fn events_of(dir: &Path, run_id: &str) -> Vec<Value> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let loom = loom_ia::Loom::from_config(dir.join("loom.yaml")).unwrap();
        let run = loom.locate(run_id, None, None).await.unwrap();
        loom.events(&run)
            .await
            .unwrap()
            .iter()
            .map(|event| serde_json::to_value(event).unwrap())
            .collect()
    })
}

/// Whether a key holds something that differs from one run to the next: ids chosen at random,
/// clock readings, measured durations, the worker and its lease (found by diffing two JSONL
/// journals of the same run).
fn volatile(key: &str) -> bool {
    matches!(
        key,
        "event_id" | "ts" | "span_id" | "parent_span_id" | "worker_id" | "lease_until"
    ) || key.ends_with("_event_id")
        || key.ends_with("_ms")
}

/// `value` with every volatile field replaced by `"~"`.
fn without_volatile(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, value)| {
                    let value = if volatile(key) && !value.is_null() {
                        Value::String("~".into())
                    } else {
                        without_volatile(value)
                    };
                    (key.clone(), value)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_volatile).collect()),
        other => other.clone(),
    }
}

/// Runs the devis question as run `devis-1` and checks that it completed with the tool's answer.
fn run_devis(dir: &Path) {
    let out = run_in(dir, &["run", "devis", QUESTION, "--run-id", "devis-1"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert_eq!(stdout.trim(), ANSWER);
    assert!(
        stderr.contains("Status     : completed · iterations: 2 · tokens: "),
        "{stderr}"
    );
}

#[test]
fn devis_on_sqlite_completes_and_inspect_and_report_read_it() {
    let dir = devis_project(true);
    run_devis(dir.path());
    assert!(dir.path().join("data/loom.db").is_file());
    assert!(
        !dir.path().join("data/default").exists(),
        "no JSONL journal beside the database"
    );

    let inspect = run_in(dir.path(), &["inspect", "devis-1"]);
    assert!(inspect.status.success(), "{}", text(&inspect.stderr));
    let json: Value =
        serde_json::from_slice(&run_in(dir.path(), &["inspect", "devis-1", "--json"]).stdout)
            .unwrap();
    assert_eq!(json["run_id"], "devis-1");
    assert_eq!(json["status"], "completed");
    let tool = json["spans"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == "tool")
        .unwrap();
    assert_eq!(tool["attributes"]["gen_ai.tool.name"], "prix_ttc");
    let full = text(&run_in(dir.path(), &["inspect", "devis-1", "--full"]).stdout);
    assert!(full.contains(&format!("· answers   : {ANSWER}")), "{full}");

    let report = run_in(dir.path(), &["report", "devis-1"]);
    assert!(report.status.success(), "{}", text(&report.stderr));
    let json: Value =
        serde_json::from_slice(&run_in(dir.path(), &["report", "devis-1", "--json"]).stdout)
            .unwrap();
    assert_eq!(json["total"]["calls"], 2);
    assert_eq!(json["models"]["fake-1 (FAKE)"]["calls"], 2);

    let missing = run_in(dir.path(), &["inspect", "nope"]);
    assert_eq!(missing.status.code(), Some(2));
    assert_eq!(text(&missing.stderr).trim(), "error: run nope not found");

    // A second run in the same file, then both runs still read back.
    let again = run_in(
        dir.path(),
        &["run", "devis", QUESTION, "--run-id", "devis-2"],
    );
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(events_of(dir.path(), "devis-1").len(), 17);
    assert_eq!(events_of(dir.path(), "devis-2").len(), 17);
}

#[test]
fn the_same_run_on_jsonl_and_on_sqlite_journals_the_same_events() {
    let jsonl = devis_project(false);
    let sqlite = devis_project(true);
    run_devis(jsonl.path());
    run_devis(sqlite.path());

    let on_jsonl = events_of(jsonl.path(), "devis-1");
    let on_sqlite = events_of(sqlite.path(), "devis-1");
    let types = |events: &[Value]| -> Vec<String> {
        events
            .iter()
            .map(|e| e["type"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(on_jsonl.len(), 17);
    assert_eq!(types(&on_sqlite), types(&on_jsonl));
    for (a, b) in on_jsonl.iter().zip(&on_sqlite) {
        assert_eq!(
            without_volatile(b),
            without_volatile(a),
            "{} differs between the journals",
            a["type"]
        );
    }

    // What people read is the same too.
    for command in [["inspect", "devis-1"], ["report", "devis-1"]] {
        let a = run_in(jsonl.path(), &command);
        let b = run_in(sqlite.path(), &command);
        assert!(a.status.success() && b.status.success());
        assert_eq!(
            stable(&text(&b.stdout)),
            stable(&text(&a.stdout)),
            "{command:?}"
        );
    }
}
