//! OpenAI Chat Completions (`POST {base}/chat/completions`, streamed), and every provider that
//! speaks it: Ollama, vLLM, OpenRouter, DeepSeek, Together, MiniMax…
//!
//! Requests: the system prompt as the first message, tool results as `tool` messages linked by
//! `tool_call_id` (error results start with `"[error] "`), images as `data:` URLs in user
//! messages when the model has vision (a mention of the file otherwise, and always in tool
//! results), `response_format` json_schema for native JSON output (strict only when the schema
//! qualifies), reasoning echoed back only inside the current tool loop when `thinking` is set.
//!
//! Stream: text from `delta.content`, reasoning from `delta.reasoning_content` /
//! `delta.reasoning`, refusals from `delta.refusal` (kept as the answer's text, stop reason
//! refusal), tool calls assembled by `index` (ids generated when missing), usage from any chunk
//! that carries it, a chunk with a top-level `error` as a classified error. The answer ends at
//! `data: [DONE]` (or at the end of the body after a `finish_reason`).
//!
//! A model declared `capabilities: {streaming: false}` is asked without `stream`, and its
//! whole `chat.completion` answer (`choices[0].message`) is read into the same chunks.

use std::{collections::HashMap, sync::Arc};

use loom_core::{
    BoxStream,
    content::{Block, BlockKind, Message, Role},
    model::{ModelChunk, ModelClient, ModelError, ModelRequest, StopReason, ToolChoice},
    usage::Usage,
};
use reqwest::header::HeaderMap;
use serde_json::{Map, Value, json};

use crate::{error::ProviderError, http::ProviderOptions};

pub(crate) mod shared;

use shared::{SseDecoder, count, data_url, mention, openai_meta, strict_schema, tool_result_text};
pub use shared::{classify, retry_after};

/// What the model can do, from its capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatSettings {
    /// Images go to the model as `data:` URLs (else a mention of the file).
    pub vision: bool,
    /// `response_format: json_schema` when the request has an output schema.
    pub native_json: bool,
    /// Reasoning is echoed back inside a tool loop (DeepSeek-style `reasoning_content`).
    pub thinking: bool,
    /// Answers are streamed (`stream: true`); `false` for servers that cannot stream: the
    /// request goes without `stream` and the whole `chat.completion` is read as chunks.
    pub streaming: bool,
}

impl Default for ChatSettings {
    /// No vision, native JSON nor thinking; streamed.
    fn default() -> Self {
        ChatSettings {
            vision: false,
            native_json: false,
            thinking: false,
            streaming: true,
        }
    }
}

/// A Chat Completions model.
pub struct OpenAiChatModel {
    options: ProviderOptions,
    settings: ChatSettings,
    client: reqwest::Client,
    headers: HeaderMap,
    url: String,
}

impl std::fmt::Debug for OpenAiChatModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiChatModel")
            .field("options", &self.options)
            .field("settings", &self.settings)
            .field("url", &self.url)
            .finish()
    }
}

impl OpenAiChatModel {
    /// A client for `options` (invalid header names or values are refused here).
    pub fn new(options: ProviderOptions, settings: ChatSettings) -> Result<Self, ProviderError> {
        let client = crate::http::client(&options)?;
        let headers = shared::headers(&options)?;
        let url = shared::endpoint(&options.base_url, "chat/completions");
        Ok(OpenAiChatModel {
            options,
            settings,
            client,
            headers,
            url,
        })
    }

    /// The endpoint requests go to.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl ModelClient for OpenAiChatModel {
    fn provider(&self) -> &str {
        "openai"
    }

    fn stream(&self, request: &ModelRequest) -> BoxStream<'static, Result<ModelChunk, ModelError>> {
        let body = build_request(&self.options, &self.settings, request);
        let builder = self
            .client
            .post(&self.url)
            .headers(self.headers.clone())
            .json(&body);
        let label = if request.model_id.is_empty() {
            self.options.model.clone()
        } else {
            request.model_id.clone()
        };
        shared::post_stream(
            builder,
            self.options.clone(),
            label,
            ChatDecoder::new(self.options.model.clone()),
            self.settings.streaming,
        )
    }
}

