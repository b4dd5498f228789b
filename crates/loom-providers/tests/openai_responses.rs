//! OpenAI Responses adapter: every transcript of `../shared/fixtures/providers/openai-responses/`
//! decodes to its `EXPECTED.md` result (bytes whole, one at a time, split inside multi-byte
//! characters, CRLF), every error body classifies as expected, request bodies are snapshotted,
//! reasoning items survive a round trip, and the client talks to a local server (no network
//! beyond 127.0.0.1).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "openai_support.rs"]
mod support;

use std::sync::Arc;

use futures_util::StreamExt;
use loom_core::{
    Message, Role,
    content::BlockKind,
    model::{ModelChunk, ModelClient, ModelErrorKind, ResponseAccumulator, StopReason},
};
use loom_providers::{
    ProviderError,
    openai_responses::{
        OpenAiResponsesModel, ResponsesDecoder, ResponsesSettings, build_request, classify,
        decode_stream, retry_after,
    },
};
use serde_json::json;
use support::*;

/// Decodes `pieces` twice: by hand (SSE events into the decoder, for the raw stop reason) and
/// through the public byte pipeline; both must agree.
async fn decode(pieces: Vec<Vec<u8>>) -> (Vec<Result<ModelChunk, ProviderError>>, Option<String>) {
    let mut decoder = ResponsesDecoder::new("gpt-test");
    let mut chunks = Vec::new();
    for (event, data) in sse_events(pieces.clone()).await {
        if decoder.is_done() {
            break;
        }
        chunks.extend(decoder.feed(event.as_deref(), &data));
    }
    let raw = decoder.provider_stop_reason().map(str::to_owned);
    chunks.extend(decoder.finish());
    let piped = collect(decode_stream(body(pieces), "gpt-test")).await;
    assert_eq!(piped, chunks, "the byte pipeline and the decoder agree");
    (chunks, raw)
}

async fn decode_fixture(path: &str) -> Vec<Result<ModelChunk, ProviderError>> {
    decode(vec![std::fs::read(fixtures().join(path)).unwrap()])
        .await
        .0
}

#[tokio::test]
async fn every_stream_fixture_decodes_to_its_expected_result() {
    if !fixtures_present() {
        return;
    }
    let files = fixture_files("openai-responses", ".sse");
    assert_eq!(files.len(), 12, "{files:?}");
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
    assert_eq!(runs, 12 * 3 + 6);
}

