//! The `/v1` routes: agents, runs, decisions, cancellation; the webhook of [`crate::hooks`]
//! and the read routes of [`crate::search`] and [`crate::sessions`] (each module's own
//! `OpenApiRouter`) are merged in. Every route is in the OpenAPI document.
//!
//! **Adding a route.** Write the handler with a `#[utoipa::path(...)]` annotation (method,
//! path relative to `/v1`, tag, `operation_id`, summary, a description naming the scope,
//! parameters, request body, every response status with its body — errors are `ErrorBody`,
//! with `Retry-After` where it is sent — and `security(("bearer" = []), ("api_key" = []))`),
//! then register it in [`v1`] (or its module's `routes`) with `.routes(routes!(handler))`. The
//! router and the OpenAPI document are built from that one call, so an unannotated handler
//! cannot be registered there (`routes!` needs the annotation); `tests/openapi.rs` lists the
//! routes the document must hold and refuses a route added by hand (axum's `route`) outside
//! `lib.rs`, `openapi.rs` and `mcp.rs`. A query string read through [`crate::params::Params`] is described by an
//! `IntoParams` struct named in `params(...)` and accepted with `params.only::<T>()`; a facade
//! type answered goes through a `schemars_schema!` marker and `openapi::schemars_components`
//! (and, when it is masked without `read_content`, `openapi::redactable`).

use axum::{
    Json,
    body::Bytes,
    extract::{
        Path, State,
        rejection::{BytesRejection, JsonRejection},
    },
    http::{StatusCode, Uri},
    response::{IntoResponse, Response},
};
use loom_ia::{JudgeMode, Loom, LoomError, Redact, RunOptions, RunRef, RunStatus};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use loom_ia::config::Scope;

use crate::{
    AppState,
    auth::Caller,
    error::{ApiError, ErrorKind},
    openapi::{ErrorBody, RunResultSchema},
    params::Params,
    upload::RunBody,
};

/// Who decides or cancels when the request does not say.
const DEFAULT_BY: &str = "api";

/// The `/v1` routes and their OpenAPI description, from the annotated handlers.
pub(crate) fn v1() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(agents))
        .routes(routes!(create_run))
        .routes(routes!(run_result))
        .routes(routes!(crate::sse::events))
        .routes(routes!(approve))
        .routes(routes!(reject))
        .routes(routes!(cancel))
        .merge(crate::search::routes())
        .merge(crate::sessions::routes())
        .routes(routes!(crate::hooks::deliver))
        .routes(routes!(crate::health::healthz))
        .routes(routes!(crate::health::readyz))
}

