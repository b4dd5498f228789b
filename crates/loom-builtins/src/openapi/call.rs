//! One operation as a tool: the request built from the call's arguments, sent, and its answer
//! read within the size cap.

use futures_util::StreamExt;
use loom_core::{
    BoxFuture,
    tool::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec},
};
use serde_json::Value;

use super::{
    AuthHeader,
    schema::{Location, Param},
};

/// Largest answer read from the API (or document fetched), in bytes.
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// The HTTP client of an `openapi` source: no redirects (a credential header must not follow
/// one to another host), no proxy from the environment, the call's timeout.
pub(super) fn client(timeout: std::time::Duration) -> Result<reqwest::Client, ToolError> {
    loom_tls::install_crypto_provider();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(timeout)
        .user_agent(concat!("loom/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|error| ToolError::new(format!("the HTTP client cannot start: {error}")))
}

/// The body of `response`, refused past [`MAX_RESPONSE_BYTES`].
pub(super) async fn read_capped(response: reqwest::Response) -> Result<Vec<u8>, ToolError> {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|error| ToolError::new(format!("the answer broke off: {error}")))?;
        if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
            return Err(ToolError::new(format!(
                "the answer is larger than {MAX_RESPONSE_BYTES} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// An operation of the document, called over HTTP.
#[derive(Debug)]
pub(super) struct OperationTool {
    spec: ToolSpec,
    method: reqwest::Method,
    base: url::Url,
    path: String,
    parameters: Vec<Param>,
    body: bool,
    auth: Option<AuthHeader>,
    client: reqwest::Client,
}

impl OperationTool {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        spec: ToolSpec,
        method: &str,
        base: &url::Url,
        path: &str,
        parameters: Vec<Param>,
        body: bool,
        auth: Option<AuthHeader>,
        client: reqwest::Client,
    ) -> OperationTool {
        OperationTool {
            spec,
            method: reqwest::Method::from_bytes(method.to_uppercase().as_bytes())
                .unwrap_or(reqwest::Method::GET),
            base: base.clone(),
            path: path.to_owned(),
            parameters,
            body,
            auth,
            client,
        }
    }

    /// The URL of a call: the base URL's path, then the operation's with its path parameters
    /// filled in (each segment percent-encoded), then the query parameters.
    fn url(&self, arguments: &serde_json::Map<String, Value>) -> Result<url::Url, ToolError> {
        let mut url = self.base.clone();
        {
            let mut segments = url
                .path_segments_mut()
                .map_err(|()| ToolError::new("the base URL cannot have a path"))?;
            segments.pop_if_empty();
            for segment in self.path.split('/').filter(|s| !s.is_empty()) {
                let mut filled = segment.to_owned();
                for param in self
                    .parameters
                    .iter()
                    .filter(|p| p.location == Location::Path)
                {
                    let placeholder = format!("{{{}}}", param.name);
                    if filled.contains(&placeholder) {
                        let value = arguments.get(&param.name).ok_or_else(|| {
                            ToolError::new(format!(
                                "the path parameter '{}' is missing",
                                param.name
                            ))
                        })?;
                        filled = filled.replace(&placeholder, &scalar(value));
                    }
                }
                segments.push(&filled);
            }
        }
        {
            let mut query = url.query_pairs_mut();
            for param in self
                .parameters
                .iter()
                .filter(|p| p.location == Location::Query)
            {
                match arguments.get(&param.name) {
                    None | Some(Value::Null) => {}
                    Some(Value::Array(items)) => {
                        for item in items {
                            query.append_pair(&param.name, &scalar(item));
                        }
                    }
                    Some(value) => {
                        query.append_pair(&param.name, &scalar(value));
                    }
                }
            }
        }
        if url.query() == Some("") {
            url.set_query(None);
        }
        Ok(url)
    }

    /// The URL of a call with these arguments (unit tests).
    #[cfg(test)]
    pub(super) fn url_for_test(&self, arguments: &serde_json::Map<String, Value>) -> url::Url {
        self.url(arguments)
            .unwrap_or_else(|e| panic!("{}", e.message))
    }

    async fn send(&self, arguments: Value) -> Result<ToolOutput, ToolError> {
        let empty = serde_json::Map::new();
        let arguments = match &arguments {
            Value::Object(map) => map,
            Value::Null => &empty,
            _ => return Err(ToolError::new("the arguments must be an object")),
        };
        let url = self.url(arguments)?;
        let mut request = self.client.request(self.method.clone(), url.clone());
        for param in self
            .parameters
            .iter()
            .filter(|p| p.location == Location::Header)
        {
            if let Some(value) = arguments.get(&param.name).filter(|v| !v.is_null()) {
                request = request.header(param.name.as_str(), scalar(value));
            }
        }
        if self.body
            && let Some(body) = arguments.get("body")
        {
            request = request.json(body);
        }
        if let Some(auth) = &self.auth {
            request = request.header(auth.name.as_str(), auth.value.as_str());
        }
        tracing::debug!(tool = %self.spec.name, method = %self.method, url = %url.path(), "openapi call");
        let response = request.send().await.map_err(|error| {
            ToolError::new(if error.is_timeout() {
                format!("{} {} timed out", self.method, url.path())
            } else {
                format!("{} {} failed: {error}", self.method, url.path())
            })
        })?;
        let status = response.status();
        let json = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.contains("json"));
        let body = read_capped(response).await?;
        let text = String::from_utf8_lossy(&body).into_owned();
        if !status.is_success() {
            return Ok(ToolOutput::error(format!(
                "HTTP {status}: {}",
                text.chars().take(2000).collect::<String>()
            )));
        }
        if json && let Ok(value) = serde_json::from_str::<Value>(&text) {
            return Ok(ToolOutput::json(value));
        }
        Ok(ToolOutput::text(if text.is_empty() {
            format!("HTTP {status}")
        } else {
            text
        }))
    }
}

/// A parameter value as the request carries it: a string as it is, anything else as JSON.
fn scalar(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

impl Tool for OperationTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(
        &self,
        _ctx: ToolContext,
        arguments: Value,
    ) -> BoxFuture<'_, Result<ToolOutput, ToolError>> {
        Box::pin(self.send(arguments))
    }
}
