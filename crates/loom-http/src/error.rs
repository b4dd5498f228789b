//! The API's errors: an HTTP status, a stable `kind`, a message, and `Retry-After` when
//! retrying later can succeed.

use axum::{
    Json,
    extract::rejection::JsonRejection,
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

/// The stable classification of an error: the `kind` of its body, which decides its HTTP
/// status. Chosen by the error's variant (a [`LoomError`] variant, or what the HTTP layer
/// refused), never by its text; the OpenAPI document lists every value.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// 404: [`LoomError::UnknownAgent`], or an agent kept off the REST API.
    UnknownAgent,
    /// 404: [`LoomError::UnknownRun`].
    UnknownRun,
    /// 404: [`LoomError::UnknownSession`].
    UnknownSession,
    /// 404: [`LoomError::UnknownArtifact`] (a session file).
    UnknownArtifact,
    /// 404: [`LoomError::UnknownApproval`]: a decision on a call no approval request waits for
    /// (or on a run where nothing waits).
    UnknownApproval,
    /// 404: [`LoomError::UnknownTrigger`].
    UnknownTrigger,
    /// 404: no such route.
    NotFound,
    /// 401: keys are declared and the request names none.
    MissingKey,
    /// 401: a key that is not declared.
    UnknownKey,
    /// 401: a key past its `expires`.
    ExpiredKey,
    /// 401: a delivery to a trigger with a `secret_env` whose signature is missing, wrong, or
    /// outside the trigger's `signature_tolerance`.
    InvalidSignature,
    /// 403: the key lacks the route's scope.
    MissingScope,
    /// 403: the API is open (no key declared) and the request's `Host` is not in
    /// `server.http.allowed_hosts` (DNS rebinding).
    HostNotAllowed,
    /// 403: the API is open and the request's `Origin` is another site's, not in
    /// `server.http.allowed_origins` (a cross-site form or script).
    OriginNotAllowed,
    /// 403: the key is limited to other agents, the tenant's `tenants[].agents` does not
    /// list the agent ([`LoomError::AgentNotAllowed`]), or the session named belongs to another
    /// agent ([`LoomError::SessionOfAnotherAgent`]).
    AgentNotAllowed,
    /// 409: [`LoomError::Refused`] (run exists, nothing to approve, a rule).
    Refused,
    /// 409 + `Retry-After`: [`LoomError::Conflict`] (the run is driven elsewhere).
    Conflict,
    /// 408: the request's body did not arrive within `server.http.body_timeout` (the
    /// connection is closed).
    RequestTimeout,
    /// 413: a body over `server.http.max_body_bytes`.
    BodyTooLarge,
    /// 400: the body of an agent's own endpoint (`POST <base_path>/agents/{name}/run` or
    /// `/stream`) that is not the expected JSON; the message names the field.
    BadRequest,
    /// 422: a body that is not the expected JSON.
    InvalidBody,
    /// 422: [`LoomError::Invalid`] (unusable id, refused attachment, delivery or payload).
    InvalidRequest,
    /// 422: an unusable query string or filter value ([`LoomError::InvalidQuery`]); the
    /// message starts with the parameter.
    InvalidQuery,
    /// 422: an unusable header (`Last-Event-ID`, a delivery id).
    InvalidHeader,
    /// 429 + `Retry-After`: [`LoomError::BudgetExhausted`].
    BudgetExhausted,
    /// 429 + `Retry-After`: [`LoomError::QuotaExceeded`] (`tenants[].quotas`).
    QuotaExceeded,
    /// 429 + `Retry-After`: the key's `rate_limit` (requests per minute).
    RateLimited,
    /// 424: [`LoomError::MissingKey`]: the journal or file is sealed (`storage.encryption`) with
    /// a key the tenant does not have (deleted, or rotated out); nothing was read or written.
    MissingEncryptionKey,
    /// 500: [`LoomError::Config`].
    Config,
    /// 500: [`LoomError::Registration`].
    Registration,
    /// 500: [`LoomError::Journal`].
    Journal,
    /// 500: [`LoomError::Engine`], or an answer that could not be written.
    Engine,
    /// 503 + `Retry-After`: [`LoomError::LimitsUnavailable`]: the shared counters
    /// (`storage.limits` `backend: redis`) cannot be reached, so a limit (a key's rate limit, a
    /// tenant's quota or budget) cannot be checked; nothing was done.
    LimitsUnavailable,
    /// 503: [`LoomError::Interrupted`]: the server shut down before the run closed; the body
    /// also names `run_id` and `session_id` (the run resumes at the next start).
    Interrupted,
    /// 503 + `Retry-After`: [`LoomError::Queue`]: the job queue could not take the job (what
    /// was journaled before stays).
    QueueUnavailable,
}

