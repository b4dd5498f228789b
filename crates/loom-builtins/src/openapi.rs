//! The `openapi` tool source (feature `openapi`): the operations of an OpenAPI 3.0 document,
//! selected by `operationId`, offered as tools `<source>__<operationId>` and called over HTTP.
//!
//! The document is read by `openapiv3` (JSON or YAML); the schemas of parameters and request
//! bodies are turned into one input schema per operation with their local `$ref`s inlined
//! (`schema.rs`); a call fills the path, query and header parameters and the JSON body, adds the
//! credential header, and reads the answer within the timeout and a size cap (`call.rs`).
//! Side effects come from the HTTP method: `GET`, `HEAD` and `OPTIONS` read only, the others
//! change something for good (`irreversible`), unless the configuration declares otherwise
//! per operation (`tool_sources[].tools.<operationId>`).

mod call;
mod schema;

use std::{sync::Arc, time::Duration};

use loom_core::{
    BoxFuture,
    ports::{SourceContext, SourceError, ToolSource},
    tool::{SideEffects, Tool, ToolDeclarations, ToolKind, ToolSpec},
};
use openapiv3::{OpenAPI, Operation, Parameter, ReferenceOr};
use serde::Deserialize;
use serde_json::Value;

pub use call::MAX_RESPONSE_BYTES;
use call::OperationTool;
use schema::Resolver;

/// Default timeout of one HTTP call, in seconds.
pub const DEFAULT_TIMEOUT_S: f64 = 30.0;

/// The `params` of a `kind: openapi` tool source, as written in the configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenApiParams {
    /// The document: a path (relative to the configuration's directory) or an `http(s)` URL.
    pub document: String,
    /// The `operationId`s offered as tools (at least one).
    pub operations: Vec<String>,
    /// The API's base URL; default: the document's first `servers` entry.
    #[serde(default)]
    pub base_url: Option<String>,
    /// How calls authenticate.
    #[serde(default)]
    pub auth: Option<AuthParams>,
    /// Seconds one call may take.
    #[serde(default)]
    pub timeout: Option<f64>,
}

/// How the calls of an `openapi` source authenticate: a secret (named, read from the tenant's
/// secrets) sent as a bearer token or in an API-key header.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, tag = "type", rename_all = "snake_case")]
pub enum AuthParams {
    /// `Authorization: Bearer <secret>`.
    Bearer {
        /// The name of the secret.
        secret: String,
    },
    /// `<header>: <secret>`.
    ApiKey {
        /// The header's name.
        header: String,
        /// The name of the secret.
        secret: String,
    },
}

impl AuthParams {
    /// The name of the secret the calls send.
    pub fn secret(&self) -> &str {
        match self {
            AuthParams::Bearer { secret } | AuthParams::ApiKey { secret, .. } => secret,
        }
    }
}

/// A credential header sent with every call (its value is a secret: never logged).
#[derive(Clone)]
pub struct AuthHeader {
    /// The header's name.
    pub name: String,
    /// Its value.
    pub value: String,
}

impl std::fmt::Debug for AuthHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthHeader")
            .field("name", &self.name)
            .field("value", &"<secret>")
            .finish()
    }
}

impl AuthHeader {
    /// The header `params` describe, with the secret's `value`.
    pub fn new(params: &AuthParams, value: String) -> AuthHeader {
        match params {
            AuthParams::Bearer { .. } => AuthHeader {
                name: "Authorization".into(),
                value: format!("Bearer {value}"),
            },
            AuthParams::ApiKey { header, .. } => AuthHeader {
                name: header.clone(),
                value,
            },
        }
    }
}

/// What builds an [`OpenApiSource`]: the document already read, and the settings.
#[derive(Debug, Clone)]
pub struct OpenApiOptions {
    /// The source's name (the tools' prefix).
    pub name: String,
    /// The operations offered, by `operationId`.
    pub operations: Vec<String>,
    /// The base URL (else the document's first server).
    pub base_url: Option<String>,
    /// The credential header.
    pub auth: Option<AuthHeader>,
    /// The timeout of one call.
    pub timeout: Duration,
}

/// Why an OpenAPI document cannot become tools.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenApiError {
    /// The document is neither JSON nor YAML, or not an OpenAPI 3.0 document.
    #[error("the OpenAPI document cannot be read: {0}")]
    Document(String),
    /// An `operations` entry names no operation of the document (`index` in `operations`).
    #[error("no operation has the operationId '{id}' (operations of the document: {known})")]
    UnknownOperation {
        /// Its index in `operations`.
        index: usize,
        /// The id.
        id: String,
        /// The ids the document has.
        known: String,
    },
    /// An `operations` entry is given twice.
    #[error("the operation '{id}' is listed twice")]
    DuplicateOperation {
        /// Its index in `operations`.
        index: usize,
        /// The id.
        id: String,
    },
    /// No operation is selected.
    #[error("'operations' needs at least one operationId")]
    NoOperation,
    /// An operation cannot become a tool (its name, a parameter, a `$ref`).
    #[error("operation '{id}': {message}")]
    Operation {
        /// Its index in `operations`.
        index: usize,
        /// The id.
        id: String,
        /// What is wrong.
        message: String,
    },
    /// No base URL: none given and the document has no absolute server URL.
    #[error("no base URL: give 'base_url' (the document's servers give none usable: {0})")]
    NoBaseUrl(String),
    /// The base URL is not an http(s) URL.
    #[error("'{0}' is not an http(s) URL")]
    BadBaseUrl(String),
    /// The document could not be fetched.
    #[error("the OpenAPI document at {url} cannot be fetched: {message}")]
    Fetch {
        /// Its URL.
        url: String,
        /// Why.
        message: String,
    },
}

