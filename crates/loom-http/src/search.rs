//! Reads across a tenant's journal: `GET /runs` (its runs, most recent first), `GET /events`
//! (the event search) and `GET /traces/{run_id}` (a run as a tree of steps and calls).
//!
//! Each reads only the caller's tenant; a key limited to some agents sees only their runs and
//! events (naming another agent in `agent` is a 403), and a trace only when every agent of the
//! run tree is allowed. Without `read_content`, events and traces lose their content fields
//! (listed in `redacted`).

use axum::{
    Json, Router,
    extract::{Path, State},
    response::{IntoResponse, Response},
    routing::get,
};
use loom_ia::{
    EventQuery, Redact, RunQuery,
    config::Scope,
    core::{Category, EventStatus, RunStatus},
    query::{DEFAULT_EVENTS, DEFAULT_RUNS, DEFAULT_SESSIONS},
};
use serde_json::Value;

use crate::{
    AppState,
    auth::Caller,
    error::ApiError,
    params::{Params, invalid},
    routes::loom_error,
};

const RUN_STATUSES: &str = "ready_for_model, awaiting_tools, waiting_child, paused, finalizing, \
                            completed, failed, cancelled";
const CATEGORIES: &str =
    "run, message, model, tool, guard, policy, approval, idempotency, artifact, session, circuit";
const EVENT_STATUSES: &str = "ok, warning, error";

/// The routes of this module.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/runs", get(runs))
        .route("/events", get(events))
        .route("/traces/{run_id}", get(trace))
}

/// The agent filter of a caller: `agent` checked against its key, and the key's agents.
fn agents(caller: &Caller, agent: Option<&str>) -> Result<Option<Vec<String>>, ApiError> {
    if let Some(agent) = agent {
        caller.agent(agent)?;
    }
    Ok(caller.agent_limit().map(<[String]>::to_vec))
}

/// `GET /runs?agent=&status=…&since=&until=&limit=&sessions=`: a
/// [`RunPage`](loom_ia::RunPage) `{runs: [RunListed], scanned, truncated}`, most recent first.
///
/// `status` is repeatable; `since` and `until` (RFC 3339 or `YYYY-MM-DD`) bound when the runs
/// started (`until` excluded); `limit` is 1 to 200 (default 50), `sessions` (the most recent
/// sessions read) 1 to 200 (default 50).
async fn runs(
    State(state): State<AppState>,
    caller: Caller,
    params: Params,
) -> Result<Json<Value>, ApiError> {
    caller.require(Scope::Read)?;
    params.only(&["agent", "status", "since", "until", "limit", "sessions"])?;
    let agent = params.text("agent")?;
    let query = RunQuery {
        tenant_id: Some(caller.tenant.clone()),
        agents: agents(&caller, agent.as_deref())?,
        agent,
        statuses: params.names::<RunStatus>("status", RUN_STATUSES)?,
        since: params.instant("since")?,
        until: params.instant("until")?,
        limit: params.count("limit", DEFAULT_RUNS)?,
        sessions: params.count("sessions", DEFAULT_SESSIONS)?,
    };
    let loom = &state.loom;
    let page = loom.runs(&query).await.map_err(|e| loom_error(loom, &e))?;
    Ok(Json(serde_json::to_value(page).unwrap_or(Value::Null)))
}

/// `GET /events?session_id=&run_id=&type=…&category=…&status=…&agent=&role=&tool_name=&model_id=&model=&since=&until=&after=&limit=`:
/// the events that pass every filter, in write order (`[Event]`).
///
/// `type`, `category` and `status` are repeatable; `since` and `until` (RFC 3339 or
/// `YYYY-MM-DD`) bound `ts` (`until` excluded); `after` is the `event_id` after which to
/// continue (the last one of the previous page); `limit` is 1 to 10 000 (default 100). A value
/// that cannot be used is a 422 naming its parameter.
async fn events(
    State(state): State<AppState>,
    caller: Caller,
    params: Params,
) -> Result<Json<Value>, ApiError> {
    caller.require(Scope::Read)?;
    params.only(&[
        "session_id",
        "run_id",
        "type",
        "category",
        "status",
        "agent",
        "role",
        "tool_name",
        "model_id",
        "model",
        "since",
        "until",
        "after",
        "limit",
    ])?;
    let agent = params.text("agent")?;
    let types = params.all("type");
    if types.contains(&"") {
        return Err(invalid("type", "must not be empty"));
    }
    let query = EventQuery {
        tenant_id: Some(caller.tenant.clone()),
        session_id: params.text("session_id")?,
        run_id: params.text("run_id")?,
        types: types.into_iter().map(str::to_owned).collect(),
        categories: params.names::<Category>("category", CATEGORIES)?,
        statuses: params.names::<EventStatus>("status", EVENT_STATUSES)?,
        agents: agents(&caller, agent.as_deref())?,
        agent,
        role: params.text("role")?,
        tool_name: params.text("tool_name")?,
        model_id: params.text("model_id")?,
        model: params.text("model")?,
        since: params.instant("since")?,
        until: params.instant("until")?,
        after: params.text("after")?,
        limit: params.count("limit", DEFAULT_EVENTS)?,
    };
    let loom = &state.loom;
    let found = loom.query(&query).await.map_err(|e| loom_error(loom, &e))?;
    let content = caller.reads_content();
    Ok(Json(Value::Array(
        found.iter().map(|event| event.view(content)).collect(),
    )))
}

/// `GET /traces/{run_id}?session_id=`: the run as a tree of steps, model calls, tool calls
/// and approvals ([`Trace`](loom_ia::Trace)). A key limited to some agents must be allowed on
/// every agent of the run tree (403 otherwise).
async fn trace(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    params: Params,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    params.only(&["session_id"])?;
    let session = params.text("session_id")?;
    let loom = &state.loom;
    let run = caller.run(&state, &run_id, session.as_deref()).await?;
    if caller.agent_limit().is_some() {
        let agents = loom
            .tree_agents(&run)
            .await
            .map_err(|e| loom_error(loom, &e))?;
        for agent in &agents {
            caller.agent(agent)?;
        }
    }
    let trace = loom.trace(&run).await.map_err(|e| loom_error(loom, &e))?;
    Ok(Json(trace.view(caller.reads_content())).into_response())
}
