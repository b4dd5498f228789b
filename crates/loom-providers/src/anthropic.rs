//! The Anthropic Messages API (`sdk: anthropic`), streamed.
//!
//! Three pure pieces and one impure one:
//! - [`build_request`] turns a provider-neutral [`ModelRequest`] into the JSON body of
//!   `POST /v1/messages` (system placement, tools, tool results linked by `tool_use_id`,
//!   thinking blocks echoed with their signature, images, prompt-cache breakpoints, native JSON
//!   output);
//! - [`Decoder`] turns server-sent events into [`ModelChunk`]s as they arrive
//!   ([`decode_message`] reads the whole answer of a model declared
//!   `capabilities: {streaming: false}`, asked without `stream`, into the same chunks);
//! - [`classify`] turns an error body (HTTP or in-stream `error` event) into a
//!   [`ProviderError`] by its type, with message text read only where Anthropic gives nothing
//!   else (credit balance, prompt too long);
//! - [`AnthropicModel`] makes the one HTTP attempt and chains the three.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use bytes::Bytes;
use futures_util::{Stream, StreamExt, stream};
use loom_core::{
    BoxStream,
    content::{Block, BlockKind, Message, Role},
    model::{ModelChunk, ModelClient, ModelError, ModelRequest, StopReason, ToolChoice},
    usage::Usage,
};
use serde_json::{Map, Value, json};

use crate::{
    capture::{self, Recorder},
    error::{ErrorClass, ProviderError, class_of, truncated},
    http::{self, ProviderOptions, Response},
};

/// The official API address, used when the configuration gives no `base_url`.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The `anthropic-version` header sent with every request.
pub const API_VERSION: &str = "2023-06-01";
/// Output token cap when neither the request nor the model sets one.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
/// Anthropic accepts at most this many `cache_control` breakpoints per request.
pub const MAX_CACHE_BREAKPOINTS: usize = 4;

const PROVIDER: &str = "anthropic";

/// Prompt-cache breakpoints (`cache: {system, tools, messages, ttl}` of the model).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheSettings {
    /// A breakpoint after the system prompt.
    pub system: bool,
    /// A breakpoint after the last tool definition.
    pub tools: bool,
    /// A breakpoint on the last block of the last user message.
    pub messages: bool,
    /// Cache lifetime, `"5m"` (Anthropic's default) or `"1h"`; `None` sends none.
    pub ttl: Option<String>,
}

/// What the Anthropic adapter needs beyond [`ProviderOptions`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnthropicSettings {
    /// Prompt-cache breakpoints.
    pub cache: CacheSettings,
    /// The model reads images: inline images are sent as base64 `image` blocks, otherwise as
    /// a mention of the file.
    pub vision: bool,
    /// The model enforces a JSON schema: `output_schema` goes to `output_config.format`.
    pub native_json: bool,
    /// Answers are streamed (`"stream": true`); `false` for servers that cannot stream: the
    /// request goes without `stream` and the whole message is read as chunks
    /// ([`decode_message`]).
    pub streaming: bool,
}

impl Default for AnthropicSettings {
    /// No cache breakpoint, vision nor native JSON; streamed.
    fn default() -> Self {
        AnthropicSettings {
            cache: CacheSettings::default(),
            vision: false,
            native_json: false,
            streaming: true,
        }
    }
}

// ------------------------------------------------------------------------------------------
// Request building
// ------------------------------------------------------------------------------------------

/// The URL requests are POSTed to: `{base_url}/v1/messages` (a base URL that already ends in
/// `/v1` is not doubled).
pub fn endpoint(options: &ProviderOptions) -> String {
    let base = options.base_url.trim().trim_end_matches('/');
    let base = if base.is_empty() {
        DEFAULT_BASE_URL
    } else {
        base
    };
    if base.ends_with("/v1") {
        format!("{base}/messages")
    } else {
        format!("{base}/v1/messages")
    }
}

