//! API keys (`security.api_keys`): who calls, for which tenant, with which scopes.
//!
//! Without any declared key the API is open: every request acts for the tenant `default` with
//! every scope. With keys, every `/v1` route needs one, in `Authorization: Bearer lk_…` or
//! `X-API-Key`; the key alone decides the tenant (nothing in a body or a query can change it),
//! its scopes decide what it may do and its `agents` which agents it may use. A key with a
//! `rate_limit` may make that many requests per sliding minute, counted in `storage.limits` (in
//! this server's memory, or in Redis for every server of the service, one window per key id);
//! over it, requests are refused with 429 and `Retry-After`, and when the shared counters cannot
//! be reached with 503 `limits_unavailable` (never let through uncounted).

use std::sync::Arc;

use axum::{
    extract::FromRequestParts,
    http::{HeaderMap, request::Parts},
};
use chrono::Utc;
use loom_ia::{
    LoomError, RunRef,
    config::{ApiKeySpec, DEFAULT_TENANT, Scope},
    core::counters::{Counters, Taken},
    quota::WINDOW,
};
use sha2::{Digest, Sha256};

use crate::{
    AppState,
    error::{ApiError, ErrorKind},
    routes::loom_error,
};

/// The declared keys, by the hash the configuration stores, and the counters of the requests
/// of the last minute of those with a `rate_limit` (window `rate:<key id>`).
#[derive(Debug)]
pub(crate) struct Keys {
    keys: Vec<ApiKeySpec>,
    requests: Arc<dyn Counters>,
}

impl Keys {
    pub(crate) fn new(keys: &[ApiKeySpec], requests: Arc<dyn Counters>) -> Keys {
        Keys {
            keys: keys.to_vec(),
            requests,
        }
    }

    /// Whether no key is declared: the API is open.
    pub(crate) fn is_open(&self) -> bool {
        self.keys.is_empty()
    }

    /// Who makes a request with these headers.
    pub(crate) async fn caller(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        if self.keys.is_empty() {
            return Ok(Caller {
                tenant: DEFAULT_TENANT.to_owned(),
                key: None,
            });
        }
        let presented = presented_key(headers).ok_or_else(|| {
            ApiError::new(
                ErrorKind::MissingKey,
                "API key missing: send the header 'Authorization: Bearer …' or 'X-API-Key'",
            )
        })?;
        let hash = key_hash(&presented);
        let Some(key) = self.keys.iter().find(|k| k.hash == hash) else {
            tracing::warn!("request refused: unknown API key");
            return Err(ApiError::new(ErrorKind::UnknownKey, "API key refused"));
        };
        if let Some(at) = key.expires_at()
            && at <= Utc::now()
        {
            tracing::warn!(key = %key.id, "request refused: expired API key");
            return Err(ApiError::new(
                ErrorKind::ExpiredKey,
                format!(
                    "key '{}' expired on {}",
                    key.id,
                    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
            ));
        }
        if let Some(limit) = key.rate_limit {
            let taken = self
                .requests
                .take(&format!("rate:{}", key.id), limit.per_minute, WINDOW)
                .await
                .map_err(|error| {
                    tracing::error!(key = %key.id, %error, "request refused: the rate limit of the API key cannot be counted");
                    let error = LoomError::limits_unavailable(
                        format!("the rate limit of key '{}'", key.id),
                        &error,
                    );
                    ApiError::from_loom(&error, 0)
                })?;
            if let Taken::Full { retry_after } = taken {
                tracing::warn!(key = %key.id, "request refused: rate limit of the API key reached");
                return Err(ApiError::rate_limited(
                    &key.id,
                    limit.per_minute,
                    retry_after,
                ));
            }
        }
        Ok(Caller {
            tenant: key.tenant.clone(),
            key: Some(Arc::new(key.clone())),
        })
    }
}

/// `sha256:<hex>` of an API key, as `security.api_keys[].hash` stores it (what `loom keys
/// create` prints, and what a presented key is compared by).
pub fn key_hash(key: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(key.as_bytes())))
}

/// The key of `Authorization: Bearer <key>` (scheme case-insensitive), else of `X-API-Key`.
fn presented_key(headers: &HeaderMap) -> Option<String> {
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        })
        .filter(|k| !k.is_empty());
    let header = || {
        headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|k| !k.is_empty())
    };
    bearer.or_else(header).map(str::to_owned)
}

