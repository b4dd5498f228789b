//! The journal as `loom://` resources, all in the caller's tenant: runs and sessions (lists),
//! a run's result, events and trace, a session's runs and events, and artifacts (blobs).
//!
//! Reading needs the `read` scope; without `read_content` the content fields are removed (and
//! listed in `redacted`) exactly as the REST API removes them ([`loom_ia::redact`]: run results,
//! traces, sessions, and events by payload type), and artifacts cannot be read. The run and
//! session lists hold no content (ids, statuses, usage, costs).

use base64::Engine as _;
use loom_ia::{LoomError, Redact, RunState, config::Scope};
use rmcp::{
    ErrorData,
    model::{ReadResourceResult, Resource, ResourceContents, ResourceTemplate},
};
use serde_json::{Value, json};

use crate::{Access, LoomMcp};

const JSON: &str = "application/json";
const JSONL: &str = "application/x-ndjson";

/// The fixed resources.
pub(crate) fn listed(access: &Access) -> Vec<Resource> {
    if !access.allows(Scope::Read) {
        return Vec::new();
    }
    let mut listed = vec![
        Resource::new("loom://runs", "runs")
            .with_description("The runs of the tenant, most recent session first.")
            .with_mime_type(JSON),
    ];
    if !access.agent_limited() {
        listed.push(
            Resource::new("loom://sessions", "sessions")
                .with_description("The sessions of the tenant, most recent first.")
                .with_mime_type(JSON),
        );
    }
    listed
}

/// The resource templates.
pub(crate) fn templates(access: &Access) -> Vec<ResourceTemplate> {
    if !access.allows(Scope::Read) {
        return Vec::new();
    }
    let mut templates = vec![
        ResourceTemplate::new("loom://runs/{run_id}{?session_id}", "run")
            .with_description(
                "A run's status and result (session_id: when the run is in a named session).",
            )
            .with_mime_type(JSON),
        ResourceTemplate::new("loom://runs/{run_id}/events{?session_id}", "run events")
            .with_description("A run's events, in journal order.")
            .with_mime_type(JSON),
        ResourceTemplate::new("loom://traces/{run_id}{?session_id}", "trace")
            .with_description("A run as a tree of steps, model calls and tool calls.")
            .with_mime_type(JSON),
    ];
    if !access.agent_limited() {
        templates.push(
            ResourceTemplate::new("loom://sessions/{session_id}", "session")
                .with_description("A session's runs and the approvals it waits for.")
                .with_mime_type(JSON),
        );
        templates.push(
            ResourceTemplate::new("loom://sessions/{session_id}/events", "session events")
                .with_description("A session's journal, one event per line.")
                .with_mime_type(JSONL),
        );
    }
    if access.allows(Scope::ReadContent) {
        templates.push(
            ResourceTemplate::new("loom://artifacts/{tenant}/{session_id}/{file}", "artifact")
                .with_description(
                    "A file of a session (an attachment, an offloaded result); artifact:// \
                     URIs are readable too.",
                ),
        );
    }
    templates
}

