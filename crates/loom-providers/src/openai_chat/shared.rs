//! What the Chat Completions and Responses adapters share: error classification, Retry-After,
//! request headers, content mentions, strict-schema detection and the SSE driver.

use std::{collections::VecDeque, time::Duration};

use bytes::Bytes;
use futures_util::{Stream, StreamExt, stream};
use loom_core::{
    BoxStream,
    content::{Block, BlockKind},
    model::{ModelChunk, ModelError},
    tool::ToolOutput,
};
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value};

use crate::{
    capture::{self, Recorder, tee},
    error::{ErrorClass, ProviderError, class_of, truncated},
    http::{ProviderOptions, network},
};

/// The official base URL, used when the configuration gives none.
pub(crate) const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// Provider name in error messages.
pub(crate) const PROVIDER: &str = "openai";

/// `{base}/{path}`, with the official base when `base` is empty.
pub(crate) fn endpoint(base: &str, path: &str) -> String {
    let base = base.trim();
    let base = if base.is_empty() {
        DEFAULT_BASE_URL
    } else {
        base
    };
    format!("{}/{path}", base.trim_end_matches('/'))
}

/// `Authorization: Bearer <key>` when a key is set, then the configured headers (which may
/// override it, e.g. `api-key` gateways).
pub(crate) fn headers(options: &ProviderOptions) -> Result<HeaderMap, ProviderError> {
    let invalid = |message: String| ProviderError {
        class: ErrorClass::Invalid,
        status: None,
        provider_code: None,
        message,
        retry_after: None,
    };
    let mut map = HeaderMap::new();
    if let Some(key) = options.api_key.as_deref().filter(|k| !k.is_empty()) {
        let mut value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
            invalid("the API key contains characters not allowed in a header".into())
        })?;
        value.set_sensitive(true);
        map.insert(AUTHORIZATION, value);
    }
    for (name, value) in &options.headers {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid(format!("invalid header name '{name}'")))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| invalid(format!("invalid value for header '{name}'")))?;
        map.insert(header, value);
    }
    Ok(map)
}

/// Classifies an HTTP error body (`{"error": {message, type, param, code}}`, `code` a string
/// or a number) by the reference's rules ([`crate::error::class_of`]): status, then
/// `error.code` / `error.type` as hints; the message is read only for a context overflow
/// reported without its code.
pub fn classify(status: Option<u16>, body: &str, retry_after: Option<Duration>) -> ProviderError {
    let parsed: Option<Value> = serde_json::from_str(body.trim()).ok();
    let object = match &parsed {
        Some(Value::Object(map)) => match map.get("error") {
            Some(error @ Value::Object(_)) => Some(error.clone()),
            Some(Value::String(message)) => Some(serde_json::json!({ "message": message })),
            _ if map.contains_key("code") || map.contains_key("message") => parsed.clone(),
            _ => None,
        },
        _ => None,
    };
    match object {
        Some(error) => classify_error(status, &error, retry_after),
        None => {
            let snippet: String = body.trim().chars().take(500).collect();
            let class = class_of(status, &[], &snippet);
            let message = match (status, snippet.is_empty()) {
                (Some(s), true) => format!("HTTP {s}"),
                (Some(s), false) => format!("HTTP {s}: {snippet}"),
                (None, _) => snippet,
            };

            ProviderError {
                class,
                status,
                provider_code: None,
                message,
                retry_after,
            }
        }
    }
}

/// Classifies one error object (`{code, type, message, param}`), from an HTTP body or from the
/// stream (`http_status` 200: the code, when it is a number, stands for the status).
pub(crate) fn classify_error(
    http_status: Option<u16>,
    error: &Value,
    retry_after: Option<Duration>,
) -> ProviderError {
    let code = match error.get("code") {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let numeric = error
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| (100..600).contains(c));
    let kind = error
        .get("type")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty());
    let effective = numeric.or(http_status.filter(|s| !(200..300).contains(s)));
    let hints: Vec<&str> = code.as_deref().into_iter().chain(kind).collect();
    let text = error.get("message").and_then(Value::as_str).unwrap_or("");
    let class = class_of(effective, &hints, text);
    let mut message = error
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| match http_status {
            Some(s) => format!("HTTP {s}: the provider gave no message"),
            None => "the provider reported an error without a message".into(),
        });
    if let Some(param) = error
        .get("param")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
        && !message.contains(param)
    {
        message.push_str(&format!(" (param: {param})"));
    }
    ProviderError {
        class,
        status: http_status,
        provider_code: code.or_else(|| kind.map(str::to_owned)),
        message,
        retry_after,
    }
}

