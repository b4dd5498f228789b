//! examples/notes-memory end to end: the stock `loom` binary runs an agent whose scripted model
//! stores a decision through loom-notes over MCP (`add_text`), finds it again (`search`) and
//! answers with it. Needs `loom` built next to `loom-notes` (`cargo build -p loom-cli` with the
//! same target directory); skipped with a message otherwise, except under
//! `LOOM_REQUIRE_SERVICES=1` (CI), where it fails.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{fs, path::Path, process::Command};

use serde_json::Value;

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn a_loom_agent_remembers_through_loom_notes() {
    let bin_dir = common::bin().parent().unwrap().to_path_buf();
    let loom = bin_dir.join("loom");
    if !loom.exists() {
        // CI builds the whole workspace, `loom` included: there the test must run.
        assert!(
            std::env::var("LOOM_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "{} is absent, and LOOM_REQUIRE_SERVICES=1 forbids skipping",
            loom.display()
        );
        eprintln!(
            "skipped: {} is absent (build it with `cargo build -p loom-cli` into the same target directory)",
            loom.display()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/notes-memory");
    copy_dir(&example, dir.path());
    let path = std::env::join_paths(
        std::iter::once(bin_dir.clone()).chain(
            std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .unwrap_or_default(),
        ),
    )
    .unwrap();
    let output = Command::new(&loom)
        .current_dir(dir.path())
        .env("PATH", path)
        .env_remove("LOOM_PROFILE")
        .args(["--config", "loom.yaml", "run", "archivist"])
        .arg("Remember that we chose SQLite in WAL mode for the notes store.")
        .args(["--run-id", "r1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(stdout.contains("Done. Your memory now holds:"), "{stdout}");
    assert!(
        stdout.contains("SQLite in WAL mode for the notes store"),
        "{stdout}"
    );

    // The journal shows the two MCP calls, in order.
    let journal = dir.path().join("data/default/r1.jsonl");
    let events: Vec<Value> = fs::read_to_string(&journal)
        .unwrap_or_else(|e| panic!("{}: {e}", journal.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let called: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "tool.called")
        .map(|e| e["payload"]["tool_name"].as_str().unwrap())
        .collect();
    assert_eq!(called, ["memory__add_text", "memory__search"]);

    // What the agent stored stays in the example's own data directory: the CLI finds it.
    let listed = common::command(dir.path(), &[])
        .args(["--fake", "--data-dir"])
        .arg(dir.path().join("data/notes"))
        .args(["search", "SQLite WAL"])
        .output()
        .unwrap();
    let found = String::from_utf8_lossy(&listed.stdout);
    assert!(found.contains("Notes store decision  [loom]"), "{found}");
}
