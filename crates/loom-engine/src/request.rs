//! Model requests: how they are built from the state, and their canonical hashes.

use std::sync::Arc;

use loom_core::{
    Block, Message,
    content::BlockKind,
    model::{FINALIZE_HINT, ModelRequest, ToolChoice, ToolDefinition},
};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::binding::{BoundTool, ModelBinding};

mod canonical;

/// Builds the orchestrator's request for `model`: its `system` prompt, session history, the
/// run's conversation (tool results in call order, without their full view), and the finalize
/// hint when tools are no longer allowed. The model's own name, token cap and parameters are
/// used. The history's messages are shared, not copied (see [`History`]).
pub(crate) fn build(
    system: &str,
    model: &ModelBinding,
    tools: &[BoundTool],
    history: &History,
    conversation: Vec<Message>,
    finalizing: bool,
    tool_choice: ToolChoice,
) -> ModelRequest {
    ModelRequest {
        model_id: model.model_id.clone(),
        system: system.to_owned(),
        messages: messages(history, conversation, finalizing),
        tools: tools
            .iter()
            .map(|t| ToolDefinition {
                name: t.name().to_owned(),
                description: t.description.clone(),
                input_schema: Arc::clone(t.input_schema()),
            })
            .collect(),
        tool_choice,
        max_tokens: model.max_tokens,
        params: model.params.clone(),
        output_schema: None,
    }
}

/// Removes the full view of every tool result (`ToolOutput::full`): it is for interfaces and
/// never reaches a model.
pub(crate) fn without_full_views(messages: &mut [Message]) {
    for message in messages {
        for block in &mut message.blocks {
            if let BlockKind::ToolResult { output, .. } = &mut block.kind {
                output.full = None;
            }
        }
    }
}

/// A session's history as the requests of a run share it: each message once, without its
/// full views. Made only by [`History::new`], so a request built from it needs no second pass
/// over the history.
#[derive(Debug, Clone, Default)]
pub(crate) struct History(Arc<[Arc<Message>]>);

impl History {
    /// `messages`, their full views removed, each shared from now on.
    pub(crate) fn new(mut messages: Vec<Message>) -> History {
        without_full_views(&mut messages);
        History(messages.into_iter().map(Arc::new).collect())
    }
}

/// A request's messages: the shared `history`, then the run's `conversation` without its full
/// views, then the finalize hint when `finalizing`.
fn messages(
    history: &History,
    mut conversation: Vec<Message>,
    finalizing: bool,
) -> Vec<Arc<Message>> {
    without_full_views(&mut conversation);
    let mut messages = Vec::with_capacity(history.0.len() + conversation.len() + 1);
    messages.extend(history.0.iter().cloned());
    messages.extend(conversation.into_iter().map(Arc::new));
    if finalizing {
        messages.push(Arc::new(Message::user(FINALIZE_HINT)));
    }
    messages
}

/// Removes the reasoning blocks that `is_own` does not recognise (those of other models: a
/// fallback is never sent another model's reasoning). A message left empty keeps an empty
/// text block. Only a message that loses a block is copied.
pub(crate) fn strip_foreign_reasoning(
    messages: &mut [Arc<Message>],
    is_own: impl Fn(&str) -> bool,
) {
    let foreign = |block: &Block| match &block.kind {
        BlockKind::Reasoning {
            model_id: Some(id), ..
        } => !is_own(id),
        _ => false,
    };
    for shared in messages {
        if !shared.blocks.iter().any(&foreign) {
            continue;
        }
        let message = Arc::make_mut(shared);
        message.blocks.retain(|block| !foreign(block));
        if message.blocks.is_empty() {
            message.blocks.push(Block::text(""));
        }
    }
}

/// SHA-256 (hex) of the request's canonical JSON (keys sorted, compact, UTF-8), and the
/// 16-hex digests of its parts (`model, system, tools, messages, settings`, `messages_count`),
/// which let a replay say what changed.
///
/// The request is written in canonical form once, straight from its fields (see
/// `request/canonical.rs`); the parts are hashed from the bytes of its top-level entries. A long
/// session's history is the bulk of a request, and is neither copied nor written twice.
pub fn request_hash(request: &ModelRequest) -> (String, Map<String, Value>) {
    let Ok((whole, entries)) = canonical::to_canonical(request) else {
        return request_hash_through_value(request);
    };
    let bytes = |name: &str| -> &[u8] {
        entries
            .iter()
            .find(|entry| {
                let key = entry.key(&whole);
                &key[1..key.len() - 1] == name.as_bytes()
            })
            .map_or(b"null", |entry| entry.value(&whole))
    };
    let parts = parts(request, bytes);
    (hex::encode(Sha256::digest(&whole)), parts)
}