/// No route matched.
pub(crate) async fn not_found(uri: Uri) -> ApiError {
    ApiError::new(ErrorKind::NotFound, format!("no route for {}", uri.path()))
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

/// An agent the caller may run.
#[derive(Debug, Serialize, ToSchema)]
struct AgentSummary {
    /// Its name (the `{name}` of `POST /agents/{name}/runs`).
    name: String,
    /// What it does (`description` of its YAML).
    description: String,
}

/// `GET /agents`: the agents published on the REST API that the caller's tenant and key may
/// use.
#[utoipa::path(
    get,
    path = "/agents",
    tag = "agents",
    operation_id = "list_agents",
    summary = "The agents the caller may run",
    description = "The agents of the configuration that the key's tenant (`tenants[].agents`) \
and the key's `agents` allow. Scope `read`.",
    responses(
        (status = 200, description = "The agents.", body = Vec<AgentSummary>),
        (status = 403, description = "The key lacks the scope `read`.", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
async fn agents(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<Vec<AgentSummary>>, ApiError> {
    caller.require(Scope::Read)?;
    let config = state.loom.config();
    let tenant = config.tenant(&caller.tenant);
    let agents = config
        .agents()
        .iter()
        .filter(|agent| agent.expose.rest)
        .filter(|agent| caller.allows_agent(&agent.name))
        .filter(|agent| tenant.is_none_or(|t| t.allows_agent(&agent.name)))
        .map(|agent| AgentSummary {
            name: agent.name.clone(),
            description: agent.description.clone(),
        })
        .collect();
    Ok(Json(agents))
}

/// `POST /agents/{name}/runs`: a JSON body, or the same fields in a `multipart/form-data` body
/// with files in `attachments` parts (see [`crate::upload`]).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct RunRequest {
    /// The user's message.
    #[schema(min_length = 1)]
    message: String,
    /// Continue this session (its conversation is re-read); default: a new session named
    /// after the run.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    session_id: Option<String>,
    /// Choose the run id; default: a UUIDv7.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    run_id: Option<String>,
    /// Who the run is for (journaled).
    #[serde(default)]
    user_id: Option<String>,
    /// Free metadata, journaled with the run: at most 64 levels deep and 64 KiB as JSON (422
    /// `invalid_request` beyond, naming the limit).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    metadata: Option<Map<String, Value>>,
    /// Judges: as configured (`auto`), always (`force`) or never (`skip`: needs the scope
    /// `admin`).
    #[serde(default)]
    #[schema(value_type = Option<JudgesMode>)]
    judges: Option<String>,
    /// Session-state values (keys the agent declares in `state:`), journaled with the run: a
    /// key the agent does not declare, a value off its schema or over `sessions.state`, or a
    /// required key left without value is refused (422 `invalid_request`, nothing written).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    state: Option<Map<String, Value>>,
    /// Answer at once with `202` and drive the run in the background.
    #[serde(default)]
    background: bool,
}

/// `POST /agents/{name}/runs` as `multipart/form-data`: the fields of [`RunRequest`] as form
/// fields (read as the JSON body is, see [`crate::upload`]), and the files in `attachments`
/// parts. Only describes the form: [`crate::upload::RunBody`] reads it.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
struct RunForm {
    /// The user's message.
    #[schema(min_length = 1)]
    message: String,
    /// Continue this session (its conversation is re-read); default: a new session named
    /// after the run.
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    session_id: Option<String>,
    /// Choose the run id; default: a UUIDv7.
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    run_id: Option<String>,
    /// Who the run is for (journaled).
    user_id: Option<String>,
    /// Free metadata, journaled with the run: the JSON text of an object (at most 64 levels
    /// deep and 64 KiB).
    #[schema(content_media_type = "application/json")]
    metadata: Option<String>,
    /// Judges: as configured (`auto`), always (`force`) or never (`skip`: needs the scope
    /// `admin`).
    judges: Option<JudgesMode>,
    /// Session-state values: the JSON text of an object (keys the agent declares).
    #[schema(content_media_type = "application/json")]
    state: Option<String>,
    /// Answer at once with `202` and drive the run in the background (`true` or `false`).
    background: Option<bool>,
    /// Files attached to the run, one part each, with its file name and `Content-Type`;
    /// checked as `loom run --attach` checks them (`execution.attachments`: size, type,
    /// count).
    #[schema(value_type = Option<Vec<String>>, format = Binary)]
    attachments: Option<Vec<String>>,
}

/// When judges run (`judges` of a run request).
#[derive(Debug, ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)]
enum JudgesMode {
    /// As configured.
    Auto,
    /// Always.
    Force,
    /// Never (scope `admin`).
    Skip,
}

/// The answer to a background run request.
#[derive(Debug, Serialize, ToSchema)]
struct Accepted {
    /// The run.
    run_id: String,
    /// Its session.
    session_id: String,
    /// Its state when the answer was written.
    #[schema(value_type = String, example = "ready_for_model")]
    status: RunStatus,
}

/// `POST /agents/{name}/runs`.
#[utoipa::path(
    post,
    path = "/agents/{name}/runs",
    tag = "runs",
    operation_id = "create_run",
    summary = "Run an agent",
    description = "Opens a run of the agent on the message. Synchronous by default: the answer \
is the run's result once it closes (`201`, also when it failed or paused for an approval). \
With `\"background\": true` the answer is `202` as soon as the run is journaled. When the \
server shuts down during a synchronous run, the run stops at a safe point and the answer is \
`503` (`kind: interrupted`, with `run_id` and `session_id`): the run resumes when the server \
starts again. Scope `run` (`admin` too for `judges: skip`).",
    params(("name" = String, Path, description = "The agent's name.")),
    request_body(
        description = "The run request: JSON, or the same fields as a `multipart/form-data` \
form with files in `attachments` parts.",
        content(
            (RunRequest = "application/json"),
            (RunForm = "multipart/form-data"),
        ),
    ),
    responses(
        (status = 201, description = "The run closed (completed, failed, cancelled) or paused: its result.", body = RunResultSchema),
        (status = 202, description = "`background`: the run is journaled and driven in the background.", body = Accepted),
        (status = 403, description = "The key lacks the scope, or may not use this agent, or the session named belongs to another agent (`agent_not_allowed`).", body = ErrorBody),
        (status = 404, description = "No such agent for the caller's tenant.", body = ErrorBody),
        (status = 409, description = "Refused: the run id exists, or an id is unusable (`refused`).", body = ErrorBody),
        (status = 413, description = "The body is larger than `server.http.max_body_bytes`.", body = ErrorBody),
        (status = 422, description = "The body is not a usable run request, or a value is over its bound (`metadata` deeper than 64 levels or over 64 KiB, `message` over 1 MiB…): the message names the field and the limit.", body = ErrorBody),
        (status = 429, description = "A tenant budget is reached.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until the budget's window lets a run in."))),
        (status = 503, description = "The server shut down before the run closed (`interrupted`): it resumes at the next start.", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
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
            ErrorKind::UnknownAgent,
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
        state: request.state.unwrap_or_default(),
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
        let body = Accepted {
            run_id: run.run_id,
            session_id: run.session_id,
            status,
        };
        return Ok((StatusCode::ACCEPTED, Json(body)).into_response());
    }
    // Driven in a task of its own: a client that goes away does not take the run with it
    // (it goes on and closes; its result is read back with `GET /runs/{run_id}`).
    let driving = {
        let loom = loom.clone();
        tokio::spawn(async move { loom.run(&agent, request.message, options).await })
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
    // Masked without `read_content`, as `GET /runs/{run_id}` is.
    Ok((
        StatusCode::CREATED,
        Json(result.view(caller.reads_content())),
    )
        .into_response())
}

/// `?session_id=` of the run routes (`GET /runs/{run_id}`, `GET /traces/{run_id}`).
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct At {
    /// The run's session. Without it, the run is looked up in the session named after it
    /// (where a run opened without `session_id` lives), as in Loom-IA: a run of a named session
    /// must be asked with its session, else it is unknown (404).
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    session_id: Option<String>,
}

/// `GET /runs/{run_id}`.
#[utoipa::path(
    get,
    path = "/runs/{run_id}",
    tag = "runs",
    operation_id = "get_run",
    summary = "A run's result",
    description = "The run's result, read from its journal (also while it goes on). Scope `read`.",
    params(("run_id" = String, Path, description = "The run."), At),
    responses(
        (status = 200, description = "The run's result.", body = RunResultSchema),
        (status = 403, description = "The key lacks the scope, or may not use the run's agent.", body = ErrorBody),
        (status = 404, description = "No such run in the session (`session_id`, else the session named after the run) of the caller's tenant.", body = ErrorBody),
        (status = 422, description = "The query string or the session id is unusable.", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
async fn run_result(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    params: Params,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    let params = params.only::<At>()?;
    let session = params.text("session_id")?;
    let loom = &state.loom;
    let run = caller
        .addressed_run(&state, &run_id, session.as_deref())
        .await?;
    let result = loom.result(&run).await.map_err(|e| loom_error(loom, &e))?;
    Ok(Json(result.view(caller.reads_content())).into_response())
}

/// The body of `POST /runs/{run_id}/approve` and `/reject`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct DecisionRequest {
    /// The call to decide (default: every call waiting).
    #[serde(default)]
    call_id: Option<String>,
    /// Who decides (journaled; default `api`).
    #[serde(default)]
    by: Option<String>,
    /// Why (journaled; a rejection's reason is given to the model).
    #[serde(default)]
    reason: Option<String>,
    /// Approval only, with `call_id`: corrected arguments the tool receives instead of the
    /// model's (checked against the tool's schema).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    arguments: Option<Value>,
    /// The run's session (found by search when absent).
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    session_id: Option<String>,
}

/// The body of `POST /runs/{run_id}/reject`: a decision without corrected arguments.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct RejectRequest {
    /// The call to reject (default: every call waiting).
    #[serde(default)]
    call_id: Option<String>,
    /// Who decides (journaled; default `api`).
    #[serde(default)]
    by: Option<String>,
    /// Why (journaled and given to the model).
    #[serde(default)]
    reason: Option<String>,
    /// The run's session (found by search when absent).
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    session_id: Option<String>,
}

impl From<RejectRequest> for DecisionRequest {
    fn from(request: RejectRequest) -> DecisionRequest {
        DecisionRequest {
            call_id: request.call_id,
            by: request.by,
            reason: request.reason,
            arguments: None,
            session_id: request.session_id,
        }
    }
}

/// The answer to a decision.
#[derive(Debug, Serialize, ToSchema)]
struct DecisionAnswer {
    /// The run.
    run_id: String,
    /// The calls decided.
    calls: Vec<String>,
}

/// `POST /runs/{run_id}/approve`.
#[utoipa::path(
    post,
    path = "/runs/{run_id}/approve",
    tag = "runs",
    operation_id = "approve_run",
    summary = "Grant a paused run's approval",
    description = "Journals the approval of the call (or of every waiting call) and answers at \
once; the run is driven on in the background, from its root run. Scope `approve`.",
    params(("run_id" = String, Path, description = "The paused run (or its root).")),
    request_body(content = DecisionRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The decision is journaled.", body = DecisionAnswer),
        (status = 403, description = "The key lacks the scope, or may not use the run's agent.", body = ErrorBody),
        (status = 404, description = "No such run in the caller's tenant (`unknown_run`), or no approval request waits in it, or none for the call named (`unknown_approval`).", body = ErrorBody),
        (status = 409, description = "The request expired, the arguments are unusable (`refused`), or the run is driven elsewhere (`conflict`).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "`conflict` only: seconds until the other driver's lease ends."))),
        (status = 413, description = "The body is larger than `server.http.max_body_bytes`.", body = ErrorBody),
        (status = 422, description = "The body is not a usable decision.", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
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

/// `POST /runs/{run_id}/reject`.
#[utoipa::path(
    post,
    path = "/runs/{run_id}/reject",
    tag = "runs",
    operation_id = "reject_run",
    summary = "Reject a paused run's approval",
    description = "Journals the rejection of the call (or of every waiting call): the model \
receives an error result with the reason. Answers at once; the run is driven on in the \
background. Scope `approve`.",
    params(("run_id" = String, Path, description = "The paused run (or its root).")),
    request_body(content = RejectRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The decision is journaled.", body = DecisionAnswer),
        (status = 403, description = "The key lacks the scope, or may not use the run's agent.", body = ErrorBody),
        (status = 404, description = "No such run in the caller's tenant (`unknown_run`), or no approval request waits in it, or none for the call named (`unknown_approval`).", body = ErrorBody),
        (status = 409, description = "The request expired (`refused`), or the run is driven elsewhere (`conflict`).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "`conflict` only: seconds until the other driver's lease ends."))),
        (status = 413, description = "The body is larger than `server.http.max_body_bytes`.", body = ErrorBody),
        (status = 422, description = "The body is not a usable rejection.", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
async fn reject(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    body: Result<Json<RejectRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Approve)?;
    let Json(request) = body?;
    decide(&state, &caller, &run_id, request.into(), false).await
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
    Ok(Json(DecisionAnswer {
        run_id: run.run_id,
        calls: decided.calls,
    })
    .into_response())
}

/// The body of `POST /runs/{run_id}/cancel` (optional).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CancelRequest {
    /// Who cancels (journaled; default `api`).
    #[serde(default)]
    by: Option<String>,
    /// The run's session (found by search when absent).
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    session_id: Option<String>,
}

/// The answer to a cancellation.
#[derive(Debug, Serialize, ToSchema)]
struct Cancelled {
    /// The run.
    run_id: String,
    /// `false` when the run had already closed.
    cancelled: bool,
}

/// `POST /runs/{run_id}/cancel`.
#[utoipa::path(
    post,
    path = "/runs/{run_id}/cancel",
    tag = "runs",
    operation_id = "cancel_run",
    summary = "Cancel a run",
    description = "A run driven by this server stops at once (between or during steps); another \
open run is closed as cancelled in its journal. The body is optional. Scope `run`.",
    params(("run_id" = String, Path, description = "The run.")),
    request_body(content = Option<CancelRequest>, content_type = "application/json"),
    responses(
        (status = 200, description = "Cancelled, or already closed (`cancelled: false`).", body = Cancelled),
        (status = 403, description = "The key lacks the scope, or may not use the run's agent.", body = ErrorBody),
        (status = 404, description = "No such run in the caller's tenant.", body = ErrorBody),
        (status = 409, description = "The session id is unusable (`refused`), or the run is driven elsewhere (`conflict`).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "`conflict` only: seconds until the other driver's lease ends."))),
        (status = 413, description = "The body is larger than `server.http.max_body_bytes`.", body = ErrorBody),
        (status = 422, description = "The body is not a usable cancellation.", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
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
    Ok(Json(Cancelled {
        run_id: run.run_id,
        cancelled,
    })
    .into_response())
}
