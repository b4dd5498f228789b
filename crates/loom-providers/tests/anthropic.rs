//! The Anthropic adapter against the real wire transcripts of `../shared/fixtures/providers`:
//! every stream decodes to its `EXPECTED.md` result whole, one byte at a time, split inside
//! multi-byte characters and with CRLF line ends; every error body classifies as expected;
//! request bodies are snapshotted; one loopback server checks the HTTP side (headers, error
//! statuses, the missing-key hint). Nothing reaches the real provider.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common {
    pub mod fixtures;
}

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::TcpListener,
    sync::{Arc, mpsc},
    time::Duration,
};

use bytes::Bytes;
use common::fixtures;
use futures_util::{StreamExt, stream};
use loom_core::{
    content::{Block, BlockKind, Message, Role},
    model::{
        ModelChunk, ModelClient, ModelErrorKind, ModelRequest, ResponseAccumulator, StopReason,
        ToolChoice, ToolDefinition,
    },
    tool::ToolOutput,
};
use loom_providers::{
    ErrorClass, ProviderError, ProviderOptions,
    anthropic::{
        AnthropicModel, AnthropicSettings, CacheSettings, DecodedItem, Decoder, build_request,
        classify, decode_message, decode_sse, endpoint,
    },
};
use serde_json::{Map, Value, json};

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

fn byte_stream(
    pieces: Vec<Vec<u8>>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin + 'static {
    stream::iter(pieces.into_iter().map(|p| Ok(Bytes::from(p))))
}

/// SSE framing by `sse-stream` over the given chunks, then the decoder: the items and the raw
/// stop reason.
fn decode_pieces(pieces: Vec<Vec<u8>>) -> (Vec<DecodedItem>, Option<String>) {
    block_on(async move {
        let mut events = sse_stream::SseStream::from_bytes_stream(byte_stream(pieces));
        let mut decoder = Decoder::new();
        let mut items = Vec::new();
        while let Some(event) = events.next().await {
            let event = event.expect("valid SSE framing");
            if let Some(data) = &event.data {
                items.extend(decoder.feed(event.event.as_deref(), data));
            }
        }
        let raw = decoder.provider_stop_reason().map(str::to_string);
        items.extend(decoder.finish());
        (items, raw)
    })
}

fn class_name(class: ErrorClass) -> &'static str {
    match class {
        ErrorClass::Auth => "auth",
        ErrorClass::Quota => "quota",
        ErrorClass::ContextLength => "context_length",
        ErrorClass::ContentFiltered => "content_filtered",
        ErrorClass::Transient | ErrorClass::Overloaded => "transient",
        ErrorClass::Invalid => "invalid",
    }
}

fn stop_name(reason: StopReason) -> &'static str {
    match reason {
        StopReason::End => "end_turn",
        StopReason::ToolUse => "tool_use",
        StopReason::MaxTokens => "max_tokens",
        StopReason::Refusal => "refusal",
    }
}

fn error_json(error: &ProviderError) -> Value {
    json!({
        "class": class_name(error.class),
        "retryable": error.class.retryable(),
        "status": error.status,
        "provider_type": error.provider_code,
        "message": error.message,
        "retry_after_s": error.retry_after.map(|d| d.as_secs_f64()),
    })
}

/// The normalized result of `EXPECTED.md` from decoded items.
fn normalize(items: &[DecodedItem], provider_stop_reason: Option<String>) -> Value {
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut signature = false;
    let mut redacted = 0;
    // (index, id, name, raw arguments, ended)
    let mut calls: Vec<(usize, String, String, String, bool)> = Vec::new();
    let mut usage = Value::Null;
    let mut stop = None;
    let mut error = None;
    let mut partial = false;
    for item in items {
        match item {
            Ok(ModelChunk::TextDelta(t)) => {
                text.push_str(t);
                partial = true;
            }
            Ok(ModelChunk::ReasoningDelta {
                text: t,
                start,
                provider_meta,
            }) => {
                reasoning.push_str(t);
                let meta = provider_meta.get("anthropic");
                if meta.and_then(|m| m.get("signature")).is_some() {
                    signature = true;
                }
                if *start && meta.and_then(|m| m.get("redacted_data")).is_some() {
                    redacted += 1;
                }
            }
            Ok(ModelChunk::ToolCallStarted {
                index,
                call_id,
                name,
            }) => calls.push((*index, call_id.clone(), name.clone(), String::new(), false)),
            Ok(ModelChunk::ToolArgsDelta {
                index,
                json_fragment,
            }) => {
                let call = calls.iter_mut().find(|c| c.0 == *index).unwrap();
                call.3.push_str(json_fragment);
                partial = true;
            }
            Ok(ModelChunk::ToolCallEnded { index }) => {
                calls.iter_mut().find(|c| c.0 == *index).unwrap().4 = true;
            }
            Ok(ModelChunk::Usage(u)) => {
                usage = json!({
                    "input_tokens": u.input_tokens + u.cache_read_tokens + u.cache_write_tokens,
                    "output_tokens": u.output_tokens,
                    "cache_read_tokens": u.cache_read_tokens,
                    "cache_write_tokens": u.cache_write_tokens,
                    "reasoning_tokens": null,
                });
            }
            Ok(ModelChunk::Exchange(_)) => panic!("decoders never capture"),
            Ok(ModelChunk::Stopped { reason, .. }) => {
                assert!(stop.is_none(), "one Stopped");
                stop = Some(stop_name(*reason));
            }
            Err(e) => {
                assert!(error.is_none(), "one error");
                error = Some(error_json(e));
            }
        }
    }
    assert!(
        stop.is_none() || error.is_none(),
        "an answer stops or fails, not both"
    );
    let tool_calls: Vec<Value> = calls
        .iter()
        .filter(|c| c.4)
        .map(|c| {
            let arguments: Value = if c.3.is_empty() {
                json!({})
            } else {
                serde_json::from_str(&c.3).expect("complete arguments parse")
            };
            json!({"id": c.1, "name": c.2, "arguments": arguments})
        })
        .collect();
    let incomplete: Vec<Value> = calls
        .iter()
        .filter(|c| !c.4)
        .map(|c| json!({"id": c.1, "name": c.2, "raw_arguments": c.3}))
        .collect();
    json!({
        "text": text,
        "reasoning": if reasoning.is_empty() { Value::Null } else { json!(reasoning) },
        "reasoning_signature": signature,
        "redacted_reasoning_blocks": redacted,
        "tool_calls": tool_calls,
        "incomplete_tool_calls": incomplete,
        "stop_reason": stop.unwrap_or("error"),
        "provider_stop_reason": provider_stop_reason,
        "usage": usage,
        "error": error,
        "partial_output": error.is_some() && partial,
    })
}

