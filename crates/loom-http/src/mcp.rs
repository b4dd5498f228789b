//! The MCP server over streamable HTTP at `<base_path>/mcp` (`server.mcp.http`): the same API
//! keys and scopes as the REST API, checked here before the request reaches the MCP server.

use axum::{
    Router,
    extract::{Request, State},
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use loom_mcp_server::Access;

use crate::{
    AppState,
    error::{ApiError, ErrorKind},
};

/// The `/mcp` route, when `server.mcp.http` is on.
pub(crate) fn routes(state: &AppState, base_path: &str, max_body_bytes: usize) -> Router<AppState> {
    let service = loom_mcp_server::http_service(&state.loom, max_body_bytes);
    Router::new()
        .route_service(&format!("{base_path}/mcp"), service)
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key))
}

/// Every request needs an API key (401 without, or with an unknown or expired one); a key that
/// can neither run nor read is refused (403). The key's tenant, scopes and agents travel to the
/// MCP server as its [`Access`].
async fn require_key(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let caller = match state.keys.caller(request.headers()).await {
        Ok(caller) => caller,
        Err(refused) => return refused.into_response(),
    };
    let Some(key) = caller.key().cloned() else {
        // Loading refuses `server.mcp.http` without keys; never serve MCP open.
        return ApiError::new(
            ErrorKind::MissingKey,
            "MCP over HTTP needs an API key (security.api_keys)",
        )
        .into_response();
    };
    let access = Access::key(key);
    if !access.usable_over_mcp() {
        let id = caller.key().map(|k| k.id.clone()).unwrap_or_default();
        return ApiError::new(
            ErrorKind::MissingScope,
            format!("key '{id}' lacks the scope 'run' or 'read' needed over MCP"),
        )
        .into_response();
    }
    request.extensions_mut().insert(access);
    next.run(request).await
}

/// Logs, once at start, each agent the server exposes and how it is protected.
pub(crate) fn log_exposure(loom: &loom_ia::Loom) {
    let config = loom.config();
    let keys = !config.raw().security.api_keys.is_empty();
    let mcp = config.raw().server.mcp.http;
    let security = if keys {
        "API key required"
    } else {
        "open: no API key is declared (security.api_keys)"
    };
    for agent in config.agents() {
        if agent.expose.rest {
            tracing::warn!(agent = %agent.name, access = "rest", security, "agent exposed");
        }
        if agent.expose.mcp && mcp {
            // `server.mcp.http` is refused at load without keys.
            tracing::warn!(agent = %agent.name, access = "mcp", security = "API key required", "agent exposed");
        }
    }
}
