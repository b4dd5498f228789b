//! The `/v1` routes: agents, runs, decisions, cancellation, webhooks; the read routes of
//! [`crate::search`] and [`crate::sessions`] are merged in.

use axum::{
    Json, Router,
    body::Bytes,
    extract::{
        Path, Query, State,
        rejection::{BytesRejection, JsonRejection, QueryRejection},
    },
    http::{StatusCode, Uri},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use loom_ia::{JudgeMode, Loom, LoomError, Redact, RunOptions, RunRef};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use loom_ia::config::Scope;

use crate::{AppState, auth::Caller, error::ApiError, upload::RunBody};

/// Who decides or cancels when the request does not say.
const DEFAULT_BY: &str = "api";

pub(crate) fn v1() -> Router<AppState> {
    Router::new()
        .route("/agents", get(agents))
        .route("/agents/{name}/runs", post(create_run))
        .route("/runs/{run_id}", get(run_result))
        .route("/runs/{run_id}/events", get(crate::sse::events))
        .route("/runs/{run_id}/approve", post(approve))
        .route("/runs/{run_id}/reject", post(reject))
        .route("/runs/{run_id}/cancel", post(cancel))
        .merge(crate::search::routes())
        .merge(crate::sessions::routes())
        .route("/hooks/{name}", post(crate::hooks::deliver))
}

/// No route matched.
pub(crate) async fn not_found(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no route for {}", uri.path()),
    )
}

/// The run lease in whole seconds: how long a run driven elsewhere stays claimed.
pub(crate) fn lease_seconds(loom: &Loom) -> u64 {
    let lease = loom.config().raw().execution.lease;
    if lease.is_finite() && lease > 0.0 {
        // A finite positive lease in seconds fits: configs are checked at load.
        lease.ceil().min(u64::MAX as f64) as u64
    } else {
        1
    }
}

pub(crate) fn loom_error(loom: &Loom, error: &LoomError) -> ApiError {
    ApiError::from_loom(error, lease_seconds(loom))
}

/// `GET /agents`: the agents published on the REST API that the caller's tenant and key may
/// use.
async fn agents(State(state): State<AppState>, caller: Caller) -> Result<Json<Value>, ApiError> {
    caller.require(Scope::Read)?;
    let config = state.loom.config();
    let tenant = config.tenant(&caller.tenant);
    let agents: Vec<Value> = config
        .agents()
        .iter()
        .filter(|agent| agent.expose.rest)
        .filter(|agent| caller.allows_agent(&agent.name))
        .filter(|agent| tenant.is_none_or(|t| t.allows_agent(&agent.name)))
        .map(|agent| json!({"name": agent.name, "description": agent.description}))
        .collect();
    Ok(Json(Value::Array(agents)))
}

/// `POST /agents/{name}/runs`: a JSON body, or the same fields in a `multipart/form-data` body
/// with files in `attachments` parts (see [`crate::upload`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunRequest {
    message: String,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    run_id: Option<String>,
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
    #[serde(default)]
    judges: Option<String>,
    #[serde(default)]
    background: bool,
}

async fn create_run(
    State(state): State<AppState>,
    caller: Caller,
    Path(agent): Path<String>,
    body: Result<RunBody<RunRequest>, ApiError>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Run)?;
    // An agent kept off the REST API (`expose.rest: false`) is unknown here.
    if state
        .loom
        .config()
        .agent(&agent)
        .is_some_and(|spec| !spec.expose.rest)
    {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_agent",
            format!("unknown agent '{agent}'"),
        ));
    }
    caller.agent(&agent)?;
    let RunBody { request, uploads } = body?;
    if request.message.is_empty() {
        return Err(ApiError::invalid_body("message must not be empty"));
    }
    let judges = match request.judges.as_deref() {
        None => JudgeMode::Auto,
        Some(text) => text
            .parse::<JudgeMode>()
            .map_err(|_| ApiError::invalid_body("judges must be auto, force or skip"))?,
    };
    if judges == JudgeMode::Skip {
        // Skipping the judges lowers the guard on the answer: only an admin key may.
        caller.require(Scope::Admin)?;
    }
    let loom = &state.loom;
    let attachments = uploads
        .into_iter()
        .map(|upload| loom.attachment(upload.name, upload.bytes, upload.media_type.as_deref()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| loom_error(loom, &e))?;
    let options = RunOptions {
        session_id: request.session_id,
        run_id: request.run_id,
        user_id: request.user_id,
        metadata: request.metadata.unwrap_or_default(),
        judges,
        tenant_id: Some(caller.tenant.clone()),
        attachments,
        ..RunOptions::default()
    };
    if request.background {
        let run = loom
            .submit(&agent, request.message, options)
            .await
            .map_err(|e| loom_error(loom, &e))?;
        let status = loom
            .result(&run)
            .await
            .map_err(|e| loom_error(loom, &e))?
            .status;
        let body = json!({"run_id": run.run_id, "session_id": run.session_id, "status": status});
        return Ok((StatusCode::ACCEPTED, Json(body)).into_response());
    }
    let result = loom
        .run(&agent, request.message, options)
        .await
        .map_err(|e| loom_error(loom, &e))?;
    Ok((StatusCode::CREATED, Json(result)).into_response())
}

