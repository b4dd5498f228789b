//! `sql` against a real SQLite file and a real PostgreSQL database (a fresh one per test, on
//! `LOOM_TEST_POSTGRES`): allowed queries answered as JSON rows with their row limit, hostile
//! ones refused by their rule, and the read-only connection refusing writes on its own, as if
//! the guard had been bypassed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::ctx;

use loom_builtins::{
    ReadOnlyDatabase, SqlDatabase, SqlError, SqlOptions, SqlTable, refusal_rule, rules, sql,
};
use loom_core::tool::{Tool, ToolError};
use loom_testkit::postgres::TestDb;
use serde_json::{Value, json};
use sqlx::{Connection, Executor};

const SETUP: &[&str] = &[
    "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT, secret TEXT)",
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, total REAL)",
    "CREATE TABLE audit (id INTEGER PRIMARY KEY, note TEXT)",
    "INSERT INTO customers VALUES (1, 'Ada', 'Lyon', 's1'), (2, 'Brune', 'Paris', 's2'), \
     (3, 'Cyril', 'Lyon', 's3')",
    "INSERT INTO orders VALUES (1, 1, 10.5), (2, 1, 20.0), (3, 2, 7.25)",
    "INSERT INTO audit VALUES (1, 'hidden')",
];

fn tables() -> Vec<SqlTable> {
    vec![
        SqlTable::with_columns("customers", ["id", "name", "city"]),
        SqlTable::all_columns("orders"),
    ]
}

/// A SQLite file with the fixture tables, in a directory kept alive by the caller.
async fn sqlite_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shop.db");
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true);
    let mut conn = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    for statement in SETUP {
        conn.execute(*statement).await.unwrap();
    }
    conn.close().await.unwrap();
    (dir, path)
}

/// A fresh PostgreSQL database with the fixture tables, `None` when the test is skipped.
async fn postgres_db(test: &str) -> Option<TestDb> {
    let db = TestDb::create(test)?;
    let mut conn = sqlx::PgConnection::connect(&db.url()).await.unwrap();
    for statement in SETUP {
        conn.execute(*statement).await.unwrap();
    }
    conn.close().await.unwrap();
    Some(db)
}

async fn call(tool: &dyn Tool, query: &str) -> Result<Value, ToolError> {
    let output = tool.call(ctx(), json!({ "query": query })).await?;
    Ok(output.data.expect("sql returns JSON"))
}

async fn answers_and_refuses(database: SqlDatabase) {
    let mut options = SqlOptions::new(database, tables());
    options.max_rows = 2;
    let tool = sql(options).unwrap();

    let result = call(
        &tool,
        "SELECT c.name, sum(o.total) AS spent FROM customers c \
         JOIN orders o ON o.customer_id = c.id GROUP BY c.name ORDER BY c.name",
    )
    .await
    .unwrap();
    assert_eq!(result["columns"], json!(["name", "spent"]));
    assert_eq!(result["rows"], json!([["Ada", 30.5], ["Brune", 7.25]]));
    assert_eq!(result["truncated"], json!(false));

    // Three rows, two allowed: cut and said so.
    let result = call(&tool, "SELECT id, name FROM customers ORDER BY id")
        .await
        .unwrap();
    assert_eq!(result["rows"], json!([[1, "Ada"], [2, "Brune"]]));
    assert_eq!(result["row_count"], json!(2));
    assert_eq!(result["truncated"], json!(true));

    // No row still names the columns.
    let result = call(&tool, "SELECT id, city FROM customers WHERE id > 99")
        .await
        .unwrap();
    assert_eq!(result["columns"], json!(["id", "city"]));
    assert_eq!(result["rows"], json!([]));

    for (query, rule) in [
        ("SELECT secret FROM customers", rules::SQL_ALLOWED_COLUMNS),
        ("SELECT * FROM customers", rules::SQL_ALLOWED_COLUMNS),
        ("SELECT note FROM audit", rules::SQL_ALLOWED_TABLES),
        ("DELETE FROM orders", rules::SQL_READ_ONLY),
        ("SELECT 1; DROP TABLE orders", rules::SQL_SINGLE_STATEMENT),
    ] {
        let error = call(&tool, query).await.unwrap_err();
        assert_eq!(
            refusal_rule(&error),
            Some(rule),
            "{query}: {}",
            error.message
        );
    }
    // Nothing was written.
    let result = call(&tool, "SELECT count(*) AS n FROM orders")
        .await
        .unwrap();
    assert_eq!(result["rows"], json!([[3]]));
}

