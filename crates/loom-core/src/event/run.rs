//! The payloads of a run's life cycle: `run.*`, `step.*` and `message.user`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{content::Message, state::RunStatus, usage::Usage};

use super::{de_ts, ser_ts};

/// Who the run is for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunContext {
    /// Tenant.
    pub tenant_id: String,
    /// End user, if known.
    #[serde(default)]
    pub user_id: Option<String>,
    /// Caller metadata.
    #[serde(default)]
    pub metadata: Map<String, Value>,
}

/// Limits of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunBudget {
    /// Dollars.
    #[serde(default)]
    pub max_cost: Option<f64>,
    /// Tokens.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Model calls.
    #[serde(default)]
    pub max_calls: Option<u64>,
}

/// `run.started`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStarted {
    /// "normal" or "compaction".
    pub kind: String,
    /// Who the run is for.
    pub context: RunContext,
    /// Parent run of a sub-agent run.
    #[serde(default)]
    pub parent_run_id: Option<String>,
    /// Call of the parent that opened it.
    #[serde(default)]
    pub parent_call_id: Option<String>,
    /// Depth in the run tree.
    #[serde(default)]
    pub depth: u32,
    /// Who triggered it.
    #[serde(default)]
    pub triggered_by: Option<String>,
    /// Trigger name.
    #[serde(default)]
    pub trigger: Option<String>,
    /// "auto", "force" or "skip".
    #[serde(default = "auto")]
    pub judges: String,
    /// Run budget.
    #[serde(default)]
    pub budget: Option<RunBudget>,
    /// Session state written by the application.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub state: Map<String, Value>,
}

fn auto() -> String {
    "auto".into()
}

/// What a step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// One model call.
    ModelCall,
    /// One batch of tool calls.
    ToolBatch,
    /// The last answer, without tools.
    Finalize,
    /// Waiting for a child run.
    WaitChild,
}

impl Effect {
    /// Journal string.
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::ModelCall => "model_call",
            Effect::ToolBatch => "tool_batch",
            Effect::Finalize => "finalize",
            Effect::WaitChild => "wait_child",
        }
    }
}

/// `step.started`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepStarted {
    /// Step number, from 1.
    pub step_no: u32,
    /// State the step starts from.
    pub state: RunStatus,
    /// What it does.
    pub effect: Effect,
}

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Fine.
    Ok,
    /// Failed.
    Error,
    /// Cancelled.
    Cancelled,
}

/// `step.completed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepCompleted {
    /// Step number.
    pub step_no: u32,
    /// Duration in milliseconds.
    pub duration_ms: f64,
    /// Events written inside the step.
    #[serde(default)]
    pub events_emitted: u32,
    /// How it ended.
    pub outcome: Outcome,
}

/// `run.transitioned`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunTransitioned {
    /// Previous state.
    pub from_state: RunStatus,
    /// New state.
    pub to_state: RunStatus,
    /// Step after which it happens.
    #[serde(default)]
    pub step_no: u32,
    /// Event type or reason that caused it.
    pub cause_type: String,
    /// Event that caused it.
    #[serde(default)]
    pub cause_event_id: Option<String>,
}

/// `run.completed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunCompleted {
    /// Final answer (null when a terminal tool result is the answer).
    pub output: Option<Message>,
    /// The `tool.completed` whose result is the answer.
    #[serde(default)]
    pub output_event_id: Option<String>,
    /// Orchestrator model calls.
    pub iterations: u32,
    /// Usage of the whole run.
    pub usage: Usage,
    /// Cost in dollars.
    pub cost_usd: f64,
    /// Structured answer.
    #[serde(default)]
    pub data: Option<Value>,
    /// Kept despite its contract or judge.
    #[serde(default)]
    pub unverified: bool,
    /// Replaced by a fallback message.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fallback: bool,
}

/// `run.failed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunFailed {
    /// Classification ("timeout", "model.auth", …).
    pub error_type: String,
    /// Message.
    pub error: String,
    /// Orchestrator model calls.
    pub iterations: u32,
    /// Usage.
    pub usage: Usage,
    /// Cost.
    pub cost_usd: f64,
}

/// `run.cancelled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunCancelled {
    /// "requested" or "parent".
    pub reason: String,
    /// Who cancelled.
    #[serde(default)]
    pub by: Option<String>,
    /// Orchestrator model calls.
    pub iterations: u32,
    /// Usage.
    pub usage: Usage,
    /// Cost.
    pub cost_usd: f64,
    /// Open approvals withdrawn.
    #[serde(default)]
    pub withdrawn: Vec<String>,
}

/// `run.claimed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunClaimed {
    /// The worker.
    pub worker_id: String,
    /// End of the lease.
    #[serde(serialize_with = "ser_ts", deserialize_with = "de_ts")]
    pub lease_until: DateTime<Utc>,
}

/// `message.user`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageUser {
    /// The message.
    pub message: Message,
    /// "request" or "repair".
    #[serde(default = "request")]
    pub kind: String,
    /// Policy behind a repair.
    #[serde(default)]
    pub policy: Option<String>,
    /// Whether tools stay offered.
    #[serde(default = "yes")]
    pub tools: bool,
}

fn request() -> String {
    "request".into()
}

fn yes() -> bool {
    true
}
