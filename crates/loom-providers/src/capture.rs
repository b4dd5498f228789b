//! Capture of raw HTTP exchanges (`telemetry.capture.raw_exchanges`).
//!
//! When [`crate::ProviderOptions::capture`] is set, an adapter records its one HTTP exchange
//! per call in a [`Recorder`]: the request as sent (credentials redacted, base64 file data
//! replaced by `"<N bytes>"`), the response status and headers, and the body bytes as they are
//! read (the SSE text of a stream). Bodies are kept up to the capture limit; their size and
//! SHA-256 are those of the full bodies. [`finish`] then adds the exchange to the chunk stream
//! as a [`ModelChunk::Exchange`]: the last chunk, or the one just before the error that ends
//! the stream.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Instant,
};

use bytes::Bytes;
use futures_util::{Stream, StreamExt, stream};
use loom_core::{
    BoxStream,
    model::{HttpExchange, ModelChunk, ModelError},
};
use reqwest::header::HeaderMap;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// What replaces a credential.
pub const REDACTED: &str = "<redacted>";

/// Headers whose value is a credential, always redacted (lower case).
const SECRET_HEADERS: [&str; 9] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "cookie",
    "set-cookie",
    "openai-organization",
    "openai-project",
];

/// The recording of one exchange, shared by the request side and the stream side.
#[derive(Debug, Clone)]
pub struct Recorder {
    inner: Arc<Mutex<Recording>>,
}

#[derive(Debug)]
struct Recording {
    max: usize,
    secrets: Vec<String>,
    started: Instant,
    exchange: HttpExchange,
    body: Vec<u8>,
    hasher: Sha256,
    done: bool,
}

impl Recorder {
    /// A recorder keeping at most `max_bytes` of each body; every occurrence of a value of
    /// `secrets` (the API key) is redacted wherever it appears.
    pub fn new(max_bytes: usize, secrets: impl IntoIterator<Item = String>) -> Recorder {
        let secrets = secrets.into_iter().filter(|s| !s.is_empty()).collect();
        Recorder {
            inner: Arc::new(Mutex::new(Recording {
                max: max_bytes,
                secrets,
                started: Instant::now(),
                exchange: HttpExchange::default(),
                body: Vec::new(),
                hasher: Sha256::new(),
                done: false,
            })),
        }
    }

    /// A recorder for a provider's options, when they ask for capture.
    pub fn for_options(options: &crate::ProviderOptions) -> Option<Recorder> {
        options
            .capture
            .map(|max| Recorder::new(max, options.api_key.clone()))
    }

    fn lock(&self) -> MutexGuard<'_, Recording> {
        // A poisoned lock only means a panic elsewhere mid-update: the recording is usable.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the request about to be sent; the exchange's clock starts here.
    pub fn request(&self, request: &reqwest::Request) {
        let mut r = self.lock();
        r.started = Instant::now();
        let url = r.scrub(request.url().as_str());
        let headers = r.headers(request.headers());
        let raw = request
            .body()
            .and_then(|b| b.as_bytes())
            .unwrap_or_default();
        let shown = match serde_json::from_slice::<Value>(raw) {
            Ok(mut value) => {
                strip_files(&mut value);
                value.to_string()
            }
            Err(_) => String::from_utf8_lossy(raw).into_owned(),
        };
        let shown = r.scrub(&shown);
        let (body, truncated) = cut(&shown, r.max);
        let e = &mut r.exchange;
        e.method = request.method().as_str().to_owned();
        e.url = url;
        e.request_headers = headers;
        e.request_body = body;
        e.request_bytes = raw.len() as u64;
        e.request_sha256 = hex::encode(Sha256::digest(raw));
        e.request_truncated = truncated;
    }

    /// Records the response status and headers.
    pub fn response(&self, status: u16, headers: &HeaderMap) {
        let mut r = self.lock();
        let headers = r.headers(headers);
        r.exchange.status_code = Some(status);
        r.exchange.response_headers = headers;
    }

