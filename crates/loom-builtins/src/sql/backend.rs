//! The read-only connections of `loom.sql`: the second barrier, which holds even if a query
//! got past the guard.
//!
//! - SQLite: the file is opened read-only (`SQLITE_OPEN_READONLY`, never created) with
//!   `PRAGMA query_only = ON`; a progress handler interrupts a statement past its time limit.
//! - PostgreSQL: every connection starts with `default_transaction_read_only = on` and a
//!   `statement_timeout`, and every query runs in a `BEGIN READ ONLY` transaction that is
//!   rolled back; the extended protocol runs one statement per query.
//!
//! Connections are opened at first use, so a tool is built without the database being up.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    str::FromStr,
    time::{Duration, Instant},
};

use serde_json::{Map, Value, json};
use sqlx::{
    AssertSqlSafe, Column, Connection, Executor, Row, SqlSafeStr, Statement, TypeInfo, ValueRef,
    pool::PoolOptions,
    postgres::{PgConnectOptions, PgPool},
    sqlite::{SqliteConnectOptions, SqlitePool},
};

use super::guard::SqlDialect;

/// Where `loom.sql` reads.
#[derive(Clone)]
pub enum SqlDatabase {
    /// A SQLite file (it must exist; it is never created).
    Sqlite(PathBuf),
    /// A PostgreSQL DSN (`postgres://user@host/db`), read from the environment or a secret.
    Postgres(String),
}

impl std::fmt::Debug for SqlDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SqlDatabase::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            // The DSN may hold a password.
            SqlDatabase::Postgres(_) => f.write_str("Postgres(<dsn>)"),
        }
    }
}

/// Rows read by a query, as JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct SqlRows {
    /// The column names, in order.
    pub columns: Vec<String>,
    /// The rows, each a list of values in column order.
    pub rows: Vec<Vec<Value>>,
    /// Whether the query had more rows than returned.
    pub truncated: bool,
}

impl SqlRows {
    /// The rows as the tool returns them: `{columns, rows, row_count, truncated}`.
    pub fn to_json(&self) -> Value {
        json!({
            "columns": self.columns,
            "rows": self.rows,
            "row_count": self.rows.len(),
            "truncated": self.truncated,
        })
    }
}

/// An error of the database (not a refusal of the guard).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqlError {
    /// The DSN or file name cannot be read as connection options.
    #[error("invalid database address: {0}")]
    Address(String),
    /// The database refused or failed the query, or could not be reached.
    #[error("the database failed: {0}")]
    Database(#[from] sqlx::Error),
    /// A row came back in a form that cannot be read.
    #[error("unreadable row: {0}")]
    Unreadable(String),
    /// The query ran past its time limit.
    #[error("the query ran longer than {0:?} and was stopped")]
    Timeout(Duration),
}

/// A database opened read-only, in one place for both backends.
#[derive(Debug, Clone)]
pub struct ReadOnlyDatabase {
    pool: Pool,
    timeout: Duration,
}

#[derive(Debug, Clone)]
enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

impl ReadOnlyDatabase {
    /// Read-only connections to `database` (opened at first use), each query stopped after
    /// `timeout`.
    ///
    /// # Errors
    /// A DSN that is not a PostgreSQL address.
    pub fn new(database: &SqlDatabase, timeout: Duration) -> Result<ReadOnlyDatabase, SqlError> {
        let pool = match database {
            SqlDatabase::Sqlite(path) => {
                let options = SqliteConnectOptions::new()
                    .filename(path)
                    .read_only(true)
                    .create_if_missing(false)
                    .pragma("query_only", "ON");
                Pool::Sqlite(
                    PoolOptions::new()
                        .max_connections(2)
                        .connect_lazy_with(options),
                )
            }
            SqlDatabase::Postgres(dsn) => {
                // The error of a bad DSN may quote it: never shown.
                let options = PgConnectOptions::from_str(dsn).map_err(|_| {
                    SqlError::Address("the PostgreSQL DSN cannot be parsed".to_owned())
                })?;
                let options = options.options([
                    ("default_transaction_read_only", "on".to_owned()),
                    (
                        "statement_timeout",
                        format!("{}", timeout.as_millis().max(1)),
                    ),
                ]);
                Pool::Postgres(
                    PoolOptions::new()
                        .max_connections(2)
                        .acquire_timeout(timeout)
                        .connect_lazy_with(options),
                )
            }
        };
        Ok(ReadOnlyDatabase { pool, timeout })
    }

