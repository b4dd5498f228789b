//! The older HTTP+SSE transport of MCP (protocol 2024-11-05, `transport: sse`), which rmcp no
//! longer ships: the client opens an SSE stream with a GET; the server's `endpoint` event names
//! the URL to POST JSON-RPC messages to; every answer and notification comes back on the stream
//! as a `message` event. The stream is parsed by `sse-stream`; [`SseTransport`] is the
//! `rmcp::transport::Transport` rmcp drives, so the protocol itself stays rmcp's.
//!
//! The message endpoint must be on the stream's origin (scheme, host and port): the configured
//! headers (tokens) go with every POST, and a server that could send them elsewhere is refused.
//! Losing the stream ends the session (the 2024-11-05 protocol has no resumption): rmcp sees
//! the transport close, and the server's reconnection logic opens a new one.

use std::{borrow::Cow, sync::Arc};

use futures_util::{StreamExt, stream::BoxStream};
use reqwest::{
    StatusCode, Url,
    header::{ACCEPT, CONTENT_TYPE, HeaderMap},
};
use rmcp::{
    RoleClient,
    model::{ClientJsonRpcMessage, ServerJsonRpcMessage},
    transport::Transport,
};
use sse_stream::{Sse, SseStream};

use crate::{error::McpError, traced};

/// Largest SSE event accepted (as rmcp bounds the events of streamable HTTP).
const MAX_EVENT_SIZE: usize = 16 * 1024 * 1024;

/// The steps of opening, reported by a connection timeout.
pub(crate) const OPENING: &str = "opening the SSE stream";
/// See [`OPENING`].
pub(crate) const WAITING_FOR_ENDPOINT: &str = "waiting for the SSE `endpoint` event";

type Events = BoxStream<'static, Result<Sse, sse_stream::Error>>;

/// Why sending a message failed (rmcp reports it as a transport error).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SseTransportError {
    /// The POST did not go through.
    #[error("posting the message failed: {}", chain(.0))]
    Post(reqwest::Error),
    /// The server answered the POST with an error status.
    #[error("the message endpoint answered HTTP {0}")]
    Status(StatusCode),
}

/// What can break the bytes of the stream.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error("{}", chain(.0))]
    Http(reqwest::Error),
    #[error("an SSE event exceeds the maximum size of {0} bytes")]
    TooLarge(usize),
}

/// An open HTTP+SSE session: the stream, and where to post.
pub(crate) struct SseTransport {
    server: String,
    client: reqwest::Client,
    post_url: Arc<Url>,
    headers: HeaderMap,
    events: Option<Events>,
}

impl SseTransport {
    /// Opens the SSE stream at `url` and waits for its `endpoint` event; `stage` names the step
    /// under way (for a connection timeout, which the caller applies).
    pub(crate) async fn open(
        server: &str,
        client: reqwest::Client,
        url: &str,
        headers: HeaderMap,
        stage: &crate::connection::Stage,
    ) -> Result<SseTransport, McpError> {
        let open_error = |message: String| McpError::SseOpen {
            server: server.to_owned(),
            url: url.to_owned(),
            message,
        };
        let stream_url = Url::parse(url).map_err(|error| open_error(error.to_string()))?;
        stage.set(OPENING);
        let response = client
            .get(stream_url.clone())
            .headers(headers.clone())
            .header(ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|error| open_error(chain(&error)))?;
        let status = response.status();
        if !status.is_success() {
            return Err(open_error(format!("HTTP {status}")));
        }
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("");
        if !is_event_stream(content_type) {
            return Err(open_error(format!(
                "the answer is not an event stream (Content-Type '{content_type}'): is this an \
                 HTTP+SSE endpoint? A streamable HTTP server takes `transport: http`"
            )));
        }
        let base = response.url().clone();
        let mut events = bounded_events(response);
        stage.set(WAITING_FOR_ENDPOINT);
        let no_endpoint = |message: String| McpError::SseNoEndpoint {
            server: server.to_owned(),
            message,
        };
        let endpoint = loop {
            match events.next().await {
                Some(Ok(event)) if event.event.as_deref() == Some("endpoint") => {
                    break event.data.unwrap_or_default();
                }
                Some(Ok(event)) => {
                    tracing::debug!(server, event = ?event.event, "SSE event before `endpoint` ignored");
                }
                Some(Err(error)) => {
                    return Err(no_endpoint(format!("the stream failed: {error}")));
                }
                None => return Err(no_endpoint("the stream ended first".to_owned())),
            }
        };
        let post_url = endpoint_url(&stream_url, &base, endpoint.trim()).map_err(|reason| {
            McpError::SseEndpointRefused {
                server: server.to_owned(),
                reason,
            }
        })?;
        tracing::debug!(server, origin = %post_url.origin().ascii_serialization(), "MCP HTTP+SSE session opened");
        Ok(SseTransport {
            server: server.to_owned(),
            client,
            post_url: Arc::new(post_url),
            headers,
            events: Some(events),
        })
    }
}