/// The headers of every request: `x-api-key` (when a key is set), `anthropic-version`,
/// `content-type`, then the configured ones (which may override the first three).
pub fn headers(options: &ProviderOptions) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(key) = &options.api_key {
        out.push(("x-api-key".to_string(), key.clone()));
    }
    out.push(("anthropic-version".to_string(), API_VERSION.to_string()));
    out.push(("content-type".to_string(), "application/json".to_string()));
    for (name, value) in &options.headers {
        out.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        out.push((name.clone(), value.clone()));
    }
    out
}

/// The JSON body of `POST /v1/messages` for `request` (`"stream": true` unless the model does
/// not stream). Pure.
pub fn build_request(
    options: &ProviderOptions,
    settings: &AnthropicSettings,
    request: &ModelRequest,
) -> Value {
    let cache_control = || {
        let mut control = Map::new();
        control.insert("type".into(), json!("ephemeral"));
        if let Some(ttl) = &settings.cache.ttl {
            control.insert("ttl".into(), json!(ttl));
        }
        Value::Object(control)
    };
    let model = if request.model_id.is_empty() {
        options.model.clone()
    } else {
        request.model_id.clone()
    };
    let max_tokens = request
        .max_tokens
        .or(options.max_tokens)
        .unwrap_or(DEFAULT_MAX_TOKENS);

    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("max_tokens".into(), json!(max_tokens));

    let mut breakpoints = 0;
    if !request.system.is_empty() {
        if settings.cache.system {
            breakpoints += 1;
            body.insert(
                "system".into(),
                json!([{"type": "text", "text": request.system, "cache_control": cache_control()}]),
            );
        } else {
            body.insert("system".into(), json!(request.system));
        }
    }

    let mut messages = convert_messages(&request.messages, settings.vision, &cache_control());
    if settings.cache.messages
        && let Some(block) = messages
            .iter_mut()
            .rev()
            .find(|m| m.role == "user")
            .and_then(|m| m.content.last_mut())
    {
        block.insert("cache_control".into(), cache_control());
    }

    if !request.tools.is_empty() {
        let mut tools: Vec<Value> = request
            .tools
            .iter()
            .map(|tool| {
                json!({
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": tool.input_schema,
                })
            })
            .collect();
        if settings.cache.tools
            && let Some(Value::Object(last)) = tools.last_mut()
        {
            breakpoints += 1;
            last.insert("cache_control".into(), cache_control());
        }
        body.insert("tools".into(), Value::Array(tools));
        let choice = match request.tool_choice {
            ToolChoice::Auto => "auto",
            ToolChoice::None => "none",
            ToolChoice::Required => "any",
        };
        body.insert("tool_choice".into(), json!({ "type": choice }));
    }

    // At most four breakpoints: the latest message breakpoints are kept (they cover the most).
    let mut budget = MAX_CACHE_BREAKPOINTS.saturating_sub(breakpoints);
    for message in messages.iter_mut().rev() {
        for block in message.content.iter_mut().rev() {
            if block.contains_key("cache_control") {
                if budget == 0 {
                    block.remove("cache_control");
                } else {
                    budget -= 1;
                }
            }
        }
    }
    body.insert(
        "messages".into(),
        Value::Array(
            messages
                .into_iter()
                .map(|m| json!({ "role": m.role, "content": m.content }))
                .collect(),
        ),
    );

    for (key, value) in request.params.iter() {
        if key != "stream" {
            body.insert(key.clone(), value.clone());
        }
    }
    if settings.native_json
        && let Some(schema) = &request.output_schema
    {
        let config = body
            .entry("output_config")
            .or_insert_with(|| Value::Object(Map::new()));
        if !config.is_object() {
            *config = Value::Object(Map::new());
        }
        if let Value::Object(config) = config {
            config.insert(
                "format".into(),
                json!({ "type": "json_schema", "schema": schema }),
            );
        }
    }
    if settings.streaming {
        body.insert("stream".into(), json!(true));
    }
    Value::Object(body)
}

/// One Anthropic message being built.
struct WireMessage {
    role: &'static str,
    content: Vec<Map<String, Value>>,
}