    /// Records bytes of the response body, as read.
    pub fn body(&self, bytes: &[u8]) {
        let mut r = self.lock();
        r.hasher.update(bytes);
        r.exchange.response_bytes += bytes.len() as u64;
        // A few bytes beyond the limit, so that a secret cut by it is still recognized.
        let keep = r
            .max
            .saturating_add(r.secrets.iter().map(String::len).max().unwrap_or(0));
        let room = keep.saturating_sub(r.body.len());
        r.body.extend_from_slice(&bytes[..room.min(bytes.len())]);
    }

    /// The exchange, ended by `error` if any; `None` once it was already taken.
    pub fn finish(&self, error: Option<&str>) -> Option<HttpExchange> {
        let mut r = self.lock();
        if r.done {
            return None;
        }
        r.done = true;
        let text = r.scrub(&utf8(&r.body));
        let (body, cut_here) = cut(&text, r.max);
        let error = error.map(|e| r.scrub(e));
        let digest = std::mem::take(&mut r.hasher).finalize();
        let elapsed = r.started.elapsed().as_secs_f64() * 1000.0;
        let mut exchange = std::mem::take(&mut r.exchange);
        exchange.response_truncated = cut_here || exchange.response_bytes > r.max as u64;
        exchange.response_body = body;
        exchange.response_sha256 = hex::encode(digest);
        exchange.duration_ms = elapsed;
        exchange.error = error;
        Some(exchange)
    }
}

impl Recording {
    /// `text` with every secret replaced.
    fn scrub(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for secret in &self.secrets {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), REDACTED);
            }
        }
        out
    }

    /// Headers as a map, names in lower case, repeated names joined by `", "`, credentials
    /// redacted.
    fn headers(&self, headers: &HeaderMap) -> BTreeMap<String, String> {
        let mut out: BTreeMap<String, String> = BTreeMap::new();
        for (name, value) in headers {
            let name = name.as_str().to_ascii_lowercase();
            let text = String::from_utf8_lossy(value.as_bytes());
            let shown = if value.is_sensitive() || SECRET_HEADERS.contains(&name.as_str()) {
                REDACTED.to_owned()
            } else {
                self.scrub(&text)
            };
            out.entry(name)
                .and_modify(|v| {
                    v.push_str(", ");
                    v.push_str(&shown);
                })
                .or_insert(shown);
        }
        out
    }
}