fn check(name: &str, how: &str, actual: &Value, expected: &Value) {
    let what = |field: &str| format!("{name} ({how}): {field}");
    fixtures::assert_long_string(
        actual["text"].as_str().unwrap(),
        &expected["text"],
        &what("text"),
    );
    for field in [
        "reasoning",
        "tool_calls",
        "stop_reason",
        "provider_stop_reason",
    ] {
        assert_eq!(actual[field], expected[field], "{}", what(field));
    }
    assert_eq!(
        actual["reasoning_signature"],
        expected
            .get("reasoning_signature")
            .cloned()
            .unwrap_or(json!(false)),
        "{}",
        what("reasoning_signature")
    );
    assert_eq!(
        actual["redacted_reasoning_blocks"],
        expected
            .get("redacted_reasoning_blocks")
            .cloned()
            .unwrap_or(json!(0)),
        "{}",
        what("redacted_reasoning_blocks")
    );
    assert_eq!(
        actual["incomplete_tool_calls"],
        expected
            .get("incomplete_tool_calls")
            .cloned()
            .unwrap_or(json!([])),
        "{}",
        what("incomplete_tool_calls")
    );
    assert_eq!(
        actual["partial_output"],
        expected
            .get("partial_output")
            .cloned()
            .unwrap_or(json!(false)),
        "{}",
        what("partial_output")
    );
    if expected["error"].is_null() {
        assert_eq!(actual["usage"], expected["usage"], "{}", what("usage"));
        assert_eq!(actual["error"], Value::Null, "{}", what("error"));
    } else {
        // Usage is best effort after an error: only the prompt is asserted.
        assert_eq!(
            actual["usage"]["input_tokens"],
            expected["usage"]["input_tokens"],
            "{}",
            what("usage.input_tokens")
        );
        for field in [
            "class",
            "retryable",
            "status",
            "provider_type",
            "message",
            "retry_after_s",
        ] {
            assert_eq!(
                actual["error"][field],
                expected["error"][field],
                "{}",
                what(&format!("error.{field}"))
            );
        }
    }
}

// ------------------------------------------------------------------------------------------
// Streams
// ------------------------------------------------------------------------------------------

#[test]
fn every_stream_decodes_to_its_expected_result_however_the_bytes_arrive() {
    if !fixtures::present() {
        return;
    }
    let files = fixtures::list("anthropic", ".sse");
    assert_eq!(files.len(), 12, "the Anthropic transcripts: {files:?}");
    for file in files {
        let bytes = fixtures::read(&file);
        let expected = fixtures::expected(&file);
        let offsets = fixtures::utf8_offsets(&file);
        if file.contains("utf8") {
            assert_eq!(offsets.len(), 5, "{file}: offsets listed");
            for offset in &offsets {
                assert!(
                    bytes[*offset] >= 0xC0,
                    "{file}: a multi-byte start at {offset}"
                );
            }
        }
        for (how, pieces) in fixtures::chunkings(&bytes, &offsets) {
            let (items, raw) = decode_pieces(pieces);
            check(&file, &how, &normalize(&items, raw), &expected);
        }
    }
}

#[test]
fn decode_sse_gives_the_decoder_items_whatever_the_chunking() {
    if !fixtures::present() {
        return;
    }
    for file in fixtures::list("anthropic", ".sse") {
        let bytes = fixtures::read(&file);
        let (reference, _) = decode_pieces(vec![bytes.clone()]);
        for pieces in [
            vec![bytes.clone()],
            bytes.iter().map(|b| vec![*b]).collect(),
            bytes.chunks(7).map(<[u8]>::to_vec).collect(),
        ] {
            let items: Vec<DecodedItem> = block_on(decode_sse(byte_stream(pieces)).collect());
            assert_eq!(items, reference, "{file}");
        }
    }
}

