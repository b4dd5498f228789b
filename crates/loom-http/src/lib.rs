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
//! `default` with every scope, as the reference does, provided its `Host` is allowed (the
//! loopback names by default) and its `Origin`, if any, is the server's own or allowed
//! (`server.http.allowed_hosts`, `allowed_origins`: no DNS rebinding, no cross-site form). With keys, every `/v1` route needs one
//! (`Authorization: Bearer lk_…` or `X-API-Key`): 401 (with `WWW-Authenticate: Bearer`) when
//! it is missing, unknown or expired; the key alone decides the tenant; a missing scope (`run`: open and cancel runs; `read`:
//! agents, results, events, sessions; `read_content`: content fields and file bytes;
//! `approve`: approve and reject; `admin`: all, and session erasure) or an agent outside the
//! key's `agents` is a 403. Without `read_content`, reads lose their content fields, listed in
//! `redacted` ([`loom_ia::redact`]). A key's `rate_limit` and a tenant's `quotas` are 429s
//! with `Retry-After`.
//! A run is read (`GET /runs/{run_id}`, its events, its trace) in the session `session_id`
//! names, else in the session named after it, as Loom-IA addresses it: a run of a named session
//! asked without its session is a 404. Decisions and cancellation find the run wherever it is.
//! Errors are JSON `{"error": {"kind": "...", "message": "..."}}` with a stable `kind` per
//! error variant (see [`ApiError`]); a server error answers an `error_id` instead of its detail.
//! Webhooks of a trigger with a `secret_env` must be signed ([`SIGNATURE_HEADER`],
//! [`TIMESTAMP_HEADER`]). [`serve`] bounds each client: a cap on connections, header and body
//! timeouts (`server.http`).
//!
//! Beside `/v1`, each agent that opts in (`expose.http`) has endpoints of its own:
//! `POST <base_path>/agents/{name}/run` (its result as JSON) and `POST
//! <base_path>/agents/{name}/stream` (Server-Sent Events with five named events, `text_delta`,
//! `tool_call`, `tool_result`, `error`, `final`, one terminal frame, heartbeat comments), behind
//! the same keys or open to anonymous callers as the agent says (see the `agent_http` and
//! `agent_stream` modules); `<base_path>/health` and `<base_path>/ready` answer as
//! `/v1/healthz` and `/v1/readyz`. `GET /v1/runs/{run_id}/events?deltas=true` adds the models'
//! live text deltas to a run's events.
//!
//! With `server.mcp.http`, the MCP server (`loom-mcp-server`) is mounted at `<base_path>/mcp`
//! over streamable HTTP: every request needs an API key, whose tenant, scopes and agents apply
//! as on the REST API.
//!
//! The OpenAPI 3.1 document is generated from the annotated handlers (`utoipa`): served at
//! `<base_path>/openapi.json`, with interactive docs at `<base_path>/docs`, both without a key,
//! unless the profile is `prod` or `server.http.docs` is `false` (`docs: true` serves them in
//! `prod`). [`openapi_document`] gives it without a server. How to add a route: see the
//! `routes` module.
//!
//! The trace viewer, a read-only web page over the `/v1` routes (runs, their trees of steps,
//! their events live, approvals), is served at `<base_path>/ui` unless the profile is `prod`
//! or `server.http.ui` is `false` (`ui: true` serves it in `prod`); its data needs the same
//! keys and scopes as `/v1` (see the `ui` module).

mod agent_http;
mod agent_stream;
mod auth;
mod error;
mod guard;
mod health;
mod hooks;
mod listen;
mod mcp;
mod openapi;
mod params;
mod routes;
mod search;
mod sessions;
mod sse;
mod ui;
mod upload;

use std::{future::Future, net::SocketAddr, sync::Arc};

use axum::{Router, extract::DefaultBodyLimit, middleware};
use loom_ia::{Loom, Profile, config::HttpServerConfig};
use tokio::{net::TcpListener, sync::watch};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

pub use auth::key_hash;
pub use error::{ApiError, ErrorKind};
pub use hooks::{SIGNATURE_HEADER, TIMESTAMP_HEADER};

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

