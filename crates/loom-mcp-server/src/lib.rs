//! # loom-mcp-server
//!
//! Loom as an MCP server, on the official SDK `rmcp`: Claude Desktop, Claude Code or any MCP
//! client uses each agent as a tool.
//!
//! - **Tools**: one per agent offered over MCP (`expose.mcp`, on by default) that the caller
//!   may use, taking `{message, session_id?, attachments?}` (an attachment is a base64 image
//!   `{data, media_type, name?}`, an `artifact://` link, or a `file://` path under
//!   `server.mcp.file_roots`) and returning the answer as text, the run result as structured
//!   content, `isError` when the run failed; and the control tools `run_status`, `run_report`
//!   (a run's or a session's usage report) and `cancel` (`by`, default `mcp:<client name>`, is
//!   journaled in the run's `run.cancelled`, whether this process drives the run or not).
//! - **Resources**: `loom://runs`, `loom://sessions` and the templates
//!   `loom://runs{?agent,status,since,until,limit,sessions}`, `loom://runs/{run_id}`,
//!   `…/events`, `loom://traces/{run_id}`, `loom://sessions/{session_id}`, `…/events`, `…/state`
//!   (scope `read_content`),
//!   `loom://artifacts/…` (blobs), all in the caller's tenant. The run list is the page of
//!   `GET /v1/runs` (`loom_ia::Loom::runs`: `{runs, scanned, truncated}`, the key's agents
//!   only), with its filters and their values (`status` repeated or comma-separated); an
//!   unusable query value is an `invalid params` error naming the parameter.
//! - **Progress**: when the client sends a progress token, one notification per progress event
//!   of the run, with the lines of `loom run --stream`.
//! - **Approvals** never go through a tool: when a run pauses on one and the client supports
//!   elicitation (stdio), the user is asked through a form `{decision: approve|reject,
//!   reason?}` (a server request before protocol 2026-07-28, an `InputRequiredResult` since),
//!   the decision is journaled with `by = "mcp:<client name>"` and the run goes on; otherwise
//!   the call returns with the pending approvals and the run waits, paused, for the REST API or
//!   `loom approve`.
//!
//! Without the `read_content` scope, everything returned (run results of agent tools and
//! `run_status`, usage reports of `run_report`, events, traces, sessions) loses its content
//! fields exactly as on the REST API ([`loom_ia::redact`]), the paths removed listed in
//! `redacted` (a usage report holds none: names, counts, tokens and costs).
//!
//! Two transports: [`serve_stdio`] (`loom mcp`: one tenant, no key, everything allowed) and
//! [`http_service`] (mounted at `<base_path>/mcp` by `loom serve` when `server.mcp.http` is on:
//! stateless, each request's [`Access`] comes from its API key, with the REST API's scopes;
//! `Host` and `Origin` are checked against `server.mcp.allowed_hosts` and `allowed_origins`).
//!
//! **Architecture invariant:** every operation goes through the facade (`loom_ia::Loom`) in
//! the caller's tenant; nothing here reads a journal directly.

mod access;
mod approvals;
mod attachments;
mod progress;
mod resources;
mod server;

use std::sync::Arc;

use loom_ia::{DEFAULT_TENANT, Loom, config::OriginPattern};
use rmcp::{
    ServiceExt,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
    },
};

pub use access::Access;
pub use server::LoomMcp;

/// What the client is told of `error`: its message, except for a server failure
/// ([`LoomError::is_internal`]: a journal, engine or configuration error, whose message may
/// name files), which is logged at ERROR under a new id and told as that id only.
pub(crate) fn told(error: &loom_ia::LoomError) -> String {
    if !error.is_internal() {
        return error.to_string();
    }
    let id = uuid::Uuid::now_v7().to_string();
    tracing::error!(error_id = %id, %error, "MCP request failed");
    format!("internal error: the server logged its detail under the id {id}")
}