#[test]
fn the_accumulator_builds_the_answer_and_the_reasoning_replays() {
    if !fixtures::present() {
        return;
    }
    let settings = AnthropicSettings::default();
    for file in fixtures::list("anthropic", ".sse") {
        let expected = fixtures::expected(&file);
        let (items, _) = decode_pieces(vec![fixtures::read(&file)]);
        let mut accumulator = ResponseAccumulator::new();
        let mut failed = false;
        for item in items {
            match item {
                Ok(chunk) => accumulator.push(chunk),
                Err(_) => failed = true,
            }
        }
        if failed {
            assert!(!expected["error"].is_null(), "{file}");
            continue;
        }
        let response = accumulator.finish().unwrap();
        assert_eq!(
            stop_name(response.stop_reason),
            expected["stop_reason"],
            "{file}"
        );
        assert!(!response.model_id.is_empty(), "{file}: model id");
        fixtures::assert_long_string(&response.message.text(), &expected["text"], &file);
        let complete = expected["tool_calls"].as_array().unwrap();
        let calls: Vec<_> = response.message.tool_calls().collect();
        let incomplete = expected
            .get("incomplete_tool_calls")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        assert_eq!(calls.len(), complete.len() + incomplete, "{file}");
        for (call, want) in calls.iter().zip(complete) {
            assert_eq!(call.0, want["id"], "{file}");
            assert_eq!(*call.2, want["arguments"], "{file}");
        }
        let usage = &expected["usage"];
        assert_eq!(
            response.usage.prompt_tokens(),
            usage["input_tokens"].as_u64().unwrap(),
            "{file}"
        );
        assert_eq!(
            response.usage.output_tokens,
            usage["output_tokens"].as_u64().unwrap(),
            "{file}"
        );

        // The assistant message goes back as it came: thinking with its signature, redacted
        // thinking with its data, in the model's order.
        let request = ModelRequest {
            messages: shared(vec![Message::user("question"), response.message.clone()]),
            ..plain_request()
        };
        let body = build_request(&options(), &settings, &request);
        let Some(content) = body["messages"][1]["content"].as_array() else {
            // An empty answer (the refusal) has nothing to send back.
            assert_eq!(response.message.text(), "", "{file}");
            assert_eq!(body["messages"].as_array().unwrap().len(), 1, "{file}");
            continue;
        };
        let kinds: Vec<&str> = content
            .iter()
            .map(|b| b["type"].as_str().unwrap())
            .collect();
        if expected.get("reasoning_signature") == Some(&json!(true)) {
            assert_eq!(kinds[0], "thinking", "{file}");
            assert_eq!(content[0]["thinking"], expected["reasoning"], "{file}");
            assert!(
                content[0]["signature"]
                    .as_str()
                    .unwrap()
                    .starts_with("EvMCCkYICxgC")
            );
        }
        if let Some(n) = expected
            .get("redacted_reasoning_blocks")
            .and_then(Value::as_u64)
        {
            assert_eq!(kinds[..n as usize], ["redacted_thinking"; 2], "{file}");
            assert!(content[0]["data"].as_str().unwrap().starts_with("EqkECkYI"));
        }
    }
}

#[test]
fn a_cut_stream_is_a_transient_error_after_the_usage_known() {
    if !fixtures::present() {
        return;
    }
    let bytes = fixtures::read("anthropic/stream-text-basic.sse");
    let text = String::from_utf8(bytes).unwrap();
    let cut = text.find("event: content_block_stop").unwrap();
    let (items, _) = decode_pieces(vec![text.as_bytes()[..cut].to_vec()]);
    let result = normalize(&items, None);
    assert_eq!(result["text"], "Hello!");
    assert_eq!(result["stop_reason"], "error");
    assert_eq!(result["error"]["class"], "transient");
    assert_eq!(result["error"]["retryable"], true);
    assert_eq!(result["usage"]["input_tokens"], 25);
    assert_eq!(result["partial_output"], true);

    // Nothing at all: still an error, without usage.
    let (items, _) = decode_pieces(vec![]);
    assert!(matches!(items.as_slice(), [Err(e)] if e.class == ErrorClass::Transient));
}

