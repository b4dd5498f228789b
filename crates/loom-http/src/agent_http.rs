//! An agent's own endpoints, beside `/v1`: for each agent that opts in (`expose.http: {enabled:
//! true, auth, allow_anonymous, heartbeat_ms}`), `POST <base_path>/agents/{name}/run` answers
//! the run's result as JSON and `POST <base_path>/agents/{name}/stream` streams it as
//! Server-Sent Events ([`crate::agent_stream`]); `<base_path>/health` and `<base_path>/ready`
//! are the liveness and readiness of `/v1/healthz` and `/v1/readyz` ([`crate::health`]).
//!
//! **Who may call.** `auth: keys` (the default) authenticates with the server's API keys
//! (`security.api_keys`, as on `/v1`: `Authorization: Bearer lk_…` or `X-API-Key`): the key
//! decides the tenant, needs the scope `run` (and `read_content` for the stream, whose events
//! are content) and must be allowed on the agent. With `allow_anonymous: true`, a request
//! without a key is served for the tenant `default` (a key presented is still checked);
//! `auth: none` ignores keys and serves anyone (it needs `allow_anonymous: true`). An agent
//! that opts in without a usable authenticator and without `allow_anonymous` is refused when
//! the configuration loads (`loom-config`). [`log_mounts`] logs each mount once at WARN with
//! its security state.
//!
//! **Errors.** An agent that does not exist or did not opt in is a 404 `unknown_agent`; a body
//! that is not `{"message": "…", …}` is a 400 `bad_request` naming the field; the rest is as
//! on `/v1` (401 without a usable key, 403 for a scope or an agent the key lacks, 413, 429…),
//! always the JSON error body.

use axum::{
    Json,
    body::Bytes,
    extract::{Path, State, rejection::BytesRejection},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use loom_ia::{
    Loom, Redact, RunOptions,
    config::{HttpAuth, HttpExpose, Scope},
};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::{
    AppState,
    auth::Caller,
    error::{ApiError, ErrorKind},
    routes::loom_error,
};

/// The body of `POST <base_path>/agents/{name}/run` and `/stream`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentRequest {
    /// The user's message (not empty).
    pub(crate) message: String,
    /// Continue this session; default: a new session named after the run.
    #[serde(default)]
    pub(crate) session_id: Option<String>,
    /// Choose the run id; default: a UUIDv7.
    #[serde(default)]
    pub(crate) run_id: Option<String>,
    /// Who the run is for (journaled).
    #[serde(default)]
    pub(crate) user_id: Option<String>,
    /// Free metadata, journaled with the run.
    #[serde(default)]
    pub(crate) metadata: Option<Map<String, Value>>,
    /// Session-state values (keys the agent declares in `state:`).
    #[serde(default)]
    pub(crate) state: Option<Map<String, Value>>,
}

impl AgentRequest {
    /// The run options of the request, for `caller`'s tenant.
    pub(crate) fn options(&mut self, caller: &Caller) -> RunOptions {
        RunOptions {
            session_id: self.session_id.take(),
            run_id: self.run_id.take(),
            user_id: self.user_id.take(),
            metadata: self.metadata.take().unwrap_or_default(),
            state: self.state.take().unwrap_or_default(),
            tenant_id: Some(caller.tenant.clone()),
            ..RunOptions::default()
        }
    }
}

/// The `expose.http` of `name`, when it exists and opted in; else a 404 `unknown_agent`.
pub(crate) fn exposed(loom: &Loom, name: &str) -> Result<HttpExpose, ApiError> {
    loom.config()
        .agent(name)
        .and_then(|spec| spec.expose.http_endpoints())
        .ok_or_else(|| {
            ApiError::new(
                ErrorKind::UnknownAgent,
                format!(
                    "unknown agent '{name}': no agent of that name has HTTP endpoints (expose.http)"
                ),
            )
        })
}

