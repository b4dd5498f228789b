//! `loom.sql` against hostile queries through the `loom` binary: the scripted fake model calls
//! the tool once per query, each refusal journaled in its `tool.completed` result names the
//! exact rule of the SQL guard that refused it (the rules each query gets in each dialect are
//! those of `loom-builtins/src/sql/guard/tests.rs`), one allowed query answers cut to
//! `max_rows`, and the database is intact afterwards (every table there, every row count the
//! same, nothing attached, copied or advanced).
//!
//! On SQLite always; on PostgreSQL in a fresh database per test (`loom_testkit::postgres`) on
//! the server `LOOM_TEST_POSTGRES` names, skipped without it (failed under
//! `LOOM_REQUIRE_SERVICES=1`); the tool reads its DSN through `dsn_env`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{fs, path::Path};

use common::{journal, loom_bin, run_in_env, text, tool_results};
use loom_testkit::postgres::TestDb;
use serde_json::{Value, json};
use sqlx::{Connection, Executor};

/// The fixture: `customers` allows `id, name, city` (not `secret`), `orders` allows every
/// column and has more rows than [`MAX_ROWS`], `audit` exists but is not declared, and the
/// sequence `ticket` (PostgreSQL only) must never advance.
const SETUP: &[&str] = &[
    "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT, secret TEXT)",
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, total REAL)",
    "CREATE TABLE audit (id INTEGER PRIMARY KEY, note TEXT)",
    "INSERT INTO customers VALUES (1, 'Ada', 'Lyon', 's1'), (2, 'Brune', 'Paris', 's2'), \
     (3, 'Cyril', 'Lyon', 's3')",
    "INSERT INTO orders VALUES (1, 1, 10.5), (2, 1, 20.0), (3, 2, 7.25), (4, 3, 3.0), \
     (5, 3, 1.0)",
    "INSERT INTO audit VALUES (1, 'hidden')",
];

/// Row counts of `customers`, `orders` and `audit` after [`SETUP`], by [`COUNT_QUERIES`].
const COUNTS: [i64; 3] = [3, 5, 1];
const COUNT_QUERIES: [&str; 3] = [
    "SELECT count(*) FROM customers",
    "SELECT count(*) FROM orders",
    "SELECT count(*) FROM audit",
];

/// The tool's row limit, under the 5 rows of `orders`.
const MAX_ROWS: usize = 3;

/// The allowed query, first call of every run: 5 rows, [`MAX_ROWS`] returned.
const ALLOWED: &str = "SELECT id, customer_id FROM orders ORDER BY id";

/// The variable the PostgreSQL configuration names in `dsn_env`.
const DSN_ENV: &str = "LOOM_E2E_SQL_DSN";

/// Hostile queries refused by the same rule in both dialects.
const HOSTILE: &[(&str, &str)] = &[
    // Writes.
    ("INSERT INTO orders (id) VALUES (99)", "sql-read-only"),
    ("UPDATE orders SET total = 0", "sql-read-only"),
    ("DELETE FROM orders", "sql-read-only"),
    ("DROP TABLE orders", "sql-read-only"),
    // Several statements, one hidden after a comment line, one behind `/* ; */`.
    ("SELECT 1; DROP TABLE orders", "sql-single-statement"),
    ("SELECT 1; -- \n DROP TABLE orders", "sql-single-statement"),
    (
        "SELECT 1 /* ; */; /* x */ DELETE FROM orders",
        "sql-single-statement",
    ),
    // CTE tricks.
    (
        "WITH gone AS (DELETE FROM orders RETURNING *) SELECT * FROM gone",
        "sql-read-only",
    ),
    (
        "WITH customers AS (SELECT 1 AS id) SELECT * FROM customers",
        "sql-allowed-tables",
    ),
    // Undeclared tables in a subquery and a UNION.
    (
        "SELECT id FROM orders WHERE id IN (SELECT id FROM audit)",
        "sql-allowed-tables",
    ),
    (
        "SELECT id FROM orders UNION SELECT id FROM audit",
        "sql-allowed-tables",
    ),
    // Forbidden columns, by name and through `*`.
    ("SELECT secret FROM customers", "sql-allowed-columns"),
    ("SELECT * FROM customers", "sql-allowed-columns"),
    ("SELECT c.* FROM customers c", "sql-allowed-columns"),
    // A PostgreSQL catalog, refused on SQLite too.
    (
        "SELECT * FROM information_schema.tables",
        "sql-system-catalog",
    ),
];

