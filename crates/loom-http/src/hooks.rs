//! `POST /hooks/{name}`: a webhook delivery opens a background run of the trigger's agent
//! ([`loom_ia::Loom::trigger`]), for the tenant of the caller's key.
//!
//! The body is the sender's raw JSON (any value; an empty body is the payload `null`), with no
//! envelope: the trigger's templates decide what the run reads from it. When the trigger
//! declares a `delivery_header`, that header's value is the delivery id: the first delivery
//! opens the run under that id (202), a redelivery answers the same run (200, `repeated`).

use axum::{
    Json,
    body::Bytes,
    extract::{Path, State, rejection::BytesRejection},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use loom_ia::config::Scope;
use serde_json::Value;

use crate::{
    AppState,
    auth::Caller,
    error::{ApiError, ErrorKind},
    openapi::{ErrorBody, TriggeredSchema},
    routes::loom_error,
};

/// `POST /hooks/{name}` (scope `run`, and the trigger's agent allowed for the key): answers a
/// [`loom_ia::Triggered`] `{trigger, run_id, session_id, status, repeated}` with 202 when the
/// delivery opened a run, 200 when it had been received before. 404 for an unknown trigger;
/// 422 for a body that is not JSON, an unusable delivery header, or a delivery the trigger
/// refuses (templates that cannot render the payload, a delivery id of another run).
#[utoipa::path(
    post,
    path = "/hooks/{name}",
    tag = "webhooks",
    operation_id = "deliver_webhook",
    summary = "Deliver a webhook to a trigger",
    description = "The body is the sender's raw JSON (any value; an empty body is `null`), \
without an envelope: the trigger's templates render the message (and the session) of a \
background run of its agent from it, in the key's tenant. When the trigger declares a \
`delivery_header`, that header's value is the delivery id and the run id: the first delivery \
opens the run (`202`), a redelivery answers the same run (`200`, `repeated: true`). The \
delivery headers of the configuration's triggers are listed as parameters. Scope `run`, and \
the trigger's agent allowed for the key.",
    params(("name" = String, Path, description = "The trigger's name (`triggers[].name`).")),
    request_body(
        content = Option<serde_json::Value>,
        content_type = "application/json",
        description = "The payload: any JSON value (an empty body is `null`).",
    ),
    responses(
        (status = 200, description = "A redelivery: the run its first reception opened (`repeated: true`); no run was opened.", body = TriggeredSchema),
        (status = 202, description = "The delivery opened a background run.", body = TriggeredSchema),
        (status = 403, description = "The key lacks the scope `run`, or may not use the trigger's agent.", body = ErrorBody),
        (status = 404, description = "No such trigger (`unknown_trigger`).", body = ErrorBody),
        (status = 409, description = "The run is refused (`refused`).", body = ErrorBody),
        (status = 413, description = "The body is larger than `server.http.max_body_bytes`.", body = ErrorBody),
        (status = 422, description = "The body is not JSON (`invalid_body`), the delivery header is not visible ASCII (`invalid_header`), or the trigger refuses the delivery (`invalid_request`: a template cannot render the payload, an empty message, an unusable session or delivery id, a delivery id naming another run).", body = ErrorBody),
        (status = 429, description = "A tenant budget or quota is reached.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until a run is let in."))),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
pub(crate) async fn deliver(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Run)?;
    let loom = &state.loom;
    let spec = loom.trigger_spec(&name).map_err(|e| loom_error(loom, &e))?;
    caller.agent(&spec.agent)?;
    let delivery = match &spec.delivery_header {
        Some(header) => delivery_id(&headers, header)?,
        None => None,
    };
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large()
        } else {
            ApiError::invalid_body(rejection.body_text())
        }
    })?;
    let payload = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::invalid_body(format!("the payload is not JSON: {e}")))?
    };
    let triggered = loom
        .trigger(&name, payload, delivery, Some(&caller.tenant))
        .await
        .map_err(|e| loom_error(loom, &e))?;
    let status = if triggered.repeated {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(triggered)).into_response())
}

/// The delivery id in `header` (absent or blank: none).
fn delivery_id(headers: &HeaderMap, header: &str) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(header) else {
        return Ok(None);
    };
    let text = value.to_str().map_err(|_| {
        ApiError::new(
            ErrorKind::InvalidHeader,
            format!("{header} must be visible ASCII text (the delivery id)"),
        )
    })?;
    let text = text.trim();
    Ok((!text.is_empty()).then(|| text.to_owned()))
}
