//! Human approval: what is asked, what a human (or an inline approver) answers, and how the
//! run-state projection records each request until it is settled.
//!
//! A call whose tool is declared `approval: always` (or an interrupted unsafe call of a tool
//! declared `on_unknown: pause`) is not launched: `approval.requested` is journaled and the run
//! pauses. A decision (`approval.granted`, `approval.rejected`, or `approval.expired` once its
//! `expire_at` has passed) settles the last request of that call; a grant covers exactly one
//! launch.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{BoxFuture, event::ApprovalRequested};

/// A request waiting for a decision, as an approver or a caller sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PendingApproval {
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool_name: String,
    /// The arguments the call would run with.
    pub arguments: Value,
    /// Why a human is asked.
    pub reason: String,
    /// The policy that asked (`before_tool` `pause`); absent when the tool's declaration did
    /// (`approval: always`, `on_unknown: pause`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// What the decision allows: `approve` (running the call).
    #[serde(default = "approve_scope")]
    pub scope: String,
    /// When the request expires (absent: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_at: Option<DateTime<Utc>>,
    /// The run.
    pub run_id: String,
    /// Its session.
    pub session_id: String,
    /// Its tenant.
    pub tenant_id: String,
}

fn approve_scope() -> String {
    APPROVE_SCOPE.to_owned()
}

/// The scope of every approval request: a decision allows (or refuses) running the call.
pub const APPROVE_SCOPE: &str = "approve";

impl PendingApproval {
    /// The request journaled in `requested`, of the run `run_id` of `session_id` in
    /// `tenant_id`: its fields as the journal has them.
    pub fn requested(
        requested: &ApprovalRequested,
        run_id: &str,
        session_id: &str,
        tenant_id: &str,
    ) -> PendingApproval {
        PendingApproval {
            call_id: requested.call_id.clone(),
            tool_name: requested.tool_name.clone(),
            arguments: requested.arguments.clone(),
            reason: requested.reason.clone(),
            policy: requested.policy.clone(),
            scope: requested.scope.clone(),
            expire_at: requested.expire_at,
            run_id: run_id.to_owned(),
            session_id: session_id.to_owned(),
            tenant_id: tenant_id.to_owned(),
        }
    }
}

/// What an approver answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Run the call, with corrected `arguments` when given (checked against the tool's
    /// schema; the journal's `tool.called` keeps what the model wrote).
    Approved {
        /// Who decided.
        by: String,
        /// Why.
        reason: Option<String>,
        /// Corrected arguments.
        arguments: Option<Value>,
    },
    /// Do not run the call: the model is told, with the reason.
    Rejected {
        /// Who decided.
        by: String,
        /// Why (given to the model).
        reason: Option<String>,
    },
}

impl Decision {
    /// Approved by `by`, as the model wrote the call.
    pub fn approved(by: impl Into<String>) -> Decision {
        Decision::Approved {
            by: by.into(),
            reason: None,
            arguments: None,
        }
    }

    /// Rejected by `by` for `reason`.
    pub fn rejected(by: impl Into<String>, reason: impl Into<String>) -> Decision {
        Decision::Rejected {
            by: by.into(),
            reason: Some(reason.into()),
        }
    }
}

/// Decides approvals inside the run loop, without pausing (scripts, tests, a chat front end):
/// the request and the decision are still journaled.
///
/// Any `Fn(PendingApproval) -> impl Future<Output = Decision>` is an approver.
pub trait Approver: Send + Sync {
    /// Decides one request.
    fn decide(&self, pending: PendingApproval) -> BoxFuture<'_, Decision>;
}

impl<F, Fut> Approver for F
where
    F: Fn(PendingApproval) -> Fut + Send + Sync,
    Fut: std::future::Future<Output = Decision> + Send + 'static,
{
    fn decide(&self, pending: PendingApproval) -> BoxFuture<'_, Decision> {
        Box::pin(self(pending))
    }
}

/// Where a request stands.
#[derive(Debug, Clone, PartialEq)]
pub enum ApprovalStatus {
    /// Waiting for a decision.
    Pending,
    /// Granted.
    Granted,
    /// Rejected.
    Rejected,
    /// Expired; `action` is "deny" or "fail".
    Expired {
        /// What the expiry does.
        action: String,
    },
}

