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
    path::{Path, PathBuf},
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
fn devis_on_the_schema_a_dba_applied_journals_what_jsonl_and_sqlite_do() {
    let Some((_db, url, role)) =
        database("devis_on_the_schema_a_dba_applied_journals_what_jsonl_and_sqlite_do")
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

    // The same events as the same run on the JSONL and the SQLite journals.
    let jsonl = copy_example("devis");
    run_devis(jsonl.path(), "unused");
    let sqlite = copy_example("devis");
    let config = sqlite.path().join("loom.yaml");
    let yaml = fs::read_to_string(&config).unwrap();
    fs::write(
        &config,
        yaml.replace(
            "    backend: jsonl\n    path: data ",
            "    backend: sqlite\n    path: data/loom.db ",
        ),
    )
    .unwrap();
    run_devis(sqlite.path(), "unused");
    assert!(sqlite.path().join("data/loom.db").is_file());
    let on_postgres = exported(dir.path(), Some(&url));
    let on_jsonl = exported(jsonl.path(), None);
    let on_sqlite = exported(sqlite.path(), None);
    assert_eq!(on_postgres.len(), 17);
    let strip = |events: &[Value]| events.iter().map(stable).collect::<Vec<_>>();
    assert_eq!(strip(&on_postgres), strip(&on_jsonl));
    assert_eq!(strip(&on_sqlite), strip(&on_jsonl));

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
        "artifacts v1, events v1, events v2, events v3, idempotency v1"
    );
    // A second start finds it applied.
    let out = run_in(
        dir.path(),
        Some(&url),
        &["run", "devis", QUESTION, "--run-id", "devis-2"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Four `devis` processes run into one session at once: each run completes and the session
/// holds every event of the four runs once, seqs without gap.
#[test]
fn four_processes_write_one_session_at_once() {
    let Some((_db, url, role)) = database("four_processes_write_one_session_at_once") else {
        return;
    };
    let dir = devis_on_postgres(&role, "auto");
    // The schema applied before the race (each process would take the migration lock).
    let listed = run_in(dir.path(), Some(&url), &["sessions", "list"]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let children: Vec<_> = (1..=4)
        .map(|i| {
            let run_id = format!("p{i}");
            Command::new(devis_bin())
                .current_dir(dir.path())
                .env_remove("LOOM_PROFILE")
                .env_remove("LOOM_LOG")
                .env(DSN_ENV, &url)
                .args(["--config", "loom.yaml", "run", "devis", QUESTION])
                .args(["--session", "partagee", "--run-id", &run_id])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
        assert_eq!(stdout.trim(), ANSWER);
    }
    let events = exported(dir.path(), Some(&url));
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=events.len() as u64).collect::<Vec<u64>>(),
        "seqs without gap"
    );
    // Past 50 events, the run that closes last may add a session snapshot.
    let events: Vec<Value> = events
        .into_iter()
        .filter(|e| e["type"] != "session.snapshot")
        .collect();
    assert_eq!(events.len(), 4 * 17, "every event of the four runs, once");
    for i in 1..=4 {
        let run_id = format!("p{i}");
        let of_run: Vec<&Value> = events
            .iter()
            .filter(|e| e["run_id"] == run_id.as_str())
            .collect();
        assert_eq!(of_run.len(), 17, "{run_id}");
        assert_eq!(of_run[16]["type"], "run.completed", "{run_id}");
    }
}

// --- Two tenants on one server ----------------------------------------------------------------

const ACME_KEY: &str = "lk_pg_acme_0123456789abcdef";
const BETA_KEY: &str = "lk_pg_beta_0123456789abcdef";

fn key_hash(key: &str) -> String {
    use sha2::Digest;
    format!(
        "sha256:{}",
        hex::encode(sha2::Sha256::digest(key.as_bytes()))
    )
}

/// The devis project on the database with tenants `acme` and `beta`, a key with every scope
/// for each, and the MCP server mounted at `/mcp`.
fn two_tenants(role: &str) -> tempfile::TempDir {
    let dir = devis_on_postgres(role, "auto");
    let config = dir.path().join("loom.yaml");
    let mut yaml = fs::read_to_string(&config).unwrap();
    let scopes = "[run, read, read_content, approve, admin]";
    yaml.push_str(&format!(
        "\ntenants:\n  - id: acme\n  - id: beta\n\
         security:\n  api_keys:\n\
         \x20   - {{id: acme, hash: \"{}\", tenant: acme, scopes: {scopes}}}\n\
         \x20   - {{id: beta, hash: \"{}\", tenant: beta, scopes: {scopes}}}\n\
         server:\n  mcp: {{http: true}}\n",
        key_hash(ACME_KEY),
        key_hash(BETA_KEY)
    ));
    fs::write(&config, yaml).unwrap();
    dir
}

/// One request with `key`: the status and the body (JSON when it is).
fn call(address: &str, key: &str, method: &str, path: &str, body: &str) -> (u16, Value) {
    let (status, body) = server::request_with(
        address,
        method,
        path,
        &format!("Authorization: Bearer {key}\r\n"),
        body,
    );
    let json = serde_json::from_str(&body).unwrap_or(Value::String(body));
    (status, json)
}

fn run_body(session: &str, run: &str) -> String {
    serde_json::json!({"message": QUESTION, "session_id": session, "run_id": run}).to_string()
}

/// Two tenants served by one `loom serve` on one database: with one tenant's key, every REST
/// route and every MCP tool and resource sees nothing of the other's run, session and trace,
/// and can neither decide, cancel nor erase them; the same ids used by the other tenant land
/// in its own rows.
#[test]
fn one_tenants_key_sees_and_changes_nothing_of_another_through_rest_and_mcp() {
    let Some((_db, url, role)) = database("one_tenants_key_sees_and_changes_nothing") else {
        return;
    };
    let dir = two_tenants(&role);
    let served = server::Server::start_with(
        &devis_bin(),
        dir.path(),
        &["--config", "loom.yaml", "serve", "--port", "0"],
        &[(DSN_ENV, PathBuf::from(&url))],
    );
    let address = served.address.clone();
    let (status, result) = call(
        &address,
        ACME_KEY,
        "POST",
        "/v1/agents/devis/runs",
        &run_body("s-acme", "r-acme"),
    );
    assert_eq!(status, 201, "{result}");
    assert_eq!(result["status"], "completed");

    // Reads by id and by session: not found.
    for path in [
        "/v1/runs/r-acme?session_id=s-acme",
        "/v1/runs/r-acme/events?session_id=s-acme",
        "/v1/traces/r-acme?session_id=s-acme",
        "/v1/sessions/s-acme",
        "/v1/sessions/s-acme/events",
        "/v1/sessions/s-acme/files",
        "/v1/sessions/s-acme/report",
    ] {
        let (status, body) = call(&address, BETA_KEY, "GET", path, "");
        assert_eq!(status, 404, "{path}: {body}");
    }
    // Lists and searches: nothing of acme's.
    for path in [
        "/v1/runs",
        "/v1/sessions",
        "/v1/events?run_id=r-acme",
        "/v1/events?session_id=s-acme",
        "/v1/events?type=run.completed",
    ] {
        let (status, body) = call(&address, BETA_KEY, "GET", path, "");
        assert_eq!(status, 200, "{path}: {body}");
        let seen = body.to_string();
        assert!(
            !seen.contains("r-acme") && !seen.contains("s-acme"),
            "{path} shows acme's run: {body}"
        );
    }
    // Decisions, cancellation and erasure: not found.
    for path in [
        "/v1/runs/r-acme/approve",
        "/v1/runs/r-acme/reject",
        "/v1/runs/r-acme/cancel",
    ] {
        let (status, body) = call(&address, BETA_KEY, "POST", path, "{}");
        assert_eq!(status, 404, "{path}: {body}");
    }
    let (status, body) = call(&address, BETA_KEY, "DELETE", "/v1/sessions/s-acme", "");
    assert_eq!(status, 404, "{body}");

    // The MCP server, with beta's key: every tool and resource says not found.
    if python_has("mcp.client, httpx2, mcp_types", "pip install 'mcp>=2,<3'") {
        let seen = mcp_client(
            "http",
            serde_json::json!({
                "url": format!("http://{address}/mcp"),
                "key": BETA_KEY,
                "foreign": {"run_id": "r-acme", "session_id": "s-acme"},
            }),
        );
        let foreign = &seen["foreign"];
        for tool in ["run_status", "run_status_search", "run_report", "cancel"] {
            assert_eq!(foreign[tool]["is_error"], true, "{tool}: {}", foreign[tool]);
        }
        for resource in ["run", "run_events", "trace", "session", "session_events"] {
            let error = foreign[resource]["error"].as_str().unwrap_or_default();
            assert!(
                error.contains("not found"),
                "{resource}: {}",
                foreign[resource]
            );
        }
        let runs = foreign["runs"]["json"]["runs"].as_array().unwrap();
        assert!(runs.is_empty(), "{}", foreign["runs"]);
    }

    // Beta may use the same ids: its run lands in its own rows.
    let (status, result) = call(
        &address,
        BETA_KEY,
        "POST",
        "/v1/agents/devis/runs",
        &run_body("s-acme", "r-acme"),
    );
    assert_eq!(status, 201, "{result}");
    // Acme's run is untouched, and acme sees one session.
    let (status, run) = call(
        &address,
        ACME_KEY,
        "GET",
        "/v1/runs/r-acme?session_id=s-acme",
        "",
    );
    assert_eq!(status, 200, "{run}");
    assert_eq!(run["status"], "completed");
    let (_, events) = call(&address, ACME_KEY, "GET", "/v1/sessions/s-acme/events", "");
    assert_eq!(
        events.as_str().map_or(0, |ndjson| ndjson.lines().count()),
        17,
        "acme's session holds its run only: {events}"
    );
    let (_, log) = served.stop();
    assert!(!log.contains("panicked"), "{log}");

    // In the database: 17 rows each.
    let out = psql(
        &url,
        &[
            "-At",
            "-c",
            "SELECT tenant_id, count(*) FROM loom_events GROUP BY tenant_id ORDER BY 1",
        ],
        None,
    );
    assert_eq!(text(&out.stdout).trim(), "acme|17\nbeta|17");
}

// --- Encryption at rest on PostgreSQL ---------------------------------------------------------

/// Two keys (32 bytes, base64), as in `at_rest.rs`: bytes 0..31, and 32 times 9.
const KEY_A: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const KEY_B: &str = "CQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQk=";
/// The id of `KEY_A`: the first 12 hex digits of sha256("loom.key.v1" + key).
const ID_A: &str = "4ed42d1a2576";
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR plan de la cuisine";
const AMOUNT: &str = "1\u{202f}375 € TTC";

/// `devis` in `dir` on the database, with exactly the keys given.
fn sealed_devis(dir: &Path, url: &str, keys: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(devis_bin())
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .env_remove("JOURNAL_KEY")
        .env_remove("NEW_KEY")
        .env(DSN_ENV, url)
        .envs(keys.iter().copied())
        .args(["--config", "loom.yaml"])
        .args(args)
        .output()
        .unwrap()
}

fn success(out: &Output) -> String {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    stdout
}

/// Sets `storage.encryption.keys` of the project in `dir`.
fn set_encryption(dir: &Path, keys: &str) {
    let config = dir.join("loom.yaml");
    let yaml = fs::read_to_string(&config).unwrap();
    let yaml = match yaml.find("  encryption:") {
        Some(start) => {
            let end = start + yaml[start..].find('\n').unwrap() + 1;
            format!("{}{}", &yaml[..start], &yaml[end..])
        }
        None => yaml,
    };
    let yaml = yaml.replacen(
        "storage:\n",
        &format!("storage:\n  encryption: {{keys: [{keys}]}}\n"),
        1,
    );
    fs::write(config, yaml).unwrap();
}

/// One column of every row of `table`, as text (`bytea` escaped).
fn rows(url: &str, select: &str) -> String {
    let out = psql(url, &["-At", "-c", select], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

/// On PostgreSQL, a sealed run and its attached file hold nothing clear in any row and read
/// back through every command; a new first key seals what follows while the old one still
/// opens; without a tenant's key its sessions are refused (exit code 2, REST 424), never
/// garbage; `loom retention` erases an old sealed session without its key.
#[test]
fn a_sealed_journal_on_postgres_round_trips_rotates_is_shredded_and_expires() {
    let Some((_db, url, role)) = database("a_sealed_journal_on_postgres_round_trips") else {
        return;
    };
    let dir = devis_on_postgres(&role, "auto");
    set_encryption(dir.path(), "JOURNAL_KEY");
    fs::write(dir.path().join("plan.png"), PNG).unwrap();
    let key_a = [("JOURNAL_KEY", KEY_A)];
    let answer = success(&sealed_devis(
        dir.path(),
        &url,
        &key_a,
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
    let stored = rows(&url, "SELECT event FROM loom_events")
        + &rows(&url, "SELECT encode(bytes, 'escape') FROM loom_artifacts");
    for clear in [AMOUNT, "rénovation", "montant_ht", "plan de la cuisine"] {
        assert!(!stored.contains(clear), "'{clear}' is stored in clear");
    }
    assert!(stored.contains(ID_A), "sealed with the key's id");
    let inspect = success(&sealed_devis(
        dir.path(),
        &url,
        &key_a,
        &["inspect", "r-1", "--full"],
    ));
    assert!(inspect.contains(AMOUNT), "{inspect}");
    success(&sealed_devis(
        dir.path(),
        &url,
        &key_a,
        &["sessions", "files", "s-1", "--out", "out"],
    ));
    assert_eq!(fs::read(dir.path().join("out/plan.png")).unwrap(), PNG);

    // Rotation: the new key first seals what follows, the old one still opens.
    set_encryption(dir.path(), "NEW_KEY, JOURNAL_KEY");
    let both = [("NEW_KEY", KEY_B), ("JOURNAL_KEY", KEY_A)];
    success(&sealed_devis(
        dir.path(),
        &url,
        &both,
        &[
            "run",
            "devis",
            QUESTION,
            "--session",
            "s-2",
            "--run-id",
            "r-2",
        ],
    ));
    let ids = rows(
        &url,
        "SELECT DISTINCT session_id || ' ' || (event::jsonb -> 'payload' ->> 'key_id') \
         FROM loom_events ORDER BY 1",
    );
    let ids: Vec<&str> = ids.lines().collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(ids[0], format!("s-1 {ID_A}"));
    assert!(
        ids[1].starts_with("s-2 ") && !ids[1].ends_with(ID_A),
        "{ids:?}"
    );
    let old = success(&sealed_devis(
        dir.path(),
        &url,
        &both,
        &["inspect", "r-1", "--full"],
    ));
    assert!(old.contains(AMOUNT), "{old}");

    // The old key deleted: its sessions are refused, the new ones read on.
    let new_only = [("NEW_KEY", KEY_B)];
    let refused = sealed_devis(dir.path(), &url, &new_only, &["inspect", "r-1"]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    assert!(
        text(&refused.stderr).contains(&format!(
            "sealed journal: tenant 'default' has no key {ID_A}"
        )),
        "{}",
        text(&refused.stderr)
    );
    success(&sealed_devis(
        dir.path(),
        &url,
        &new_only,
        &["inspect", "r-2"],
    ));
    // A wrong value under the old name opens nothing either: refused, never garbage.
    let wrong = [("NEW_KEY", KEY_B), ("JOURNAL_KEY", KEY_B)];
    let refused = sealed_devis(dir.path(), &url, &wrong, &["inspect", "r-1", "--full"]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    assert!(
        text(&refused.stderr).contains(&format!("has no key {ID_A}")),
        "{}",
        text(&refused.stderr)
    );
    assert!(refused.stdout.is_empty(), "nothing printed of the session");
    let served = server::Server::start_with(
        &devis_bin(),
        dir.path(),
        &["--config", "loom.yaml", "serve", "--port", "0"],
        &[
            (DSN_ENV, PathBuf::from(&url)),
            ("NEW_KEY", PathBuf::from(KEY_B)),
        ],
    );
    let (status, body) = server::request(&served.address, "GET", "/v1/runs/r-1?session_id=s-1", "");
    assert_eq!(status, 424, "{body}");
    assert!(body.contains("missing_encryption_key"), "{body}");
    let (status, body) = server::request(&served.address, "GET", "/v1/runs/r-2?session_id=s-2", "");
    assert_eq!(status, 200, "{body}");
    drop(served);

    // Retention decides on the last write, never the content: the old sealed session goes
    // without its key.
    let config = dir.path().join("loom.yaml");
    let yaml = fs::read_to_string(&config).unwrap();
    fs::write(
        &config,
        yaml.replacen(
            "storage:\n",
            "storage:\n  retention: {events_days: 30}\n",
            1,
        ),
    )
    .unwrap();
    // s-1 made old: its events written in 2020 (the database's superuser rewrites them; the
    // application role has no UPDATE on the journal).
    let aged = psql(
        &url,
        &[
            "-c",
            "UPDATE loom_events SET event = replace(event, '\"ts\":\"2026-', '\"ts\":\"2020-'), \
             ts = ts - interval '6 years' WHERE session_id = 's-1'",
            "-c",
            "UPDATE loom_sessions SET updated_at = updated_at - interval '6 years' \
             WHERE session_id = 's-1'",
        ],
        None,
    );
    assert!(aged.status.success(), "{}", text(&aged.stderr));
    let swept = success(&sealed_devis(
        dir.path(),
        &url,
        &new_only,
        &["retention", "--yes"],
    ));
    assert!(swept.contains("1 session(s) erased, 1 kept."), "{swept}");
    assert_eq!(
        rows(
            &url,
            "SELECT DISTINCT session_id FROM loom_events ORDER BY 1"
        )
        .trim(),
        "s-2"
    );
    assert_eq!(
        rows(&url, "SELECT count(*) FROM loom_artifacts").trim(),
        "0",
        "the sealed file went with its session"
    );
}
