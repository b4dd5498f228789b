//! `POST /hooks/{name}`: a webhook delivery opens a background run of the trigger's agent
//! ([`loom_ia::Loom::trigger`]), for the tenant of the caller's key, or of the trigger when the
//! delivery is signed.
//!
//! The body is the sender's raw JSON (any value; an empty body is the payload `null`), with no
//! envelope: the trigger's templates decide what the run reads from it. When the trigger
//! declares a `delivery_header`, that header's value is the delivery id: the first delivery
//! opens the run under that id (202), a redelivery answers the same run (200, `repeated`).
//!
//! **Signed deliveries.** A trigger with a `secret_env` takes only deliveries signed with its
//! secret, as the services that send webhooks sign theirs: the sender writes the Unix time in
//! seconds in [`TIMESTAMP_HEADER`] and, in [`SIGNATURE_HEADER`], `v1=` followed by the
//! lowercase hex HMAC-SHA256, keyed by the secret, of the string `<timestamp>.<raw body>`
//! (several `v1=` entries may be given, comma-separated, while a secret is rotated). The
//! signature is compared in constant time (`hmac`'s `verify_slice`), and a timestamp more than
//! the trigger's `signature_tolerance` (300 s by default) away from the server's clock is
//! refused, so a captured delivery cannot be replayed later. A delivery without both headers,
//! with a wrong signature or an old timestamp is `401` `invalid_signature`, before its body is
//! read as JSON. The signature is the delivery's authentication: the services that send
//! webhooks cannot add an API key, so none is asked for, and the run opens in the trigger's
//! `tenant` (`default` unless set). A trigger without `secret_env` needs a key with the scope
//! `run` (and its agent), and the key decides the tenant.

use axum::{
    Json,
    body::Bytes,
    extract::{Path, State, rejection::BytesRejection},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use hmac::{Hmac, KeyInit, Mac};
use loom_ia::config::{Scope, TriggerSpec};
use serde_json::Value;
use sha2::Sha256;

use crate::{
    AppState,
    auth::Caller,
    error::{ApiError, ErrorKind},
    openapi::{ErrorBody, TriggeredSchema},
    routes::loom_error,
};

/// The header of a signed delivery's Unix time, in seconds.
pub const TIMESTAMP_HEADER: &str = "X-Loom-Timestamp";

/// The header of a signed delivery's signature: `v1=<hex HMAC-SHA256>` (comma-separated when
/// there are several).
pub const SIGNATURE_HEADER: &str = "X-Loom-Signature";

/// `POST /hooks/{name}` (a signed trigger: its signature; otherwise a key with the scope `run`
/// and the trigger's agent allowed): answers a
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
delivery headers of the configuration's triggers are listed as parameters. A trigger with a \
signing secret (`secret_env`) takes signed deliveries only (`X-Loom-Timestamp`, \
`X-Loom-Signature`) and needs no API key: the run opens in the trigger's tenant. Any other \
trigger needs a key with the scope `run` and the trigger's agent, in the key's tenant.",
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
    caller: Result<Caller, ApiError>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let loom = &state.loom;
    // A signed trigger authenticates its deliveries by their signature (checked below, once the
    // body is read); any other delivery, to an unknown trigger too, needs a key first.
    let signed = loom
        .trigger_spec(&name)
        .ok()
        .and_then(|spec| Some((spec, spec.signed_tenant()?)));
    let (spec, tenant, secret) = match signed {
        Some((spec, tenant)) => {
            // Read when the instance was built, which refuses a signed trigger without it.
            let secret = loom.trigger_secret(&name).ok_or_else(|| {
                ApiError::server(
                    ErrorKind::Config,
                    &format!("trigger '{name}' has no signing secret"),
                )
            })?;
            (spec, tenant.to_owned(), Some(secret))
        }
        None => {
            let caller = caller?;
            caller.require(Scope::Run)?;
            let spec = loom.trigger_spec(&name).map_err(|e| loom_error(loom, &e))?;
            caller.agent(&spec.agent)?;
            (spec, caller.tenant, None)
        }
    };
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
    if let Some(secret) = secret {
        let now = chrono::Utc::now().timestamp();
        verify_signature(spec, secret, &headers, &body, now)?;
    }
    let payload = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::invalid_body(format!("the payload is not JSON: {e}")))?
    };
    let triggered = loom
        .trigger(&name, payload, delivery, Some(&tenant))
        .await
        .map_err(|e| loom_error(loom, &e))?;
    let status = if triggered.repeated {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(triggered)).into_response())
}