/// Reads `uri` for `access`.
pub(crate) async fn read(
    server: &LoomMcp,
    access: &Access,
    uri: &str,
) -> Result<ReadResourceResult, ErrorData> {
    access
        .require(Scope::Read)
        .map_err(|refused| ErrorData::invalid_request(refused, None))?;
    if let Some(artifact) = uri.strip_prefix("artifact://") {
        return read_artifact(server, access, uri, &format!("artifact://{artifact}")).await;
    }
    let Some(rest) = uri.strip_prefix("loom://") else {
        return Err(not_found(format!(
            "unknown resource {uri} (expected loom://… or artifact://…)"
        )));
    };
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let session = query_value(query, "session_id");
    let parts: Vec<&str> = path.split('/').collect();
    let loom = server.loom();
    let tenant = access.tenant();
    let content = access.reads_content();
    match parts.as_slice() {
        ["runs"] => {
            let mut runs = Vec::new();
            for summary in loom.sessions(Some(tenant)).await.map_err(failed)? {
                let states = match loom.session_runs(&summary.session_id, Some(tenant)).await {
                    Ok(states) => states,
                    Err(LoomError::UnknownSession(_)) => continue,
                    Err(error) => return Err(failed(error)),
                };
                for state in states {
                    let agent = state.agent.clone().unwrap_or_default();
                    if access.agent_limited() && !access.allows_agent(loom.config(), &agent) {
                        continue;
                    }
                    runs.push(run_line(&state));
                }
            }
            Ok(json_text(uri, &Value::Array(runs)))
        }
        ["sessions"] => {
            whole_sessions(access)?;
            let sessions: Vec<Value> = loom
                .sessions(Some(tenant))
                .await
                .map_err(failed)?
                .into_iter()
                .map(|s| {
                    json!({
                        "session_id": s.session_id,
                        "last_seq": s.last_seq,
                        "updated_at": s.updated_at,
                    })
                })
                .collect();
            Ok(json_text(uri, &Value::Array(sessions)))
        }
        ["runs", run_id] => {
            let run = server
                .visible_run(access, run_id, session.as_deref())
                .await?;
            let result = loom.result(&run).await.map_err(failed)?;
            Ok(json_text(uri, &result.view(content)))
        }
        ["runs", run_id, "events"] => {
            let run = server
                .visible_run(access, run_id, session.as_deref())
                .await?;
            let events: Vec<Value> = loom
                .events(&run)
                .await
                .map_err(failed)?
                .iter()
                .map(|event| event.view(content))
                .collect();
            Ok(json_text(uri, &Value::Array(events)))
        }
        ["traces", run_id] => {
            let run = server
                .visible_run(access, run_id, session.as_deref())
                .await?;
            let trace = loom.trace(&run).await.map_err(failed)?;
            Ok(json_text(uri, &trace.view(content)))
        }
        ["sessions", session_id] => {
            whole_sessions(access)?;
            let info = loom
                .session(session_id, Some(tenant))
                .await
                .map_err(failed)?;
            Ok(json_text(uri, &info.view(content)))
        }
        ["sessions", session_id, "events"] => {
            whole_sessions(access)?;
            // As stored with `read_content`, else each event without its content.
            let text = if content {
                loom.export_session(session_id, Some(tenant))
                    .await
                    .map_err(failed)?
            } else {
                let mut text = String::new();
                for event in loom
                    .session_events(session_id, Some(tenant))
                    .await
                    .map_err(failed)?
                {
                    text.push_str(&event.redacted().to_string());
                    text.push('\n');
                }
                text
            };
            Ok(ReadResourceResult::new(vec![
                ResourceContents::text(text, uri).with_mime_type(JSONL),
            ]))
        }
        ["artifacts", artifact @ ..] if !artifact.is_empty() => {
            let target = format!("artifact://{}", artifact.join("/"));
            read_artifact(server, access, uri, &target).await
        }
        _ => Err(not_found(format!(
            "unknown resource {uri} (loom://runs, loom://sessions, loom://runs/{{run_id}}, \
             loom://runs/{{run_id}}/events, loom://traces/{{run_id}}, \
             loom://sessions/{{session_id}}, loom://sessions/{{session_id}}/events, \
             loom://artifacts/…)"
        ))),
    }
}

/// The bytes of an artifact of the caller's tenant, as a blob.
async fn read_artifact(
    server: &LoomMcp,
    access: &Access,
    uri: &str,
    artifact: &str,
) -> Result<ReadResourceResult, ErrorData> {
    access
        .require(Scope::ReadContent)
        .map_err(|refused| ErrorData::invalid_request(refused, None))?;
    if access.agent_limited() {
        return Err(ErrorData::invalid_request(
            "a key limited to some agents cannot read a session's files",
            None,
        ));
    }
    let bytes = server
        .loom()
        .artifact(access.tenant(), artifact)
        .await
        .map_err(failed)?
        .ok_or_else(|| not_found(format!("no artifact {uri}")))?;
    let blob = base64::engine::general_purpose::STANDARD.encode(bytes);
    let extension = artifact.rsplit('.').next().unwrap_or_default();
    Ok(ReadResourceResult::new(vec![
        ResourceContents::blob(blob, uri).with_mime_type(media_type(extension)),
    ]))
}

/// A run as the lists show it.
fn run_line(state: &RunState) -> Value {
    json!({
        "run_id": state.run_id,
        "session_id": state.session_id,
        "agent": state.agent,
        "status": state.status,
        "parent_run_id": state.parent_run_id,
        "iterations": state.iterations,
        "usage": state.usage,
        "cost_usd": state.cost_usd,
    })
}

/// Refused for a key limited to some agents (a session may hold other agents' runs).
fn whole_sessions(access: &Access) -> Result<(), ErrorData> {
    if access.agent_limited() {
        Err(ErrorData::invalid_request(
            "a key limited to some agents cannot read whole sessions: read its runs \
             (loom://runs/{run_id})",
            None,
        ))
    } else {
        Ok(())
    }
}

fn json_text(uri: &str, value: &Value) -> ReadResourceResult {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    ReadResourceResult::new(vec![ResourceContents::text(text, uri).with_mime_type(JSON)])
}

fn not_found(message: String) -> ErrorData {
    ErrorData::resource_not_found(message, None)
}

/// An unknown run, session or artifact is "not found"; anything else is an internal error.
fn failed(error: LoomError) -> ErrorData {
    match error {
        LoomError::UnknownRun(_) | LoomError::UnknownSession(_) | LoomError::Refused(_) => {
            not_found(error.to_string())
        }
        other => ErrorData::internal_error(other.to_string(), None),
    }
}

/// `key=value` of a query string.
fn query_value(query: &str, key: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_owned())
        .filter(|v| !v.is_empty())
}

/// The media type of an artifact's extension.
fn media_type(extension: &str) -> &'static str {
    match extension {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "json" => "application/json",
        "txt" | "md" => "text/plain",
        _ => "application/octet-stream",
    }
}