/// The request body for `request` (pure).
pub fn build_request(
    options: &ProviderOptions,
    settings: &ChatSettings,
    request: &ModelRequest,
) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), Value::String(options.model.clone()));
    body.insert("messages".into(), Value::Array(messages(settings, request)));
    if settings.streaming {
        body.insert("stream".into(), Value::Bool(true));
        body.insert("stream_options".into(), json!({ "include_usage": true }));
    }
    let max_tokens = request.max_tokens.or(options.max_tokens);
    match request.params.get("max_completion_tokens") {
        // `max_completion_tokens: true` asks for the newer name; a number is sent as given.
        Some(Value::Bool(true)) => {
            if let Some(n) = max_tokens {
                body.insert("max_completion_tokens".into(), n.into());
            }
        }
        Some(v) if !v.is_null() => {}
        _ => {
            if let Some(n) = max_tokens {
                body.insert("max_tokens".into(), n.into());
            }
        }
    }
    if !request.tools.is_empty() {
        let tools = request
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": shared::parameters(&t.input_schema),
                    }
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        body.insert(
            "tool_choice".into(),
            Value::String(tool_choice(request.tool_choice).into()),
        );
    }
    if settings.native_json
        && let Some(schema) = &request.output_schema
    {
        let mut format = Map::new();
        format.insert("name".into(), "output".into());
        format.insert("schema".into(), schema.clone());
        if strict_schema(schema) {
            format.insert("strict".into(), Value::Bool(true));
        }
        body.insert(
            "response_format".into(),
            json!({ "type": "json_schema", "json_schema": format }),
        );
    }
    let mut params = Arc::clone(&request.params);
    if params.get("max_completion_tokens") == Some(&Value::Bool(true)) {
        Arc::make_mut(&mut params).remove("max_completion_tokens");
    }
    shared::merge_params(&mut body, &params, settings.streaming);
    Value::Object(body)
}

pub(crate) fn tool_choice(choice: ToolChoice) -> &'static str {
    match choice {
        ToolChoice::Auto => "auto",
        ToolChoice::None => "none",
        ToolChoice::Required => "required",
    }
}

fn messages(settings: &ChatSettings, request: &ModelRequest) -> Vec<Value> {
    let mut out = Vec::new();
    if !request.system.is_empty() {
        out.push(json!({ "role": "system", "content": request.system }));
    }
    // The current tool loop: everything after the last user message.
    let loop_start = request
        .messages
        .iter()
        .rposition(|m| m.role == Role::User)
        .map_or(0, |i| i + 1);
    for (i, message) in request.messages.iter().enumerate() {
        match message.role {
            Role::User => out.push(user_message(settings, &message.blocks)),
            Role::Assistant => out.push(assistant_message(
                message,
                settings.thinking && i >= loop_start,
            )),
            Role::Tool => {
                let mut others = Vec::new();
                for block in &message.blocks {
                    match &block.kind {
                        BlockKind::ToolResult { call_id, output } => out.push(json!({
                            "role": "tool",
                            "tool_call_id": call_id,
                            "content": tool_result_text(output),
                        })),
                        _ => others.push(block.clone()),
                    }
                }
                if !others.is_empty() {
                    out.push(user_message(settings, &others));
                }
            }
        }
    }
    out
}

fn user_message(settings: &ChatSettings, blocks: &[Block]) -> Value {
    let mut parts: Vec<Value> = Vec::new();
    let mut has_image = false;
    for block in blocks {
        match &block.kind {
            BlockKind::Text { text } => parts.push(json!({ "type": "text", "text": text })),
            BlockKind::Json { data } => {
                parts.push(json!({ "type": "text", "text": data.to_string() }))
            }
            BlockKind::InlineData {
                media_type, data, ..
            } if settings.vision && media_type.starts_with("image/") => {
                has_image = true;
                parts.push(json!({ "type": "image_url", "image_url": { "url": data_url(media_type, data) } }));
            }
            _ => {
                if let Some(text) = mention(block) {
                    parts.push(json!({ "type": "text", "text": text }));
                }
            }
        }
    }
    if has_image {
        return json!({ "role": "user", "content": parts });
    }
    let texts: Vec<&str> = parts.iter().filter_map(|p| p["text"].as_str()).collect();
    json!({ "role": "user", "content": texts.join("\n") })
}

