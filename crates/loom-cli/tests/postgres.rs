//! End-to-end on PostgreSQL through the `loom` binary (the `devis` example): the schema printed
//! by `loom storage sql` and applied with `psql` by a "DBA", then the devis run with
//! `storage.migrate: check` completes and journals the same events as on JSONL; without the
//! schema the start is refused naming what is missing; `migrate: auto` applies it itself.
//!
//! Each test gets a fresh database (`loom_testkit::postgres`: `loom_t_<random>`) and role on the server
//! `LOOM_TEST_POSTGRES` names, dropped at the end; without it the tests are skipped (failed
//! under `LOOM_REQUIRE_SERVICES=1`). `psql` must be on the PATH.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::{
    fs,
    io::Write,
    path::Path,
    process::{Command, Output, Stdio},
};

use loom_testkit::postgres::TestDb;
use serde_json::Value;

const QUESTION: &str = "Quel prix TTC pour un devis de 1 250 € HT en rénovation (TVA à 10 %) ?";
const ANSWER: &str = "Pour ce devis de rénovation, le prix est de 1\u{202f}375 € TTC (1\u{202f}250 € HT + 125 € de TVA à 10 %).";
/// The variable the test configurations name in `dsn_env`.
const DSN_ENV: &str = "LOOM_E2E_PG_DSN";