/// `?session_id=` of the run routes.
#[derive(Debug, Deserialize)]
struct At {
    #[serde(default)]
    session_id: Option<String>,
}

async fn run_result(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    query: Result<Query<At>, QueryRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    let Query(at) = query?;
    let loom = &state.loom;
    let run = caller
        .run(&state, &run_id, at.session_id.as_deref())
        .await?;
    let result = loom.result(&run).await.map_err(|e| loom_error(loom, &e))?;
    Ok(Json(result.view(caller.reads_content())).into_response())
}

/// `POST /runs/{run_id}/approve` and `/reject`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionRequest {
    #[serde(default)]
    call_id: Option<String>,
    #[serde(default)]
    by: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default)]
    session_id: Option<String>,
}

async fn approve(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    body: Result<Json<DecisionRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Approve)?;
    let Json(request) = body?;
    decide(&state, &caller, &run_id, request, true).await
}

async fn reject(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    body: Result<Json<DecisionRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Approve)?;
    let Json(request) = body?;
    if request.arguments.is_some() {
        return Err(ApiError::invalid_body(
            "arguments are for an approval, not a rejection",
        ));
    }
    decide(&state, &caller, &run_id, request, false).await
}

/// Journals the decision and answers at once; the run is driven on in the background (from
/// its root run, which answers for its sub-runs) until it closes or pauses again.
async fn decide(
    state: &AppState,
    caller: &Caller,
    run_id: &str,
    request: DecisionRequest,
    approved: bool,
) -> Result<Response, ApiError> {
    let loom = &state.loom;
    let run = caller
        .run(state, run_id, request.session_id.as_deref())
        .await?;
    let by = request.by.as_deref().unwrap_or(DEFAULT_BY);
    let call_id = request.call_id.as_deref();
    let reason = request.reason.as_deref();
    let decided = if approved {
        loom.approve(&run, call_id, by, reason, request.arguments, true)
            .await
    } else {
        loom.reject(&run, call_id, by, reason, true).await
    }
    .map_err(|e| loom_error(loom, &e))?;
    let root = loom
        .state(&run)
        .await
        .map_err(|e| loom_error(loom, &e))?
        .root_run_id;
    let root = RunRef {
        run_id: root,
        ..run.clone()
    };
    let driver = loom.clone();
    tokio::spawn(async move {
        if let Err(error) = driver.resume(&root).await {
            tracing::warn!(run_id = %root.run_id, %error, "run not driven on after a decision");
        }
    });
    Ok(Json(json!({"run_id": run.run_id, "calls": decided.calls})).into_response())
}

/// `POST /runs/{run_id}/cancel` (the body is optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelRequest {
    #[serde(default)]
    by: Option<String>,
    #[serde(default)]
    session_id: Option<String>,
}

async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Run)?;
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large()
        } else {
            ApiError::invalid_body(rejection.body_text())
        }
    })?;
    let request: CancelRequest = if body.iter().all(u8::is_ascii_whitespace) {
        CancelRequest::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::invalid_body(e.to_string()))?
    };
    let loom = &state.loom;
    let run = caller
        .run(&state, &run_id, request.session_id.as_deref())
        .await?;
    let by = Some(request.by.unwrap_or_else(|| DEFAULT_BY.to_owned()));
    let cancelled = loom
        .cancel(&run, by)
        .await
        .map_err(|e| loom_error(loom, &e))?;
    Ok(Json(json!({"run_id": run.run_id, "cancelled": cancelled})).into_response())
}
