//! OpenAI Responses API (`POST {base}/responses`, streamed, stateless: `store: false`).
//!
//! Requests: `instructions` for the system prompt, `input` items (`message` with
//! `input_text`/`input_image`/`output_text` parts, `function_call` {call_id, name, arguments},
//! `function_call_output` {call_id, output}, `reasoning` items echoed back with their
//! `encrypted_content`), function tools (strict only when the schema qualifies), native JSON
//! output through `text.format`, `max_output_tokens`.
//!
//! Stream: dispatch on `data.type` (the `event:` line may be missing); text from
//! `response.output_text.delta`, reasoning from `response.reasoning_summary_text.delta` /
//! `response.reasoning_text.delta` (the item's id and encrypted content kept in the block's
//! `provider_meta.openai`), function calls from `output_item.added` / `function_call_arguments.*`
//! / `output_item.done` (the id used to reply is `call_id`, not the item id), refusals kept as
//! the answer's text with stop reason refusal. The answer ends at `response.completed` or
//! `response.incomplete`; `response.failed` and `error` events are classified errors (one error
//! when both arrive).
//!
//! A model declared `capabilities: {streaming: false}` is asked without `stream`, and its whole
//! `response` object is read into the same chunks (as its terminal event).

use std::sync::Arc;

use loom_core::{
    BoxStream,
    content::{BlockKind, Message, Role},
    model::{ModelChunk, ModelClient, ModelError, ModelRequest, StopReason},
    usage::Usage,
};
use reqwest::header::HeaderMap;
use serde_json::{Map, Value, json};

use crate::{
    error::ProviderError,
    http::ProviderOptions,
    openai_chat::shared::{
        self, SseDecoder, count, data_url, mention, openai_meta, strict_schema, tool_result_text,
    },
};

pub use crate::openai_chat::{classify, retry_after};

/// What the model can do, from its capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponsesSettings {
    /// Images go to the model as `input_image` data URLs (else a mention of the file).
    pub vision: bool,
    /// `text.format: json_schema` when the request has an output schema.
    pub native_json: bool,
    /// A reasoning model: ask for `reasoning.encrypted_content` (non-reasoning models refuse
    /// that `include`).
    pub reasoning: bool,
    /// Answers are streamed (`stream: true`); `false` for servers that cannot stream: the
    /// request goes without `stream` and the whole `response` object is read as chunks.
    pub streaming: bool,
}

impl Default for ResponsesSettings {
    /// No vision, native JSON nor reasoning; streamed.
    fn default() -> Self {
        ResponsesSettings {
            vision: false,
            native_json: false,
            reasoning: false,
            streaming: true,
        }
    }
}

/// A Responses API model.
pub struct OpenAiResponsesModel {
    options: ProviderOptions,
    settings: ResponsesSettings,
    client: reqwest::Client,
    headers: HeaderMap,
    url: String,
}

impl std::fmt::Debug for OpenAiResponsesModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiResponsesModel")
            .field("options", &self.options)
            .field("settings", &self.settings)
            .field("url", &self.url)
            .finish()
    }
}