#[test]
fn every_error_body_classifies_as_expected() {
    if !fixtures_present() {
        return;
    }
    let files = fixture_files("openai-responses", ".json");
    assert_eq!(files.len(), 2, "{files:?}");
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

#[tokio::test]
async fn encrypted_reasoning_is_kept_for_replay() {
    if !fixtures_present() {
        return;
    }
    let chunks = decode_fixture("openai-responses/stream-reasoning-function-call.sse").await;
    let mut acc = ResponseAccumulator::new();
    for chunk in chunks {
        acc.push(chunk.unwrap());
    }
    let response = acc.finish().unwrap();
    let reasoning = &response.message.blocks[0];
    let BlockKind::Reasoning { text, .. } = &reasoning.kind else {
        panic!("{reasoning:?}")
    };
    assert_eq!(text, "");
    let meta = &reasoning.provider_meta["openai"];
    assert!(meta["item_id"].as_str().unwrap().starts_with("rs_"));
    // The content of `output_item.done` (the final one), not that of `output_item.added`.
    let encrypted = meta["encrypted_content"].as_str().unwrap();
    assert!(encrypted.starts_with("gAAAAA"));

    // Sent back on the next call, without the item id (store: false keeps nothing).
    let mut request = plain_turn();
    request.messages.push(Arc::new(response.message.clone()));
    let body = build_request(&options("", None), &ResponsesSettings::default(), &request);
    let items = body["input"].as_array().unwrap();
    assert_eq!(
        items[1],
        json!({ "type": "reasoning", "summary": [], "encrypted_content": encrypted })
    );
    assert_eq!(items[2]["type"], "function_call");
    assert_eq!(items[2]["call_id"], "call_CWXgs68YprAjp6t0371hiPOI");
    assert!(items[2].get("id").is_none());
}

#[tokio::test]
async fn summarized_reasoning_keeps_text_and_encrypted_content_in_one_block() {
    if !fixtures_present() {
        return;
    }
    let chunks =
        decode_fixture("openai-responses/stream-reasoning-summary-function-call.sse").await;
    let mut acc = ResponseAccumulator::new();
    for chunk in chunks {
        acc.push(chunk.unwrap());
    }
    let response = acc.finish().unwrap();
    let reasoning: Vec<_> = response
        .message
        .blocks
        .iter()
        .filter(|b| matches!(b.kind, BlockKind::Reasoning { .. }))
        .collect();
    assert_eq!(reasoning.len(), 1);
    let BlockKind::Reasoning { text, .. } = &reasoning[0].kind else {
        unreachable!()
    };
    assert!(text.starts_with("**Calculating step-by-step"));
    assert!(reasoning[0].provider_meta["openai"]["encrypted_content"].is_string());
}

#[test]
fn decoder_edge_cases() {
    // An `error` event alone, then the end of the body: that error, once.
    let mut d = ResponsesDecoder::new("m");
    assert!(
        d.feed(
            None,
            r#"{"type":"error","code":"server_error","message":"boom"}"#
        )
        .is_empty()
    );
    let end = d.finish();
    assert_eq!(end.len(), 1);
    let Err(e) = &end[0] else { panic!() };
    assert_eq!(class_name(e.class), "transient");
    assert_eq!(e.message, "boom");

    // No event at all: truncated.
    let d = ResponsesDecoder::new("m");
    let Err(e) = &d.finish()[0] else { panic!() };
    assert!(e.class.retryable());

    // A server that streams nothing item by item: the final output is replayed.
    let mut d = ResponsesDecoder::new("m");
    let chunks = d.feed(
        Some("response.completed"),
        r#"{"type":"response.completed","response":{"status":"completed","model":"x","output":[
            {"type":"message","content":[{"type":"output_text","text":"Hi"}]},
            {"type":"function_call","id":"fc_1","call_id":"call_1","name":"f","arguments":"{\"a\":1}"}],
            "usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":4},"output_tokens":3}}}"#,
    );
    let mut acc = ResponseAccumulator::new();
    for c in chunks {
        acc.push(c.unwrap());
    }
    let r = acc.finish().unwrap();
    assert_eq!(r.message.text(), "Hi");
    assert_eq!(r.message.tool_calls().next().unwrap().0, "call_1");
    assert_eq!(r.stop_reason, StopReason::ToolUse);
    assert_eq!((r.usage.input_tokens, r.usage.cache_read_tokens), (6, 4));
    assert_eq!(r.model_id, "x");

    // Incomplete because of the content filter: a refusal.
    let mut d = ResponsesDecoder::new("m");
    let chunks = d.feed(
        None,
        r#"{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"content_filter"}}}"#,
    );
    assert!(matches!(
        chunks.last(),
        Some(Ok(ModelChunk::Stopped {
            reason: StopReason::Refusal,
            ..
        }))
    ));
    assert_eq!(d.provider_stop_reason(), Some("incomplete/content_filter"));
}

// ---------------------------------------------------------------------------------------------
// Request bodies

