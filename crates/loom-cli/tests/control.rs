//! Live control and sessions through the `devis` binary: resume after a crash, cancel, steer
//! errors, and the sessions commands (list, show, export, delete, in a tenant).

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use serde_json::Value;

const QUESTION: &str = "Quel prix TTC pour un devis de 1 250 € HT en rénovation (TVA à 10 %) ?";

fn devis(dir: &Path, args: &[&str]) -> Output {
    Command::new(devis_bin())
        .current_dir(dir)
        .args(["--config", "loom.yaml"])
        .args(args)
        .output()
        .unwrap()
}

fn journal_path(dir: &Path, session: &str) -> PathBuf {
    dir.join("data/default").join(format!("{session}.jsonl"))
}

fn types(dir: &Path, session: &str) -> Vec<String> {
    fs::read_to_string(journal_path(dir, session))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// Keeps the first `lines` events of a journal, as a crash at that point would have left it
/// (lease expiry aside: the claim is dropped so another process may take over at once).
fn crash_after(dir: &Path, session: &str, lines: usize) {
    let path = journal_path(dir, session);
    let kept: Vec<String> = fs::read_to_string(&path)
        .unwrap()
        .lines()
        .take(lines)
        .filter(|l| !l.contains("\"type\":\"run.claimed\""))
        .enumerate()
        .map(|(i, l)| {
            let mut event: Value = serde_json::from_str(l).unwrap();
            event["seq"] = Value::from(i as u64 + 1);
            event.to_string()
        })
        .collect();
    fs::write(&path, kept.join("\n") + "\n").unwrap();
}

#[test]
fn resume_continues_a_run_from_where_its_journal_stops() {
    let dir = devis_project();
    assert!(
        devis(dir.path(), &["run", "devis", QUESTION, "--run-id", "r1"])
            .status
            .success()
    );
    // A crash right after tool.called (9th event): the tool may or may not have run.
    crash_after(dir.path(), "r1", 9);
    assert_eq!(types(dir.path(), "r1").last().unwrap(), "tool.called");
    let out = devis(dir.path(), &["resume", "r1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("1\u{202f}375 € TTC"));
    let after = types(dir.path(), "r1");
    assert_eq!(after.last().unwrap(), "run.completed");
    // prix_ttc has no side effects: it was launched again, marked as resumed.
    let journal = fs::read_to_string(journal_path(dir.path(), "r1")).unwrap();
    assert!(journal.contains("\"resumed\":true"));
    // Resuming a closed run changes nothing.
    let again = devis(dir.path(), &["resume", "r1"]);
    assert!(again.status.success());
    assert_eq!(types(dir.path(), "r1"), after);
}

#[test]
fn cancel_closes_an_open_run_once() {
    let dir = devis_project();
    assert!(
        devis(dir.path(), &["run", "devis", QUESTION, "--run-id", "c1"])
            .status
            .success()
    );
    crash_after(dir.path(), "c1", 7);
    let out = devis(dir.path(), &["cancel", "c1", "--by", "alice"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let after = types(dir.path(), "c1");
    assert_eq!(
        after[after.len() - 2..],
        ["run.transitioned", "run.cancelled"]
    );
    let journal = fs::read_to_string(journal_path(dir.path(), "c1")).unwrap();
    assert!(journal.contains("\"by\":\"alice\""));
    let twice = devis(dir.path(), &["cancel", "c1"]);
    assert_eq!(twice.status.code(), Some(2));
    // A closed run cannot be steered either.
    let steer = devis(dir.path(), &["steer", "c1", "Et en 20 % ?"]);
    assert_eq!(steer.status.code(), Some(2));
    assert!(
        text(&steer.stderr).contains("has closed"),
        "{}",
        text(&steer.stderr)
    );
}

#[test]
fn sessions_list_show_export_and_delete() {
    let dir = devis_project();
    for run in ["s-a", "s-b"] {
        assert!(
            devis(
                dir.path(),
                &[
                    "run",
                    "devis",
                    QUESTION,
                    "--session",
                    "client-7",
                    "--run-id",
                    run
                ]
            )
            .status
            .success()
        );
    }
    assert!(
        devis(dir.path(), &["run", "devis", QUESTION, "--run-id", "other"])
            .status
            .success()
    );
    let list = text(&devis(dir.path(), &["sessions", "list"]).stdout);
    assert!(list.contains("client-7  34 event(s)"), "{list}");
    assert!(list.contains("other  17 event(s)"), "{list}");
    let show = text(&devis(dir.path(), &["sessions", "show", "client-7"]).stdout);
    assert!(
        show.contains("  s-a  devis  completed  2 iteration(s)"),
        "{show}"
    );
    assert!(
        show.contains("  s-b  devis  completed  2 iteration(s)"),
        "{show}"
    );
    // Export is the journal, byte for byte.
    let export = devis(dir.path(), &["sessions", "export", "client-7"]);
    assert_eq!(
        export.stdout,
        fs::read(journal_path(dir.path(), "client-7")).unwrap()
    );
    // Delete needs --yes, then erases the journal; other sessions stay.
    assert_eq!(
        devis(dir.path(), &["sessions", "delete", "client-7"])
            .status
            .code(),
        Some(2)
    );
    assert!(journal_path(dir.path(), "client-7").exists());
    let delete = devis(dir.path(), &["sessions", "delete", "client-7", "--yes"]);
    assert!(delete.status.success(), "{}", text(&delete.stderr));
    assert!(text(&delete.stderr).contains("34 event(s)"));
    assert!(!journal_path(dir.path(), "client-7").exists());
    assert!(journal_path(dir.path(), "other").exists());
    let gone = devis(dir.path(), &["sessions", "show", "client-7"]);
    assert_eq!(gone.status.code(), Some(2));
    assert_eq!(
        text(&gone.stderr).trim(),
        "error: session client-7 not found"
    );
}

/// Every `loom sessions` command takes `--tenant`: the sessions of another tenant are neither
/// listed nor found, and an undeclared tenant is refused.
#[test]
fn sessions_commands_take_a_tenant() {
    let dir = devis_project();
    let config = dir.path().join("loom.yaml");
    let mut yaml = fs::read_to_string(&config).unwrap();
    yaml.push_str("\ntenants:\n  - id: default\n  - id: acme\n");
    fs::write(&config, yaml).unwrap();
    for (tenant, session) in [("acme", "client-acme"), ("default", "client-7")] {
        let run = devis(
            dir.path(),
            &[
                "run",
                "devis",
                QUESTION,
                "--tenant",
                tenant,
                "--session",
                session,
            ],
        );
        assert!(run.status.success(), "{}", text(&run.stderr));
    }
    let acme = dir.path().join("data/acme/client-acme.jsonl");
    assert!(acme.exists());
    let list = text(&devis(dir.path(), &["sessions", "list", "--tenant", "acme"]).stdout);
    assert!(list.contains("client-acme  17 event(s)"), "{list}");
    assert!(!list.contains("client-7"), "{list}");
    let list = text(&devis(dir.path(), &["sessions", "list"]).stdout);
    assert!(
        list.contains("client-7") && !list.contains("client-acme"),
        "{list}"
    );
    // The flag may come before the subcommand too.
    let show = devis(
        dir.path(),
        &["sessions", "--tenant", "acme", "show", "client-acme"],
    );
    assert!(
        text(&show.stdout).contains("  devis  completed  2 iteration(s)"),
        "{}",
        text(&show.stderr)
    );
    let elsewhere = devis(dir.path(), &["sessions", "show", "client-acme"]);
    assert_eq!(elsewhere.status.code(), Some(2));
    let export = devis(
        dir.path(),
        &["sessions", "export", "client-acme", "--tenant", "acme"],
    );
    assert_eq!(export.stdout, fs::read(&acme).unwrap());
    let delete = devis(
        dir.path(),
        &[
            "sessions",
            "delete",
            "client-acme",
            "--tenant",
            "acme",
            "--yes",
        ],
    );
    assert!(delete.status.success(), "{}", text(&delete.stderr));
    assert!(!acme.exists());
    assert!(journal_path(dir.path(), "client-7").exists());
    let unknown = devis(dir.path(), &["sessions", "list", "--tenant", "globex"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        text(&unknown.stderr).contains("globex"),
        "{}",
        text(&unknown.stderr)
    );
}

#[test]
fn a_second_driver_gets_a_conflict_and_writes_nothing() {
    let dir = devis_project();
    assert!(
        devis(dir.path(), &["run", "devis", QUESTION, "--run-id", "l1"])
            .status
            .success()
    );
    // Keep the first 7 events, the claim included, with a lease that is still running.
    let path = journal_path(dir.path(), "l1");
    let kept: Vec<String> = fs::read_to_string(&path)
        .unwrap()
        .lines()
        .take(7)
        .map(|l| {
            let mut event: Value = serde_json::from_str(l).unwrap();
            if event["type"] == "run.claimed" {
                event["payload"]["lease_until"] = Value::from("2099-01-01T00:00:00.000000Z");
            }
            event.to_string()
        })
        .collect();
    fs::write(&path, kept.join("\n") + "\n").unwrap();
    let before = fs::read(&path).unwrap();
    let out = devis(dir.path(), &["resume", "l1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("this run is driven elsewhere"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(fs::read(&path).unwrap(), before);
}