/// Refuses (`401` `invalid_signature`) a delivery to `trigger` whose headers do not carry a
/// signature of `body` by `secret` made within the trigger's `signature_tolerance` of `now`
/// (Unix seconds).
fn verify_signature(
    trigger: &TriggerSpec,
    secret: &[u8],
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
) -> Result<(), ApiError> {
    let refused = |why: String| {
        tracing::warn!(trigger = %trigger.name, reason = %why, "delivery refused: signature");
        ApiError::new(
            ErrorKind::InvalidSignature,
            format!(
                "trigger '{}' takes signed deliveries only: {why}",
                trigger.name
            ),
        )
    };
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let Some(timestamp) = header(TIMESTAMP_HEADER) else {
        return Err(refused(format!("{TIMESTAMP_HEADER} is missing")));
    };
    let Some(signatures) = header(SIGNATURE_HEADER) else {
        return Err(refused(format!("{SIGNATURE_HEADER} is missing")));
    };
    let timestamp = timestamp.trim();
    let Ok(sent) = timestamp.parse::<i64>() else {
        return Err(refused(format!(
            "{TIMESTAMP_HEADER} must be a Unix time in seconds"
        )));
    };
    if now.abs_diff(sent) > trigger.signature_tolerance {
        return Err(refused(format!(
            "{TIMESTAMP_HEADER} is more than {} s away from the server's clock (a replay?)",
            trigger.signature_tolerance
        )));
    }
    let Ok(keyed) = Hmac::<Sha256>::new_from_slice(secret) else {
        return Err(refused("the secret cannot key an HMAC".into()));
    };
    let mut mac = keyed;
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    let signed = signatures
        .split(',')
        .filter_map(|entry| entry.trim().strip_prefix("v1="))
        .filter_map(|text| hex::decode(text).ok())
        .any(|signature| mac.clone().verify_slice(&signature).is_ok());
    if signed {
        Ok(())
    } else {
        Err(refused(format!(
            "{SIGNATURE_HEADER} holds no v1 signature of this body and timestamp"
        )))
    }
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

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    const SECRET: &[u8] = b"whsec_test";
    const NOW: i64 = 1_780_000_000;

    fn sign(secret: &[u8], timestamp: &str, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
        mac.update(format!("{timestamp}.").as_bytes());
        mac.update(body);
        format!("v1={}", hex::encode(mac.finalize().into_bytes()))
    }

    fn headers(timestamp: Option<&str>, signature: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(timestamp) = timestamp {
            headers.insert(TIMESTAMP_HEADER, HeaderValue::from_str(timestamp).unwrap());
        }
        if let Some(signature) = signature {
            headers.insert(SIGNATURE_HEADER, HeaderValue::from_str(signature).unwrap());
        }
        headers
    }

    fn verdict(headers: &HeaderMap, body: &[u8]) -> Result<(), String> {
        let trigger = TriggerSpec::new("orders", "support", "{{ payload }}");
        verify_signature(&trigger, SECRET, headers, body, NOW).map_err(|error| {
            assert_eq!(error.kind, ErrorKind::InvalidSignature);
            error.message
        })
    }

    #[test]
    fn a_signature_of_the_body_within_the_window_is_accepted() {
        let body = br#"{"order": 42}"#;
        let now = NOW.to_string();
        assert_eq!(
            verdict(&headers(Some(&now), Some(&sign(SECRET, &now, body))), body),
            Ok(())
        );
        // Within the window either way, and among other entries (a secret being rotated).
        let earlier = (NOW - 299).to_string();
        let rotated = format!("v1=00ff, {}", sign(SECRET, &earlier, body));
        assert_eq!(
            verdict(&headers(Some(&earlier), Some(&rotated)), body),
            Ok(())
        );
        let later = (NOW + 299).to_string();
        assert_eq!(
            verdict(
                &headers(Some(&later), Some(&sign(SECRET, &later, body))),
                body
            ),
            Ok(())
        );
    }

    #[test]
    fn missing_wrong_tampered_or_replayed_deliveries_are_refused() {
        let body = br#"{"order": 42}"#;
        let now = NOW.to_string();
        let good = sign(SECRET, &now, body);
        let refused = |headers: HeaderMap, body: &[u8]| verdict(&headers, body).unwrap_err();
        assert_eq!(
            refused(headers(None, None), body),
            "trigger 'orders' takes signed deliveries only: X-Loom-Timestamp is missing"
        );
        assert_eq!(
            refused(headers(Some(&now), None), body),
            "trigger 'orders' takes signed deliveries only: X-Loom-Signature is missing"
        );
        let no_signature = "trigger 'orders' takes signed deliveries only: X-Loom-Signature holds \
                            no v1 signature of this body and timestamp";
        // Another secret, another body, another timestamp, not hex, another scheme.
        assert_eq!(
            refused(headers(Some(&now), Some(&sign(b"other", &now, body))), body),
            no_signature
        );
        assert_eq!(
            refused(headers(Some(&now), Some(&good)), br#"{"order": 43}"#),
            no_signature
        );
        let next = (NOW + 1).to_string();
        assert_eq!(
            refused(headers(Some(&next), Some(&good)), body),
            no_signature
        );
        assert_eq!(
            refused(headers(Some(&now), Some("v1=zz")), body),
            no_signature
        );
        let v0 = good.replace("v1=", "v0=");
        assert_eq!(refused(headers(Some(&now), Some(&v0)), body), no_signature);
        // A replay: a signature made outside the window, valid as it was.
        let old = (NOW - 301).to_string();
        assert_eq!(
            refused(headers(Some(&old), Some(&sign(SECRET, &old, body))), body),
            "trigger 'orders' takes signed deliveries only: X-Loom-Timestamp is more than 300 s \
             away from the server's clock (a replay?)"
        );
        assert_eq!(
            refused(headers(Some("yesterday"), Some(&good)), body),
            "trigger 'orders' takes signed deliveries only: X-Loom-Timestamp must be a Unix \
             time in seconds"
        );
    }
}
