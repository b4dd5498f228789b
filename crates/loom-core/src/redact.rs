//! Content fields: what a reader without the `read_content` scope must not see, and how a
//! read removes it.
//!
//! *Content* is what people or models wrote, or what tools returned: messages, model answers,
//! tool arguments and results, run outputs and structured data, error texts that may quote
//! them, approval and policy reasons, file names. Everything else (ids, types, statuses,
//! counters, usage, costs, latencies, model and tool names) is *metadata* and stays readable.
//!
//! Each payload type names its content fields in [`Payload::content_fields`] (an exhaustive
//! match, so a new payload type must decide); the types built on top of the journal (run
//! results, traces, session views, in `loom-ia`) list theirs next to this list and use
//! [`remove_paths`]. A masked value loses those fields and gains `redacted`, the JSON paths of
//! what was removed.
//!
//! A *path* is a chain of object keys separated by `.`, where `key[]` means every element of
//! the array under `key` (`criteria[].reason`). The paths listed in `redacted` are concrete:
//! `payload.criteria[0].reason`.

use serde_json::{Map, Value};

use crate::event::{Event, Payload};

impl Payload {
    /// The payload's content fields, as paths inside the payload.
    ///
    /// | type | content |
    /// |---|---|
    /// | `run.started` | `context.metadata`, `state` |
    /// | `run.completed` | `output`, `data` |
    /// | `run.failed` | `error` |
    /// | `message.user`, `model.responded` | `message` |
    /// | `model.retried`, `model.fell_back`, `circuit.opened`, `tool.source_unavailable`, `session.repaired` | `error` |
    /// | `model.exchanged` | `request_headers`, `request_body`, `response_headers`, `response_body`, `error` |
    /// | `tool.called` | `arguments` |
    /// | `tool.completed` | `output` |
    /// | `artifact.stored` | `name` |
    /// | `approval.requested`, `approval.granted` | `arguments`, `reason` |
    /// | `approval.rejected` | `reason` |
    /// | `idempotency.recorded` | `result` |
    /// | `policy.decided` | `reason`, `arguments`, `output` |
    /// | `guard.checked` | `reason` |
    /// | `judge.evaluated` | `criteria[].reason` |
    ///
    /// The other types (`step.*`, `run.transitioned`, `run.cancelled`, `run.claimed`,
    /// `approval.expired`, `idempotency.reused`, `budget.exceeded`, `session.trimmed`,
    /// `tool.source_opened`) hold no content.
    pub fn content_fields(&self) -> &'static [&'static str] {
        match self {
            Payload::RunStarted(_) => &["context.metadata", "state"],
            Payload::RunCompleted(_) => &["output", "data"],
            Payload::RunFailed(_) => &["error"],
            Payload::MessageUser(_) | Payload::ModelResponded(_) => &["message"],
            Payload::ModelRetried(_)
            | Payload::ModelFellBack(_)
            | Payload::CircuitOpened(_)
            | Payload::ToolSourceUnavailable(_)
            | Payload::SessionRepaired(_) => &["error"],
            Payload::ModelExchanged(_) => &[
                "request_headers",
                "request_body",
                "response_headers",
                "response_body",
                "error",
            ],
            Payload::ToolCalled(_) => &["arguments"],
            Payload::ToolCompleted(_) => &["output"],
            Payload::ArtifactStored(_) => &["name"],
            Payload::SessionSnapshot(_) => &["messages", "state"],
            Payload::SessionCompacted(_) => &["summary"],
            Payload::ApprovalRequested(_) | Payload::ApprovalGranted(_) => &["arguments", "reason"],
            Payload::ApprovalRejected(_) => &["reason"],
            Payload::IdempotencyRecorded(_) => &["result"],
            Payload::PolicyDecided(_) => &["reason", "arguments", "output"],
            Payload::GuardChecked(_) => &["reason"],
            Payload::JudgeEvaluated(_) => &["criteria[].reason"],
            Payload::StepStarted(_)
            | Payload::StepCompleted(_)
            | Payload::RunTransitioned(_)
            | Payload::RunCancelled(_)
            | Payload::RunClaimed(_)
            | Payload::ApprovalExpired(_)
            | Payload::IdempotencyReused(_)
            | Payload::BudgetExceeded(_)
            | Payload::SessionTrimmed(_)
            // The tools' declarations come from configured servers, not from a conversation.
            | Payload::ToolSourceOpened(_) => &[],
            // Never handed to a reader (the sealing journal opens it); ciphertext all the same.
            Payload::Sealed(_) => &["sealed"],
        }
    }
}

/// Removes every field of `paths` from `value` and returns the concrete paths of those that
/// held something (not `null`, `""`, `{}` or `[]`), each prefixed with `prefix` (`"payload."`, or `""`), in the
/// order found. A path that does not exist in `value` is skipped.
pub fn remove_paths(value: &mut Value, paths: &[&str], prefix: &str) -> Vec<String> {
    let mut removed = Vec::new();
    for path in paths {
        let segments: Vec<&str> = path.split('.').collect();
        remove(value, &segments, prefix.to_owned(), &mut removed);
    }
    removed
}

