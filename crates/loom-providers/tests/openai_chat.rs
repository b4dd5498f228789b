//! OpenAI Chat Completions adapter: every transcript of `../shared/fixtures/providers/openai-chat/`
//! decodes to its `EXPECTED.md` result (bytes whole, one at a time, split inside multi-byte
//! characters, CRLF), every error body classifies as expected, request bodies are snapshotted,
//! and the client talks to a local server (no network beyond 127.0.0.1).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "openai_support.rs"]
mod support;

use futures_util::StreamExt;
use loom_core::model::{
    ModelChunk, ModelClient, ModelError, ModelErrorKind, ResponseAccumulator, StopReason,
};
use loom_providers::{
    ErrorClass, ProviderError,
    openai_chat::{
        ChatDecoder, ChatSettings, OpenAiChatModel, build_request, classify, decode_stream,
        retry_after,
    },
};
use serde_json::{Value, json};
use support::*;

/// Decodes `pieces` twice: by hand (SSE events into the decoder, for the raw stop reason) and
/// through the public byte pipeline; both must agree.
async fn decode(pieces: Vec<Vec<u8>>) -> (Vec<Result<ModelChunk, ProviderError>>, Option<String>) {
    let mut decoder = ChatDecoder::new("gpt-test");
    let mut chunks = Vec::new();
    for (_, data) in sse_events(pieces.clone()).await {
        if decoder.is_done() {
            break;
        }
        chunks.extend(decoder.feed(&data));
    }
    let raw = decoder.provider_stop_reason().map(str::to_owned);
    chunks.extend(decoder.finish());
    let piped = collect(decode_stream(body(pieces), "gpt-test")).await;
    assert_eq!(piped, chunks, "the byte pipeline and the decoder agree");
    (chunks, raw)
}

#[tokio::test]
async fn every_stream_fixture_decodes_to_its_expected_result() {
    if !fixtures_present() {
        return;
    }
    let files = fixture_files("openai-chat", ".sse");
    assert_eq!(files.len(), 9, "{files:?}");
    let mut runs = 0;
    for path in files {
        let (expected, offsets) = expected(&path);
        let bytes = std::fs::read(fixtures().join(&path)).unwrap();
        if path.contains("utf8") {
            assert_eq!(offsets.len(), 5, "{path}: offsets listed");
        }
        for (how, pieces) in deliveries(&bytes, &offsets) {
            let label = format!("{path} ({how})");
            let (chunks, raw) = decode(pieces).await;
            let normalized = normalize(&chunks, raw.as_deref());
            check(&label, &normalized, &expected);
            check_accumulated(&label, &chunks, &normalized);
            runs += 1;
        }
    }
    assert_eq!(runs, 9 * 3 + 6);
}

#[test]
fn every_error_body_classifies_as_expected() {
    if !fixtures_present() {
        return;
    }
    let files = fixture_files("openai-chat", ".json");
    assert_eq!(files.len(), 6, "{files:?}");
    for path in files {
        let (expected, _) = expected(&path);
        let (status, headers, body) = error_fixture(&path);
        let error = classify(
            Some(status),
            &body,
            retry_after(status, &header_map(&headers)),
        );
        check_error(&path, &error, &expected["error"]);
    }
}

#[test]
fn retry_after_prefers_the_headers_and_reads_go_durations() {
    let headers = |pairs: &[(&str, &str)]| {
        header_map(
            &pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<Vec<_>>(),
        )
    };
    let secs = |h| retry_after(429, &h).map(|d| d.as_secs_f64());
    assert_eq!(
        secs(headers(&[
            ("retry-after", "7"),
            ("x-ratelimit-reset-tokens", "1s")
        ])),
        Some(7.0)
    );
    assert_eq!(secs(headers(&[("retry-after-ms", "1500")])), Some(1.5));
    assert_eq!(
        secs(headers(&[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "6m0s")
        ])),
        Some(360.0)
    );
    assert_eq!(
        secs(headers(&[("x-ratelimit-reset-tokens", "1h2m3.5s")])),
        Some(3723.5)
    );
    // Only a 429 reads the rate-limit headers (they come with every response).
    let reset = headers(&[("x-ratelimit-reset-tokens", "6ms")]);
    assert_eq!(retry_after(500, &reset), None);
}

