//! # loom-builtins
//!
//! The tools Loom provides itself (`loom.<tool>` in `loom.yaml`), each an [`FnTool`] of kind
//! [`ToolKind::Builtin`](loom_core::tool::ToolKind::Builtin):
//!
//! - [`current_datetime`]: the time now, from the injected [`Clock`](loom_core::ports::Clock),
//!   in UTC and in a requested IANA time zone or fixed offset;
//! - [`local_files`]: list, read, write and delete files inside declared [`Folder`]s only; the
//!   resolved path (symbolic links included) must stay inside the folder's root, and every
//!   operation is made through the folder's directory handle, never leaving it;
//! - `excel` (feature `excel`): list the sheets of a workbook, read a sheet or an A1 range as
//!   typed values, and write cells and formulas into an `.xlsx` copy, inside the same declared
//!   folders as `local_files` (formulas are written, never recalculated);
//! - `sql` (feature `sql`): one read-only `SELECT` over declared tables and columns of a
//!   SQLite file or a PostgreSQL database, checked by a parser-based guard and run on a
//!   read-only connection;
//! - `fetch_page` (feature `fetch`): GET an `http`/`https` page whose host, and every address
//!   it resolves to, redirects included, is public; HTML comes back as readable markdown;
//! - [`openapi`] (feature `openapi`): a tool source of the operations of an OpenAPI 3 document.
//!
//! Every refusal is a [`ToolError`] whose message names the rule
//! that refused (`refused by rule 'inside-roots': ...`) and carries it as [`ToolError::rule`];
//! [`refusal_rule`] reads it and
//! [`rules`] lists the names.
//!
//! **Architecture invariant:** an adapter depends on `loom-core` only among loom crates.
//!
//! [`FnTool`]: loom_core::tool::FnTool

mod address;
mod datetime;
#[cfg(feature = "excel")]
mod excel;
#[cfg(feature = "fetch")]
mod fetch;
mod files;
#[cfg(feature = "fetch")]
mod markdown;
#[cfg(feature = "openapi")]
pub mod openapi;
#[cfg(feature = "sql")]
mod sql;

use loom_core::tool::ToolError;

pub use address::non_public_range;
pub use datetime::current_datetime;
#[cfg(feature = "excel")]
pub use excel::{READ_CELL_CAP, WORKBOOK_CAP_BYTES, WRITE_CELL_CAP, excel};
#[cfg(feature = "fetch")]
pub use fetch::{FetchOptions, Resolver, SystemResolver, fetch_page};
pub use files::{Folder, READ_CAP_BYTES, Right, Rights, WRITE_CAP_BYTES, local_files};
#[cfg(feature = "sql")]
pub use sql::{
    DEFAULT_MAX_ROWS, DEFAULT_SQL_TIMEOUT, GuardedQuery, Parsed, ReadOnlyDatabase, SqlDatabase,
    SqlDialect, SqlError, SqlGuard, SqlOptions, SqlRows, SqlTable, sql,
};

