//! The session routes: list, one session's runs and waiting approvals, its journal as NDJSON,
//! its files, one file's bytes, its state, its usage report, and its GDPR erasure.
//!
//! Every route reads the caller's tenant only (another tenant's session is a 404). A key
//! limited to some agents cannot list sessions (403), and reaches a session only when every
//! agent that ran in it is allowed. Without `read_content`, content fields are removed and
//! listed in `redacted`, and a file's bytes cannot be read.

use axum::{
    Json,
    extract::{Path, State},
    http::{HeaderValue, header},
    response::{IntoResponse, Response},
};
use loom_ia::{
    FILE_ORIGINS, Loom, Redact, SessionDeletion, SessionInfo, SessionListed, UsageReport,
    config::Scope,
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
    error::{ApiError, ErrorKind},
    openapi::{
        CompactionNoteSchema, ErrorBody, EventSchema, SessionDeletionSchema, SessionFileSchema,
        SessionInfoSchema, SessionListedSchema, UsageReportSchema,
    },
    params::{Params, invalid},
    routes::loom_error,
};

/// The routes of this module and their description.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(show, delete))
        .routes(routes!(events))
        .routes(routes!(files))
        .routes(routes!(file))
        .routes(routes!(session_state))
        .routes(routes!(report))
        .routes(routes!(compact))
}

/// The session, after checking that a key limited to some agents may see every agent that ran
/// in it.
async fn session(loom: &Loom, caller: &Caller, session_id: &str) -> Result<SessionInfo, ApiError> {
    let info = loom
        .session(session_id, Some(&caller.tenant))
        .await
        .map_err(|e| loom_error(loom, &e))?;
    if caller.agent_limit().is_some() {
        // A compaction run summarizes the session's own runs, checked here.
        for run in info
            .runs
            .iter()
            .filter(|r| r.agent != loom_ia::COMPACTION_AGENT)
        {
            caller.agent(&run.agent)?;
        }
    }
    Ok(info)
}

