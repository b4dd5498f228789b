//! Reads across a tenant's journal: `GET /runs` (its runs, most recent first), `GET /events`
//! (the event search) and `GET /traces/{run_id}` (a run as a tree of steps and calls).
//!
//! Each reads only the caller's tenant; a key limited to some agents sees only their runs and
//! events (naming another agent in `agent` is a 403), and a trace only when every agent of the
//! run tree is allowed. Without `read_content`, events and traces lose their content fields
//! (listed in `redacted`). Each query string is documented by an `IntoParams` struct, which is
//! also the list of parameters the route accepts ([`Params::only`]).

use axum::{
    Json,
    extract::{Path, State},
    response::{IntoResponse, Response},
};
use loom_ia::{
    EventQuery, Redact, RunPage, RunQuery,
    config::Scope,
    core::{Category, EventStatus, RunStatus},
    query::{DEFAULT_EVENTS, DEFAULT_RUNS, DEFAULT_SESSIONS, EVENT_TYPES},
};
use serde_json::Value;
use utoipa::{
    IntoParams,
    openapi::{ObjectBuilder, RefOr, Schema, Type, schema::SchemaType},
};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::{
    AppState,
    auth::Caller,
    error::ApiError,
    openapi::{
        CategorySchema, ErrorBody, EventSchema, EventStatusSchema, RunPageSchema, RunStatusSchema,
        TraceSchema,
    },
    params::{Params, invalid},
    routes::{At, loom_error},
};

const RUN_STATUSES: &str = "ready_for_model, awaiting_tools, waiting_child, paused, finalizing, \
                            completed, failed, cancelled";
const CATEGORIES: &str =
    "run, message, model, tool, guard, policy, approval, idempotency, artifact, session, circuit";
const EVENT_STATUSES: &str = "ok, warning, error";

/// The routes of this module and their description.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(runs))
        .routes(routes!(events))
        .routes(routes!(trace))
}

/// One event type (`type` of the event search): a name of [`EVENT_TYPES`].
pub(crate) struct EventType;

impl utoipa::PartialSchema for EventType {
    fn schema() -> RefOr<Schema> {
        RefOr::T(Schema::Object(
            ObjectBuilder::new()
                .schema_type(SchemaType::new(Type::String))
                .description(Some("An event type."))
                .enum_values(Some(EVENT_TYPES.iter().copied()))
                .build(),
        ))
    }
}

impl utoipa::ToSchema for EventType {}

/// The agent filter of a caller: `agent` checked against its key, and the key's agents.
fn agents(caller: &Caller, agent: Option<&str>) -> Result<Option<Vec<String>>, ApiError> {
    if let Some(agent) = agent {
        caller.agent(agent)?;
    }
    Ok(caller.agent_limit().map(<[String]>::to_vec))
}

/// The query string of `GET /runs`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
struct RunsQuery {
    /// Only the runs of this agent (a key limited to some agents: one of them, else 403).
    #[param(min_length = 1)]
    agent: Option<String>,
    /// Only the runs in one of these states (repeatable).
    #[param(style = Form, explode)]
    status: Option<Vec<RunStatusSchema>>,
    /// Only the runs started at or after this instant (RFC 3339, or `YYYY-MM-DD`: its first
    /// instant, UTC).
    #[param(example = "2026-05-01T12:00:00Z")]
    since: Option<String>,
    /// Only the runs started before this instant (RFC 3339 or `YYYY-MM-DD`); not before
    /// `since`.
    #[param(example = "2026-05-01T12:00:00Z")]
    until: Option<String>,
    /// At most this many runs.
    #[param(minimum = 1, maximum = 200, default = json!(DEFAULT_RUNS))]
    limit: Option<u32>,
    /// Read at most this many sessions, the most recently written first.
    #[param(minimum = 1, maximum = 200, default = json!(DEFAULT_SESSIONS))]
    sessions: Option<u32>,
}