/// Runs `write` on the connection alone (no guard) and checks the database refused it as a
/// write (`expected` in its message) and that nothing changed.
async fn connection_refuses(database: SqlDatabase, write: &str, expected: &str) {
    let db = ReadOnlyDatabase::new(&database, Duration::from_secs(5)).unwrap();
    let error = db.fetch(write, 10).await.unwrap_err();
    assert!(matches!(error, SqlError::Database(_)), "{write}: {error}");
    assert!(error.to_string().contains(expected), "{write}: {error}");
    let rows = db.fetch("SELECT count(*) FROM orders", 10).await.unwrap();
    assert_eq!(rows.rows, vec![vec![json!(3)]]);
}

#[tokio::test]
async fn sqlite_answers_allowed_queries_and_refuses_hostile_ones() {
    let (_dir, path) = sqlite_file().await;
    answers_and_refuses(SqlDatabase::Sqlite(path)).await;
}

#[tokio::test]
async fn sqlite_connection_is_read_only_without_the_guard() {
    let (_dir, path) = sqlite_file().await;
    // The raw connection runs what it is given, several statements included: the write
    // hidden between two reads is refused by the read-only file itself.
    connection_refuses(
        SqlDatabase::Sqlite(path),
        "SELECT 1) ; DELETE FROM orders; SELECT * FROM (SELECT 1",
        "readonly",
    )
    .await;
}

#[tokio::test]
async fn sqlite_missing_file_is_an_error_and_never_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.db");
    let tool = sql(SqlOptions::new(SqlDatabase::Sqlite(path.clone()), tables())).unwrap();
    let error = call(&tool, "SELECT id FROM orders").await.unwrap_err();
    assert_eq!(refusal_rule(&error), None);
    assert!(!path.exists());
}

#[tokio::test]
async fn sqlite_long_query_is_stopped_at_its_time_limit() {
    let (_dir, path) = sqlite_file().await;
    let mut options = SqlOptions::new(SqlDatabase::Sqlite(path), tables());
    options.timeout = Duration::from_millis(200);
    let tool = sql(options).unwrap();
    let error = call(
        &tool,
        "WITH RECURSIVE n(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM n) \
         SELECT count(*) FROM n",
    )
    .await
    .unwrap_err();
    assert!(
        error.message.contains("ran longer than"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn postgres_answers_allowed_queries_and_refuses_hostile_ones() {
    let Some(db) = postgres_db("postgres_answers_allowed_queries_and_refuses_hostile_ones").await
    else {
        return;
    };
    answers_and_refuses(SqlDatabase::Postgres(db.url())).await;
    // pg_sleep and catalogs never reach the server.
    let tool = sql(SqlOptions::new(SqlDatabase::Postgres(db.url()), tables())).unwrap();
    for (query, rule) in [
        ("SELECT pg_sleep(30)", rules::SQL_ALLOWED_FUNCTIONS),
        (
            "SELECT usename FROM pg_catalog.pg_user",
            rules::SQL_SYSTEM_CATALOG,
        ),
        (
            "WITH gone AS (DELETE FROM orders RETURNING *) SELECT * FROM gone",
            rules::SQL_READ_ONLY,
        ),
    ] {
        let error = call(&tool, query).await.unwrap_err();
        assert_eq!(refusal_rule(&error), Some(rule), "{query}");
    }
}

#[tokio::test]
async fn postgres_connection_is_read_only_without_the_guard() {
    let Some(db) = postgres_db("postgres_connection_is_read_only_without_the_guard").await else {
        return;
    };
    // As the server's superuser: only the read-only session and transaction stop the write
    // (a sequence advanced by a SELECT).
    let mut conn = sqlx::PgConnection::connect(&db.url()).await.unwrap();
    conn.execute("CREATE SEQUENCE ticket").await.unwrap();
    conn.close().await.unwrap();
    connection_refuses(
        SqlDatabase::Postgres(db.url()),
        "SELECT nextval('ticket')",
        "read-only transaction",
    )
    .await;
    // A sleep past the time limit is cancelled by statement_timeout.
    let slow = ReadOnlyDatabase::new(&SqlDatabase::Postgres(db.url()), Duration::from_millis(300))
        .unwrap();
    let error = slow.fetch("SELECT pg_sleep(5)", 1).await.unwrap_err();
    assert!(matches!(error, SqlError::Timeout(_)), "{error}");
}
