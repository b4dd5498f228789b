//! An agent's tool references (`ToolRef`), the declarations the configuration fixes for a tool
//! (`ToolOverrides`) and the folders `loom.local_files` and `loom.excel` may use.

use std::{collections::BTreeMap, path::PathBuf};

use loom_core::tool::{Approval, SideEffects};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::guards::OutputContract;

/// A tool reference of an agent: a tool registered in code or built in (`tool`), the tools of
/// an MCP server (`mcp`) or of a tool source (`source`). Exactly one of `tool`, `mcp` and
/// `source` is given; the other keys are checked against it (`folders` only with
/// `loom.local_files` and `loom.excel`, `include` only with `mcp` or `source`, …).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolRef {
    /// Registered tool name, or a built-in `loom.current_datetime`, `loom.local_files`,
    /// `loom.fetch_page`, `loom.sql`, `loom.excel` (alias `python`, for users of the Python
    /// reference).
    #[serde(default, alias = "python")]
    #[schemars(length(min = 1))]
    pub tool: Option<String>,
    /// A declared MCP server whose tools the agent uses (`<server>__<tool>`).
    #[serde(default)]
    #[schemars(regex(pattern = r"^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$"))]
    pub mcp: Option<String>,
    /// A declared tool source whose tools the agent uses (`<source>__<tool>`); the keys that
    /// follow `mcp` apply to it alike.
    #[serde(default)]
    #[schemars(regex(pattern = r"^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$"))]
    pub source: Option<String>,
    /// With `mcp`: the prefix the model sees instead of the server name (`<alias>__<tool>`).
    #[serde(default)]
    #[schemars(regex(pattern = r"^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$"), length(max = 40))]
    pub alias: Option<String>,
    /// With `mcp`: only these tools (server names, without prefix).
    #[serde(default)]
    pub include: Option<Vec<String>>,
    /// With `mcp`: all tools but these.
    #[serde(default)]
    pub exclude: Option<Vec<String>>,
    /// With `mcp`: fail the run when the server cannot be reached (else its tools are withdrawn).
    #[serde(default)]
    pub required: bool,
    /// With `mcp`: declarations per tool (server names), over the server's own.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolOverrides>,
    /// Description shown to the model instead of the tool's own.
    #[serde(default)]
    pub description: Option<String>,
    /// Per-call timeout in seconds.
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub timeout: Option<f64>,
    /// Side effects of a call.
    #[serde(default)]
    pub side_effects: Option<SideEffects>,
    /// Human approval of calls.
    #[serde(default)]
    pub approval: Option<Approval>,
    /// Whether running a call twice has the effect of running it once.
    #[serde(default)]
    pub idempotent: Option<bool>,
    /// Result size (characters) above which the result is offloaded.
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub offload_over: Option<u64>,
    /// With `loom.local_files` and `loom.excel`: the folders the tool may use.
    #[serde(default)]
    pub folders: Option<Vec<FolderSpec>>,
    /// With `loom.sql`: the database it reads.
    #[serde(default)]
    pub database: Option<SqlDatabaseSpec>,
    /// With `loom.sql`: the tables it may read, each with its allowed columns.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub tables: Option<Vec<SqlTableSpec>>,
    /// With `loom.sql`: the most rows a query returns (default 100).
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub max_rows: Option<u64>,
    /// With `loom.fetch_page`: allow loopback, private and link-local addresses (default false).
    #[serde(default)]
    pub allow_private: Option<bool>,
    /// With `loom.fetch_page`: largest page read, in bytes after decompression.
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub max_bytes: Option<u64>,
    /// Contract of the tool's results (with `mcp`: set it per tool under `tools`).
    #[serde(default)]
    pub output: Option<OutputContract>,
}

impl ToolRef {
    /// A reference to the tool `tool` without overrides.
    pub fn new(tool: impl Into<String>) -> ToolRef {
        ToolRef {
            tool: Some(tool.into()),
            ..ToolRef::default()
        }
    }

    /// A reference to the tools of the tool source `source`.
    pub fn source(source: impl Into<String>) -> ToolRef {
        ToolRef {
            source: Some(source.into()),
            ..ToolRef::default()
        }
    }

    /// A reference to the tools of the MCP server `server`.
    pub fn mcp(server: impl Into<String>) -> ToolRef {
        ToolRef {
            mcp: Some(server.into()),
            ..ToolRef::default()
        }
    }
}

/// Declarations of one tool fixed by the configuration; absent keys keep the tool's own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolOverrides {
    /// Description shown to the model.
    #[serde(default)]
    pub description: Option<String>,
    /// Side effects of a call.
    #[serde(default)]
    pub side_effects: Option<SideEffects>,
    /// Human approval of calls.
    #[serde(default)]
    pub approval: Option<Approval>,
    /// Whether running a call twice has the effect of running it once.
    #[serde(default)]
    pub idempotent: Option<bool>,
    /// Per-call timeout in seconds.
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub timeout: Option<f64>,
    /// Result size (characters) above which the result is offloaded.
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub offload_over: Option<u64>,
    /// Contract of the tool's results.
    #[serde(default)]
    pub output: Option<OutputContract>,
}

/// A folder `loom.local_files` or `loom.excel` may use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FolderSpec {
    /// Name the model uses for it.
    #[schemars(regex(pattern = r"^[a-z0-9][a-z0-9_-]{0,31}$"))]
    pub name: String,
    /// Directory, relative to the config file.
    pub path: PathBuf,
    /// What the tool may do there.
    #[schemars(length(min = 1))]
    pub rights: Vec<FolderRight>,
}

/// The database `loom.sql` reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SqlDatabaseSpec {
    /// `sqlite` (a file, `path`) or `postgres` (a DSN read from `dsn_env`).
    pub backend: SqlBackend,
    /// With `sqlite`: the database file, relative to the config file; it must exist (it is
    /// opened read-only, never created).
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// With `postgres`: the environment variable (or env file entry) holding the DSN.
    #[serde(default)]
    pub dsn_env: Option<String>,
}

/// The backend of `loom.sql`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SqlBackend {
    /// A SQLite file.
    Sqlite,
    /// A PostgreSQL database.
    Postgres,
}

/// A table `loom.sql` may read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SqlTableSpec {
    /// The table's name (`orders`, or `schema.orders`).
    #[schemars(length(min = 1))]
    pub name: String,
    /// The columns a query may use; absent, every column (and `*`).
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub columns: Option<Vec<String>>,
}

/// A right on a folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FolderRight {
    /// List and read files.
    Read,
    /// Create new files.
    Write,
    /// Replace existing files.
    Overwrite,
    /// Delete files.
    Delete,
}