#[test]
fn in_stream_errors_keep_their_kind() {
    if !fixtures::present() {
        return;
    }
    let (items, _) = decode_pieces(vec![fixtures::read(
        "anthropic/stream-error-overloaded-midstream.sse",
    )]);
    let error = items.iter().find_map(|i| i.as_ref().err()).unwrap();
    assert_eq!(error.class, ErrorClass::Overloaded);
    let model_error = loom_core::model::ModelError::from(error.clone());
    assert_eq!(model_error.kind, ModelErrorKind::Overloaded);
    assert_eq!(model_error.http_status, Some(200));

    let mut decoder = Decoder::new();
    let data = r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#;
    let items = decoder.feed(Some("error"), data);
    assert!(matches!(items.as_slice(), [Err(e)] if e.class == ErrorClass::Invalid));
    // The answer is over: later events and the end of stream add nothing.
    assert!(decoder.feed(None, r#"{"type":"message_stop"}"#).is_empty());
    assert!(decoder.finish().is_empty());

    // Data that is not JSON fails the answer as transient.
    let mut decoder = Decoder::new();
    let items = decoder.feed(Some("message_start"), "{not json");
    assert!(matches!(items.as_slice(), [Err(e)] if e.class == ErrorClass::Transient));
}

#[test]
fn stop_reasons_are_normalized() {
    for (raw, want) in [
        ("end_turn", StopReason::End),
        ("stop_sequence", StopReason::End),
        ("pause_turn", StopReason::End),
        ("tool_use", StopReason::ToolUse),
        ("max_tokens", StopReason::MaxTokens),
        ("model_context_window_exceeded", StopReason::MaxTokens),
        ("refusal", StopReason::Refusal),
    ] {
        let mut decoder = Decoder::new();
        decoder.feed(
            None,
            r#"{"type":"message_start","message":{"model":"m","usage":{"input_tokens":1}}}"#,
        );
        let data = json!({"type": "message_delta", "delta": {"stop_reason": raw}}).to_string();
        decoder.feed(Some("message_delta"), &data);
        let items = decoder.feed(None, r#"{"type":"message_stop"}"#);
        assert_eq!(
            items.last(),
            Some(&Ok(ModelChunk::Stopped {
                reason: want,
                model_id: "m".into()
            })),
            "{raw}"
        );
    }
}

// ------------------------------------------------------------------------------------------
// Error bodies
// ------------------------------------------------------------------------------------------

fn header_map(meta: &Value) -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in meta["headers"].as_object().unwrap() {
        headers.insert(
            reqwest::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.as_str().unwrap().parse().unwrap(),
        );
    }
    headers
}

#[test]
fn every_error_body_classifies_as_expected() {
    if !fixtures::present() {
        return;
    }
    let files = fixtures::list("anthropic", ".json");
    assert_eq!(files.len(), 7, "the Anthropic error bodies: {files:?}");
    for file in files {
        let body = String::from_utf8(fixtures::read(&file)).unwrap();
        let meta = fixtures::read_json(&file.replace(".json", ".meta.json"));
        let status = meta["status"].as_u64().unwrap() as u16;
        let retry_after = loom_providers::error::retry_after(&header_map(&meta));
        let error = classify(Some(status), &body, retry_after);
        let expected = fixtures::expected(&file)["error"].clone();
        let actual = error_json(&error);
        for field in ["class", "retryable", "status", "provider_type"] {
            assert_eq!(actual[field], expected[field], "{file}: {field}");
        }
        assert_eq!(
            actual["retry_after_s"].as_f64(),
            expected["retry_after_s"].as_f64(),
            "{file}: retry_after_s"
        );
        let provider_message = serde_json::from_str::<Value>(&body).unwrap()["error"]["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(error.message, provider_message, "{file}: message");
        if file.contains("529") {
            assert_eq!(error.class, ErrorClass::Overloaded);
        }
    }
}

#[test]
fn classification_edge_cases() {
    let body =
        |t: &str, m: &str| json!({"type":"error","error":{"type":t,"message":m}}).to_string();
    let class = |status: Option<u16>, b: &str| classify(status, b, None).class;
    let limit = "input length and `max_tokens` exceed context limit: 190000 + 20000 > 200000";
    assert_eq!(
        class(Some(400), &body("invalid_request_error", limit)),
        ErrorClass::ContextLength
    );
    // The message is read only for invalid_request_error: a rate limit stays transient.
    assert_eq!(
        class(Some(429), &body("rate_limit_error", "prompt is too long")),
        ErrorClass::Transient
    );
    assert_eq!(
        class(Some(403), &body("permission_error", "no")),
        ErrorClass::Auth
    );
    assert_eq!(
        class(Some(402), &body("billing_error", "pay")),
        ErrorClass::Quota
    );
    assert_eq!(
        class(Some(404), &body("not_found_error", "model: x")),
        ErrorClass::Invalid
    );
    assert_eq!(
        class(Some(413), &body("request_too_large", "too big")),
        ErrorClass::Invalid
    );
    assert_eq!(class(Some(529), ""), ErrorClass::Overloaded);
    // 503 is overloaded too (the reference's rules), whatever the body.
    assert_eq!(
        class(Some(503), "<html>Service Unavailable</html>"),
        ErrorClass::Overloaded
    );
    // A context overflow said in the message of a 400 of another wording.
    assert_eq!(
        class(
            Some(400),
            &body("invalid_request_error", "the context window is full")
        ),
        ErrorClass::ContextLength
    );
    // Quota comes before auth.
    assert_eq!(
        class(Some(403), &body("billing_error", "pay")),
        ErrorClass::Quota
    );
    // A gateway page that is not JSON: by status.
    let bad_gateway = classify(Some(502), "<html>Bad Gateway</html>", None);
    assert_eq!(bad_gateway.class, ErrorClass::Transient);
    assert!(bad_gateway.message.contains("HTTP 502"));
    assert_eq!(class(Some(400), "nope"), ErrorClass::Invalid);
    // In-stream (HTTP 200) errors by their type.
    assert_eq!(
        class(Some(200), &body("authentication_error", "x")),
        ErrorClass::Auth
    );
    assert_eq!(
        class(Some(200), &body("rate_limit_error", "x")),
        ErrorClass::Transient
    );
    assert_eq!(
        class(Some(200), &body("something_new", "x")),
        ErrorClass::Transient
    );
    assert_eq!(
        classify(Some(429), "", Some(Duration::from_secs(3))).retry_after,
        Some(Duration::from_secs(3))
    );
}

// ------------------------------------------------------------------------------------------
// Request building
// ------------------------------------------------------------------------------------------

fn options() -> ProviderOptions {
    ProviderOptions {
        base_url: String::new(),
        api_key: Some("sk-test".into()),
        api_key_env: Some("ANTHROPIC_API_KEY".into()),
        model: "claude-sonnet-4-5".into(),
        max_tokens: None,
        headers: BTreeMap::new(),
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
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        })),
    }
}

fn plain_request() -> ModelRequest {
    ModelRequest {
        model_id: "claude-sonnet-4-5".into(),
        system: "You are a terse weather assistant.".into(),
        messages: shared(vec![Message::user("Weather in Paris?")]),
        tools: vec![weather_tool()],
        tool_choice: ToolChoice::Auto,
        max_tokens: None,
        params: Default::default(),
        output_schema: None,
    }
}

fn meta(key: &str, value: &str) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert("anthropic".into(), json!({ key: value }));
    map
}

fn reasoning(text: &str, provider_meta: Map<String, Value>) -> Block {
    let mut block = Block::new(BlockKind::Reasoning {
        text: text.into(),
        model_id: Some("claude-sonnet-4-5".into()),
    });
    block.provider_meta = provider_meta;
    block
}

