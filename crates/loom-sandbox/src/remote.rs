//! The remote backend: the [`Sandbox`] contract over HTTP.
//!
//! [`router`] is the runner (`loom sandbox serve --listen ADDR --root DIR`): four `POST`
//! routes, `/v1/read`, `/v1/write`, `/v1/list` and `/v1/exec`, each a JSON body naming the
//! working folder, answered by a [`LocalSandbox`] under the runner's root; every request needs
//! `Authorization: Bearer <token>` (compared in constant time), checked before its body is
//! read. File contents travel base64-encoded, so binary files cross as they are. The limits a
//! client asks for are capped by the runner's own ([`Limits::within`]). An error comes back as
//! the [`SandboxError`] itself (JSON), so a refusal keeps its rule across the wire.
//! [`RemoteSandbox`] is the client (reqwest, rustls with ring): it refuses a write over the
//! file cap itself, as the local backend does, and gives up on a runner that does not answer
//! (a command's wall time plus [`ANSWER_MARGIN`], [`CALL_TIMEOUT`] for the other calls).

use std::{sync::Arc, time::Duration};

use axum::{
    Json, Router,
    extract::{DefaultBodyLimit, FromRequestParts, State},
    http::{StatusCode, request::Parts},
    routing::post,
};
use base64::{Engine as _, engine::general_purpose::STANDARD as BASE64};
use loom_core::{
    BoxFuture,
    sandbox::{Entry, ExecOutcome, ExecRequest, Limits, Sandbox, SandboxError, Workspace},
};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::{LocalSandbox, SetupError, folder::FILE_CAP_BYTES};

/// How long the client waits for a runner's answer to a read, a write or a list.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// How long past a command's wall time the client waits for the runner's answer to an exec.
pub const ANSWER_MARGIN: Duration = Duration::from_secs(30);

#[derive(Serialize, Deserialize)]
struct PathBody {
    workspace: Workspace,
    path: String,
}

#[derive(Serialize, Deserialize)]
struct WriteBody {
    workspace: Workspace,
    path: String,
    /// The bytes, base64.
    content: String,
}

#[derive(Serialize, Deserialize)]
struct ExecBody {
    workspace: Workspace,
    request: ExecRequest,
}

#[derive(Serialize, Deserialize)]
struct ReadReply {
    /// The bytes, base64.
    content: String,
}

#[derive(Serialize, Deserialize)]
struct WriteReply {
    bytes: u64,
}

struct Runner {
    local: LocalSandbox,
    token: String,
    cap: Limits,
}

type Reply<T> = Result<Json<T>, (StatusCode, Json<SandboxError>)>;

/// A request that carries the runner's bearer token: checked before the handler reads the
/// body (extractors run in order, the JSON body last).
struct Authorized;

impl FromRequestParts<Arc<Runner>> for Authorized {
    type Rejection = (StatusCode, Json<SandboxError>);

