//! Helpers shared by the end-to-end tests: where the binaries are, copies of the example
//! projects, and reading journals. Each test binary uses a subset of them.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

pub(crate) mod server;

/// The stock `loom` binary.
pub(crate) fn loom_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_loom"))
}

/// Runs the stock `loom` in `dir` on its `loom.yaml`, without the caller's `LOOM_PROFILE` and
/// `LOOM_LOG`.
pub(crate) fn loom(dir: &Path, args: &[&str]) -> std::process::Output {
    run_in(&loom_bin(), dir, args)
}

/// Runs `bin` (the stock `loom` or an example binary) in `dir` on its `loom.yaml` as [`loom`]
/// does, the `relance` example's file of sent reminders kept in `dir` (`RELANCE_FILE`).
pub(crate) fn run_in(bin: &Path, dir: &Path, args: &[&str]) -> std::process::Output {
    run_in_env(bin, dir, args, &[])
}

/// [`run_in`] with more environment variables.
pub(crate) fn run_in_env(
    bin: &Path,
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    Command::new(bin)
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .env("RELANCE_FILE", dir.join("relances.txt"))
        .envs(env.iter().copied())
        .args(["--config", "loom.yaml"])
        .args(args)
        .output()
        .unwrap()
}

/// Runs a scenario of `tests/mcp_client.py` (the official Python MCP client) with its
/// `arguments`, and returns what it observed (the JSON of its last line of output).
pub(crate) fn mcp_client(scenario: &str, arguments: Value) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client.py");
    let output = Command::new("python3")
        .arg(script)
        .arg(scenario)
        .arg(arguments.to_string())
        .output()
        .unwrap();
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "scenario {scenario} failed:\n{}\n{stdout}",
        text(&output.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// The repository root.
pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The events of `../shared/reference/journals/<name>`, or `None` on a clone without
/// `../shared` (the test then returns: see `loom_testkit::shared`).
pub(crate) fn reference_journal(name: &str) -> Option<Vec<Value>> {
    let relative = format!("reference/journals/{name}");
    let text = loom_testkit::shared::text(&relative)?;
    let events = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{relative}: {e}")))
        .collect();
    Some(events)
}

/// The optional payload fields Loom adds to the reference's events (its readers ignore unknown
/// fields, and an optional field leaves `schema_version` at 1): `(type, field)`.
pub(crate) const ADDED_FIELDS: &[(&str, &str)] = &[
    // The declaration a call was launched under: whether its `tool.called` must be synced.
    ("tool.called", "side_effects"),
];

/// The payload keys Loom writes for the reference's event `theirs`: the reference's, in its
/// order, then the fields Loom adds to that type ([`ADDED_FIELDS`]).
pub(crate) fn expected_payload_keys(theirs: &Value) -> Vec<String> {
    let kind = theirs["type"].as_str().unwrap_or_default();
    let payload = theirs["payload"].as_object();
    payload
        .into_iter()
        .flat_map(|m| m.keys().cloned())
        .chain(
            ADDED_FIELDS
                .iter()
                .filter(|(added_to, _)| *added_to == kind)
                .map(|(_, field)| (*field).to_owned()),
        )
        .collect()
}

/// An example binary (`devis`, `chaos`, `relance`), built by `cargo test` beside `loom`.
pub(crate) fn example_bin(name: &str) -> PathBuf {
    let path = loom_bin()
        .parent()
        .unwrap()
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test` (which builds examples)",
        path.display()
    );
    path
}

/// The `devis` example binary.
pub(crate) fn devis_bin() -> PathBuf {
    example_bin("devis")
}

/// A copy of `examples/<name>` (its `loom.yaml`, `agents/`, `prompts/` and `classeurs/`) in a
/// fresh directory.
pub(crate) fn copy_example(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let source = repo().join("examples").join(name);
    fs::copy(source.join("loom.yaml"), dir.path().join("loom.yaml")).unwrap();
    for sub in ["agents", "prompts", "classeurs"] {
        if !source.join(sub).is_dir() {
            continue;
        }
        fs::create_dir_all(dir.path().join(sub)).unwrap();
        for entry in fs::read_dir(source.join(sub)).unwrap() {
            let entry = entry.unwrap();
            fs::copy(entry.path(), dir.path().join(sub).join(entry.file_name())).unwrap();
        }
    }
    dir
}

/// A copy of `examples/devis`.
pub(crate) fn devis_project() -> tempfile::TempDir {
    copy_example("devis")
}

/// Process output as text.
pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The run id `loom run` prints on stderr.
pub(crate) fn run_id_of(stderr: &str) -> String {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("Run        : "))
        .expect("the run id line")
        .trim()
        .to_owned()
}

/// The events of a session's JSONL journal under `<dir>/data/default/`.
pub(crate) fn journal(dir: &Path, session: &str) -> Vec<Value> {
    let path = dir.join("data/default").join(format!("{session}.jsonl"));
    fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Whether `python3` can import `modules` (comma-separated, as in an `import` line). When it
/// cannot, the test is skipped in a quick developer run and fails when services are required
/// (`LOOM_REQUIRE_SERVICES=1`, as `.ci/run` sets, which installs them): `install` is the pip
/// command named in both messages.
pub(crate) fn python_has(modules: &str, install: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("LOOM_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "python3 cannot import {modules}: {install}"
        );
        eprintln!("skipped: python3 cannot import {modules} ({install})");
    }
    ok
}

/// The journaled results of a run's tool calls, in journal order: (call id, is_error, the
/// first block's text, or its data as JSON).
pub(crate) fn tool_results(events: &[Value]) -> Vec<(String, bool, String)> {
    events
        .iter()
        .filter(|e| e["type"] == "tool.completed")
        .map(|e| {
            let output = &e["payload"]["output"];
            let text = output["blocks"][0]["text"]
                .as_str()
                .map_or_else(|| output["blocks"][0]["data"].to_string(), str::to_owned);
            (
                e["payload"]["call_id"].as_str().unwrap().to_owned(),
                output["is_error"].as_bool().unwrap(),
                text,
            )
        })
        .collect()
}