/// The OpenAPI 3.1 document of the API `loom` serves with `settings` (its paths under
/// `<base_path>/v1`), as served at `<base_path>/openapi.json`.
pub fn openapi_document(loom: &Loom, settings: &HttpServerConfig) -> serde_json::Value {
    let (_, api) = api(loom, settings);
    openapi::document(&api)
}

/// The routes under `<base_path>/v1` and their document, built from the same `routes!` calls.
fn api(loom: &Loom, settings: &HttpServerConfig) -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let prefix = format!("{}/v1", settings.base_path);
    let (router, api) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .nest(&prefix, routes::v1())
        .split_for_parts();
    let open = loom.config().raw().security.api_keys.is_empty();
    let mut api = openapi::finish(api, open);
    openapi::delivery_headers(&mut api, &prefix, loom.config().triggers());
    openapi::signature_headers(&mut api, &prefix, loom.config().triggers());
    openapi::rate_limits(&mut api, &loom.config().raw().security.api_keys);
    openapi::sealed(&mut api, loom.config().raw().storage.encryption.is_some());
    openapi::shared_limits(
        &mut api,
        loom.config().raw().storage.limits.backend == loom_ia::config::LimitsBackend::Redis,
    );
    (router, api)
}

/// Whether `<base_path>/openapi.json` and `<base_path>/docs` are served: `server.http.docs`,
/// else everywhere but under `prod`.
fn docs_served(loom: &Loom, settings: &HttpServerConfig) -> bool {
    settings
        .docs
        .unwrap_or(loom.config().profile() != Some(Profile::Prod))
}

fn build(loom: Loom, settings: &HttpServerConfig, closing: watch::Receiver<bool>) -> Router {
    let limits = listen::Limits::of(settings);
    let limit = limits.max_body_bytes;
    let keys = Arc::new(auth::Keys::new(
        &loom.config().raw().security.api_keys,
        loom.counters().clone(),
    ));
    let browsers = guard::Browsers::of(settings, keys.is_open());
    let mcp = loom.config().raw().server.mcp.http;
    let (v1, api) = api(&loom, settings);
    let docs = docs_served(&loom, settings);
    let ui = ui::served(&loom, settings);
    let state = AppState {
        loom,
        closing,
        keys,
    };
    let mut router = v1.merge(front(&settings.base_path));
    if mcp {
        router = router.merge(mcp::routes(&state, &settings.base_path, limit));
    }
    if docs {
        router = router.merge(openapi::docs(openapi::document(&api), &settings.base_path));
    }
    if ui {
        router = router.merge(ui::routes(&settings.base_path));
    }
    router
        .fallback(routes::not_found)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
        .layer(middleware::from_fn_with_state(limits, listen::read_body))
        .layer(middleware::from_fn_with_state(browsers, guard::check))
}

/// The routes beside `/v1` ([`agent_http`]): each agent's own endpoints (answered only for
/// the agents that opt in, `expose.http`; 404 `unknown_agent` for the others), and the
/// liveness and readiness of `/v1/healthz` and `/v1/readyz` at `<base_path>/health` and
/// `<base_path>/ready`. Not in the OpenAPI document of `/v1`.
fn front(base_path: &str) -> Router<AppState> {
    use axum::routing::{get, post};
    Router::new()
        .route(
            &format!("{base_path}/agents/{{name}}/run"),
            post(agent_http::run),
        )
        .route(
            &format!("{base_path}/agents/{{name}}/stream"),
            post(agent_stream::stream),
        )
        .route(&format!("{base_path}/health"), get(health::healthz))
        .route(&format!("{base_path}/ready"), get(health::readyz))
}

/// Serves the API on `listener` until `shutdown` resolves, then shuts down gracefully without
/// closing any run: it stops accepting connections, ends open SSE streams, and stops driving
/// ([`Loom::stop`] with `execution.shutdown_timeout`): each run in flight stops at its next
/// safe point (after its current step's events are written; past the timeout, where it is),
/// open in its journal with its lease handed back. A synchronous `POST …/runs` whose run was
/// stopped is answered `503` with `kind: interrupted`, its `run_id` and `session_id`; the next
/// start resumes the run ([`Loom::recover_all`], called by `loom serve`). Returns once every
/// request is answered and no run is driven.
///
/// While it serves, [`Loom::watch_leases`] sweeps the journal every half lease (1 to 30 s)
/// and resumes the runs whose lease expired without being handed back (a process sharing
/// the journal crashed); the sweep stops with the server.
///
/// A client is bounded by `settings`: at most `max_connections` connections are served at
/// once (the next wait in the listen backlog), request headers must arrive within
/// `header_timeout` (else the connection is closed), a body within `body_timeout` of its
/// headers (else `408`).
pub async fn serve(
    loom: Loom,
    listener: TcpListener,
    settings: &HttpServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_until(loom, listener, settings, async move {
        shutdown.await;
        Shutdown::Stop
    })
    .await
}