/// Converts the conversation: tool messages become `user` messages of `tool_result` blocks,
/// consecutive messages of the same role are merged (tool results first in a user turn),
/// empty text blocks and messages left empty are dropped.
fn convert_messages(
    messages: &[Arc<Message>],
    vision: bool,
    cache_control: &Value,
) -> Vec<WireMessage> {
    let mut out: Vec<WireMessage> = Vec::new();
    for message in messages {
        let role = match message.role {
            Role::Assistant => "assistant",
            Role::User | Role::Tool => "user",
        };
        let content: Vec<Map<String, Value>> = message
            .blocks
            .iter()
            .filter_map(|block| convert_block(block, message.role, vision, cache_control))
            .collect();
        if content.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.role == role => last.content.extend(content),
            _ => out.push(WireMessage { role, content }),
        }
    }
    for message in &mut out {
        if message.role == "user" {
            // Anthropic wants the tool results of a user turn before anything else.
            message
                .content
                .sort_by_key(|b| b.get("type") != Some(&json!("tool_result")));
        }
    }
    out
}

fn object(value: Value) -> Option<Map<String, Value>> {
    match value {
        Value::Object(map) => Some(map),
        _ => None,
    }
}

/// One block on the wire, or `None` when it is not sent.
fn convert_block(
    block: &Block,
    role: Role,
    vision: bool,
    cache_control: &Value,
) -> Option<Map<String, Value>> {
    let mut converted = match &block.kind {
        BlockKind::Text { text } => text_block(text)?,
        BlockKind::Json { data } => text_block(&data.to_string())?,
        BlockKind::Artifact { .. } | BlockKind::InlineData { .. } => media_block(block, vision)?,
        BlockKind::Reasoning { text, .. } => {
            if role != Role::Assistant {
                return None;
            }
            let meta = block.provider_meta.get(PROVIDER)?;
            if let Some(data) = meta.get("redacted_data").and_then(Value::as_str) {
                object(json!({ "type": "redacted_thinking", "data": data }))?
            } else {
                let signature = meta.get("signature").and_then(Value::as_str)?;
                object(json!({ "type": "thinking", "thinking": text, "signature": signature }))?
            }
        }
        BlockKind::ToolCall {
            call_id,
            name,
            arguments,
        } => {
            let input = if arguments.is_object() {
                arguments.clone()
            } else {
                json!({})
            };
            object(json!({ "type": "tool_use", "id": call_id, "name": name, "input": input }))?
        }
        BlockKind::ToolResult { call_id, output } => {
            let mut parts: Vec<Map<String, Value>> = output
                .blocks
                .iter()
                .filter_map(|b| match &b.kind {
                    BlockKind::Text { text } => text_block(text),
                    BlockKind::Json { data } => text_block(&data.to_string()),
                    BlockKind::Artifact { .. } | BlockKind::InlineData { .. } => {
                        media_block(b, vision)
                    }
                    _ => None,
                })
                .collect();
            if parts.is_empty()
                && let Some(data) = &output.data
            {
                parts.extend(text_block(&data.to_string()));
            }
            let mut result = Map::new();
            result.insert("type".into(), json!("tool_result"));
            result.insert("tool_use_id".into(), json!(call_id));
            let only_text = parts.iter().all(|p| p.get("type") == Some(&json!("text")));
            if only_text {
                let text: Vec<&str> = parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect();
                if !text.is_empty() {
                    result.insert("content".into(), json!(text.join("\n")));
                }
            } else {
                result.insert(
                    "content".into(),
                    Value::Array(parts.into_iter().map(Value::Object).collect()),
                );
            }
            if output.is_error {
                result.insert("is_error".into(), json!(true));
            }
            result
        }
    };
    if block.cache_breakpoint {
        converted.insert("cache_control".into(), cache_control.clone());
    }
    Some(converted)
}

/// A text block, or `None` for empty (or blank) text, which Anthropic refuses.
fn text_block(text: &str) -> Option<Map<String, Value>> {
    if text.trim().is_empty() {
        return None;
    }
    object(json!({ "type": "text", "text": text }))
}