#[test]
fn classification_follows_the_reference_rules_in_order() {
    let class = |status, body: &str| class_name(classify(status, body, None).class);
    assert_eq!(
        class(
            Some(429),
            r#"{"error":{"message":"quota","code":"insufficient_quota"}}"#
        ),
        "quota"
    );
    // The code decides, not a message that names it.
    assert_eq!(
        class(Some(429), r#"{"error":{"message":"insufficient_quota"}}"#),
        "transient"
    );
    // Without its code, a context overflow is read from the message of a 400 (or 413, or an
    // error without status), as the reference does; not from a 429's.
    assert_eq!(
        class(
            Some(400),
            r#"{"error":{"message":"This model's maximum context length is 8192 tokens"}}"#
        ),
        "context_length"
    );
    assert_eq!(
        class(
            Some(413),
            r#"{"error":{"message":"Too many input tokens"}}"#
        ),
        "context_length"
    );
    assert_eq!(
        class(
            Some(429),
            r#"{"error":{"message":"maximum context length"}}"#
        ),
        "transient"
    );
    // 503 (and 529, and the overloaded codes) is overloaded, not transient.
    let unavailable = classify(Some(503), "<html>unavailable</html>", None);
    assert_eq!(unavailable.class, ErrorClass::Overloaded);
    assert_eq!(
        ModelError::from(unavailable).kind,
        ModelErrorKind::Overloaded
    );
    assert_eq!(
        classify(
            Some(500),
            r#"{"error":{"message":"busy","code":"server_overloaded"}}"#,
            None
        )
        .class,
        ErrorClass::Overloaded
    );
    assert_eq!(classify(Some(529), "", None).class, ErrorClass::Overloaded);
    assert_eq!(class(Some(502), "<html>bad gateway</html>"), "transient");
    // The content filter.
    let filtered = classify(
        Some(400),
        r#"{"error":{"message":"refused","code":"content_policy_violation"}}"#,
        None,
    );
    assert_eq!(filtered.class, ErrorClass::ContentFiltered);
    assert_eq!(
        ModelError::from(filtered).kind,
        ModelErrorKind::ContentFiltered
    );
    // Quota comes before auth, and 402 is quota.
    assert_eq!(
        class(
            Some(401),
            r#"{"error":{"message":"x","code":"billing_hard_limit_reached"}}"#
        ),
        "quota"
    );
    assert_eq!(class(Some(402), "{}"), "quota");
    assert_eq!(class(Some(409), "{}"), "transient");
    assert_eq!(
        class(Some(404), r#"{"error":"model 'x' not found"}"#),
        "invalid"
    );
    assert_eq!(class(Some(403), "{}"), "auth");
    // An error without status is transient unless a code says otherwise.
    assert_eq!(
        class(
            None,
            r#"{"error":{"message":"bad","type":"invalid_request_error"}}"#
        ),
        "transient"
    );
    let plain = classify(Some(502), "", None);
    assert_eq!(plain.message, "HTTP 502");
}

#[test]
fn decoder_edge_cases() {
    // No [DONE]: the finish_reason ends the answer at the end of the body.
    let mut d = ChatDecoder::new("m");
    let mut chunks =
        d.feed(r#"{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}"#);
    chunks.extend(d.finish());
    assert_eq!(
        chunks.last().unwrap(),
        &Ok(ModelChunk::Stopped {
            reason: StopReason::End,
            model_id: "m".into()
        })
    );

    // Neither: truncated, transient.
    let mut d = ChatDecoder::new("m");
    d.feed(r#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#);
    let end = d.finish();
    let Err(e) = &end[0] else { panic!("{end:?}") };
    assert!(e.class.retryable());

    // Missing ids are generated; a call without an index still lands; a finish_reason "stop"
    // with calls (some local servers) is tool use.
    let mut d = ChatDecoder::new("m");
    let mut chunks = d.feed(
        r#"{"choices":[{"delta":{"tool_calls":[{"function":{"name":"a","arguments":"{}"}},{"index":1,"function":{"name":"b","arguments":{"x":1}}}]},"finish_reason":"stop"}]}"#,
    );
    chunks.extend(d.feed("[DONE]"));
    let mut acc = ResponseAccumulator::new();
    for c in chunks {
        acc.push(c.unwrap());
    }
    let response = acc.finish().unwrap();
    let calls: Vec<_> = response
        .message
        .tool_calls()
        .map(|(id, name, args)| (id, name, args.clone()))
        .collect();
    assert_eq!(
        calls,
        vec![("call_0", "a", json!({})), ("call_1", "b", json!({"x": 1}))]
    );
    assert_eq!(response.stop_reason, StopReason::ToolUse);

    // Invalid JSON from the provider: transient.
    let mut d = ChatDecoder::new("m");
    let Err(e) = &d.feed("{oops")[0] else {
        panic!()
    };
    assert!(e.class.retryable());
    assert!(d.is_done() && d.feed("[DONE]").is_empty());
}

#[test]
fn reasoning_is_tagged_with_its_field() {
    let mut d = ChatDecoder::new("m");
    let chunks = d.feed(r#"{"choices":[{"index":0,"delta":{"reasoning_content":"think"}}]}"#);
    let Ok(ModelChunk::ReasoningDelta {
        start,
        provider_meta,
        ..
    }) = &chunks[0]
    else {
        panic!()
    };
    assert!(start);
    assert_eq!(
        Value::Object(provider_meta.clone()),
        json!({"openai": {"reasoning_field": "reasoning_content"}})
    );
    let chunks = d.feed(r#"{"choices":[{"index":0,"delta":{"reasoning_content":" more"}}]}"#);
    assert!(matches!(
        &chunks[0],
        Ok(ModelChunk::ReasoningDelta { start: false, .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// Request bodies

fn settings(vision: bool, native_json: bool, thinking: bool) -> ChatSettings {
    ChatSettings {
        vision,
        native_json,
        thinking,
        streaming: true,
    }
}

#[test]
fn request_plain_turn_with_system_and_tools() {
    let body = build_request(
        &options("", None),
        &settings(false, false, false),
        &plain_turn(),
    );
    insta::assert_json_snapshot!("chat_plain_turn", body);
}

#[test]
fn request_tool_loop_with_results_and_echoed_reasoning() {
    let meta = json!({ "reasoning_field": "reasoning_content" });
    let request = tool_loop(meta.clone(), meta);
    let body = build_request(&options("", None), &settings(false, false, true), &request);
    insta::assert_json_snapshot!("chat_tool_loop_thinking", body);
    // Without `thinking`, reasoning stays home.
    let body = build_request(&options("", None), &settings(false, false, false), &request);
    assert!(!body.to_string().contains("reasoning_content"));
}

#[test]
fn request_never_carries_the_full_view_of_a_result() {
    let meta = json!({ "reasoning_field": "reasoning_content" });
    let request = tool_loop(meta.clone(), meta);
    let settings = settings(false, false, true);
    let plain = build_request(&options("", None), &settings, &request);
    let with_full = build_request(&options("", None), &settings, &with_full_views(request));
    assert!(!with_full.to_string().contains("FULL-VIEW-ONLY"));
    assert_eq!(with_full, plain);
}

#[test]
fn request_native_json_schema() {
    let mut strict = json_schema(true);
    std::sync::Arc::make_mut(&mut strict.params)
        .insert("max_completion_tokens".into(), json!(true));
    let body = build_request(&options("", None), &settings(false, true, false), &strict);
    insta::assert_json_snapshot!("chat_json_schema_strict", body);
    let loose = json_schema(false);
    let body = build_request(&options("", None), &settings(false, true, false), &loose);
    insta::assert_json_snapshot!("chat_json_schema_loose", body);
    // Without native JSON, no response_format.
    let body = build_request(&options("", None), &settings(false, false, false), &loose);
    assert!(body.get("response_format").is_none());
}

#[test]
fn request_images_with_and_without_vision() {
    let body = build_request(
        &options("", None),
        &settings(true, false, false),
        &image_turn(),
    );
    insta::assert_json_snapshot!("chat_image_vision", body);
    let body = build_request(
        &options("", None),
        &settings(false, false, false),
        &image_turn(),
    );
    insta::assert_json_snapshot!("chat_image_no_vision", body);
}

#[test]
fn params_pass_through_and_null_removes() {
    let mut request = plain_turn();
    std::sync::Arc::make_mut(&mut request.params)
        .insert("max_completion_tokens".into(), json!(300));
    std::sync::Arc::make_mut(&mut request.params).insert("stream_options".into(), Value::Null);
    std::sync::Arc::make_mut(&mut request.params).insert("stream".into(), json!(false));
    let body = build_request(&options("", None), &settings(false, false, false), &request);
    assert_eq!(body["max_completion_tokens"], 300);
    assert!(body.get("max_tokens").is_none());
    assert!(body.get("stream_options").is_none());
    assert_eq!(body["stream"], true, "the adapter only speaks streams");
}

// ---------------------------------------------------------------------------------------------
// Through HTTP (127.0.0.1)

#[tokio::test]
async fn streams_from_a_local_server_with_key_and_headers() {
    if !fixtures_present() {
        return;
    }
    let (base, received) = serve(vec![sse_reply("openai-chat/stream-tool-call-single.sse")]);
    let model =
        OpenAiChatModel::new(options(&base, Some("sk-test")), ChatSettings::default()).unwrap();
    assert_eq!(model.provider(), "openai");
    assert_eq!(model.url(), format!("{base}/chat/completions"));
    let mut stream = model.stream(&plain_turn());
    let mut acc = ResponseAccumulator::new();
    while let Some(chunk) = stream.next().await {
        acc.push(chunk.unwrap());
    }
    let response = acc.finish().unwrap();
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    assert_eq!(response.usage.input_tokens, 76);
    let calls: Vec<_> = response.message.tool_calls().collect();
    assert_eq!(calls[0].0, "call_c91SqDXlYFuETYv8mUHzz6pp");
    assert_eq!(
        calls[0].2,
        &json!({"city": "Edinburgh", "country": "UK", "units": "c"})
    );
    let received = received.lock().unwrap().clone();
    assert_eq!(received[0].path, "/v1/chat/completions");
    assert_eq!(received[0].header("authorization"), Some("Bearer sk-test"));
    assert_eq!(received[0].header("x-team"), Some("loom"));
    assert_eq!(received[0].body["model"], "gpt-test");
    assert_eq!(received[0].body["stream"], true);
}

#[tokio::test]
async fn http_errors_are_one_classified_error() {
    if !fixtures_present() {
        return;
    }
    let (base, received) = serve(vec![
        error_reply("openai-chat/error-429-rate-limit-exceeded.json"),
        error_reply("openai-chat/error-401-invalid-api-key.json"),
        error_reply("openai-chat/error-429-insufficient-quota.json"),
    ]);
    let model = OpenAiChatModel::new(options(&base, None), ChatSettings::default()).unwrap();
    let errors = [
        ModelErrorKind::Transient,
        ModelErrorKind::Auth,
        ModelErrorKind::QuotaExhausted,
    ];
    for (i, kind) in errors.into_iter().enumerate() {
        let items: Vec<_> = model.stream(&plain_turn()).collect().await;
        assert_eq!(items.len(), 1, "{items:?}");
        let error = items[0].clone().unwrap_err();
        assert_eq!(error.kind, kind);
        match i {
            0 => {
                assert_eq!(error.http_status, Some(429));
                assert_eq!(error.retry_after.map(|d| d.as_millis()), Some(26_604));
            }
            1 => assert!(
                error.message.ends_with(
                    " — no API key was sent: model main has no api_key_env (declare for example api_key_env: \
                     OPENAI_API_KEY)"
                ),
                "{}",
                error.message
            ),
            _ => {}
        }
    }
    let received = received.lock().unwrap().clone();
    assert!(
        received.iter().all(|r| r.header("authorization").is_none()),
        "no key, no header"
    );
}

#[tokio::test]
async fn a_closed_port_is_a_transient_network_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    drop(listener);
    let model = OpenAiChatModel::new(options(&base, None), ChatSettings::default()).unwrap();
    let items: Vec<_> = model.stream(&plain_turn()).collect().await;
    assert_eq!(items.len(), 1);
    assert_eq!(
        items[0].clone().unwrap_err().kind,
        ModelErrorKind::Transient
    );
}

#[test]
fn bad_headers_are_refused_at_construction() {
    let mut o = options("", Some("sk"));
    o.headers.insert("bad header".into(), "x".into());
    assert!(OpenAiChatModel::new(o, ChatSettings::default()).is_err());
    let default = OpenAiChatModel::new(options("", None), ChatSettings::default()).unwrap();
    assert_eq!(default.url(), "https://api.openai.com/v1/chat/completions");
}

#[tokio::test]
async fn a_server_that_does_not_stream_still_answers() {
    let body = json!({
        "object": "chat.completion",
        "model": "llama3",
        "choices": [{ "index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Checking.",
            "tool_calls": [{ "id": "c1", "type": "function",
                             "function": { "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}" } }] } }],
        "usage": { "prompt_tokens": 12, "completion_tokens": 5 }
    });
    let json_type = vec![("content-type".to_owned(), "application/json".to_owned())];
    let (base, _) = serve(vec![(200, json_type, body.to_string().into_bytes())]);
    let model = OpenAiChatModel::new(options(&base, None), ChatSettings::default()).unwrap();
    let mut acc = ResponseAccumulator::new();
    for chunk in model.stream(&plain_turn()).collect::<Vec<_>>().await {
        acc.push(chunk.unwrap());
    }
    let response = acc.finish().unwrap();
    assert_eq!(response.message.text(), "Checking.");
    assert_eq!(
        response.message.tool_calls().next().unwrap().2,
        &json!({ "city": "Oslo" })
    );
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    assert_eq!(
        (response.usage.input_tokens, response.model_id.as_str()),
        (12, "llama3")
    );
}

#[tokio::test]
async fn a_captured_exchange_comes_last_with_the_key_and_images_stripped() {
    if !fixtures_present() {
        return;
    }
    let (base, _) = serve(vec![
        sse_reply("openai-chat/stream-text-usage.sse"),
        error_reply("openai-chat/error-401-invalid-api-key.json"),
    ]);
    let mut o = options(&base, Some("sk-capture-secret"));
    o.capture = Some(1 << 20);
    let settings = ChatSettings {
        vision: true,
        ..ChatSettings::default()
    };
    let model = OpenAiChatModel::new(o, settings).unwrap();
    let items: Vec<_> = model.stream(&image_turn()).collect().await;
    let Some(Ok(ModelChunk::Exchange(exchange))) = items.last() else {
        panic!("the exchange comes last: {items:?}")
    };
    assert_eq!(exchange.url, format!("{base}/chat/completions"));
    assert_eq!(exchange.status_code, Some(200));
    assert_eq!(exchange.request_headers["authorization"], "<redacted>");
    assert_eq!(exchange.request_headers["x-team"], "loom");
    assert!(exchange.request_body.contains("\"url\":\"<8 bytes>\""));
    assert!(!exchange.request_body.contains("base64"));
    assert!(exchange.response_body.contains("data: [DONE]"));
    assert_eq!(exchange.error, None);

    let items: Vec<_> = model.stream(&plain_turn()).collect().await;
    let [Ok(ModelChunk::Exchange(exchange)), Err(error)] = items.as_slice() else {
        panic!("exchange then error: {items:?}")
    };
    assert_eq!(error.kind, ModelErrorKind::Auth);
    assert_eq!(exchange.status_code, Some(401));
    assert!(exchange.response_headers.contains_key("content-type"));
    assert!(!format!("{exchange:?}").contains("sk-capture-secret"));
}

// ---------------------------------------------------------------------------------------------
// A model that does not stream (`capabilities: {streaming: false}`)

/// A whole `chat.completion`, as the API answers a request without `stream`.
const COMPLETION: &str = r#"{
  "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
  "object": "chat.completion",
  "created": 1741570283,
  "model": "gpt-4o-2024-08-06",
  "choices": [{
    "index": 0,
    "message": {
      "role": "assistant",
      "content": "Let me look.",
      "tool_calls": [{
        "id": "call_abc123",
        "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"location\":\"Paris\"}"}
      }],
      "refusal": null,
      "annotations": []
    },
    "logprobs": null,
    "finish_reason": "tool_calls"
  }],
  "usage": {
    "prompt_tokens": 82,
    "completion_tokens": 17,
    "total_tokens": 99,
    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0}
  },
  "system_fingerprint": "fp_fc9f1d7035"
}"#;

fn not_streaming() -> ChatSettings {
    ChatSettings {
        streaming: false,
        ..ChatSettings::default()
    }
}

#[test]
fn a_model_that_does_not_stream_is_asked_without_stream() {
    let mut request = plain_turn();
    std::sync::Arc::make_mut(&mut request.params).insert("stream".into(), json!(true));
    std::sync::Arc::make_mut(&mut request.params)
        .insert("stream_options".into(), json!({"include_usage": true}));
    let body = build_request(&options("", None), &not_streaming(), &request);
    assert!(body.get("stream").is_none(), "{body}");
    assert!(body.get("stream_options").is_none(), "{body}");
    // Everything else is the streamed request's.
    let mut streamed = build_request(&options("", None), &ChatSettings::default(), &plain_turn());
    let object = streamed.as_object_mut().unwrap();
    object.remove("stream");
    object.remove("stream_options");
    assert_eq!(body, streamed);
}

#[tokio::test]
async fn a_non_streamed_answer_is_read_whole_into_the_same_chunks() {
    // No content type at all (some local servers): the model does not stream, so the body is
    // the whole answer.
    let (base, received) = serve(vec![(200, Vec::new(), COMPLETION.as_bytes().to_vec())]);
    let model = OpenAiChatModel::new(options(&base, None), not_streaming()).unwrap();
    let mut acc = ResponseAccumulator::new();
    for chunk in model.stream(&plain_turn()).collect::<Vec<_>>().await {
        acc.push(chunk.unwrap());
    }
    let response = acc.finish().unwrap();
    assert_eq!(response.message.text(), "Let me look.");
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    let calls: Vec<_> = response.message.tool_calls().collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, "call_abc123");
    assert_eq!(calls[0].1, "get_weather");
    assert_eq!(calls[0].2, &json!({"location": "Paris"}));
    assert_eq!(response.usage.input_tokens, 82);
    assert_eq!(response.usage.output_tokens, 17);
    assert_eq!(response.model_id, "gpt-4o-2024-08-06");
    let received = received.lock().unwrap().clone();
    assert!(received[0].body.get("stream").is_none());

    // A body that is not JSON is a transient error; an HTTP error is classified as ever.
    let (base, _) = serve(vec![
        (200, Vec::new(), b"<html>proxy</html>".to_vec()),
        (503, Vec::new(), b"{}".to_vec()),
    ]);
    let model = OpenAiChatModel::new(options(&base, None), not_streaming()).unwrap();
    for kind in [ModelErrorKind::Transient, ModelErrorKind::Overloaded] {
        let items: Vec<_> = model.stream(&plain_turn()).collect().await;
        assert_eq!(items.last().unwrap().clone().unwrap_err().kind, kind);
    }
}