/// One `approval.requested` of a run and what became of it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRecord {
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool_name: String,
    /// The arguments shown to the human.
    pub arguments: Value,
    /// Why a human was asked.
    pub reason: String,
    /// The policy that asked, if a policy did.
    pub policy: Option<String>,
    /// What the decision allows (`approve`).
    pub scope: String,
    /// When it expires.
    pub expire_at: Option<DateTime<Utc>>,
    /// Where it stands.
    pub status: ApprovalStatus,
    /// Who decided.
    pub by: Option<String>,
    /// The decision's reason.
    pub decision_reason: Option<String>,
    /// Corrected arguments of a grant.
    pub granted_arguments: Option<Value>,
    /// Whether the granted call was launched (a grant covers one launch).
    pub launched: bool,
    /// Span of the request (decisions are written in it).
    pub span_id: String,
    /// Parent span of the request.
    pub parent_span_id: Option<String>,
}

impl ApprovalRecord {
    /// Whether it waits for a decision.
    pub fn is_pending(&self) -> bool {
        self.status == ApprovalStatus::Pending
    }

    /// Whether it waits and its deadline has passed at `now`.
    pub fn is_stale(&self, now: DateTime<Utc>) -> bool {
        self.is_pending() && self.expire_at.is_some_and(|at| at <= now)
    }
}

/// The message given to the model for a rejected call.
pub fn rejection_message(tool_name: &str, by: &str, reason: Option<&str>) -> String {
    let reason = match reason.map(str::trim).filter(|r| !r.is_empty()) {
        Some(reason) => format!(": {reason}"),
        None => String::new(),
    };
    format!(
        "Call to {tool_name} rejected by {by}{reason}. This is a decision, not a failure: do not \
         make this call again; tell the user what was refused and why."
    )
}

/// The message given to the model for a call whose request expired (`on_expiry: deny`).
pub fn expiry_message(tool_name: &str, expire_at: Option<DateTime<Utc>>) -> String {
    let when = expire_at
        .map(|at| {
            format!(
                " at {}",
                at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )
        })
        .unwrap_or_default();
    format!(
        "Call to {tool_name} not run: the approval request expired{when} without a decision. \
         Tell the user it was not done."
    )
}

/// What an expired request does (`approval.on_expiry`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OnExpiry {
    /// The call is not run; the model is told.
    #[default]
    Deny,
    /// The run fails (`error_type` "approval.expired").
    Fail,
}

impl OnExpiry {
    /// The journal string.
    pub fn as_str(self) -> &'static str {
        match self {
            OnExpiry::Deny => "deny",
            OnExpiry::Fail => "fail",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        Event, RunState, RunStatus,
        content::BlockKind,
        event::{ApprovalGranted, ApprovalRejected, Payload},
    };

    const GRANTED: &str = "reference/journals/approval-granted.jsonl";
    const REJECTED: &str = "reference/journals/approval-rejected.jsonl";

    /// The lines of a reference journal of `../shared`; `None` (the test is skipped) on a
    /// clone without it.
    fn lines(path: &str) -> Option<Vec<String>> {
        let text = loom_testkit::shared::text(path)?;
        let lines = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect();
        Some(lines)
    }

    fn read(path: &str) -> Option<Vec<Event>> {
        let events = lines(path)?
            .iter()
            .map(|l| Event::from_json(l).unwrap_or_else(|e| panic!("{path}: {e}")))
            .collect();
        Some(events)
    }

    #[test]
    fn reference_approval_events_round_trip_byte_for_byte() {
        for path in [GRANTED, REJECTED] {
            let Some(lines) = lines(path) else {
                return;
            };
            for line in lines {
                if line.contains(r#""category":"approval""#) {
                    assert_eq!(Event::from_json(&line).unwrap().to_json(), line);
                }
            }
        }
    }

    #[test]
    fn reference_approval_runs_fold_through_paused_to_completed() {
        let Some(events) = read(GRANTED) else {
            return;
        };
        let paused = RunState::fold("appr-run-1", &events[..12]).unwrap();
        assert_eq!(paused.status, RunStatus::Paused);
        assert_eq!(paused.pending_approvals().len(), 1);
        assert_eq!(paused.pending_approvals()[0].tool_name, "calculer");
        let state = RunState::fold("appr-run-1", &events).unwrap();
        assert_eq!(state.status, RunStatus::Completed);
        assert!(state.pending_approvals().is_empty());
        assert_eq!(state.approvals[0].status, ApprovalStatus::Granted);
        assert!(state.approvals[0].launched);

        let Some(events) = read(REJECTED) else {
            return;
        };
        let state = RunState::fold("appr-run-2", &events).unwrap();
        assert_eq!(state.status, RunStatus::Completed);
        assert_eq!(state.approvals[0].status, ApprovalStatus::Rejected);
        assert_eq!(state.approvals[0].by.as_deref(), Some("denis"));
        assert!(!state.approvals[0].launched);
    }