    /// The dialect of the database's SQL.
    pub fn dialect(&self) -> SqlDialect {
        match self.pool {
            Pool::Sqlite(_) => SqlDialect::Sqlite,
            Pool::Postgres(_) => SqlDialect::Postgres,
        }
    }

    /// The real columns of `table` (`name` or `schema.name`), empty when it does not exist.
    ///
    /// # Errors
    /// The database failed.
    pub async fn columns(&self, table: &str) -> Result<Vec<String>, SqlError> {
        let rows = match &self.pool {
            Pool::Sqlite(pool) => {
                let (schema, name) = split_name(table, "main");
                let sql = format!(
                    "SELECT name FROM pragma_table_info(?1, {})",
                    quote_literal(schema)
                );
                sqlx::query(AssertSqlSafe(sql))
                    .bind(name.to_owned())
                    .fetch_all(pool)
                    .await?
                    .into_iter()
                    .map(|row| row.try_get::<String, _>(0))
                    .collect::<Result<Vec<_>, _>>()?
            }
            Pool::Postgres(pool) => {
                let (schema, name) = match table.split_once('.') {
                    Some((schema, name)) => (Some(schema), name),
                    None => (None, table),
                };
                sqlx::query(
                    "SELECT column_name::text FROM information_schema.columns \
                     WHERE table_name = $1 AND (($2::text IS NULL AND \
                     table_schema = ANY (current_schemas(false))) OR table_schema = $2) \
                     ORDER BY ordinal_position",
                )
                .bind(name.to_owned())
                .bind(schema.map(str::to_owned))
                .fetch_all(pool)
                .await?
                .into_iter()
                .map(|row| row.try_get::<String, _>(0))
                .collect::<Result<Vec<_>, _>>()?
            }
        };
        Ok(rows)
    }

    /// The real columns of each of `tables`.
    ///
    /// # Errors
    /// The database failed.
    pub async fn schema(&self, tables: &[&str]) -> Result<BTreeMap<String, Vec<String>>, SqlError> {
        let mut schema = BTreeMap::new();
        for table in tables {
            schema.insert((*table).to_owned(), self.columns(table).await?);
        }
        Ok(schema)
    }

    /// Runs `sql` as given on the read-only connection and reads at most `max_rows` rows.
    ///
    /// This is the second barrier only: it runs whatever it is given, read-only. Callers check
    /// the query with the guard first ([`super::SqlGuard`]).
    ///
    /// # Errors
    /// The database refused or failed the query (a write among them), or it ran too long.
    pub async fn fetch(&self, sql: &str, max_rows: usize) -> Result<SqlRows, SqlError> {
        let limit = max_rows.saturating_add(1);
        match &self.pool {
            Pool::Sqlite(pool) => self.fetch_sqlite(pool, sql, limit).await,
            Pool::Postgres(pool) => fetch_postgres(pool, sql, limit, self.timeout).await,
        }
        .map(|(columns, mut rows)| {
            let truncated = rows.len() > max_rows;
            rows.truncate(max_rows);
            SqlRows {
                columns,
                rows,
                truncated,
            }
        })
    }

