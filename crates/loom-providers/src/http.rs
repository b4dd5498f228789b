//! The HTTP side shared by the adapters: client, options, one POST (streamed, or read whole).

use std::{collections::BTreeMap, time::Duration};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use crate::{
    capture::{Recorder, tee},
    error::{ErrorClass, ProviderError, retry_after},
};

/// What every adapter needs to reach its provider.
#[derive(Clone, PartialEq)]
pub struct ProviderOptions {
    /// Base URL (the official one when the configuration gives none).
    pub base_url: String,
    /// The API key, read from the variable `api_key_env` names; `None` for local servers.
    pub api_key: Option<String>,
    /// The name of that variable, for error messages (never the key itself).
    pub api_key_env: Option<String>,
    /// Provider model name.
    pub model: String,
    /// Output token cap.
    pub max_tokens: Option<u32>,
    /// Extra headers sent with every request.
    pub headers: BTreeMap<String, String>,
    /// Connection timeout (the engine applies first-token, idle and total timeouts).
    pub connect_timeout: Duration,
    /// Capture each HTTP exchange, keeping at most this many bytes of each body
    /// (`telemetry.capture.raw_max_bytes`); `None` captures nothing.
    pub capture: Option<usize>,
}

impl std::fmt::Debug for ProviderOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderOptions")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .field("api_key_env", &self.api_key_env)
            .field("model", &self.model)
            .field("max_tokens", &self.max_tokens)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("connect_timeout", &self.connect_timeout)
            .field("capture", &self.capture)
            .finish()
    }
}

/// A reqwest client for providers.
pub fn client(options: &ProviderOptions) -> Result<reqwest::Client, ProviderError> {
    loom_tls::install_crypto_provider();
    reqwest::Client::builder()
        .connect_timeout(options.connect_timeout)
        .build()
        .map_err(|e| ProviderError {
            class: ErrorClass::Invalid,
            status: None,
            provider_code: None,
            message: format!("the HTTP client cannot start: {e}"),
            retry_after: None,
        })
}

/// A successful streaming response, or the error body of a failed one (status, headers, text).
pub enum Response {
    /// 2xx: the body as a byte stream.
    Stream(Box<dyn Stream<Item = Result<Bytes, reqwest::Error>> + Send + Unpin>),
    /// Not 2xx.
    Failed {
        /// HTTP status.
        status: u16,
        /// Delay asked for.
        retry_after: Option<std::time::Duration>,
        /// The body, as text.
        body: String,
    },
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Response::Stream(_) => f.write_str("Response::Stream"),
            Response::Failed { status, body, .. } => f
                .debug_struct("Response::Failed")
                .field("status", status)
                .field("body", body)
                .finish(),
        }
    }
}

/// Sends `request`, recording it and its response in `recorder` when there is one.
pub async fn send(
    request: reqwest::RequestBuilder,
    recorder: Option<&Recorder>,
) -> Result<reqwest::Response, ProviderError> {
    let (client, request) = request.build_split();
    let request = request.map_err(network)?;
    if let Some(recorder) = recorder {
        recorder.request(&request);
    }
    let response = client.execute(request).await.map_err(network)?;
    if let Some(recorder) = recorder {
        recorder.response(response.status().as_u16(), response.headers());
    }
    Ok(response)
}

/// The whole body of a response as text (empty when it cannot be read), recorded in
/// `recorder` when there is one.
pub async fn text(response: reqwest::Response, recorder: Option<&Recorder>) -> String {
    let bytes = response.bytes().await.unwrap_or_default();
    if let Some(recorder) = recorder {
        recorder.body(&bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// POSTs the request and returns the streamed body or the failure; with a `recorder`, the
/// exchange is recorded (the streamed body as it is read).
pub async fn post(
    request: reqwest::RequestBuilder,
    recorder: Option<Recorder>,
) -> Result<Response, ProviderError> {
    let response = send(request, recorder.as_ref()).await?;
    let status = response.status().as_u16();
    if response.status().is_success() {
        return Ok(Response::Stream(Box::new(Box::pin(tee(
            response.bytes_stream(),
            recorder,
        )))));
    }
    let retry_after = retry_after(response.headers());
    let body = text(response, recorder.as_ref()).await;
    Ok(Response::Failed {
        status,
        retry_after,
        body,
    })
}

/// The whole body of a successful response (a non-streamed answer); a body cut by the network
/// is a transient error.
pub async fn whole(
    mut body: Box<dyn Stream<Item = Result<Bytes, reqwest::Error>> + Send + Unpin>,
) -> Result<Vec<u8>, ProviderError> {
    let mut out = Vec::new();
    while let Some(piece) = body.next().await {
        out.extend_from_slice(&piece.map_err(network)?);
    }
    Ok(out)
}

/// A network failure (refused, reset, timeout): transient.
pub fn network(error: reqwest::Error) -> ProviderError {
    ProviderError {
        class: ErrorClass::Transient,
        status: None,
        provider_code: None,
        message: format!("network error: {error}"),
        retry_after: None,
    }
}
