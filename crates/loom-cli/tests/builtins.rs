//! Built-in tools through the `loom` binary with the scripted fake model: `loom.sql` answers
//! an allowed query over a SQLite file and refuses a hostile one, the rule that refused it
//! visible in the journaled tool result.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;

use common::{journal, loom, text};
use serde_json::Value;
use sqlx::{Connection, Executor};

/// The journaled results of a run's tool calls, by call id: (is_error, text or JSON).
fn tool_results(events: &[Value]) -> Vec<(String, bool, String)> {
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

#[tokio::test]
async fn sql_answers_an_allowed_query_and_refuses_a_hostile_one() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("data")).unwrap();
    let db = dir.path().join("shop.db");
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&db)
        .create_if_missing(true);
    let mut conn = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    for statement in [
        "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, secret TEXT)",
        "INSERT INTO customers VALUES (1, 'Ada', 's1'), (2, 'Brune', 's2')",
    ] {
        conn.execute(statement).await.unwrap();
    }
    conn.close().await.unwrap();
    fs::write(
        dir.path().join("loom.yaml"),
        r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
        - tool_calls:
            - name: sql
              arguments: {query: "SELECT name FROM customers ORDER BY id"}
            - name: sql
              arguments: {query: "SELECT name FROM customers; -- \n DROP TABLE customers"}
            - name: sql
              arguments: {query: "SELECT secret FROM customers"}
        - text: "fini"
storage:
  events: {backend: jsonl, path: data}
agents:
  - name: base
    main: {model: fake-1}
    tools:
      - tool: loom.sql
        database: {backend: sqlite, path: shop.db}
        tables:
          - {name: customers, columns: [id, name]}
        max_rows: 10
        timeout: 5
"#,
    )
    .unwrap();
    let out = loom(dir.path(), &["run", "base", "clients ?", "--run-id", "q1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let results = tool_results(&journal(dir.path(), "q1"));
    let by_call = |id: &str| results.iter().find(|r| r.0 == id).unwrap();
    let (_, failed, answer) = by_call("fake_0_0");
    assert!(!failed, "{results:?}");
    let answer: Value = serde_json::from_str(answer).unwrap();
    assert_eq!(answer["rows"], serde_json::json!([["Ada"], ["Brune"]]));
    assert_eq!(answer["truncated"], false);
    let (_, failed, refusal) = by_call("fake_0_1");
    assert!(failed);
    assert!(
        refusal.contains("refused by rule 'sql-single-statement'"),
        "{refusal}"
    );
    let (_, failed, refusal) = by_call("fake_0_2");
    assert!(failed);
    assert!(
        refusal.contains("refused by rule 'sql-allowed-columns'"),
        "{refusal}"
    );
    // The table is still there, untouched.
    let mut conn = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    let count: (i64,) = sqlx::query_as("SELECT count(*) FROM customers")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(count.0, 2);
}

#[test]
fn sql_parameters_are_refused_where_they_are_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let write = |tool: &str| {
        fs::write(
            dir.path().join("loom.yaml"),
            format!(
                "version: 1\nmodels:\n  - id: fake-1\n    sdk: fake\n    model: FAKE\n\
                 agents:\n  - name: base\n    main: {{model: fake-1}}\n    tools:\n{tool}"
            ),
        )
        .unwrap();
    };
    for (tool, expected) in [
        (
            "      - tool: loom.sql\n        database: {backend: sqlite, path: absent.db}\n        tables: [{name: t}]\n",
            "agents[0].tools[0].database.path",
        ),
        (
            "      - tool: loom.sql\n        database: {backend: postgres}\n        tables: [{name: t}]\n",
            "backend postgres needs 'dsn_env'",
        ),
        (
            "      - tool: loom.current_datetime\n        max_rows: 3\n",
            "'max_rows' applies to loom.sql",
        ),
    ] {
        write(tool);
        let out = loom(dir.path(), &["validate"]);
        assert!(!out.status.success(), "{tool}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(expected), "{tool}: {stderr}");
    }
}
