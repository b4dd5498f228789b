//! Model requests: how they are built from the state, and their canonical hashes.

use loom_core::{
    Message,
    model::{FINALIZE_HINT, ModelRequest, ToolChoice, ToolDefinition},
};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::AgentRuntime;

/// Builds the orchestrator's request: system prompt, session history, the run's conversation
/// (tool results in call order), and the finalize hint when tools are no longer allowed.
pub(crate) fn build(
    agent: &AgentRuntime,
    history: &[Message],
    conversation: Vec<Message>,
    finalizing: bool,
) -> ModelRequest {
    let mut messages = Vec::with_capacity(history.len() + conversation.len() + 1);
    messages.extend_from_slice(history);
    messages.extend(conversation);
    if finalizing {
        messages.push(Message::user(FINALIZE_HINT));
    }
    ModelRequest {
        model_id: agent.main.model_id.clone(),
        system: agent.system.clone(),
        messages,
        tools: agent
            .tools
            .iter()
            .map(|t| ToolDefinition {
                name: t.name().to_owned(),
                description: t.description.clone(),
                input_schema: t.tool.spec().input_schema.clone(),
            })
            .collect(),
        tool_choice: if finalizing {
            ToolChoice::None
        } else {
            ToolChoice::Auto
        },
        max_tokens: agent.main.max_tokens,
        params: agent.main.params.clone(),
        output_schema: None,
    }
}

/// SHA-256 (hex) of the request's canonical JSON (keys sorted, compact, UTF-8), and the
/// 16-hex digests of its parts (`model, system, tools, messages, settings`, `messages_count`),
/// which let a replay say what changed.
pub fn request_hash(request: &ModelRequest) -> (String, Map<String, Value>) {
    let whole = serde_json::to_value(request).unwrap_or(Value::Null);
    let settings = json!({
        "tool_choice": request.tool_choice,
        "max_tokens": request.max_tokens,
        "params": request.params,
        "output_schema": request.output_schema,
    });
    let mut parts = Map::new();
    let short = |v: &Value| digest(v)[..16].to_owned();
    parts.insert(
        "model".into(),
        Value::String(short(&json!(request.model_id))),
    );
    parts.insert(
        "system".into(),
        Value::String(short(&json!(request.system))),
    );
    parts.insert(
        "tools".into(),
        Value::String(short(
            &serde_json::to_value(&request.tools).unwrap_or(Value::Null),
        )),
    );
    parts.insert(
        "messages".into(),
        Value::String(short(
            &serde_json::to_value(&request.messages).unwrap_or(Value::Null),
        )),
    );
    parts.insert("settings".into(), Value::String(short(&settings)));
    parts.insert(
        "messages_count".into(),
        Value::String(request.messages.len().to_string()),
    );
    (digest(&whole), parts)
}

fn digest(value: &Value) -> String {
    let mut canonical = String::new();
    write_canonical(value, &mut canonical);
    let hash = Sha256::digest(canonical.as_bytes());
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys() {
        let mut out = String::new();
        write_canonical(&json!({"b": 1, "a": [{"d": 2, "c": "é"}]}), &mut out);
        assert_eq!(out, r#"{"a":[{"c":"é","d":2}],"b":1}"#);
    }
}