/// Hostile queries of SQLite.
const HOSTILE_SQLITE: &[(&str, &str)] = &[
    ("ATTACH DATABASE 'attached.db' AS x", "sql-read-only"),
    ("PRAGMA query_only = 0", "sql-read-only"),
    (
        "SELECT load_extension('/tmp/evil.so')",
        "sql-allowed-functions",
    ),
    ("SELECT randomblob(1000000000)", "sql-allowed-functions"),
    ("SELECT * FROM sqlite_master", "sql-system-catalog"),
];

/// The file the hostile `COPY` of [`HOSTILE_POSTGRES`] names.
const COPY_TARGET: &str = "/tmp/loom_e2e_sql_copy_never_written";

/// Hostile queries of PostgreSQL.
const HOSTILE_POSTGRES: &[(&str, &str)] = &[
    ("SET default_transaction_read_only = off", "sql-read-only"),
    (
        "COPY orders TO '/tmp/loom_e2e_sql_copy_never_written'",
        "sql-read-only",
    ),
    ("SELECT pg_sleep(30)", "sql-allowed-functions"),
    (
        "SELECT pg_read_file('/etc/passwd')",
        "sql-allowed-functions",
    ),
    (
        "SELECT set_config('default_transaction_read_only', 'off', false)",
        "sql-allowed-functions",
    ),
    ("SELECT nextval('ticket')", "sql-allowed-functions"),
    ("SELECT * FROM pg_catalog.pg_tables", "sql-system-catalog"),
];

/// Writes the project in `dir`: the fake model calls `sql` once per query, all in its first
/// turn (call ids `fake_0_<index>`), then answers `fini`.
fn write_project(dir: &Path, database: &str, queries: &[&str]) {
    fs::create_dir_all(dir.join("data")).unwrap();
    let calls: Vec<Value> = queries
        .iter()
        .map(|query| json!({"name": "sql", "arguments": {"query": query}}))
        .collect();
    // JSON is YAML: the queries keep their quotes, comments and newlines as they are.
    let calls = serde_json::to_string(&calls).unwrap();
    let yaml = format!(
        r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
        - tool_calls: {calls}
        - text: "fini"
storage:
  events: {{backend: jsonl, path: data}}
agents:
  - name: base
    main: {{model: fake-1}}
    tools:
      - tool: loom.sql
        database: {database}
        tables:
          - {{name: customers, columns: [id, name, city]}}
          - {{name: orders}}
        max_rows: {MAX_ROWS}
        timeout: 5
"#
    );
    fs::write(dir.join("loom.yaml"), yaml).unwrap();
}

/// The rule a refusal names (`refused by rule '<rule>': …`).
fn refused_by(refusal: &str) -> Option<&str> {
    let (_, rest) = refusal.split_once("refused by rule '")?;
    rest.split_once('\'').map(|(rule, _)| rule)
}