impl ErrorKind {
    /// The kind as written in the body (`unknown_run`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::UnknownAgent => "unknown_agent",
            ErrorKind::UnknownRun => "unknown_run",
            ErrorKind::UnknownSession => "unknown_session",
            ErrorKind::UnknownArtifact => "unknown_artifact",
            ErrorKind::UnknownApproval => "unknown_approval",
            ErrorKind::UnknownTrigger => "unknown_trigger",
            ErrorKind::NotFound => "not_found",
            ErrorKind::MissingKey => "missing_key",
            ErrorKind::UnknownKey => "unknown_key",
            ErrorKind::ExpiredKey => "expired_key",
            ErrorKind::InvalidSignature => "invalid_signature",
            ErrorKind::MissingScope => "missing_scope",
            ErrorKind::HostNotAllowed => "host_not_allowed",
            ErrorKind::OriginNotAllowed => "origin_not_allowed",
            ErrorKind::AgentNotAllowed => "agent_not_allowed",
            ErrorKind::Refused => "refused",
            ErrorKind::Conflict => "conflict",
            ErrorKind::RequestTimeout => "request_timeout",
            ErrorKind::BodyTooLarge => "body_too_large",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::InvalidBody => "invalid_body",
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::InvalidQuery => "invalid_query",
            ErrorKind::InvalidHeader => "invalid_header",
            ErrorKind::BudgetExhausted => "budget_exhausted",
            ErrorKind::QuotaExceeded => "quota_exceeded",
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::MissingEncryptionKey => "missing_encryption_key",
            ErrorKind::Config => "config",
            ErrorKind::Registration => "registration",
            ErrorKind::Journal => "journal",
            ErrorKind::Engine => "engine",
            ErrorKind::LimitsUnavailable => "limits_unavailable",
            ErrorKind::Interrupted => "interrupted",
            ErrorKind::QueueUnavailable => "queue_unavailable",
        }
    }

    /// The HTTP status of the kind.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorKind::UnknownAgent
            | ErrorKind::UnknownRun
            | ErrorKind::UnknownSession
            | ErrorKind::UnknownArtifact
            | ErrorKind::UnknownApproval
            | ErrorKind::UnknownTrigger
            | ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::MissingKey
            | ErrorKind::UnknownKey
            | ErrorKind::ExpiredKey
            | ErrorKind::InvalidSignature => StatusCode::UNAUTHORIZED,
            ErrorKind::MissingScope
            | ErrorKind::HostNotAllowed
            | ErrorKind::OriginNotAllowed
            | ErrorKind::AgentNotAllowed => StatusCode::FORBIDDEN,
            ErrorKind::Refused | ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
            ErrorKind::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::InvalidBody
            | ErrorKind::InvalidRequest
            | ErrorKind::InvalidQuery
            | ErrorKind::InvalidHeader => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorKind::BudgetExhausted | ErrorKind::QuotaExceeded | ErrorKind::RateLimited => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ErrorKind::MissingEncryptionKey => StatusCode::FAILED_DEPENDENCY,
            ErrorKind::Config
            | ErrorKind::Registration
            | ErrorKind::Journal
            | ErrorKind::Engine => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorKind::Interrupted | ErrorKind::QueueUnavailable | ErrorKind::LimitsUnavailable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error answered as `{"error": {"kind": ..., "message": ...}}`, with the status of its
/// [`ErrorKind`].
///
/// A server error (status 500: `config`, `registration`, `journal`, `engine`) never answers
/// its detail, which may name files and internals: the detail is logged at ERROR with an
/// `error_id`, and the client reads a generic message and that id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ApiError {
    /// Stable classification (it decides the status).
    pub kind: ErrorKind,
    /// What went wrong, for a human (generic for a server error).
    pub message: String,
    /// Seconds after which retrying can succeed (`Retry-After`).
    pub retry_after: Option<u64>,
    /// The run an `interrupted` error is about (its `run_id` and `session_id` are in the body).
    pub run: Option<Box<RunRef>>,
    /// A server error only: the id its detail was logged under.
    pub error_id: Option<String>,
}