fn remove(value: &mut Value, segments: &[&str], at: String, removed: &mut Vec<String>) {
    let Some((first, rest)) = segments.split_first() else {
        return;
    };
    let Value::Object(object) = value else {
        return;
    };
    match first.strip_suffix("[]") {
        Some(key) => {
            if let Some(Value::Array(items)) = object.get_mut(key) {
                for (index, item) in items.iter_mut().enumerate() {
                    let at = format!("{at}{key}[{index}].");
                    remove(item, rest, at, removed);
                }
            }
        }
        None if rest.is_empty() => {
            if let Some(gone) = object.remove(*first)
                && !is_empty(&gone)
            {
                removed.push(format!("{at}{first}"));
            }
        }
        None => {
            if let Some(inner) = object.get_mut(*first) {
                remove(inner, rest, format!("{at}{first}."), removed);
            }
        }
    }
}

/// Whether a removed value held nothing: `null`, `""`, `{}` or `[]`.
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(text) => text.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(object) => object.is_empty(),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

/// Adds `redacted: [paths]` to an object when something was removed.
pub fn mark_redacted(value: &mut Value, redacted: Vec<String>) {
    if redacted.is_empty() {
        return;
    }
    if let Value::Object(object) = value {
        object.insert(
            "redacted".into(),
            Value::Array(redacted.into_iter().map(Value::String).collect()),
        );
    }
}

/// `event` as JSON without its content: the payload's [content fields](Payload::content_fields)
/// removed, and `redacted` listing them (`payload.message`) when there were any. The envelope
/// (ids, type, status, agent, facets, seq) is kept whole: facets hold no content.
pub fn redact_event(event: &Event) -> Value {
    let mut value = serde_json::to_value(event).unwrap_or_else(|_| Value::Object(Map::new()));
    let mut redacted = Vec::new();
    if let Some(payload) = value.get_mut("payload") {
        redacted = remove_paths(payload, event.payload.content_fields(), "payload.");
    }
    mark_redacted(&mut value, redacted);
    value
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn paths_are_removed_through_objects_and_arrays() {
        let mut value = json!({
            "a": {"b": "secret", "c": 1},
            "list": [{"reason": "why", "score": 1}, {"reason": null, "score": 2}, {"score": 3}],
            "gone": null,
            "empty": {},
        });
        let removed = remove_paths(
            &mut value,
            &["a.b", "list[].reason", "gone", "empty", "absent.x"],
            "",
        );
        assert_eq!(removed, vec!["a.b", "list[0].reason"]);
        assert_eq!(
            value,
            json!({"a": {"c": 1}, "list": [{"score": 1}, {"score": 2}, {"score": 3}]})
        );
    }

    #[test]
    fn an_event_loses_its_content_and_lists_it() {
        let line = r#"{"event_id":"01a2272b-2a5d-7c60-ae0f-8690fd14d194","ts":"2026-11-29T11:57:50.044443Z","schema_version":1,"tenant_id":"default","session_id":"s","run_id":"r","root_run_id":"r","span_id":"x","parent_span_id":null,"type":"tool.called","category":"tool","status":"ok","agent":"demo","role":null,"facets":{"tool_name":"calculer","tool_kind":"python"},"payload":{"type":"tool.called","call_id":"c1","tool_name":"calculer","tool_kind":"python","arguments":{"expr":"secret"},"refs":[],"resumed":false,"child_run_id":null},"seq":9}"#;
        let event = Event::from_json(line).unwrap();
        let masked = redact_event(&event);
        assert_eq!(masked["redacted"], json!(["payload.arguments"]));
        assert!(masked["payload"].get("arguments").is_none());
        assert_eq!(masked["payload"]["tool_name"], "calculer");
        assert_eq!(
            masked["facets"],
            serde_json::to_value(&event.facets).unwrap()
        );
        assert!(!masked.to_string().contains("secret"));
    }

    /// On the reference journal of an approved call, masking leaves none of the texts of the
    /// conversation (question, answers, arguments, result, approval reason), and keeps the
    /// metadata.
    #[test]
    fn a_masked_reference_journal_holds_no_content() {
        let Some(text) = loom_testkit::shared::text("reference/journals/approval-granted.jsonl")
        else {
            return;
        };
        let mut redacted = Vec::new();
        for line in text.lines() {
            let event = Event::from_json(line).unwrap();
            let masked = redact_event(&event);
            let json = masked.to_string();
            for content in [
                "12 × 7",
                "Je calcule",
                "12*7+3",
                "\"87\"",
                "font 87",
                "approbation",
            ] {
                assert!(
                    !json.contains(content),
                    "{} kept {content}: {json}",
                    event.event_type
                );
            }
            assert_eq!(masked["seq"], event.seq);
            assert_eq!(masked["type"], event.event_type.as_str());
            if let Some(paths) = masked.get("redacted") {
                redacted.push(format!("{} {}", event.event_type, paths));
            }
        }
        assert_eq!(
            redacted,
            vec![
                r#"message.user ["payload.message"]"#,
                r#"model.responded ["payload.message"]"#,
                r#"approval.requested ["payload.arguments","payload.reason"]"#,
                r#"approval.granted ["payload.reason"]"#,
                r#"tool.called ["payload.arguments"]"#,
                r#"tool.completed ["payload.output"]"#,
                r#"model.responded ["payload.message"]"#,
                r#"run.completed ["payload.output"]"#,
            ]
        );
    }
}