/// The delay an OpenAI error response asks for: `retry-after-ms` / `retry-after`, else, on a
/// 429, the `x-ratelimit-reset-requests|tokens` duration (`"26.604s"`, `"6m0s"`) of the limit
/// closest to exhaustion.
pub fn retry_after(status: u16, headers: &HeaderMap) -> Option<Duration> {
    if let Some(delay) = crate::error::retry_after(headers) {
        return Some(delay);
    }
    if status != 429 {
        return None;
    }
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let number = |name: &str| text(name).and_then(|v| v.parse::<f64>().ok());
    let mut best: Option<(f64, Duration)> = None;
    for limit in ["requests", "tokens"] {
        let Some(reset) = text(&format!("x-ratelimit-reset-{limit}")).and_then(go_duration) else {
            continue;
        };
        let remaining = number(&format!("x-ratelimit-remaining-{limit}"));
        let cap = number(&format!("x-ratelimit-limit-{limit}"));
        let fraction = match (remaining, cap) {
            (Some(r), Some(c)) if c > 0.0 => r / c,
            (Some(r), _) if r <= 0.0 => 0.0,
            _ => 1.0,
        };
        let better = match best {
            None => true,
            Some((f, d)) => fraction < f || (fraction == f && reset > d),
        };
        if better {
            best = Some((fraction, reset));
        }
    }
    best.map(|(_, d)| d)
}

/// Parses a Go duration (`"1h2m3.5s"`, `"6m0s"`, `"26.604s"`, `"6ms"`, `"250us"`).
pub(crate) fn go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0f64;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += value * scale;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// Appends the "no key was sent" hint to an auth error when the model has no key.
pub(crate) fn no_key_hint(
    mut error: ProviderError,
    options: &ProviderOptions,
    model: &str,
) -> ProviderError {
    let no_key = options.api_key.as_deref().is_none_or(str::is_empty);
    if error.class == ErrorClass::Auth && no_key {
        error.message.push_str(&format!(
            " — no API key was sent: model {model} has no api_key_env (declare for example \
             api_key_env: OPENAI_API_KEY)"
        ));
    }
    error
}

/// Whether `schema` can be enforced strictly: every object schema closes its properties
/// (`additionalProperties: false`) and requires all of them.
pub(crate) fn strict_schema(schema: &Value) -> bool {
    let Value::Object(map) = schema else {
        return schema.is_boolean();
    };
    let is_object = map.get("type").is_some_and(|t| {
        t == "object"
            || t.as_array()
                .is_some_and(|a| a.iter().any(|x| x == "object"))
    }) || map.contains_key("properties");
    if is_object {
        if map.get("additionalProperties") != Some(&Value::Bool(false)) {
            return false;
        }
        let properties = map.get("properties").and_then(Value::as_object);
        let required: Vec<&str> = map
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(properties) = properties {
            if properties.keys().any(|k| !required.contains(&k.as_str())) {
                return false;
            }
            if !properties.values().all(strict_schema) {
                return false;
            }
        }
    }
    let nested_one = ["items", "not", "if", "then", "else"];
    if nested_one
        .iter()
        .filter_map(|k| map.get(*k))
        .any(|s| s.is_object() && !strict_schema(s))
    {
        return false;
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(list) = map.get(key).and_then(Value::as_array)
            && !list.iter().all(strict_schema)
        {
            return false;
        }
    }
    for key in ["$defs", "definitions"] {
        if let Some(defs) = map.get(key).and_then(Value::as_object)
            && !defs.values().all(strict_schema)
        {
            return false;
        }
    }
    true
}