fn tool_result(call_id: &str, output: ToolOutput) -> Block {
    Block::new(BlockKind::ToolResult {
        call_id: call_id.into(),
        output,
    })
}

fn tool_loop_request() -> ModelRequest {
    let mut params = Map::new();
    params.insert(
        "thinking".into(),
        json!({"type": "enabled", "budget_tokens": 2048}),
    );
    ModelRequest {
        messages: shared(vec![
            Message::user("Weather in Paris and Oslo?"),
            Message {
                role: Role::Assistant,
                blocks: vec![
                    reasoning("Two cities: two calls.", meta("signature", "sig-abc")),
                    reasoning("", meta("redacted_data", "opaque-xyz")),
                    Block::text(""),
                    Block::text("Checking both."),
                    Block::tool_call("toolu_1", "get_weather", json!({"city": "Paris"})),
                    Block::tool_call("toolu_2", "get_weather", json!({"city": "Oslo"})),
                ],
            },
            Message {
                role: Role::Tool,
                blocks: vec![
                    tool_result("toolu_1", ToolOutput::json(json!({"temp_c": 18}))),
                    tool_result("toolu_2", ToolOutput::error("unknown city 'Oslo'")),
                ],
            },
            Message::user("Also, be brief."),
            Message {
                role: Role::Assistant,
                blocks: vec![
                    // Reasoning of another provider (no Anthropic signature): not echoed.
                    reasoning("other model's thoughts", Map::new()),
                    Block::text("Paris: 18 °C. Oslo: unknown."),
                ],
            },
            Message::user("Thanks"),
        ]),
        max_tokens: Some(8000),
        params: params.into(),
        ..plain_request()
    }
}

#[test]
fn request_plain_turn_with_system_and_tools() {
    let mut request = plain_request();
    std::sync::Arc::make_mut(&mut request.params).insert("temperature".into(), json!(0.2));
    let mut options = options();
    options.max_tokens = Some(1024);
    let body = build_request(&options, &AnthropicSettings::default(), &request);
    insta::assert_json_snapshot!("plain_turn", body);

    // Without tools: no tools, no tool_choice; default cap 4096; no system when empty.
    let bare = ModelRequest {
        system: String::new(),
        tools: vec![],
        ..plain_request()
    };
    let body = build_request(&self::options(), &AnthropicSettings::default(), &bare);
    assert_eq!(body["max_tokens"], 4096);
    assert!(body.get("tools").is_none() && body.get("tool_choice").is_none());
    assert!(body.get("system").is_none());
    assert_eq!(body["stream"], true);
}

#[test]
fn request_tool_loop_with_results_and_signed_thinking() {
    let body = build_request(
        &options(),
        &AnthropicSettings::default(),
        &tool_loop_request(),
    );
    insta::assert_json_snapshot!("tool_loop", body);
    let roles: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant", "user"]);
}

#[test]
fn request_never_carries_the_full_view_of_a_result() {
    let mut request = tool_loop_request();
    let plain = build_request(&options(), &AnthropicSettings::default(), &request);
    for message in request.messages.iter_mut().map(std::sync::Arc::make_mut) {
        for block in &mut message.blocks {
            if let BlockKind::ToolResult { output, .. } = &mut block.kind {
                output.full = Some(json!({"rows": ["FULL-VIEW-ONLY"]}));
            }
        }
    }
    let with_full = build_request(&options(), &AnthropicSettings::default(), &request);
    assert!(!with_full.to_string().contains("FULL-VIEW-ONLY"));
    assert_eq!(with_full, plain);
}

#[test]
fn request_cache_breakpoints() {
    let settings = AnthropicSettings {
        cache: CacheSettings {
            system: true,
            tools: true,
            messages: true,
            ttl: Some("1h".into()),
        },
        ..AnthropicSettings::default()
    };
    let body = build_request(&options(), &settings, &tool_loop_request());
    insta::assert_json_snapshot!("cache", body);

    // Explicit block breakpoints on top: never more than four in all, the latest kept.
    let mut request = tool_loop_request();
    for message in request.messages.iter_mut().map(std::sync::Arc::make_mut) {
        for block in &mut message.blocks {
            block.cache_breakpoint = true;
        }
    }
    let body = build_request(&options(), &settings, &request);
    let text = body.to_string();
    assert_eq!(text.matches("cache_control").count(), 4);
    let last_user = body["messages"].as_array().unwrap().last().unwrap();
    assert!(last_user["content"][0].get("cache_control").is_some());
}

fn image_request() -> ModelRequest {
    ModelRequest {
        tools: vec![],
        messages: shared(vec![Message {
            role: Role::User,
            blocks: vec![
                Block::text("What is in this picture?"),
                Block::new(BlockKind::InlineData {
                    media_type: "image/png".into(),
                    data: "iVBORw0KGgo=".into(),
                    name: Some("cat.png".into()),
                }),
                Block::new(BlockKind::Artifact {
                    uri: "artifact://run-1/report.pdf".into(),
                    media_type: "application/pdf".into(),
                    size: 2048,
                    name: Some("report.pdf".into()),
                }),
            ],
        }]),
        ..plain_request()
    }
}

#[test]
fn request_images_with_and_without_vision() {
    let vision = AnthropicSettings {
        vision: true,
        ..AnthropicSettings::default()
    };
    insta::assert_json_snapshot!(
        "image_vision",
        build_request(&options(), &vision, &image_request())
    );
    insta::assert_json_snapshot!(
        "image_no_vision",
        build_request(&options(), &AnthropicSettings::default(), &image_request())
    );
}