/// Images Anthropic reads inline.
const IMAGE_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/gif", "image/webp"];

/// An inline image as a base64 `image` block when the model has vision; any other file as a
/// text mention.
fn media_block(block: &Block, vision: bool) -> Option<Map<String, Value>> {
    match &block.kind {
        BlockKind::InlineData {
            media_type,
            data,
            name,
        } => {
            if vision && IMAGE_TYPES.contains(&media_type.as_str()) {
                return object(json!({
                    "type": "image",
                    "source": { "type": "base64", "media_type": media_type, "data": data },
                }));
            }
            let name = name.as_deref().unwrap_or("unnamed");
            let why = if media_type.starts_with("image/") && !vision {
                "this model cannot read images"
            } else {
                "this file type cannot be sent to the model"
            };
            text_block(&format!("[file {name} ({media_type}) not shown: {why}]"))
        }
        BlockKind::Artifact {
            uri,
            media_type,
            size,
            name,
        } => {
            let name = name.as_deref().unwrap_or("unnamed");
            text_block(&format!(
                "[file {name} ({media_type}, {size} bytes): {uri}]"
            ))
        }
        _ => None,
    }
}

// ------------------------------------------------------------------------------------------
// Error classification
// ------------------------------------------------------------------------------------------

/// The HTTP status Anthropic documents for each error type (used for in-stream errors, which
/// arrive with a 200).
fn implied_status(error_type: &str) -> Option<u16> {
    Some(match error_type {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "billing_error" => 402,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "api_error" => 500,
        "timeout_error" => 504,
        "overloaded_error" => 529,
        _ => return None,
    })
}

