//! Approvals asked to the user through MCP elicitation — never through a tool.
//!
//! When a run pauses on an approval and the client can show a form, each waiting call is put to
//! the user as `{decision: approve|reject, reason?}`; the answer is journaled with
//! `by = "mcp:<client name>"` and the run goes on. A client that cannot show forms (or a user
//! who dismisses the form) leaves the run paused, for the REST API or `loom approve`.

use loom_ia::{Loom, LoomError, PendingApproval, RunRef};
use rmcp::model::{ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema};
use serde_json::{Value, json};

/// The user's answer to one approval form.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    /// Run the call.
    Approve(Option<String>),
    /// Do not run it; the reason goes to the model.
    Reject(Option<String>),
    /// No decision (the form was dismissed or unreadable): the call keeps waiting.
    Undecided,
}

/// The form asking for a decision on `pending`.
pub(crate) fn form(pending: &PendingApproval) -> ElicitRequestParams {
    let schema = json!({
        "type": "object",
        "properties": {
            "decision": {
                "type": "string",
                "title": "Decision",
                "description": "approve runs the call; reject refuses it (the agent is told why)",
                "enum": ["approve", "reject"],
            },
            "reason": {"type": "string", "title": "Reason", "description": "Why (journaled)"},
        },
        "required": ["decision"],
    });
    let requested_schema = match schema {
        Value::Object(object) => ElicitationSchema::from_json_schema(object).ok(),
        _ => None,
    }
    .unwrap_or_else(|| {
        ElicitationSchema::builder()
            .required_string("decision")
            .build_unchecked()
    });
    ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: format!(
            "The agent asks to call {} with {} ({}). Approve this call?",
            pending.tool_name, pending.arguments, pending.reason
        ),
        requested_schema,
    }
}

/// Reads the user's answer.
pub(crate) fn answer(result: &ElicitResult) -> Answer {
    match result.action {
        ElicitationAction::Accept => {
            let content = result.content.as_ref();
            let reason = content
                .and_then(|c| c.get("reason"))
                .and_then(Value::as_str)
                .filter(|r| !r.trim().is_empty())
                .map(str::to_owned);
            match content
                .and_then(|c| c.get("decision"))
                .and_then(Value::as_str)
            {
                Some("approve") => Answer::Approve(reason),
                Some("reject") => Answer::Reject(reason),
                _ => Answer::Undecided,
            }
        }
        // The user refused to answer: the call does not run.
        ElicitationAction::Decline => {
            Answer::Reject(Some("the user declined to approve the call".to_owned()))
        }
        _ => Answer::Undecided,
    }
}

/// Journals `answer` for the call `call_id` that `root` (or one of its sub-runs) waits for,
/// without driving the run; `true` when a decision was written.
pub(crate) async fn decide(
    loom: &Loom,
    root: &RunRef,
    call_id: &str,
    answer: &Answer,
    by: &str,
) -> Result<bool, LoomError> {
    match answer {
        Answer::Approve(reason) => {
            loom.approve(root, Some(call_id), by, reason.as_deref(), None, true)
                .await?;
            Ok(true)
        }
        Answer::Reject(reason) => {
            loom.reject(root, Some(call_id), by, reason.as_deref(), true)
                .await?;
            Ok(true)
        }
        Answer::Undecided => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(action: ElicitationAction, content: Option<Value>) -> ElicitResult {
        let result = ElicitResult::new(action);
        match content {
            Some(content) => result.with_content(content),
            None => result,
        }
    }

    #[test]
    fn answers_are_read() {
        assert_eq!(
            answer(&result(
                ElicitationAction::Accept,
                Some(json!({"decision": "approve", "reason": "ok"}))
            )),
            Answer::Approve(Some("ok".into()))
        );
        assert_eq!(
            answer(&result(
                ElicitationAction::Accept,
                Some(json!({"decision": "reject"}))
            )),
            Answer::Reject(None)
        );
        assert_eq!(
            answer(&result(
                ElicitationAction::Accept,
                Some(json!({"decision": "maybe"}))
            )),
            Answer::Undecided
        );
        assert!(matches!(
            answer(&result(ElicitationAction::Decline, None)),
            Answer::Reject(Some(_))
        ));
        assert_eq!(
            answer(&result(ElicitationAction::Cancel, None)),
            Answer::Undecided
        );
    }

    #[test]
    fn the_form_asks_for_a_decision() {
        let pending = PendingApproval {
            call_id: "c1".into(),
            tool_name: "virement".into(),
            arguments: json!({"montant": 1250}),
            reason: "approval: always".into(),
            policy: None,
            scope: "approve".into(),
            expire_at: None,
            run_id: "r1".into(),
            session_id: "s1".into(),
            tenant_id: "default".into(),
        };
        let ElicitRequestParams::FormElicitationParams {
            message,
            requested_schema,
            ..
        } = form(&pending)
        else {
            panic!("a form");
        };
        assert!(message.contains("virement"), "{message}");
        let schema = serde_json::to_value(&requested_schema).unwrap();
        assert_eq!(
            schema["properties"]["decision"]["enum"],
            json!(["approve", "reject"])
        );
        assert_eq!(schema["required"], json!(["decision"]));
    }
}