impl Transport<RoleClient> for SseTransport {
    type Error = SseTransportError;

    fn name() -> Cow<'static, str> {
        Cow::Borrowed("HTTP+SSE")
    }

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let mut request = self
            .client
            .post(self.post_url.as_str())
            .headers(self.headers.clone());
        // The call's trace context as the W3C header too, as over streamable HTTP.
        if let Some(trace) = traced::traceparent(&item) {
            request = request.header(traced::TRACEPARENT_HEADER, trace);
        }
        let request = request.json(&item);
        async move {
            let response = request.send().await.map_err(SseTransportError::Post)?;
            let status = response.status();
            if status.is_success() {
                Ok(())
            } else {
                Err(SseTransportError::Status(status))
            }
        }
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        let events = self.events.as_mut()?;
        loop {
            match events.next().await? {
                Ok(event) => {
                    // An event without a name is a `message`.
                    let name = event.event.as_deref().unwrap_or("message");
                    let Some(data) = event.data.filter(|_| name == "message") else {
                        tracing::debug!(server = %self.server, event = name, "SSE event ignored");
                        continue;
                    };
                    match serde_json::from_str(&data) {
                        Ok(message) => return Some(message),
                        Err(error) => tracing::warn!(
                            server = %self.server,
                            %error,
                            "unreadable MCP message on the SSE stream; ignored"
                        ),
                    }
                }
                Err(error) => {
                    tracing::warn!(server = %self.server, %error, "the MCP server's SSE stream failed");
                    return None;
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // Dropping the stream closes the GET: the server ends the session.
        self.events = None;
        Ok(())
    }
}

/// Whether a Content-Type is `text/event-stream` (parameters aside).
fn is_event_stream(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("text/event-stream"))
}

/// The URL to post to: `endpoint` resolved against the stream's final URL `base`, on the
/// configured stream URL's origin; otherwise why not.
fn endpoint_url(stream: &Url, base: &Url, endpoint: &str) -> Result<Url, String> {
    if endpoint.is_empty() {
        return Err("the `endpoint` event is empty".to_owned());
    }
    let url = base
        .join(endpoint)
        .map_err(|error| format!("'{endpoint}' is not a URL ({error})"))?;
    if url.origin() != stream.origin() {
        return Err(format!(
            "it is on {} while the SSE stream is on {}: Loom posts messages (and their headers) \
             to the stream's origin only",
            url.origin().ascii_serialization(),
            stream.origin().ascii_serialization()
        ));
    }
    Ok(url)
}

/// The events of `response`, each bounded to [`MAX_EVENT_SIZE`] bytes.
fn bounded_events(response: reqwest::Response) -> Events {
    let mut size = EventSize::new(MAX_EVENT_SIZE);
    let bytes = response.bytes_stream().map(move |chunk| {
        let chunk = chunk.map_err(BodyError::Http)?;
        size.check(&chunk)?;
        Ok::<_, BodyError>(chunk)
    });
    SseStream::from_bytes_stream(bytes).boxed()
}

