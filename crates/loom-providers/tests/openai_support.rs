//! Helpers shared by the OpenAI adapter tests (`openai_chat.rs`, `openai_responses.rs` include
//! this file as a module): fixture loading, `EXPECTED.md` entries, byte splits, the normalized
//! result and its comparison, canned requests, and a one-connection-at-a-time local HTTP server.
//!
//! Normalization notes (EXPECTED.md vs. our model):
//! - our `Usage.input_tokens` excludes cached/written tokens, EXPECTED's includes them: compare
//!   `Usage::prompt_tokens()`;
//! - a refusal is the answer's text in our model (no separate channel) with stop reason
//!   `refusal`: our text must equal EXPECTED's `text` + `refusal`;
//! - `provider_stop_reason` comes from the decoder (`provider_stop_reason()`).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs,
    io::{BufRead, BufReader, Read, Write},
    net::TcpListener,
    path::PathBuf,
    sync::{Arc, Mutex},
    thread,
    time::Duration,
};

use bytes::Bytes;
use futures_util::{Stream, StreamExt, stream};
use loom_core::{
    Block, BlockKind, Message, Role,
    model::{
        ModelChunk, ModelRequest, ResponseAccumulator, StopReason, ToolChoice, ToolDefinition,
    },
    tool::ToolOutput,
    usage::Usage,
};
use loom_providers::{ErrorClass, ProviderError, ProviderOptions};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// `request` with a full view (`ToolOutput::full`, for interfaces only) on every tool result.
pub(crate) fn with_full_views(mut request: ModelRequest) -> ModelRequest {
    for message in request.messages.iter_mut().map(Arc::make_mut) {
        for block in &mut message.blocks {
            if let BlockKind::ToolResult { output, .. } = &mut block.kind {
                output.full = Some(json!({"rows": ["FULL-VIEW-ONLY"]}));
            }
        }
    }
    request
}

/// `../shared/fixtures/providers`.
pub(crate) fn fixtures() -> PathBuf {
    loom_testkit::shared::root().join("fixtures/providers")
}

/// Whether the fixtures can be read: `false` (after a skip notice) on a clone without
/// `../shared`, where the test returns at once (see `loom_testkit::shared`).
pub(crate) fn fixtures_present() -> bool {
    loom_testkit::shared::path("fixtures/providers").is_some()
}

/// The files of one fixture folder ending with `suffix`, sorted (`folder/name`).
pub(crate) fn fixture_files(folder: &str, suffix: &str) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(fixtures().join(folder))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(suffix) && !n.ends_with(".meta.json"))
        .map(|n| format!("{folder}/{n}"))
        .collect();
    names.sort();
    names
}

/// The `EXPECTED.md` entry of a fixture: its JSON block and the byte offsets its text lists.
pub(crate) fn expected(path: &str) -> (Value, Vec<usize>) {
    let md = fs::read_to_string(fixtures().join("EXPECTED.md")).unwrap();
    let heading = format!("#### `{path}`");
    let start = md
        .find(&heading)
        .unwrap_or_else(|| panic!("no EXPECTED.md entry for {path}"));
    let section = &md[start + heading.len()..];
    let open = section.find("```json").unwrap();
    let close = section[open + 7..].find("```").unwrap();
    let value = serde_json::from_str(&section[open + 7..open + 7 + close]).unwrap();
    // "ü@574 (2 B), 🌧@875 (4 B)…": offsets of multi-byte characters.
    let prose = &section[..open];
    let mut offsets = Vec::new();
    if prose.contains("Byte offsets") {
        for piece in prose.split('@').skip(1) {
            let digits: String = piece.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(n) = digits.parse() {
                offsets.push(n);
            }
        }
    }
    (value, offsets)
}