/// Reads a document in JSON or YAML into a value.
pub fn parse_document(text: &str) -> Result<Value, OpenApiError> {
    match serde_json::from_str(text) {
        Ok(value) => Ok(value),
        Err(json) if text.trim_start().starts_with('{') => {
            Err(OpenApiError::Document(json.to_string()))
        }
        Err(_) => serde_saphyr::from_str::<Value>(text)
            .map_err(|error| OpenApiError::Document(error.to_string())),
    }
}

/// Fetches a document over HTTP (within `timeout`, at most [`MAX_RESPONSE_BYTES`]).
pub async fn fetch_document(url: &str, timeout: Duration) -> Result<Value, OpenApiError> {
    let fetch_error = |message: String| OpenApiError::Fetch {
        url: url.to_owned(),
        message,
    };
    let client = call::client(timeout).map_err(|e| fetch_error(e.message))?;
    let response = client
        .get(url)
        .send()
        .await
        .map_err(|e| fetch_error(e.to_string()))?;
    if !response.status().is_success() {
        return Err(fetch_error(format!("HTTP {}", response.status())));
    }
    let body = call::read_capped(response)
        .await
        .map_err(|e| fetch_error(e.message))?;
    parse_document(&String::from_utf8_lossy(&body))
}

/// The operations of an OpenAPI document as a tool source.
#[derive(Debug)]
pub struct OpenApiSource {
    name: String,
    tools: Vec<Arc<dyn Tool>>,
}

impl OpenApiSource {
    /// The tools of `document`'s selected operations; `document_url`, when the document was
    /// fetched, resolves a relative server URL.
    pub fn new(
        options: OpenApiOptions,
        document: &Value,
        document_url: Option<&str>,
    ) -> Result<OpenApiSource, OpenApiError> {
        let api: OpenAPI = serde_json::from_value(document.clone())
            .map_err(|error| OpenApiError::Document(error.to_string()))?;
        if !api.openapi.starts_with("3.") {
            return Err(OpenApiError::Document(format!(
                "version '{}' is not OpenAPI 3",
                api.openapi
            )));
        }
        if options.operations.is_empty() {
            return Err(OpenApiError::NoOperation);
        }
        let base_url = base_url(&options, &api, document_url)?;
        let client = call::client(options.timeout).map_err(|e| OpenApiError::Fetch {
            url: base_url.to_string(),
            message: e.message,
        })?;
        let resolver = Resolver::new(document);
        let found = operations(&api);
        let mut tools: Vec<Arc<dyn Tool>> = Vec::with_capacity(options.operations.len());
        for (index, id) in options.operations.iter().enumerate() {
            if options.operations[..index].contains(id) {
                return Err(OpenApiError::DuplicateOperation {
                    index,
                    id: id.clone(),
                });
            }
            let Some((method, path, item_parameters, operation)) = found
                .iter()
                .find(|(_, _, _, op)| op.operation_id.as_ref() == Some(id))
            else {
                let known: Vec<&str> = found
                    .iter()
                    .filter_map(|(_, _, _, op)| op.operation_id.as_deref())
                    .collect();
                return Err(OpenApiError::UnknownOperation {
                    index,
                    id: id.clone(),
                    known: if known.is_empty() {
                        "none".into()
                    } else {
                        known.join(", ")
                    },
                });
            };
            let at = |message: String| OpenApiError::Operation {
                index,
                id: id.clone(),
                message,
            };
            let name = format!("{}__{id}", options.name);
            if !loom_core::ids::is_valid_name(&name) {
                return Err(at(format!(
                    "'{name}' is not a valid tool name (^[A-Za-z0-9_-]{{1,64}}$)"
                )));
            }
            let mut parameters: Vec<&ReferenceOr<Parameter>> = item_parameters.iter().collect();
            parameters.extend(operation.parameters.iter());
            let input = resolver.input(&parameters, operation.request_body.as_ref());
            let input = input.map_err(at)?;
            let side_effects = match *method {
                "get" | "head" | "options" => SideEffects::None,
                _ => SideEffects::Irreversible,
            };
            let spec = ToolSpec {
                name,
                description: description(method, path, operation),
                input_schema: input.schema,
                kind: ToolKind::Builtin,
                declarations: ToolDeclarations {
                    side_effects,
                    idempotent: matches!(*method, "get" | "head" | "options" | "put" | "delete"),
                    timeout: Some(options.timeout),
                    ..ToolDeclarations::default()
                },
            };
            tools.push(Arc::new(OperationTool::new(
                spec,
                method,
                &base_url,
                path,
                input.parameters,
                input.body,
                options.auth.clone(),
                client.clone(),
            )));
        }
        Ok(OpenApiSource {
            name: options.name,
            tools,
        })
    }