/// Counts the bytes of the SSE event being received (lines up to the blank line that ends it),
/// so that a server cannot make Loom buffer an endless event.
#[derive(Debug)]
struct EventSize {
    max: usize,
    current: usize,
    at_line_start: bool,
    after_cr: bool,
}

impl EventSize {
    fn new(max: usize) -> EventSize {
        EventSize {
            max,
            current: 0,
            at_line_start: true,
            after_cr: false,
        }
    }

    /// Accounts for `bytes`; an error once the current event exceeds the maximum.
    fn check(&mut self, bytes: &[u8]) -> Result<(), BodyError> {
        for &byte in bytes {
            match byte {
                // The LF of a CRLF: the CR already ended the line.
                b'\n' if self.after_cr => self.after_cr = false,
                b'\r' | b'\n' => {
                    if self.at_line_start {
                        // A blank line: the event ends.
                        self.current = 0;
                    }
                    self.at_line_start = true;
                    self.after_cr = byte == b'\r';
                }
                _ => {
                    self.at_line_start = false;
                    self.after_cr = false;
                    self.current += 1;
                    if self.current > self.max {
                        return Err(BodyError::TooLarge(self.max));
                    }
                }
            }
        }
        Ok(())
    }
}

/// An error with its sources (reqwest's own message leaves out the cause).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    #[test]
    fn the_endpoint_is_resolved_on_the_streams_origin() {
        let stream = url("http://127.0.0.1:8931/sse");
        let posted = endpoint_url(&stream, &stream, "/messages/?session_id=ab12");
        assert_eq!(
            posted.as_ref().map(Url::as_str),
            Ok("http://127.0.0.1:8931/messages/?session_id=ab12")
        );
        let absolute = endpoint_url(&stream, &stream, "http://127.0.0.1:8931/m?s=1");
        assert_eq!(
            absolute.as_ref().map(Url::as_str),
            Ok("http://127.0.0.1:8931/m?s=1")
        );
    }

    #[test]
    fn an_endpoint_on_another_origin_is_refused() {
        let stream = url("https://crm.example/sse");
        for foreign in [
            "https://evil.example/messages",
            "//evil.example/messages",
            "http://crm.example/messages",
            "https://crm.example:8443/messages",
        ] {
            let refused = endpoint_url(&stream, &stream, foreign);
            let reason = refused.expect_err(foreign);
            assert!(
                reason.contains("while the SSE stream is on https://crm.example"),
                "{foreign}: {reason}"
            );
        }
        assert!(endpoint_url(&stream, &stream, "").is_err());
    }

    #[test]
    fn content_types() {
        assert!(is_event_stream("text/event-stream"));
        assert!(is_event_stream("Text/Event-Stream; charset=utf-8"));
        assert!(!is_event_stream("application/json"));
        assert!(!is_event_stream(""));
    }

    #[test]
    fn an_event_is_bounded_and_the_count_restarts_after_each_blank_line() {
        let mut size = EventSize::new(8);
        // 7 bytes, then the CRLF CRLF that ends the event split across chunks.
        assert!(size.check(b"data: a\r").is_ok());
        assert!(size.check(b"\n\r\ndata: b\n\n").is_ok());
        assert!(size.check(b"data:").is_ok());
        assert!(size.check(b" 1234").is_err());
        // Lines of one event add up.
        let mut size = EventSize::new(8);
        assert!(size.check(b"data: 1\n").is_ok());
        assert!(matches!(
            size.check(b"data: 2\n"),
            Err(BodyError::TooLarge(8))
        ));
    }

    #[test]
    fn errors_name_their_causes() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let error = Outer(std::io::Error::other("connection refused"));
        assert_eq!(chain(&error), "outer: connection refused");
    }
}