/// The digests of the request's parts, from the canonical bytes of each top-level field
/// (`null` for a field left out).
fn parts<'a>(request: &ModelRequest, bytes: impl Fn(&str) -> &'a [u8]) -> Map<String, Value> {
    let short = |bytes: &[u8]| {
        let mut hex = hex::encode(Sha256::digest(bytes));
        hex.truncate(16);
        Value::String(hex)
    };
    // `{"max_tokens":…,"output_schema":…,"params":…,"tool_choice":…}`: keys in sorted order.
    let mut settings = Vec::new();
    for (i, name) in ["max_tokens", "output_schema", "params", "tool_choice"]
        .into_iter()
        .enumerate()
    {
        settings.push(if i == 0 { b'{' } else { b',' });
        write_key(name, &mut settings);
        settings.extend_from_slice(bytes(name));
    }
    settings.push(b'}');
    let mut parts = Map::new();
    parts.insert("model".into(), short(bytes("model_id")));
    parts.insert("system".into(), short(bytes("system")));
    parts.insert("tools".into(), short(bytes("tools")));
    parts.insert("messages".into(), short(bytes("messages")));
    parts.insert("settings".into(), short(&settings));
    parts.insert(
        "messages_count".into(),
        Value::String(request.messages.len().to_string()),
    );
    parts
}

/// [`request_hash`] through the request's `Value`, for what the direct writer refuses.
fn request_hash_through_value(request: &ModelRequest) -> (String, Map<String, Value>) {
    let whole = serde_json::to_value(request).unwrap_or(Value::Null);
    let Value::Object(fields) = &whole else {
        // A request always serializes to an object; anything else hashes as itself.
        let mut buffer = Vec::new();
        return (digest(&whole, &mut buffer), Map::new());
    };
    let mut canonical: Vec<(&String, Vec<u8>)> = fields
        .iter()
        .map(|(key, value)| {
            let mut out = Vec::new();
            write_canonical(value, &mut out);
            (key, out)
        })
        .collect();
    canonical.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let parts = parts(request, |name: &str| -> &[u8] {
        canonical
            .iter()
            .find(|(key, _)| key.as_str() == name)
            .map_or(b"null", |(_, out)| out.as_slice())
    });
    let mut hasher = Sha256::new();
    for (i, (key, value)) in canonical.iter().enumerate() {
        let mut head = Vec::with_capacity(key.len() + 4);
        head.push(if i == 0 { b'{' } else { b',' });
        write_key(key, &mut head);
        hasher.update(&head);
        hasher.update(value);
    }
    hasher.update(if canonical.is_empty() {
        b"{}" as &[u8]
    } else {
        b"}"
    });
    (hex::encode(hasher.finalize()), parts)
}

/// `"key":`, the key written as a JSON string.
fn write_key(key: &str, out: &mut Vec<u8>) {
    // Writing JSON into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, key);
    out.push(b':');
}

