//! The journal as `loom://` resources, all in the caller's tenant: runs and sessions (lists),
//! a run's result, events and trace, a session's runs and events, and artifacts (blobs).
//!
//! Reading needs the `read` scope; without `read_content` the content fields are removed (and
//! listed in `redacted`) exactly as the REST API removes them ([`loom_ia::redact`]: run results,
//! traces, sessions, and events by payload type), and artifacts cannot be read. The run and
//! session lists hold no content (ids, statuses, usage, costs).
//!
//! `loom://runs` is the facade's [`Loom::runs`](loom_ia::Loom::runs), as `GET /v1/runs`: a
//! [`RunPage`](loom_ia::RunPage) `{runs, scanned, truncated}` of the caller's tenant (and of
//! its key's agents), filtered by the query of `loom://runs{?agent,status,since,until,limit,sessions}`
//! with the REST values: `status` repeatable (`status=paused&status=failed`) or
//! comma-separated (`status=paused,failed`, the RFC 6570 expansion of a list), `since` and
//! `until` RFC 3339 or `YYYY-MM-DD` (when the runs started, `until` excluded), `limit` 1 to 200
//! (default 50), `sessions` 1 to 200 (default 50). The URI is read by the `url` crate and its
//! query by [`loom_ia::QueryString`], the reader of the REST API too (RFC 3986
//! percent-decoding: a `+` stays a `+`). An unknown parameter, a single-valued one given twice,
//! an empty or unusable value is an `invalid params` error naming the parameter.

