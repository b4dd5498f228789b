//! The model port: requests, streamed chunks, errors classified by kind, and the accumulator
//! that turns a stream into a complete answer.
//!
//! Streaming is the primitive. A complete answer is always the collected stream, so every
//! provider implements one method, [`ModelClient::stream`].

use std::{collections::BTreeMap, fmt, sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{
    BoxStream,
    content::{Block, BlockKind, Message, Role},
    usage::Usage,
};

/// A tool as offered to a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// JSON Schema of the arguments, shared: an agent's tools are prepared once, when it is
    /// bound, and each request offers them without copying their schemas.
    pub input_schema: Arc<Value>,
}

/// Whether the model may, must or must not call tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// No tool call allowed.
    None,
    /// At least one tool call required.
    Required,
}

/// A provider-neutral model request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRequest {
    /// Provider model name.
    pub model_id: String,
    /// System prompt.
    pub system: String,
    /// Conversation. Each message is shared (`Arc`): a session's history is the same messages
    /// in every request of a run, never copied per call; an edit of one (`Arc::make_mut`)
    /// copies that message only. Serialized as the messages themselves.
    pub messages: Vec<Arc<Message>>,
    /// Offered tools.
    pub tools: Vec<ToolDefinition>,
    /// Tool choice.
    pub tool_choice: ToolChoice,
    /// Output token cap.
    pub max_tokens: Option<u32>,
    /// Provider parameters, passed through as given. Shared (`Arc`) with the model's binding:
    /// the same parameters go out in every request of the model, never copied per call (a
    /// fake model's script is in them). Serialized as the map itself.
    pub params: Arc<Map<String, Value>>,
    /// JSON Schema the answer must follow, when the provider can enforce it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
}

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// It finished its answer.
    End,
    /// It wants tool results.
    ToolUse,
    /// It hit the token cap.
    MaxTokens,
    /// It refused.
    Refusal,
}

impl StopReason {
    /// The journal string.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::End => "end",
            StopReason::ToolUse => "tool_use",
            StopReason::MaxTokens => "max_tokens",
            StopReason::Refusal => "refusal",
        }
    }
}

/// One piece of a streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelChunk {
    /// Visible text.
    TextDelta(String),
    /// Reasoning text; `start` opens a new reasoning block.
    ReasoningDelta {
        /// Text.
        text: String,
        /// Whether this opens a new block.
        start: bool,
        /// Provider data to keep with the block.
        provider_meta: Map<String, Value>,
    },
    /// A tool call begins.
    ToolCallStarted {
        /// Position of the call in the answer.
        index: usize,
        /// Provider call id.
        call_id: String,
        /// Tool name.
        name: String,
    },
    /// A fragment of a call's JSON arguments (split anywhere).
    ToolArgsDelta {
        /// Position of the call.
        index: usize,
        /// Raw fragment.
        json_fragment: String,
    },
    /// A tool call is complete.
    ToolCallEnded {
        /// Position of the call.
        index: usize,
    },
    /// Token usage (may arrive more than once; the last one wins per field).
    Usage(Usage),
    /// The answer is complete.
    Stopped {
        /// Why.
        reason: StopReason,
        /// The provider model that answered.
        model_id: String,
    },
    /// The HTTP exchange of this call, captured when the provider was asked to
    /// (`telemetry.capture.raw_exchanges`): the last chunk of the stream, or the one just before
    /// its error. It carries no answer content: accumulators ignore it.
    Exchange(Box<HttpExchange>),
}

/// One HTTP exchange with a provider, as captured for `model.exchanged`: secrets redacted, file
/// bytes replaced by their size, bodies cut at the capture limit (their size and SHA-256 are
/// those of the full bodies).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct HttpExchange {
    /// HTTP method.
    pub method: String,
    /// Request URL (an API key in it is redacted).
    pub url: String,
    /// Response status; `None` when no response arrived.
    pub status_code: Option<u16>,
    /// From the request being sent to the end of the response (or the failure).
    pub duration_ms: f64,
    /// Request headers, names in lower case, credentials replaced by `"<redacted>"`.
    pub request_headers: BTreeMap<String, String>,
    /// Request body as text, base64 file data replaced by `"<N bytes>"`, cut at the limit.
    pub request_body: String,
    /// Size of the full request body as sent.
    pub request_bytes: u64,
    /// SHA-256 (hex) of the full request body as sent.
    pub request_sha256: String,
    /// Whether `request_body` was cut.
    pub request_truncated: bool,
    /// Response headers, names in lower case, credentials replaced by `"<redacted>"`.
    pub response_headers: BTreeMap<String, String>,
    /// Response body as received (the SSE text of a stream), cut at the limit.
    pub response_body: String,
    /// Bytes of response body received.
    pub response_bytes: u64,
    /// SHA-256 (hex) of the response body received.
    pub response_sha256: String,
    /// Whether `response_body` was cut.
    pub response_truncated: bool,
    /// The error that ended the exchange (HTTP, network or in-stream), if any.
    pub error: Option<String>,
}

