//! The HTTP client of MCP servers over streamable HTTP: reqwest's, with each request whose
//! `_meta` carries the W3C trace context (`traceparent`, given to a `tools/call` when traces are
//! exported) also sending it as the `traceparent` HTTP header, so that the server's tracing
//! middleware (which reads headers, not JSON-RPC `_meta`) joins the run's trace. The header is
//! the `_meta` value itself: both come from the one deterministic derivation of the call's span
//! (`loom_engine::traceparent`).

use std::{collections::HashMap, sync::Arc};

use futures_util::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::{
    model::ClientJsonRpcMessage,
    transport::streamable_http_client::{
        SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
        StreamableHttpResponseLimits,
    },
};
use serde_json::Value;
use sse_stream::Sse;

use crate::server::TRACEPARENT_META_KEY;

/// The W3C trace-context header.
pub(crate) const TRACEPARENT_HEADER: HeaderName = HeaderName::from_static("traceparent");

/// reqwest's streamable HTTP client, sending a request's `_meta.traceparent` as a header.
#[derive(Clone, Debug)]
pub(crate) struct TracedClient(pub(crate) reqwest::Client);

/// The `traceparent` of `message`'s `_meta`, when it has a usable one.
pub(crate) fn traceparent(message: &ClientJsonRpcMessage) -> Option<HeaderValue> {
    let value = serde_json::to_value(message).ok()?;
    let trace = value
        .get("params")?
        .get("_meta")?
        .get(TRACEPARENT_META_KEY)?;
    match trace {
        Value::String(trace) => HeaderValue::from_str(trace).ok(),
        _ => None,
    }
}

/// `headers`, with `message`'s trace context added.
fn with_trace(
    message: &ClientJsonRpcMessage,
    mut headers: HashMap<HeaderName, HeaderValue>,
) -> HashMap<HeaderName, HeaderValue> {
    if let Some(trace) = traceparent(message) {
        headers.insert(TRACEPARENT_HEADER, trace);
    }
    headers
}

type Stream = BoxStream<'static, Result<Sse, SseError>>;
type HttpError = StreamableHttpError<reqwest::Error>;

impl StreamableHttpClient for TracedClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let headers = with_trace(&message, custom_headers);
        self.0
            .post_message(uri, message, session_id, auth_header, headers)
            .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let headers = with_trace(&message, custom_headers);
        self.0
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                headers,
                max_sse_event_size,
            )
            .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let headers = with_trace(&message, custom_headers);
        self.0
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                headers,
                limits,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), HttpError> {
        self.0
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Stream, HttpError> {
        self.0
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<Stream, HttpError> {
        self.0
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}