use base64::Engine as _;
use loom_ia::{
    LoomError, QueryString, Redact, RunQuery,
    config::Scope,
    query::{DEFAULT_RUNS, DEFAULT_SESSIONS, RUN_STATUSES},
};
use rmcp::{
    ErrorData,
    model::{ReadResourceResult, Resource, ResourceContents, ResourceTemplate},
};
use serde_json::Value;
use url::Url;

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
            .with_description(
                "The runs of the tenant, most recent first: {runs, scanned, truncated}, at most \
                 50 from the 50 most recent sessions (filter and page with loom://runs{?…}).",
            )
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
        ResourceTemplate::new(RUNS_TEMPLATE, "runs (filtered)")
            .with_description(
                "The runs of the tenant, most recent first, as GET /v1/runs: {runs, scanned, \
                 truncated}. agent; status (repeatable or comma-separated: ready_for_model, \
                 awaiting_tools, waiting_child, paused, finalizing, completed, failed, \
                 cancelled); since, until (RFC 3339 or YYYY-MM-DD, when the runs started, until \
                 excluded; the next page: until = started_at of the last run); limit 1-200 \
                 (default 50); sessions 1-200 (most recent sessions read, default 50).",
            )
            .with_mime_type(JSON),
        ResourceTemplate::new("loom://runs/{run_id}{?session_id}", "run")
            .with_description(
                "A run's status and result (session_id: when the run is in a named session).",
            )
            .with_mime_type(JSON),
        ResourceTemplate::new("loom://runs/{run_id}/events{?session_id}", "run events")
            .with_description("A run's events, in journal order.")
            .with_mime_type(JSON),
        ResourceTemplate::new("loom://traces/{run_id}{?session_id}", "trace")
            .with_description(
                "A run's trace: its figures and its spans (steps, model calls, tool calls, \
                 judges, approvals, sub-runs).",
            )
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
        if access.allows(Scope::ReadContent) {
            templates.push(
                ResourceTemplate::new("loom://sessions/{session_id}/state", "session state")
                    .with_description(
                        "A session's state, sorted by key: what its runs wrote over the \
                         defaults its agent declares.",
                    )
                    .with_mime_type(JSON),
            );
        }
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
    let (segments, params) = loom_uri(uri)?;
    let parts: Vec<&str> = segments.iter().map(String::as_str).collect();
    // The run resources take `session_id`; the others no parameter.
    let known: &[&str] = match parts.as_slice() {
        ["runs"] => RUN_PARAMETERS,
        ["runs", _] | ["runs", _, "events"] | ["traces", _] => &["session_id"],
        _ => &[],
    };
    params.only(known).map_err(failed)?;
    let session = params.text("session_id").map_err(failed)?;
    let loom = server.loom();
    let tenant = access.tenant();
    let content = access.reads_content();
    match parts.as_slice() {
        ["runs"] => {
            let page = loom
                .runs(&run_query(access, &params)?)
                .await
                .map_err(failed)?;
            Ok(json_text(
                uri,
                &serde_json::to_value(page).unwrap_or_default(),
            ))
        }
        ["sessions"] => {
            whole_sessions(access)?;
            let sessions = loom.sessions(Some(tenant)).await.map_err(failed)?;
            // Ids, counts and instants: serializing cannot fail.
            let sessions = serde_json::to_value(sessions).unwrap_or_default();
            Ok(json_text(uri, &sessions))
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
                .visible_tree(access, run_id, session.as_deref())
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
        ["sessions", session_id, "state"] => {
            whole_sessions(access)?;
            // State values are content.
            access
                .require(Scope::ReadContent)
                .map_err(|refused| ErrorData::invalid_request(refused, None))?;
            let values = loom
                .session_state(session_id, Some(tenant))
                .await
                .map_err(failed)?;
            Ok(json_text(uri, &Value::Object(values)))
        }
        ["artifacts", artifact @ ..] if !artifact.is_empty() => {
            let target = format!("artifact://{}", artifact.join("/"));
            read_artifact(server, access, uri, &target).await
        }
        _ => Err(not_found(format!(
            "unknown resource {uri} (loom://runs{{?…}}, loom://sessions, loom://runs/{{run_id}}, \
             loom://runs/{{run_id}}/events, loom://traces/{{run_id}}, \
             loom://sessions/{{session_id}}, loom://sessions/{{session_id}}/events, \
             loom://sessions/{{session_id}}/state, loom://artifacts/…)"
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

/// The template of the filtered run list.
const RUNS_TEMPLATE: &str = "loom://runs{?agent,status,since,until,limit,sessions}";

/// The parameters of `loom://runs` (those of `GET /v1/runs`).
const RUN_PARAMETERS: &[&str] = &["agent", "status", "since", "until", "limit", "sessions"];

/// The facade query of `loom://runs{?…}`: the caller's tenant, its key's agents, the filters.
fn run_query(access: &Access, params: &QueryString) -> Result<RunQuery, ErrorData> {
    let agent = params.text("agent").map_err(failed)?;
    if let Some(agent) = &agent {
        access
            .require_agent(agent)
            .map_err(|refused| ErrorData::invalid_request(refused, None))?;
    }
    let names: Vec<&str> = RUN_STATUSES.iter().map(|status| status.as_str()).collect();
    Ok(RunQuery {
        tenant_id: Some(access.tenant().to_owned()),
        agents: access.agent_limit(),
        agent,
        statuses: params
            .choices("status", &names.join(", "))
            .map_err(failed)?,
        since: params.instant("since").map_err(failed)?,
        until: params.instant("until").map_err(failed)?,
        limit: params.count("limit", DEFAULT_RUNS).map_err(failed)?,
        sessions: params.count("sessions", DEFAULT_SESSIONS).map_err(failed)?,
    })
}

/// The path segments (the host first: `runs`, `sessions`, `traces`…) and the query of a
/// `loom://` URI, read by the `url` crate: each segment percent-decoded, the query by
/// [`QueryString`] as the REST API reads its own.
fn loom_uri(uri: &str) -> Result<(Vec<String>, QueryString), ErrorData> {
    let unknown = || {
        not_found(format!(
            "unknown resource {uri} (expected loom://… or artifact://…)"
        ))
    };
    let url = Url::parse(uri).map_err(|_| unknown())?;
    if url.scheme() != "loom" || url.fragment().is_some() {
        return Err(unknown());
    }
    let host = url
        .host_str()
        .filter(|host| !host.is_empty())
        .ok_or_else(unknown)?;
    let mut segments = vec![decoded_segment(host).ok_or_else(unknown)?];
    if let Some(path) = url.path_segments() {
        for segment in path {
            segments.push(decoded_segment(segment).ok_or_else(unknown)?);
        }
    }
    // `loom://runs/` names `loom://runs`.
    if segments.len() > 1 && segments.last().is_some_and(String::is_empty) {
        segments.pop();
    }
    let params = QueryString::parse(url.query().unwrap_or_default()).map_err(failed)?;
    Ok((segments, params))
}

/// A path segment percent-decoded, when it decodes to UTF-8.
fn decoded_segment(segment: &str) -> Option<String> {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .ok()
        .map(|text| text.into_owned())
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

/// An unknown run, session or artifact is "not found", an unusable query value "invalid
/// params" (naming the parameter); anything else is an internal error.
fn failed(error: LoomError) -> ErrorData {
    match error {
        LoomError::UnknownRun(_) | LoomError::UnknownSession(_) | LoomError::Refused(_) => {
            not_found(error.to_string())
        }
        LoomError::InvalidQuery { .. } => ErrorData::invalid_params(error.to_string(), None),
        other => ErrorData::internal_error(crate::told(&other), None),
    }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use loom_ia::{RunStatus, config::ApiKeySpec};

    use super::*;

    fn query(text: &str) -> QueryString {
        QueryString::parse(text).unwrap()
    }

    fn message(error: ErrorData) -> (rmcp::model::ErrorCode, String) {
        (error.code, error.message.to_string())
    }

    #[test]
    fn a_run_query_reads_the_rest_filters() {
        let access = Access::local("acme");
        let params = query(
            "agent=devis&status=paused,failed&status=completed&since=2026-05-01\
             &until=2026-05-01T12%3A00%3A00+02:00&limit=5&sessions=7",
        );
        params.only(RUN_PARAMETERS).unwrap();
        let run_query = run_query(&access, &params).unwrap();
        assert_eq!(run_query.tenant_id.as_deref(), Some("acme"));
        assert_eq!(run_query.agent.as_deref(), Some("devis"));
        assert_eq!(run_query.agents, None);
        assert_eq!(
            run_query.statuses,
            vec![RunStatus::Paused, RunStatus::Failed, RunStatus::Completed]
        );
        assert_eq!(
            run_query.since.unwrap().to_rfc3339(),
            "2026-05-01T00:00:00+00:00"
        );
        assert_eq!(
            run_query.until.unwrap().to_rfc3339(),
            "2026-05-01T10:00:00+00:00"
        );
        assert_eq!((run_query.limit, run_query.sessions), (5, 7));
        let defaults = run_query_of(&access, "").unwrap();
        assert_eq!(
            (defaults.limit, defaults.sessions),
            (DEFAULT_RUNS, DEFAULT_SESSIONS)
        );
    }

    fn run_query_of(access: &Access, text: &str) -> Result<RunQuery, ErrorData> {
        let params = QueryString::parse(text).map_err(failed)?;
        params.only(RUN_PARAMETERS).map_err(failed)?;
        run_query(access, &params)
    }

    #[test]
    fn an_unusable_run_query_names_its_parameter() {
        let access = Access::local("acme");
        let invalid = rmcp::model::ErrorCode::INVALID_PARAMS;
        for (text, expected) in [
            (
                "status=done",
                "status: unknown value 'done' (expected: ready_for_model, awaiting_tools, \
                 waiting_child, paused, finalizing, completed, failed, cancelled)",
            ),
            (
                "status=paused,",
                "status: unknown value '' (expected: ready_for_model, awaiting_tools, \
                 waiting_child, paused, finalizing, completed, failed, cancelled)",
            ),
            ("limit=x", "limit: 'x' is not a whole number"),
            ("agent=a&agent=b", "agent: given more than once"),
            ("agent=", "agent: must not be empty"),
            (
                "since=hier",
                "since: 'hier' is neither an RFC 3339 instant nor a YYYY-MM-DD date",
            ),
            (
                "tenant=globex",
                "tenant: unknown parameter (expected: agent, status, since, until, limit, \
                 sessions)",
            ),
            ("agent=%E9", "agent: '%E9' does not decode to UTF-8"),
            ("agent=de%2", "agent: 'de%2' holds a broken %-escape"),
            // A sign is not a hex digit: `%+1` is not byte 1.
            ("agent=%+1", "agent: '%+1' holds a broken %-escape"),
        ] {
            let error = run_query_of(&access, text).unwrap_err();
            assert_eq!(message(error), (invalid, expected.to_owned()), "{text}");
        }
        // A key limited to some agents may not name another.
        let limited = Access::key(Arc::new(ApiKeySpec {
            id: "devis-seul".into(),
            hash: format!("sha256:{}", "0".repeat(64)),
            tenant: "acme".into(),
            expires: None,
            scopes: vec![Scope::Read],
            agents: vec!["devis".into()],
            rate_limit: None,
        }));
        assert_eq!(
            message(run_query_of(&limited, "agent=paiement").unwrap_err()),
            (
                rmcp::model::ErrorCode::INVALID_REQUEST,
                "key 'devis-seul' is not allowed on the agent 'paiement'".to_owned()
            )
        );
        let own = run_query_of(&limited, "agent=devis").unwrap();
        assert_eq!(own.agents, Some(vec!["devis".to_owned()]));
    }

    /// A resource URI is read by the `url` crate: segments decoded, the query by the shared
    /// reader, anything else not found.
    #[test]
    fn resource_uris_are_read_by_the_url_crate() {
        let (segments, params) = loom_uri("loom://runs/r%2D1/events?session_id=s-1").unwrap();
        assert_eq!(segments, ["runs", "r-1", "events"]);
        assert_eq!(params.all("session_id"), ["s-1"]);
        let (segments, _) = loom_uri("loom://runs/").unwrap();
        assert_eq!(segments, ["runs"]);
        for bad in [
            "runs",
            "http://runs",
            "loom://",
            "loom://runs#x",
            "loom://runs/%FF",
        ] {
            let error = loom_uri(bad).unwrap_err();
            assert_eq!(
                error.code,
                rmcp::model::ErrorCode::RESOURCE_NOT_FOUND,
                "{bad}"
            );
        }
        let error = loom_uri("loom://runs?agent=%+1").unwrap_err();
        assert_eq!(
            message(error),
            (
                rmcp::model::ErrorCode::INVALID_PARAMS,
                "agent: '%+1' holds a broken %-escape".to_owned()
            )
        );
    }

    /// The `state` argument of an agent tool is journaled with the run and read back from
    /// `loom://sessions/{id}/state` (scope `read_content`); a refused state runs nothing.
    #[tokio::test]
    async fn an_agent_tools_state_is_read_back_from_its_session_resource() {
        use loom_ia::config::{AgentSpec, Config, LoomConfig, ModelSpec, Sdk, StateKey};
        use serde_json::json;

        let mut carnet = AgentSpec::new("carnet", "fake-1");
        carnet.state.insert(
            "client".into(),
            StateKey {
                schema: json!({"type": "string"}).as_object().unwrap().clone(),
                description: String::new(),
                from: Vec::new(),
                required: false,
                default: None,
            },
        );
        let mut model = ModelSpec::new("fake-1", Sdk::Fake, "FAKE");
        model
            .params
            .insert("script".into(), json!([{"text": "Noté."}]));
        let raw = LoomConfig {
            models: vec![model],
            agents: vec![carnet],
            ..LoomConfig::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let loom = loom_ia::Loom::new(Config::new(raw, dir.path().to_path_buf()).unwrap()).unwrap();
        let access = Access::local("default");
        let server = LoomMcp::stdio(loom, access.clone());
        let (progress, _lines) = crate::progress::Progress::new(false, true);
        let arguments = |state: Value| {
            json!({"message": "Bonjour", "session_id": "c1", "state": state})
                .as_object()
                .unwrap()
                .clone()
        };
        let result = server
            .start(
                &access,
                "carnet",
                arguments(json!({"client": "C-42"})),
                &progress,
            )
            .await
            .unwrap();
        assert_eq!(result.status, RunStatus::Completed);
        let answer = read(&server, &access, "loom://sessions/c1/state")
            .await
            .unwrap();
        let shown = serde_json::to_value(&answer.contents[0]).unwrap();
        let state: Value = serde_json::from_str(shown["text"].as_str().unwrap()).unwrap();
        assert_eq!(state, json!({"client": "C-42"}));

        let refused = server
            .start(
                &access,
                "carnet",
                arguments(json!({"client": 7})),
                &progress,
            )
            .await
            .unwrap_err();
        assert!(
            refused.contains("session state: client: does not follow its schema"),
            "{refused}"
        );
        let refused = server
            .start(&access, "carnet", arguments(json!("C-1")), &progress)
            .await
            .unwrap_err();
        assert_eq!(refused, "state must be an object of the agent's state keys");
        // Without `read_content`, state values stay unread.
        let reader = Access::key(Arc::new(ApiKeySpec {
            id: "lecteur".into(),
            hash: format!("sha256:{}", "0".repeat(64)),
            tenant: "default".into(),
            expires: None,
            scopes: vec![Scope::Read],
            agents: Vec::new(),
            rate_limit: None,
        }));
        assert!(
            read(&server, &reader, "loom://sessions/c1/state")
                .await
                .is_err()
        );
    }
}
