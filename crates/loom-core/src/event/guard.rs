//! The payloads of what holds a run to its rules: human approvals (`approval.*`), policy
//! decisions, contract and judge verdicts, budgets.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{de_opt_ts, ser_opt_ts};

/// `approval.requested`: the call is held until a decision.
///
/// Content fields: `arguments`, `reason`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequested {
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool_name: String,
    /// The arguments the call would run with.
    pub arguments: Value,
    /// Why a human is asked.
    pub reason: String,
    /// The policy that asked (none: the tool's declaration).
    #[serde(default)]
    pub policy: Option<String>,
    /// What the decision allows ([`crate::approval::APPROVE_SCOPE`]).
    #[serde(default = "approve")]
    pub scope: String,
    /// Deadline (`null`: never expires).
    #[serde(default, serialize_with = "ser_opt_ts", deserialize_with = "de_opt_ts")]
    pub expire_at: Option<DateTime<Utc>>,
}

fn approve() -> String {
    crate::approval::APPROVE_SCOPE.into()
}

/// `approval.granted`.
///
/// Content fields: `arguments`, `reason`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalGranted {
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool_name: String,
    /// Who decided.
    pub by: String,
    /// Why.
    #[serde(default)]
    pub reason: Option<String>,
    /// Corrected arguments the call runs with (`null`: the model's).
    #[serde(default)]
    pub arguments: Option<Value>,
}

/// `approval.rejected`.
///
/// Content field: `reason`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRejected {
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool_name: String,
    /// Who decided.
    pub by: String,
    /// Why (given to the model).
    #[serde(default)]
    pub reason: Option<String>,
}

/// `approval.expired`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalExpired {
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool_name: String,
    /// "deny" (the model is told) or "fail" (the run fails).
    pub action: String,
    /// The deadline that passed.
    #[serde(default, serialize_with = "ser_opt_ts", deserialize_with = "de_opt_ts")]
    pub expire_at: Option<DateTime<Utc>>,
}

/// `policy.decided`: a decision of a policy at one hook point, journaled before it takes effect.
///
/// Content fields: `reason`, `arguments`, `output`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyDecided {
    /// The policy (`loom.contract`, `loom.judge.<name>`, `loom.budget`, or a user policy).
    pub policy: String,
    /// The hook point (`before_model`, `after_model`, `before_tool`, `after_tool`, `on_output`).
    pub point: String,
    /// `continue`, `replace`, `retry`, `deny`, `pause`, `stop` or `fail`.
    pub decision: String,
    /// Why.
    #[serde(default)]
    pub reason: Option<String>,
    /// The tool call concerned (tool points).
    #[serde(default)]
    pub call_id: Option<String>,
    /// Repair attempt number (retry).
    #[serde(default)]
    pub attempt: Option<u32>,
    /// Whether the repair keeps tools offered (retry).
    #[serde(default)]
    pub tools: Option<bool>,
    /// Replacement arguments (replace at `before_tool`).
    #[serde(default)]
    pub arguments: Option<Value>,
    /// Replacement output (replace at `on_output` / `after_tool`).
    #[serde(default)]
    pub output: Option<Value>,
    /// Whether the policy itself failed (exception, timeout, decision not allowed).
    #[serde(default)]
    pub error: bool,
}

/// `guard.checked`: a contract or judge verdict on an output.
///
/// Content field: `reason`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuardChecked {
    /// `contract`, `judge` or `fidelity`.
    pub guard: String,
    /// `output`, `role:<name>` or `tool:<name>`.
    pub target: String,
    /// `passed`, `failed` or `skipped`.
    pub outcome: String,
    /// The diagnostic, or why the guard was skipped.
    #[serde(default)]
    pub reason: Option<String>,
    /// Attempt number (1 for the first check).
    #[serde(default)]
    pub attempt: Option<u32>,
    /// Whether normalization changed the output.
    #[serde(default)]
    pub normalized: bool,
    /// What a failure leads to: `retry`, `fail`, `unverified` or `fallback`.
    #[serde(default)]
    pub resolution: Option<String>,
    /// The policy running the guard (`loom.contract`, `loom.judge.<name>`).
    #[serde(default)]
    pub policy: Option<String>,
    /// The tool call whose result was checked.
    #[serde(default)]
    pub call_id: Option<String>,
}

/// One criterion of a judge's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CriterionScore {
    /// Criterion name.
    pub name: String,
    /// Score between 0 and 1.
    pub score: f64,
    /// Threshold.
    pub min_score: f64,
    /// Whether a score under the threshold refuses the output.
    pub blocking: bool,
    /// The judge's explanation.
    #[serde(default)]
    pub reason: Option<String>,
}

impl CriterionScore {
    /// Whether the score reaches the threshold.
    pub fn passed(&self) -> bool {
        self.score >= self.min_score
    }
}

/// `judge.evaluated`: a judge's scores.
///
/// Content field: `criteria[].reason`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgeEvaluated {
    /// Judge name.
    pub judge: String,
    /// `output` or `role:<name>`.
    pub target: String,
    /// Provider model name of the judge.
    pub model_id: String,
    /// Config model id of the judge.
    #[serde(default)]
    pub model: Option<String>,
    /// One score per criterion (at least one).
    pub criteria: Vec<CriterionScore>,
    /// Every criterion passed.
    pub passed: bool,
    /// A blocking criterion failed.
    pub blocked: bool,
    /// Attempt number.
    #[serde(default)]
    pub attempt: Option<u32>,
    /// The policy running the judge.
    #[serde(default)]
    pub policy: Option<String>,
    /// The role call judged.
    #[serde(default)]
    pub call_id: Option<String>,
}

/// `budget.exceeded`: a run or session limit was reached (once per limit and run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetExceeded {
    /// `run` or `session`.
    pub scope: String,
    /// `max_cost`, `max_tokens` or `max_calls`.
    pub limit: String,
    /// The limit's value.
    pub value: f64,
    /// What was spent.
    pub spent: f64,
    /// `warn` or `stop`.
    pub action: String,
    /// The policy (`loom.budget`).
    #[serde(default)]
    pub policy: Option<String>,
}