#[test]
fn request_native_json_and_params() {
    let mut request = plain_request();
    request.output_schema = Some(json!({
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
        "additionalProperties": false,
    }));
    std::sync::Arc::make_mut(&mut request.params)
        .insert("output_config".into(), json!({"effort": "low"}));
    std::sync::Arc::make_mut(&mut request.params).insert("stream".into(), json!(false));
    let native = AnthropicSettings {
        native_json: true,
        ..AnthropicSettings::default()
    };
    let body = build_request(&options(), &native, &request);
    assert_eq!(body["output_config"]["effort"], "low");
    assert_eq!(
        body["output_config"]["format"]["type"], "json_schema",
        "{body}"
    );
    assert_eq!(
        body["output_config"]["format"]["schema"]["required"],
        json!(["answer"])
    );
    assert_eq!(body["stream"], true, "streaming is not a parameter");

    let body = build_request(&options(), &AnthropicSettings::default(), &request);
    assert!(body["output_config"].get("format").is_none());
}

#[test]
fn tool_choices() {
    for (choice, wire) in [
        (ToolChoice::Auto, "auto"),
        (ToolChoice::None, "none"),
        (ToolChoice::Required, "any"),
    ] {
        let request = ModelRequest {
            tool_choice: choice,
            ..plain_request()
        };
        let body = build_request(&options(), &AnthropicSettings::default(), &request);
        assert_eq!(body["tool_choice"], json!({ "type": wire }));
    }
}

#[test]
fn endpoints() {
    let mut options = options();
    assert_eq!(endpoint(&options), "https://api.anthropic.com/v1/messages");
    options.base_url = "http://127.0.0.1:9/".into();
    assert_eq!(endpoint(&options), "http://127.0.0.1:9/v1/messages");
    options.base_url = "https://gateway.example/anthropic/v1".into();
    assert_eq!(
        endpoint(&options),
        "https://gateway.example/anthropic/v1/messages"
    );
}

// ------------------------------------------------------------------------------------------
// HTTP, over loopback
// ------------------------------------------------------------------------------------------

/// Serves one response on 127.0.0.1 and hands back the request it received.
fn serve_once(
    status: u16,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (String, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let mut request = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            let n = socket.read(&mut buffer).unwrap();
            request.extend_from_slice(&buffer[..n]);
            let text = String::from_utf8_lossy(&request).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text[..end]
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if request.len() >= end + 4 + length || n == 0 {
                    break;
                }
            }
            if n == 0 {
                break;
            }
        }
        sender
            .send(String::from_utf8_lossy(&request).to_string())
            .unwrap();
        let mut response = format!(
            "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n",
            body.len()
        );
        for (name, value) in headers {
            response.push_str(&format!("{name}: {value}\r\n"));
        }
        response.push_str("\r\n");
        socket.write_all(response.as_bytes()).unwrap();
        socket.write_all(&body).unwrap();
    });
    (address, receiver)
}

fn client(base_url: String, api_key: Option<&str>) -> AnthropicModel {
    let mut options = options();
    options.base_url = base_url;
    options.api_key = api_key.map(str::to_string);
    options.api_key_env = api_key.map(|_| "ANTHROPIC_API_KEY".to_string());
    options
        .headers
        .insert("anthropic-beta".into(), "test-beta".into());
    AnthropicModel::new(options, AnthropicSettings::default()).unwrap()
}

#[test]
fn streams_over_http_with_the_right_headers() {
    if !fixtures::present() {
        return;
    }
    let (address, requests) = serve_once(
        200,
        &[("content-type", "text/event-stream")],
        fixtures::read("anthropic/stream-tool-use-single.sse"),
    );
    let model = client(address, Some("sk-loopback"));
    assert_eq!(model.provider(), "anthropic");
    let items: Vec<_> = block_on(model.stream(&plain_request()).collect());
    let mut accumulator = ResponseAccumulator::new();
    for item in items {
        accumulator.push(item.unwrap());
    }
    let response = accumulator.finish().unwrap();
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    let calls: Vec<_> = response.message.tool_calls().collect();
    assert_eq!(calls[0].0, "toolu_01T1x1fJ34qAmk2tNTrN7Up6");

    let request = requests.recv_timeout(Duration::from_secs(5)).unwrap();
    let lower = request.to_lowercase();
    assert!(lower.starts_with("post /v1/messages http/1.1"), "{request}");
    assert!(lower.contains("x-api-key: sk-loopback"));
    assert!(lower.contains("anthropic-version: 2023-06-01"));
    assert!(lower.contains("anthropic-beta: test-beta"));
    assert!(lower.contains("content-type: application/json"));
    let body: Value =
        serde_json::from_str(&request[request.find("\r\n\r\n").unwrap() + 4..]).unwrap();
    assert_eq!(
        body,
        build_request(model.options(), model.settings(), &plain_request())
    );
}

#[test]
fn http_errors_are_classified_with_retry_after_and_the_missing_key_hint() {
    if !fixtures::present() {
        return;
    }
    let (address, requests) = serve_once(
        401,
        &[("content-type", "application/json")],
        fixtures::read("anthropic/error-401-authentication.json"),
    );
    let items: Vec<_> = block_on(client(address, None).stream(&plain_request()).collect());
    let request = requests.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(!request.to_lowercase().contains("x-api-key"));
    let [Err(error)] = items.as_slice() else {
        panic!("one error: {items:?}")
    };
    assert_eq!(error.kind, ModelErrorKind::Auth);
    assert_eq!(error.http_status, Some(401));
    assert_eq!(
        error.message,
        "invalid x-api-key — no API key was sent: model claude-sonnet-4-5 has no api_key_env \
         (declare for example api_key_env: ANTHROPIC_API_KEY)"
    );

    let (address, _requests) = serve_once(
        429,
        &[("content-type", "application/json"), ("retry-after", "27")],
        fixtures::read("anthropic/error-429-rate-limit.json"),
    );
    let items: Vec<_> = block_on(
        client(address, Some("k"))
            .stream(&plain_request())
            .collect(),
    );
    let [Err(error)] = items.as_slice() else {
        panic!("one error: {items:?}")
    };
    assert_eq!(error.kind, ModelErrorKind::Transient);
    assert_eq!(error.retry_after, Some(Duration::from_secs(27)));
    assert!(!error.message.contains("no API key"));
}