/// How [`serve_until`] ends once its shutdown future resolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// The runs in flight stop at their next safe point at once, as [`serve`] does on its
    /// shutdown: a synchronous request whose run stopped is answered `503` `interrupted`.
    Stop,
    /// A hand-over to another process serving the same socket and journal (`loom serve
    /// --reload`): no new connection is accepted, the requests in flight go on until they
    /// are answered (for up to `execution.shutdown_timeout`), and only then are the runs
    /// still driven (background runs, or requests past the timeout) stopped as with
    /// [`Shutdown::Stop`]. A client whose request was in flight during the switch gets its
    /// answer, not a `503`.
    Drain,
}

/// [`serve`], the shutdown future saying how to end ([`Shutdown`]).
pub async fn serve_until(
    loom: Loom,
    listener: TcpListener,
    settings: &HttpServerConfig,
    shutdown: impl Future<Output = Shutdown> + Send + 'static,
) -> std::io::Result<()> {
    let (closing, receiver) = watch::channel(false);
    mcp::log_exposure(&loom);
    agent_http::log_mounts(&loom, &settings.base_path);
    let app = build(loom.clone(), settings, receiver);
    let limits = listen::Limits::of(settings);
    let grace = loom.shutdown_timeout();
    // The stop runs beside the graceful shutdown of the connections: in-flight requests end when their runs
    // stop, and the timeout must cut a step that would keep them waiting.
    let (stopping, stop_now) = tokio::sync::oneshot::channel::<()>();
    let stopper = loom.clone();
    let stopped = tokio::spawn(async move {
        if stop_now.await.is_ok() {
            stopper.stop(grace).await;
        }
    });
    // Runs a crashed process sharing the journal left behind go on once their lease expires.
    let (unwatch, unwatched) = tokio::sync::oneshot::channel::<()>();
    let watcher = loom.clone();
    let watch = tokio::spawn(async move {
        watcher
            .watch_leases(async move {
                let _ = unwatched.await;
            })
            .await;
    });
    // A drain stops the runs only when its time is up: the timer, cancelled when every
    // request was answered before.
    let (draining, drain_timer) = tokio::sync::oneshot::channel::<tokio::task::JoinHandle<()>>();
    listen::serve(listener, app, limits, async move {
            let how = shutdown.await;
            let _ = unwatch.send(());
            let _ = closing.send(true);
            match how {
                Shutdown::Stop => {
                    tracing::info!(
                        "shutting down: the runs in flight stop at their next safe point, open and resumable"
                    );
                    let _ = stopping.send(());
                }
                Shutdown::Drain => {
                    tracing::info!(
                        grace_seconds = grace.as_secs_f64(),
                        "handing over: the requests in flight are answered first"
                    );
                    let timer = tokio::spawn(async move {
                        tokio::time::sleep(grace).await;
                        tracing::info!(
                            "hand-over timeout: the runs in flight stop at their next safe point"
                        );
                        let _ = stopping.send(());
                    });
                    let _ = draining.send(timer);
            }
        }
    })
    .await;
    if let Ok(timer) = drain_timer.await {
        // Every request was answered in time: the timer (and its stop) is not needed.
        timer.abort();
        let _ = timer.await;
    }
    let _ = stopped.await;
    // A drain ended: stop the runs still driven (which ends the watch).
    loom.stop(grace).await;
    let _ = watch.await;
    Ok(())
}

/// Binds `host:port` (`port` 0: a free port).
pub async fn bind(host: &str, port: u16) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind((host, port)).await?;
    let address = listener.local_addr()?;
    Ok((listener, address))
}