/// A tool's parameters: an object schema (`{}` or null becomes an empty object schema).
pub(crate) fn parameters(schema: &Value) -> Value {
    match schema {
        Value::Object(map) if !map.is_empty() => schema.clone(),
        _ => serde_json::json!({ "type": "object", "properties": {} }),
    }
}

/// The text that stands for a block the model cannot see (a file without vision, an artifact).
pub(crate) fn mention(block: &Block) -> Option<String> {
    match &block.kind {
        BlockKind::InlineData {
            media_type, name, ..
        } => Some(format!(
            "[file {}: {media_type}, not shown to this model]",
            name.as_deref().unwrap_or("(unnamed)")
        )),
        BlockKind::Artifact {
            uri,
            media_type,
            size,
            name,
        } => Some(format!(
            "[file {}: {media_type}, {size} bytes, {uri}]",
            name.as_deref().unwrap_or(uri)
        )),
        _ => None,
    }
}

/// The text of a tool result: its visible text, files mentioned, `"[error] "` first on errors.
pub(crate) fn tool_result_text(output: &ToolOutput) -> String {
    let mut text = output.visible_text();
    for block in &output.blocks {
        if let BlockKind::InlineData { .. } = block.kind
            && let Some(m) = mention(block)
        {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&m);
        }
    }
    if output.is_error {
        format!("[error] {text}")
    } else {
        text
    }
}

/// A `data:` URL for inline bytes.
pub(crate) fn data_url(media_type: &str, data: &str) -> String {
    format!("data:{media_type};base64,{data}")
}

/// `{"openai": {...}}` provider metadata.
pub(crate) fn openai_meta(fields: Map<String, Value>) -> Map<String, Value> {
    let mut meta = Map::new();
    meta.insert("openai".into(), Value::Object(fields));
    meta
}

/// Merges `params` at the top level of `body` (a null value removes the key), then forces
/// `stream: true` when the model streams, or removes `stream` and `stream_options` when it
/// does not (`capabilities.streaming: false`).
pub(crate) fn merge_params(
    body: &mut Map<String, Value>,
    params: &Map<String, Value>,
    streaming: bool,
) {
    for (key, value) in params {
        if value.is_null() {
            body.remove(key);
        } else {
            body.insert(key.clone(), value.clone());
        }
    }
    if streaming {
        body.insert("stream".into(), Value::Bool(true));
    } else {
        body.remove("stream");
        body.remove("stream_options");
    }
}

/// Usage numbers from a JSON path.
pub(crate) fn count(value: &Value, path: &[&str]) -> Option<u64> {
    let mut at = value;
    for key in path {
        at = at.get(*key)?;
    }
    at.as_u64()
}

/// A decoder of one provider's SSE events.
pub(crate) trait SseDecoder: Send + 'static {
    /// One event.
    fn on_event(
        &mut self,
        event: Option<&str>,
        data: &str,
    ) -> Vec<Result<ModelChunk, ProviderError>>;
    /// The end of the body.
    fn on_end(self) -> Vec<Result<ModelChunk, ProviderError>>;
    /// Whether a terminal chunk (stop or error) went out.
    fn is_done(&self) -> bool;
    /// A whole JSON answer (a server that does not stream).
    fn on_json(&mut self, body: &str) -> Vec<Result<ModelChunk, ProviderError>>;
}