fn settings(vision: bool, native_json: bool, reasoning: bool) -> ResponsesSettings {
    ResponsesSettings {
        vision,
        native_json,
        reasoning,
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
    insta::assert_json_snapshot!("responses_plain_turn", body);
}

#[test]
fn request_tool_loop_with_results_and_echoed_reasoning() {
    let request = tool_loop(
        json!({ "item_id": "rs_old", "encrypted_content": "gAAAA-old" }),
        json!({ "item_id": "rs_new", "encrypted_content": "gAAAA-new" }),
    );
    let body = build_request(&options("", None), &settings(false, false, true), &request);
    insta::assert_json_snapshot!("responses_tool_loop_reasoning", body);
}

#[test]
fn request_never_carries_the_full_view_of_a_result() {
    let request = tool_loop(
        json!({ "item_id": "rs_old", "encrypted_content": "gAAAA-old" }),
        json!({ "item_id": "rs_new", "encrypted_content": "gAAAA-new" }),
    );
    let settings = settings(false, false, true);
    let plain = build_request(&options("", None), &settings, &request);
    let with_full = build_request(&options("", None), &settings, &with_full_views(request));
    assert!(!with_full.to_string().contains("FULL-VIEW-ONLY"));
    assert_eq!(with_full, plain);
}

#[test]
fn request_native_json_schema() {
    let body = build_request(
        &options("", None),
        &settings(false, true, false),
        &json_schema(true),
    );
    insta::assert_json_snapshot!("responses_json_schema_strict", body);
    let body = build_request(
        &options("", None),
        &settings(false, true, false),
        &json_schema(false),
    );
    assert_eq!(body["text"]["format"]["strict"], false);
    let body = build_request(
        &options("", None),
        &settings(false, false, false),
        &json_schema(true),
    );
    assert!(body.get("text").is_none());
}

#[test]
fn request_images_with_and_without_vision() {
    let body = build_request(
        &options("", None),
        &settings(true, false, false),
        &image_turn(),
    );
    insta::assert_json_snapshot!("responses_image_vision", body);
    let body = build_request(
        &options("", None),
        &settings(false, false, false),
        &image_turn(),
    );
    insta::assert_json_snapshot!("responses_image_no_vision", body);
}

#[test]
fn reasoning_of_other_providers_is_not_echoed() {
    let mut request = plain_turn();
    request.messages.push(Arc::new(Message {
        role: Role::Assistant,
        blocks: vec![
            reasoning_block("thought", json!({ "reasoning_field": "reasoning_content" })),
            { loom_core::Block::text("Answer") },
        ],
    }));
    let body = build_request(&options("", None), &settings(false, false, true), &request);
    let items = body["input"].as_array().unwrap();
    assert!(items.iter().all(|i| i["type"] != "reasoning"), "{items:?}");
}

// ---------------------------------------------------------------------------------------------
// Through HTTP (127.0.0.1)

#[tokio::test]
async fn streams_from_a_local_server() {
    if !fixtures_present() {
        return;
    }
    let (base, received) = serve(vec![sse_reply(
        "openai-responses/stream-web-search-cached-tokens.sse",
    )]);
    let model = OpenAiResponsesModel::new(
        options(&base, Some("sk-test")),
        ResponsesSettings::default(),
    )
    .unwrap();
    assert_eq!(model.provider(), "openai");
    let mut stream = model.stream(&plain_turn());
    let mut acc = ResponseAccumulator::new();
    while let Some(chunk) = stream.next().await {
        acc.push(chunk.unwrap());
    }
    let response = acc.finish().unwrap();
    assert_eq!(response.stop_reason, StopReason::End);
    assert!(
        response
            .message
            .text()
            .starts_with("San Francisco weather today")
    );
    assert_eq!(response.usage.input_tokens, 9463 - 8320);
    assert_eq!(response.usage.cache_read_tokens, 8320);
    assert_eq!(response.usage.reasoning_tokens, 512);
    let received = received.lock().unwrap().clone();
    assert_eq!(received[0].path, "/v1/responses");
    assert_eq!(received[0].header("authorization"), Some("Bearer sk-test"));
    assert_eq!(received[0].body["store"], false);
}

#[tokio::test]
async fn in_stream_and_http_errors() {
    if !fixtures_present() {
        return;
    }
    let (base, _) = serve(vec![
        sse_reply("openai-responses/stream-error-insufficient-quota.sse"),
        sse_reply("openai-responses/stream-failed-server-error.sse"),
        error_reply("openai-responses/error-404-model-not-found.json"),
    ]);
    let model =
        OpenAiResponsesModel::new(options(&base, None), ResponsesSettings::default()).unwrap();
    let items: Vec<_> = model.stream(&plain_turn()).collect().await;
    assert_eq!(items.len(), 1, "one error, not two: {items:?}");
    assert_eq!(
        items[0].clone().unwrap_err().kind,
        ModelErrorKind::QuotaExhausted
    );

    let items: Vec<_> = model.stream(&plain_turn()).collect().await;
    assert_eq!(
        items[0],
        Ok(ModelChunk::TextDelta("Sure".into())),
        "partial output, then the error"
    );
    let error = items.last().unwrap().clone().unwrap_err();
    assert_eq!(error.kind, ModelErrorKind::Transient);
    assert_eq!(error.http_status, Some(200));

    let items: Vec<_> = model.stream(&plain_turn()).collect().await;
    let error = items[0].clone().unwrap_err();
    assert_eq!(error.kind, ModelErrorKind::InvalidRequest);
    assert!(
        !error.message.contains("no API key"),
        "the hint is for auth errors only"
    );
}

#[tokio::test]
async fn a_server_that_does_not_stream_still_answers() {
    let body = json!({
        "object": "response", "status": "incomplete", "model": "gpt-x",
        "incomplete_details": { "reason": "max_output_tokens" },
        "output": [{ "type": "message", "role": "assistant",
                     "content": [{ "type": "output_text", "text": "Rivers are" }] }],
        "usage": { "input_tokens": 9, "output_tokens": 2 }
    });
    let json_type = vec![("content-type".to_owned(), "application/json".to_owned())];
    let (base, _) = serve(vec![(200, json_type, body.to_string().into_bytes())]);
    let model =
        OpenAiResponsesModel::new(options(&base, None), ResponsesSettings::default()).unwrap();
    let mut acc = ResponseAccumulator::new();
    for chunk in model.stream(&plain_turn()).collect::<Vec<_>>().await {
        acc.push(chunk.unwrap());
    }
    let response = acc.finish().unwrap();
    assert_eq!(response.message.text(), "Rivers are");
    assert_eq!(response.stop_reason, StopReason::MaxTokens);
    assert_eq!(response.usage.input_tokens, 9);
}

// ---------------------------------------------------------------------------------------------
// A model that does not stream (`capabilities: {streaming: false}`)

/// A whole `response` object, as the API answers a request without `stream`.
const RESPONSE: &str = r#"{
  "id": "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b",
  "object": "response",
  "created_at": 1741476542,
  "status": "completed",
  "error": null,
  "incomplete_details": null,
  "model": "gpt-4.1-2025-04-14",
  "output": [
    {
      "type": "message",
      "id": "msg_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b",
      "status": "completed",
      "role": "assistant",
      "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]
    },
    {
      "type": "function_call",
      "id": "fc_12345xyz",
      "call_id": "call_12345xyz",
      "name": "get_weather",
      "arguments": "{\"location\":\"Paris, France\"}",
      "status": "completed"
    }
  ],
  "usage": {
    "input_tokens": 36,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 87,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 123
  }
}"#;

