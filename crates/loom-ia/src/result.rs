//! What a run produced, as callers see it: one builder ([`RunResult::from_events`]) for every
//! door (`loom run|resume|approve --json`, the REST API, the MCP server's structured content).

use std::borrow::Borrow;

use loom_core::{
    Event, Message, RunState, RunStatus, Usage,
    approval::PendingApproval,
    event::{ArtifactStored, GuardChecked, JudgeEvaluated, Payload},
    state::FoldError,
};
use loom_engine::RunRef;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::report::UsageReport;

/// The outcome of a run, read from its journal. `--json` prints it; its field names follow
/// the reference's `RunResult`, and as the reference prints it (`exclude_none`), fields
/// without a value are left out (empty lists and `false` stay).
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
    /// The files of the run, one per `artifact.stored` of the run itself, in journal order: its
    /// attachments, the files its tools returned, its offloaded results (a sub-run's files are
    /// its own, as in the reference's fold of one run). Stores are content-addressed: the same
    /// bytes stored twice are listed twice under one URI.
    #[serde(default)]
    pub artifacts: Vec<RunArtifact>,
    /// Structured answer: the output contract's validated JSON, or a terminal tool's data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// Kept despite its contract or judge.
    #[serde(default)]
    pub unverified: bool,
    /// Replaced by a fallback message.
    #[serde(default)]
    pub fallback: bool,
    /// Tokens and cost of the run, sub-runs rolled up, by role and by model.
    #[serde(default)]
    pub report: UsageReport,
    /// The verdicts of the judges that ran on the run (`judge.evaluated`), in order.
    #[serde(default)]
    pub verdicts: Vec<JudgeVerdict>,
    /// The judges that did not run, and why (`guard.checked` with outcome `skipped`).
    #[serde(default)]
    pub skipped_judges: Vec<SkippedJudge>,
    /// Approvals waiting for a human: the run's own (it is `paused`), or those of the sub-runs
    /// it waits for (it is `waiting_child`).
    #[serde(default)]
    pub pending_approvals: Vec<PendingApproval>,
    /// Read without the `read_content` scope only: the content fields that were removed
    /// (`text`, `pending_approvals[0].reason`…, see [`crate::redact::RESULT_CONTENT`]); absent
    /// otherwise. The builder leaves it empty; the masked JSON that [`crate::Redact::view`]
    /// gives (REST, MCP) lists the paths here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redacted: Vec<String>,
    /// The compaction this run triggered, or that ran at its opening (not in the reference's
    /// `RunResult`; absent when there was none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<crate::compaction::CompactionNote>,
}

/// A file of a run (one `artifact.stored`): where it is and what it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunArtifact {
    /// `artifact://<tenant>/<session>/<sha256>.<ext>`: its bytes through `GET
    /// /v1/sessions/{id}/files/{file}`, `loom sessions files` or the MCP resource.
    pub uri: String,
    /// Where it comes from: `attachment`, `tool_output` or `offload`.
    pub origin: String,
    /// MIME type.
    pub media_type: String,
    /// Bytes.
    pub size: u64,
    /// Display name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl From<&ArtifactStored> for RunArtifact {
    fn from(stored: &ArtifactStored) -> RunArtifact {
        RunArtifact {
            uri: stored.uri.clone(),
            origin: stored.origin.clone(),
            media_type: stored.media_type.clone(),
            size: stored.size,
            name: stored.name.clone(),
        }
    }
}

/// One verdict of a judge (a `judge.evaluated` of the run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct JudgeVerdict {
    /// The judge.
    pub judge: String,
    /// What it judged: `output`, or `role:<name>`.
    pub target: String,
    /// Provider model name of the judge.
    pub model_id: String,
    /// Config model id of the judge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// One score per criterion.
    pub criteria: Vec<CriterionVerdict>,
    /// Every criterion reached its threshold.
    pub passed: bool,
    /// A blocking criterion did not.
    pub blocked: bool,
    /// Attempt number (1 for the first judgement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The policy that ran the judge (`loom.judge.<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The role call judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
}

/// A criterion's score in a [`JudgeVerdict`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CriterionVerdict {
    /// Criterion name.
    pub name: String,
    /// Score between 0 and 1.
    pub score: f64,
    /// Threshold.
    pub min_score: f64,
    /// Whether a score under the threshold refuses the output.
    pub blocking: bool,
    /// The judge's explanation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl From<&JudgeEvaluated> for JudgeVerdict {
    fn from(evaluated: &JudgeEvaluated) -> JudgeVerdict {
        JudgeVerdict {
            judge: evaluated.judge.clone(),
            target: evaluated.target.clone(),
            model_id: evaluated.model_id.clone(),
            model: evaluated.model.clone(),
            criteria: evaluated
                .criteria
                .iter()
                .map(|c| CriterionVerdict {
                    name: c.name.clone(),
                    score: c.score,
                    min_score: c.min_score,
                    blocking: c.blocking,
                    reason: c.reason.clone(),
                })
                .collect(),
            passed: evaluated.passed,
            blocked: evaluated.blocked,
            attempt: evaluated.attempt,
            policy: evaluated.policy.clone(),
            call_id: evaluated.call_id.clone(),
        }
    }
}

/// A judge that did not run (a `guard.checked` of guard `judge` with outcome `skipped`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SkippedJudge {
    /// The judge.
    pub judge: String,
    /// What it would have judged: `output`, or `role:<name>`.
    pub target: String,
    /// Why: `caller_skip`, `other_profile`, `tenant_filtered`, `sampled_out`,
    /// `condition_false`, or `judge_error: …` (a judge in error let through by `on_error:
    /// allow`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The role call it would have judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
}

