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

use crate::{AppState, auth::Caller, error::ApiError, routes::loom_error};

/// `POST /hooks/{name}` (scope `run`, and the trigger's agent allowed for the key): answers a
/// [`loom_ia::Triggered`] `{trigger, run_id, session_id, status, repeated}` with 202 when the
/// delivery opened a run, 200 when it had been received before. 404 for an unknown trigger;
/// 422 for a body that is not JSON, an unusable delivery header, or a delivery the trigger
/// refuses (templates that cannot render the payload, a delivery id of another run).
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
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_header",
            format!("{header} must be visible ASCII text (the delivery id)"),
        )
    })?;
    let text = text.trim();
    Ok((!text.is_empty()).then(|| text.to_owned()))
}
