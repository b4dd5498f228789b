//! The server loop of `loom serve`, and what bounds a slow or greedy client.
//!
//! - **Connections**: at most `server.http.max_connections` are served at once. The loop
//!   accepts a connection only when one of those slots is free, so the next ones wait in the
//!   listen backlog (not served, not refused) until one closes.
//! - **Headers**: hyper's HTTP/1 connection closes a connection whose request headers are not
//!   complete `server.http.header_timeout` after it started reading them, which also bounds
//!   how long an idle keep-alive connection holds its slot.
//! - **Body**: [`read_body`] reads every request body whole, within
//!   `server.http.body_timeout` of its headers; a body still incomplete then is answered `408`
//!   and the connection closed. A body over `server.http.max_body_bytes` is `413`.
//!
//! `axum::serve` exposes none of these, so the loop is written here on `hyper` and
//! `hyper-util` (the crates axum serves with), graceful shutdown included.

use std::{future::Future, pin::pin, sync::Arc, time::Duration};

use axum::{
    Router,
    body::Body,
    extract::{Request, State},
    http::{HeaderValue, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    server::graceful::GracefulShutdown,
    service::TowerToHyperService,
};
use loom_ia::config::HttpServerConfig;
use tokio::{net::TcpListener, sync::Semaphore, time::Instant};

use crate::error::{ApiError, ErrorKind};

/// The bounds of `server.http` on a client.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// `header_timeout`.
    pub(crate) header_timeout: Duration,
    /// `body_timeout`.
    pub(crate) body_timeout: Duration,
    /// `max_connections`.
    pub(crate) max_connections: usize,
    /// `max_body_bytes`.
    pub(crate) max_body_bytes: usize,
}

impl Limits {
    /// The limits of `settings` (checked at load: positive, finite).
    pub(crate) fn of(settings: &HttpServerConfig) -> Limits {
        let seconds = |value: f64| {
            Duration::try_from_secs_f64(value).unwrap_or(Duration::from_secs(u64::from(u32::MAX)))
        };
        Limits {
            header_timeout: seconds(settings.header_timeout),
            body_timeout: seconds(settings.body_timeout),
            max_connections: usize::try_from(settings.max_connections)
                .unwrap_or(usize::MAX)
                .clamp(1, Semaphore::MAX_PERMITS),
            max_body_bytes: usize::try_from(settings.max_body_bytes).unwrap_or(usize::MAX),
        }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then stops accepting, lets each open
/// connection finish its request in flight (an idle one closes, a connection accepted less
/// than [`FIRST_REQUEST_GRACE`] before gets that long to send its request first), and returns
/// once all are closed.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut shutdown = pin!(shutdown);
    let mut last_accepted: Option<Instant> = None;
    loop {
        // A free slot first: past the cap, connections wait in the backlog.
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => slot,
            () = &mut shutdown => break,
        };
        let Ok(slot) = slot else {
            // The semaphore is never closed.
            break;
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    accept_failed(&error).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        last_accepted = Some(Instant::now());
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout);
        let connection =
            http1.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let served = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = served.await {
                // A header timeout, a client gone mid-request: the connection is closed.
                tracing::debug!(%error, "connection closed on an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    // A connection accepted just now has not sent its request yet, and hyper closes a
    // connection without a request in progress at once: give it a moment to be read.
    if let Some(accepted) = last_accepted {
        tokio::time::sleep_until(accepted + FIRST_REQUEST_GRACE.min(limits.header_timeout)).await;
    }
    graceful.shutdown().await;
}

/// How long, at shutdown, a connection accepted just before is given to send its request
/// before it counts as idle (and is closed rather than answered). A client connects and
/// writes its request at once; one that sends nothing within this is a keep-alive connection
/// between requests, or a slow client, closed as before.
const FIRST_REQUEST_GRACE: Duration = Duration::from_millis(250);

/// After a failed `accept`: a failure of that one connection is skipped; another (no file
/// descriptor left, …) is logged and retried after a second, as `axum::serve` does.
async fn accept_failed(error: &std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        error.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::error!(%error, "accepting a connection failed: retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Reads the request's body whole, within `body_timeout` and up to `max_body_bytes`, before
/// the route sees it: `408` (and the connection closed) when it is not all in by then, `413`
/// when it is larger.
pub(crate) async fn read_body(
    State(limits): State<Limits>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let limited = Limited::new(body, limits.max_body_bytes);
    let bytes = match tokio::time::timeout(limits.body_timeout, limited.collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(error)) if error.downcast_ref::<LengthLimitError>().is_some() => {
            return ApiError::too_large().into_response();
        }
        Ok(Err(error)) => {
            return ApiError::invalid_body(format!("the request body could not be read: {error}"))
                .into_response();
        }
        Err(_) => {
            let mut response = ApiError::new(
                ErrorKind::RequestTimeout,
                format!(
                    "the request body did not arrive within {} s (server.http.body_timeout)",
                    limits.body_timeout.as_secs_f64()
                ),
            )
            .into_response();
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return response;
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::Router;
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::{TcpListener, TcpStream},
        sync::oneshot,
    };

    use super::{Limits, serve};

    /// A connection accepted just before the shutdown, whose request arrives just after it
    /// (a request racing a `loom serve --reload` hand-over), is answered, not dropped.
    #[tokio::test(flavor = "current_thread")]
    async fn a_request_racing_the_shutdown_is_answered() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = Router::new().fallback(|| async { "served" });
        let limits = Limits {
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(5),
            max_connections: 8,
            max_body_bytes: 1024,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, app, limits, async move {
            let _ = stopped.await;
        }));
        let mut client = TcpStream::connect(address).await.unwrap();
        // The server accepts the connection meanwhile, then is told to stop; the request
        // comes after.
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        client.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response:?}");
        assert!(response.ends_with("served"), "{response:?}");
        server.await.unwrap();
    }
}