#[test]
fn a_refused_connection_is_transient() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let items: Vec<_> = block_on(
        client(address, Some("k"))
            .stream(&plain_request())
            .collect(),
    );
    let [Err(error)] = items.as_slice() else {
        panic!("one error: {items:?}")
    };
    assert_eq!(error.kind, ModelErrorKind::Transient);
}

// ------------------------------------------------------------------------------------------
// Capture of the raw exchange
// ------------------------------------------------------------------------------------------

fn capturing(base_url: String, max: usize) -> AnthropicModel {
    let mut options = options();
    options.base_url = base_url;
    options.api_key = Some("sk-ant-secret-key".into());
    options.capture = Some(max);
    AnthropicModel::new(
        options,
        AnthropicSettings {
            vision: true,
            ..AnthropicSettings::default()
        },
    )
    .unwrap()
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn a_captured_stream_ends_with_its_exchange() {
    if !fixtures::present() {
        return;
    }
    let sse = fixtures::read("anthropic/stream-text-basic.sse");
    let (address, requests) =
        serve_once(200, &[("content-type", "text/event-stream")], sse.clone());
    let model = capturing(address.clone(), 1 << 20);
    let items: Vec<_> = block_on(model.stream(&image_request()).collect());
    let Some(Ok(ModelChunk::Exchange(exchange))) = items.last() else {
        panic!("the exchange comes last: {items:?}")
    };
    let mut accumulator = ResponseAccumulator::new();
    for item in items.iter().cloned() {
        accumulator.push(item.unwrap());
    }
    assert_eq!(accumulator.finish().unwrap().message.text(), "Hello!");

    let request = requests.recv_timeout(Duration::from_secs(5)).unwrap();
    let sent = &request[request.find("\r\n\r\n").unwrap() + 4..];
    assert_eq!(exchange.method, "POST");
    assert_eq!(exchange.url, format!("{address}/v1/messages"));
    assert_eq!(exchange.status_code, Some(200));
    assert_eq!(exchange.request_headers["x-api-key"], "<redacted>");
    assert_eq!(exchange.request_headers["anthropic-version"], "2023-06-01");
    assert_eq!(exchange.request_bytes, sent.len() as u64);
    assert_eq!(exchange.request_sha256, sha256_hex(sent.as_bytes()));
    assert!(!exchange.request_truncated);
    // The image travels in full, but the exchange keeps only its size.
    assert!(sent.contains("iVBORw0KGgo="));
    assert!(!exchange.request_body.contains("iVBORw0KGgo="));
    assert!(exchange.request_body.contains("\"data\":\"<8 bytes>\""));
    assert_eq!(
        exchange.response_headers["content-type"],
        "text/event-stream"
    );
    assert_eq!(exchange.response_body.as_bytes(), sse.as_slice());
    assert_eq!(exchange.response_bytes, sse.len() as u64);
    assert_eq!(exchange.response_sha256, sha256_hex(&sse));
    assert!(!exchange.response_truncated);
    assert_eq!(exchange.error, None);
    assert!(!format!("{exchange:?}").contains("sk-ant-secret-key"));
}

#[test]
fn a_captured_failure_gives_its_exchange_just_before_the_error() {
    if !fixtures::present() {
        return;
    }
    // An HTTP error.
    let body = fixtures::read("anthropic/error-529-overloaded.json");
    let (address, _requests) =
        serve_once(529, &[("content-type", "application/json")], body.clone());
    let items: Vec<_> = block_on(capturing(address, 40).stream(&plain_request()).collect());
    let [Ok(ModelChunk::Exchange(exchange)), Err(error)] = items.as_slice() else {
        panic!("exchange then error: {items:?}")
    };
    assert_eq!(error.kind, ModelErrorKind::Overloaded);
    assert_eq!(exchange.status_code, Some(529));
    assert_eq!(exchange.error.as_deref(), Some(error.message.as_str()));
    assert!(exchange.request_truncated);
    assert!(exchange.request_body.len() <= 40);
    assert!(exchange.response_truncated);
    assert_eq!(exchange.response_body.as_bytes(), &body[..40]);
    assert_eq!(exchange.response_sha256, sha256_hex(&body));

    // An error in the middle of a stream.
    let sse = fixtures::read("anthropic/stream-error-overloaded-midstream.sse");
    let (address, _requests) = serve_once(200, &[("content-type", "text/event-stream")], sse);
    let items: Vec<_> = block_on(
        capturing(address, 1 << 20)
            .stream(&plain_request())
            .collect(),
    );
    let n = items.len();
    assert!(
        matches!(&items[n - 2], Ok(ModelChunk::Exchange(e)) if e.status_code == Some(200) && e.error.is_some()),
        "{items:?}"
    );
    assert!(matches!(&items[n - 1], Err(e) if e.kind == ModelErrorKind::Overloaded));

    // No response at all.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let items: Vec<_> = block_on(capturing(address, 100).stream(&plain_request()).collect());
    let [Ok(ModelChunk::Exchange(exchange)), Err(_)] = items.as_slice() else {
        panic!("exchange then error: {items:?}")
    };
    assert_eq!(exchange.status_code, None);
    assert!(exchange.error.as_deref().unwrap().contains("network error"));
}

#[test]
fn without_capture_no_exchange_is_streamed() {
    if !fixtures::present() {
        return;
    }
    let (address, _requests) = serve_once(
        200,
        &[("content-type", "text/event-stream")],
        fixtures::read("anthropic/stream-text-basic.sse"),
    );
    let items: Vec<_> = block_on(
        client(address, Some("k"))
            .stream(&plain_request())
            .collect(),
    );
    assert!(
        !items
            .iter()
            .any(|i| matches!(i, Ok(ModelChunk::Exchange(_))))
    );
}

// ------------------------------------------------------------------------------------------
// A model that does not stream (`capabilities: {streaming: false}`)
// ------------------------------------------------------------------------------------------

/// The whole message a request without `stream` gets for what `stream-tool-use-single.sse`
/// streams (the Messages API's documented shape).
fn tool_use_message() -> Value {
    json!({
        "id": "msg_01Aq9w938a90dw8q",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [
            {"type": "text", "text": "Okay, let's check the weather for San Francisco, CA:"},
            {
                "type": "tool_use",
                "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                "name": "get_weather",
                "input": {"location": "San Francisco, CA", "unit": "fahrenheit"}
            }
        ],
        "stop_reason": "tool_use",
        "stop_sequence": null,
        "usage": {
            "input_tokens": 472,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 89
        }
    })
}

fn accumulate(items: Vec<DecodedItem>) -> loom_core::model::ModelResponse {
    let mut accumulator = ResponseAccumulator::new();
    for item in items {
        accumulator.push(item.unwrap());
    }
    accumulator.finish().unwrap()
}

#[test]
fn a_whole_message_gives_what_its_stream_gives() {
    if !fixtures::present() {
        return;
    }
    let whole = accumulate(decode_message(&tool_use_message().to_string()));
    let (streamed, _) = decode_pieces(vec![fixtures::read("anthropic/stream-tool-use-single.sse")]);
    let streamed = accumulate(streamed);
    assert_eq!(whole.message, streamed.message);
    assert_eq!(whole.usage, streamed.usage);
    assert_eq!(whole.stop_reason, StopReason::ToolUse);

    // Thinking keeps its signature, a redacted block its data, as in a stream.
    let thinking = json!({
        "type": "message",
        "model": "claude-sonnet-4-5",
        "content": [
            {"type": "thinking", "thinking": "Let me think.", "signature": "sig-1"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Done."}
        ],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 10, "output_tokens": 3}
    });
    let response = accumulate(decode_message(&thinking.to_string()));
    assert_eq!(response.message.text(), "Done.");
    assert_eq!(response.stop_reason, StopReason::End);
    let metas: Vec<&Map<String, Value>> = response
        .message
        .blocks
        .iter()
        .filter(|b| matches!(b.kind, BlockKind::Reasoning { .. }))
        .map(|b| &b.provider_meta)
        .collect();
    assert_eq!(metas.len(), 2);
    assert_eq!(metas[0]["anthropic"]["signature"], "sig-1");
    assert_eq!(metas[1]["anthropic"]["redacted_data"], "opaque");

    // Not JSON: transient. An error object: classified.
    let items = decode_message("<html>proxy</html>");
    assert!(matches!(items.as_slice(), [Err(e)] if e.class == ErrorClass::Transient));
    let overloaded =
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    let items = decode_message(&overloaded.to_string());
    assert!(matches!(items.as_slice(), [Err(e)] if e.class == ErrorClass::Overloaded));
}

#[test]
fn a_model_that_does_not_stream_is_asked_without_stream_and_read_whole() {
    let settings = AnthropicSettings {
        streaming: false,
        ..AnthropicSettings::default()
    };
    let mut request = plain_request();
    std::sync::Arc::make_mut(&mut request.params).insert("stream".into(), json!(true));
    let body = build_request(&options(), &settings, &request);
    assert!(body.get("stream").is_none(), "{body}");
    let mut streamed = build_request(&options(), &AnthropicSettings::default(), &plain_request());
    streamed.as_object_mut().unwrap().remove("stream");
    assert_eq!(body, streamed);

    let (address, requests) = serve_once(
        200,
        &[("content-type", "application/json")],
        tool_use_message().to_string().into_bytes(),
    );
    let mut options = options();
    options.base_url = address;
    let model = AnthropicModel::new(options, settings).unwrap();
    let items: Vec<_> = block_on(model.stream(&plain_request()).collect());
    let mut accumulator = ResponseAccumulator::new();
    for item in items {
        accumulator.push(item.unwrap());
    }
    let response = accumulator.finish().unwrap();
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    assert_eq!(
        response.message.text(),
        "Okay, let's check the weather for San Francisco, CA:"
    );
    let calls: Vec<_> = response.message.tool_calls().collect();
    assert_eq!(
        calls[0].2,
        &json!({"location": "San Francisco, CA", "unit": "fahrenheit"})
    );
    assert_eq!(response.usage.input_tokens, 472);
    let request = requests.recv_timeout(Duration::from_secs(5)).unwrap();
    let body: Value =
        serde_json::from_str(&request[request.find("\r\n\r\n").unwrap() + 4..]).unwrap();
    assert!(body.get("stream").is_none(), "{body}");
}

/// Messages as a request shares them.
fn shared(messages: Vec<Message>) -> Vec<std::sync::Arc<Message>> {
    messages.into_iter().map(std::sync::Arc::new).collect()
}
