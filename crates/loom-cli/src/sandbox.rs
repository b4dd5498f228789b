//! `loom sandbox serve`: the runner of agents declaring `sandbox: {backend: remote}`.

use crate::{FAILED, REFUSED};

/// Serves the sandbox contract on `listen` over working folders under `root`, behind the
/// bearer token read from `token_env`, until SIGINT (Ctrl-C).
#[cfg(feature = "remote-sandbox")]
pub(crate) async fn serve(listen: &str, root: &std::path::Path, token_env: &str) -> u8 {
    use loom_ia::sandbox_runner::{Limits, router, serve};
    let token = match std::env::var(token_env) {
        Ok(token) if !token.is_empty() => token,
        _ => {
            eprintln!("error: the environment variable {token_env} (--token-env) holds no token");
            return REFUSED;
        }
    };
    let router = match router(root, token, Limits::default()) {
        Ok(router) => router,
        Err(error) => {
            eprintln!("error: {error}");
            return REFUSED;
        }
    };
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("error: cannot listen on {listen}: {error}");
            return FAILED;
        }
    };
    match listener.local_addr() {
        Ok(address) => eprintln!("Listening on http://{address}"),
        Err(_) => eprintln!("Listening on http://{listen}"),
    }
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    match serve(listener, router, shutdown).await {
        Ok(()) => crate::OK,
        Err(error) => {
            eprintln!("error: {error}");
            FAILED
        }
    }
}

/// Refused by a build without the remote sandbox.
#[cfg(not(feature = "remote-sandbox"))]
pub(crate) async fn serve(_listen: &str, _root: &std::path::Path, _token_env: &str) -> u8 {
    eprintln!("error: this build of loom has no remote sandbox (Cargo feature 'remote-sandbox')");
    REFUSED
}