/// The MCP server over streamable HTTP, as a tower service (mounted by `loom-http`).
pub type HttpService = StreamableHttpService<LoomMcp, NeverSessionManager>;

/// Why the MCP server could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// `--tenant` names a tenant the configuration does not declare.
    #[error("{0}")]
    UnknownTenant(String),
    /// The session with the client could not start (the client closed stdin, or did not open
    /// the protocol).
    #[error("the MCP session could not start: {0}")]
    Start(String),
    /// The server stopped abnormally.
    #[error("the MCP server stopped: {0}")]
    Stopped(String),
}

/// Serves MCP on stdin/stdout for `tenant` (default `default`) until the client closes the
/// connection; then cancels the runs still in flight (their journals close them). Logs must go
/// to stderr: stdout is the protocol.
pub async fn serve_stdio(loom: Loom, tenant: Option<&str>) -> Result<(), ServeError> {
    let tenant = tenant.unwrap_or(DEFAULT_TENANT);
    loom.config()
        .check_tenant(tenant)
        .map_err(|e| ServeError::UnknownTenant(e.to_string()))?;
    for agent in loom.config().agents() {
        if agent.expose.mcp
            && loom
                .config()
                .tenant(tenant)
                .is_none_or(|t| t.allows_agent(&agent.name))
        {
            tracing::info!(agent = %agent.name, tenant, "agent offered over MCP on stdio");
        }
    }
    let server = LoomMcp::stdio(loom.clone(), Access::local(tenant));
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| ServeError::Start(e.to_string()))?;
    let outcome = running.waiting().await;
    loom.cancel_all();
    outcome
        .map(|_| ())
        .map_err(|e| ServeError::Stopped(e.to_string()))
}

/// The MCP server over streamable HTTP for `loom serve`: stateless (no MCP session, so no
/// elicitation: runs needing an approval pause), requests up to `max_body_bytes`, `Host`
/// checked against `server.mcp.allowed_hosts` (default: `localhost`, `127.0.0.1`, `::1` on any
/// port) and a present `Origin` against `server.mcp.allowed_origins` (none by default: any
/// `Origin` is refused with 403). An origin entry without a port admits the scheme's default
/// port only: it is handed to rmcp with that port written ([`OriginPattern`]), since rmcp reads
/// a port-less entry as any port. Each request must carry its [`Access`] in the extensions of
/// its HTTP request.
pub fn http_service(loom: &Loom, max_body_bytes: usize) -> HttpService {
    let settings = &loom.config().raw().server.mcp;
    // Checked at load: every entry parses.
    let origins: Vec<String> = settings
        .allowed_origins
        .iter()
        .filter_map(|origin| OriginPattern::parse(origin).ok())
        .map(|origin| origin.to_string())
        .collect();
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_max_request_body_bytes(max_body_bytes)
        .with_allowed_origins(origins)
        .enforce_origin_validation();
    if !settings.allowed_hosts.is_empty() {
        config = config.with_allowed_hosts(settings.allowed_hosts.clone());
    }
    let loom = loom.clone();
    StreamableHttpService::new(
        move || Ok(LoomMcp::http(loom.clone())),
        Arc::new(NeverSessionManager::default()),
        config,
    )
}

#[cfg(test)]
mod tests {
    use loom_ia::{LoomError, core::ports::StoreError};

    use super::told;

    /// A server failure is told as an id, never with the file its message names.
    #[test]
    fn a_server_failure_is_told_as_an_id() {
        let journal = LoomError::Journal(StoreError::Io {
            path: "/srv/loom/journal/acme/s-1.jsonl".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        });
        let text = told(&journal);
        assert!(!text.contains("/srv/loom"), "{text}");
        assert!(
            text.starts_with("internal error: the server logged its detail under the id "),
            "{text}"
        );
        let unknown = LoomError::UnknownRun("r-1".into());
        assert_eq!(told(&unknown), "run r-1 not found");
    }
}
