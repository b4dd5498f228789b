//! What a span and a span event say: the OpenTelemetry GenAI attributes of model calls and
//! tool calls (`gen_ai.*`, input tokens counting the cache), messages as GenAI writes them
//! (`{role, parts, finish_reason}`), and a journal event as a span event (its facets as
//! `loom.<facet>`, and what the reader needs of the rest).

use std::collections::BTreeMap;

use loom_core::{Event, Message, Usage, content::BlockKind, event::Payload};
use serde_json::{Value, json};

use super::trace::{Span, SpanEvent};

/// Names a tool call's span after its tool.
pub(super) fn tool_names(span: &mut Span, tool: &str, call_id: &str) {
    span.name = format!("execute_tool {tool}");
    span.attributes
        .insert("gen_ai.operation.name".into(), json!("execute_tool"));
    span.attributes
        .insert("gen_ai.tool.name".into(), json!(tool));
    span.attributes
        .insert("gen_ai.tool.call.id".into(), json!(call_id));
}

/// The `gen_ai.usage.*` attributes (input tokens include the cache's) and `loom.cost_usd`.
pub(super) fn usage_attributes(
    attributes: &mut BTreeMap<String, Value>,
    usage: &Usage,
    cost_usd: f64,
) {
    attributes.insert(
        "gen_ai.usage.input_tokens".into(),
        json!(usage.prompt_tokens()),
    );
    attributes.insert(
        "gen_ai.usage.output_tokens".into(),
        json!(usage.output_tokens),
    );
    attributes.insert(
        "gen_ai.usage.cache_read.input_tokens".into(),
        json!(usage.cache_read_tokens),
    );
    attributes.insert(
        "gen_ai.usage.cache_write.input_tokens".into(),
        json!(usage.cache_write_tokens),
    );
    if usage.reasoning_tokens > 0 {
        attributes.insert(
            "loom.usage.reasoning_tokens".into(),
            json!(usage.reasoning_tokens),
        );
    }
    attributes.insert("loom.cost_usd".into(), json!(cost_usd));
}

/// A message as OpenTelemetry GenAI writes one (`{role, parts, finish_reason}`): its text,
/// reasoning and tool calls.
pub(super) fn messages_json(message: &Message, finish_reason: Option<&str>) -> Value {
    let parts: Vec<Value> = message
        .blocks
        .iter()
        .filter_map(|block| match &block.kind {
            BlockKind::Text { text } => Some(json!({"type": "text", "content": text})),
            BlockKind::Reasoning { text, .. } => {
                Some(json!({"type": "reasoning", "content": text}))
            }
            BlockKind::ToolCall {
                call_id,
                name,
                arguments,
            } => Some(
                json!({"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}),
            ),
            BlockKind::Json { data } => Some(json!({"type": "json", "content": data})),
            BlockKind::Artifact {
                uri, media_type, ..
            } => Some(json!({"type": "uri", "uri": uri, "mime_type": media_type})),
            BlockKind::InlineData { .. } | BlockKind::ToolResult { .. } => None,
        })
        .collect();
    let mut value = json!({"role": message.role, "parts": parts});
    if let Some(reason) = finish_reason {
        value["finish_reason"] = json!(reason);
    }
    value
}

/// `event` as a span event: its facets (`loom.<facet>`), and what the reader needs of the rest.
pub(super) fn span_event(event: &Event) -> SpanEvent {
    let mut attributes: BTreeMap<String, Value> = event
        .facets
        .iter()
        .map(|(key, value)| (format!("loom.{key}"), value.clone()))
        .collect();
    let mut put = |key: &str, value: Value| {
        if !value.is_null() {
            attributes.insert(key.to_owned(), value);
        }
    };
    match &event.payload {
        Payload::PolicyDecided(p) => {
            put("loom.reason", json!(p.reason));
            put("loom.arguments", json!(p.arguments));
            put("loom.output", json!(p.output));
            put("loom.call_id", json!(p.call_id));
            put("loom.attempt", json!(p.attempt));
            if p.error {
                put("loom.failed", json!(true));
            }
        }
        Payload::GuardChecked(p) => {
            put("loom.reason", json!(p.reason));
            put("loom.resolution", json!(p.resolution));
            put("loom.attempt", json!(p.attempt));
            put("loom.call_id", json!(p.call_id));
        }
        Payload::JudgeEvaluated(p) => {
            put("loom.attempt", json!(p.attempt));
            let reasons: BTreeMap<&str, &str> = p
                .criteria
                .iter()
                .filter_map(|c| c.reason.as_deref().map(|r| (c.name.as_str(), r)))
                .collect();
            if !reasons.is_empty() {
                put("loom.reasons", json!(reasons));
            }
        }
        Payload::ApprovalRequested(p) => {
            put("loom.call_id", json!(p.call_id));
            put("loom.reason", json!(p.reason));
            put("loom.arguments", p.arguments.clone());
            put("loom.policy", json!(p.policy));
            put("loom.expire_at", json!(p.expire_at));
        }
        Payload::ApprovalGranted(p) => {
            put("loom.call_id", json!(p.call_id));
            put("loom.reason", json!(p.reason));
            put("loom.arguments", json!(p.arguments));
        }
        Payload::ApprovalRejected(p) => {
            put("loom.call_id", json!(p.call_id));
            put("loom.reason", json!(p.reason));
        }
        Payload::ApprovalExpired(p) => put("loom.call_id", json!(p.call_id)),
        Payload::ModelRetried(p) => {
            put("loom.error", json!(p.error));
            put("loom.http_status", json!(p.http_status));
            put("loom.delay_s", json!(p.delay_s));
            if p.r#final {
                put("loom.final", json!(true));
            }
        }
        Payload::ModelFellBack(p) => put("loom.error", json!(p.error)),
        Payload::CircuitOpened(p) => {
            put("loom.error", json!(p.error));
            put("loom.cooldown_s", json!(p.cooldown_s));
        }
        Payload::ToolSourceUnavailable(p) => put("loom.error", json!(p.error)),
        Payload::ToolSourceOpened(p) => put(
            "loom.tool_names",
            json!(p.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>()),
        ),
        Payload::ArtifactStored(p) => {
            put("loom.uri", json!(p.uri));
            put("loom.name", json!(p.name));
            put("loom.call_id", json!(p.call_id));
        }
        Payload::RunTransitioned(p) => {
            put("loom.step_no", json!(p.step_no));
            put("loom.cause_type", json!(p.cause_type));
        }
        Payload::BudgetExceeded(p) => {
            put("loom.value", json!(p.value));
            put("loom.spent", json!(p.spent));
        }
        Payload::MessageUser(p) => {
            put("loom.kind", json!(p.kind));
            put("loom.policy", json!(p.policy));
            put("loom.message", json!(p.message.text()));
        }
        Payload::IdempotencyRecorded(p) => put("loom.call_id", json!(p.call_id)),
        Payload::IdempotencyReused(p) => put("loom.call_id", json!(p.call_id)),
        _ => {}
    }
    SpanEvent {
        name: event.event_type.clone(),
        time: event.ts,
        attributes,
    }
}
