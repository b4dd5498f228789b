//! What a run's state is: [`RunStatus`], [`RunState`] and its parts (pending calls, repairs,
//! amendments, the claim), the `message.user` kinds the projection tells apart, and the errors
//! of a projection and of a fold.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{approval::ApprovalRecord, content::Message, usage::Usage};

/// `message.user.kind` of a message sent to a running run (`Loom::steer`): it joins the
/// conversation before the run's next model call.
pub const STEER: &str = "steer";

/// The states of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// The next effect is a model call.
    ReadyForModel,
    /// The model asked for tools; the next effect is the tool batch.
    AwaitingTools,
    /// A child run must finish first.
    WaitingChild,
    /// A human must decide.
    Paused,
    /// The iteration cap is reached: one last answer, without tools.
    Finalizing,
    /// Done.
    Completed,
    /// Failed.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl RunStatus {
    /// The journal string.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::ReadyForModel => "ready_for_model",
            RunStatus::AwaitingTools => "awaiting_tools",
            RunStatus::WaitingChild => "waiting_child",
            RunStatus::Paused => "paused",
            RunStatus::Finalizing => "finalizing",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// Completed, failed or cancelled.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tool call the model asked for and that has no result yet.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingCall {
    /// Call id.
    pub call_id: String,
    /// Tool name.
    pub name: String,
    /// Arguments as written by the model.
    pub arguments: Value,
    /// Whether `tool.called` was written (the effect may have happened).
    pub started: bool,
    /// Arguments a `before_tool` policy put in place of the model's (the tool runs with
    /// them; the journal's `tool.called` keeps the model's).
    pub replaced_arguments: Option<Value>,
    /// The child run of a sub-agent call, once opened.
    pub child_run_id: Option<String>,
}

impl PendingCall {
    /// The arguments the tool runs with: the policy's replacement, else the model's.
    pub fn effective_arguments(&self) -> &Value {
        self.replaced_arguments.as_ref().unwrap_or(&self.arguments)
    }
}

/// A repair a policy asked for (`policy.decided` retry), written as a `message.user` of kind
/// `repair` before the next model call.
#[derive(Debug, Clone, PartialEq)]
pub struct Repair {
    /// The policy that refused the output.
    pub policy: String,
    /// Its diagnostic.
    pub feedback: String,
    /// Whether the repair may call tools.
    pub tools: bool,
}

/// A call that ran with other arguments than the model wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Amendment {
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool_name: String,
    /// Who corrected them (the approver, or `policy <name>`).
    pub by: String,
    /// The arguments it ran with.
    pub arguments: Value,
}

impl Amendment {
    /// The note the model reads after the call's result.
    pub fn note(&self) -> String {
        format!(
            "{}: the call {} to {} ran with arguments corrected by {}: {}. The call above \
             shows them; the journal keeps the original ones.]",
            crate::model::SYSTEM_NOTE_PREFIX,
            self.call_id,
            self.tool_name,
            self.by,
            self.arguments
        )
    }
}

/// `message.user.kind` of a repair request.
pub const REPAIR: &str = "repair";

/// The lease a worker holds on the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// Worker.
    pub worker_id: String,
    /// End of the lease.
    pub lease_until: DateTime<Utc>,
}

/// A journal that breaks the state machine.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("run {run_id}, event {event_id} (seq {seq}, {event_type}): {reason}")]
pub struct ProjectionError {
    /// Run.
    pub run_id: String,
    /// Offending event.
    pub event_id: String,
    /// Its seq.
    pub seq: u64,
    /// Its type.
    pub event_type: String,
    /// What is wrong.
    pub reason: String,
}

