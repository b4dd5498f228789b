//! The open API against the browser of the developer who runs it.
//!
//! Without `security.api_keys` every request is served with every scope, so a web page the
//! developer visits could use the API: by a cross-site form post (the browser sends it with
//! an `Origin` of that page), or by DNS rebinding (the page's own name made to point at
//! `127.0.0.1`, so the browser sees one site, but the request's `Host` is that name). While
//! the API is open, each request must therefore name an allowed `Host`
//! (`server.http.allowed_hosts`, by default the loopback names `localhost`, `127.0.0.1` and
//! `::1` on any port): else `403` `host_not_allowed`; and its `Origin`, when it sends one, must
//! be the server's own (the same host and port as `Host`) or one of
//! `server.http.allowed_origins`: else `403` `origin_not_allowed`. With keys, the key protects
//! the API (a browser does not send it across sites) and these checks are not made; the MCP
//! endpoint makes its own (`server.mcp.allowed_hosts`, `allowed_origins`).

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    http::header,
    middleware::Next,
    response::{IntoResponse, Response},
};
use loom_ia::config::{HostPattern, HttpServerConfig, LOOPBACK_HOSTS, OriginPattern};

use crate::error::{ApiError, ErrorKind};

/// The hosts and origins the open API admits; `None` when keys are declared (nothing to
/// check).
#[derive(Debug, Clone)]
pub(crate) struct Browsers {
    hosts: Vec<HostPattern>,
    origins: Vec<OriginPattern>,
}

impl Browsers {
    /// The checks of `settings` for an open API (`open`), or none.
    pub(crate) fn of(settings: &HttpServerConfig, open: bool) -> Option<Arc<Browsers>> {
        if !open {
            return None;
        }
        let hosts: Vec<&str> = if settings.allowed_hosts.is_empty() {
            LOOPBACK_HOSTS.to_vec()
        } else {
            settings.allowed_hosts.iter().map(String::as_str).collect()
        };
        // Checked at load: every entry parses.
        Some(Arc::new(Browsers {
            hosts: hosts
                .into_iter()
                .filter_map(|host| HostPattern::parse(host).ok())
                .collect(),
            origins: settings
                .allowed_origins
                .iter()
                .filter_map(|origin| OriginPattern::parse(origin).ok())
                .collect(),
        }))
    }

    /// Why a request with these `Host` and `Origin` values is refused, if it is.
    fn refusal(&self, host: Option<&str>, origin: Option<&str>) -> Option<ApiError> {
        let Some(host) = host.filter(|host| self.hosts.iter().any(|h| h.admits(host))) else {
            return Some(ApiError::new(
                ErrorKind::HostNotAllowed,
                format!(
                    "the API is open (no security.api_keys) and answers only the hosts of \
                     server.http.allowed_hosts, not '{}' (DNS rebinding)",
                    host.unwrap_or_default()
                ),
            ));
        };
        let origin = origin?;
        // The server's own pages (the docs) send their origin: the same host and port.
        let own = ["http", "https"].iter().any(|scheme| {
            OriginPattern::parse(&format!("{scheme}://{host}")).is_ok_and(|own| own.admits(origin))
        });
        if own || self.origins.iter().any(|allowed| allowed.admits(origin)) {
            return None;
        }
        Some(ApiError::new(
            ErrorKind::OriginNotAllowed,
            format!(
                "the API is open (no security.api_keys) and refuses requests from other sites: \
                 Origin '{origin}' is not in server.http.allowed_origins"
            ),
        ))
    }
}

/// Refuses, on an open API, a request whose `Host` or `Origin` is not allowed (see the module).
pub(crate) async fn check(
    State(browsers): State<Option<Arc<Browsers>>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(browsers) = browsers {
        let headers = request.headers();
        let text = |name| headers.get(name).and_then(|value| value.to_str().ok());
        let host = text(header::HOST).or_else(|| request.uri().authority().map(|a| a.as_str()));
        if let Some(refused) = browsers.refusal(host, text(header::ORIGIN)) {
            tracing::warn!(
                kind = %refused.kind,
                host = host.unwrap_or_default(),
                "request refused on the open API"
            );
            return refused.into_response();
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn browsers(hosts: &[&str], origins: &[&str]) -> Arc<Browsers> {
        let settings = HttpServerConfig {
            allowed_hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            allowed_origins: origins.iter().map(|o| (*o).to_owned()).collect(),
            ..HttpServerConfig::default()
        };
        Browsers::of(&settings, true).unwrap()
    }

    fn kind(refused: Option<ApiError>) -> Option<&'static str> {
        refused.map(|error| error.kind.as_str())
    }

    #[test]
    fn hosts_and_origins_of_an_open_api() {
        let local = browsers(&[], &["https://front.example"]);
        assert_eq!(kind(local.refusal(Some("127.0.0.1:8000"), None)), None);
        assert_eq!(kind(local.refusal(Some("localhost"), None)), None);
        assert_eq!(kind(local.refusal(Some("[::1]:8000"), None)), None);
        assert_eq!(
            kind(local.refusal(Some("evil.example:8000"), None)),
            Some("host_not_allowed")
        );
        assert_eq!(kind(local.refusal(None, None)), Some("host_not_allowed"));
        // Its own origin (the docs page), an allowed one, another site.
        assert_eq!(
            kind(local.refusal(Some("127.0.0.1:8000"), Some("http://127.0.0.1:8000"))),
            None
        );
        assert_eq!(
            kind(local.refusal(Some("127.0.0.1:8000"), Some("https://front.example"))),
            None
        );
        assert_eq!(
            kind(local.refusal(Some("127.0.0.1:8000"), Some("http://127.0.0.1:9000"))),
            Some("origin_not_allowed")
        );
        assert_eq!(
            kind(local.refusal(Some("127.0.0.1:8000"), Some("https://evil.example"))),
            Some("origin_not_allowed")
        );
        assert_eq!(
            kind(local.refusal(Some("127.0.0.1:8000"), Some("null"))),
            Some("origin_not_allowed")
        );
        let named = browsers(&["loom.example.com"], &[]);
        assert_eq!(kind(named.refusal(Some("loom.example.com"), None)), None);
        assert_eq!(
            kind(named.refusal(Some("localhost:8000"), None)),
            Some("host_not_allowed")
        );
        assert!(Browsers::of(&HttpServerConfig::default(), false).is_none());
    }
}