#[tokio::test]
async fn a_model_that_does_not_stream_is_asked_without_stream_and_read_whole() {
    let settings = ResponsesSettings {
        streaming: false,
        ..ResponsesSettings::default()
    };
    let mut request = plain_turn();
    std::sync::Arc::make_mut(&mut request.params).insert("stream".into(), json!(true));
    let body = build_request(&options("", None), &settings, &request);
    assert!(body.get("stream").is_none(), "{body}");
    let mut streamed = build_request(
        &options("", None),
        &ResponsesSettings::default(),
        &plain_turn(),
    );
    streamed.as_object_mut().unwrap().remove("stream");
    assert_eq!(body, streamed);

    let (base, received) = serve(vec![(200, Vec::new(), RESPONSE.as_bytes().to_vec())]);
    let model = OpenAiResponsesModel::new(options(&base, None), settings).unwrap();
    let mut acc = ResponseAccumulator::new();
    for chunk in model.stream(&plain_turn()).collect::<Vec<_>>().await {
        acc.push(chunk.unwrap());
    }
    let response = acc.finish().unwrap();
    assert_eq!(response.message.text(), "Let me look.");
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    let calls: Vec<_> = response.message.tool_calls().collect();
    assert_eq!(calls[0].0, "call_12345xyz");
    assert_eq!(calls[0].2, &json!({"location": "Paris, France"}));
    assert_eq!(response.usage.input_tokens, 36);
    assert_eq!(response.usage.output_tokens, 87);
    let received = received.lock().unwrap().clone();
    assert!(received[0].body.get("stream").is_none());
}
