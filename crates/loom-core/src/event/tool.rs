//! The payloads of tool calls and their sources: `tool.*`, `idempotency.*` (a call with a
//! business key recorded or reused) and `circuit.opened` (the breaker of a model or an MCP
//! server).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    tool::{ToolKind, ToolOutput},
    usage::Usage,
};

/// `tool.called`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCalled {
    /// Call id.
    pub call_id: String,
    /// Tool.
    pub tool_name: String,
    /// Tool family.
    pub tool_kind: ToolKind,
    /// Arguments as written by the model.
    pub arguments: Value,
    /// `$ref`s resolved.
    #[serde(default)]
    pub refs: Vec<Value>,
    /// Relaunched on resume.
    #[serde(default)]
    pub resumed: bool,
    /// Child run of a sub-agent call.
    #[serde(default)]
    pub child_run_id: Option<String>,
    /// What the tool declared a call may change, as the engine launched it. Absent from the
    /// reference's journals (and from Loom's before this field): read as unknown. A call of a
    /// tool declared `none` is safe to run again, so its `tool.called` need not be on disk
    /// before the tool runs ([`must_sync`](crate::event::must_sync)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side_effects: Option<crate::tool::SideEffects>,
}

/// `tool.completed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCompleted {
    /// Call id.
    pub call_id: String,
    /// Tool.
    pub tool_name: String,
    /// Result.
    pub output: ToolOutput,
    /// Latency.
    pub latency_ms: f64,
    /// Bytes of the output's JSON.
    pub size: u64,
    /// Usage of a sub-agent.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Cost of a sub-agent or role.
    #[serde(default)]
    pub cost_usd: f64,
}

/// `tool.source_unavailable`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSourceUnavailable {
    /// The source (MCP server name or alias).
    pub source: String,
    /// Why.
    pub error: String,
    /// Whether the agent requires it (the run then fails).
    #[serde(default)]
    pub required: bool,
}

/// `tool.source_opened` (not in the reference catalogue): a tool source (an MCP server) gave
/// its tools for the run, with what the model was offered of each and the declarations the
/// engine applied. Written each time the source opens for the run (its start and every
/// resume), so that a replay offers the same tools without asking the live server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSourceOpened {
    /// The source (MCP server name or alias).
    pub source: String,
    /// Its tools offered to the run, in the order the source listed them.
    pub tools: Vec<OfferedTool>,
}

/// One tool of a source as the run was offered it (`tool.source_opened.tools[]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OfferedTool {
    /// The name offered to the model.
    pub name: String,
    /// The description offered to the model.
    pub description: String,
    /// The JSON Schema of its arguments.
    pub input_schema: serde_json::Value,
    /// Its family, as `tool.called.tool_kind` records it.
    pub kind: crate::tool::ToolKind,
    /// What a call may change.
    pub side_effects: crate::tool::SideEffects,
    /// Whether a human approves calls.
    #[serde(default)]
    pub approval: crate::tool::Approval,
    /// Whether running a call twice has the effect of running it once.
    #[serde(default)]
    pub idempotent: bool,
    /// What to do with an interrupted call.
    #[serde(default)]
    pub on_unknown: crate::tool::OnUnknown,
    /// Per-call timeout in seconds, when declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// Result size above which the result is offloaded, when declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload_over: Option<u64>,
}

/// `circuit.opened`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CircuitOpened {
    /// "model" or "mcp".
    pub target_kind: String,
    /// The model id or server name.
    pub target: String,
    /// Consecutive failures that opened it.
    pub failures: u32,
    /// How long it stays open.
    pub cooldown_s: f64,
    /// The last error.
    #[serde(default)]
    pub error: Option<String>,
    /// Role call involved.
    #[serde(default)]
    pub call_id: Option<String>,
    /// Judge involved.
    #[serde(default)]
    pub judge: Option<String>,
}

/// `idempotency.recorded`.
///
/// Content field: `result`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdempotencyRecorded {
    /// The full business key (`<tenant>:<tool>:<business key>`).
    pub key: String,
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool_name: String,
    /// The recorded result.
    pub result: crate::tool::ToolOutput,
}

/// `idempotency.reused`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdempotencyReused {
    /// The full business key (`<tenant>:<tool>:<business key>`).
    pub key: String,
    /// The call that was not run.
    pub call_id: String,
    /// Its tool.
    pub tool_name: String,
}
