//! Built-in tools through the `loom` binary with the scripted fake model: `loom.sql` answers
//! an allowed query over a SQLite file and refuses a hostile one, the rule that refused it
//! visible in the journaled tool result; `loom.excel` lists, reads and writes a copy of a
//! workbook and refuses a path outside its folders; the `factures` example reads a workbook,
//! computes in its sandbox and answers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;

use common::{copy_example, journal, loom, repo, text, tool_results};
use serde_json::Value;
use sqlx::{Connection, Executor};

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

#[test]
fn excel_reads_a_workbook_writes_a_copy_and_refuses_a_path_outside() {
    let dir = tempfile::tempdir().unwrap();
    for sub in ["classeurs", "sorties"] {
        fs::create_dir_all(dir.path().join(sub)).unwrap();
    }
    let workbook = repo().join("examples/factures/classeurs/factures.xlsx");
    fs::copy(&workbook, dir.path().join("classeurs/factures.xlsx")).unwrap();
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
            - name: excel
              arguments: {op: sheets, folder: compta, path: factures.xlsx}
            - name: excel
              arguments: {op: read, folder: compta, path: factures.xlsx, range: "A2:F3"}
            - name: excel
              arguments: {op: read, folder: compta, path: ../loom.yaml}
            - name: excel
              arguments: {op: read, folder: compta, path: factures.xlsx, range: "A1:B"}
        - tool_calls:
            - name: excel
              arguments:
                op: write
                folder: compta
                path: factures.xlsx
                output_folder: sorties
                output_path: factures-total.xlsx
                cells:
                  - {cell: D9, value: Total}
                  - {cell: E9, formula: "=SUM(E2:E8)"}
        - tool_calls:
            - name: excel
              arguments: {op: read, folder: sorties, path: factures-total.xlsx, range: "D9:E9"}
        - text: "fini"
storage:
  events: {backend: jsonl, path: data}
agents:
  - name: base
    main: {model: fake-1}
    tools:
      - tool: loom.excel
        folders:
          - {name: compta, path: classeurs, rights: [read]}
          - {name: sorties, path: sorties, rights: [read, write]}
"#,
    )
    .unwrap();
    let out = loom(dir.path(), &["run", "base", "factures ?", "--run-id", "x1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = journal(dir.path(), "x1");
    let results = tool_results(&events);
    let by_call = |id: &str| results.iter().find(|r| r.0 == id).unwrap();
    let json = |id: &str| -> Value {
        let (_, failed, text) = by_call(id);
        assert!(!failed, "{id}: {text}");
        serde_json::from_str(text).unwrap()
    };
    assert_eq!(json("fake_0_0")["sheets"][0]["name"], "Factures");
    assert_eq!(json("fake_0_0")["sheets"][0]["range"], "A1:F8");
    let read = json("fake_0_1");
    assert_eq!(
        read["rows"],
        serde_json::json!([
            [
                "F-2026-001",
                "Boulangerie Martin",
                "2026-01-05",
                "2026-02-04",
                1250.0,
                true
            ],
            [
                "F-2026-002",
                "Garage Dupont",
                "2026-01-12",
                "2026-02-11",
                3480.0,
                false
            ],
        ])
    );
    let (_, failed, refusal) = by_call("fake_0_2");
    assert!(failed);
    assert!(refusal.contains("refused by rule 'no-parent'"), "{refusal}");
    let (_, failed, error) = by_call("fake_0_3");
    assert!(failed);
    assert!(error.contains("'range' is 'A1:B'"), "{error}");
    let written = json("fake_1_0");
    assert_eq!(written["path"], "factures-total.xlsx");
    assert_eq!(written["recalculated"], false);
    let copy = json("fake_2_0");
    assert_eq!(copy["rows"], serde_json::json!([["Total", null]]));
    assert_eq!(copy["formulas"], serde_json::json!({"E9": "=SUM(E2:E8)"}));
    // The source is untouched; the reads declared no side effect, the tool reversible ones
    // (it may write a copy).
    assert_eq!(
        fs::read(dir.path().join("classeurs/factures.xlsx")).unwrap(),
        fs::read(&workbook).unwrap()
    );
    let kinds: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "tool.called")
        .map(|e| e["payload"]["tool_kind"].as_str().unwrap())
        .collect();
    assert!(kinds.iter().all(|kind| *kind == "builtin"), "{kinds:?}");
}

#[test]
fn excel_parameters_are_refused_where_they_are_wrong() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("classeurs")).unwrap();
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
            "      - tool: loom.excel\n",
            "agents[0].tools[0].tool: loom.excel needs 'folders' (at least one)",
        ),
        (
            "      - tool: loom.excel\n        folders: [{name: c, path: classeurs, rights: [read]}]\n        recalc: true\n",
            "agents[0].tools[0].recalc: unknown key 'recalc'",
        ),
        (
            "      - tool: loom.excel\n        folders: [{name: c, path: classeurs, rights: [read, delete]}]\n",
            "agents[0].tools[0].folders[0].rights[1]: loom.excel never deletes a file",
        ),
        (
            "      - tool: loom.excel\n        folders: [{name: c, path: absents, rights: [read]}]\n",
            "agents[0].tools[0].folders[0].path",
        ),
        (
            "      - tool: loom.current_datetime\n        folders: [{name: c, path: classeurs, rights: [read]}]\n",
            "'folders' applies to loom.local_files and loom.excel",
        ),
    ] {
        write(tool);
        let out = loom(dir.path(), &["validate"]);
        assert!(!out.status.success(), "{tool}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(expected), "{tool}: {stderr}");
    }
}

/// The `factures` example, on the stock binary: the workbook read by `loom.excel`, its rows
/// handed to the sandbox, the total computed there by Python, and the answer printed.
#[test]
fn the_factures_example_reads_a_workbook_computes_in_the_sandbox_and_answers() {
    if !loom_testkit::services::namespaces("the_factures_example") {
        return;
    }
    let dir = copy_example("factures");
    let out = loom(
        dir.path(),
        &[
            "run",
            "recouvrement",
            "Quel est le total des factures impayées ?",
            "--run-id",
            "f1",
        ],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("4 factures impayées, total 12 316,00 € TTC :"),
        "{stdout}"
    );
    assert!(
        stdout.contains("- F-2026-002 Garage Dupont : 3 480,00 € (échéance 2026-02-11)"),
        "{stdout}"
    );
    let events = journal(dir.path(), "f1");
    let called: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "tool.called")
        .map(|e| e["payload"]["tool_name"].as_str().unwrap())
        .collect();
    assert_eq!(
        called,
        [
            "excel",
            "sandbox__write",
            "sandbox__write",
            "sandbox__exec",
            "sandbox__read"
        ]
    );
    let results = tool_results(&events);
    let exec = events
        .iter()
        .find(|e| e["type"] == "tool.completed" && e["payload"]["call_id"] == "fake_2_0")
        .unwrap();
    assert_eq!(exec["payload"]["output"]["data"]["exit_code"], 0, "{exec}");
    assert_eq!(
        exec["payload"]["output"]["data"]["command"],
        "python3 impayees.py > reponse.txt"
    );
    // What the sandbox computed over is what the workbook holds: the rows read by the tool.
    let (_, failed, read) = results.iter().find(|r| r.0 == "fake_0_0").unwrap();
    assert!(!failed, "{read}");
    assert!(read.contains("\"Hôtel du Parc\""), "{read}");
}