/// Kinds of model error. The engine decides retries and fallbacks from the kind alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelErrorKind {
    /// Rate limits, 5xx, timeouts, network: worth retrying.
    Transient,
    /// Provider overloaded: worth retrying.
    Overloaded,
    /// Credit or quota exhausted.
    QuotaExhausted,
    /// The prompt does not fit.
    ContextOverflow,
    /// Refused by a content filter.
    ContentFiltered,
    /// Bad or missing key.
    Auth,
    /// The request is wrong; retrying will not help.
    InvalidRequest,
    /// The answer was cut by the token cap.
    Truncated,
    /// Every model of the chain was skipped.
    Unavailable,
}

impl ModelErrorKind {
    /// The snake_case name used in events (`model.<kind>` error types).
    pub fn as_str(self) -> &'static str {
        match self {
            ModelErrorKind::Transient => "transient",
            ModelErrorKind::Overloaded => "overloaded",
            ModelErrorKind::QuotaExhausted => "quota_exhausted",
            ModelErrorKind::ContextOverflow => "context_overflow",
            ModelErrorKind::ContentFiltered => "content_filtered",
            ModelErrorKind::Auth => "auth",
            ModelErrorKind::InvalidRequest => "invalid_request",
            ModelErrorKind::Truncated => "truncated",
            ModelErrorKind::Unavailable => "unavailable",
        }
    }

    /// Whether the same call may succeed if tried again.
    pub fn is_retryable(self) -> bool {
        matches!(self, ModelErrorKind::Transient | ModelErrorKind::Overloaded)
    }
}

/// A model call that failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ModelError {
    /// Classification.
    pub kind: ModelErrorKind,
    /// What the provider said, or what went wrong.
    pub message: String,
    /// HTTP status, when there was one.
    pub http_status: Option<u16>,
    /// Delay the provider asked for.
    pub retry_after: Option<Duration>,
}

impl fmt::Display for ModelErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ModelError {
    /// An error of this kind.
    pub fn new(kind: ModelErrorKind, message: impl Into<String>) -> ModelError {
        ModelError {
            kind,
            message: message.into(),
            http_status: None,
            retry_after: None,
        }
    }
}

/// The model port. Object-safe: the engine holds `Arc<dyn ModelClient>`.
pub trait ModelClient: Send + Sync + fmt::Debug {
    /// Provider name journaled in `model.responded.provider` ("fake", "anthropic", "openai").
    fn provider(&self) -> &str;

    /// Streams the answer to `request`. The stream ends after [`ModelChunk::Stopped`]; a stream
    /// that ends without it is a transient error.
    ///
    /// The request is lent: a client takes from it what it sends before it returns the stream,
    /// and the engine keeps the one request for every attempt (retries included) instead of
    /// copying a conversation's history into each.
    fn stream(&self, request: &ModelRequest) -> BoxStream<'static, Result<ModelChunk, ModelError>>;
}

/// A complete answer built from a stream.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelResponse {
    /// The assistant message.
    pub message: Message,
    /// Usage reported.
    pub usage: Usage,
    /// Stop reason.
    pub stop_reason: StopReason,
    /// Provider model that answered.
    pub model_id: String,
}

/// Builds a [`ModelResponse`] from chunks, in any provider's order.
#[derive(Debug, Default)]
pub struct ResponseAccumulator {
    blocks: Vec<Block>,
    calls: Vec<(usize, String, String, String)>,
    usage: Usage,
    stopped: Option<(StopReason, String)>,
}

