//! `loom-notes serve`: the MCP server over stdio, or over streamable HTTP at `/mcp`.

use std::{net::SocketAddr, sync::Arc};

use anyhow::Context as _;
use rmcp::{
    ServiceExt,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
    },
};

use crate::{mcp::NotesMcp, setup::Opened, sources};

/// The server over the opened service.
fn server(opened: &Opened) -> anyhow::Result<NotesMcp> {
    let settings = opened.service.settings();
    Ok(NotesMcp::new(
        Arc::clone(&opened.service),
        sources::files(settings),
        sources::fetcher(settings)?,
    ))
}

/// Serves MCP on stdin/stdout until the client closes the connection. Logs go to stderr.
pub(crate) async fn stdio(opened: Opened) -> anyhow::Result<()> {
    let server = server(&opened)?;
    tracing::info!(data_dir = %opened.data_dir.display(), "loom-notes serving MCP on stdio");
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .context("the MCP session could not start")?;
    running.waiting().await.context("the MCP server stopped")?;
    Ok(())
}

/// Serves MCP over streamable HTTP at `http://{addr}/mcp` (stateless: no MCP session) until
/// interrupted. `Host` must be a loopback name (rmcp's default), a present `Origin` is refused.
pub(crate) async fn http(opened: Opened, addr: SocketAddr) -> anyhow::Result<()> {
    let server = server(&opened)?;
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .enforce_origin_validation();
    let service: StreamableHttpService<NotesMcp, NeverSessionManager> = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let router = axum::Router::new().route_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr().unwrap_or(addr);
    // Tests and scripts read this line to learn the port (with ADDR ending in :0).
    eprintln!("loom-notes: MCP over streamable HTTP at http://{local}/mcp");
    tracing::info!(data_dir = %opened.data_dir.display(), %local, "loom-notes serving MCP over HTTP");
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("the HTTP server stopped")?;
    Ok(())
}