    async fn from_request_parts(
        parts: &mut Parts,
        runner: &Arc<Runner>,
    ) -> Result<Authorized, Self::Rejection> {
        let given = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        let same = given.len() == runner.token.len()
            && given
                .bytes()
                .zip(runner.token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same {
            Ok(Authorized)
        } else {
            Err((
                StatusCode::UNAUTHORIZED,
                Json(SandboxError::Unavailable(
                    "the runner refused the bearer token".into(),
                )),
            ))
        }
    }
}

fn status(error: SandboxError) -> (StatusCode, Json<SandboxError>) {
    let code = match &error {
        SandboxError::Refused { .. } => StatusCode::FORBIDDEN,
        SandboxError::NotFound(_) => StatusCode::NOT_FOUND,
        SandboxError::Invalid(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (code, Json(error))
}

/// The runner's routes over working folders under `root`, behind the bearer `token`, each
/// command's limits capped by `cap`.
pub fn router(root: &std::path::Path, token: String, cap: Limits) -> Result<Router, SetupError> {
    if token.is_empty() {
        return Err(SetupError::Remote("the runner's token is empty".into()));
    }
    let runner = Arc::new(Runner {
        local: LocalSandbox::new(root)?,
        token,
        cap,
    });
    Ok(Router::new()
        .route("/v1/read", post(read))
        .route("/v1/write", post(write))
        .route("/v1/list", post(list))
        .route("/v1/exec", post(exec))
        // A write of the whole file cap, base64 in JSON, fits.
        .layer(DefaultBodyLimit::max(
            2 * FILE_CAP_BYTES as usize + 64 * 1024,
        ))
        .with_state(runner))
}

async fn read(
    State(runner): State<Arc<Runner>>,
    _: Authorized,
    Json(body): Json<PathBody>,
) -> Reply<ReadReply> {
    let bytes = runner
        .local
        .read(&body.workspace, &body.path)
        .await
        .map_err(status)?;
    Ok(Json(ReadReply {
        content: BASE64.encode(bytes),
    }))
}

async fn write(
    State(runner): State<Arc<Runner>>,
    _: Authorized,
    Json(body): Json<WriteBody>,
) -> Reply<WriteReply> {
    let content = BASE64.decode(body.content.as_bytes()).map_err(|e| {
        status(SandboxError::Invalid(format!(
            "the content of '{}' is not base64: {e}",
            body.path
        )))
    })?;
    let bytes = runner
        .local
        .write(&body.workspace, &body.path, content)
        .await
        .map_err(status)?;
    Ok(Json(WriteReply { bytes }))
}

async fn list(
    State(runner): State<Arc<Runner>>,
    _: Authorized,
    Json(body): Json<PathBody>,
) -> Reply<Vec<Entry>> {
    runner
        .local
        .list(&body.workspace, &body.path)
        .await
        .map(Json)
        .map_err(status)
}

async fn exec(
    State(runner): State<Arc<Runner>>,
    _: Authorized,
    Json(mut body): Json<ExecBody>,
) -> Reply<ExecOutcome> {
    body.request.limits = body.request.limits.within(runner.cap);
    tracing::info!(workspace = %body.workspace, "remote sandbox exec");
    runner
        .local
        .exec(&body.workspace, body.request)
        .await
        .map(Json)
        .map_err(status)
}

/// The client of a runner.
#[derive(Clone)]
pub struct RemoteSandbox {
    base: String,
    token: String,
    client: reqwest::Client,
}

impl RemoteSandbox {
    /// A client of the runner at `url` (`http://` or `https://`), with its bearer `token`.
    pub fn new(url: &str, token: String) -> Result<RemoteSandbox, SetupError> {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(SetupError::Remote(format!(
                "'{url}' is not an http:// or https:// URL"
            )));
        }
        loom_tls::install_crypto_provider();
        let client = reqwest::Client::builder()
            .build()
            .map_err(|e| SetupError::Remote(format!("cannot build the HTTP client: {e}")))?;
        Ok(RemoteSandbox {
            base: url.trim_end_matches('/').to_owned(),
            token,
            client,
        })
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        route: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<T, SandboxError> {
        let url = format!("{}/v1/{route}", self.base);
        let response = self
            .client
            .post(&url)
            .bearer_auth(&self.token)
            .timeout(timeout)
            .json(body)
            .send()
            .await
            .map_err(|e| SandboxError::Unavailable(format!("the runner at {url}: {e}")))?;
        let ok = response.status().is_success();
        let code = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| SandboxError::Unavailable(format!("the runner at {url}: {e}")))?;
        if ok {
            serde_json::from_slice(&bytes).map_err(|e| {
                SandboxError::Unavailable(format!("the runner at {url} answered garbage: {e}"))
            })
        } else {
            Err(
                serde_json::from_slice::<SandboxError>(&bytes).unwrap_or_else(|_| {
                    SandboxError::Unavailable(format!("the runner at {url} answered {code}"))
                }),
            )
        }
    }
}

impl std::fmt::Debug for RemoteSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("RemoteSandbox")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl Sandbox for RemoteSandbox {
    fn read<'a>(
        &'a self,
        workspace: &'a Workspace,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<u8>, SandboxError>> {
        Box::pin(async move {
            let body = PathBody {
                workspace: workspace.clone(),
                path: path.to_owned(),
            };
            let reply: ReadReply = self.call("read", &body, CALL_TIMEOUT).await?;
            BASE64.decode(reply.content.as_bytes()).map_err(|e| {
                SandboxError::Unavailable(format!("the runner sent '{path}' garbled: {e}"))
            })
        })
    }

    fn write<'a>(
        &'a self,
        workspace: &'a Workspace,
        path: &'a str,
        content: Vec<u8>,
    ) -> BoxFuture<'a, Result<u64, SandboxError>> {
        Box::pin(async move {
            // The runner's cap, refused here as the local backend refuses it.
            if content.len() as u64 > FILE_CAP_BYTES {
                return Err(SandboxError::refused(
                    loom_core::sandbox::rules::SIZE_CAP,
                    format!(
                        "{} bytes is over the {FILE_CAP_BYTES}-byte cap of a write",
                        content.len()
                    ),
                ));
            }
            let body = WriteBody {
                workspace: workspace.clone(),
                path: path.to_owned(),
                content: BASE64.encode(content),
            };
            let reply: WriteReply = self.call("write", &body, CALL_TIMEOUT).await?;
            Ok(reply.bytes)
        })
    }

    fn list<'a>(
        &'a self,
        workspace: &'a Workspace,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Entry>, SandboxError>> {
        Box::pin(async move {
            let body = PathBody {
                workspace: workspace.clone(),
                path: path.to_owned(),
            };
            self.call("list", &body, CALL_TIMEOUT).await
        })
    }

    fn exec<'a>(
        &'a self,
        workspace: &'a Workspace,
        request: ExecRequest,
    ) -> BoxFuture<'a, Result<ExecOutcome, SandboxError>> {
        Box::pin(async move {
            let timeout = Duration::from_millis(request.limits.wall_ms) + ANSWER_MARGIN;
            let body = ExecBody {
                workspace: workspace.clone(),
                request,
            };
            self.call("exec", &body, timeout).await
        })
    }
}

/// Serves `router` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}
