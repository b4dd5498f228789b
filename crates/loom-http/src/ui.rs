//! The trace viewer (`<base_path>/ui`): a read-only web page over the `/v1` routes.
//!
//! The page is a small TypeScript bundle built by esbuild from `crates/loom-http/ui/src/`
//! into `crates/loom-http/ui/dist/` (committed: a `cargo build` needs no Node), embedded here
//! with `include_str!`. Its files hold no data: everything it shows comes from the `/v1` routes
//! (runs, traces, a run's result and its events over SSE, approve and reject), called with the
//! API key the person types into the page, so the keys and scopes are those of the API. One
//! route of its own, `<base_path>/ui/whoami`, answers the key's tenant and scopes (it needs a
//! key like `/v1`, and the scope `read`), so the page shows the approve and reject buttons
//! only to a key with `approve`, and says so when content is hidden (no `read_content`).
//!
//! Served unless `server.http.ui` is `false`, or the profile is `prod` and `server.http.ui`
//! is not `true` ([`served`]). Every file is answered with a Content-Security-Policy that
//! allows only the server's own scripts, styles and connections (no CDN, no inline script),
//! and `X-Frame-Options: DENY`.

use axum::{
    Json, Router,
    http::{HeaderValue, header},
    response::{IntoResponse, Redirect, Response},
    routing::get,
};
use loom_ia::{
    Loom, Profile,
    config::{HttpServerConfig, Scope},
};
use serde::Serialize;

use crate::{AppState, auth::Caller, error::ApiError};

/// The page.
const INDEX_HTML: &str = include_str!("../ui/dist/index.html");
/// Its script (the esbuild bundle).
const APP_JS: &str = include_str!("../ui/dist/app.js");
/// Its style sheet.
const APP_CSS: &str = include_str!("../ui/dist/app.css");

/// What the page's files may load: only from the server itself.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
frame-ancestors 'none'";

/// Whether the viewer is served: `server.http.ui`, else everywhere but under `prod`.
pub(crate) fn served(loom: &Loom, settings: &HttpServerConfig) -> bool {
    settings
        .ui
        .unwrap_or(loom.config().profile() != Some(Profile::Prod))
}

/// The viewer's routes under `<base_path>/ui`.
pub(crate) fn routes(base_path: &str) -> Router<AppState> {
    let root = format!("{base_path}/ui");
    let index = format!("{root}/");
    Router::new()
        .route(&root, get(move || async move { Redirect::to(&index) }))
        .route(
            &format!("{root}/"),
            get(|| async { file("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            &format!("{root}/app.js"),
            get(|| async { file("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            &format!("{root}/app.css"),
            get(|| async { file("text/css; charset=utf-8", APP_CSS) }),
        )
        .route(&format!("{root}/whoami"), get(whoami))
}

/// One embedded file, with the page's security headers; not cached past a restart (`no-cache`:
/// the browser revalidates, so a new binary's page is seen at once).
fn file(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// Who the page acts for.
#[derive(Debug, Serialize)]
struct WhoAmI {
    /// The key's tenant (`default` on an open API).
    tenant: String,
    /// The key's id (absent on an open API).
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    /// Whether the API is open (no `security.api_keys`): every scope.
    open: bool,
    /// The scopes the key has (`admin` counts as every scope).
    scopes: Vec<&'static str>,
}

/// `GET <base_path>/ui/whoami`: the caller's tenant and scopes (scope `read`).
async fn whoami(caller: Caller) -> Result<Json<WhoAmI>, ApiError> {
    caller.require(Scope::Read)?;
    let all = [
        Scope::Run,
        Scope::Read,
        Scope::ReadContent,
        Scope::Approve,
        Scope::Admin,
    ];
    let key = caller.key();
    let scopes = all
        .into_iter()
        .filter(|scope| key.is_none_or(|key| key.allows(*scope)))
        .map(Scope::as_str)
        .collect();
    Ok(Json(WhoAmI {
        tenant: caller.tenant.clone(),
        key: key.map(|key| key.id.clone()),
        open: key.is_none(),
        scopes,
    }))
}
