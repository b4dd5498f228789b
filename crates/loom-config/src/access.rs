//! Who may reach `loom serve` from a browser: the entries of `allowed_origins` and
//! `allowed_hosts` (`server.http` and `server.mcp`), parsed once here with the `url` crate and
//! matched against a request's `Origin` and `Host` headers by the access crates.
//!
//! An origin entry is `null`, or `scheme://host` with an optional `:port` or `:*` (any port).
//! Without a port, an entry means the scheme's default port (443 for `https`, 80 for `http`,
//! as a browser writes the origin): `https://app.example.com` does not admit
//! `https://app.example.com:8443`, another origin. A host entry is `host` (any port) or
//! `host:port`; an IPv6 address may be written bare (`::1`) or in brackets (`[::1]:8000`).

use url::{Host, Url};

/// One entry of `allowed_origins`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginPattern {
    /// `null`: the `Origin: null` of sandboxed documents and `file:` pages.
    Null,
    /// `scheme://host` with a port rule.
    Site {
        /// The scheme, lowercase.
        scheme: String,
        /// The host as the `url` crate serializes it (lowercase, IPv6 in brackets).
        host: String,
        /// Which ports it admits.
        port: PortPattern,
    },
}

/// The ports an origin entry admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortPattern {
    /// `:*`: any port.
    Any,
    /// One port: the one written, or the scheme's default when none is written.
    Exact(u16),
    /// No port written and the scheme has no default (`chrome-extension://…`): an origin
    /// without a port.
    Absent,
}

/// An origin as a request's `Origin` header gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RequestOrigin {
    Null,
    Site {
        scheme: String,
        host: String,
        port: Option<u16>,
    },
}

impl RequestOrigin {
    fn parse(text: &str) -> Option<RequestOrigin> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("null") {
            return Some(RequestOrigin::Null);
        }
        let url = site_url(text)?;
        Some(RequestOrigin::Site {
            scheme: url.scheme().to_owned(),
            host: url.host_str()?.to_owned(),
            port: url.port_or_known_default(),
        })
    }
}

/// `text` as a URL that is only a scheme and a host (and a port): no user, path, query or
/// fragment.
fn site_url(text: &str) -> Option<Url> {
    let url = Url::parse(text).ok()?;
    let bare = url.username().is_empty()
        && url.password().is_none()
        && matches!(url.path(), "" | "/")
        && url.query().is_none()
        && url.fragment().is_none()
        && url.host_str().is_some_and(|host| !host.is_empty());
    // A path the URL parser added ("/") is fine; one written in the text is not.
    let written_path = text
        .split_once("://")
        .is_some_and(|(_, rest)| rest.contains('/'));
    (bare && !written_path).then_some(url)
}

impl OriginPattern {
    /// Reads an entry of `allowed_origins`, or says what is wrong with it.
    pub fn parse(text: &str) -> Result<OriginPattern, String> {
        let refused = || {
            format!(
                "'{text}' is not an origin (expected scheme://host, scheme://host:port, \
                 scheme://host:* or null, e.g. https://app.example.com)"
            )
        };
        if text == "null" {
            return Ok(OriginPattern::Null);
        }
        let (base, any_port) = match text.strip_suffix(":*") {
            Some(base) => (base, true),
            None => (text, false),
        };
        let url = site_url(base).ok_or_else(refused)?;
        let host = url.host_str().ok_or_else(refused)?.to_owned();
        let port = if any_port {
            // `:*` replaces the port: `https://host:443:*` is refused (the URL parser would
            // drop a default port before it could be seen).
            let authority = base.split_once("://").map_or("", |(_, rest)| rest);
            if authority
                .rsplit(']')
                .next()
                .is_some_and(|tail| tail.contains(':'))
            {
                return Err(refused());
            }
            PortPattern::Any
        } else {
            url.port_or_known_default()
                .map_or(PortPattern::Absent, PortPattern::Exact)
        };
        Ok(OriginPattern::Site {
            scheme: url.scheme().to_owned(),
            host,
            port,
        })
    }

    /// Whether the `Origin` header value `origin` is admitted by this entry.
    pub fn admits(&self, origin: &str) -> bool {
        match (self, RequestOrigin::parse(origin)) {
            (OriginPattern::Null, Some(RequestOrigin::Null)) => true,
            (
                OriginPattern::Site { scheme, host, port },
                Some(RequestOrigin::Site {
                    scheme: s,
                    host: h,
                    port: p,
                }),
            ) => {
                *scheme == s
                    && *host == h
                    && match port {
                        PortPattern::Any => true,
                        PortPattern::Exact(port) => p == Some(*port),
                        PortPattern::Absent => p.is_none(),
                    }
            }
            _ => false,
        }
    }
}

