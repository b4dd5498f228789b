//! The API's errors: an HTTP status, a stable `kind`, a message, and `Retry-After` when
//! retrying later can succeed.

use axum::{
    Json,
    extract::rejection::{JsonRejection, QueryRejection},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use std::time::Duration;

use loom_ia::{LoomError, RunRef};

use crate::openapi::{ErrorBody, ErrorDetail};

/// A delay in whole seconds, rounded up, at least 1 (what `Retry-After` says).
fn whole_seconds(delay: Duration) -> u64 {
    (delay.as_secs() + u64::from(delay.subsec_nanos() > 0)).max(1)
}

/// An error answered as `{"error": {"kind": ..., "message": ...}}`.
///
/// `kind` is stable and chosen by the error's variant, never by its text:
///
/// | kind | status | from |
/// |---|---|---|
/// | `unknown_agent` | 404 | [`LoomError::UnknownAgent`] |
/// | `unknown_run` | 404 | [`LoomError::UnknownRun`] |
/// | `unknown_session` | 404 | [`LoomError::UnknownSession`] |
/// | `unknown_artifact` | 404 | [`LoomError::UnknownArtifact`] (a session file) |
/// | `unknown_trigger` | 404 | [`LoomError::UnknownTrigger`] |
/// | `refused` | 409 | [`LoomError::Refused`] (run exists, nothing to approve, a rule) |
/// | `invalid_request` | 422 | [`LoomError::Invalid`] (unusable id, refused attachment, delivery or payload) |
/// | `conflict` | 409 + `Retry-After` | [`LoomError::Conflict`] (the run is driven elsewhere) |
/// | `budget_exhausted` | 429 + `Retry-After` | [`LoomError::BudgetExhausted`] |
/// | `quota_exceeded` | 429 + `Retry-After` | [`LoomError::QuotaExceeded`] (`tenants[].quotas`) |
/// | `rate_limited` | 429 + `Retry-After` | the key's `rate_limit` (requests per minute) |
/// | `config` | 500 | [`LoomError::Config`] |
/// | `registration` | 500 | [`LoomError::Registration`] |
/// | `journal` | 500 | [`LoomError::Journal`] |
/// | `engine` | 500 | [`LoomError::Engine`] |
/// | `interrupted` | 503 | [`LoomError::Interrupted`]: the server shut down before the run closed; the body also names `run_id` and `session_id` (the run resumes at the next start) |
/// | `invalid_body` | 422 | a body that is not the expected JSON |
/// | `body_too_large` | 413 | a body over `server.http.max_body_bytes` |
/// | `invalid_query` | 422 | an unusable query string or filter value ([`LoomError::InvalidQuery`]); the message starts with the parameter |
/// | `invalid_header` | 422 | an unusable header (`Last-Event-ID`) |
/// | `not_found` | 404 | no such route |
/// | `missing_key` | 401 | keys are declared and the request names none |
/// | `unknown_key` | 401 | a key that is not declared |
/// | `expired_key` | 401 | a key past its `expires` |
/// | `missing_scope` | 403 | the key lacks the route's scope |
/// | `agent_not_allowed` | 403 | the key is limited to other agents, or the tenant's `tenants[].agents` does not list the agent ([`LoomError::AgentNotAllowed`]) |
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable classification.
    pub kind: &'static str,
    /// What went wrong, for a human.
    pub message: String,
    /// Seconds after which retrying can succeed (`Retry-After`).
    pub retry_after: Option<u64>,
    /// The run an `interrupted` error is about (its `run_id` and `session_id` are in the body).
    pub run: Option<Box<RunRef>>,
}

