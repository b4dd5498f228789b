//! What a reader without the `read_content` scope sees: every read that returns content has
//! its content fields removed and lists them in `redacted` (JSON paths of what was removed).
//!
//! The content fields, in one place:
//!
//! - events: per payload type, [`loom_core::event::Payload::content_fields`] (messages, model
//!   answers, tool arguments and results, run outputs and data, error texts, approval and
//!   policy reasons, file names), removed from `payload` (`payload.message`);
//! - run results ([`RunResult`]): [`RESULT_CONTENT`];
//! - traces ([`Trace`]): [`TRACE_CONTENT`], and in its spans and span events the attributes
//!   [`CONTENT_ATTRIBUTES`](crate::report::CONTENT_ATTRIBUTES) (listed as
//!   `spans[3].attributes["gen_ai.tool.call.result"]`); a masked trace also says
//!   `content: false`;
//! - sessions ([`SessionInfo`]): [`SESSION_CONTENT`];
//! - session files ([`SessionFile`]): [`FILE_CONTENT`];
//! - usage reports ([`UsageReport`]): [`REPORT_CONTENT`], none.
//!
//! Ids, types, statuses, counters, usage, costs, latencies, model and tool names are not
//! content and stay. A path is a chain of keys separated by `.`, `key[]` standing for every
//! element of the array `key`; `redacted` lists concrete paths (`pending_approvals[0].reason`)
//! of the fields that held something, and is absent when nothing was removed.

use serde::Serialize;
use serde_json::Value;

use loom_core::{
    Event,
    redact::{mark_redacted, redact_event, remove_paths},
};

use crate::{RunResult, SessionFile, SessionInfo, Trace, UsageReport};

/// Content fields of a [`RunResult`]: the answer (`text`, `output`, `data`), the failure
/// message, the files' display names, the judges' explanations and why a judge was skipped
/// (as in their events: `artifact.stored.name`, `judge.evaluated.criteria[].reason`,
/// `guard.checked.reason`), and what waiting approvals would run with and why.
pub const RESULT_CONTENT: &[&str] = &[
    "text",
    "output",
    "data",
    "error",
    "artifacts[].name",
    "verdicts[].criteria[].reason",
    "skipped_judges[].reason",
    "pending_approvals[].arguments",
    "pending_approvals[].reason",
];

/// Content fields of a [`Trace`] outside its spans: the answer. In the spans, the content is
/// in the attributes [`CONTENT_ATTRIBUTES`](crate::report::CONTENT_ATTRIBUTES) (model texts
/// and tool calls, tool arguments and results, reasons, errors, the run's request).
pub const TRACE_CONTENT: &[&str] = &["output"];

/// Content fields of a [`SessionInfo`]: what waiting approvals would run with and why.
pub const SESSION_CONTENT: &[&str] = &[
    "pending_approvals[].arguments",
    "pending_approvals[].reason",
];

/// Content fields of a [`SessionFile`]: its display name (an attachment's file name). The
/// bytes themselves need `read_content` to be read at all.
pub const FILE_CONTENT: &[&str] = &["name"];

/// Content fields of a usage report ([`UsageReport`]): none. A report holds
/// ids, agent, slot and model names, call counts, tokens and costs, which any reader with the
/// `read` scope sees; a field of content added to a report must be listed here.
pub const REPORT_CONTENT: &[&str] = &[];

/// A value read through an access path (REST, MCP) that can be shown without its content.
pub trait Redact {
    /// The value as JSON without its content fields, plus `redacted` when some were removed.
    fn redacted(&self) -> Value;

    /// The value as JSON: whole when the reader may read content, else [`Redact::redacted`].
    fn view(&self, read_content: bool) -> Value
    where
        Self: Serialize,
    {
        if read_content {
            serde_json::to_value(self).unwrap_or(Value::Null)
        } else {
            self.redacted()
        }
    }
}

fn without(value: &impl Serialize, content: &[&str]) -> Value {
    let mut json = serde_json::to_value(value).unwrap_or(Value::Null);
    let removed = remove_paths(&mut json, content, "");
    mark_redacted(&mut json, removed);
    json
}

