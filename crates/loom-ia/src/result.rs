//! What a run produced, as callers see it.

use loom_core::{Message, RunState, RunStatus, Usage, approval::PendingApproval};
use loom_engine::RunRef;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The outcome of a run, read from its journal. `--json` prints it; its field names follow
/// the reference's `RunResult` (fields without a value are left out).
///
/// Its JSON Schema (`schemars::JsonSchema`) is what the REST API's OpenAPI document gives for
/// it: derived from the same serde attributes, so the document cannot drift from the JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunResult {
    /// Run.
    pub run_id: String,
    /// Session.
    pub session_id: String,
    /// Agent.
    pub agent: String,
    /// Final (or current) state.
    pub status: RunStatus,
    /// The answer's text ("" when there is none).
    pub text: String,
    /// The answer as a message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Message>,
    /// Failure classification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    /// Failure message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Orchestrator model calls.
    pub iterations: u32,
    /// Tokens of every model call of the run.
    pub usage: Usage,
    /// Cost in dollars.
    pub cost_usd: f64,
    /// Files produced.
    #[serde(default)]
    pub artifacts: Vec<String>,
    /// Structured answer, when the agent has an output schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// Kept despite its contract or judge.
    #[serde(default)]
    pub unverified: bool,
    /// Replaced by a fallback message.
    #[serde(default)]
    pub fallback: bool,
    /// Approvals waiting for a human: the run's own (it is `paused`), or those of the sub-runs
    /// it waits for (it is `waiting_child`).
    #[serde(default)]
    pub pending_approvals: Vec<PendingApproval>,
}

impl RunResult {
    /// The result of a folded run.
    pub fn from_state(state: &RunState) -> RunResult {
        RunResult {
            run_id: state.run_id.clone(),
            session_id: state.session_id.clone(),
            agent: state.agent.clone().unwrap_or_default(),
            status: state.status,
            text: state.output_text().unwrap_or_default(),
            output: state.output.clone(),
            error_type: state.error_type.clone(),
            error: state.error.clone(),
            iterations: state.iterations,
            usage: state.usage,
            cost_usd: state.cost_usd,
            artifacts: Vec::new(),
            data: state.output_data.clone(),
            unverified: state.unverified,
            fallback: state.fallback,
            pending_approvals: state.pending_approvals(),
        }
    }

    /// Whether the run completed.
    pub fn ok(&self) -> bool {
        self.status == RunStatus::Completed
    }

    /// Where the run lives.
    pub fn run_ref(&self, tenant_id: &str) -> RunRef {
        RunRef {
            tenant_id: tenant_id.to_owned(),
            session_id: self.session_id.clone(),
            run_id: self.run_id.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use loom_core::Event;

    use super::*;

    /// The reference journal of a run answered by a terminal role.
    const TERMINAL_ROLE: &str = "reference/journals/policies-terminal-role.jsonl";

    #[test]
    fn a_terminal_roles_result_is_the_text() {
        let Some(text) = loom_testkit::shared::text(TERMINAL_ROLE) else {
            return;
        };
        let events: Vec<Event> = text
            .lines()
            .map(|line| Event::from_json(line).expect("a reference event"))
            .collect();
        let state = RunState::fold("j3-run", &events).expect("the run folds");
        let result = RunResult::from_state(&state);
        assert!(result.ok());
        assert_eq!(
            result.text,
            "Objet : votre devis D-2026-042\n\nBonjour Madame Martin, devis D-2026-042 de 1 840 €."
        );
    }
}
