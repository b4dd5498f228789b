//! The session routes: list, one session's runs and waiting approvals, its journal as NDJSON,
//! its files, one file's bytes, its usage report, and its GDPR erasure.
//!
//! Every route reads the caller's tenant only (another tenant's session is a 404). A key
//! limited to some agents cannot list sessions (403), and reaches a session only when every
//! agent that ran in it is allowed. Without `read_content`, content fields are removed and
//! listed in `redacted`, and a file's bytes cannot be read.

use axum::{
    Json, Router,
    extract::{Path, State},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use loom_ia::{FILE_ORIGINS, Loom, Redact, SessionInfo, config::Scope};
use serde_json::{Value, json};

use crate::{
    AppState,
    auth::Caller,
    error::ApiError,
    params::{Params, invalid},
    routes::loom_error,
};

/// The routes of this module.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/sessions", get(list))
        .route("/sessions/{session_id}", get(show).delete(delete))
        .route("/sessions/{session_id}/events", get(events))
        .route("/sessions/{session_id}/files", get(files))
        .route("/sessions/{session_id}/files/{file}", get(file))
        .route("/sessions/{session_id}/report", get(report))
}

/// The session, after checking that a key limited to some agents may see every agent that ran
/// in it.
async fn session(loom: &Loom, caller: &Caller, session_id: &str) -> Result<SessionInfo, ApiError> {
    let info = loom
        .session(session_id, Some(&caller.tenant))
        .await
        .map_err(|e| loom_error(loom, &e))?;
    if caller.agent_limit().is_some() {
        for run in &info.runs {
            caller.agent(&run.agent)?;
        }
    }
    Ok(info)
}

/// `GET /sessions`: the tenant's sessions, most recent first,
/// `[{session_id, last_seq, updated_at}]`. 403 for a key limited to some agents (a session
/// list would name sessions of other agents).
async fn list(
    State(state): State<AppState>,
    caller: Caller,
    params: Params,
) -> Result<Json<Value>, ApiError> {
    caller.require(Scope::Read)?;
    params.only(&[])?;
    if caller.agent_limit().is_some() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "agent_not_allowed",
            "a key limited to some agents cannot list the sessions",
        ));
    }
    let loom = &state.loom;
    let sessions = loom
        .sessions(Some(&caller.tenant))
        .await
        .map_err(|e| loom_error(loom, &e))?;
    let listed = sessions
        .into_iter()
        .map(|s| {
            json!({
                "session_id": s.session_id,
                "last_seq": s.last_seq,
                "updated_at": s.updated_at.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
            })
        })
        .collect();
    Ok(Json(Value::Array(listed)))
}

/// `GET /sessions/{session_id}`: a [`SessionInfo`] `{session_id, last_seq, updated_at,
/// runs: [{run_id, agent, status, parent_run_id, iterations, usage, cost_usd, unpiloted}],
/// pending_approvals}` (plus `redacted` without `read_content`).
async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(session_id): Path<String>,
    params: Params,
) -> Result<Json<Value>, ApiError> {
    caller.require(Scope::Read)?;
    params.only(&[])?;
    let info = session(&state.loom, &caller, &session_id).await?;
    Ok(Json(info.view(caller.reads_content())))
}

/// `GET /sessions/{session_id}/events`: the session's journal, one event per line
/// (`application/x-ndjson`), exactly as stored with `read_content`, else masked.
async fn events(
    State(state): State<AppState>,
    caller: Caller,
    Path(session_id): Path<String>,
    params: Params,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    params.only(&[])?;
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

/// `GET /sessions/{session_id}/files?origin=…`: the files stored beside the session
/// (`[SessionFile]`: `{file, uri, name, media_type, size, origin, run_id, call_id,
/// stored_at}`), only those of the given origins (`attachment`, `tool_output`, `offload`;
/// repeatable) when any.
async fn files(
    State(state): State<AppState>,
    caller: Caller,
    Path(session_id): Path<String>,
    params: Params,
) -> Result<Json<Value>, ApiError> {
    caller.require(Scope::Read)?;
    params.only(&["origin"])?;
    let origins: Vec<String> = params
        .all("origin")
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

/// `GET /sessions/{session_id}/files/{file}` (scope `read_content`): the file's bytes, with
/// its media type as `Content-Type` and `Content-Disposition: attachment` naming it.
async fn file(
    State(state): State<AppState>,
    caller: Caller,
    Path((session_id, file)): Path<(String, String)>,
    params: Params,
) -> Result<Response, ApiError> {
    caller.require(Scope::ReadContent)?;
    params.only(&[])?;
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
    let mut encoded = String::new();
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    format!("attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}")
}

/// `GET /sessions/{session_id}/report`: tokens and cost of the session
/// ([`SessionReport`](loom_ia::SessionReport)): each root run, and every call by role, by
/// sub-agent and by model.
async fn report(
    State(state): State<AppState>,
    caller: Caller,
    Path(session_id): Path<String>,
    params: Params,
) -> Result<Json<Value>, ApiError> {
    caller.require(Scope::Read)?;
    params.only(&[])?;
    let loom = &state.loom;
    session(loom, &caller, &session_id).await?;
    let report = loom
        .session_report(&session_id, Some(&caller.tenant))
        .await
        .map_err(|e| loom_error(loom, &e))?;
    Ok(Json(serde_json::to_value(report).unwrap_or(Value::Null)))
}

/// `DELETE /sessions/{session_id}` (scope `admin`): erases the session (GDPR): its journal,
/// its files and its idempotency keys; answers a
/// [`SessionDeletion`](loom_ia::SessionDeletion) `{session_id, events_deleted,
/// files_deleted, idempotency_keys_deleted}`, or 404 when there was nothing.
async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(session_id): Path<String>,
    params: Params,
) -> Result<Json<Value>, ApiError> {
    caller.require(Scope::Admin)?;
    params.only(&[])?;
    let loom = &state.loom;
    session(loom, &caller, &session_id).await?;
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
    Ok(Json(serde_json::to_value(deletion).unwrap_or(Value::Null)))
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