/// Classifies an Anthropic error: an HTTP error body (`status` = the HTTP status) or the data of
/// an in-stream `error` event (`status` = `Some(200)`, or `None`; the status its error `type`
/// stands for is then used). The reference's rules decide ([`crate::error::class_of`], the
/// error `type` as the hint), after two cases Anthropic reports as a plain
/// `invalid_request_error` that Loom reads by their message: a credit balance too low is
/// quota, an input that exceeds the context limit is context length.
pub fn classify(status: Option<u16>, body: &str, retry_after: Option<Duration>) -> ProviderError {
    let parsed: Option<Value> = serde_json::from_str(body.trim()).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    let error_type = error
        .and_then(|e| e.get("type"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let provider_message = error
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .map(str::to_string);

    let failed_status = status.filter(|s| !(200..300).contains(s));
    let effective = failed_status.or_else(|| error_type.as_deref().and_then(implied_status));
    let lower = provider_message.as_deref().unwrap_or("").to_lowercase();
    let invalid_request =
        error_type.as_deref() == Some("invalid_request_error") || effective == Some(400);

    let class = if invalid_request && lower.contains("credit balance is too low") {
        ErrorClass::Quota
    } else if invalid_request && lower.contains("exceed context limit") {
        ErrorClass::ContextLength
    } else {
        let hints: Vec<&str> = error_type.iter().map(String::as_str).collect();
        class_of(effective, &hints, provider_message.as_deref().unwrap_or(""))
    };

    let message = provider_message.unwrap_or_else(|| {
        let text = body.trim();
        let text: String = text.chars().take(500).collect();
        match (failed_status, text.is_empty()) {
            (Some(s), true) => format!("Anthropic answered HTTP {s}"),
            (Some(s), false) => format!("Anthropic answered HTTP {s}: {text}"),
            (None, true) => "Anthropic reported an error".to_string(),
            (None, false) => format!("Anthropic reported an error: {text}"),
        }
    });
    ProviderError {
        class,
        status,
        provider_code: error_type,
        message,
        retry_after,
    }
}

// ------------------------------------------------------------------------------------------
// Stream decoding
// ------------------------------------------------------------------------------------------

/// What each open content block is.
#[derive(Debug, Clone, PartialEq)]
enum OpenBlock {
    Text,
    Thinking,
    Tool(usize),
    Ignored,
}

/// The pure server-sent-events → chunks state machine of one answer.
///
/// Feed it each event's name and data in order ([`Decoder::feed`]), then call
/// [`Decoder::finish`] at end of stream. Text, reasoning and tool-argument fragments come out
/// as they arrive; one [`ModelChunk::Usage`] (the merged usage) and [`ModelChunk::Stopped`]
/// come out at `message_stop`. An `error` event gives the usage known so far, then one
/// classified error, and ends the answer; so does a stream cut before `message_stop`.
///
/// A `tool_use` block that never receives `content_block_stop` (cut by `max_tokens`) gets no
/// [`ModelChunk::ToolCallEnded`]: its arguments are incomplete and it must not be executed.
#[derive(Debug, Default)]
pub struct Decoder {
    model_id: String,
    blocks: Vec<(u64, OpenBlock)>,
    tools: usize,
    usage: Usage,
    usage_seen: bool,
    provider_stop_reason: Option<String>,
    done: bool,
}

/// A chunk or an error, as the decoder gives them.
pub type DecodedItem = Result<ModelChunk, ProviderError>;

impl Decoder {
    /// A decoder for one answer.
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Whether the answer is over (`message_stop` or an error): later events are ignored.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The raw `stop_reason` Anthropic sent, once `message_delta` has arrived.
    pub fn provider_stop_reason(&self) -> Option<&str> {
        self.provider_stop_reason.as_deref()
    }

    /// Decodes one event. `event` is the `event:` name (optional: dispatch is on `data.type`).
    pub fn feed(&mut self, event: Option<&str>, data: &str) -> Vec<DecodedItem> {
        let mut out = Vec::new();
        if self.done {
            return out;
        }
        let data = data.trim();
        if data.is_empty() {
            return out;
        }
        let value: Value = match serde_json::from_str(data) {
            Ok(value) => value,
            Err(e) => {
                self.fail(
                    ProviderError {
                        class: ErrorClass::Transient,
                        status: Some(200),
                        provider_code: None,
                        message: format!("Anthropic sent an event that is not JSON: {e}"),
                        retry_after: None,
                    },
                    &mut out,
                );
                return out;
            }
        };
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .or(event)
            .unwrap_or_default();
        match kind {
            "message_start" => {
                let message = value.get("message");
                if let Some(model) = message.and_then(|m| m.get("model")).and_then(Value::as_str) {
                    self.model_id = model.to_string();
                }
                if let Some(usage) = message.and_then(|m| m.get("usage")) {
                    self.merge_usage(usage);
                }
            }
            "content_block_start" => self.block_start(&value, &mut out),
            "content_block_delta" => self.block_delta(&value, &mut out),
            "content_block_stop" => {
                let index = value.get("index").and_then(Value::as_u64).unwrap_or(0);
                if let Some(position) = self.blocks.iter().position(|(i, _)| *i == index) {
                    let (_, block) = self.blocks.remove(position);
                    if let OpenBlock::Tool(tool) = block {
                        out.push(Ok(ModelChunk::ToolCallEnded { index: tool }));
                    }
                }
            }
            "message_delta" => {
                if let Some(reason) = value
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.provider_stop_reason = Some(reason.to_string());
                }
                if let Some(usage) = value.get("usage") {
                    self.merge_usage(usage);
                }
            }
            "message_stop" => {
                self.done = true;
                out.push(Ok(ModelChunk::Usage(self.usage)));
                out.push(Ok(ModelChunk::Stopped {
                    reason: stop_reason(self.provider_stop_reason.as_deref()),
                    model_id: self.model_id.clone(),
                }));
            }
            "error" => self.fail(classify(Some(200), data, None), &mut out),
            // `ping` and event types added later.
            _ => {}
        }
        out
    }

    /// Ends the answer at end of stream: nothing when it ended properly, otherwise the usage
    /// known so far and a transient "stream interrupted" error.
    pub fn finish(mut self) -> Vec<DecodedItem> {
        let mut out = Vec::new();
        if !self.done {
            self.fail(truncated("Anthropic"), &mut out);
        }
        out
    }

    fn fail(&mut self, error: ProviderError, out: &mut Vec<DecodedItem>) {
        if self.usage_seen {
            out.push(Ok(ModelChunk::Usage(self.usage)));
        }
        out.push(Err(error));
        self.done = true;
    }

    /// Merges a usage object: each field present replaces the one known (never added).
    fn merge_usage(&mut self, usage: &Value) {
        let field = |name: &str| usage.get(name).and_then(Value::as_u64);
        if let Some(n) = field("input_tokens") {
            self.usage.input_tokens = n;
        }
        if let Some(n) = field("output_tokens") {
            self.usage.output_tokens = n;
        }
        if let Some(n) = field("cache_read_input_tokens") {
            self.usage.cache_read_tokens = n;
        }
        if let Some(n) = field("cache_creation_input_tokens") {
            self.usage.cache_write_tokens = n;
        }
        self.usage_seen = true;
    }

    fn block_start(&mut self, value: &Value, out: &mut Vec<DecodedItem>) {
        let index = value.get("index").and_then(Value::as_u64).unwrap_or(0);
        let empty = Value::Null;
        let block = value.get("content_block").unwrap_or(&empty);
        let text = |name: &str| block.get(name).and_then(Value::as_str).unwrap_or_default();
        let open = match text("type") {
            "text" => {
                if !text("text").is_empty() {
                    out.push(Ok(ModelChunk::TextDelta(text("text").to_string())));
                }
                OpenBlock::Text
            }
            "thinking" => {
                let mut meta = Map::new();
                if !text("signature").is_empty() {
                    meta = anthropic_meta("signature", text("signature"));
                }
                out.push(Ok(ModelChunk::ReasoningDelta {
                    text: text("thinking").to_string(),
                    start: true,
                    provider_meta: meta,
                }));
                OpenBlock::Thinking
            }
            "redacted_thinking" => {
                out.push(Ok(ModelChunk::ReasoningDelta {
                    text: String::new(),
                    start: true,
                    provider_meta: anthropic_meta("redacted_data", text("data")),
                }));
                OpenBlock::Ignored
            }
            "tool_use" => {
                let tool = self.tools;
                self.tools += 1;
                out.push(Ok(ModelChunk::ToolCallStarted {
                    index: tool,
                    call_id: text("id").to_string(),
                    name: text("name").to_string(),
                }));
                // Streams start with `"input": {}`; a non-streamed input comes whole.
                if let Some(input) = block.get("input").and_then(Value::as_object)
                    && !input.is_empty()
                {
                    out.push(Ok(ModelChunk::ToolArgsDelta {
                        index: tool,
                        json_fragment: Value::Object(input.clone()).to_string(),
                    }));
                }
                OpenBlock::Tool(tool)
            }
            // Server tools, citations blocks and types added later are not surfaced.
            _ => OpenBlock::Ignored,
        };
        self.blocks.retain(|(i, _)| *i != index);
        self.blocks.push((index, open));
    }

    fn block_delta(&mut self, value: &Value, out: &mut Vec<DecodedItem>) {
        let index = value.get("index").and_then(Value::as_u64).unwrap_or(0);
        let Some(open) = self
            .blocks
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, b)| b.clone())
        else {
            return;
        };
        let empty = Value::Null;
        let delta = value.get("delta").unwrap_or(&empty);
        let text = |name: &str| delta.get(name).and_then(Value::as_str).unwrap_or_default();
        match (text("type"), open) {
            ("text_delta", OpenBlock::Text) if !text("text").is_empty() => {
                out.push(Ok(ModelChunk::TextDelta(text("text").to_string())));
            }
            ("thinking_delta", OpenBlock::Thinking) if !text("thinking").is_empty() => {
                out.push(Ok(ModelChunk::ReasoningDelta {
                    text: text("thinking").to_string(),
                    start: false,
                    provider_meta: Map::new(),
                }));
            }
            ("signature_delta", OpenBlock::Thinking) => {
                out.push(Ok(ModelChunk::ReasoningDelta {
                    text: String::new(),
                    start: false,
                    provider_meta: anthropic_meta("signature", text("signature")),
                }));
            }
            ("input_json_delta", OpenBlock::Tool(tool)) if !text("partial_json").is_empty() => {
                out.push(Ok(ModelChunk::ToolArgsDelta {
                    index: tool,
                    json_fragment: text("partial_json").to_string(),
                }));
            }
            _ => {}
        }
    }
}