impl Redact for Event {
    fn redacted(&self) -> Value {
        redact_event(self)
    }
}

impl Redact for RunResult {
    fn redacted(&self) -> Value {
        without(self, RESULT_CONTENT)
    }
}

impl Redact for Trace {
    fn redacted(&self) -> Value {
        let mut trace = self.clone();
        let removed = trace.strip();
        let mut json = serde_json::to_value(&trace).unwrap_or(Value::Null);
        mark_redacted(&mut json, removed);
        json
    }
}

impl Redact for SessionInfo {
    fn redacted(&self) -> Value {
        without(self, SESSION_CONTENT)
    }
}

impl Redact for SessionFile {
    fn redacted(&self) -> Value {
        without(self, FILE_CONTENT)
    }
}

impl Redact for UsageReport {
    fn redacted(&self) -> Value {
        without(self, REPORT_CONTENT)
    }
}

#[cfg(test)]
mod tests {
    use loom_core::{Message, RunStatus, Usage, approval::PendingApproval};
    use serde_json::json;

    use super::*;
    use crate::{CriterionVerdict, JudgeVerdict, RunArtifact, SkippedJudge};

    #[test]
    fn a_result_keeps_its_metadata_and_lists_what_went() {
        let result = RunResult {
            run_id: "r1".into(),
            session_id: "s1".into(),
            agent: "devis".into(),
            status: RunStatus::Paused,
            text: "secret answer".into(),
            output: Some(Message::assistant("secret answer")),
            error_type: None,
            error: None,
            iterations: 2,
            usage: Usage::default(),
            cost_usd: 0.5,
            artifacts: vec![RunArtifact {
                uri: "artifact://default/s1/ab.png".into(),
                origin: "tool_output".into(),
                media_type: "image/png".into(),
                size: 12,
                name: Some("secret-plan.png".into()),
            }],
            data: None,
            unverified: false,
            fallback: false,
            report: UsageReport::default(),
            verdicts: vec![JudgeVerdict {
                judge: "ton".into(),
                target: "output".into(),
                model_id: "FAKE".into(),
                model: None,
                criteria: vec![CriterionVerdict {
                    name: "poli".into(),
                    score: 0.9,
                    min_score: 0.5,
                    blocking: true,
                    reason: Some("secret explanation".into()),
                }],
                passed: true,
                blocked: false,
                attempt: Some(1),
                policy: None,
                call_id: None,
            }],
            skipped_judges: vec![SkippedJudge {
                judge: "faits".into(),
                target: "output".into(),
                reason: Some("judge_error: secret quoted".into()),
                call_id: None,
            }],
            pending_approvals: vec![PendingApproval {
                call_id: "c1".into(),
                tool_name: "envoyer".into(),
                arguments: json!({"client": "secret"}),
                reason: "secret reason".into(),
                policy: None,
                scope: "approve".into(),
                expire_at: None,
                run_id: "r1".into(),
                session_id: "s1".into(),
                tenant_id: "default".into(),
            }],
            redacted: Vec::new(),
            compaction: None,
        };
        let masked = result.view(false);
        assert!(!masked.to_string().contains("secret"), "{masked}");
        assert_eq!(
            masked["redacted"],
            json!([
                "text",
                "output",
                "artifacts[0].name",
                "verdicts[0].criteria[0].reason",
                "skipped_judges[0].reason",
                "pending_approvals[0].arguments",
                "pending_approvals[0].reason"
            ])
        );
        assert_eq!(
            masked["artifacts"][0]["uri"],
            "artifact://default/s1/ab.png"
        );
        assert_eq!(masked["verdicts"][0]["criteria"][0]["score"], 0.9);
        assert_eq!(masked["skipped_judges"][0]["judge"], "faits");
        assert_eq!(masked["pending_approvals"][0]["tool_name"], "envoyer");
        assert_eq!(
            (masked["iterations"].clone(), masked["cost_usd"].clone()),
            (json!(2), json!(0.5))
        );
        assert_eq!(result.view(true), serde_json::to_value(&result).unwrap());
    }
}
