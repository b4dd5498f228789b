//! What goes wrong when opening an HTTP+SSE server (`transport: sse`), against small in-process
//! HTTP servers that answer the GET wrongly on purpose (the happy path runs against the Python
//! SDK's own SSE server in `python.rs` and `lifecycle.rs`): no `endpoint` event before the
//! connect timeout, a stream that ends first, an endpoint on another origin (refused, and
//! nothing is posted there), an HTTP error, a body that is not an event stream.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    body::{Body, Bytes},
    http::{HeaderMap, StatusCode, header::CONTENT_TYPE},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use common::*;
use futures_util::{StreamExt, stream};
use loom_core::ports::ToolSource;
use loom_mcp::McpServer;

const LIMIT: Duration = Duration::from_secs(30);

/// An event stream that sends `events` then stays open.
fn event_stream(events: &'static str, then_close: bool) -> Response {
    let first = stream::iter([Ok::<_, Infallible>(Bytes::from_static(events.as_bytes()))]);
    let body = if then_close {
        Body::from_stream(first)
    } else {
        Body::from_stream(first.chain(stream::pending()))
    };
    ([(CONTENT_TYPE, "text/event-stream")], body).into_response()
}

/// Serves `router` on 127.0.0.1:0; its base URL.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://{address}")
}

/// The error of opening `url` as an SSE server, with a 1 s connect timeout.
async fn open_error(url: &str, headers: Vec<(String, String)>) -> String {
    let mut options = sse_options("legacy", url, headers);
    options.connect_timeout = Duration::from_secs(1);
    options.circuit = None;
    let server = McpServer::new(options);
    let error = server
        .open(&source_ctx("default", "r1"))
        .await
        .expect_err("the server cannot be opened");
    server.shutdown().await;
    error.message
}

#[tokio::test]
async fn no_endpoint_event_before_the_connect_timeout() {
    bounded(LIMIT, async {
        let base = serve(Router::new().route(
            "/sse",
            get(|| async { event_stream(": ping\n\nevent: message\ndata: {}\n\n", false) }),
        ))
        .await;
        assert_eq!(
            open_error(&format!("{base}/sse"), vec![]).await,
            "MCP server 'legacy' did not answer within 1s while connecting (waiting for the SSE \
             `endpoint` event)"
        );
    })
    .await;
}

#[tokio::test]
async fn a_stream_that_ends_before_its_endpoint_event() {
    bounded(LIMIT, async {
        let base =
            serve(Router::new().route("/sse", get(|| async { event_stream(": hello\n\n", true) })))
                .await;
        assert_eq!(
            open_error(&format!("{base}/sse"), vec![]).await,
            "MCP server 'legacy' did not send the `endpoint` event of the HTTP+SSE transport: \
             the stream ended first"
        );
    })
    .await;
}

/// The endpoint names another origin (another port of the same host): refused before anything
/// is posted, so the configured headers never reach it.
#[tokio::test]
async fn an_endpoint_on_another_origin_is_refused() {
    bounded(LIMIT, async {
        let posted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&posted);
        let elsewhere = serve(Router::new().route(
            "/messages",
            post(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async { StatusCode::ACCEPTED }
            }),
        ))
        .await;
        let events: &'static str =
            Box::leak(format!("event: endpoint\ndata: {elsewhere}/messages\n\n").into_boxed_str());
        let base = serve(Router::new().route(
            "/sse",
            get(move || async move { event_stream(events, false) }),
        ))
        .await;
        let error = open_error(
            &format!("{base}/sse"),
            vec![("Authorization".into(), "Bearer s3cret".into())],
        )
        .await;
        assert_eq!(
            error,
            format!(
                "MCP server 'legacy': message endpoint refused: it is on {elsewhere} while the SSE \
                 stream is on {base}: Loom posts messages (and their headers) to the stream's \
                 origin only"
            )
        );
        assert!(!error.contains("s3cret"));
        assert_eq!(posted.load(Ordering::SeqCst), 0);
    })
    .await;
}

#[tokio::test]
async fn http_errors_and_other_bodies_are_named() {
    bounded(LIMIT, async {
        let base = serve(
            Router::new()
                .route(
                    "/private",
                    get(|headers: HeaderMap| async move {
                        // The configured headers go with the GET.
                        if headers.get("x-api-key").is_some_and(|v| v == "right") {
                            event_stream(": ok\n\n", true)
                        } else {
                            StatusCode::UNAUTHORIZED.into_response()
                        }
                    }),
                )
                .route(
                    "/mcp",
                    get(|| async { ([(CONTENT_TYPE, "application/json")], "{}") }),
                ),
        )
        .await;
        let url = format!("{base}/private");
        assert_eq!(
            open_error(&url, vec![]).await,
            format!(
                "MCP server 'legacy': cannot open the SSE stream at {url}: HTTP 401 Unauthorized"
            )
        );
        // With the header: past the GET (then no endpoint).
        assert!(
            open_error(&url, vec![("X-Api-Key".into(), "right".into())])
                .await
                .contains("did not send the `endpoint` event")
        );
        let url = format!("{base}/mcp");
        assert_eq!(
            open_error(&url, vec![]).await,
            format!(
                "MCP server 'legacy': cannot open the SSE stream at {url}: the answer is not an \
                 event stream (Content-Type 'application/json'): is this an HTTP+SSE endpoint? A \
                 streamable HTTP server takes `transport: http`"
            )
        );
        // Nothing listens.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/sse", closed.local_addr().unwrap());
        drop(closed);
        let error = open_error(&url, vec![]).await;
        assert!(
            error.starts_with(&format!(
                "MCP server 'legacy': cannot open the SSE stream at {url}: "
            )),
            "{error}"
        );
    })
    .await;
}
