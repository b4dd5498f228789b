//! `sql`: one read-only `SELECT` over declared tables and columns of a SQLite file or a
//! PostgreSQL database, checked by the guard before it runs, and run on a read-only
//! connection.
//!
//! Two barriers, each enough to stop a write on its own:
//!
//! 1. the guard ([`SqlGuard`], `guard.rs`): the model's SQL is parsed and refused unless it is
//!    one `SELECT` over the declared tables and columns, calling allowed functions only; what
//!    runs is the checked syntax tree rendered back, never the model's text;
//! 2. the connection ([`ReadOnlyDatabase`], `backend.rs`): a read-only SQLite file with
//!    `query_only`, or a PostgreSQL session and transaction that are read-only, each with a
//!    time limit.
//!
//! A query gets a row limit: it is wrapped as `SELECT * FROM (<query>) LIMIT <max_rows + 1>`,
//! and the extra row only tells that the result was cut (`truncated`).

mod backend;
mod guard;

use std::{sync::Arc, time::Duration};

use loom_core::{
    BoxFuture,
    tool::{FnTool, SideEffects, ToolDeclarations, ToolError, ToolKind, ToolOutput, ToolSpec},
};
use serde::Deserialize;
use serde_json::json;

pub use backend::{ReadOnlyDatabase, SqlDatabase, SqlError, SqlRows};
pub use guard::{GuardedQuery, Parsed, SqlDialect, SqlGuard, SqlTable};

use crate::BuiltinError;

/// The most rows a query returns when the configuration does not say.
pub const DEFAULT_MAX_ROWS: usize = 100;
/// The longest a query runs when the configuration does not say.
pub const DEFAULT_SQL_TIMEOUT: Duration = Duration::from_secs(10);

/// What the `sql` tool is built from.
#[derive(Debug, Clone)]
pub struct SqlOptions {
    /// Where it reads.
    pub database: SqlDatabase,
    /// The tables it may read, with their allowed columns.
    pub tables: Vec<SqlTable>,
    /// The most rows a query returns.
    pub max_rows: usize,
    /// The longest a query runs.
    pub timeout: Duration,
}

impl SqlOptions {
    /// Options over `database` and `tables`, with the default row limit and time limit.
    pub fn new(database: SqlDatabase, tables: Vec<SqlTable>) -> SqlOptions {
        SqlOptions {
            database,
            tables,
            max_rows: DEFAULT_MAX_ROWS,
            timeout: DEFAULT_SQL_TIMEOUT,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    query: String,
}

/// The guard and the connection, shared by every call.
#[derive(Debug)]
struct Sql {
    guard: SqlGuard,
    database: ReadOnlyDatabase,
    max_rows: usize,
}

impl Sql {
    /// Checks `text` with the guard, reading the real columns of the restricted tables it
    /// reads, then runs it.
    async fn call(&self, text: &str) -> Result<ToolOutput, ToolError> {
        let parsed = self.guard.parse(text).inspect_err(refused)?;
        let schema = self
            .database
            .schema(&parsed.restricted_tables())
            .await
            .map_err(failed)?;
        let guarded = parsed.check_columns(&schema).inspect_err(refused)?;
        tracing::debug!(sql = %guarded.sql, "loom.sql query");
        let rows = self
            .database
            .fetch(&guarded.sql, self.max_rows)
            .await
            .map_err(failed)?;
        Ok(ToolOutput::json(rows.to_json()))
    }
}

fn refused(error: &ToolError) {
    tracing::info!(rule = ?error.rule, error = %error.message, "loom.sql refused a query");
}

fn failed(error: SqlError) -> ToolError {
    tracing::info!(%error, "loom.sql query failed");
    ToolError::new(error.to_string())
}

/// The `sql` tool: `{query}` is one `SELECT`; the result is `{columns, rows, row_count,
/// truncated}`. Declared side effects: none (idempotent).
///
/// # Errors
/// No table, a table declared twice, an empty column list, a row limit of 0, a DSN that does
/// not parse.
pub fn sql(options: SqlOptions) -> Result<FnTool, BuiltinError> {
    if options.tables.is_empty() {
        return Err(BuiltinError::Sql("declare at least one table".to_owned()));
    }
    for (index, table) in options.tables.iter().enumerate() {
        if options.tables[..index].iter().any(|t| t.name == table.name) {
            return Err(BuiltinError::Sql(format!(
                "the table '{}' is declared twice",
                table.name
            )));
        }
        if table.columns.as_ref().is_some_and(Vec::is_empty) {
            return Err(BuiltinError::Sql(format!(
                "the table '{}' has an empty column list; omit 'columns' to allow them all",
                table.name
            )));
        }
    }
    if options.max_rows == 0 {
        return Err(BuiltinError::Sql("max_rows must be at least 1".to_owned()));
    }
    let database = ReadOnlyDatabase::new(&options.database, options.timeout)
        .map_err(|error| BuiltinError::Sql(error.to_string()))?;
    let spec = spec(&options, database.dialect());
    let sql = Arc::new(Sql {
        guard: SqlGuard::new(database.dialect(), &options.tables),
        database,
        max_rows: options.max_rows,
    });
    Ok(FnTool::new(spec, move |_ctx, arguments| {
        let sql = sql.clone();
        Box::pin(async move {
            let args: Args = serde_json::from_value(arguments)
                .map_err(|error| ToolError::new(format!("invalid arguments: {error}")))?;
            sql.call(&args.query).await
        }) as BoxFuture<'static, _>
    }))
}

fn spec(options: &SqlOptions, dialect: SqlDialect) -> ToolSpec {
    let tables: Vec<String> = options
        .tables
        .iter()
        .map(|table| match &table.columns {
            Some(columns) => format!("{} ({})", table.name, columns.join(", ")),
            None => format!("{} (all columns)", table.name),
        })
        .collect();
    let engine = match dialect {
        SqlDialect::Sqlite => "SQLite",
        SqlDialect::Postgres => "PostgreSQL",
    };
    ToolSpec {
        name: "sql".to_owned(),
        description: format!(
            "Run one read-only SELECT query ({engine} dialect) over these tables and columns \
             only: {}. Common aggregate, text, number and date functions are allowed; at most \
             {} rows come back.",
            tables.join("; "),
            options.max_rows
        ),
        input_schema: json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "One SELECT statement."}
            },
            "required": ["query"],
            "additionalProperties": false
        }),
        kind: ToolKind::Builtin,
        declarations: ToolDeclarations {
            side_effects: SideEffects::None,
            idempotent: true,
            ..ToolDeclarations::default()
        },
    }
}