impl ResponseAccumulator {
    /// An empty accumulator.
    pub fn new() -> ResponseAccumulator {
        ResponseAccumulator::default()
    }

    /// Adds one chunk.
    pub fn push(&mut self, chunk: ModelChunk) {
        match chunk {
            ModelChunk::TextDelta(text) => match self.blocks.last_mut() {
                Some(Block {
                    kind: BlockKind::Text { text: last },
                    ..
                }) => last.push_str(&text),
                _ => self.blocks.push(Block::text(text)),
            },
            ModelChunk::ReasoningDelta {
                text,
                start,
                provider_meta,
            } => {
                let append = !start
                    && matches!(
                        self.blocks.last(),
                        Some(Block {
                            kind: BlockKind::Reasoning { .. },
                            ..
                        })
                    );
                if append {
                    if let Some(block) = self.blocks.last_mut() {
                        if let BlockKind::Reasoning { text: last, .. } = &mut block.kind {
                            last.push_str(&text);
                        }
                        block.provider_meta.extend(provider_meta);
                    }
                } else {
                    let mut block = Block::new(BlockKind::Reasoning {
                        text,
                        model_id: None,
                    });
                    block.provider_meta = provider_meta;
                    self.blocks.push(block);
                }
            }
            ModelChunk::ToolCallStarted {
                index,
                call_id,
                name,
            } => {
                self.calls.push((index, call_id, name, String::new()));
            }
            ModelChunk::ToolArgsDelta {
                index,
                json_fragment,
            } => {
                if let Some(call) = self.calls.iter_mut().rev().find(|c| c.0 == index) {
                    call.3.push_str(&json_fragment);
                }
            }
            ModelChunk::ToolCallEnded { .. } => {}
            ModelChunk::Usage(usage) => {
                let merge = |old: u64, new: u64| if new > 0 { new } else { old };
                self.usage.input_tokens = merge(self.usage.input_tokens, usage.input_tokens);
                self.usage.output_tokens = merge(self.usage.output_tokens, usage.output_tokens);
                self.usage.cache_read_tokens =
                    merge(self.usage.cache_read_tokens, usage.cache_read_tokens);
                self.usage.cache_write_tokens =
                    merge(self.usage.cache_write_tokens, usage.cache_write_tokens);
                self.usage.reasoning_tokens =
                    merge(self.usage.reasoning_tokens, usage.reasoning_tokens);
            }
            ModelChunk::Stopped { reason, model_id } => self.stopped = Some((reason, model_id)),
            ModelChunk::Exchange(_) => {}
        }
    }

    /// The complete answer, or a transient error when the stream ended without its stop signal.
    pub fn finish(self) -> Result<ModelResponse, ModelError> {
        let Some((stop_reason, model_id)) = self.stopped else {
            return Err(ModelError::new(
                ModelErrorKind::Transient,
                "stream interrupted: the provider closed the stream without an end signal",
            ));
        };
        let mut blocks = self.blocks;
        let mut seen: Vec<String> = Vec::new();
        for (_, call_id, name, raw) in self.calls {
            let arguments = if raw.trim().is_empty() {
                Value::Object(Map::new())
            } else {
                match serde_json::from_str::<Value>(&raw) {
                    Ok(value @ Value::Object(_)) => value,
                    _ => serde_json::json!({ "_loom_invalid_json": raw }),
                }
            };
            let mut id = call_id;
            if seen.contains(&id) {
                let mut n = 2;
                while seen.contains(&format!("{id}_{n}")) {
                    n += 1;
                }
                id = format!("{id}_{n}");
            }
            seen.push(id.clone());
            blocks.push(Block::tool_call(id, name, arguments));
        }
        for block in &mut blocks {
            if let BlockKind::Reasoning { model_id: m, .. } = &mut block.kind {
                *m = Some(model_id.clone());
            }
        }
        blocks.retain(|b| !matches!(&b.kind, BlockKind::Text { text } if text.is_empty()));
        if blocks.is_empty() {
            blocks.push(Block::text(""));
        }
        Ok(ModelResponse {
            message: Message {
                role: Role::Assistant,
                blocks,
            },
            usage: self.usage,
            stop_reason,
            model_id,
        })
    }
}