impl ApiError {
    /// An error without `Retry-After`. For a server error (status 500) `message` is logged,
    /// not answered (see [`ApiError`]).
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ApiError {
        let message = message.into();
        if kind.status() == StatusCode::INTERNAL_SERVER_ERROR {
            return ApiError::server(kind, &message);
        }
        ApiError {
            kind,
            message,
            retry_after: None,
            run: None,
            error_id: None,
        }
    }

    /// A server error: `detail` is logged at ERROR under a new id, and the answer says only
    /// the kind and that id.
    pub(crate) fn server(kind: ErrorKind, detail: &dyn std::fmt::Display) -> ApiError {
        let id = uuid::Uuid::now_v7().to_string();
        tracing::error!(error_id = %id, %kind, error = %detail, "request failed");
        ApiError {
            kind,
            message: format!(
                "internal error ({kind}): the server logged its detail under the id {id}"
            ),
            retry_after: None,
            run: None,
            error_id: Some(id),
        }
    }

    /// A request body the API cannot use (422).
    pub fn invalid_body(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::InvalidBody, message)
    }

    /// A request body over `server.http.max_body_bytes` (413).
    pub fn too_large() -> ApiError {
        ApiError::new(
            ErrorKind::BodyTooLarge,
            "the request body is larger than server.http.max_body_bytes",
        )
    }

    /// A key over its `rate_limit` (429): `retry_after` until one of its requests leaves the
    /// sliding minute.
    pub fn rate_limited(key: &str, per_minute: u32, retry_after: Duration) -> ApiError {
        let seconds = whole_seconds(retry_after);
        ApiError {
            kind: ErrorKind::RateLimited,
            message: format!(
                "key '{key}': {per_minute} requests per minute exceeded, retry in {seconds} s"
            ),
            retry_after: Some(seconds),
            run: None,
            error_id: None,
        }
    }

    /// The error answered for `error`; `lease_seconds` is the run lease, after which a run
    /// driven elsewhere can be claimed again.
    pub fn from_loom(error: &LoomError, lease_seconds: u64) -> ApiError {
        let mut run = None;
        let (kind, retry_after) = match error {
            LoomError::UnknownAgent { .. } => (ErrorKind::UnknownAgent, None),
            LoomError::UnknownRun(_) => (ErrorKind::UnknownRun, None),
            LoomError::UnknownSession(_) => (ErrorKind::UnknownSession, None),
            LoomError::UnknownArtifact(_) => (ErrorKind::UnknownArtifact, None),
            LoomError::UnknownApproval(_) => (ErrorKind::UnknownApproval, None),
            LoomError::InvalidQuery { .. } => (ErrorKind::InvalidQuery, None),
            LoomError::UnknownTrigger { .. } => (ErrorKind::UnknownTrigger, None),
            LoomError::Refused(_) => (ErrorKind::Refused, None),
            LoomError::AgentNotAllowed { .. } | LoomError::SessionOfAnotherAgent { .. } => {
                (ErrorKind::AgentNotAllowed, None)
            }
            LoomError::Invalid(_) => (ErrorKind::InvalidRequest, None),
            LoomError::Conflict(_) => (ErrorKind::Conflict, Some(lease_seconds)),
            LoomError::BudgetExhausted { retry_in, .. } => {
                (ErrorKind::BudgetExhausted, Some(whole_seconds(*retry_in)))
            }
            LoomError::QuotaExceeded { retry_after, .. } => {
                (ErrorKind::QuotaExceeded, Some(whole_seconds(*retry_after)))
            }
            LoomError::MissingKey { .. } => (ErrorKind::MissingEncryptionKey, None),
            LoomError::LimitsUnavailable { .. } => (
                ErrorKind::LimitsUnavailable,
                Some(whole_seconds(loom_ia::LIMITS_RETRY_AFTER)),
            ),
            LoomError::Config(_) => (ErrorKind::Config, None),
            LoomError::Registration(_) => (ErrorKind::Registration, None),
            LoomError::Journal(_) => (ErrorKind::Journal, None),
            LoomError::Engine(_) => (ErrorKind::Engine, None),
            LoomError::Interrupted(interrupted) => {
                run = Some(Box::new(interrupted.clone()));
                (ErrorKind::Interrupted, None)
            }
            LoomError::Queue(_) => (ErrorKind::QueueUnavailable, Some(5)),
        };
        if kind.status() == StatusCode::INTERNAL_SERVER_ERROR {
            return ApiError::server(kind, error);
        }
        ApiError {
            kind,
            message: error.to_string(),
            retry_after: retry_after.map(|seconds| seconds.max(1)),
            run,
            error_id: None,
        }
    }

    /// The JSON body, also sent as an SSE `error` event.
    pub fn body(&self) -> serde_json::Value {
        let body = ErrorBody {
            error: ErrorDetail {
                kind: self.kind,
                message: self.message.clone(),
                run_id: self.run.as_ref().map(|run| run.run_id.clone()),
                session_id: self.run.as_ref().map(|run| run.session_id.clone()),
                error_id: self.error_id.clone(),
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

/// What every `401` answers in `WWW-Authenticate` (RFC 9110): the API's scheme.
pub(crate) const CHALLENGE: &str = "Bearer";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.kind.status();
        let mut response = (status, Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(CHALLENGE),
            );
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
            (api.kind.status(), api.kind.as_str(), api.retry_after),
            (StatusCode::CONFLICT, "conflict", Some(60))
        );
        let response = api.into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "60");

        let refused = ApiError::from_loom(&LoomError::Refused("conflict".into()), 60);
        assert_eq!(
            (refused.kind.as_str(), refused.retry_after),
            ("refused", None)
        );
        let unknown = ApiError::from_loom(&LoomError::UnknownRun("refused".into()), 60);
        assert_eq!(
            (unknown.kind.status(), unknown.kind.as_str()),
            (StatusCode::NOT_FOUND, "unknown_run")
        );
    }

    /// Shared limits that cannot be reached are 503 with `Retry-After`, saying which limit,
    /// and neither a server error nor a refusal.
    #[test]
    fn unavailable_limits_are_503_with_retry_after() {
        let error = LoomError::limits_unavailable(
            "the quota of tenant 'acme'",
            &loom_ia::core::counters::CounterError::Unavailable("connection refused".into()),
        );
        assert!(!error.is_internal() && !error.is_refusal());
        let api = ApiError::from_loom(&error, 60);
        assert_eq!(
            (api.kind.status(), api.kind.as_str(), api.retry_after),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "limits_unavailable",
                Some(5)
            )
        );
        assert!(
            api.message.contains("the quota of tenant 'acme'"),
            "{}",
            api.message
        );
        let response = api.into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "5");
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
            (api.kind.status(), api.kind.as_str(), api.retry_after),
            (StatusCode::FORBIDDEN, "agent_not_allowed", None)
        );
        assert_eq!(
            api.message,
            "tenant 'acme' may not use the agent 'other' (tenants[].agents)"
        );
    }

    /// A sealed journal whose key the tenant lacks is 424, says the tenant and the key id, and
    /// is a refusal for the CLI (exit code 2), not a server error.
    #[test]
    fn a_missing_encryption_key_is_424_naming_the_tenant_and_key() {
        let error = LoomError::from(loom_ia::core::ports::StoreError::MissingKey {
            tenant_id: "acme".into(),
            key_id: "4ed42d1a2576".into(),
            reason: "'journal_key' is not set".into(),
        });
        assert!(error.is_refusal() && !error.is_internal());
        let api = ApiError::from_loom(&error, 60);
        assert_eq!(
            (
                api.kind.status(),
                api.kind.as_str(),
                api.error_id.as_deref()
            ),
            (
                StatusCode::FAILED_DEPENDENCY,
                "missing_encryption_key",
                None
            )
        );
        assert_eq!(
            api.message,
            "sealed journal: tenant 'acme' has no key 4ed42d1a2576: 'journal_key' is not set"
        );
    }

    /// Bad input is 422, a conflict 409; a quota says when to retry, rounded up.
    #[test]
    fn refusals_are_split_by_kind() {
        let invalid = ApiError::from_loom(&LoomError::Invalid("run exists".into()), 60);
        assert_eq!(
            (
                invalid.kind.status(),
                invalid.kind.as_str(),
                invalid.retry_after
            ),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", None)
        );
        let quota = LoomError::QuotaExceeded {
            tenant: "acme".into(),
            limit: 3,
            retry_after: Duration::from_millis(12_300),
        };
        let api = ApiError::from_loom(&quota, 60);
        assert_eq!(
            (api.kind.status(), api.kind.as_str(), api.retry_after),
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
            (api.kind.status(), api.kind.as_str(), api.message.as_str()),
            (
                StatusCode::NOT_FOUND,
                "unknown_trigger",
                "unknown trigger 'x' (no trigger is declared)"
            )
        );
        let limited = ApiError::rate_limited("k", 5, Duration::from_millis(400));
        assert_eq!(
            (limited.kind.status(), limited.retry_after),
            (StatusCode::TOO_MANY_REQUESTS, Some(1))
        );
    }

    /// A server error answers neither its detail nor a file path: the detail is logged under
    /// the id the answer gives.
    #[test]
    fn a_server_error_answers_an_id_not_its_detail() {
        let error = LoomError::Journal(loom_ia::core::ports::StoreError::Io {
            path: "/srv/loom/journal/acme/s-1.jsonl".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        });
        let api = ApiError::from_loom(&error, 60);
        assert_eq!(api.kind, ErrorKind::Journal);
        let id = api.error_id.clone().unwrap();
        let body = api.body();
        assert!(!body.to_string().contains("/srv/loom"), "{body}");
        assert_eq!(body["error"]["error_id"], id.as_str());
        assert_eq!(
            body["error"]["message"],
            format!("internal error (journal): the server logged its detail under the id {id}")
        );
        let engine = ApiError::new(ErrorKind::Engine, "panicked at /home/me/src/tool.rs:3");
        assert!(!engine.message.contains("/home/me"), "{}", engine.message);
        assert!(engine.error_id.is_some());
        assert_eq!(
            ApiError::new(ErrorKind::NotFound, "no route").error_id,
            None
        );
    }

    /// Every 401 says the scheme to authenticate with; other statuses do not.
    #[test]
    fn every_401_carries_www_authenticate_bearer() {
        for kind in [
            ErrorKind::MissingKey,
            ErrorKind::UnknownKey,
            ErrorKind::ExpiredKey,
            ErrorKind::InvalidSignature,
        ] {
            let response = ApiError::new(kind, "refused").into_response();
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
            assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
        }
        let forbidden = ApiError::new(ErrorKind::MissingScope, "no").into_response();
        assert!(forbidden.headers().get(header::WWW_AUTHENTICATE).is_none());
    }

    /// A decision on a call nothing waits for is 404, like an unknown run; an expired request
    /// stays a 409.
    #[test]
    fn an_unknown_approval_is_404() {
        let api = ApiError::from_loom(&LoomError::UnknownApproval("run r: no approval".into()), 60);
        assert_eq!(
            (api.kind.status(), api.kind.as_str()),
            (StatusCode::NOT_FOUND, "unknown_approval")
        );
        assert!(LoomError::UnknownApproval(String::new()).is_refusal());
    }

    /// Each kind is written in the body as `as_str` says, and the OpenAPI document lists every
    /// kind (utoipa reads the enum itself, so a new kind cannot be left out of it).
    #[test]
    fn every_kind_is_written_as_named_and_documented() {
        use utoipa::PartialSchema;
        let schema = serde_json::to_value(ErrorKind::schema()).unwrap();
        let documented: Vec<&str> = schema["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(documented.len(), 35, "{schema}");
        assert!(documented.contains(&"bad_request"), "{schema}");
        assert!(documented.contains(&"limits_unavailable"), "{schema}");
        assert!(documented.contains(&"missing_encryption_key"), "{schema}");
        for name in &documented {
            let kind: ErrorKind = serde_json::from_value(serde_json::json!(name))
                .unwrap_or_else(|_| panic!("{name} is not a kind"));
            assert_eq!(kind.as_str(), *name);
            assert_eq!(serde_json::to_value(kind).unwrap(), **name);
        }
    }
}
