//! The built-in tool source kind `openapi` (feature `openapi`): `params` read into
//! [`OpenApiParams`], the document read from a file under the configuration's directory when
//! the source is built (so a wrong `operationId` is refused at load, located), or fetched from
//! an `http(s)` URL when a run first opens it; the credential read from the tenant's secrets.

use std::{sync::Arc, time::Duration};

use loom_builtins::openapi::{
    AuthHeader, DEFAULT_TIMEOUT_S, OpenApiError, OpenApiOptions, OpenApiParams, OpenApiSource,
    RemoteOpenApiSource, parse_document,
};
use loom_core::ports::ToolSource;

use crate::tool_sources::{SourceFactoryError, SourceRequest};

/// Builds an `openapi` source.
pub(crate) fn build(
    request: &SourceRequest<'_>,
) -> Result<Arc<dyn ToolSource>, SourceFactoryError> {
    let params: OpenApiParams = serde_json::from_value(request.params.clone())
        .map_err(|error| SourceFactoryError::new(format!("params: {error}")))?;
    let timeout = params.timeout.unwrap_or(DEFAULT_TIMEOUT_S);
    let timeout = Duration::try_from_secs_f64(timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| SourceFactoryError::at("timeout", "must be a positive number of seconds"))?;
    let auth = match &params.auth {
        Some(auth) => Some(AuthHeader::new(
            auth,
            request
                .secrets
                .get(auth.secret())
                .map_err(|e| SourceFactoryError::at("auth.secret", e.message))?,
        )),
        None => None,
    };
    let options = OpenApiOptions {
        name: request.name.to_owned(),
        operations: params.operations.clone(),
        base_url: params.base_url.clone(),
        auth,
        timeout,
    };
    if params.document.starts_with("http://") || params.document.starts_with("https://") {
        if options.operations.is_empty() {
            return Err(located(OpenApiError::NoOperation));
        }
        return Ok(Arc::new(RemoteOpenApiSource::new(options, params.document)));
    }
    let path = request.base_dir.join(&params.document);
    let text = std::fs::read_to_string(&path).map_err(|error| {
        SourceFactoryError::at(
            "document",
            format!(
                "cannot read the OpenAPI document {}: {error}",
                path.display()
            ),
        )
    })?;
    let document =
        parse_document(&text).map_err(|e| SourceFactoryError::at("document", e.to_string()))?;
    let source = OpenApiSource::new(options, &document, None).map_err(located)?;
    Ok(Arc::new(source))
}

/// The error located at the key of `params` it is about.
fn located(error: OpenApiError) -> SourceFactoryError {
    let key = match &error {
        OpenApiError::UnknownOperation { index, .. }
        | OpenApiError::DuplicateOperation { index, .. }
        | OpenApiError::Operation { index, .. } => format!("operations[{index}]"),
        OpenApiError::NoOperation => "operations".into(),
        OpenApiError::NoBaseUrl(_) | OpenApiError::BadBaseUrl(_) => "base_url".into(),
        _ => "document".into(),
    };
    SourceFactoryError::at(key, error.to_string())
}