/// `{"anthropic": {key: value}}`.
fn anthropic_meta(key: &str, value: &str) -> Map<String, Value> {
    let mut meta = Map::new();
    meta.insert(PROVIDER.into(), json!({ key: value }));
    meta
}

/// The normalized stop reason of Anthropic's `stop_reason` (`end_turn` when absent).
pub fn stop_reason(provider: Option<&str>) -> StopReason {
    match provider {
        Some("tool_use") => StopReason::ToolUse,
        Some("max_tokens" | "model_context_window_exceeded") => StopReason::MaxTokens,
        Some("refusal") => StopReason::Refusal,
        // end_turn, stop_sequence, pause_turn and values added later.
        _ => StopReason::End,
    }
}

/// Reads the whole JSON answer of a non-streamed call (a `message` object) into the chunks its
/// stream would have given: its content blocks in order (text, thinking with its signature,
/// redacted thinking, tool calls with their whole input), then the usage and the stop. A body
/// that is not JSON is a transient error; an `error` object is classified as in a stream.
pub fn decode_message(body: &str) -> Vec<DecodedItem> {
    let value: Value = match serde_json::from_str(body.trim()) {
        Ok(value) => value,
        Err(e) => {
            return vec![Err(ProviderError {
                class: ErrorClass::Transient,
                status: Some(200),
                provider_code: None,
                message: format!("Anthropic sent an answer that is not JSON: {e}"),
                retry_after: None,
            })];
        }
    };
    if value.get("type").and_then(Value::as_str) == Some("error") || value.get("error").is_some() {
        return vec![Err(classify(Some(200), body, None))];
    }
    let mut decoder = Decoder::new();
    let mut out = Vec::new();
    let mut start = Map::new();
    if let Some(model) = value.get("model").filter(|m| m.is_string()) {
        start.insert("model".into(), model.clone());
    }
    if let Some(usage) = value.get("usage").filter(|u| u.is_object()) {
        start.insert("usage".into(), usage.clone());
    }
    let mut events = vec![json!({"type": "message_start", "message": start})];
    let blocks = value
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for (index, block) in blocks.iter().enumerate() {
        events.push(json!({"type": "content_block_start", "index": index, "content_block": block}));
        events.push(json!({"type": "content_block_stop", "index": index}));
    }
    let stop_reason = value.get("stop_reason").cloned().unwrap_or(Value::Null);
    events.push(json!({"type": "message_delta", "delta": {"stop_reason": stop_reason}}));
    events.push(json!({"type": "message_stop"}));
    for event in events {
        out.extend(decoder.feed(None, &event.to_string()));
    }
    out.extend(decoder.finish());
    out
}