impl OpenAiResponsesModel {
    /// A client for `options` (invalid header names or values are refused here).
    pub fn new(
        options: ProviderOptions,
        settings: ResponsesSettings,
    ) -> Result<Self, ProviderError> {
        let client = crate::http::client(&options)?;
        let headers = shared::headers(&options)?;
        let url = shared::endpoint(&options.base_url, "responses");
        Ok(OpenAiResponsesModel {
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

impl ModelClient for OpenAiResponsesModel {
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
            ResponsesDecoder::new(self.options.model.clone()),
            self.settings.streaming,
        )
    }
}

/// The request body for `request` (pure).
pub fn build_request(
    options: &ProviderOptions,
    settings: &ResponsesSettings,
    request: &ModelRequest,
) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), Value::String(options.model.clone()));
    if !request.system.is_empty() {
        body.insert("instructions".into(), Value::String(request.system.clone()));
    }
    body.insert(
        "input".into(),
        Value::Array(input(settings, &request.messages)),
    );
    if settings.streaming {
        body.insert("stream".into(), Value::Bool(true));
    }
    body.insert("store".into(), Value::Bool(false));
    if settings.reasoning {
        body.insert("include".into(), json!(["reasoning.encrypted_content"]));
    }
    if let Some(n) = request.max_tokens.or(options.max_tokens) {
        body.insert("max_output_tokens".into(), n.into());
    }
    if !request.tools.is_empty() {
        let tools = request
            .tools
            .iter()
            .map(|t| {
                let parameters = shared::parameters(&t.input_schema);
                // Responses makes omitted `strict` mean "strict when possible": say it.
                let strict = strict_schema(&parameters);
                json!({
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": parameters,
                    "strict": strict,
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        body.insert(
            "tool_choice".into(),
            Value::String(crate::openai_chat::tool_choice(request.tool_choice).into()),
        );
    }
    if settings.native_json
        && let Some(schema) = &request.output_schema
    {
        let mut format = Map::new();
        format.insert("type".into(), "json_schema".into());
        format.insert("name".into(), "output".into());
        format.insert("schema".into(), schema.clone());
        format.insert("strict".into(), Value::Bool(strict_schema(schema)));
        body.insert("text".into(), json!({ "format": format }));
    }
    shared::merge_params(&mut body, &request.params, settings.streaming);
    Value::Object(body)
}

fn input(settings: &ResponsesSettings, messages: &[Arc<Message>]) -> Vec<Value> {
    let mut out = Vec::new();
    for message in messages {
        match message.role {
            Role::User => {
                let content = user_content(settings, message);
                if !content.is_empty() {
                    out.push(json!({ "type": "message", "role": "user", "content": content }));
                }
            }
            Role::Assistant => assistant_items(message, &mut out),
            Role::Tool => {
                let mut others = Vec::new();
                for block in &message.blocks {
                    match &block.kind {
                        BlockKind::ToolResult { call_id, output } => out.push(json!({
                            "type": "function_call_output",
                            "call_id": call_id,
                            "output": tool_result_text(output),
                        })),
                        _ => others.push(block.clone()),
                    }
                }
                if !others.is_empty() {
                    let content = user_content(
                        settings,
                        &Message {
                            role: Role::User,
                            blocks: others,
                        },
                    );
                    out.push(json!({ "type": "message", "role": "user", "content": content }));
                }
            }
        }
    }
    out
}

fn user_content(settings: &ResponsesSettings, message: &Message) -> Vec<Value> {
    let mut parts = Vec::new();
    for block in &message.blocks {
        match &block.kind {
            BlockKind::Text { text } => parts.push(json!({ "type": "input_text", "text": text })),
            BlockKind::Json { data } => {
                parts.push(json!({ "type": "input_text", "text": data.to_string() }))
            }
            BlockKind::InlineData {
                media_type, data, ..
            } if settings.vision && media_type.starts_with("image/") => {
                parts.push(
                    json!({ "type": "input_image", "image_url": data_url(media_type, data) }),
                );
            }
            _ => {
                if let Some(text) = mention(block) {
                    parts.push(json!({ "type": "input_text", "text": text }));
                }
            }
        }
    }
    parts
}

fn assistant_items(message: &Message, out: &mut Vec<Value>) {
    let mut text = String::new();
    let flush = |text: &mut String, out: &mut Vec<Value>| {
        if !text.is_empty() {
            out.push(json!({
                "type": "message",
                "role": "assistant",
                "content": [{ "type": "output_text", "text": std::mem::take(text) }],
            }));
        }
    };
    for block in &message.blocks {
        match &block.kind {
            BlockKind::Text { text: t } => text.push_str(t),
            BlockKind::ToolCall {
                call_id,
                name,
                arguments,
            } => {
                flush(&mut text, out);
                out.push(json!({
                    "type": "function_call",
                    "call_id": call_id,
                    "name": name,
                    "arguments": arguments.to_string(),
                }));
            }
            BlockKind::Reasoning { text: t, .. } => {
                // Replayable only with its encrypted content (store: false keeps nothing, so the
                // item id is not sent: the server would look it up and fail).
                let Some(encrypted) = block
                    .provider_meta
                    .get("openai")
                    .and_then(|m| m.get("encrypted_content"))
                    .and_then(Value::as_str)
                else {
                    continue;
                };
                flush(&mut text, out);
                let summary: Vec<Value> = if t.is_empty() {
                    Vec::new()
                } else {
                    vec![json!({ "type": "summary_text", "text": t })]
                };
                out.push(json!({ "type": "reasoning", "summary": summary, "encrypted_content": encrypted }));
            }
            _ => {}
        }
    }
    flush(&mut text, out);
}

/// Our usage from a Responses `usage` object: cached and written tokens are taken out of the
/// input.
pub(crate) fn usage(u: &Value) -> Usage {
    let input = count(u, &["input_tokens"]).unwrap_or(0);
    let cached = count(u, &["input_tokens_details", "cached_tokens"]).unwrap_or(0);
    let written = count(u, &["input_tokens_details", "cache_write_tokens"]).unwrap_or(0);
    Usage {
        input_tokens: input.saturating_sub(cached + written),
        output_tokens: count(u, &["output_tokens"]).unwrap_or(0),
        cache_read_tokens: cached,
        cache_write_tokens: written,
        reasoning_tokens: count(u, &["output_tokens_details", "reasoning_tokens"]).unwrap_or(0),
    }
}

#[derive(Debug)]
struct Call {
    item_id: Option<String>,
    output_index: Option<u64>,
    arguments: String,
    ended: bool,
}

#[derive(Debug)]
struct Reasoning {
    item_id: Option<String>,
    started: bool,
    summary_index: Option<u64>,
}

/// Decodes the events of a Responses stream into chunks.
#[derive(Debug)]
pub struct ResponsesDecoder {
    model: String,
    calls: Vec<Call>,
    reasoning: Option<Reasoning>,
    refusal: bool,
    streamed: bool,
    pending_error: Option<ProviderError>,
    status: Option<String>,
    done: bool,
}

type Out = Vec<Result<ModelChunk, ProviderError>>;

impl ResponsesDecoder {
    /// A decoder; `model` names the answering model until an event says otherwise.
    pub fn new(model: impl Into<String>) -> ResponsesDecoder {
        ResponsesDecoder {
            model: model.into(),
            calls: Vec::new(),
            reasoning: None,
            refusal: false,
            streamed: false,
            pending_error: None,
            status: None,
            done: false,
        }
    }

    /// The raw final status (`completed`, `incomplete/max_output_tokens`, `failed`).
    pub fn provider_stop_reason(&self) -> Option<&str> {
        self.status.as_deref()
    }

    /// Whether the stop chunk or an error went out (later events are ignored).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// One event: its `event:` name (optional: `data.type` decides) and its data.
    pub fn feed(&mut self, event: Option<&str>, data: &str) -> Out {
        let mut out = Vec::new();
        if self.done {
            return out;
        }
        let data = data.trim();
        if data.is_empty() {
            return out;
        }
        if data == "[DONE]" {
            return self.end();
        }
        let value: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => {
                self.done = true;
                out.push(Err(shared::invalid_json(&e)));
                return out;
            }
        };
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .or(event)
            .unwrap_or_default();
        let delta = || {
            value
                .get("delta")
                .and_then(Value::as_str)
                .unwrap_or_default()
        };
        match kind {
            "response.created" | "response.in_progress" => self.note_model(&value),
            "response.output_item.added" => {
                if let Some(item) = value.get("item") {
                    self.item_added(
                        item,
                        value.get("output_index").and_then(Value::as_u64),
                        &mut out,
                    );
                }
            }
            "response.output_item.done" => {
                if let Some(item) = value.get("item") {
                    self.item_done(
                        item,
                        value.get("output_index").and_then(Value::as_u64),
                        &mut out,
                    );
                }
            }
            "response.output_text.delta" if !delta().is_empty() => {
                self.streamed = true;
                out.push(Ok(ModelChunk::TextDelta(delta().to_owned())));
            }
            "response.refusal.delta" if !delta().is_empty() => {
                self.streamed = true;
                self.refusal = true;
                out.push(Ok(ModelChunk::TextDelta(delta().to_owned())));
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta"
                if !delta().is_empty() =>
            {
                let index = value.get("summary_index").and_then(Value::as_u64);
                let item_id = value.get("item_id").and_then(Value::as_str);
                self.reasoning_text(item_id, index, delta(), &mut out);
            }
            "response.function_call_arguments.delta" => {
                if let Some(i) = self.find_call(&value) {
                    let call = &mut self.calls[i];
                    if !call.ended && !delta().is_empty() {
                        call.arguments.push_str(delta());
                        out.push(Ok(ModelChunk::ToolArgsDelta {
                            index: i,
                            json_fragment: delta().to_owned(),
                        }));
                    }
                }
            }
            "response.function_call_arguments.done" => {
                if let Some(i) = self.find_call(&value) {
                    let whole = value
                        .get("arguments")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    self.end_call(i, whole, &mut out);
                }
            }
            "response.completed" | "response.incomplete" => {
                let response = value.get("response").cloned().unwrap_or(Value::Null);
                self.complete(&response, &mut out);
            }
            "response.failed" => {
                let response = value.get("response").cloned().unwrap_or(Value::Null);
                self.status = Some("failed".into());
                self.note_model(&value);
                if let Some(u) = response.get("usage").filter(|u| u.is_object()) {
                    out.push(Ok(ModelChunk::Usage(usage(u))));
                }
                let error = self.pending_error.take().unwrap_or_else(|| {
                    let error = response.get("error").filter(|e| e.is_object()).cloned();
                    let error =
                        error.unwrap_or_else(|| json!({ "message": "the response failed" }));
                    shared::classify_error(Some(200), &error, None)
                });
                self.done = true;
                out.push(Err(error));
            }
            "error" => {
                // Reported once, with `response.failed` (or at the end of the body).
                let error = match value.get("error") {
                    Some(e @ Value::Object(_)) => e.clone(),
                    _ => value.clone(),
                };
                self.pending_error = Some(shared::classify_error(Some(200), &error, None));
            }
            _ => {}
        }
        out
    }

    /// The end of the body: an error reported without `response.failed`, else truncation.
    pub fn finish(mut self) -> Out {
        self.end()
    }

    fn end(&mut self) -> Out {
        if self.done {
            return Vec::new();
        }
        self.done = true;
        vec![Err(self
            .pending_error
            .take()
            .unwrap_or_else(shared::interrupted))]
    }

    fn note_model(&mut self, value: &Value) {
        let model = value
            .get("response")
            .and_then(|r| r.get("model"))
            .and_then(Value::as_str);
        if let Some(model) = model.filter(|m| !m.is_empty()) {
            self.model = model.to_owned();
        }
    }

    fn find_call(&self, value: &Value) -> Option<usize> {
        let item_id = value.get("item_id").and_then(Value::as_str);
        let output_index = value.get("output_index").and_then(Value::as_u64);
        if let Some(id) = item_id
            && let Some(i) = self
                .calls
                .iter()
                .position(|c| c.item_id.as_deref() == Some(id))
        {
            return Some(i);
        }
        output_index.and_then(|o| self.calls.iter().position(|c| c.output_index == Some(o)))
    }

    fn item_added(&mut self, item: &Value, output_index: Option<u64>, out: &mut Out) {
        self.streamed = true;
        match item.get("type").and_then(Value::as_str) {
            Some("function_call") => {
                self.reasoning = None;
                self.start_call(item, output_index, out);
            }
            Some("reasoning") => {
                self.reasoning = Some(Reasoning {
                    item_id: item.get("id").and_then(Value::as_str).map(str::to_owned),
                    started: false,
                    summary_index: None,
                });
            }
            _ => self.reasoning = None,
        }
    }

    fn start_call(&mut self, item: &Value, output_index: Option<u64>, out: &mut Out) -> usize {
        let index = self.calls.len();
        let text = |key: &str| {
            item.get(key)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        let call_id = text("call_id")
            .or(text("id"))
            .map_or_else(|| format!("call_{index}"), str::to_owned);
        out.push(Ok(ModelChunk::ToolCallStarted {
            index,
            call_id,
            name: text("name").unwrap_or_default().to_owned(),
        }));
        let arguments = text("arguments").unwrap_or_default().to_owned();
        if !arguments.is_empty() {
            out.push(Ok(ModelChunk::ToolArgsDelta {
                index,
                json_fragment: arguments.clone(),
            }));
        }
        self.calls.push(Call {
            item_id: text("id").map(str::to_owned),
            output_index,
            arguments,
            ended: false,
        });
        index
    }

    fn end_call(&mut self, index: usize, whole: &str, out: &mut Out) {
        let call = &mut self.calls[index];
        if call.ended {
            return;
        }
        if call.arguments.is_empty() && !whole.is_empty() {
            call.arguments = whole.to_owned();
            out.push(Ok(ModelChunk::ToolArgsDelta {
                index,
                json_fragment: whole.to_owned(),
            }));
        }
        call.ended = true;
        out.push(Ok(ModelChunk::ToolCallEnded { index }));
    }

    fn reasoning_text(
        &mut self,
        item_id: Option<&str>,
        summary_index: Option<u64>,
        text: &str,
        out: &mut Out,
    ) {
        self.streamed = true;
        let reasoning = self.reasoning.get_or_insert_with(|| Reasoning {
            item_id: item_id.map(str::to_owned),
            started: false,
            summary_index: None,
        });
        let mut text = text.to_owned();
        if reasoning.started && summary_index.is_some() && summary_index != reasoning.summary_index
        {
            text.insert_str(0, "\n\n");
        }
        if summary_index.is_some() {
            reasoning.summary_index = summary_index;
        }
        let mut meta = Map::new();
        if let Some(id) = &reasoning.item_id {
            meta.insert("item_id".into(), Value::String(id.clone()));
        }
        out.push(Ok(ModelChunk::ReasoningDelta {
            text,
            start: !reasoning.started,
            provider_meta: openai_meta(meta),
        }));
        reasoning.started = true;
    }

    fn item_done(&mut self, item: &Value, output_index: Option<u64>, out: &mut Out) {
        self.streamed = true;
        match item.get("type").and_then(Value::as_str) {
            Some("function_call") => {
                let id = item.get("id").and_then(Value::as_str);
                let found = self
                    .calls
                    .iter()
                    .position(|c| id.is_some() && c.item_id.as_deref() == id)
                    .or_else(|| {
                        output_index
                            .and_then(|o| self.calls.iter().position(|c| c.output_index == Some(o)))
                    });
                let index = match found {
                    Some(i) => i,
                    None => self.start_call(item, output_index, out),
                };
                let whole = item
                    .get("arguments")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                self.end_call(index, whole, out);
            }
            Some("reasoning") => {
                let current = self.reasoning.take();
                let started = current.as_ref().is_some_and(|r| r.started);
                let item_id = item.get("id").and_then(Value::as_str);
                let encrypted = item.get("encrypted_content").and_then(Value::as_str);
                let mut meta = Map::new();
                if let Some(id) = item_id {
                    meta.insert("item_id".into(), Value::String(id.to_owned()));
                }
                if let Some(e) = encrypted {
                    meta.insert("encrypted_content".into(), Value::String(e.to_owned()));
                }
                // Summary text the stream did not deliver as deltas.
                let summary = if started {
                    String::new()
                } else {
                    let parts = item
                        .get("summary")
                        .and_then(Value::as_array)
                        .map(Vec::as_slice)
                        .unwrap_or_default();
                    let texts: Vec<&str> = parts
                        .iter()
                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                        .collect();
                    texts.join("\n\n")
                };
                if started || encrypted.is_some() || !summary.is_empty() {
                    out.push(Ok(ModelChunk::ReasoningDelta {
                        text: summary,
                        start: !started,
                        provider_meta: openai_meta(meta),
                    }));
                }
            }
            Some("message") => self.reasoning = None,
            _ => {}
        }
    }

    fn complete(&mut self, response: &Value, out: &mut Out) {
        let status = response
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("completed")
            .to_owned();
        let reason = response
            .get("incomplete_details")
            .and_then(|d| d.get("reason"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        if let Some(model) = response
            .get("model")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
        {
            self.model = model.to_owned();
        }
        if !self.streamed {
            // Nothing was streamed item by item: replay the final output.
            let items = response
                .get("output")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for (i, item) in items.iter().enumerate() {
                self.replay(item, i as u64, out);
            }
        }
        if let Some(u) = response.get("usage").filter(|u| u.is_object()) {
            out.push(Ok(ModelChunk::Usage(usage(u))));
        }
        for i in 0..self.calls.len() {
            self.end_call(i, "", out);
        }
        let incomplete = status == "incomplete";
        let stop = if self.refusal || (incomplete && reason.as_deref() == Some("content_filter")) {
            StopReason::Refusal
        } else if incomplete {
            StopReason::MaxTokens
        } else if !self.calls.is_empty() {
            StopReason::ToolUse
        } else {
            StopReason::End
        };
        self.status = Some(match reason {
            Some(r) if incomplete => format!("{status}/{r}"),
            _ => status,
        });
        self.done = true;
        out.push(Ok(ModelChunk::Stopped {
            reason: stop,
            model_id: self.model.clone(),
        }));
    }

    fn replay(&mut self, item: &Value, output_index: u64, out: &mut Out) {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                let parts = item
                    .get("content")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                for part in parts {
                    match part.get("type").and_then(Value::as_str) {
                        Some("output_text") => {
                            if let Some(t) = part
                                .get("text")
                                .and_then(Value::as_str)
                                .filter(|t| !t.is_empty())
                            {
                                out.push(Ok(ModelChunk::TextDelta(t.to_owned())));
                            }
                        }
                        Some("refusal") => {
                            if let Some(t) = part
                                .get("refusal")
                                .and_then(Value::as_str)
                                .filter(|t| !t.is_empty())
                            {
                                self.refusal = true;
                                out.push(Ok(ModelChunk::TextDelta(t.to_owned())));
                            }
                        }
                        _ => {}
                    }
                }
            }
            Some("function_call" | "reasoning") => self.item_done(item, Some(output_index), out),
            _ => {}
        }
    }
}

impl SseDecoder for ResponsesDecoder {
    fn on_event(&mut self, event: Option<&str>, data: &str) -> Out {
        self.feed(event, data)
    }

    fn on_end(self) -> Out {
        self.finish()
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn on_json(&mut self, body: &str) -> Out {
        // A `response` object: replayed as its terminal event.
        let Ok(value) = serde_json::from_str::<Value>(body.trim()) else {
            return self.feed(None, body);
        };
        if value.get("error").is_some_and(|e| e.is_object()) && value.get("status").is_none() {
            let error = shared::classify_error(Some(200), &value["error"], None);
            self.done = true;
            return vec![Err(error)];
        }
        let kind = match value.get("status").and_then(Value::as_str) {
            Some("failed") => "response.failed",
            Some("incomplete") => "response.incomplete",
            _ => "response.completed",
        };
        let event = json!({ "type": kind, "response": value });
        self.feed(None, &event.to_string())
    }
}

/// Decodes a Responses body (SSE bytes) into chunks, as [`ModelClient::stream`] does.
pub fn decode_stream<S, E>(
    bytes: S,
    model: impl Into<String>,
) -> BoxStream<'static, Result<ModelChunk, ProviderError>>
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, E>> + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    shared::drive(bytes, ResponsesDecoder::new(model))
}