/// Turns a body into chunks: SSE parsing, then `decoder`, until its terminal chunk.
pub(crate) fn drive<S, E, D>(
    bytes: S,
    decoder: D,
) -> BoxStream<'static, Result<ModelChunk, ProviderError>>
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
    D: SseDecoder,
{
    // A body that ends without a blank line still dispatches its last event.
    let bytes = bytes.chain(stream::once(async { Ok(Bytes::from_static(b"\n\n")) }));
    let events = Box::pin(sse_stream::SseStream::from_bytes_stream(bytes));
    let state = (events, Some(decoder), VecDeque::new());
    Box::pin(stream::unfold(
        state,
        |(mut events, mut decoder, mut queue)| async move {
            loop {
                if let Some(item) = queue.pop_front() {
                    return Some((item, (events, decoder, queue)));
                }
                let current = decoder.as_mut()?;
                if current.is_done() {
                    return None;
                }
                match events.next().await {
                    Some(Ok(sse)) => {
                        if let Some(data) = sse.data.as_deref() {
                            queue.extend(current.on_event(sse.event.as_deref(), data));
                        }
                    }
                    Some(Err(error)) => {
                        decoder = None;
                        let message = match &error {
                            sse_stream::Error::Body(e) => format!("stream interrupted: {e}"),
                            other => format!("invalid event stream from {PROVIDER}: {other}"),
                        };
                        queue.push_back(Err(ProviderError {
                            class: ErrorClass::Transient,
                            status: Some(200),
                            provider_code: None,
                            message,
                            retry_after: None,
                        }));
                    }
                    None => {
                        if let Some(d) = decoder.take() {
                            queue.extend(d.on_end());
                        }
                    }
                }
            }
        },
    ))
}

/// A stream of one error.
pub(crate) fn failed(error: ProviderError) -> BoxStream<'static, Result<ModelChunk, ModelError>> {
    Box::pin(stream::once(async move { Err(error.into()) }))
}

/// One POST: a single error for a failed request, else the decoded answer (the event stream;
/// or, when `streaming` is off or the server answered JSON anyway, the whole JSON answer read
/// as the same chunks); with `options.capture`, the exchange is added as the last chunk (or
/// just before the error).
pub(crate) fn post_stream<D: SseDecoder>(
    request: reqwest::RequestBuilder,
    options: ProviderOptions,
    model_label: String,
    decoder: D,
    streaming: bool,
) -> BoxStream<'static, Result<ModelChunk, ModelError>> {
    let recorder = Recorder::for_options(&options);
    let recording = recorder.clone();
    let opened = async move {
        let response = match crate::http::send(request, recording.as_ref()).await {
            Ok(response) => response,
            Err(error) => return failed(error),
        };
        let status = response.status().as_u16();
        if !response.status().is_success() {
            let delay = retry_after(status, response.headers());
            let body = crate::http::text(response, recording.as_ref()).await;
            return failed(no_key_hint(
                classify(Some(status), &body, delay),
                &options,
                &model_label,
            ));
        }
        let json = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if json || !streaming {
            // A non-streamed call, or a server that ignored `stream: true`: decode the whole
            // answer at once.
            let mut decoder = decoder;
            let items = match response.bytes().await {
                Ok(body) => {
                    if let Some(recorder) = &recording {
                        recorder.body(&body);
                    }
                    let mut items = decoder.on_json(&String::from_utf8_lossy(&body));
                    items.extend(decoder.on_end());
                    items
                }
                Err(error) => vec![Err(network(error))],
            };
            let items = items.into_iter().map(|item| item.map_err(ModelError::from));
            return Box::pin(stream::iter(items))
                as BoxStream<'static, Result<ModelChunk, ModelError>>;
        }
        let chunks = drive(tee(response.bytes_stream(), recording), decoder);
        Box::pin(chunks.map(|item| item.map_err(ModelError::from)))
            as BoxStream<'static, Result<ModelChunk, ModelError>>
    };
    capture::finish(Box::pin(stream::once(opened).flatten()), recorder)
}

/// The "stream interrupted" error of this provider.
pub(crate) fn interrupted() -> ProviderError {
    let mut error = truncated(PROVIDER);
    error.status = Some(200);
    error
}

/// An event whose data is not JSON: transient.
pub(crate) fn invalid_json(error: &serde_json::Error) -> ProviderError {
    ProviderError {
        class: ErrorClass::Transient,
        status: Some(200),
        provider_code: None,
        message: format!("invalid JSON in the {PROVIDER} event stream: {error}"),
        retry_after: None,
    }
}