/// Replaces base64 file data in a request body by `"<N bytes>"` (N: the decoded size):
/// `data:` URLs with a `;base64,` payload anywhere, and the `data` of `{"type": "base64"}`
/// sources (Anthropic images and documents).
pub fn strip_files(value: &mut Value) {
    match value {
        Value::String(text) => {
            if text.starts_with("data:")
                && let Some((_, payload)) = text.split_once(";base64,")
            {
                *text = placeholder(payload);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strip_files),
        Value::Object(map) => {
            let base64 = map.get("type").and_then(Value::as_str) == Some("base64");
            for (key, item) in map.iter_mut() {
                match item {
                    Value::String(data) if base64 && key == "data" => *data = placeholder(data),
                    _ => strip_files(item),
                }
            }
        }
        _ => {}
    }
}

/// `"<N bytes>"` for a base64 payload.
fn placeholder(base64: &str) -> String {
    let significant = base64.bytes().filter(|b| !b.is_ascii_whitespace());
    let (mut chars, mut padding) = (0usize, 0usize);
    for b in significant {
        chars += 1;
        if b == b'=' {
            padding += 1;
        }
    }
    format!("<{} bytes>", (chars * 3 / 4).saturating_sub(padding))
}

/// The body as text: invalid sequences replaced, an incomplete character at the end dropped.
fn utf8(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(e) if e.error_len().is_none() => {
            String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned()
        }
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// `text` cut to at most `max` bytes on a character boundary, and whether it was cut.
fn cut(text: &str, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text.to_owned(), false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (text[..end].to_owned(), true)
}

/// The body stream, its bytes recorded as they are read.
pub fn tee<S, E>(
    bytes: S,
    recorder: Option<Recorder>,
) -> impl Stream<Item = Result<Bytes, E>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
{
    bytes.inspect(move |item| {
        if let (Some(recorder), Ok(chunk)) = (&recorder, item) {
            recorder.body(chunk);
        }
    })
}

/// Adds the recorded exchange to `chunks`: as the last chunk, or just before the first error
/// (which ends the stream). Without a recorder, `chunks` is returned as is.
pub fn finish(
    chunks: BoxStream<'static, Result<ModelChunk, ModelError>>,
    recorder: Option<Recorder>,
) -> BoxStream<'static, Result<ModelChunk, ModelError>> {
    let Some(recorder) = recorder else {
        return chunks;
    };
    let state = (Some(chunks), recorder, None::<ModelError>);
    Box::pin(stream::unfold(
        state,
        |(mut chunks, recorder, mut pending)| async move {
            if let Some(error) = pending.take() {
                return Some((Err(error), (None, recorder, None)));
            }
            let items = chunks.as_mut()?;
            match items.next().await {
                Some(Ok(chunk)) => Some((Ok(chunk), (chunks, recorder, None))),
                Some(Err(error)) => match recorder.finish(Some(&error.message)) {
                    Some(exchange) => Some((
                        Ok(ModelChunk::Exchange(Box::new(exchange))),
                        (None, recorder, Some(error)),
                    )),
                    None => Some((Err(error), (None, recorder, None))),
                },
                None => recorder.finish(None).map(|exchange| {
                    (
                        Ok(ModelChunk::Exchange(Box::new(exchange))),
                        (None, recorder, None),
                    )
                }),
            }
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn files_are_replaced_by_their_size() {
        let mut body = json!({
            "messages": [{"content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGVsbG8="}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8h"}},
                {"type": "text", "text": "data: not a file"}
            ]}]
        });
        strip_files(&mut body);
        let content = &body["messages"][0]["content"];
        assert_eq!(content[0]["source"]["data"], "<5 bytes>");
        assert_eq!(content[0]["source"]["media_type"], "image/png");
        assert_eq!(content[1]["image_url"]["url"], "<6 bytes>");
        assert_eq!(content[2]["text"], "data: not a file");
    }

    #[test]
    fn bodies_are_cut_on_a_character_boundary_and_hashed_whole() {
        let recorder = Recorder::new(5, ["sk-secret".to_owned()]);
        recorder.body("abcé".as_bytes());
        recorder.body(b"xyz sk-secret");
        let exchange = recorder.finish(Some("bad key sk-secret")).unwrap();
        assert_eq!(exchange.response_body, "abcé");
        assert!(exchange.response_truncated);
        assert_eq!(exchange.response_bytes, 18);
        assert_eq!(
            exchange.response_sha256,
            hex::encode(Sha256::digest("abcéxyz sk-secret".as_bytes()))
        );
        assert_eq!(exchange.error.as_deref(), Some("bad key <redacted>"));
        assert!(recorder.finish(None).is_none());
    }

    #[test]
    fn credentials_are_redacted_from_headers_and_url() {
        let recorder = Recorder::new(1000, ["k3y".to_owned()]);
        loom_tls::install_crypto_provider();
        let client = reqwest::Client::new();
        let request = client
            .post("http://localhost/v1/x?key=k3y")
            .header("x-api-key", "k3y")
            .header("authorization", "Bearer other")
            .header("x-custom", "prefix-k3y")
            .header("anthropic-version", "2023-06-01")
            .body(r#"{"a":"data:image/png;base64,AAAA"}"#)
            .build()
            .unwrap();
        recorder.request(&request);
        let exchange = recorder.finish(None).unwrap();
        assert_eq!(exchange.url, "http://localhost/v1/x?key=<redacted>");
        assert_eq!(exchange.request_headers["x-api-key"], REDACTED);
        assert_eq!(exchange.request_headers["authorization"], REDACTED);
        assert_eq!(exchange.request_headers["x-custom"], "prefix-<redacted>");
        assert_eq!(exchange.request_headers["anthropic-version"], "2023-06-01");
        assert_eq!(exchange.request_body, r#"{"a":"<3 bytes>"}"#);
        assert_eq!(exchange.request_bytes, 34);
        assert_eq!(exchange.method, "POST");
        assert_eq!(exchange.status_code, None);
    }
}