/// Decodes an SSE body (any byte chunking) into chunks: SSE framing by `sse-stream`, then
/// [`Decoder`]. The stream ends after `Stopped` or the first error.
pub fn decode_sse<S, E>(bytes: S) -> BoxStream<'static, DecodedItem>
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    struct State<T> {
        events: T,
        decoder: Option<Decoder>,
        pending: VecDeque<DecodedItem>,
    }
    let state = State {
        events: sse_stream::SseStream::from_bytes_stream(bytes),
        decoder: Some(Decoder::new()),
        pending: VecDeque::new(),
    };
    Box::pin(stream::unfold(state, |mut state| async move {
        loop {
            if let Some(item) = state.pending.pop_front() {
                return Some((item, state));
            }
            let decoder = state.decoder.as_mut()?;
            if decoder.is_done() {
                state.decoder = None;
                continue;
            }
            match state.events.next().await {
                Some(Ok(event)) => {
                    if let Some(data) = &event.data {
                        state
                            .pending
                            .extend(decoder.feed(event.event.as_deref(), data));
                    }
                }
                Some(Err(e)) => {
                    let message = match e {
                        sse_stream::Error::Body(e) => format!("network error: {e}"),
                        other => format!("Anthropic sent an invalid event stream: {other}"),
                    };
                    let mut out = Vec::new();
                    decoder.fail(
                        ProviderError {
                            class: ErrorClass::Transient,
                            status: Some(200),
                            provider_code: None,
                            message,
                            retry_after: None,
                        },
                        &mut out,
                    );
                    state.pending.extend(out);
                }
                None => {
                    if let Some(decoder) = state.decoder.take() {
                        state.pending.extend(decoder.finish());
                    }
                }
            }
        }
    }))
}

