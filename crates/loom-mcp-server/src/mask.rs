//! Content removed for a caller without the `read_content` scope.
//!
//! A minimal masking of what the MCP server returns (run results, events, traces, sessions):
//! every field that carries content — messages, answers, tool arguments and results, files
//! — is removed, and the paths removed are listed in `redacted`, as the reference does. What
//! stays is the shape of the run: ids, statuses, tools called, usage, cost, errors.

use serde_json::{Map, Value};

/// Keys whose values are content, wherever they appear.
const CONTENT_KEYS: &[&str] = &[
    "text",
    "output",
    "data",
    "message",
    "arguments",
    "result",
    "tool_calls",
    "refs",
    "request_body",
    "response_body",
    "metadata",
];

/// Removes the content of `value` (an object: a run result, an event, a trace) and lists the
/// paths removed in its `redacted` field. Returns whether anything was removed.
pub(crate) fn mask(value: &mut Value) -> bool {
    let mut removed = Vec::new();
    strip(value, "", &mut removed);
    let any = !removed.is_empty();
    if let Value::Object(map) = value
        && any
    {
        map.insert(
            "redacted".to_owned(),
            Value::Array(removed.into_iter().map(Value::String).collect()),
        );
    }
    any
}

fn strip(value: &mut Value, path: &str, removed: &mut Vec<String>) {
    match value {
        Value::Object(map) => strip_object(map, path, removed),
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                strip(item, &format!("{path}[{i}]"), removed);
            }
        }
        _ => {}
    }
}

fn strip_object(map: &mut Map<String, Value>, path: &str, removed: &mut Vec<String>) {
    let join = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    let keys: Vec<String> = map.keys().cloned().collect();
    for key in keys {
        // The session state a run starts with (an object) is content; the `state` of a step
        // (a status name) is not.
        let content = CONTENT_KEYS.contains(&key.as_str())
            || (key == "state" && map.get(&key).is_some_and(Value::is_object));
        if content {
            if map.get(&key).is_some_and(|v| !v.is_null()) {
                map.remove(&key);
                removed.push(join(&key));
            }
        } else if let Some(child) = map.get_mut(&key) {
            strip(child, &join(&key), removed);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn content_is_removed_and_listed() {
        let mut event = json!({
            "type": "tool.called",
            "run_id": "r1",
            "payload": {"type": "tool.called", "tool_name": "virement", "arguments": {"iban": "FR76"}},
        });
        assert!(mask(&mut event));
        assert_eq!(
            event,
            json!({
                "type": "tool.called",
                "run_id": "r1",
                "payload": {"type": "tool.called", "tool_name": "virement"},
                "redacted": ["payload.arguments"],
            })
        );
    }

    #[test]
    fn a_result_keeps_its_shape() {
        let mut result = json!({
            "run_id": "r1", "status": "paused", "text": "Bonjour", "output": null,
            "pending_approvals": [{"call_id": "c1", "tool_name": "t", "arguments": {"a": 1}}],
        });
        mask(&mut result);
        assert_eq!(
            result,
            json!({
                "run_id": "r1", "status": "paused", "output": null,
                "pending_approvals": [{"call_id": "c1", "tool_name": "t"}],
                "redacted": ["text", "pending_approvals[0].arguments"],
            })
        );
    }

    #[test]
    fn a_step_state_is_not_content_but_a_session_state_is() {
        let mut step = json!({"payload": {"state": "ready_for_model"}});
        assert!(!mask(&mut step));
        let mut started = json!({"payload": {"state": {"client": "Martin"}}});
        assert!(mask(&mut started));
        assert_eq!(started["redacted"], json!(["payload.state"]));
    }
}