impl ApiError {
    /// An error without `Retry-After`.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            retry_after: None,
            run: None,
        }
    }

    /// A request body the API cannot use (422).
    pub fn invalid_body(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", message)
    }

    /// A request body over `server.http.max_body_bytes` (413).
    pub fn too_large() -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            "the request body is larger than server.http.max_body_bytes",
        )
    }

    /// A key over its `rate_limit` (429): `retry_after` until one of its requests leaves the
    /// sliding minute.
    pub fn rate_limited(key: &str, per_minute: u32, retry_after: Duration) -> ApiError {
        let seconds = whole_seconds(retry_after);
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: "rate_limited",
            message: format!(
                "key '{key}': {per_minute} requests per minute exceeded, retry in {seconds} s"
            ),
            retry_after: Some(seconds),
            run: None,
        }
    }

    /// The error answered for `error`; `lease_seconds` is the run lease, after which a run
    /// driven elsewhere can be claimed again.
    pub fn from_loom(error: &LoomError, lease_seconds: u64) -> ApiError {
        let message = error.to_string();
        let mut run = None;
        let (status, kind, retry_after) = match error {
            LoomError::UnknownAgent { .. } => (StatusCode::NOT_FOUND, "unknown_agent", None),
            LoomError::UnknownRun(_) => (StatusCode::NOT_FOUND, "unknown_run", None),
            LoomError::UnknownSession(_) => (StatusCode::NOT_FOUND, "unknown_session", None),
            LoomError::UnknownArtifact(_) => (StatusCode::NOT_FOUND, "unknown_artifact", None),
            LoomError::InvalidQuery { .. } => {
                (StatusCode::UNPROCESSABLE_ENTITY, "invalid_query", None)
            }
            LoomError::UnknownTrigger { .. } => (StatusCode::NOT_FOUND, "unknown_trigger", None),
            LoomError::Refused(_) => (StatusCode::CONFLICT, "refused", None),
            LoomError::AgentNotAllowed { .. } => (StatusCode::FORBIDDEN, "agent_not_allowed", None),
            LoomError::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", None),
            LoomError::Conflict(_) => (StatusCode::CONFLICT, "conflict", Some(lease_seconds)),
            LoomError::BudgetExhausted { retry_in, .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "budget_exhausted",
                Some(retry_in.as_secs() + u64::from(retry_in.subsec_nanos() > 0)),
            ),
            LoomError::QuotaExceeded { retry_after, .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "quota_exceeded",
                Some(whole_seconds(*retry_after)),
            ),
            LoomError::Config(_) => (StatusCode::INTERNAL_SERVER_ERROR, "config", None),
            LoomError::Registration(_) => (StatusCode::INTERNAL_SERVER_ERROR, "registration", None),
            LoomError::Journal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "journal", None),
            LoomError::Engine(_) => (StatusCode::INTERNAL_SERVER_ERROR, "engine", None),
            LoomError::Interrupted(interrupted) => {
                run = Some(Box::new(interrupted.clone()));
                (StatusCode::SERVICE_UNAVAILABLE, "interrupted", None)
            }
        };
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(%error, kind, "request failed");
        }
        ApiError {
            status,
            kind,
            message,
            retry_after: retry_after.map(|seconds| seconds.max(1)),
            run,
        }
    }

    /// The JSON body, also sent as an SSE `error` event.
    pub fn body(&self) -> serde_json::Value {
        let body = ErrorBody {
            error: ErrorDetail {
                kind: self.kind.into(),
                message: self.message.clone(),
                run_id: self.run.as_ref().map(|run| run.run_id.clone()),
                session_id: self.run.as_ref().map(|run| run.session_id.clone()),
            },
        };
        // Strings and options only: serializing cannot fail.
        serde_json::to_value(body).unwrap_or_default()
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> ApiError {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large()
        } else {
            ApiError::invalid_body(rejection.body_text())
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> ApiError {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_query",
            rejection.body_text(),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run driven elsewhere (no HTTP route can make one in a single process): 409 with the
    /// lease as `Retry-After`, classified by variant whatever the message says.
    #[test]
    fn a_claim_conflict_is_409_with_retry_after() {
        let error = LoomError::Conflict("run r1 is claimed by worker w2".into());
        let api = ApiError::from_loom(&error, 60);
        assert_eq!(
            (api.status, api.kind, api.retry_after),
            (StatusCode::CONFLICT, "conflict", Some(60))
        );
        let response = api.into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "60");

        let refused = ApiError::from_loom(&LoomError::Refused("conflict".into()), 60);
        assert_eq!((refused.kind, refused.retry_after), ("refused", None));
        let unknown = ApiError::from_loom(&LoomError::UnknownRun("refused".into()), 60);
        assert_eq!(
            (unknown.status, unknown.kind),
            (StatusCode::NOT_FOUND, "unknown_run")
        );
    }

    /// An agent outside the tenant's `tenants[].agents` is 403 like one outside the key's
    /// agents, and still a refusal for the CLI (exit code 2).
    #[test]
    fn an_agent_the_tenant_may_not_use_is_403() {
        let error = LoomError::AgentNotAllowed {
            tenant: "acme".into(),
            agent: "other".into(),
        };
        assert!(error.is_refusal());
        let api = ApiError::from_loom(&error, 60);
        assert_eq!(
            (api.status, api.kind, api.retry_after),
            (StatusCode::FORBIDDEN, "agent_not_allowed", None)
        );
        assert_eq!(
            api.message,
            "tenant 'acme' may not use the agent 'other' (tenants[].agents)"
        );
    }

    /// Bad input is 422, a conflict 409; a quota says when to retry, rounded up.
    #[test]
    fn refusals_are_split_by_kind() {
        let invalid = ApiError::from_loom(&LoomError::Invalid("run exists".into()), 60);
        assert_eq!(
            (invalid.status, invalid.kind, invalid.retry_after),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", None)
        );
        let quota = LoomError::QuotaExceeded {
            tenant: "acme".into(),
            limit: 3,
            retry_after: Duration::from_millis(12_300),
        };
        let api = ApiError::from_loom(&quota, 60);
        assert_eq!(
            (api.status, api.kind, api.retry_after),
            (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded", Some(13))
        );
        assert_eq!(
            api.message,
            "tenant 'acme': 3 runs per minute exceeded, retry in 13 s"
        );
        let trigger = LoomError::UnknownTrigger {
            name: "x".into(),
            known: Vec::new(),
        };
        let api = ApiError::from_loom(&trigger, 60);
        assert_eq!(
            (api.status, api.kind, api.message.as_str()),
            (
                StatusCode::NOT_FOUND,
                "unknown_trigger",
                "unknown trigger 'x' (no trigger is declared)"
            )
        );
        let limited = ApiError::rate_limited("k", 5, Duration::from_millis(400));
        assert_eq!(
            (limited.status, limited.retry_after),
            (StatusCode::TOO_MANY_REQUESTS, Some(1))
        );
    }
}
