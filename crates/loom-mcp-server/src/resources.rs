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
//! (default 50), `sessions` 1 to 200 (default 50). Query values are percent-decoded (RFC 3986:
//! a `+` stays a `+`). An unknown parameter, a single-valued one given twice, an empty or
//! unusable value is an `invalid params` error naming the parameter.

use base64::Engine as _;
use loom_ia::{
    LoomError, Redact, RunQuery,
    config::Scope,
    query::{DEFAULT_RUNS, DEFAULT_SESSIONS, parse_instant, parse_run_status},
};
use rmcp::{
    ErrorData,
    model::{ReadResourceResult, Resource, ResourceContents, ResourceTemplate},
};
use serde_json::Value;

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
    let params = UriQuery::parse(query)?;
    let parts: Vec<&str> = path.split('/').collect();
    // The run resources take `session_id`; the others no parameter.
    match parts.as_slice() {
        ["runs"] => params.only(RUN_PARAMETERS)?,
        ["runs", _] | ["runs", _, "events"] | ["traces", _] => params.only(&["session_id"])?,
        _ => params.only(&[])?,
    }
    let session = params.one("session_id")?.map(str::to_owned);
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
        ["artifacts", artifact @ ..] if !artifact.is_empty() => {
            let target = format!("artifact://{}", artifact.join("/"));
            read_artifact(server, access, uri, &target).await
        }
        _ => Err(not_found(format!(
            "unknown resource {uri} (loom://runs{{?…}}, loom://sessions, loom://runs/{{run_id}}, \
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

/// The template of the filtered run list.
const RUNS_TEMPLATE: &str = "loom://runs{?agent,status,since,until,limit,sessions}";

/// The parameters of `loom://runs` (those of `GET /v1/runs`).
const RUN_PARAMETERS: &[&str] = &["agent", "status", "since", "until", "limit", "sessions"];

/// The facade query of `loom://runs{?…}`: the caller's tenant, its key's agents, the filters.
fn run_query(access: &Access, params: &UriQuery) -> Result<RunQuery, ErrorData> {
    let agent = params.one("agent")?.map(str::to_owned);
    if let Some(agent) = &agent {
        access
            .require_agent(agent)
            .map_err(|refused| ErrorData::invalid_request(refused, None))?;
    }
    let mut statuses = Vec::new();
    for value in params.all("status") {
        for name in value.split(',') {
            statuses.push(parse_run_status("status", name).map_err(failed)?);
        }
    }
    let instant = |name: &'static str| -> Result<_, ErrorData> {
        params
            .one(name)?
            .map(|text| parse_instant(name, text).map_err(failed))
            .transpose()
    };
    Ok(RunQuery {
        tenant_id: Some(access.tenant().to_owned()),
        agents: access.agent_limit(),
        agent,
        statuses,
        since: instant("since")?,
        until: instant("until")?,
        limit: params.count("limit", DEFAULT_RUNS)?,
        sessions: params.count("sessions", DEFAULT_SESSIONS)?,
    })
}

/// The query of a resource URI as `(name, value)` pairs, in order, percent-decoded.
struct UriQuery {
    pairs: Vec<(String, String)>,
}

impl UriQuery {
    /// Splits `query` (what follows `?`) on `&` and `=`, and decodes each name and value.
    fn parse(query: &str) -> Result<UriQuery, ErrorData> {
        let mut pairs = Vec::new();
        for piece in query.split('&').filter(|piece| !piece.is_empty()) {
            let (name, value) = piece.split_once('=').unwrap_or((piece, ""));
            let name = percent_decoded(name).map_err(|reason| bad_parameter(name, reason))?;
            let value = percent_decoded(value).map_err(|reason| bad_parameter(&name, reason))?;
            pairs.push((name, value));
        }
        Ok(UriQuery { pairs })
    }

    /// Refuses a parameter not in `known`.
    fn only(&self, known: &[&str]) -> Result<(), ErrorData> {
        match self
            .pairs
            .iter()
            .find(|(name, _)| !known.contains(&name.as_str()))
        {
            Some((name, _)) if known.is_empty() => Err(bad_parameter(
                name,
                "unknown parameter (this resource takes none)",
            )),
            Some((name, _)) => Err(bad_parameter(
                name,
                format!("unknown parameter (expected: {})", known.join(", ")),
            )),
            None => Ok(()),
        }
    }

    /// Every value of `name`, in order.
    fn all(&self, name: &str) -> Vec<&str> {
        self.pairs
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The value of a single-valued parameter, refused when given twice or empty.
    fn one(&self, name: &str) -> Result<Option<&str>, ErrorData> {
        match self.all(name).as_slice() {
            [] => Ok(None),
            [""] => Err(bad_parameter(name, "must not be empty")),
            [value] => Ok(Some(value)),
            _ => Err(bad_parameter(name, "given more than once")),
        }
    }

    /// A count (a whole number), `default` when absent; its range is the facade's to check.
    fn count(&self, name: &str, default: usize) -> Result<usize, ErrorData> {
        match self.one(name)? {
            None => Ok(default),
            Some(text) => text
                .parse()
                .map_err(|_| bad_parameter(name, format!("'{text}' is not a whole number"))),
        }
    }
}

/// `text` with its `%XX` escapes decoded (RFC 3986; `+` is kept), refused when an escape is
/// cut short or the bytes are not UTF-8.
pub(crate) fn percent_decoded(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let escape = bytes
                .get(at + 1..at + 3)
                .and_then(|hex| std::str::from_utf8(hex).ok())
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| format!("'{text}' holds a broken %-escape"))?;
            decoded.push(escape);
            at += 3;
        } else {
            decoded.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(decoded).map_err(|_| format!("'{text}' does not decode to UTF-8"))
}

/// An unusable query parameter, named first (as the REST API's `invalid_query`).
fn bad_parameter(parameter: &str, reason: impl std::fmt::Display) -> ErrorData {
    ErrorData::invalid_params(format!("{parameter}: {reason}"), None)
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
        other => ErrorData::internal_error(other.to_string(), None),
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

    fn query(text: &str) -> UriQuery {
        UriQuery::parse(text).unwrap()
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
        let params = UriQuery::parse(text)?;
        params.only(RUN_PARAMETERS)?;
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
}
