//! Encryption at rest and retention through the `devis` binary (the stock CLI with the example's
//! tool): a sealed journal and its files on JSONL and SQLite hold no clear content and read
//! back through every command; rotation; a removed, deleted or wrong key (exit code 2, REST
//! 424); altered bytes; `loom retention` listing then erasing old sessions, sealed or not.

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
/// The amount of the answer, as the tool writes it (narrow no-break spaces).
const AMOUNT: &str = "1\u{202f}375 € TTC";
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR plan de la cuisine";
/// Two keys (32 bytes, base64): bytes 0..31, and 32 times 9.
const KEY_A: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const KEY_B: &str = "CQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQk=";
/// Their ids: the first 12 hex digits of sha256("loom.key.v1" + key).
const ID_A: &str = "4ed42d1a2576";

/// `devis` in `dir` with exactly the environment variables given (none inherited that Loom
/// reads).
fn devis(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(devis_bin())
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .env_remove("JOURNAL_KEY")
        .env_remove("NEW_KEY")
        .envs(env.iter().copied())
        .args(["--config", "loom.yaml"])
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The devis project with `storage` replaced.
fn project(storage: &str) -> tempfile::TempDir {
    let dir = devis_project();
    set_keys(dir.path(), storage);
    dir
}

/// Replaces the `storage` section of the project's `loom.yaml`.
fn set_keys(dir: &Path, storage: &str) {
    let path = dir.join("loom.yaml");
    let yaml = fs::read_to_string(&path).unwrap();
    let start = yaml.find("storage:").unwrap();
    let end = yaml.find("telemetry:").unwrap();
    fs::write(
        &path,
        format!("{}{storage}\n{}", &yaml[..start], &yaml[end..]),
    )
    .unwrap();
}

fn jsonl_storage(keys: &str) -> String {
    format!(
        "storage:\n  events: {{backend: jsonl, path: data}}\n  encryption: {{keys: [{keys}]}}\n"
    )
}

fn sqlite_storage(keys: &str) -> String {
    format!(
        "storage:\n  events: {{backend: sqlite, path: data/loom.db}}\n  encryption: {{keys: [{keys}]}}\n"
    )
}

/// Every byte the journal holds: the JSONL files, or the SQLite database with its WAL.
fn stored_bytes(dir: &Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut stack = vec![dir.join("data")];
    while let Some(path) = stack.pop() {
        for entry in fs::read_dir(&path).unwrap() {
            let entry = entry.unwrap().path();
            if entry.is_dir() {
                stack.push(entry);
            } else {
                bytes.extend(fs::read(&entry).unwrap());
            }
        }
    }
    bytes
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// The key ids of a JSONL journal's lines, in order.
fn key_ids(dir: &Path, session: &str) -> Vec<String> {
    journal(dir, session)
        .iter()
        .map(|event| {
            event["payload"]["key_id"]
                .as_str()
                .unwrap_or("clear")
                .to_owned()
        })
        .collect()
}

/// A sealed devis run: the answer is right, nothing of the conversation or of the attached file
/// reaches the disk, and `inspect`, `sessions show`, `sessions export` and `sessions files`
/// read it back clear.
fn round_trip(dir: &Path, env: &[(&str, &str)]) {
    fs::write(dir.join("plan.png"), PNG).unwrap();
    let answer = ok(&devis(
        dir,
        env,
        &[
            "run",
            "devis",
            QUESTION,
            "--session",
            "s-1",
            "--run-id",
            "r-1",
            "--attach",
            "plan.png",
        ],
    ));
    assert!(answer.contains(AMOUNT), "{answer}");

    let stored = stored_bytes(dir);
    for clear in [AMOUNT, "rénovation", "montant_ht", "plan de la cuisine"] {
        assert!(!contains(&stored, clear), "'{clear}' is stored in clear");
    }
    // The envelope stays clear: ids and types.
    assert!(contains(&stored, "\"type\":\"run.started\"") || contains(&stored, "run.started"));
    assert!(contains(&stored, ID_A));

    let inspect = ok(&devis(dir, env, &["inspect", "r-1", "--full"]));
    assert!(inspect.contains(AMOUNT), "{inspect}");
    let show: Value = serde_json::from_str(&ok(&devis(
        dir,
        env,
        &["sessions", "show", "s-1", "--json"],
    )))
    .unwrap();
    assert_eq!(show["runs"][0]["status"], "completed", "{show}");
    let export = ok(&devis(dir, env, &["sessions", "export", "s-1"]));
    assert!(
        export.contains("rénovation") && !export.contains("\"sealed\""),
        "{export}"
    );
    ok(&devis(
        dir,
        env,
        &["sessions", "files", "s-1", "--out", "out"],
    ));
    assert_eq!(fs::read(dir.join("out/plan.png")).unwrap(), PNG);
}

/// Without its key, every command that reads the session refuses with exit code 2, naming the
/// tenant and the key id; the session can still be erased.
fn refused_without_key(dir: &Path, env: &[(&str, &str)], key_id: &str) {
    for args in [
        &["inspect", "r-1"][..],
        &["sessions", "show", "s-1"],
        &["sessions", "export", "s-1"],
        &["resume", "r-1", "--session", "s-1"],
    ] {
        let out = devis(dir, env, args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "sealed journal: tenant 'default' has no key {key_id}"
            )),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn a_sealed_jsonl_journal_round_trips_rotates_and_is_shredded() {
    let dir = project(&jsonl_storage("JOURNAL_KEY"));
    let key_a = [("JOURNAL_KEY", KEY_A)];
    round_trip(dir.path(), &key_a);
    // Every line sealed with key A, the file too.
    assert!(key_ids(dir.path(), "s-1").iter().all(|id| id == ID_A));
    let files: Vec<_> = fs::read_dir(dir.path().join("data/.artifacts/default/s-1"))
        .unwrap()
        .map(|e| fs::read(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(files.len(), 1);
    assert!(files[0].starts_with(b"LOOMSEAL1") && files[0][9..21] == *ID_A.as_bytes());

    // Rotation: the new key first seals the second run, the old one still opens the first.
    set_keys(dir.path(), &jsonl_storage("NEW_KEY, JOURNAL_KEY"));
    let both = [("NEW_KEY", KEY_B), ("JOURNAL_KEY", KEY_A)];
    ok(&devis(
        dir.path(),
        &both,
        &[
            "run",
            "devis",
            "Et pour 100 € HT ?",
            "--session",
            "s-1",
            "--run-id",
            "r-2",
        ],
    ));
    let ids = key_ids(dir.path(), "s-1");
    let first_of_r2 = journal(dir.path(), "s-1")
        .iter()
        .position(|e| e["run_id"] == "r-2")
        .unwrap();
    let id_b = &ids[first_of_r2];
    assert_ne!(id_b, ID_A);
    assert!(ids[..first_of_r2].iter().all(|id| id == ID_A), "{ids:?}");
    assert!(ids[first_of_r2..].iter().all(|id| id == id_b), "{ids:?}");
    assert!(ok(&devis(dir.path(), &both, &["inspect", "r-1"])).contains("completed"));

    // The old key removed from the configuration: what it sealed is a missing key.
    set_keys(dir.path(), &jsonl_storage("NEW_KEY"));
    refused_without_key(dir.path(), &[("NEW_KEY", KEY_B)], ID_A);
    // A wrong value for the old key: its id is not the one sealed, still a missing key.
    set_keys(dir.path(), &jsonl_storage("NEW_KEY, JOURNAL_KEY"));
    refused_without_key(
        dir.path(),
        &[("NEW_KEY", KEY_B), ("JOURNAL_KEY", KEY_B)],
        ID_A,
    );

    // Crypto-shredding: the variable unset, nothing of the session reads, and a new run in the
    // tenant is refused before anything is written (its sealing key is gone).
    let lines = journal(dir.path(), "s-1").len();
    refused_without_key(dir.path(), &[("JOURNAL_KEY", KEY_A)], id_b);
    let refused = devis(
        dir.path(),
        &[],
        &["run", "devis", QUESTION, "--session", "s-2"],
    );
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    assert!(
        text(&refused.stderr).contains("has no key 'NEW_KEY'"),
        "{}",
        text(&refused.stderr)
    );
    assert!(!dir.path().join("data/default/s-2.jsonl").exists());
    assert_eq!(
        journal(dir.path(), "s-1").len(),
        lines,
        "nothing recorded is lost"
    );

    // Over REST: 424 with the kind and the key id, the session still listed and erasable.
    let server = server::Server::start(
        &devis_bin(),
        dir.path(),
        &["--config", "loom.yaml", "serve", "--port", "0"],
    );
    let (status, body) = server::request(&server.address, "GET", "/v1/sessions/s-1", "");
    assert_eq!(status, 424, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["kind"], "missing_encryption_key");
    assert!(
        body["error"]["message"].as_str().unwrap().contains(ID_A),
        "{body}"
    );
    let (status, body) = server::request(&server.address, "GET", "/v1/runs/r-1?session_id=s-1", "");
    assert_eq!(status, 424, "{body}");
    let (status, body) = server::request(&server.address, "GET", "/v1/sessions", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"s-1\""), "{body}");
    let (status, _) = server::request(&server.address, "DELETE", "/v1/sessions/s-1", "");
    assert_eq!(status, 200);
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
    assert!(!dir.path().join("data/default/s-1.jsonl").exists());
    assert!(!dir.path().join("data/.artifacts/default/s-1").exists());
}

#[test]
fn a_sealed_sqlite_journal_round_trips_and_refuses_without_its_key() {
    let dir = project(&sqlite_storage("JOURNAL_KEY"));
    round_trip(dir.path(), &[("JOURNAL_KEY", KEY_A)]);
    refused_without_key(dir.path(), &[], ID_A);
    ok(&devis(
        dir.path(),
        &[],
        &["sessions", "delete", "s-1", "--yes"],
    ));
    let listed = ok(&devis(dir.path(), &[], &["sessions", "list", "--json"]));
    assert_eq!(
        serde_json::from_str::<Value>(&listed).unwrap(),
        serde_json::json!([])
    );
}

/// An altered sealed line is refused as such ("cannot open"), never read as garbage.
#[test]
fn an_altered_sealed_line_cannot_be_opened() {
    let dir = project(&jsonl_storage("JOURNAL_KEY"));
    let env = [("JOURNAL_KEY", KEY_A)];
    ok(&devis(
        dir.path(),
        &env,
        &[
            "run",
            "devis",
            QUESTION,
            "--session",
            "s-1",
            "--run-id",
            "r-1",
        ],
    ));
    let path = dir.path().join("data/default/s-1.jsonl");
    let original = fs::read_to_string(&path).unwrap();
    // The same sealed payload under another time: the AAD no longer matches.
    let first = original.lines().next().unwrap();
    let ts_at = first.find("\"ts\":\"").unwrap() + 6;
    let mut altered = first.to_owned();
    altered.replace_range(ts_at..ts_at + 4, "2020");
    fs::write(&path, original.replacen(first, &altered, 1)).unwrap();
    let out = devis(dir.path(), &env, &["inspect", "r-1"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot open event") && stderr.contains("the key does not open it"),
        "{stderr}"
    );
}

/// `loom retention`: sessions last written more than `events_days` ago are listed (a dry run
/// touches nothing), then erased with `--yes`, a sealed one whose key is gone included; a
/// recent one stays. The JSON report is snapshotted.
#[test]
fn retention_lists_then_erases_old_sessions_only() {
    let dir = project(
        "storage:\n  events: {backend: jsonl, path: data}\n  encryption: {keys: [JOURNAL_KEY]}\n  \
         retention: {events_days: 30}\n",
    );
    let env = [("JOURNAL_KEY", KEY_A)];
    let validated = ok(&devis(dir.path(), &env, &["validate"]));
    assert!(
        validated.contains(
            "Journal    : jsonl in ./data, sealed with JOURNAL_KEY (the first seals), retention 30 days"
        ),
        "{validated}"
    );
    for session in ["old", "sealed-old", "recent"] {
        ok(&devis(
            dir.path(),
            &env,
            &[
                "run",
                "devis",
                QUESTION,
                "--session",
                session,
                "--run-id",
                session,
            ],
        ));
    }
    // Two sessions made old: every event of theirs written in 2020 (the bound reads the last
    // write from the clear envelope, never the content).
    for session in ["old", "sealed-old"] {
        let path = dir.path().join(format!("data/default/{session}.jsonl"));
        let aged: String = fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|line| {
                let mut event: Value = serde_json::from_str(line).unwrap();
                let ts = event["ts"].as_str().unwrap();
                event["ts"] = Value::String(format!("2020{}", &ts[4..]));
                format!("{event}\n")
            })
            .collect();
        fs::write(&path, aged).unwrap();
    }

    // A dry run: listed, nothing erased (the key is not even needed).
    let listed = ok(&devis(dir.path(), &[], &["retention"]));
    assert!(
        listed.contains("2 session(s) would be erased, 1 kept."),
        "{listed}"
    );
    assert!(listed.contains("  old  last write 2020-"), "{listed}");
    assert!(listed.contains("Dry run"), "{listed}");
    assert!(dir.path().join("data/default/old.jsonl").exists());

    let mut json: Value =
        serde_json::from_str(&ok(&devis(dir.path(), &[], &["retention", "--json"]))).unwrap();
    // The instants of this run, checked then masked for the snapshot.
    let now = chrono::DateTime::parse_from_rfc3339(json["now"].as_str().unwrap()).unwrap();
    let cutoff =
        chrono::DateTime::parse_from_rfc3339(json["tenants"][0]["cutoff"].as_str().unwrap())
            .unwrap();
    assert_eq!(now - cutoff, chrono::Duration::days(30));
    json["now"] = "[now]".into();
    json["tenants"][0]["cutoff"] = "[now - 30 days]".into();
    for session in json["tenants"][0]["sessions"].as_array_mut().unwrap() {
        assert!(session["updated_at"].as_str().unwrap().starts_with("2020-"));
        session["updated_at"] = "[2020]".into();
    }
    insta::assert_json_snapshot!("retention_dry_run", json);

    let erased = ok(&devis(
        dir.path(),
        &[],
        &["retention", "--yes", "--tenant", "default"],
    ));
    assert!(erased.contains("2 session(s) erased, 1 kept."), "{erased}");
    assert!(
        erased.contains("erased: 17 event(s), 0 file(s), 0 idempotency key(s)"),
        "{erased}"
    );
    for gone in ["old", "sealed-old"] {
        assert!(
            !dir.path()
                .join(format!("data/default/{gone}.jsonl"))
                .exists()
        );
    }
    assert!(dir.path().join("data/default/recent.jsonl").exists());
    let after = ok(&devis(dir.path(), &[], &["retention"]));
    assert!(
        after.contains("0 session(s) would be erased, 1 kept."),
        "{after}"
    );
    assert!(!after.contains("Dry run"), "{after}");
    let unknown = devis(dir.path(), &[], &["retention", "--tenant", "nobody"]);
    assert_eq!(unknown.status.code(), Some(2), "{}", text(&unknown.stderr));
}

/// The events of `tenant`'s session in the project's JSONL journal.
fn tenant_journal(dir: &Path, tenant: &str, session: &str) -> Vec<Value> {
    let path = dir
        .join("data")
        .join(tenant)
        .join(format!("{session}.jsonl"));
    fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Each tenant redirects the key name to its own variable (`tenants[].secrets`): its journal is
/// sealed with its own key, losing one tenant's key shreds that tenant only, and a tenant's own
/// `retention` wins over `storage.retention`.
#[test]
fn each_tenant_seals_with_its_own_key_and_keeps_its_own_retention() {
    let dir = project(
        "storage:\n  events: {backend: jsonl, path: data}\n  encryption: {keys: [journal_key]}\n  \
         retention: {events_days: 30}\n\
         tenants:\n  - id: martin\n    secrets: {journal_key: MARTIN_KEY}\n    \
         retention: {events_days: 36500}\n  - id: dupont\n    secrets: {journal_key: DUPONT_KEY}\n",
    );
    let both = [("MARTIN_KEY", KEY_A), ("DUPONT_KEY", KEY_B)];
    for tenant in ["martin", "dupont"] {
        let answer = ok(&devis(
            dir.path(),
            &both,
            &[
                "run",
                "devis",
                QUESTION,
                "--tenant",
                tenant,
                "--session",
                "s-1",
                "--run-id",
                "r-1",
            ],
        ));
        assert!(answer.contains(AMOUNT), "{answer}");
    }
    let ids = |tenant: &str| -> Vec<String> {
        let mut ids: Vec<String> = tenant_journal(dir.path(), tenant, "s-1")
            .iter()
            .map(|e| {
                e["payload"]["key_id"]
                    .as_str()
                    .unwrap_or("clear")
                    .to_owned()
            })
            .collect();
        ids.dedup();
        ids
    };
    assert_eq!(ids("martin"), [ID_A], "martin's key seals martin's journal");
    let dupont = ids("dupont");
    assert_eq!(dupont.len(), 1, "{dupont:?}");
    assert!(dupont[0] != ID_A && dupont[0] != "clear", "{dupont:?}");

    // Dupont's key deleted: dupont's journal is unreadable, martin's reads on.
    let martin_only = [("MARTIN_KEY", KEY_A)];
    let shredded = devis(
        dir.path(),
        &martin_only,
        &["inspect", "r-1", "--tenant", "dupont"],
    );
    assert_eq!(shredded.status.code(), Some(2));
    assert!(
        text(&shredded.stderr).contains("sealed journal: tenant 'dupont' has no key"),
        "{}",
        text(&shredded.stderr)
    );
    let martin = ok(&devis(
        dir.path(),
        &martin_only,
        &["inspect", "r-1", "--tenant", "martin", "--full"],
    ));
    assert!(martin.contains(AMOUNT), "{martin}");

    // Both sessions made old: dupont's 30 days (the root bound) erase it, martin's own bound
    // keeps it.
    for tenant in ["martin", "dupont"] {
        let path = dir.path().join(format!("data/{tenant}/s-1.jsonl"));
        let aged: String = fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|line| {
                let mut event: Value = serde_json::from_str(line).unwrap();
                let ts = event["ts"].as_str().unwrap();
                event["ts"] = Value::String(format!("2020{}", &ts[4..]));
                format!("{event}\n")
            })
            .collect();
        fs::write(&path, aged).unwrap();
    }
    ok(&devis(dir.path(), &[], &["retention", "--yes"]));
    assert!(dir.path().join("data/martin/s-1.jsonl").exists());
    assert!(!dir.path().join("data/dupont/s-1.jsonl").exists());
}