impl SkippedJudge {
    /// The skipped judge a `guard.checked` records, if it records one.
    fn of(checked: &GuardChecked) -> Option<SkippedJudge> {
        if checked.guard != "judge" || checked.outcome != "skipped" {
            return None;
        }
        let judge = checked
            .policy
            .as_deref()
            .and_then(|p| p.strip_prefix(JUDGE_POLICY_PREFIX))
            .unwrap_or_default();
        Some(SkippedJudge {
            judge: judge.to_owned(),
            target: checked.target.clone(),
            reason: checked.reason.clone(),
            call_id: checked.call_id.clone(),
        })
    }
}

/// The judges' policies are named `loom.judge.<name>`.
const JUDGE_POLICY_PREFIX: &str = "loom.judge.";

impl RunResult {
    /// The result of `run_id` from the events of its session (the journal of the whole
    /// session: a run waiting for its sub-runs lists their pending approvals, and its report
    /// rolls their usage up). The one builder of every door.
    ///
    /// `events` may be owned or shared (`Arc<Event>`, as [`Loom::result`](crate::Loom::result)
    /// reads them).
    pub fn from_events<E: Borrow<Event>>(
        run_id: &str,
        events: &[E],
    ) -> Result<RunResult, FoldError> {
        let state = RunState::fold(run_id, events)?;
        let mut pending_approvals = state.pending_approvals();
        if state.status == RunStatus::WaitingChild {
            // The root answers for its tree: `approve` on it decides its sub-runs' requests.
            pending_approvals.extend(loom_engine::descendant_approvals(events, run_id)?);
        }
        let own = || {
            events
                .iter()
                .map(Borrow::borrow)
                .filter(|e: &&Event| e.run_id == run_id)
        };
        let mut artifacts = Vec::new();
        let mut verdicts = Vec::new();
        let mut skipped_judges = Vec::new();
        for event in own() {
            match &event.payload {
                Payload::ArtifactStored(stored) => artifacts.push(RunArtifact::from(stored)),
                Payload::JudgeEvaluated(evaluated) => verdicts.push(evaluated.into()),
                Payload::GuardChecked(checked) => skipped_judges.extend(SkippedJudge::of(checked)),
                _ => {}
            }
        }
        Ok(RunResult {
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
            artifacts,
            data: state.output_data.clone(),
            unverified: state.unverified,
            fallback: state.fallback,
            report: UsageReport::from_events(run_id, events),
            verdicts,
            skipped_judges,
            pending_approvals,
            redacted: Vec::new(),
            compaction: crate::compaction::CompactionNote::of_run(events, run_id),
        })
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

    /// The reference journal of a run paused for an approval, then granted.
    const GRANTED: &str = "reference/journals/approval-granted.jsonl";

    fn events(path: &str) -> Option<Vec<Event>> {
        let text = loom_testkit::shared::text(path)?;
        Some(
            text.lines()
                .map(|line| Event::from_json(line).expect("a reference event"))
                .collect(),
        )
    }

    #[test]
    fn a_terminal_roles_result_is_the_text() {
        let Some(events) = events(TERMINAL_ROLE) else {
            return;
        };
        let result = RunResult::from_events("j3-run", &events).expect("the run folds");
        assert!(result.ok());
        assert_eq!(
            result.text,
            "Objet : votre devis D-2026-042\n\nBonjour Madame Martin, devis D-2026-042 de 1 840 €."
        );
        // The report is the run's usage report, whatever its shape.
        assert_eq!(result.report, UsageReport::from_events("j3-run", &events));
        assert_ne!(result.report, UsageReport::default());
    }

    /// Every field of the reference's `RunResult` is written, as the reference writes it
    /// (`exclude_none`: fields without a value are left out; empty lists and `false` stay).
    #[test]
    fn the_result_has_the_references_fields() {
        let Some(events) = events(GRANTED) else {
            return;
        };
        let paused = RunResult::from_events("appr-run-1", &events[..12]).unwrap();
        let json = serde_json::to_value(&paused).unwrap();
        let keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "run_id",
                "session_id",
                "agent",
                "status",
                "text",
                "iterations",
                "usage",
                "cost_usd",
                "artifacts",
                "unverified",
                "fallback",
                "report",
                "verdicts",
                "skipped_judges",
                "pending_approvals"
            ]
        );
        assert_eq!(
            json["pending_approvals"][0],
            serde_json::json!({
                "call_id": "fake_0_0",
                "tool_name": "calculer",
                "arguments": {"expr": "12*7+3"},
                "reason": "outil déclaré à approbation obligatoire (effets : irreversible)",
                "scope": "approve",
                "expire_at": "2026-11-30T11:57:04.201200Z",
                "run_id": "appr-run-1",
                "session_id": "appr-sess",
                "tenant_id": "default"
            })
        );
        let done =
            serde_json::to_value(RunResult::from_events("appr-run-1", &events).unwrap()).unwrap();
        assert_eq!(
            done["output"]["blocks"][0]["text"],
            "12 fois 7, plus 3, font 87."
        );
        assert_eq!(
            done["report"],
            serde_json::to_value(UsageReport::from_events("appr-run-1", &events)).unwrap()
        );
        assert_eq!(done["pending_approvals"], serde_json::json!([]));
    }
}