// ------------------------------------------------------------------------------------------
// The client
// ------------------------------------------------------------------------------------------

/// An Anthropic model behind the model port: one streamed HTTP attempt per call.
#[derive(Debug, Clone)]
pub struct AnthropicModel {
    options: ProviderOptions,
    settings: AnthropicSettings,
    client: reqwest::Client,
}

impl AnthropicModel {
    /// A client for `options.model`.
    pub fn new(
        options: ProviderOptions,
        settings: AnthropicSettings,
    ) -> Result<AnthropicModel, ProviderError> {
        let client = http::client(&options)?;
        Ok(AnthropicModel {
            options,
            settings,
            client,
        })
    }

    /// The options in use.
    pub fn options(&self) -> &ProviderOptions {
        &self.options
    }

    /// The settings in use.
    pub fn settings(&self) -> &AnthropicSettings {
        &self.settings
    }

    /// The HTTP request of one call.
    fn http_request(&self, request: &ModelRequest) -> reqwest::RequestBuilder {
        let body = build_request(&self.options, &self.settings, request);
        let mut builder = self.client.post(endpoint(&self.options));
        for (name, value) in headers(&self.options) {
            builder = builder.header(name, value);
        }
        builder.body(body.to_string())
    }

    /// Adds the hint an auth error needs when no key was sent.
    fn explain(&self, mut error: ProviderError) -> ProviderError {
        if error.class == ErrorClass::Auth && self.options.api_key.is_none() {
            error.message.push_str(&format!(
                " — no API key was sent: model {} has no api_key_env (declare for example \
                 api_key_env: ANTHROPIC_API_KEY)",
                self.options.model
            ));
        }
        error
    }
}

impl ModelClient for AnthropicModel {
    fn provider(&self) -> &str {
        PROVIDER
    }

    fn stream(&self, request: &ModelRequest) -> BoxStream<'static, Result<ModelChunk, ModelError>> {
        let builder = self.http_request(request);
        let this = self.clone();
        let recorder = Recorder::for_options(&self.options);
        let recording = recorder.clone();
        let streaming = self.settings.streaming;
        let response = async move {
            let items: BoxStream<'static, DecodedItem> = match http::post(builder, recording).await
            {
                Err(error) => Box::pin(stream::iter([Err(error)])),
                Ok(Response::Failed {
                    status,
                    retry_after,
                    body,
                }) => Box::pin(stream::iter([Err(classify(
                    Some(status),
                    &body,
                    retry_after,
                ))])),
                Ok(Response::Stream(bytes)) if streaming => decode_sse(bytes),
                Ok(Response::Stream(bytes)) => match http::whole(bytes).await {
                    Ok(body) => Box::pin(stream::iter(decode_message(&String::from_utf8_lossy(
                        &body,
                    )))),
                    Err(error) => Box::pin(stream::iter([Err(error)])),
                },
            };
            items.map(move |item| item.map_err(|e| ModelError::from(this.explain(e))))
        };
        capture::finish(Box::pin(stream::once(response).flatten()), recorder)
    }
}