/// Runs the project in `dir` (with `env`) on [`ALLOWED`] then every hostile query, and checks
/// the journal: the allowed query answered with the row limit applied, each hostile one
/// refused by exactly its rule.
fn run_and_check(dir: &Path, env: &[(&str, &str)], database: &str, hostile: &[(&str, &str)]) {
    let queries: Vec<&str> = std::iter::once(ALLOWED)
        .chain(hostile.iter().map(|(query, _)| *query))
        .collect();
    write_project(dir, database, &queries);
    let out = run_in_env(
        &loom_bin(),
        dir,
        &["run", "base", "hostile queries", "--run-id", "h1"],
        env,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let results = tool_results(&journal(dir, "h1"));
    assert_eq!(results.len(), queries.len(), "{results:#?}");
    let by_call = |index: usize| {
        let id = format!("fake_0_{index}");
        results
            .iter()
            .find(|r| r.0 == id)
            .unwrap_or_else(|| panic!("no result for {id}: {results:#?}"))
    };

    let (_, failed, answer) = by_call(0);
    assert!(!failed, "{ALLOWED}: {answer}");
    let answer: Value = serde_json::from_str(answer).unwrap();
    assert_eq!(answer["columns"], json!(["id", "customer_id"]));
    assert_eq!(answer["rows"], json!([[1, 1], [2, 1], [3, 2]]));
    assert_eq!(answer["row_count"], json!(MAX_ROWS));
    assert_eq!(answer["truncated"], json!(true));

    let mut wrong = Vec::new();
    for (index, (query, expected)) in hostile.iter().enumerate() {
        let (_, failed, refusal) = by_call(index + 1);
        if !failed || refused_by(refusal) != Some(*expected) {
            wrong.push(format!(
                "{query:?}: expected {expected}, got (is_error {failed}) {refusal}"
            ));
        }
    }
    assert!(wrong.is_empty(), "refused wrongly:\n{}", wrong.join("\n"));
}

#[tokio::test]
async fn sqlite_refuses_hostile_queries_through_the_binary_by_their_rule() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shop.db");
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&db)
        .create_if_missing(true);
    let mut conn = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    for statement in SETUP {
        conn.execute(*statement).await.unwrap();
    }
    conn.close().await.unwrap();

    let hostile = [HOSTILE, HOSTILE_SQLITE].concat();
    run_and_check(
        dir.path(),
        &[],
        "{backend: sqlite, path: shop.db}",
        &hostile,
    );

    // Intact: every table there with its rows, nothing attached.
    let mut conn = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    let mut counts = Vec::new();
    for sql in COUNT_QUERIES {
        let (count,): (i64,) = sqlx::query_as(sql).fetch_one(&mut conn).await.unwrap();
        counts.push(count);
    }
    assert_eq!(counts, COUNTS);
    let (secrets,): (String,) = sqlx::query_as(
        "SELECT group_concat(secret, ',') FROM (SELECT secret FROM customers ORDER BY id)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(secrets, "s1,s2,s3");
    conn.close().await.unwrap();
    assert!(!dir.path().join("attached.db").exists());
}

#[tokio::test]
async fn postgres_refuses_hostile_queries_through_the_binary_by_their_rule() {
    let test = "postgres_refuses_hostile_queries_through_the_binary_by_their_rule";
    // A fresh database of its own: no other test sees these tables.
    let Some(db) = TestDb::create(test) else {
        return;
    };
    let url = db.url();
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    for statement in SETUP.iter().chain(&["CREATE SEQUENCE ticket"]) {
        conn.execute(*statement).await.unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let hostile = [HOSTILE, HOSTILE_POSTGRES].concat();
    run_and_check(
        dir.path(),
        &[(DSN_ENV, url.as_str())],
        &format!("{{backend: postgres, dsn_env: {DSN_ENV}}}"),
        &hostile,
    );

    // Intact: every table there with its rows, the sequence never advanced.
    let mut counts = Vec::new();
    for sql in COUNT_QUERIES {
        let (count,): (i64,) = sqlx::query_as(sql).fetch_one(&mut conn).await.unwrap();
        counts.push(count);
    }
    assert_eq!(counts, COUNTS);
    let (called,): (bool,) = sqlx::query_as("SELECT is_called FROM ticket")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(!called, "the sequence advanced");
    conn.close().await.unwrap();
    assert!(!Path::new(COPY_TARGET).exists(), "COPY wrote {COPY_TARGET}");
}
