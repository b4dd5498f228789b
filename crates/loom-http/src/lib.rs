//! # loom-http
//!
//! The Loom REST API (`loom serve`): agents, runs (synchronous or in the background, from a
//! JSON or a `multipart/form-data` body with attachments), run results, approvals,
//! cancellation, a run's events (and its sub-runs') as Server-Sent Events, the run list, the
//! event search, traces, sessions (their journal, files, report and erasure), and webhooks
//! (`POST /hooks/{name}`, the configuration's `triggers`) — every route under
//! `<base_path>/v1`, over a shared [`loom_ia::Loom`].
//!
//! Without `security.api_keys` the API is **open**: every request acts for the tenant
//! `default` with every scope, as the reference does. With keys, every `/v1` route needs one
//! (`Authorization: Bearer lk_…` or `X-API-Key`): 401 when it is missing, unknown or expired;
//! the key alone decides the tenant; a missing scope (`run`: open and cancel runs; `read`:
//! agents, results, events, sessions; `read_content`: content fields and file bytes;
//! `approve`: approve and reject; `admin`: all, and session erasure) or an agent outside the
//! key's `agents` is a 403. Without `read_content`, reads lose their content fields, listed in
//! `redacted` ([`loom_ia::redact`]). A key's `rate_limit` and a tenant's `quotas` are 429s
//! with `Retry-After`.
//! Errors are JSON `{"error": {"kind": "...", "message": "..."}}` with a stable `kind` per
//! error variant (see [`ApiError`]).
//!
//! With `server.mcp.http`, the MCP server (`loom-mcp-server`) is mounted at `<base_path>/mcp`
//! over streamable HTTP: every request needs an API key, whose tenant, scopes and agents apply
//! as on the REST API.

mod auth;
mod error;
mod hooks;
mod mcp;
mod params;
mod routes;
mod search;
mod sessions;
mod sse;
mod upload;

use std::{future::Future, net::SocketAddr, sync::Arc};

use axum::{Router, extract::DefaultBodyLimit};
use loom_ia::{Loom, config::HttpServerConfig};
use tokio::{net::TcpListener, sync::watch};

pub use error::ApiError;

/// How often an idle SSE stream sends a keep-alive comment.
pub const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(15);

/// What every handler shares.
#[derive(Clone, Debug)]
pub(crate) struct AppState {
    pub(crate) loom: Loom,
    /// Turns `true` when the server shuts down: open SSE streams end.
    pub(crate) closing: watch::Receiver<bool>,
    /// The declared API keys (none: the API is open).
    pub(crate) keys: Arc<auth::Keys>,
}

impl AppState {
    /// Resolves when the server starts shutting down (never, for a router served without
    /// [`serve`]).
    pub(crate) async fn closed(mut closing: watch::Receiver<bool>) {
        loop {
            if *closing.borrow_and_update() {
                return;
            }
            if closing.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// The API's router for `loom`, with its routes under `<base_path>/v1` and the request body
/// limit of `settings` (`host` and `port` are the listener's business).
pub fn router(loom: Loom, settings: &HttpServerConfig) -> Router {
    let (_closing, receiver) = watch::channel(false);
    build(loom, settings, receiver)
}

fn build(loom: Loom, settings: &HttpServerConfig, closing: watch::Receiver<bool>) -> Router {
    let limit = usize::try_from(settings.max_body_bytes).unwrap_or(usize::MAX);
    let prefix = format!("{}/v1", settings.base_path);
    let keys = Arc::new(auth::Keys::new(&loom.config().raw().security.api_keys));
    let mcp = loom.config().raw().server.mcp.http;
    let state = AppState {
        loom,
        closing,
        keys,
    };
    let mut router = Router::new().nest(&prefix, routes::v1());
    if mcp {
        router = router.merge(mcp::routes(&state, &settings.base_path, limit));
    }
    router
        .fallback(routes::not_found)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// Serves the API on `listener` until `shutdown` resolves, then shuts down gracefully: it
/// stops accepting connections, cancels the runs `loom` is driving ([`Loom::cancel_all`], so
/// their journals close them as cancelled and a synchronous request still gets its result),
/// ends open SSE streams, and waits for in-flight requests.
pub async fn serve(
    loom: Loom,
    listener: TcpListener,
    settings: &HttpServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (closing, receiver) = watch::channel(false);
    mcp::log_exposure(&loom);
    let app = build(loom.clone(), settings, receiver);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutting down: cancelling the runs in flight");
            loom.cancel_all();
            let _ = closing.send(true);
        })
        .await
}

/// Binds `host:port` (`port` 0: a free port).
pub async fn bind(host: &str, port: u16) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind((host, port)).await?;
    let address = listener.local_addr()?;
    Ok((listener, address))
}