/// SHA-256 hex of `value`'s canonical JSON, written into `buffer` (reused across calls).
fn digest(value: &Value, buffer: &mut Vec<u8>) -> String {
    buffer.clear();
    write_canonical(value, buffer);
    hex::encode(Sha256::digest(buffer.as_slice()))
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                // Writing JSON into a Vec cannot fail.
                let _ = serde_json::to_writer(&mut *out, key);
                out.push(b':');
                write_canonical(item, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        other => {
            let _ = serde_json::to_writer(&mut *out, other);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The engine's edits of shared messages copy only the messages they change: a full view
    /// removed, another model's reasoning dropped (an emptied message keeps an empty text).
    #[test]
    fn edits_copy_only_the_messages_they_change() {
        let result = Message {
            role: loom_core::Role::Tool,
            blocks: vec![Block::new(BlockKind::ToolResult {
                call_id: "c1".into(),
                output: loom_core::tool::ToolOutput::json(json!({"ttc": 1500}))
                    .with_full(json!({"detail": [1, 2]})),
            })],
        };
        let reasoning = |model: &str| {
            Block::new(BlockKind::Reasoning {
                text: "calcul".into(),
                model_id: Some(model.into()),
            })
        };
        let theirs = Message {
            role: loom_core::Role::Assistant,
            blocks: vec![reasoning("other")],
        };
        let mixed = Message {
            role: loom_core::Role::Assistant,
            blocks: vec![
                reasoning("mine"),
                reasoning("other"),
                Block::text("1 500 €"),
            ],
        };
        let history = History::new(vec![Message::user("Prix ?"), result.clone()]);
        let mut messages = super::messages(&history, vec![result], false);
        // The history is shared as it is, without its full view.
        assert!(
            messages
                .iter()
                .zip(history.0.iter())
                .all(|(a, b)| Arc::ptr_eq(a, b))
        );
        let BlockKind::ToolResult { output, .. } = &messages[1].blocks[0].kind else {
            panic!("a tool result");
        };
        assert_eq!(output.full, None);
        // The run's own messages lose their full view as well.
        assert_eq!(messages[2], messages[1]);
        assert_eq!(messages.len(), 3);
        assert_eq!(
            super::messages(&history, Vec::new(), true)
                .last()
                .map(|m| m.text()),
            Some(FINALIZE_HINT.to_owned())
        );
        // Reasoning: only the messages holding another model's are copied.
        messages.extend([Arc::new(theirs), Arc::new(mixed)]);
        let before = messages.clone();
        strip_foreign_reasoning(&mut messages, |id| id == "mine");
        for at in 0..3 {
            assert!(Arc::ptr_eq(&messages[at], &before[at]));
        }
        assert_eq!(messages[3].blocks, vec![Block::text("")]);
        assert_eq!(
            messages[4].blocks,
            vec![reasoning("mine"), Block::text("1 500 €")]
        );
        assert_eq!(
            before[4].blocks.len(),
            3,
            "the shared message is left as it was"
        );
    }

    /// The hashes as first defined: the whole request's canonical JSON, and each part's,
    /// written on their own.
    fn reference_hash(request: &ModelRequest) -> (String, Map<String, Value>) {
        let whole = serde_json::to_value(request).unwrap();
        let field = |name: &str| whole.get(name).cloned().unwrap_or(Value::Null);
        let settings = json!({
            "tool_choice": field("tool_choice"),
            "max_tokens": field("max_tokens"),
            "params": field("params"),
            "output_schema": field("output_schema"),
        });
        let mut buffer = Vec::new();
        let mut short = |value: &Value| {
            let mut hex = digest(value, &mut buffer);
            hex.truncate(16);
            Value::String(hex)
        };
        let mut parts = Map::new();
        parts.insert("model".into(), short(&field("model_id")));
        parts.insert("system".into(), short(&field("system")));
        parts.insert("tools".into(), short(&field("tools")));
        parts.insert("messages".into(), short(&field("messages")));
        parts.insert("settings".into(), short(&settings));
        parts.insert(
            "messages_count".into(),
            Value::String(request.messages.len().to_string()),
        );
        (digest(&whole, &mut buffer), parts)
    }

    /// Hashes assembled from each field's canonical bytes are those of the whole request
    /// written at once (journals hold them: a replay compares them), with and without the
    /// optional fields.
    #[test]
    fn the_hashes_are_those_of_the_whole_canonical_request() {
        let mut request = ModelRequest {
            model_id: "m".into(),
            system: "Tu es « devis ».".into(),
            messages: vec![
                Arc::new(Message::user("Quel prix TTC pour 1 250 € HT ?")),
                Arc::new(Message::user("et à 20 % ?")),
            ],
            tools: vec![ToolDefinition {
                name: "prix_ttc".into(),
                description: "TTC".into(),
                input_schema: Arc::new(
                    json!({"type": "object", "properties": {"ht": {"type": "number"}}}),
                ),
            }],
            tool_choice: ToolChoice::Auto,
            max_tokens: Some(512),
            params: Arc::new(
                [("temperature".to_owned(), json!(0.2))]
                    .into_iter()
                    .collect(),
            ),
            output_schema: None,
        };
        assert_eq!(request_hash(&request), reference_hash(&request));
        assert_eq!(request_hash(&request), request_hash_through_value(&request));
        // Every kind of block, with provider data and the keys a model writes.
        let mut call = Block::tool_call("c1", "prix_ttc", json!({"ht": 1250, "taux": 0.2}));
        call.provider_meta
            .insert("signature".into(), json!({"z": "s", "a": [1]}));
        let mut reasoning = Block::new(BlockKind::Reasoning {
            text: "calcul".into(),
            model_id: Some("m".into()),
        });
        reasoning.cache_breakpoint = true;
        request.messages.push(Arc::new(Message {
            role: loom_core::Role::Assistant,
            blocks: vec![reasoning, call, Block::json(json!({"b": null, "a": "é"}))],
        }));
        request.messages.push(Arc::new(Message {
            role: loom_core::Role::Tool,
            blocks: vec![Block::new(BlockKind::ToolResult {
                call_id: "c1".into(),
                output: loom_core::tool::ToolOutput::json(json!({"ttc": 1500}))
                    .with_full(json!({"detail": [1, 2]})),
            })],
        }));
        request.tool_choice = ToolChoice::Required;
        assert_eq!(request_hash(&request), reference_hash(&request));
        assert_eq!(request_hash(&request), request_hash_through_value(&request));
        // A key the direct writer refuses (it holds an escape): the hash goes through the
        // `Value` path, and is the same.
        request.messages.push(Arc::new(Message {
            role: loom_core::Role::Assistant,
            blocks: vec![Block::tool_call(
                "c2",
                "prix_ttc",
                json!({"a\nb": 1, "a": 2}),
            )],
        }));
        assert!(canonical::to_canonical(&request).is_err());
        assert_eq!(request_hash(&request), reference_hash(&request));
        request.output_schema = Some(json!({"type": "object"}));
        request.max_tokens = None;
        request.params = Default::default();
        request.tools.clear();
        assert_eq!(request_hash(&request), reference_hash(&request));
        assert_eq!(request_hash(&request), request_hash_through_value(&request));
    }

    #[test]
    fn canonical_json_sorts_keys() {
        let mut out = Vec::new();
        write_canonical(&json!({"b": 1, "a": [{"d": 2, "c": "é"}]}), &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":[{"c":"é","d":2}],"b":1}"#
        );
    }
}