/// Who makes the request: its tenant, and its key (`None`: the API is open, every scope).
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    /// The tenant every run of the request is opened and looked up in.
    pub(crate) tenant: String,
    key: Option<Arc<ApiKeySpec>>,
}

impl Caller {
    /// A caller without a key, for the tenant `default`: what an agent's own endpoint serves
    /// when it allows anonymous callers (`expose.http.allow_anonymous`).
    pub(crate) fn anonymous() -> Caller {
        Caller {
            tenant: DEFAULT_TENANT.to_owned(),
            key: None,
        }
    }

    /// Whether the request's headers present a key (`Authorization: Bearer …` or
    /// `X-API-Key`), valid or not.
    pub(crate) fn presents_key(headers: &HeaderMap) -> bool {
        presented_key(headers).is_some()
    }

    /// The key of the request (`None`: the API is open).
    pub(crate) fn key(&self) -> Option<&Arc<ApiKeySpec>> {
        self.key.as_ref()
    }

    /// 403 unless the caller has `scope`.
    pub(crate) fn require(&self, scope: Scope) -> Result<(), ApiError> {
        match &self.key {
            Some(key) if !key.allows(scope) => Err(ApiError::new(
                ErrorKind::MissingScope,
                format!("key '{}' lacks the scope '{scope}'", key.id),
            )),
            _ => Ok(()),
        }
    }

    /// Whether the caller may use `agent`.
    pub(crate) fn allows_agent(&self, agent: &str) -> bool {
        self.key.as_ref().is_none_or(|key| key.allows_agent(agent))
    }

    /// Whether the caller may read content fields (`read_content`; an open API may).
    pub(crate) fn reads_content(&self) -> bool {
        self.key
            .as_ref()
            .is_none_or(|key| key.allows(Scope::ReadContent))
    }

    /// The agents the caller is limited to, when its key names some.
    pub(crate) fn agent_limit(&self) -> Option<&[String]> {
        self.key
            .as_ref()
            .map(|key| key.agents.as_slice())
            .filter(|agents| !agents.is_empty())
    }

    /// 403 unless the caller may use `agent`.
    pub(crate) fn agent(&self, agent: &str) -> Result<(), ApiError> {
        match &self.key {
            Some(key) if !key.allows_agent(agent) => Err(ApiError::new(
                ErrorKind::AgentNotAllowed,
                format!("key '{}' is not allowed on the agent '{agent}'", key.id),
            )),
            _ => Ok(()),
        }
    }

    /// The run `run_id` as the read routes address it (`GET /runs/{run_id}`, its events, its
    /// trace), as Loom-IA does: in the session `session` names, else in the session named after
    /// the run (where a run opened without a session lives). A run of a named session asked
    /// without its session is unknown (404), even though the run index could find it.
    pub(crate) async fn addressed_run(
        &self,
        state: &AppState,
        run_id: &str,
        session: Option<&str>,
    ) -> Result<RunRef, ApiError> {
        let loom = &state.loom;
        let run = loom
            .address(run_id, session, Some(&self.tenant))
            .await
            .map_err(|e| loom_error(loom, &e))?;
        self.sees(state, run).await
    }

    /// The run `run_id` of the caller's tenant, checked against the key's agents: in `session`
    /// when given, else wherever the journal's run index finds it (the decisions and the
    /// cancellation, whose bodies need not name the session).
    pub(crate) async fn run(
        &self,
        state: &AppState,
        run_id: &str,
        session: Option<&str>,
    ) -> Result<RunRef, ApiError> {
        let loom = &state.loom;
        let run = loom
            .locate(run_id, session, Some(&self.tenant))
            .await
            .map_err(|e| loom_error(loom, &e))?;
        self.sees(state, run).await
    }

    /// `run`, when the caller's key may use its agent.
    async fn sees(&self, state: &AppState, run: RunRef) -> Result<RunRef, ApiError> {
        let loom = &state.loom;
        if self.key.as_ref().is_some_and(|key| !key.agents.is_empty()) {
            let agent = loom
                .state(&run)
                .await
                .map_err(|e| loom_error(loom, &e))?
                .agent
                .unwrap_or_default();
            self.agent(&agent)?;
        }
        Ok(run)
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, ApiError> {
        state.keys.caller(&parts.headers).await
    }
}