    async fn fetch_sqlite(
        &self,
        pool: &SqlitePool,
        sql: &str,
        limit: usize,
    ) -> Result<(Vec<String>, Vec<Vec<Value>>), SqlError> {
        let mut connection = pool.acquire().await?;
        let deadline = Instant::now() + self.timeout;
        // SQLite has no statement timeout: the progress handler stops the statement.
        connection
            .lock_handle()
            .await?
            .set_progress_handler(1000, move || Instant::now() < deadline);
        let wrapped = format!("SELECT * FROM ({sql}) LIMIT {limit}");
        let result = sqlx::query(AssertSqlSafe(wrapped))
            .fetch_all(&mut *connection)
            .await;
        connection.lock_handle().await?.remove_progress_handler();
        let rows = match result {
            Ok(rows) => rows,
            Err(error) if Instant::now() >= deadline => {
                tracing::info!(%error, "loom.sql: SQLite query interrupted at its time limit");
                return Err(SqlError::Timeout(self.timeout));
            }
            Err(error) => return Err(error.into()),
        };
        let columns: Vec<String> = match rows.first() {
            Some(row) => row.columns().iter().map(|c| c.name().to_owned()).collect(),
            // No row: the names come from the prepared statement.
            None => (&mut *connection)
                .prepare(AssertSqlSafe(format!("SELECT * FROM ({sql})")).into_sql_str())
                .await?
                .columns()
                .iter()
                .map(|c| c.name().to_owned())
                .collect(),
        };
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut values = Vec::with_capacity(columns.len());
            for index in 0..row.len() {
                values.push(sqlite_value(row, index)?);
            }
            out.push(values);
        }
        Ok((columns, out))
    }
}

/// One SQLite value as JSON, by its storage class.
fn sqlite_value(row: &sqlx::sqlite::SqliteRow, index: usize) -> Result<Value, SqlError> {
    let raw = row.try_get_raw(index)?;
    if raw.is_null() {
        return Ok(Value::Null);
    }
    let kind = raw.type_info().name().to_owned();
    Ok(match kind.as_str() {
        "INTEGER" => json!(row.try_get::<i64, _>(index)?),
        "REAL" => json!(row.try_get::<f64, _>(index)?),
        "BLOB" => {
            let bytes: Vec<u8> = row.try_get(index)?;
            json!(format!("<{} bytes of binary data>", bytes.len()))
        }
        _ => json!(row.try_get::<String, _>(index)?),
    })
}

/// Runs `sql` in a read-only transaction that is rolled back; each row comes back as JSON
/// from the database (`row_to_json`), the columns renamed `c1…cn` so that duplicate names
/// survive.
async fn fetch_postgres(
    pool: &PgPool,
    sql: &str,
    limit: usize,
    timeout: Duration,
) -> Result<(Vec<String>, Vec<Vec<Value>>), SqlError> {
    let mut connection = pool.acquire().await?;
    let mut transaction = connection.begin_with("BEGIN TRANSACTION READ ONLY").await?;
    let statement = (&mut *transaction)
        .prepare(AssertSqlSafe(format!("SELECT * FROM ({sql}) AS loom_query")).into_sql_str())
        .await
        .map_err(|error| timed_out(error, timeout))?;
    let columns: Vec<String> = statement
        .columns()
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    let aliases: Vec<String> = (1..=columns.len()).map(|i| format!("c{i}")).collect();
    let wrapped = format!(
        "SELECT row_to_json(loom_query)::text FROM ({sql}) AS loom_query({}) LIMIT {limit}",
        aliases.join(", ")
    );
    let rows = sqlx::query(AssertSqlSafe(wrapped))
        .fetch_all(&mut *transaction)
        .await
        .map_err(|error| timed_out(error, timeout))?;
    transaction.rollback().await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let text: String = row.try_get(0)?;
        let object: Map<String, Value> =
            serde_json::from_str(&text).map_err(|error| SqlError::Unreadable(error.to_string()))?;
        out.push(
            aliases
                .iter()
                .map(|alias| object.get(alias).cloned().unwrap_or(Value::Null))
                .collect(),
        );
    }
    Ok((columns, out))
}

/// A PostgreSQL error, as a timeout when it is `statement_timeout`'s cancellation.
fn timed_out(error: sqlx::Error, timeout: Duration) -> SqlError {
    if let sqlx::Error::Database(db) = &error
        && db.code().as_deref() == Some("57014")
    {
        return SqlError::Timeout(timeout);
    }
    error.into()
}

fn split_name<'a>(name: &'a str, default_schema: &'a str) -> (&'a str, &'a str) {
    name.split_once('.').unwrap_or((default_schema, name))
}

fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}