/// The last user message of a finalizing call (never journaled): the model must answer now.
pub const FINALIZE_HINT: &str = "You can no longer call tools. Answer the request now, in text, \
with the information already obtained; if you could not do everything, say what remains to be done.";

/// How a note the engine adds to a conversation begins (a call that ran with corrected
/// arguments, for instance).
pub const SYSTEM_NOTE_PREFIX: &str = "[System note";

/// How the user message begins that gives a refused answer back to its author with a check's
/// diagnostic (see [`repair_message`]).
pub const REPAIR_PREFIX: &str = "Answer refused by a check (";

/// The user message that gives a refused answer back to its author: the check that refused it
/// (`policy`) and its diagnostic.
pub fn repair_message(policy: &str, feedback: &str) -> String {
    format!("{REPAIR_PREFIX}{policy}): {feedback}")
}

/// The last user message of an orchestrator shown the session state: `state_json` (compact,
/// sorted by key) between `<session_state>` tags. Never journaled.
pub fn session_state_message(state_json: &str) -> String {
    format!("<session_state>{state_json}</session_state>")
}

/// Whether a user message's text is a note of the engine rather than something the user said:
/// the [`FINALIZE_HINT`], a system note, a repair request ([`repair_message`]), the session
/// state ([`session_state_message`]). A scripted model counts its turns from the last message
/// that is not one, as the reference's fake model does.
pub fn is_engine_note(text: &str) -> bool {
    text == FINALIZE_HINT
        || text.starts_with(SYSTEM_NOTE_PREFIX)
        || text.starts_with(REPAIR_PREFIX)
        || (text.starts_with("<session_state>") && text.ends_with("</session_state>"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repair_requests_and_hints_are_engine_notes() {
        assert!(is_engine_note(&repair_message("loom.contract", "not JSON")));
        assert!(is_engine_note(FINALIZE_HINT));
        assert!(is_engine_note(
            "[System note: the call c1 ran with other arguments.]"
        ));
        assert!(is_engine_note(&session_state_message(
            "{\"client\":\"C-1\"}"
        )));
        assert!(!is_engine_note("Que vaut le devis D-2026-042 ?"));
        assert_eq!(
            repair_message("cite_le_devis", "cite it"),
            "Answer refused by a check (cite_le_devis): cite it"
        );
    }

    #[test]
    fn accumulates_text_and_split_arguments() {
        let mut acc = ResponseAccumulator::new();
        acc.push(ModelChunk::TextDelta("Je ".into()));
        acc.push(ModelChunk::TextDelta("calcule.".into()));
        acc.push(ModelChunk::ToolCallStarted {
            index: 0,
            call_id: "c1".into(),
            name: "t".into(),
        });
        acc.push(ModelChunk::ToolArgsDelta {
            index: 0,
            json_fragment: "{\"a\": \"é".into(),
        });
        acc.push(ModelChunk::ToolArgsDelta {
            index: 0,
            json_fragment: "\"}".into(),
        });
        acc.push(ModelChunk::ToolCallEnded { index: 0 });
        acc.push(ModelChunk::Stopped {
            reason: StopReason::ToolUse,
            model_id: "m".into(),
        });
        let response = acc.finish().unwrap();
        assert_eq!(response.message.text(), "Je calcule.");
        let calls: Vec<_> = response.message.tool_calls().collect();
        assert_eq!(calls[0].2["a"], "é");
    }

    #[test]
    fn invalid_json_and_duplicate_ids() {
        let mut acc = ResponseAccumulator::new();
        for _ in 0..2 {
            acc.push(ModelChunk::ToolCallStarted {
                index: 0,
                call_id: "c".into(),
                name: "t".into(),
            });
            acc.push(ModelChunk::ToolArgsDelta {
                index: 0,
                json_fragment: "{oops".into(),
            });
        }
        acc.push(ModelChunk::Stopped {
            reason: StopReason::ToolUse,
            model_id: "m".into(),
        });
        let response = acc.finish().unwrap();
        let calls: Vec<_> = response.message.tool_calls().collect();
        assert_eq!(calls[1].0, "c_2");
        assert_eq!(calls[0].2["_loom_invalid_json"], "{oops");
    }

    #[test]
    fn missing_stop_is_transient() {
        let acc = ResponseAccumulator::new();
        assert_eq!(acc.finish().unwrap_err().kind, ModelErrorKind::Transient);
    }
}