    /// `payload` in the envelope of `event` (another event id).
    fn with_payload(event: Event, payload: Payload) -> Event {
        Event::new(
            crate::event::Envelope {
                event_id: format!("{}-x", event.event_id),
                ts: event.ts,
                tenant_id: event.tenant_id,
                session_id: event.session_id,
                run_id: event.run_id,
                root_run_id: event.root_run_id,
                span_id: event.span_id,
                parent_span_id: event.parent_span_id,
                agent: event.agent,
                role: None,
            },
            payload,
        )
    }

    #[test]
    fn decisions_without_request_or_twice_are_refused() {
        let Some(events) = read(GRANTED) else {
            return;
        };
        let granted = events[12].clone();
        // A decision before any request.
        let mut early = RunState::fold("appr-run-1", &events[..8]).unwrap();
        assert!(
            early
                .apply(&granted)
                .unwrap_err()
                .reason
                .contains("without a request")
        );
        // A second decision on the same request.
        let mut state = RunState::fold("appr-run-1", &events[..13]).unwrap();
        let again = with_payload(
            granted.clone(),
            Payload::ApprovalRejected(ApprovalRejected {
                call_id: "fake_0_0".into(),
                tool_name: "calculer".into(),
                by: "denis".into(),
                reason: None,
            }),
        );
        assert!(
            state
                .apply(&again)
                .unwrap_err()
                .reason
                .contains("already decided")
        );
    }

    #[test]
    fn a_grant_with_arguments_rewrites_the_call_in_the_conversation() {
        let Some(events) = read(GRANTED) else {
            return;
        };
        let mut state = RunState::fold("appr-run-1", &events[..12]).unwrap();
        let corrected = serde_json::json!({"expr": "2+2"});
        let grant = with_payload(
            events[12].clone(),
            Payload::ApprovalGranted(ApprovalGranted {
                call_id: "fake_0_0".into(),
                tool_name: "calculer".into(),
                by: "denis".into(),
                reason: None,
                arguments: Some(corrected.clone()),
            }),
        );
        state.apply(&grant).unwrap();
        let shown = state
            .conversation()
            .iter()
            .flat_map(|m| m.blocks.clone())
            .find_map(|b| match b.kind {
                BlockKind::ToolCall { arguments, .. } => Some(arguments),
                _ => None,
            })
            .unwrap();
        assert_eq!(shown, corrected);
        // What the model wrote stays on the pending call (and in `tool.called`).
        assert_eq!(
            state.pending_calls[0].arguments,
            serde_json::json!({"expr": "12*7+3"})
        );
        assert_eq!(state.approvals[0].granted_arguments, Some(corrected));
    }

    #[test]
    fn a_decision_after_the_run_closed_is_ignored() {
        let Some(events) = read(GRANTED) else {
            return;
        };
        let mut state = RunState::fold("appr-run-1", &events).unwrap();
        let late = with_payload(
            events[12].clone(),
            Payload::ApprovalRejected(ApprovalRejected {
                call_id: "fake_0_0".into(),
                tool_name: "calculer".into(),
                by: "denis".into(),
                reason: None,
            }),
        );
        assert!(state.apply(&late).is_ok());
        assert_eq!(state.status, RunStatus::Completed);
    }

    /// A pending approval carries the request's fields as the reference's `approval.requested`
    /// has them (`policy`, `scope`, `expire_at`), left out when they have no value.
    #[test]
    fn a_pending_approval_carries_the_requests_fields() {
        let Some(events) = read(GRANTED) else {
            return;
        };
        let paused = RunState::fold("appr-run-1", &events[..12]).unwrap();
        let pending = &paused.pending_approvals()[0];
        assert_eq!(pending.scope, "approve");
        assert_eq!(pending.policy, None);
        assert_eq!(
            serde_json::to_value(pending).unwrap(),
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
        let Payload::ApprovalRequested(mut requested) = events[8].payload.clone() else {
            panic!("approval.requested is the 9th event");
        };
        requested.policy = Some("plafond".into());
        requested.expire_at = None;
        let by_policy = PendingApproval::requested(&requested, "r", "s", "t");
        let json = serde_json::to_value(&by_policy).unwrap();
        assert_eq!(json["policy"], "plafond");
        assert!(json.get("expire_at").is_none(), "{json}");
        let back: PendingApproval = serde_json::from_value(json).unwrap();
        assert_eq!(back, by_policy);
    }

    #[test]
    fn rejection_and_expiry_messages_name_the_decision() {
        assert_eq!(
            rejection_message("send", "denis", Some("non")),
            "Call to send rejected by denis: non. This is a decision, not a failure: do not make \
             this call again; tell the user what was refused and why."
        );
        assert!(
            rejection_message("send", "denis", None).starts_with("Call to send rejected by denis.")
        );
        assert!(expiry_message("send", None).contains("expired"));
    }
}