/// The entry written with its port explicit (`https://app.example.com:443`, `…:*`), the form
/// in which rmcp's own check reads it as exactly as [`OriginPattern::admits`] does.
impl std::fmt::Display for OriginPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OriginPattern::Null => f.write_str("null"),
            OriginPattern::Site { scheme, host, port } => match port {
                PortPattern::Any => write!(f, "{scheme}://{host}:*"),
                PortPattern::Exact(port) => write!(f, "{scheme}://{host}:{port}"),
                PortPattern::Absent => write!(f, "{scheme}://{host}"),
            },
        }
    }
}

/// One entry of `allowed_hosts`, or a request's `Host` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    /// The host as the `url` crate serializes it (lowercase, IPv6 in brackets).
    pub host: String,
    /// The port written (`None`: any port for an entry, the scheme's default for a header).
    pub port: Option<u16>,
}

/// The hosts the API admits when `allowed_hosts` is empty: the loopback names.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

impl HostPattern {
    /// Reads `host` or `host:port` (an entry of `allowed_hosts`, or a `Host` header value),
    /// or says what is wrong with it.
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        let refused = || {
            format!("'{text}' is not a host (expected host or host:port, e.g. example.com:8443)")
        };
        let text = text.trim();
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (address, after) = rest.split_once(']').ok_or_else(refused)?;
            let port = match after {
                "" => None,
                after => Some(after.strip_prefix(':').ok_or_else(refused)?),
            };
            (format!("[{address}]"), port)
        } else if text.matches(':').count() > 1 {
            // A bare IPv6 address.
            (format!("[{text}]"), None)
        } else {
            match text.split_once(':') {
                Some((host, port)) => (host.to_owned(), Some(port)),
                None => (text.to_owned(), None),
            }
        };
        if host.is_empty() || host.contains(['/', '?', '#', '@', ' ', '%']) {
            return Err(refused());
        }
        let host = Host::parse(&host).map_err(|_| refused())?.to_string();
        let port = port
            .map(|port| port.parse::<u16>().map_err(|_| refused()))
            .transpose()?;
        Ok(HostPattern { host, port })
    }

    /// Whether the `Host` header value `header` is admitted by this entry.
    pub fn admits(&self, header: &str) -> bool {
        HostPattern::parse(header).is_ok_and(|asked| {
            asked.host == self.host && self.port.is_none_or(|port| asked.port == Some(port))
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn an_origin_without_a_port_is_the_default_port_only() {
        let app = OriginPattern::parse("https://app.example.com").unwrap();
        assert_eq!(app.to_string(), "https://app.example.com:443");
        assert!(app.admits("https://app.example.com"));
        assert!(app.admits("https://APP.example.com:443"));
        assert!(!app.admits("https://app.example.com:8443"));
        assert!(!app.admits("http://app.example.com"));
        assert!(!app.admits("https://evil.example"));
        assert!(!app.admits("null"));
        let any = OriginPattern::parse("http://localhost:*").unwrap();
        assert!(any.admits("http://localhost:5173"));
        assert!(any.admits("http://localhost"));
        let exact = OriginPattern::parse("http://[::1]:8080").unwrap();
        assert!(exact.admits("http://[::1]:8080"));
        assert!(!exact.admits("http://[::1]:8081"));
        let extension = OriginPattern::parse("chrome-extension://abcdef").unwrap();
        assert!(extension.admits("chrome-extension://abcdef"));
        assert!(OriginPattern::parse("null").unwrap().admits("null"));
        for bad in [
            "app.example.com",
            "https://",
            "https://app.example.com/",
            "https://app.example.com/path",
            "https://a@app.example.com",
            "https://app.example.com:443:*",
            "https://app.example.com:99999",
            "https://app.example.com?x=1",
            "null:*",
        ] {
            assert!(OriginPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hosts_match_their_port_or_any() {
        let local = HostPattern::parse("localhost").unwrap();
        assert!(local.admits("localhost:8000"));
        assert!(local.admits("LOCALHOST"));
        assert!(!local.admits("localhost.evil.example"));
        let six = HostPattern::parse("::1").unwrap();
        assert!(six.admits("[::1]:8000"));
        let pinned = HostPattern::parse("loom.example.com:8443").unwrap();
        assert!(pinned.admits("loom.example.com:8443"));
        assert!(!pinned.admits("loom.example.com:8444"));
        assert!(!pinned.admits("loom.example.com"));
        for bad in ["", "a/b", "https://x", "x:y", "[::1", "a b", "u@x"] {
            assert!(HostPattern::parse(bad).is_err(), "{bad}");
        }
    }
}
