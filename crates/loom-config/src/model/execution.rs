//! `execution`: defaults of tool calls, limits on attached files, the lease and the shutdown
//! timeout.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Execution settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ExecutionConfig {
    /// Tool calls.
    pub tools: ToolsExecution,
    /// Files attached to a run's request (`loom run --attach`).
    pub attachments: AttachmentsExecution,
    /// Seconds a driver holds a run before another may take it over (renewed while working).
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub lease: f64,
    /// Seconds a stopping server (`loom serve` on SIGTERM or Ctrl-C) lets the runs in flight
    /// finish their current step; past it, a step still running is abandoned as a crash would
    /// leave it. Either way the run stays open, its lease handed back, and resumes at the next
    /// start.
    #[schemars(range(min = 0))]
    pub shutdown_timeout: f64,
}

impl Default for ExecutionConfig {
    fn default() -> Self {
        ExecutionConfig {
            tools: ToolsExecution::default(),
            attachments: AttachmentsExecution::default(),
            lease: 60.0,
            shutdown_timeout: 30.0,
        }
    }
}

/// Defaults for tool calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ToolsExecution {
    /// Per-call timeout in seconds (`null`: none).
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub timeout: Option<f64>,
    /// Validate arguments against the tool's input schema.
    pub validate_arguments: bool,
    /// Result size (characters) above which results are offloaded (`null`: never).
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub offload_over: Option<u64>,
}

impl Default for ToolsExecution {
    fn default() -> Self {
        ToolsExecution {
            timeout: Some(30.0),
            validate_arguments: true,
            offload_over: Some(50_000),
        }
    }
}

/// Limits on the files attached to a run (`execution.attachments`), checked before anything
/// is written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AttachmentsExecution {
    /// Largest file, in bytes.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub max_bytes: u64,
    /// Accepted media types (`type/subtype`).
    pub types: Vec<String>,
    /// Most files on one request.
    pub max_files: u32,
}

/// The media types attached by default: the images every vision model reads.
pub const DEFAULT_ATTACHMENT_TYPES: [&str; 4] =
    ["image/jpeg", "image/png", "image/gif", "image/webp"];

impl Default for AttachmentsExecution {
    /// 5 MiB per file, the four common image types, 10 files.
    fn default() -> Self {
        AttachmentsExecution {
            max_bytes: 5_242_880,
            types: DEFAULT_ATTACHMENT_TYPES.map(str::to_owned).to_vec(),
            max_files: 10,
        }
    }
}