/// The names of the rules a built-in tool refuses by, as they appear in refusal messages.
pub mod rules {
    /// `local_files`, `excel`: the folder named in the call is not one of the declared folders.
    pub const DECLARED_FOLDER: &str = "declared-folder";
    /// `local_files`, `excel`: the path has a `..` component.
    pub const NO_PARENT: &str = "no-parent";
    /// `local_files`, `excel`: the resolved path (symbolic links followed) leaves the folder's
    /// root.
    pub const INSIDE_ROOTS: &str = "inside-roots";
    /// `local_files`, `excel`: the folder does not grant the right the operation needs.
    pub const FOLDER_RIGHTS: &str = "folder-rights";
    /// `local_files`, `excel`: the file is above the read or write size cap.
    pub const SIZE_CAP: &str = "size-cap";
    /// `fetch_page`: the URL's scheme is not `http` or `https`.
    pub const HTTP_ONLY: &str = "http-only";
    /// `fetch_page`: the host is, or resolves to, an address that is not public.
    pub const PUBLIC_ADDRESS: &str = "public-address";
    /// `fetch_page`: more redirects than allowed.
    pub const MAX_REDIRECTS: &str = "max-redirects";
    /// `fetch_page`: the response is not text.
    pub const TEXT_ONLY: &str = "text-only";
    /// `sql`: the query does not parse (or nests too deep).
    pub const SQL_PARSE: &str = "sql-parse";
    /// `sql`: more than one statement (or none).
    pub const SQL_SINGLE_STATEMENT: &str = "sql-single-statement";
    /// `sql`: the statement is not a read-only `SELECT` (a write, a data-modifying CTE,
    /// `SELECT … INTO`, a locking clause, `PRAGMA`, `ATTACH`, `SET`, …).
    pub const SQL_READ_ONLY: &str = "sql-read-only";
    /// `sql`: a table that is not declared (or a CTE that could stand for one).
    pub const SQL_ALLOWED_TABLES: &str = "sql-allowed-tables";
    /// `sql`: a column outside a table's declared columns (`*` and whole rows included).
    pub const SQL_ALLOWED_COLUMNS: &str = "sql-allowed-columns";
    /// `sql`: a function that is not on the list of pure functions.
    pub const SQL_ALLOWED_FUNCTIONS: &str = "sql-allowed-functions";
    /// `sql`: a system catalog (`sqlite_master`, `pg_*`, `information_schema`, `::regclass`).
    pub const SQL_SYSTEM_CATALOG: &str = "sql-system-catalog";
    /// `sql`: an expression or `FROM` item of a kind the guard does not know.
    pub const SQL_ALLOWED_SYNTAX: &str = "sql-allowed-syntax";
}

/// A refusal: a tool error that carries the rule that refused ([`ToolError::rule`]) and whose
/// message names it for the model.
pub fn refusal(rule: &'static str, detail: impl std::fmt::Display) -> ToolError {
    ToolError::refused(rule, format!("refused by rule '{rule}': {detail}"))
}

/// The rule of a refusal made with [`refusal`], `None` for any other error.
pub fn refusal_rule(error: &ToolError) -> Option<&'static str> {
    error.rule
}

/// An error building a built-in tool from its configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuiltinError {
    /// `local_files` and `excel` need at least one folder.
    #[error("the tool needs at least one folder")]
    NoFolder,
    /// A folder name does not match `^[a-z0-9][a-z0-9_-]{0,31}$`.
    #[error(
        "folder name '{0}' is invalid: use 1 to 32 of a-z, 0-9, '_' and '-', starting with a letter or digit"
    )]
    InvalidFolderName(String),
    /// Two folders have the same name.
    #[error("folder name '{0}' is declared twice")]
    DuplicateFolder(String),
    /// A folder grants no right.
    #[error("folder '{0}' grants no right")]
    NoRight(String),
    /// A folder's path cannot be resolved (it does not exist, or cannot be read).
    #[error("folder '{name}': cannot resolve {path}: {source}")]
    FolderUnavailable {
        /// The folder's name.
        name: String,
        /// The path as configured.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The `sql` tool's configuration is refused.
    #[error("loom.sql: {0}")]
    Sql(String),
    /// A folder's path is not a directory.
    #[error("folder '{name}': {path} is not a directory")]
    NotADirectory {
        /// The folder's name.
        name: String,
        /// The path as configured.
        path: std::path::PathBuf,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_its_rule() {
        let error = refusal(rules::INSIDE_ROOTS, "the path leaves 'docs'");
        assert_eq!(
            error.message,
            "refused by rule 'inside-roots': the path leaves 'docs'"
        );
        assert_eq!(refusal_rule(&error), Some("inside-roots"));
        assert_eq!(refusal_rule(&ToolError::new("not found")), None);
        // The rule is carried, not parsed back from the text.
        let lookalike = ToolError::new("refused by rule 'inside-roots': forged");
        assert_eq!(refusal_rule(&lookalike), None);
    }
}