/// `GET /sessions`: the tenant's sessions, most recent first. 403 for a key limited to some
/// agents (a session list would name sessions of other agents).
#[utoipa::path(
    get,
    path = "/sessions",
    tag = "sessions",
    operation_id = "list_sessions",
    summary = "The tenant's sessions",
    description = "The sessions of the tenant's journal, the most recently written first. A key \
limited to some agents cannot list them (a list would name sessions of other agents). Scope \
`read`.",
    responses(
        (status = 200, description = "The sessions.", body = Vec<SessionListedSchema>),
        (status = 403, description = "The key lacks the scope `read`, or is limited to some agents.", body = ErrorBody),
        (status = 422, description = "The query string holds a parameter (none is accepted).", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
async fn list(
    State(state): State<AppState>,
    caller: Caller,
    params: Params,
) -> Result<Json<Vec<SessionListed>>, ApiError> {
    caller.require(Scope::Read)?;
    params.none()?;
    if caller.agent_limit().is_some() {
        return Err(ApiError::new(
            ErrorKind::AgentNotAllowed,
            "a key limited to some agents cannot list the sessions",
        ));
    }
    let loom = &state.loom;
    let listed = loom
        .sessions(Some(&caller.tenant))
        .await
        .map_err(|e| loom_error(loom, &e))?;
    Ok(Json(listed))
}

/// `GET /sessions/{session_id}`: a [`SessionInfo`] `{session_id, last_seq, updated_at,
/// runs: [{run_id, agent, status, parent_run_id, iterations, usage, cost_usd, unpiloted}],
/// pending_approvals}` (plus `redacted` without `read_content`).
#[utoipa::path(
    get,
    path = "/sessions/{session_id}",
    tag = "sessions",
    operation_id = "get_session",
    summary = "A session",
    description = "The session's runs (sub-runs included) in the order they started, with their \
state, usage and cost, and the approvals waiting in it. Without `read_content`, what waiting \
approvals would run with and why is removed and listed in `redacted`. A key limited to some \
agents must be allowed on every agent that ran in the session. Scope `read`.",
    params(("session_id" = String, Path, description = "The session.")),
    responses(
        (status = 200, description = "The session.", body = SessionInfoSchema),
        (status = 403, description = "The key lacks the scope `read`, or may not use an agent that ran in the session.", body = ErrorBody),
        (status = 404, description = "No such session in the caller's tenant.", body = ErrorBody),
        (status = 422, description = "The query string holds a parameter (none is accepted).", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(session_id): Path<String>,
    params: Params,
) -> Result<Json<Value>, ApiError> {
    caller.require(Scope::Read)?;
    params.none()?;
    let info = session(&state.loom, &caller, &session_id).await?;
    Ok(Json(info.view(caller.reads_content())))
}

/// `GET /sessions/{session_id}/events`: the session's journal, one event per line
/// (`application/x-ndjson`), exactly as stored with `read_content`, else masked.
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/events",
    tag = "sessions",
    operation_id = "export_session",
    summary = "A session's journal (NDJSON)",
    description = "The session's journal, one JSON `Event` per line (`application/x-ndjson`), \
in journal order: exactly as stored with `read_content`, else each event without the content \
fields of its payload, listed in its `redacted`. A key limited to some agents must be allowed \
on every agent that ran in the session. Scope `read`.",
    params(("session_id" = String, Path, description = "The session.")),
    responses(
        (status = 200, description = "The journal: one `Event` (see the schema) per line.", content_type = "application/x-ndjson", body = EventSchema),
        (status = 403, description = "The key lacks the scope `read`, or may not use an agent that ran in the session.", body = ErrorBody),
        (status = 404, description = "No such session in the caller's tenant.", body = ErrorBody),
        (status = 422, description = "The query string holds a parameter (none is accepted).", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
async fn events(
    State(state): State<AppState>,
    caller: Caller,
    Path(session_id): Path<String>,
    params: Params,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    params.none()?;
    let loom = &state.loom;
    session(loom, &caller, &session_id).await?;
    let body = if caller.reads_content() {
        loom.export_session(&session_id, Some(&caller.tenant))
            .await
            .map_err(|e| loom_error(loom, &e))?
    } else {
        let events = loom
            .session_events(&session_id, Some(&caller.tenant))
            .await
            .map_err(|e| loom_error(loom, &e))?;
        let mut out = String::new();
        for event in &events {
            out.push_str(&event.redacted().to_string());
            out.push('\n');
        }
        out
    };
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}

/// One file origin (`origin` of the file list): a name of [`FILE_ORIGINS`].
pub(crate) struct FileOrigin;

impl utoipa::PartialSchema for FileOrigin {
    fn schema() -> RefOr<Schema> {
        RefOr::T(Schema::Object(
            ObjectBuilder::new()
                .schema_type(SchemaType::new(Type::String))
                .description(Some("Where a file comes from."))
                .enum_values(Some(FILE_ORIGINS))
                .build(),
        ))
    }
}

impl utoipa::ToSchema for FileOrigin {}

/// The query string of `GET /sessions/{session_id}/files`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
struct FilesQuery {
    /// Only the files of these origins (repeatable; default: all).
    #[param(style = Form, explode, inline)]
    origin: Option<Vec<FileOrigin>>,
}

/// `GET /sessions/{session_id}/files?origin=…`: the files stored beside the session
/// (`[SessionFile]`: `{file, uri, name, media_type, size, origin, run_id, call_id,
/// stored_at}`), only those of the given origins (`attachment`, `tool_output`, `offload`;
/// repeatable) when any.
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/files",
    tag = "sessions",
    operation_id = "list_session_files",
    summary = "A session's files",
    description = "The files stored beside the session (attachments, tool outputs, offloaded \
results), each once, in the order they were stored; `file` names one in \
`GET /sessions/{session_id}/files/{file}`. Without `read_content`, the display name is \
removed and listed in `redacted`. A key limited to some agents must be allowed on every agent \
that ran in the session. Scope `read`.",
    params(("session_id" = String, Path, description = "The session."), FilesQuery),
    responses(
        (status = 200, description = "The files.", body = Vec<SessionFileSchema>),
        (status = 403, description = "The key lacks the scope `read`, or may not use an agent that ran in the session.", body = ErrorBody),
        (status = 404, description = "No such session in the caller's tenant.", body = ErrorBody),
        (status = 422, description = "A query parameter is unknown or unusable (`invalid_query`, the message starts with its name).", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
async fn files(
    State(state): State<AppState>,
    caller: Caller,
    Path(session_id): Path<String>,
    params: Params,
) -> Result<Json<Value>, ApiError> {
    caller.require(Scope::Read)?;
    let params = params.only::<FilesQuery>()?;
    let origins: Vec<String> = params
        .all("origin")?
        .into_iter()
        .map(|origin| {
            if FILE_ORIGINS.contains(&origin) {
                Ok(origin.to_owned())
            } else {
                Err(invalid(
                    "origin",
                    format!(
                        "unknown value '{origin}' (expected: {})",
                        FILE_ORIGINS.join(", ")
                    ),
                ))
            }
        })
        .collect::<Result<_, _>>()?;
    let loom = &state.loom;
    session(loom, &caller, &session_id).await?;
    let files = loom
        .session_files(&session_id, &origins, Some(&caller.tenant))
        .await
        .map_err(|e| loom_error(loom, &e))?;
    let content = caller.reads_content();
    Ok(Json(Value::Array(
        files.iter().map(|f| f.view(content)).collect(),
    )))
}

/// `GET /sessions/{session_id}/state` (scope `read_content`): the session's state.
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/state",
    tag = "sessions",
    operation_id = "get_session_state",
    summary = "A session's state",
    description = "The session's state as an object sorted by key: the values its runs wrote (the \
callers' `state`, the accepted writes of tool results) over the defaults its agent declares \
(`{}` when the agent declares no state). State values are content: scope `read_content`. A key \
limited to some agents must be allowed on every agent that ran in the session.",
    params(("session_id" = String, Path, description = "The session.")),
    responses(
        (status = 200, description = "The state: one value per key.", body = Object),
        (status = 403, description = "The key lacks the scope `read_content`, or may not use an agent that ran in the session.", body = ErrorBody),
        (status = 404, description = "No such session in the caller's tenant.", body = ErrorBody),
        (status = 422, description = "The query string holds a parameter (none is accepted).", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
async fn session_state(
    State(state): State<AppState>,
    caller: Caller,
    Path(session_id): Path<String>,
    params: Params,
) -> Result<Json<serde_json::Map<String, Value>>, ApiError> {
    caller.require(Scope::ReadContent)?;
    params.none()?;
    let loom = &state.loom;
    session(loom, &caller, &session_id).await?;
    let values = loom
        .session_state(&session_id, Some(&caller.tenant))
        .await
        .map_err(|e| loom_error(loom, &e))?;
    Ok(Json(values))
}

/// `GET /sessions/{session_id}/files/{file}` (scope `read_content`): the file's bytes, with
/// its media type as `Content-Type` and `Content-Disposition: attachment` naming it.
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/files/{file}",
    tag = "sessions",
    operation_id = "get_session_file",
    summary = "A session file's bytes",
    description = "The file's bytes, with its media type as `Content-Type` (any type: what was \
stored) and `Content-Disposition: attachment` naming it. A key limited to some agents must be \
allowed on every agent that ran in the session. Scope `read_content`.",
    params(
        ("session_id" = String, Path, description = "The session."),
        ("file" = String, Path, description = "The file, as `file` of the file list names it (`<sha256>.<ext>`)."),
    ),
    responses(
        (status = 200, description = "The file's bytes, with the media type it was stored with.",
            content((serde_json::Value = "*/*")),
            headers(
                ("Content-Disposition" = String, description = "`attachment`, with the file's name (`filename` in ASCII, `filename*` in UTF-8)."),
                ("X-Content-Type-Options" = String, description = "`nosniff`."),
            )),
        (status = 403, description = "The key lacks the scope `read_content`, or may not use an agent that ran in the session.", body = ErrorBody),
        (status = 404, description = "No such session in the caller's tenant (`unknown_session`), or no such file in it, or its bytes are gone (`unknown_artifact`).", body = ErrorBody),
        (status = 422, description = "The query string holds a parameter (none is accepted).", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
async fn file(
    State(state): State<AppState>,
    caller: Caller,
    Path((session_id, file)): Path<(String, String)>,
    params: Params,
) -> Result<Response, ApiError> {
    caller.require(Scope::ReadContent)?;
    params.none()?;
    let loom = &state.loom;
    session(loom, &caller, &session_id).await?;
    let (found, bytes) = loom
        .session_file(&session_id, &file, Some(&caller.tenant))
        .await
        .map_err(|e| loom_error(loom, &e))?;
    let media_type = HeaderValue::from_str(&found.media_type)
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    let name = found.name.as_deref().unwrap_or(&found.file);
    let disposition = HeaderValue::from_str(&content_disposition(name))
        .unwrap_or(HeaderValue::from_static("attachment"));
    Ok((
        [
            (header::CONTENT_TYPE, media_type),
            (header::CONTENT_DISPOSITION, disposition),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        bytes,
    )
        .into_response())
}

/// `attachment; filename="<ASCII name>"; filename*=UTF-8''<percent-encoded name>` (RFC 6266):
/// an ASCII fallback for old clients, the exact name for the others.
fn content_disposition(name: &str) -> String {
    let fallback: String = name
        .chars()
        .map(|c| {
            if (c.is_ascii_graphic() && c != '"' && c != '\\') || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let encoded = percent_encoding::utf8_percent_encode(name, ATTR_CHAR_ESCAPED);
    format!("attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}")
}

/// What RFC 5987 escapes in a `filename*` value: every byte but its `attr-char`s (letters,
/// digits and `!#$&+-.^_`|~`).
const ATTR_CHAR_ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'!')
    .remove(b'#')
    .remove(b'$')
    .remove(b'&')
    .remove(b'+')
    .remove(b'-')
    .remove(b'.')
    .remove(b'^')
    .remove(b'_')
    .remove(b'`')
    .remove(b'|')
    .remove(b'~');

/// `GET /sessions/{session_id}/report`: tokens and cost of the session ([`UsageReport`]):
/// every run (sub-runs included) with its own calls, and every call by role, by agent and by
/// model.
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/report",
    tag = "sessions",
    operation_id = "get_session_report",
    summary = "A session's usage report",
    description = "Tokens and cost of the session, the reference's `UsageReport`: `total`, \
`runs` (every run of the session, sub-runs included, keyed by run id, each with its own model \
calls, where it sits in its tree and its calls rolled up with its sub-runs' in \
`with_sub_runs`), and every model call by role (`roles`), by agent (`agents`) and by model \
(`models`). A key limited to some agents must be allowed on every agent that ran in the \
session. Scope `read`.",
    params(("session_id" = String, Path, description = "The session.")),
    responses(
        (status = 200, description = "The report.", body = UsageReportSchema),
        (status = 403, description = "The key lacks the scope `read`, or may not use an agent that ran in the session.", body = ErrorBody),
        (status = 404, description = "No such session in the caller's tenant.", body = ErrorBody),
        (status = 422, description = "The query string holds a parameter (none is accepted).", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
async fn report(
    State(state): State<AppState>,
    caller: Caller,
    Path(session_id): Path<String>,
    params: Params,
) -> Result<Json<UsageReport>, ApiError> {
    caller.require(Scope::Read)?;
    params.none()?;
    let loom = &state.loom;
    session(loom, &caller, &session_id).await?;
    let report = loom
        .session_report(&session_id, Some(&caller.tenant))
        .await
        .map_err(|e| loom_error(loom, &e))?;
    Ok(Json(report))
}

/// `DELETE /sessions/{session_id}` (scope `admin`): erases the session (GDPR): its journal,
/// its files and its idempotency keys; answers a [`SessionDeletion`] `{session_id,
/// events_deleted, files_deleted, idempotency_keys_deleted}`, or 404 when there was nothing.
#[utoipa::path(
    delete,
    path = "/sessions/{session_id}",
    tag = "sessions",
    operation_id = "delete_session",
    summary = "Erase a session (GDPR)",
    description = "Erases the session: its journal, the files stored beside it and the \
idempotency records of its runs, and says how many of each went. A second erasure finds \
nothing (404). A session whose journal cannot be read is erased all the same; a key limited to \
some agents must be allowed on every agent that ran in the session (so it cannot erase a \
session it cannot read). Scope `admin`.",
    params(("session_id" = String, Path, description = "The session.")),
    responses(
        (status = 200, description = "Erased: what went.", body = SessionDeletionSchema),
        (status = 403, description = "The key lacks the scope `admin`, or may not use an agent that ran in the session.", body = ErrorBody),
        (status = 404, description = "No such session in the caller's tenant.", body = ErrorBody),
        (status = 422, description = "The query string holds a parameter (none is accepted).", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(session_id): Path<String>,
    params: Params,
) -> Result<Json<SessionDeletion>, ApiError> {
    caller.require(Scope::Admin)?;
    params.none()?;
    let loom = &state.loom;
    // Read only to check the agents of a limited key: erasing needs no reading, so an
    // unreadable session can be erased.
    if caller.agent_limit().is_some() {
        session(loom, &caller, &session_id).await?;
    }
    let deletion = loom
        .delete_session(&session_id, Some(&caller.tenant))
        .await
        .map_err(|e| loom_error(loom, &e))?;
    tracing::info!(
        tenant = %caller.tenant,
        session = %session_id,
        events = deletion.events_deleted,
        "session erased"
    );
    Ok(Json(deletion))
}

/// `POST /sessions/{session_id}/compact` (scope `run`): compacts the session now
/// (`sessions.compaction`) and answers a [`loom_ia::CompactionNote`]: `applied`, `kept` (the
/// summary left out markers of the originals, which stay), `failed` or `nothing`.
#[utoipa::path(
    post,
    path = "/sessions/{session_id}/compact",
    tag = "sessions",
    operation_id = "compact_session",
    summary = "Compact a session's history",
    description = "Summarizes the turns before the last `keep_last` successful ones with the \
compaction model, checks that the summary keeps their amounts, dates, references and e-mail \
addresses, and replaces them by the summary in the history of the session's next runs; when the \
summary leaves some out after one retry, the original turns are kept (`kept`). The compaction is \
journaled as a run of kind `compaction`. 409 when compaction is not configured. Scope `run`.",
    params(("session_id" = String, Path, description = "The session.")),
    responses(
        (status = 200, description = "What the compaction did.", body = CompactionNoteSchema),
        (status = 403, description = "The key lacks the scope `run`, or may not use an agent that ran in the session.", body = ErrorBody),
        (status = 404, description = "No such session in the caller's tenant.", body = ErrorBody),
        (status = 409, description = "Compaction is not configured (`sessions.compaction`).", body = ErrorBody),
        (status = 422, description = "The query string holds a parameter (none is accepted).", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
async fn compact(
    State(state): State<AppState>,
    caller: Caller,
    Path(session_id): Path<String>,
    params: Params,
) -> Result<Json<loom_ia::CompactionNote>, ApiError> {
    caller.require(Scope::Run)?;
    params.none()?;
    let loom = &state.loom;
    // A limited key compacts only a session whose every agent it may use.
    session(loom, &caller, &session_id).await?;
    let note = loom
        .compact(Some(&caller.tenant), &session_id)
        .await
        .map_err(|e| loom_error(loom, &e))?;
    Ok(Json(note))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_name_is_quoted_and_percent_encoded() {
        assert_eq!(
            content_disposition("devis \"final\" é.pdf"),
            "attachment; filename=\"devis _final_ _.pdf\"; \
             filename*=UTF-8''devis%20%22final%22%20%C3%A9.pdf"
        );
        assert!(HeaderValue::from_str(&content_disposition("a\r\nb")).is_ok());
    }
}
