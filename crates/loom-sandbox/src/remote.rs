//! The remote backend: the [`Sandbox`] contract over HTTP.
//!
//! [`router`] is the runner (`loom sandbox serve --listen ADDR --root DIR`): four `POST`
//! routes, `/v1/read`, `/v1/write`, `/v1/list` and `/v1/exec`, each a JSON body naming the
//! working folder, answered by a [`LocalSandbox`] under the runner's root; every request needs
//! `Authorization: Bearer <token>` (compared in constant time). The limits a client asks for
//! are capped by the runner's own ([`Limits::within`]). An error comes back as the
//! [`SandboxError`] itself (JSON), so a refusal keeps its rule across the wire.
//! [`RemoteSandbox`] is the client (reqwest, rustls with ring).

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::State,
    http::{HeaderMap, StatusCode},
    routing::post,
};
use loom_core::{
    BoxFuture,
    sandbox::{Entry, ExecOutcome, ExecRequest, Limits, Sandbox, SandboxError, Workspace},
};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::{LocalSandbox, SetupError};

#[derive(Serialize, Deserialize)]
struct PathBody {
    workspace: Workspace,
    path: String,
}

#[derive(Serialize, Deserialize)]
struct WriteBody {
    workspace: Workspace,
    path: String,
    content: String,
}

#[derive(Serialize, Deserialize)]
struct ExecBody {
    workspace: Workspace,
    request: ExecRequest,
}

#[derive(Serialize, Deserialize)]
struct ReadReply {
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

impl Runner {
    fn authorize(&self, headers: &HeaderMap) -> Result<(), (StatusCode, Json<SandboxError>)> {
        let given = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        let same = given.len() == self.token.len()
            && given
                .bytes()
                .zip(self.token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same {
            Ok(())
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
        .with_state(runner))
}

async fn read(
    State(runner): State<Arc<Runner>>,
    headers: HeaderMap,
    Json(body): Json<PathBody>,
) -> Reply<ReadReply> {
    runner.authorize(&headers)?;
    let bytes = runner
        .local
        .read(&body.workspace, &body.path)
        .await
        .map_err(status)?;
    let content = String::from_utf8(bytes).map_err(|_| {
        status(SandboxError::Invalid(format!(
            "'{}' is not UTF-8 text",
            body.path
        )))
    })?;
    Ok(Json(ReadReply { content }))
}

async fn write(
    State(runner): State<Arc<Runner>>,
    headers: HeaderMap,
    Json(body): Json<WriteBody>,
) -> Reply<WriteReply> {
    runner.authorize(&headers)?;
    let bytes = runner
        .local
        .write(&body.workspace, &body.path, body.content.into_bytes())
        .await
        .map_err(status)?;
    Ok(Json(WriteReply { bytes }))
}

async fn list(
    State(runner): State<Arc<Runner>>,
    headers: HeaderMap,
    Json(body): Json<PathBody>,
) -> Reply<Vec<Entry>> {
    runner.authorize(&headers)?;
    runner
        .local
        .list(&body.workspace, &body.path)
        .await
        .map(Json)
        .map_err(status)
}

async fn exec(
    State(runner): State<Arc<Runner>>,
    headers: HeaderMap,
    Json(mut body): Json<ExecBody>,
) -> Reply<ExecOutcome> {
    runner.authorize(&headers)?;
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
#[derive(Debug, Clone)]
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
    ) -> Result<T, SandboxError> {
        let url = format!("{}/v1/{route}", self.base);
        let response = self
            .client
            .post(&url)
            .bearer_auth(&self.token)
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
            let reply: ReadReply = self.call("read", &body).await?;
            Ok(reply.content.into_bytes())
        })
    }

    fn write<'a>(
        &'a self,
        workspace: &'a Workspace,
        path: &'a str,
        content: Vec<u8>,
    ) -> BoxFuture<'a, Result<u64, SandboxError>> {
        Box::pin(async move {
            let content = String::from_utf8(content)
                .map_err(|_| SandboxError::Invalid("a remote write carries UTF-8 text".into()))?;
            let body = WriteBody {
                workspace: workspace.clone(),
                path: path.to_owned(),
                content,
            };
            let reply: WriteReply = self.call("write", &body).await?;
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
            self.call("list", &body).await
        })
    }

    fn exec<'a>(
        &'a self,
        workspace: &'a Workspace,
        request: ExecRequest,
    ) -> BoxFuture<'a, Result<ExecOutcome, SandboxError>> {
        Box::pin(async move {
            let body = ExecBody {
                workspace: workspace.clone(),
                request,
            };
            self.call("exec", &body).await
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