/// The ways the bytes may arrive: whole, one byte at a time, split inside each listed
/// multi-byte character, and whole with CRLF line ends.
pub(crate) fn deliveries(bytes: &[u8], offsets: &[usize]) -> Vec<(String, Vec<Vec<u8>>)> {
    let mut out = vec![
        ("whole".to_owned(), vec![bytes.to_vec()]),
        (
            "byte by byte".to_owned(),
            bytes.iter().map(|b| vec![*b]).collect(),
        ),
    ];
    if !offsets.is_empty() {
        let mut pieces = Vec::new();
        let mut from = 0;
        for offset in offsets {
            pieces.push(bytes[from..offset + 1].to_vec());
            from = offset + 1;
        }
        pieces.push(bytes[from..].to_vec());
        out.push(("split at the listed offsets".to_owned(), pieces));
        for offset in offsets {
            out.push((
                format!("split at {}", offset + 1),
                vec![bytes[..offset + 1].to_vec(), bytes[offset + 1..].to_vec()],
            ));
        }
    }
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    out.push((
        "CRLF".to_owned(),
        vec![text.replace('\n', "\r\n").into_bytes()],
    ));
    out
}

/// A body stream made of `pieces`.
pub(crate) fn body(
    pieces: Vec<Vec<u8>>,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    stream::iter(pieces.into_iter().map(|p| Ok(Bytes::from(p))))
}

/// Parses the pieces as SSE exactly like the adapter (a blank line appended at the end).
pub(crate) async fn sse_events(pieces: Vec<Vec<u8>>) -> Vec<(Option<String>, String)> {
    let bytes = body(pieces).chain(stream::once(async { Ok(Bytes::from_static(b"\n\n")) }));
    let mut events = Box::pin(sse_stream::SseStream::from_bytes_stream(bytes));
    let mut out = Vec::new();
    while let Some(event) = events.next().await {
        let event = event.unwrap();
        if let Some(data) = event.data {
            out.push((event.event, data));
        }
    }
    out
}

/// Collects a chunk stream.
pub(crate) async fn collect<S: Stream<Item = Result<ModelChunk, ProviderError>> + Unpin>(
    mut chunks: S,
) -> Vec<Result<ModelChunk, ProviderError>> {
    let mut out = Vec::new();
    while let Some(chunk) = chunks.next().await {
        out.push(chunk);
    }
    out
}

/// What a stream amounts to, in EXPECTED.md's terms.
#[derive(Debug)]
pub(crate) struct Normalized {
    pub(crate) text: String,
    pub(crate) reasoning: Option<String>,
    pub(crate) tool_calls: Vec<(String, String, String)>,
    pub(crate) stop_reason: &'static str,
    pub(crate) provider_stop_reason: Option<String>,
    pub(crate) usage: Option<Usage>,
    pub(crate) error: Option<ProviderError>,
    pub(crate) partial_output: bool,
}

/// Normalizes the chunks of one stream; checks the chunk protocol on the way (nothing after
/// the terminal chunk, arguments only for started calls, every call ended before the stop).
pub(crate) fn normalize(
    chunks: &[Result<ModelChunk, ProviderError>],
    provider_stop_reason: Option<&str>,
) -> Normalized {
    let mut n = Normalized {
        text: String::new(),
        reasoning: None,
        tool_calls: Vec::new(),
        stop_reason: "error",
        provider_stop_reason: provider_stop_reason.map(str::to_owned),
        usage: None,
        error: None,
        partial_output: false,
    };
    let mut ended = Vec::new();
    let mut terminal = false;
    for chunk in chunks {
        assert!(!terminal, "a chunk after the terminal one: {chunk:?}");
        match chunk {
            Ok(ModelChunk::TextDelta(t)) => {
                n.text.push_str(t);
                n.partial_output |= !t.is_empty();
            }
            Ok(ModelChunk::ReasoningDelta { text, .. }) => {
                n.reasoning.get_or_insert_with(String::new).push_str(text);
                n.partial_output |= !text.is_empty();
            }
            Ok(ModelChunk::ToolCallStarted {
                index,
                call_id,
                name,
            }) => {
                assert_eq!(*index, n.tool_calls.len(), "call indexes are positions");
                n.tool_calls
                    .push((call_id.clone(), name.clone(), String::new()));
                n.partial_output = true;
            }
            Ok(ModelChunk::ToolArgsDelta {
                index,
                json_fragment,
            }) => {
                assert!(
                    !ended.contains(index),
                    "arguments after the end of call {index}"
                );
                n.tool_calls[*index].2.push_str(json_fragment);
            }
            Ok(ModelChunk::ToolCallEnded { index }) => {
                assert!(*index < n.tool_calls.len());
                ended.push(*index);
            }
            Ok(ModelChunk::Usage(u)) => {
                let merged = n.usage.get_or_insert_with(Usage::default);
                let pick = |old: u64, new: u64| if new > 0 { new } else { old };
                merged.input_tokens = pick(merged.input_tokens, u.input_tokens);
                merged.output_tokens = pick(merged.output_tokens, u.output_tokens);
                merged.cache_read_tokens = pick(merged.cache_read_tokens, u.cache_read_tokens);
                merged.cache_write_tokens = pick(merged.cache_write_tokens, u.cache_write_tokens);
                merged.reasoning_tokens = pick(merged.reasoning_tokens, u.reasoning_tokens);
            }
            Ok(ModelChunk::Exchange(_)) => panic!("decoders never capture"),
            Ok(ModelChunk::Stopped { reason, model_id }) => {
                assert!(!model_id.is_empty());
                assert_eq!(
                    ended.len(),
                    n.tool_calls.len(),
                    "every call ends before the stop"
                );
                n.stop_reason = match reason {
                    StopReason::End => "end_turn",
                    StopReason::ToolUse => "tool_use",
                    StopReason::MaxTokens => "max_tokens",
                    StopReason::Refusal => "refusal",
                };
                terminal = true;
            }
            Err(e) => {
                n.error = Some(e.clone());
                terminal = true;
            }
        }
    }
    assert!(terminal, "the stream must end with a stop or an error");
    if n.reasoning.as_deref() == Some("") {
        n.reasoning = None;
    }
    n
}

