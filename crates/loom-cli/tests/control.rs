//! Live control and sessions through the `devis` binary: resume after a crash, cancel, steer
//! errors, and the sessions commands (list, show, export, delete, in a tenant).

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::server;
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
    // The reference's layout: id, events, last write (UTC, to the minute), most recent first.
    let list = text(&devis(dir.path(), &["sessions", "list"]).stdout);
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 2, "{list}");
    assert!(
        lines[0].starts_with(&format!("{:<24} {:>6} events   20", "other", 17)),
        "{list}"
    );
    assert!(
        lines[1].starts_with(&format!("{:<24} {:>6} events   20", "client-7", 34)),
        "{list}"
    );
    let show = text(&devis(dir.path(), &["sessions", "show", "client-7"]).stdout);
    assert!(
        show.starts_with("Session    : client-7 · 34 events · 20"),
        "{show}"
    );
    assert!(show.contains("\nRuns       :\n"), "{show}");
    for run in ["s-a", "s-b"] {
        assert!(
            show.contains(&format!(
                "  {run}  devis        completed         2 iteration(s)  0.00"
            )),
            "{show}"
        );
    }
    assert!(show.ends_with("Waiting    : nothing\n"), "{show}");
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
    assert!(
        list.starts_with("client-acme                  17 events"),
        "{list}"
    );
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
        text(&show.stdout).contains("  devis        completed         2 iteration(s)"),
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

/// A 1×1 PNG, to attach.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0xf0,
    0x1f, 0x00, 0x05, 0x00, 0x01, 0xff, 0x89, 0x99, 0x3d, 0x1d, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
    0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

/// The JSON a command printed on stdout (it succeeded).
fn json_of(output: &Output) -> Value {
    assert!(output.status.success(), "{}", text(&output.stderr));
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&output.stdout)))
}

/// `value` with the instants that vary between runs (`updated_at`, `stored_at`, checked to be
/// RFC 3339 UTC with microseconds) replaced by `[ts]`, for a snapshot.
fn without_instants(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, value)| {
                    let value = match (key.as_str(), value) {
                        ("updated_at" | "stored_at", Value::String(ts)) => {
                            assert!(
                                chrono::DateTime::parse_from_rfc3339(ts).is_ok()
                                    && ts.ends_with('Z')
                                    && ts.len() == "2026-11-29T11:53:09.863639Z".len(),
                                "{key}: {ts}"
                            );
                            Value::from("[ts]")
                        }
                        _ => without_instants(value),
                    };
                    (key.clone(), value)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_instants).collect()),
        other => other.clone(),
    }
}

/// `loom sessions list --json`, `show --json` and `files --json` print the bodies of
/// `GET /v1/sessions`, `GET /v1/sessions/{id}` and `GET /v1/sessions/{id}/files`: the
/// reference's `[{session_id, last_seq, updated_at}]` (most recent first), `SessionInfo` and
/// `[SessionFile]`.
#[test]
fn sessions_json_is_the_rest_bodies() {
    let dir = devis_project();
    fs::write(dir.path().join("plan.png"), PNG).unwrap();
    for run in ["s-a", "s-b"] {
        let out = devis(
            dir.path(),
            &[
                "run",
                "devis",
                QUESTION,
                "--session",
                "client-7",
                "--run-id",
                run,
                "--attach",
                "plan.png",
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    assert!(
        devis(dir.path(), &["run", "devis", QUESTION, "--run-id", "other"])
            .status
            .success()
    );

    let list = json_of(&devis(dir.path(), &["sessions", "list", "--json"]));
    insta::assert_json_snapshot!("sessions_list_json", without_instants(&list));
    let show = json_of(&devis(
        dir.path(),
        &["sessions", "show", "client-7", "--json"],
    ));
    insta::assert_json_snapshot!("sessions_show_json", without_instants(&show));
    let files = json_of(&devis(
        dir.path(),
        &["sessions", "files", "client-7", "--json"],
    ));
    insta::assert_json_snapshot!("sessions_files_json", without_instants(&files));
    let none = json_of(&devis(
        dir.path(),
        &[
            "sessions", "files", "client-7", "--origin", "offload", "--json",
        ],
    ));
    assert_eq!(none, Value::Array(Vec::new()));
    let unknown = devis(dir.path(), &["sessions", "show", "nope", "--json"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert_eq!(text(&unknown.stdout), "");
    assert_eq!(
        text(&unknown.stderr).trim(),
        "error: session nope not found"
    );

    // The REST API answers the same bodies, byte for byte once parsed.
    let server = server::Server::start(
        &devis_bin(),
        dir.path(),
        &["--config", "loom.yaml", "serve", "--port", "0"],
    );
    for (path, printed) in [
        ("/v1/sessions", &list),
        ("/v1/sessions/client-7", &show),
        ("/v1/sessions/client-7/files", &files),
    ] {
        let (status, body) = server::request(&server.address, "GET", path, "");
        assert_eq!(status, 200, "{path}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(&body, printed, "{path}");
    }
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
}

/// `loom sessions files`: the list for people, `--origin`, and `--out DIR` writing the bytes
/// (refused, writing nothing, over an existing file unless `--force`).
#[test]
fn sessions_files_lists_and_writes_the_files() {
    let dir = devis_project();
    fs::write(dir.path().join("plan.png"), PNG).unwrap();
    let out = devis(
        dir.path(),
        &[
            "run", "devis", QUESTION, "--run-id", "f-1", "--attach", "plan.png",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let sha = {
        use sha2::{Digest, Sha256};
        hex::encode(Sha256::digest(PNG))
    };
    let listed = devis(dir.path(), &["sessions", "files", "f-1"]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    assert_eq!(
        text(&listed.stdout),
        format!(
            "artifact://default/f-1/{sha}.png (image/png, {} bytes, attachment, plan.png)\n",
            PNG.len()
        )
    );
    let none = devis(
        dir.path(),
        &["sessions", "files", "f-1", "--origin", "tool_output"],
    );
    assert_eq!(text(&none.stdout), "No file.\n");
    let bad = devis(
        dir.path(),
        &["sessions", "files", "f-1", "--origin", "upload"],
    );
    assert_eq!(bad.status.code(), Some(2));

    let out_dir = dir.path().join("out");
    let written = devis(dir.path(), &["sessions", "files", "f-1", "--out", "out"]);
    assert!(written.status.success(), "{}", text(&written.stderr));
    assert_eq!(fs::read(out_dir.join("plan.png")).unwrap(), PNG);
    assert!(
        text(&written.stderr).contains("1 file(s) written to out."),
        "{}",
        text(&written.stderr)
    );
    // Again: the file exists, so nothing is written without --force.
    fs::write(out_dir.join("plan.png"), b"mine").unwrap();
    let again = devis(dir.path(), &["sessions", "files", "f-1", "--out", "out"]);
    assert_eq!(again.status.code(), Some(2));
    assert!(
        text(&again.stderr).contains("exists: add --force to overwrite it (nothing was written)"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(fs::read(out_dir.join("plan.png")).unwrap(), b"mine");
    let forced = devis(
        dir.path(),
        &["sessions", "files", "f-1", "--out", "out", "--force"],
    );
    assert!(forced.status.success(), "{}", text(&forced.stderr));
    assert_eq!(fs::read(out_dir.join("plan.png")).unwrap(), PNG);
    // --force means nothing without --out.
    let alone = devis(dir.path(), &["sessions", "files", "f-1", "--force"]);
    assert_eq!(alone.status.code(), Some(2));
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