    /// The tools, named `<source>__<operationId>`.
    pub fn tools(&self) -> &[Arc<dyn Tool>] {
        &self.tools
    }
}

impl ToolSource for OpenApiSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn open<'a>(
        &'a self,
        _ctx: &'a SourceContext,
    ) -> BoxFuture<'a, Result<Vec<Arc<dyn Tool>>, SourceError>> {
        Box::pin(async move { Ok(self.tools.clone()) })
    }

    fn release<'a>(&'a self, _ctx: &'a SourceContext) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// An `openapi` source whose document is at a URL: fetched when a run first opens it (an
/// error then makes the source unavailable for that run, and the next run fetches again).
#[derive(Debug)]
pub struct RemoteOpenApiSource {
    options: OpenApiOptions,
    url: String,
    loaded: tokio::sync::OnceCell<OpenApiSource>,
}

impl RemoteOpenApiSource {
    /// A source of the document at `url`, fetched at first use.
    pub fn new(options: OpenApiOptions, url: String) -> RemoteOpenApiSource {
        RemoteOpenApiSource {
            options,
            url,
            loaded: tokio::sync::OnceCell::new(),
        }
    }
}

impl ToolSource for RemoteOpenApiSource {
    fn name(&self) -> &str {
        &self.options.name
    }

    fn open<'a>(
        &'a self,
        _ctx: &'a SourceContext,
    ) -> BoxFuture<'a, Result<Vec<Arc<dyn Tool>>, SourceError>> {
        Box::pin(async move {
            let source = self
                .loaded
                .get_or_try_init(|| async {
                    let document = fetch_document(&self.url, self.options.timeout).await?;
                    OpenApiSource::new(self.options.clone(), &document, Some(&self.url))
                })
                .await
                .map_err(|error| SourceError {
                    message: error.to_string(),
                    circuit: None,
                })?;
            Ok(source.tools.clone())
        })
    }

    fn release<'a>(&'a self, _ctx: &'a SourceContext) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// Every operation of the document: method, path, the path item's parameters, operation.
fn operations(api: &OpenAPI) -> Vec<(&'static str, &str, &[ReferenceOr<Parameter>], &Operation)> {
    let mut found = Vec::new();
    for (path, item) in api.paths.iter() {
        let ReferenceOr::Item(item) = item else {
            continue;
        };
        for (method, operation) in item.iter() {
            let method: &'static str = match method {
                "get" => "get",
                "put" => "put",
                "post" => "post",
                "delete" => "delete",
                "options" => "options",
                "head" => "head",
                "patch" => "patch",
                _ => "trace",
            };
            found.push((method, path.as_str(), item.parameters.as_slice(), operation));
        }
    }
    found
}

/// The tool's description: the operation's summary and description, else its method and path.
fn description(method: &str, path: &str, operation: &Operation) -> String {
    let parts: Vec<&str> = [
        operation.summary.as_deref(),
        operation.description.as_deref(),
    ]
    .into_iter()
    .flatten()
    .filter(|s| !s.trim().is_empty())
    .collect();
    if parts.is_empty() {
        format!("{} {path}", method.to_uppercase())
    } else {
        parts.join("\n\n")
    }
}

/// The base URL: the option, else the document's first server (its variables at their
/// defaults; relative to the document's URL when it was fetched).
fn base_url(
    options: &OpenApiOptions,
    api: &OpenAPI,
    document_url: Option<&str>,
) -> Result<url::Url, OpenApiError> {
    let text = match (&options.base_url, api.servers.first()) {
        (Some(url), _) => url.clone(),
        (None, Some(server)) => {
            let mut url = server.url.clone();
            for (name, variable) in server.variables.iter().flatten() {
                url = url.replace(&format!("{{{name}}}"), &variable.default);
            }
            match url::Url::parse(&url) {
                Ok(_) => url,
                Err(_) => match document_url.and_then(|d| url::Url::parse(d).ok()) {
                    Some(document) => document
                        .join(&url)
                        .map_err(|_| OpenApiError::NoBaseUrl(url.clone()))?
                        .to_string(),
                    None => return Err(OpenApiError::NoBaseUrl(format!("'{url}' is relative"))),
                },
            }
        }
        (None, None) => return Err(OpenApiError::NoBaseUrl("it lists none".into())),
    };
    let url = url::Url::parse(&text).map_err(|_| OpenApiError::BadBaseUrl(text.clone()))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(OpenApiError::BadBaseUrl(text));
    }
    Ok(url)
}

#[cfg(test)]
mod tests;