fn psql(url: &str, args: &[&str], input: Option<&str>) -> Output {
    let mut child = Command::new("psql")
        .arg(url)
        .args(["-v", "ON_ERROR_STOP=1", "-X", "-q"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psql on the PATH");
    if let Some(input) = input {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    child.wait_with_output().unwrap()
}

/// A fresh database and role (`loom_testkit::postgres`), dropped with it; `None`: skipped.
fn database(test: &str) -> Option<(TestDb, String, String)> {
    let db = TestDb::create(test)?;
    let (url, role) = (db.url(), db.role().to_owned());
    Some((db, url, role))
}

/// A copy of examples/devis whose journal is the database (`dsn_env` names [`DSN_ENV`]).
fn devis_on_postgres(role: &str, migrate: &str) -> tempfile::TempDir {
    let dir = copy_example("devis");
    let config = dir.path().join("loom.yaml");
    let yaml = fs::read_to_string(&config).unwrap();
    let jsonl = "  events:\n    backend: jsonl\n    path: data ";
    assert!(yaml.contains(jsonl), "examples/devis/loom.yaml changed");
    fs::write(
        config,
        yaml.replace(
            jsonl,
            &format!(
                "  migrate: {migrate}\n  events:\n    backend: postgres\n    dsn_env: {DSN_ENV}\n    \
                 role: {role}\n    pool: {{min_size: 1, max_size: 2}} "
            ),
        ),
    )
    .unwrap();
    dir
}

fn run_in(dir: &Path, dsn: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(devis_bin());
    command
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .env_remove(DSN_ENV)
        .args(["--config", "loom.yaml"])
        .args(args);
    if let Some(dsn) = dsn {
        command.env(DSN_ENV, dsn);
    }
    command.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The journal of the only session of the project in `dir`, as `loom sessions export` gives it.
fn exported(dir: &Path, dsn: Option<&str>) -> Vec<Value> {
    let list = run_in(dir, dsn, &["sessions", "list", "--json"]);
    assert!(list.status.success(), "{}", text(&list.stderr));
    let sessions: Value = serde_json::from_slice(&list.stdout).unwrap();
    let session = sessions[0]["session_id"].as_str().unwrap().to_owned();
    let export = run_in(dir, dsn, &["sessions", "export", &session]);
    assert!(export.status.success(), "{}", text(&export.stderr));
    text(&export.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// `value` without what differs from one run to the next.
fn stable(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, value)| {
                    let volatile = matches!(
                        key.as_str(),
                        "event_id"
                            | "ts"
                            | "span_id"
                            | "parent_span_id"
                            | "worker_id"
                            | "lease_until"
                    ) || key.ends_with("_event_id")
                        || key.ends_with("_ms");
                    let value = if volatile && !value.is_null() {
                        Value::String("~".into())
                    } else {
                        stable(value)
                    };
                    (key.clone(), value)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(stable).collect()),
        other => other.clone(),
    }
}

fn run_devis(dir: &Path, dsn: &str) {
    let out = run_in(
        dir,
        Some(dsn),
        &["run", "devis", QUESTION, "--run-id", "devis-1"],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert_eq!(stdout.trim(), ANSWER);
}

#[test]
fn storage_sql_prints_the_schema() {
    let out = Command::new(loom_bin())
        .args(["storage", "sql"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    insta::assert_snapshot!("storage_sql", text(&out.stdout));
    let out = Command::new(loom_bin())
        .args(["storage", "sql", "--role", "Bad-Role"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("role \"Bad-Role\" is not usable"));
}

#[test]
fn devis_on_the_schema_a_dba_applied_journals_what_jsonl_does() {
    let Some((_db, url, role)) =
        database("devis_on_the_schema_a_dba_applied_journals_what_jsonl_does")
    else {
        return;
    };
    let dir = devis_on_postgres(&role, "check");

    // Without the variable, then without the schema: refused (exit 2), naming what is missing.
    let out = run_in(dir.path(), None, &["validate"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!(
            "storage.events.dsn_env: the environment variable {DSN_ENV} is not set"
        )),
        "{}",
        text(&out.stderr)
    );
    let out = run_in(dir.path(), Some(&url), &["run", "devis", QUESTION]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("the PostgreSQL schema lacks events v1"),
        "{stderr}"
    );
    assert!(stderr.contains("loom storage sql"), "{stderr}");

    // The DBA prints the schema and applies it with psql.
    let sql = Command::new(devis_bin())
        .args(["storage", "sql", "--role", &role])
        .output()
        .unwrap();
    assert!(sql.status.success(), "{}", text(&sql.stderr));
    let applied = psql(&url, &["-f", "-"], Some(&text(&sql.stdout)));
    assert!(applied.status.success(), "{}", text(&applied.stderr));

    // A role the DSN's user cannot take is refused at start, naming the key.
    let wrong = devis_on_postgres("loom_not_granted", "check");
    let out = run_in(wrong.path(), Some(&url), &["validate"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("storage.events.role: cannot SET ROLE loom_not_granted"),
        "{}",
        text(&out.stderr)
    );

    run_devis(dir.path(), &url);
    let inspect = run_in(dir.path(), Some(&url), &["inspect", "devis-1", "--json"]);
    assert!(inspect.status.success(), "{}", text(&inspect.stderr));
    let json: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(json["status"], "completed");

    // The same events as the same run on the JSONL journal.
    let jsonl = copy_example("devis");
    run_devis(jsonl.path(), "unused");
    let on_postgres = exported(dir.path(), Some(&url));
    let on_jsonl = exported(jsonl.path(), None);
    assert_eq!(on_postgres.len(), 17);
    let strip = |events: &[Value]| events.iter().map(stable).collect::<Vec<_>>();
    assert_eq!(strip(&on_postgres), strip(&on_jsonl));

    // The rows are in the database, for the default tenant only.
    let out = psql(
        &url,
        &[
            "-At",
            "-c",
            "SELECT tenant_id, count(*) FROM loom_events GROUP BY tenant_id",
        ],
        None,
    );
    assert_eq!(text(&out.stdout).trim(), "default|17");

    // Erasing the session erases its rows, its files and its place in the index of sessions.
    let session = on_postgres[0]["session_id"].as_str().unwrap().to_owned();
    let file = psql(
        &url,
        &[
            "-c",
            &format!(
                "INSERT INTO loom_artifacts (tenant_id, session_id, uri, bytes) \
                 VALUES ('default', '{session}', 'artifact://default/{session}/{}.txt', 'x')",
                "a".repeat(64)
            ),
        ],
        None,
    );
    assert!(file.status.success(), "{}", text(&file.stderr));
    let out = run_in(
        dir.path(),
        Some(&url),
        &["sessions", "delete", &session, "--yes"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = psql(
        &url,
        &[
            "-At",
            "-c",
            "SELECT (SELECT count(*) FROM loom_events) + (SELECT count(*) FROM loom_sessions) \
             + (SELECT count(*) FROM loom_artifacts)",
        ],
        None,
    );
    assert_eq!(text(&out.stdout).trim(), "0");
}

#[test]
fn migrate_auto_applies_the_schema_at_start() {
    let Some((_db, url, role)) = database("migrate_auto_applies_the_schema_at_start") else {
        return;
    };
    let dir = devis_on_postgres(&role, "auto");
    run_devis(dir.path(), &url);
    let out = psql(
        &url,
        &[
            "-At",
            "-c",
            "SELECT string_agg(component || ' v' || version, ', ' ORDER BY component) FROM loom_schema",
        ],
        None,
    );
    assert_eq!(
        text(&out.stdout).trim(),
        "artifacts v1, events v1, events v2, idempotency v1"
    );
    // A second start finds it applied.
    let out = run_in(
        dir.path(),
        Some(&url),
        &["run", "devis", QUESTION, "--run-id", "devis-2"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}