/// Everything known about a run, recomputed from its events.
#[derive(Debug, Clone, PartialEq)]
pub struct RunState {
    /// Run.
    pub run_id: String,
    /// Session.
    pub session_id: String,
    /// Tenant.
    pub tenant_id: String,
    /// Root run.
    pub root_run_id: String,
    /// Span of `run.started`.
    pub run_span_id: String,
    /// Parent run.
    pub parent_run_id: Option<String>,
    /// Depth.
    pub depth: u32,
    /// Agent.
    pub agent: Option<String>,
    /// "normal" or "compaction".
    pub kind: String,
    /// Current state.
    pub status: RunStatus,
    /// Last step number.
    pub step: u32,
    /// Sum of step durations.
    pub active_ms: f64,
    /// Orchestrator model calls.
    pub iterations: u32,
    /// The run's messages, in journal order.
    pub messages: Vec<Message>,
    /// Tool calls of the last answer still without result, in call order.
    pub pending_calls: Vec<PendingCall>,
    /// Usage.
    pub usage: Usage,
    /// Cost.
    pub cost_usd: f64,
    /// Model calls of every slot.
    pub model_calls: u32,
    /// Final answer.
    pub output: Option<Message>,
    /// Structured final answer.
    pub output_data: Option<Value>,
    /// Failure classification.
    pub error_type: Option<String>,
    /// Failure message.
    pub error: Option<String>,
    /// The current lease.
    pub claim: Option<Claim>,
    /// Whether the closing event was written.
    pub finished: bool,
    /// The model each slot switched to (`model.fell_back`): a run that fell back stays there.
    pub models: std::collections::BTreeMap<String, String>,
    /// URIs of the results moved out of the context in this run (`artifact.stored`, origin
    /// `offload`), which `artifact_read` may page through.
    pub offloaded: Vec<String>,
    /// Every approval request of the run, in journal order, with what became of it.
    pub approvals: Vec<ApprovalRecord>,
    /// Steering messages waiting for the open tool calls to complete.
    pub steering: Vec<Message>,
    /// A repair asked for and not yet written.
    pub pending_repair: Option<Repair>,
    /// Repairs asked per policy (`<policy>` for the output, `<policy>#<call_id>` for a call).
    pub retries: std::collections::BTreeMap<String, u32>,
    /// Whether the last repair forbade tools (the next call is made with `tool_choice: none`).
    pub repair_without_tools: bool,
    /// The final answer an `on_output` policy put in place of the model's.
    pub replaced_output: Option<Message>,
    /// The final output failed its contract or judge and was kept anyway.
    pub unverified: bool,
    /// The final output was replaced by a fallback message.
    pub fallback: bool,
    /// Budget limits already signalled (`<scope>.<limit>`).
    pub exceeded: std::collections::BTreeSet<String>,
    /// How judges run for this run: `auto`, `force` or `skip`.
    pub judges: String,
    /// The run's budget as opened (a sub-agent's share included).
    pub budget: Option<crate::event::RunBudget>,
    /// The parent's call that opened this run (sub-agents).
    pub parent_call_id: Option<String>,
    /// Names of the tools the model called in the run, in the order their results came: run,
    /// refused before launch or denied by a policy, each call the model made and got an answer
    /// to counts (as in the reference, where `loom.require_tool` forces one call, not one
    /// successful call).
    pub tools_called: Vec<String>,
    /// Calls whose arguments were corrected (at approval, or by a `before_tool` policy): the
    /// model is told, after their results, with a system note.
    pub amendments: Vec<Amendment>,
    /// Calls answered by model calls journaled in this run (`model.responded` with a
    /// `call_id`: roles). Their consumption is counted once, from those `model.responded`; the
    /// `usage`/`cost_usd` their `tool.completed` repeats is not added again.
    pub priced_calls: std::collections::BTreeSet<String>,
    /// Seq of the last event applied.
    pub last_seq: u64,
    /// When the run started.
    pub started_at: DateTime<Utc>,
    /// When the last event was written.
    pub updated_at: DateTime<Utc>,
}

/// Why a run could not be folded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FoldError {
    /// No event of that run.
    #[error("run {0} not found")]
    Unknown(String),
    /// The journal breaks the state machine.
    #[error(transparent)]
    Projection(#[from] ProjectionError),
}