/// Who calls the endpoints of `agent` with these headers (see the module's doc): checked
/// against `scopes` and the agent.
pub(crate) async fn caller(
    state: &AppState,
    agent: &str,
    http: &HttpExpose,
    headers: &HeaderMap,
    scopes: &[Scope],
) -> Result<Caller, ApiError> {
    let keys_apply = http.auth == HttpAuth::Keys && !state.keys.is_open();
    let caller = if keys_apply && (Caller::presents_key(headers) || !http.allow_anonymous) {
        state.keys.caller(headers).await?
    } else if http.allow_anonymous {
        Caller::anonymous()
    } else {
        // The configuration refuses an agent without authenticator or anonymous callers.
        return Err(ApiError::new(
            ErrorKind::MissingKey,
            format!("the endpoints of the agent '{agent}' have no usable authenticator"),
        ));
    };
    for scope in scopes {
        caller.require(*scope)?;
    }
    caller.agent(agent)?;
    Ok(caller)
}

/// The request body: JSON `{"message": "…", …}`, else a 400 naming the field.
pub(crate) fn request(body: Result<Bytes, BytesRejection>) -> Result<AgentRequest, ApiError> {
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large()
        } else {
            ApiError::new(ErrorKind::BadRequest, rejection.body_text())
        }
    })?;
    let mut json = serde_json::Deserializer::from_slice(&body);
    let request: AgentRequest = serde_path_to_error::deserialize(&mut json).map_err(|error| {
        let path = error.path().to_string();
        let message = if path == "." {
            format!(
                "the body must be a JSON object {{\"message\": \"…\"}}: {}",
                error.inner()
            )
        } else {
            format!("{path}: {}", error.inner())
        };
        ApiError::new(ErrorKind::BadRequest, message)
    })?;
    json.end().map_err(|error| {
        ApiError::new(
            ErrorKind::BadRequest,
            format!("the body must hold one JSON object: {error}"),
        )
    })?;
    if request.message.trim().is_empty() {
        return Err(ApiError::new(
            ErrorKind::BadRequest,
            "message: must not be empty",
        ));
    }
    Ok(request)
}

/// `POST <base_path>/agents/{name}/run`: the run's result once it closes or pauses, `200`
/// (`RunResult` as `/v1` answers it: `run_id`, `status`, `text`, `usage`, `cost_usd`…; its
/// content fields masked without `read_content`).
pub(crate) async fn run(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let http = exposed(&state.loom, &name)?;
    let caller = caller(&state, &name, &http, &headers, &[Scope::Run]).await?;
    let mut request = request(body)?;
    let options = request.options(&caller);
    let loom = &state.loom;
    // Driven in a task of its own: a client that goes away does not take the run with it.
    let driving = {
        let loom = loom.clone();
        tokio::spawn(async move { loom.run(&name, request.message, options).await })
    };
    let result = driving
        .await
        .map_err(|e| {
            ApiError::new(
                ErrorKind::Engine,
                format!("the run's task ended abnormally: {e}"),
            )
        })?
        .map_err(|e| loom_error(loom, &e))?;
    Ok(Json(result.view(caller.reads_content())).into_response())
}

/// The security state of an agent's endpoints, as logged when they are mounted.
fn security_state(loom: &Loom, http: &HttpExpose) -> &'static str {
    let keys = http.auth == HttpAuth::Keys && !loom.config().raw().security.api_keys.is_empty();
    match (keys, http.allow_anonymous) {
        (true, false) => "authenticated: API key required",
        (true, true) => "anonymous: no key required (a key presented is checked)",
        (false, _) => "anonymous: no authenticator, anyone may run the agent",
    }
}

/// Logs each agent's endpoints once at WARN (`agent exposed`, `access = "http"`), with their
/// security state, beside the `rest` and `mcp` exposures (called when the server starts).
pub(crate) fn log_mounts(loom: &Loom, base_path: &str) {
    for agent in loom.config().agents() {
        let Some(http) = agent.expose.http_endpoints() else {
            continue;
        };
        tracing::warn!(
            agent = %agent.name,
            access = "http",
            security = security_state(loom, &http),
            endpoints = %format!("{base_path}/agents/{}/{{run,stream}}", agent.name),
            heartbeat_ms = http.heartbeat_ms(),
            "agent exposed"
        );
    }
}