fn long_string(label: &str, ours: &str, expected: &Value) {
    match expected {
        Value::String(s) => assert_eq!(ours, s, "{label}"),
        Value::Object(o) => {
            assert_eq!(
                ours.chars().count() as u64,
                o["len_chars"].as_u64().unwrap(),
                "{label}: length"
            );
            let digest: String = Sha256::digest(ours.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(digest, o["sha256"].as_str().unwrap(), "{label}: sha256");
            assert!(
                ours.starts_with(o["starts_with"].as_str().unwrap()),
                "{label}: start"
            );
            assert!(
                ours.ends_with(o["ends_with"].as_str().unwrap()),
                "{label}: end"
            );
        }
        other => panic!("{label}: unexpected form {other}"),
    }
}

/// The class names of EXPECTED.md.
pub(crate) fn class_name(class: ErrorClass) -> &'static str {
    match class {
        ErrorClass::Auth => "auth",
        ErrorClass::Quota => "quota",
        ErrorClass::ContextLength => "context_length",
        ErrorClass::ContentFiltered => "content_filtered",
        ErrorClass::Transient | ErrorClass::Overloaded => "transient",
        ErrorClass::Invalid => "invalid",
    }
}

/// Checks an error against EXPECTED's `error` object.
pub(crate) fn check_error(label: &str, ours: &ProviderError, expected: &Value) {
    assert_eq!(
        class_name(ours.class),
        expected["class"],
        "{label}: class ({ours:?})"
    );
    assert_eq!(
        ours.class.retryable(),
        expected["retryable"],
        "{label}: retryable"
    );
    assert_eq!(
        ours.status.map(u64::from),
        expected["status"].as_u64(),
        "{label}: status"
    );
    let code = expected
        .get("provider_code")
        .or_else(|| expected.get("provider_type"));
    if let Some(code) = code {
        let code = match code {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        assert_eq!(
            ours.provider_code.as_deref(),
            Some(code.as_str()),
            "{label}: provider code"
        );
    }
    if let Some(message) = expected.get("message").and_then(Value::as_str) {
        assert_eq!(ours.message, message, "{label}: message");
    }
    if let Some(prefix) = expected.get("message_starts_with").and_then(Value::as_str) {
        assert!(
            ours.message.starts_with(prefix),
            "{label}: message {:?}",
            ours.message
        );
    }
    if let Some(param) = expected.get("param").and_then(Value::as_str) {
        assert!(
            ours.message.contains(param),
            "{label}: the message names the param"
        );
    }
    match expected["retry_after_s"].as_f64() {
        None => assert_eq!(ours.retry_after, None, "{label}: retry after"),
        Some(s) => {
            let ours = ours.retry_after.expect("a retry-after delay").as_secs_f64();
            assert!(
                (ours - s).abs() < 1e-6,
                "{label}: retry after {ours} vs {s}"
            );
        }
    }
}

/// Compares a normalized stream to its EXPECTED.md entry.
pub(crate) fn check(label: &str, n: &Normalized, expected: &Value) {
    let refusal = expected
        .get("refusal")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match &expected["text"] {
        Value::String(t) => assert_eq!(n.text, format!("{t}{refusal}"), "{label}: text"),
        other => long_string(&format!("{label}: text"), &n.text, other),
    }
    assert_eq!(
        n.reasoning.as_deref(),
        expected["reasoning"].as_str(),
        "{label}: reasoning"
    );
    let calls = expected["tool_calls"].as_array().unwrap();
    assert_eq!(
        n.tool_calls.len(),
        calls.len(),
        "{label}: tool calls {:?}",
        n.tool_calls
    );
    for ((id, name, raw), call) in n.tool_calls.iter().zip(calls) {
        assert_eq!(id, call["id"].as_str().unwrap(), "{label}: call id");
        if let Some(item_id) = call.get("item_id").and_then(Value::as_str) {
            assert_ne!(
                id, item_id,
                "{label}: the reply id is call_id, not the item id"
            );
        }
        assert_eq!(name, call["name"].as_str().unwrap(), "{label}: call name");
        let arguments: Value =
            serde_json::from_str(raw).unwrap_or_else(|e| panic!("{label}: {e}: {raw}"));
        assert_eq!(arguments, call["arguments"], "{label}: arguments");
    }
    assert!(
        expected
            .get("incomplete_tool_calls")
            .is_none_or(|v| v.as_array().is_some_and(Vec::is_empty)),
        "{label}: no OpenAI fixture has incomplete calls"
    );
    assert_eq!(
        n.stop_reason, expected["stop_reason"],
        "{label}: stop reason"
    );
    assert_eq!(
        n.provider_stop_reason.as_deref(),
        expected["provider_stop_reason"].as_str(),
        "{label}: raw stop"
    );
    match (&n.usage, &expected["usage"]) {
        (None, Value::Null) => {}
        (Some(u), e @ Value::Object(_)) => {
            assert_eq!(
                u.prompt_tokens(),
                e["input_tokens"],
                "{label}: input tokens (cache included)"
            );
            assert_eq!(
                u.output_tokens, e["output_tokens"],
                "{label}: output tokens"
            );
            assert_eq!(
                u.cache_read_tokens, e["cache_read_tokens"],
                "{label}: cache read"
            );
            assert_eq!(
                u.cache_write_tokens, e["cache_write_tokens"],
                "{label}: cache write"
            );
            assert_eq!(
                u.reasoning_tokens, e["reasoning_tokens"],
                "{label}: reasoning tokens"
            );
        }
        (ours, theirs) => panic!("{label}: usage {ours:?} vs {theirs}"),
    }
    match (&n.error, &expected["error"]) {
        (None, Value::Null) => {}
        (Some(ours), e @ Value::Object(_)) => {
            check_error(label, ours, e);
            let partial = expected
                .get("partial_output")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            assert_eq!(n.partial_output, partial, "{label}: partial output");
        }
        (ours, theirs) => panic!("{label}: error {ours:?} vs {theirs}"),
    }
}

/// For a successful stream: the engine's accumulator builds the same answer.
pub(crate) fn check_accumulated(
    label: &str,
    chunks: &[Result<ModelChunk, ProviderError>],
    n: &Normalized,
) {
    if n.error.is_some() {
        return;
    }
    let mut acc = ResponseAccumulator::new();
    for chunk in chunks {
        acc.push(chunk.clone().unwrap());
    }
    let response = acc.finish().unwrap();
    assert_eq!(response.message.text(), n.text, "{label}: accumulated text");
    let calls: Vec<(String, String)> = response
        .message
        .tool_calls()
        .map(|(id, name, _)| (id.to_owned(), name.to_owned()))
        .collect();
    let ours: Vec<(String, String)> = n
        .tool_calls
        .iter()
        .map(|(id, name, _)| (id.clone(), name.clone()))
        .collect();
    assert_eq!(calls, ours, "{label}: accumulated calls");
    for (_, _, arguments) in response.message.tool_calls() {
        assert!(
            arguments.get("_loom_invalid_json").is_none(),
            "{label}: arguments parse"
        );
    }
}

/// A canned error fixture: status, headers, body.
pub(crate) fn error_fixture(path: &str) -> (u16, Vec<(String, String)>, String) {
    let meta_path = path.replace(".json", ".meta.json");
    let meta: Value =
        serde_json::from_str(&fs::read_to_string(fixtures().join(meta_path)).unwrap()).unwrap();
    let headers = meta["headers"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    let body = fs::read_to_string(fixtures().join(path)).unwrap();
    (meta["status"].as_u64().unwrap() as u16, headers, body)
}

/// A header map from pairs.
pub(crate) fn header_map(pairs: &[(String, String)]) -> reqwest::header::HeaderMap {
    let mut map = reqwest::header::HeaderMap::new();
    for (k, v) in pairs {
        map.insert(
            reqwest::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            reqwest::header::HeaderValue::from_str(v).unwrap(),
        );
    }
    map
}

// ---------------------------------------------------------------------------------------------
// Requests

/// Options for a test model.
pub(crate) fn options(base_url: &str, api_key: Option<&str>) -> ProviderOptions {
    ProviderOptions {
        base_url: base_url.to_owned(),
        api_key: api_key.map(str::to_owned),
        api_key_env: api_key.map(|_| "OPENAI_API_KEY".to_owned()),
        model: "gpt-test".to_owned(),
        max_tokens: Some(1024),
        headers: [("x-team".to_owned(), "loom".to_owned())]
            .into_iter()
            .collect(),
        connect_timeout: Duration::from_secs(5),
        capture: None,
    }
}

fn weather_tool() -> ToolDefinition {
    ToolDefinition {
        name: "get_weather".into(),
        description: "Current weather of a city.".into(),
        input_schema: Arc::new(json!({
            "type": "object",
            "properties": { "city": { "type": "string" } },
            "required": ["city"],
            "additionalProperties": false
        })),
    }
}

fn search_tool() -> ToolDefinition {
    ToolDefinition {
        name: "search".into(),
        description: "Searches the notes.".into(),
        input_schema: Arc::new(json!({
            "type": "object",
            "properties": { "query": { "type": "string" }, "limit": { "type": "integer" } },
            "required": ["query"]
        })),
    }
}

/// A request with the given conversation.
pub(crate) fn request(messages: Vec<Message>) -> ModelRequest {
    ModelRequest {
        model_id: "main".into(),
        system: "You are a careful assistant.".into(),
        messages: messages.into_iter().map(Arc::new).collect(),
        tools: vec![weather_tool(), search_tool()],
        tool_choice: ToolChoice::Auto,
        max_tokens: None,
        params: Default::default(),
        output_schema: None,
    }
}

/// A plain turn: system, two tools (one strict-compatible), one question, a param.
pub(crate) fn plain_turn() -> ModelRequest {
    let mut r = request(vec![Message::user("What is the weather in Paris?")]);
    std::sync::Arc::make_mut(&mut r.params).insert("temperature".into(), json!(0.2));
    r
}

/// A reasoning block as the given adapter stored it.
pub(crate) fn reasoning_block(text: &str, meta: Value) -> Block {
    let mut block = Block::new(BlockKind::Reasoning {
        text: text.into(),
        model_id: Some("gpt-test".into()),
    });
    block.provider_meta.insert("openai".into(), meta);
    block
}

/// A tool loop: an earlier turn (whose reasoning is not echoed by Chat), then a turn with
/// reasoning, text and two calls, and their results (one an error).
pub(crate) fn tool_loop(old_meta: Value, meta: Value) -> ModelRequest {
    let mut error = ToolOutput::error("unknown city 'Atlantis'");
    error.blocks.push(Block::text("known cities: Paris, Rome"));
    request(vec![
        Message::user("Hello"),
        Message {
            role: Role::Assistant,
            blocks: vec![
                reasoning_block("Greeting.", old_meta),
                Block::text("Hello! How can I help?"),
            ],
        },
        Message::user("Weather in Paris and Atlantis?"),
        Message {
            role: Role::Assistant,
            blocks: vec![
                reasoning_block("Two cities: call the tool twice.", meta),
                Block::text("Let me check."),
                Block::tool_call("call_1", "get_weather", json!({ "city": "Paris" })),
                Block::tool_call("call_2", "get_weather", json!({ "city": "Atlantis" })),
            ],
        },
        Message {
            role: Role::Tool,
            blocks: vec![
                Block::new(BlockKind::ToolResult {
                    call_id: "call_1".into(),
                    output: ToolOutput::json(json!({ "temp_c": 18, "sky": "clear" })),
                }),
                Block::new(BlockKind::ToolResult {
                    call_id: "call_2".into(),
                    output: error,
                }),
            ],
        },
    ])
}

/// A request with an output schema (strict-compatible or not).
pub(crate) fn json_schema(strict: bool) -> ModelRequest {
    let mut r = request(vec![Message::user("Give me the capital of France.")]);
    r.tools.clear();
    r.output_schema = Some(if strict {
        json!({
            "type": "object",
            "properties": {
                "country": { "type": "string" },
                "capital": { "type": "object", "properties": { "name": { "type": "string" } },
                             "required": ["name"], "additionalProperties": false }
            },
            "required": ["country", "capital"],
            "additionalProperties": false
        })
    } else {
        json!({ "type": "object", "properties": { "capital": { "type": "string" }, "note": { "type": "string" } },
                "required": ["capital"] })
    });
    r
}

/// A user image, and an image inside a tool result.
pub(crate) fn image_turn() -> ModelRequest {
    let image = |name: &str| {
        Block::new(BlockKind::InlineData {
            media_type: "image/png".into(),
            data: "iVBORw0KGgo=".into(),
            name: Some(name.into()),
        })
    };
    let mut screenshot = ToolOutput::text("screenshot taken");
    screenshot.blocks.push(image("screen.png"));
    request(vec![
        Message {
            role: Role::User,
            blocks: vec![Block::text("What is on this picture?"), image("cat.png")],
        },
        Message {
            role: Role::Assistant,
            blocks: vec![Block::tool_call(
                "call_9",
                "search",
                json!({ "query": "screenshot" }),
            )],
        },
        Message {
            role: Role::Tool,
            blocks: vec![Block::new(BlockKind::ToolResult {
                call_id: "call_9".into(),
                output: screenshot,
            })],
        },
    ])
}

// ---------------------------------------------------------------------------------------------
// A local HTTP server

/// A canned reply: status, headers, body.
pub(crate) type Reply = (u16, Vec<(String, String)>, Vec<u8>);

/// One request the server received.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub(crate) path: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Value,
}

impl Received {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Serves `replies` (status, headers, body) one per connection, in order, on 127.0.0.1:0.
pub(crate) fn serve(replies: Vec<Reply>) -> (String, Arc<Mutex<Vec<Received>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    let received = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&received);
    thread::spawn(move || {
        for (status, headers, body) in replies {
            let (mut socket, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(socket.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let path = line
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_owned();
            let mut request_headers = Vec::new();
            loop {
                let mut header = String::new();
                reader.read_line(&mut header).unwrap();
                let header = header.trim_end();
                if header.is_empty() {
                    break;
                }
                if let Some((k, v)) = header.split_once(':') {
                    request_headers.push((k.trim().to_owned(), v.trim().to_owned()));
                }
            }
            let length = request_headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .map_or(0, |(_, v)| v.parse().unwrap());
            let mut raw = vec![0; length];
            reader.read_exact(&mut raw).unwrap();
            let body_json = serde_json::from_slice(&raw).unwrap_or(Value::Null);
            log.lock().unwrap().push(Received {
                path,
                headers: request_headers,
                body: body_json,
            });
            let mut head = format!(
                "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            socket.write_all(head.as_bytes()).unwrap();
            socket.write_all(&body).unwrap();
            socket.flush().unwrap();
        }
    });
    (base, received)
}

/// A fixture stream as a 200 `text/event-stream` reply.
pub(crate) fn sse_reply(path: &str) -> Reply {
    let body = fs::read(fixtures().join(path)).unwrap();
    (
        200,
        vec![("content-type".into(), "text/event-stream".into())],
        body,
    )
}

/// A fixture error body as a reply with its meta status and headers.
pub(crate) fn error_reply(path: &str) -> Reply {
    let (status, headers, body) = error_fixture(path);
    (status, headers, body.into_bytes())
}