/// `GET /runs`: a [`RunPage`] `{runs: [RunListed], scanned, truncated}`, most recent first.
#[utoipa::path(
    get,
    path = "/runs",
    tag = "runs",
    operation_id = "list_runs",
    summary = "The tenant's runs, most recent first",
    description = "The runs (sub-runs included) of the tenant's most recently written sessions \
(`sessions` of them) that pass every filter, most recent start first, at most `limit`; \
`truncated` says whether runs were left out. A key limited to some agents sees only their \
runs. A value that cannot be used is a 422 naming its parameter. Scope `read`.",
    params(RunsQuery),
    responses(
        (status = 200, description = "The runs.", body = RunPageSchema),
        (status = 403, description = "The key lacks the scope `read`, or `agent` is not one of the key's agents.", body = ErrorBody),
        (status = 422, description = "A query parameter is unknown, repeated, or unusable (`invalid_query`, the message starts with its name).", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
async fn runs(
    State(state): State<AppState>,
    caller: Caller,
    params: Params,
) -> Result<Json<RunPage>, ApiError> {
    caller.require(Scope::Read)?;
    let params = params.only::<RunsQuery>()?;
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
    Ok(Json(page))
}

/// The query string of `GET /events`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
struct EventsQuery {
    /// Only this session's events.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    session_id: Option<String>,
    /// Only this run's events (not its sub-runs').
    #[param(min_length = 1)]
    run_id: Option<String>,
    /// Only events of these types (repeatable).
    #[param(rename = "type", style = Form, explode, inline)]
    event_type: Option<Vec<EventType>>,
    /// Only events of these categories (repeatable).
    #[param(style = Form, explode)]
    category: Option<Vec<CategorySchema>>,
    /// Only events of these statuses (repeatable).
    #[param(style = Form, explode)]
    status: Option<Vec<EventStatusSchema>>,
    /// Only the events of this agent's runs (a key limited to some agents: one of them, else
    /// 403).
    #[param(min_length = 1)]
    agent: Option<String>,
    /// Only model events of this slot (`main`, a role, `judge:<name>`).
    #[param(min_length = 1)]
    role: Option<String>,
    /// Only the events of this tool.
    #[param(min_length = 1)]
    tool_name: Option<String>,
    /// Only the events of this model (its `id` in the configuration).
    #[param(min_length = 1)]
    model_id: Option<String>,
    /// Only the events of this provider model name.
    #[param(min_length = 1)]
    model: Option<String>,
    /// Only events written at or after this instant (RFC 3339, or `YYYY-MM-DD`: its first
    /// instant, UTC).
    #[param(example = "2026-05-01T12:00:00Z")]
    since: Option<String>,
    /// Only events written before this instant (RFC 3339 or `YYYY-MM-DD`); not before
    /// `since`.
    #[param(example = "2026-05-01T12:00:00Z")]
    until: Option<String>,
    /// Continue after this event (the last `event_id` of the previous page); it must be an
    /// event of the journal searched.
    #[param(min_length = 1)]
    after: Option<String>,
    /// At most this many events.
    #[param(minimum = 1, maximum = 10000, default = json!(DEFAULT_EVENTS))]
    limit: Option<u32>,
}

/// `GET /events`: the events that pass every filter, in write order (`[Event]`).
#[utoipa::path(
    get,
    path = "/events",
    tag = "journal",
    operation_id = "search_events",
    summary = "Search the tenant's journal",
    description = "The events of the tenant's journal that pass every filter, in write order \
(each session's journal order; sessions interleaved by time), at most `limit`; page with \
`after`. A key limited to some agents sees only their events. Without `read_content`, each \
event loses the content fields of its payload, listed in `redacted`. A value that cannot be \
used is a 422 naming its parameter. Scope `read`.",
    params(EventsQuery),
    responses(
        (status = 200, description = "The events.", body = Vec<EventSchema>),
        (status = 403, description = "The key lacks the scope `read`, or `agent` is not one of the key's agents.", body = ErrorBody),
        (status = 422, description = "A query parameter is unknown, repeated, or unusable (`invalid_query`, the message starts with its name).", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
async fn events(
    State(state): State<AppState>,
    caller: Caller,
    params: Params,
) -> Result<Json<Value>, ApiError> {
    caller.require(Scope::Read)?;
    let params = params.only::<EventsQuery>()?;
    let agent = params.text("agent")?;
    let types = params.all("type")?;
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

/// `GET /traces/{run_id}`: the run's trace ([`Trace`](loom_ia::Trace)): its figures and its
/// spans (steps, model calls, tool calls, judges, approvals, and its sub-runs' spans under the
/// calls that opened them). A key limited to some agents must be allowed on every agent of the
/// run tree (403 otherwise).
#[utoipa::path(
    get,
    path = "/traces/{run_id}",
    tag = "journal",
    operation_id = "get_trace",
    summary = "A run's trace",
    description = "The reference's `Trace`: the run's figures and its `spans` (kinds `run`, \
`step`, `chat`, `tool`, `judge`, `model`, `other`), each with its parent span, times, status, \
attributes (OpenTelemetry GenAI names such as `gen_ai.usage.input_tokens`, and `loom.*`) and \
events; a sub-agent's run is a `run` span under the tool call that opened it. A key limited to \
some agents must be allowed on every agent of the run tree. Without `read_content`, the answer \
and the content attributes (texts, arguments, results, reasons, errors) are removed, listed in \
`redacted`, and `content` is false. Scope `read`.",
    params(("run_id" = String, Path, description = "The run."), At),
    responses(
        (status = 200, description = "The trace.", body = TraceSchema),
        (status = 403, description = "The key lacks the scope `read`, or may not use an agent of the run tree.", body = ErrorBody),
        (status = 404, description = "No such run in the session (`session_id`, else the session named after the run) of the caller's tenant.", body = ErrorBody),
        (status = 422, description = "A query parameter is unknown, repeated or unusable, or the session id is unusable.", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
async fn trace(
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

#[cfg(test)]
mod tests {
    use loom_ia::query::{MAX_EVENTS, MAX_RUNS, MAX_SESSIONS};
    use utoipa::openapi::path::ParameterIn;

    use super::*;

    /// The schema of the query parameter `name` of `T`, as JSON.
    fn parameter<T: IntoParams>(name: &str) -> Value {
        let found = T::into_params(|| Some(ParameterIn::Query))
            .into_iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("{name} is not documented"));
        serde_json::to_value(found.schema).unwrap_or_default()
    }

    /// The documented ranges and defaults of the counts are the facade's.
    #[test]
    fn the_documented_counts_are_the_facade_limits() {
        for (schema, max, default) in [
            (parameter::<RunsQuery>("limit"), MAX_RUNS, DEFAULT_RUNS),
            (
                parameter::<RunsQuery>("sessions"),
                MAX_SESSIONS,
                DEFAULT_SESSIONS,
            ),
            (
                parameter::<EventsQuery>("limit"),
                MAX_EVENTS,
                DEFAULT_EVENTS,
            ),
        ] {
            assert_eq!(schema["minimum"], 1, "{schema}");
            assert_eq!(schema["maximum"], max, "{schema}");
            assert_eq!(schema["default"], default, "{schema}");
        }
        let types = parameter::<EventsQuery>("type");
        assert_eq!(types["items"]["enum"], serde_json::json!(EVENT_TYPES));
    }
}