fn assistant_message(message: &Message, echo_reasoning: bool) -> Value {
    let mut text = Vec::new();
    let mut calls = Vec::new();
    let mut reasoning: Option<(String, String)> = None;
    for block in &message.blocks {
        match &block.kind {
            BlockKind::Text { text: t } if !t.is_empty() => text.push(t.as_str()),
            BlockKind::ToolCall {
                call_id,
                name,
                arguments,
            } => calls.push(json!({
                "id": call_id,
                "type": "function",
                "function": { "name": name, "arguments": arguments.to_string() },
            })),
            BlockKind::Reasoning { text: t, .. } if echo_reasoning && !t.is_empty() => {
                // Only reasoning this API produced (other providers' blocks have no field).
                let Some(field) = block
                    .provider_meta
                    .get("openai")
                    .and_then(|m| m.get("reasoning_field"))
                else {
                    continue;
                };
                let field = field.as_str().unwrap_or("reasoning_content").to_owned();
                match &mut reasoning {
                    Some((_, all)) => all.push_str(t),
                    None => reasoning = Some((field, t.clone())),
                }
            }
            _ => {}
        }
    }
    let mut out = Map::new();
    out.insert("role".into(), "assistant".into());
    let content = if text.is_empty() && !calls.is_empty() {
        Value::Null
    } else {
        Value::String(text.join("\n"))
    };
    out.insert("content".into(), content);
    if let Some((field, all)) = reasoning {
        out.insert(field, Value::String(all));
    }
    if !calls.is_empty() {
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    Value::Object(out)
}

/// Our usage from a Chat `usage` object: cached and written tokens are taken out of the prompt.
pub(crate) fn usage(u: &Value) -> Usage {
    let prompt = count(u, &["prompt_tokens"]).unwrap_or(0);
    let cached = count(u, &["prompt_tokens_details", "cached_tokens"])
        .or_else(|| count(u, &["prompt_cache_hit_tokens"]))
        .unwrap_or(0);
    let written = count(u, &["prompt_tokens_details", "cache_write_tokens"]).unwrap_or(0);
    Usage {
        input_tokens: prompt.saturating_sub(cached + written),
        output_tokens: count(u, &["completion_tokens"]).unwrap_or(0),
        cache_read_tokens: cached,
        cache_write_tokens: written,
        reasoning_tokens: count(u, &["completion_tokens_details", "reasoning_tokens"]).unwrap_or(0),
    }
}

#[derive(Debug)]
struct Call {
    id: Option<String>,
    name: String,
    started: bool,
    pending: String,
}

/// Decodes the `data:` payloads of a Chat Completions stream into chunks.
#[derive(Debug)]
pub struct ChatDecoder {
    model: String,
    calls: Vec<Call>,
    by_index: HashMap<u64, usize>,
    finish_reason: Option<String>,
    refusal: bool,
    in_reasoning: bool,
    done: bool,
}

impl ChatDecoder {
    /// A decoder; `model` names the answering model until a chunk says otherwise.
    pub fn new(model: impl Into<String>) -> ChatDecoder {
        ChatDecoder {
            model: model.into(),
            calls: Vec::new(),
            by_index: HashMap::new(),
            finish_reason: None,
            refusal: false,
            in_reasoning: false,
            done: false,
        }
    }

    /// The raw `finish_reason`, once one arrived.
    pub fn provider_stop_reason(&self) -> Option<&str> {
        self.finish_reason.as_deref()
    }

    /// Whether the stop chunk or an error went out (later data is ignored).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// One `data:` payload.
    pub fn feed(&mut self, data: &str) -> Vec<Result<ModelChunk, ProviderError>> {
        let mut out = Vec::new();
        if self.done {
            return out;
        }
        let data = data.trim();
        if data.is_empty() {
            return out;
        }
        if data == "[DONE]" {
            self.stop(&mut out);
            return out;
        }
        let chunk: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => {
                self.done = true;
                out.push(Err(shared::invalid_json(&e)));
                return out;
            }
        };
        if let Some(model) = chunk
            .get("model")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
        {
            self.model = model.to_owned();
        }
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            out.push(Ok(ModelChunk::Usage(usage(u))));
        }
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            self.done = true;
            let error = if error.is_object() {
                error.clone()
            } else {
                json!({ "message": error.to_string() })
            };
            out.push(Err(shared::classify_error(Some(200), &error, None)));
            return out;
        }
        let choices = chunk
            .get("choices")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for choice in choices {
            if choice.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                continue;
            }
            if let Some(delta) = choice.get("delta").or_else(|| choice.get("message")) {
                self.delta(delta, &mut out);
            }
            if let Some(reason) = choice
                .get("finish_reason")
                .and_then(Value::as_str)
                .filter(|r| !r.is_empty())
            {
                self.finish_reason = Some(reason.to_owned());
            }
        }
        out
    }

    /// The end of the body: the stop chunk after a `finish_reason`, else a truncation error.
    pub fn finish(mut self) -> Vec<Result<ModelChunk, ProviderError>> {
        let mut out = Vec::new();
        if self.done {
            return out;
        }
        if self.finish_reason.is_some() {
            self.stop(&mut out);
        } else {
            self.done = true;
            out.push(Err(shared::interrupted()));
        }
        out
    }

    fn delta(&mut self, delta: &Value, out: &mut Vec<Result<ModelChunk, ProviderError>>) {
        let reasoning = ["reasoning_content", "reasoning"]
            .into_iter()
            .find_map(|field| delta.get(field).and_then(Value::as_str).map(|t| (field, t)));
        if let Some((field, text)) = reasoning.filter(|(_, t)| !t.is_empty()) {
            let mut meta = Map::new();
            meta.insert("reasoning_field".into(), field.into());
            out.push(Ok(ModelChunk::ReasoningDelta {
                text: text.to_owned(),
                start: !self.in_reasoning,
                provider_meta: openai_meta(meta),
            }));
            self.in_reasoning = true;
        }
        if let Some(text) = delta
            .get("content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            self.in_reasoning = false;
            out.push(Ok(ModelChunk::TextDelta(text.to_owned())));
        }
        if let Some(text) = delta
            .get("refusal")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            self.in_reasoning = false;
            self.refusal = true;
            out.push(Ok(ModelChunk::TextDelta(text.to_owned())));
        }
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            self.in_reasoning = false;
            for (position, entry) in calls.iter().enumerate() {
                self.tool_call(position, entry, out);
            }
        }
    }

    fn tool_call(
        &mut self,
        position: usize,
        entry: &Value,
        out: &mut Vec<Result<ModelChunk, ProviderError>>,
    ) {
        let key = entry
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or(position as u64);
        let id = entry
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let function = entry.get("function");
        let name = function
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let arguments = match function.and_then(|f| f.get("arguments")) {
            Some(Value::String(s)) => s.clone(),
            Some(v @ Value::Object(_)) => v.to_string(),
            _ => String::new(),
        };
        let existing = self.by_index.get(&key).copied().filter(|&i| {
            // A new id at a known index is a new call (some servers reuse index 0).
            !matches!((id, self.calls[i].id.as_deref()), (Some(new), Some(old)) if new != old)
        });
        let i = match existing {
            Some(i) => i,
            None => {
                self.calls.push(Call {
                    id: None,
                    name: String::new(),
                    started: false,
                    pending: String::new(),
                });
                self.by_index.insert(key, self.calls.len() - 1);
                self.calls.len() - 1
            }
        };
        let call = &mut self.calls[i];
        if let Some(id) = id
            && call.id.is_none()
        {
            call.id = Some(id.to_owned());
        }
        if !call.started
            && let Some(name) = name
        {
            call.name.push_str(name);
        }
        call.pending.push_str(&arguments);
        if !call.name.is_empty() || call.started {
            Self::start(i, call, out);
        }
    }

    fn start(index: usize, call: &mut Call, out: &mut Vec<Result<ModelChunk, ProviderError>>) {
        if !call.started {
            call.started = true;
            out.push(Ok(ModelChunk::ToolCallStarted {
                index,
                call_id: call.id.clone().unwrap_or_else(|| format!("call_{index}")),
                name: call.name.clone(),
            }));
        }
        if !call.pending.is_empty() {
            out.push(Ok(ModelChunk::ToolArgsDelta {
                index,
                json_fragment: std::mem::take(&mut call.pending),
            }));
        }
    }

    fn stop(&mut self, out: &mut Vec<Result<ModelChunk, ProviderError>>) {
        self.done = true;
        for (i, call) in self.calls.iter_mut().enumerate() {
            Self::start(i, call, out);
            out.push(Ok(ModelChunk::ToolCallEnded { index: i }));
        }
        let reason = if self.refusal {
            StopReason::Refusal
        } else {
            match self.finish_reason.as_deref() {
                Some("tool_calls" | "function_call") => StopReason::ToolUse,
                Some("length") => StopReason::MaxTokens,
                Some("content_filter") => StopReason::Refusal,
                _ if !self.calls.is_empty() => StopReason::ToolUse,
                _ => StopReason::End,
            }
        };
        out.push(Ok(ModelChunk::Stopped {
            reason,
            model_id: self.model.clone(),
        }));
    }
}

impl SseDecoder for ChatDecoder {
    fn on_event(
        &mut self,
        _event: Option<&str>,
        data: &str,
    ) -> Vec<Result<ModelChunk, ProviderError>> {
        self.feed(data)
    }

    fn on_end(self) -> Vec<Result<ModelChunk, ProviderError>> {
        self.finish()
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn on_json(&mut self, body: &str) -> Vec<Result<ModelChunk, ProviderError>> {
        // A `chat.completion` object: `choices[].message` instead of `delta`.
        let out = self.feed(body);
        if !self.done && self.finish_reason.is_none() {
            self.finish_reason = Some("stop".into());
        }
        out
    }
}

/// Decodes a Chat Completions body (SSE bytes) into chunks, as [`ModelClient::stream`] does.
pub fn decode_stream<S, E>(
    bytes: S,
    model: impl Into<String>,
) -> BoxStream<'static, Result<ModelChunk, ProviderError>>
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, E>> + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    shared::drive(bytes, ChatDecoder::new(model))
}
