//! `add_url`'s fetching (reference A.10): the SSRF guard, the HTTP exchange, the limits.
//!
//! Before **every** request, the first one and each redirect:
//!
//! - the scheme must be `http` or `https` ([`SourceError::SchemeNotAllowed`]);
//! - an IP-literal host is checked directly (IPv4-mapped IPv6 judged by its IPv4 address);
//! - a host name is resolved through the injected [`HostResolver`], inside reqwest's own
//!   resolution hook: **every** address must be public, and reqwest connects only to the
//!   addresses that were checked, so a second DNS answer (rebinding) is never used — the
//!   window the Python version documents (A.13 item 8) is closed.
//!
//! A refused address is [`SourceError::NonPublicAddress`], naming the host, the address, its
//! range and the switch that allows it. [`FetchSettings::allow_private`] lifts the guard;
//! [`FetchSettings::allowed_addresses`] lifts it for listed addresses only.
//!
//! # Which addresses are public
//!
//! The table is [`loom_builtins::non_public_range`] (IANA special-purpose registries), shared
//! with Loom's `fetch_page`. The Python version uses CPython 3.12's
//! `is_global and not is_multicast` (after unwrapping IPv4-mapped IPv6). The two agree on
//! every address listed in the reference (A.13 item 9) except three, where this crate is
//! **stricter** on purpose:
//!
//! - `192.0.0.9` (and all of `192.0.0.0/24`, IETF protocol assignments) is refused; CPython
//!   treats `192.0.0.9` and `192.0.0.10` as global;
//! - `192.88.99.1` (`192.88.99.0/24`, the deprecated 6to4 relay anycast) is refused; CPython
//!   treats it as global;
//! - `2002::/16` (6to4) is judged by the IPv4 address it embeds: `2002::1` embeds `0.0.0.0`
//!   and is refused; CPython treats all of `2002::/16` as global. Likewise NAT64
//!   `64:ff9b::/96` is judged by its embedded IPv4 address (`64:ff9b::808:808` = `8.8.8.8` is
//!   public, `64:ff9b::7f00:1` = `127.0.0.1` is not).
//!
//! Proxies from the environment are ignored (`no_proxy`), so no proxy can reach what the
//! guard refuses.

use std::{
    fmt, io,
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use async_trait::async_trait;
use loom_builtins::non_public_range;
use reqwest::{
    Url,
    dns::{Addrs, Name, Resolve, Resolving},
    header, redirect,
};

use crate::{SourceDocument, SourceError, html::extract_from_html};

/// The `User-Agent` of the Python loom-notes 1.1.0 (reference A.3), the default.
pub const DEFAULT_USER_AGENT: &str =
    "loom-notes/1.1.0 (+https://github.com/denislamard/loom-notes)";

/// The `Accept` header of every request.
pub const ACCEPT: &str = "text/html,application/xhtml+xml";

/// Resolves host names to addresses for the SSRF guard; tests inject fake DNS answers.
#[async_trait]
pub trait HostResolver: Send + Sync + fmt::Debug {
    /// The addresses of `host` (a name, never an IP literal).
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>>;
}

/// The system resolver (`getaddrinfo`, through `tokio::net::lookup_host`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

#[async_trait]
impl HostResolver for SystemResolver {
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        Ok(tokio::net::lookup_host((host, 0))
            .await?
            .map(|address| address.ip())
            .collect())
    }
}

/// How a [`UrlFetcher`] fetches.
#[derive(Debug, Clone)]
pub struct FetchSettings {
    /// The time limit of a whole fetch: connection, redirects and body (default 20 s).
    pub timeout: Duration,
    /// The most bytes of body, after decompression (default 5 000 000).
    pub max_bytes: u64,
    /// Lift the SSRF guard (`LOOM_NOTES_FETCH_ALLOW_PRIVATE`, default `false`).
    pub allow_private: bool,
    /// The `User-Agent` header (default [`DEFAULT_USER_AGENT`]).
    pub user_agent: String,
    /// The most redirects followed (default 20, as httpx).
    pub max_redirects: usize,
    /// Non-public addresses reachable anyway, the guard staying on for every other one
    /// (default none; not in the Python version: for a trusted intranet host, and for tests).
    pub allowed_addresses: Vec<IpAddr>,
    /// The name resolver (default [`SystemResolver`]).
    pub resolver: Arc<dyn HostResolver>,
}

impl Default for FetchSettings {
    fn default() -> FetchSettings {
        FetchSettings {
            timeout: Duration::from_secs(20),
            max_bytes: 5_000_000,
            allow_private: false,
            user_agent: DEFAULT_USER_AGENT.to_owned(),
            max_redirects: 20,
            allowed_addresses: Vec::new(),
            resolver: Arc::new(SystemResolver),
        }
    }
}

/// `add_url`'s fetcher: one HTTP client, the SSRF guard in its name resolution and redirect
/// policy.
#[derive(Debug)]
pub struct UrlFetcher {
    settings: FetchSettings,
    guard: Arc<Guard>,
    client: reqwest::Client,
}

impl UrlFetcher {
    /// A fetcher with these settings.
    ///
    /// # Errors
    /// [`SourceError::Client`] when the HTTP client cannot be built.
    pub fn new(settings: FetchSettings) -> Result<Self, SourceError> {
        let guard = Arc::new(Guard {
            allow_private: settings.allow_private,
            allowed_addresses: settings.allowed_addresses.clone(),
        });
        let resolver = GuardedResolver {
            guard: guard.clone(),
            inner: settings.resolver.clone(),
        };
        let policy = redirect_policy(guard.clone(), settings.max_redirects);
        let mut headers = header::HeaderMap::new();
        headers.insert(header::ACCEPT, header::HeaderValue::from_static(ACCEPT));
        loom_tls::install_crypto_provider();
        let client = reqwest::Client::builder()
            .no_proxy()
            .dns_resolver(Arc::new(resolver))
            .redirect(policy)
            .timeout(settings.timeout)
            .user_agent(settings.user_agent.clone())
            .default_headers(headers)
            .build()
            .map_err(|error| SourceError::Client {
                reason: error_chain(&error),
            })?;
        Ok(UrlFetcher {
            settings,
            guard,
            client,
        })
    }

    /// The settings in force.
    pub fn settings(&self) -> &FetchSettings {
        &self.settings
    }

    /// Fetches `url` (trimmed) and extracts its title and markdown text; the document's
    /// `source` is the requested URL, not the final one after redirects.
    ///
    /// # Errors
    /// The URL and guard refusals ([`SourceError::InvalidUrl`],
    /// [`SourceError::SchemeNotAllowed`], [`SourceError::HostNotFound`],
    /// [`SourceError::NonPublicAddress`], [`SourceError::TooManyRedirects`]), the exchange's
    /// failures ([`SourceError::Timeout`], [`SourceError::HttpStatus`],
    /// [`SourceError::Download`]), the response checks
    /// ([`SourceError::UnsupportedContentType`], [`SourceError::DeclaredTooLarge`],
    /// [`SourceError::BodyTooLarge`]) and the extraction's
    /// ([`SourceError::HtmlUnreadable`], [`SourceError::NoContent`]).
    pub async fn fetch(&self, url: &str) -> Result<SourceDocument, SourceError> {
        let requested = url.trim();
        let result = self.fetch_checked(requested).await;
        if let Err(error) = &result {
            tracing::info!(url = requested, %error, "add_url refused or failed");
        }
        result
    }

    async fn fetch_checked(&self, requested: &str) -> Result<SourceDocument, SourceError> {
        let url = parse_url(requested)?;
        self.guard.check_literal(&url)?;
        tracing::debug!(%url, "add_url request");
        let response = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|error| self.failure(requested, &error))?;
        let final_url = response.url().to_string();
        let (body, content_type) = self.read_body(requested, response).await?;
        let html = decode(&body, content_type.as_deref());
        let page = tokio::task::spawn_blocking(move || extract_from_html(&html, &final_url))
            .await
            .map_err(|error| SourceError::Download {
                url: requested.to_owned(),
                reason: format!("the extraction stopped: {error}"),
            })??;
        Ok(SourceDocument {
            title: page.title,
            text: page.text,
            source: requested.to_owned(),
        })
    }

    /// Checks the status, the content type and the declared length, then reads the body
    /// (decompressed) up to the limit. Returns the body and the content type.
    async fn read_body(
        &self,
        requested: &str,
        mut response: reqwest::Response,
    ) -> Result<(Vec<u8>, Option<String>), SourceError> {
        let status = response.status();
        // reqwest hands back, unfollowed, a redirect to a scheme it cannot fetch.
        let unfollowed = status
            .is_redirection()
            .then(|| response.headers().get(header::LOCATION))
            .flatten()
            .and_then(|location| location.to_str().ok())
            .and_then(|location| response.url().join(location).ok());
        if let Some(location) = unfollowed
            && !matches!(location.scheme(), "http" | "https")
        {
            return Err(SourceError::SchemeNotAllowed {
                url: location.to_string(),
            });
        }
        if !status.is_success() {
            return Err(SourceError::HttpStatus {
                url: requested.to_owned(),
                status: status.as_u16(),
            });
        }
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
        let readable = content_type.as_deref().is_some_and(|content_type| {
            let lower = content_type.to_ascii_lowercase();
            lower.contains("html") || lower.contains("xml")
        });
        if !readable {
            return Err(SourceError::UnsupportedContentType { content_type });
        }
        let max = self.settings.max_bytes;
        let declared = response
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok());
        if let Some(declared) = declared
            && declared > max
        {
            return Err(SourceError::DeclaredTooLarge { declared, max });
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|error| self.failure(requested, &error))?
        {
            body.extend_from_slice(&chunk);
            if u64::try_from(body.len()).unwrap_or(u64::MAX) > max {
                return Err(SourceError::BodyTooLarge { max });
            }
        }
        Ok((body, content_type))
    }

    /// A reqwest error as the refusal that caused it (the guard's, carried through reqwest
    /// as the error's source), a timeout, or a download failure.
    fn failure(&self, requested: &str, error: &reqwest::Error) -> SourceError {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(cause) = source {
            if let Some(refusal) = cause.downcast_ref::<Refusal>() {
                return refusal.to_error(requested);
            }
            source = cause.source();
        }
        if error.is_timeout() {
            return SourceError::Timeout {
                url: requested.to_owned(),
                seconds: self.settings.timeout.as_secs_f64(),
            };
        }
        SourceError::Download {
            url: requested.to_owned(),
            reason: error_chain(error),
        }
    }
}

/// Parses a URL the way the Python version reports it: a text with no scheme at all (`not a
/// url`) is a scheme refusal, another parse failure an invalid URL.
fn parse_url(requested: &str) -> Result<Url, SourceError> {
    let url = Url::parse(requested).map_err(|error| match error {
        url::ParseError::RelativeUrlWithoutBase => SourceError::SchemeNotAllowed {
            url: requested.to_owned(),
        },
        other => SourceError::InvalidUrl {
            url: requested.to_owned(),
            reason: other.to_string(),
        },
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(SourceError::SchemeNotAllowed {
            url: requested.to_owned(),
        });
    }
    if url.host().is_none() {
        return Err(SourceError::InvalidUrl {
            url: requested.to_owned(),
            reason: "no host".to_owned(),
        });
    }
    Ok(url)
}

/// Decodes a body with the content type's charset (a WHATWG label), else as UTF-8, invalid
/// sequences replaced.
fn decode(body: &[u8], content_type: Option<&str>) -> String {
    let encoding = content_type
        .and_then(|content_type| {
            content_type.split(';').skip(1).find_map(|parameter| {
                let (name, value) = parameter.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("charset")
                    .then(|| value.trim().trim_matches(|c| c == '"' || c == '\''))
            })
        })
        .and_then(|label| encoding_rs::Encoding::for_label(label.as_bytes()));
    match encoding {
        Some(encoding) => encoding.decode_without_bom_handling(body).0.into_owned(),
        None => String::from_utf8_lossy(body).into_owned(),
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !message.contains(&cause_text) {
            message.push_str(": ");
            message.push_str(&cause_text);
        }
        source = cause.source();
    }
    message
}

/// The guard's decisions on addresses.
#[derive(Debug)]
struct Guard {
    allow_private: bool,
    allowed_addresses: Vec<IpAddr>,
}

impl Guard {
    fn check(&self, host: &str, address: IpAddr) -> Result<(), Refusal> {
        if self.allow_private || self.allowed_addresses.contains(&address) {
            return Ok(());
        }
        match non_public_range(address) {
            None => Ok(()),
            Some(range) => Err(Refusal::NonPublic {
                host: host.to_owned(),
                address,
                range,
            }),
        }
    }

    /// Checks the scheme and, when the host is an IP literal, the address (names are checked
    /// at resolution).
    fn check_url(&self, url: &Url) -> Result<(), Refusal> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Refusal::Scheme {
                url: url.to_string(),
            });
        }
        match url.host() {
            Some(url::Host::Ipv4(ip)) => self.check(&ip.to_string(), IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => self.check(&ip.to_string(), IpAddr::V6(ip)),
            Some(url::Host::Domain(_)) => Ok(()),
            None => Err(Refusal::Scheme {
                url: url.to_string(),
            }),
        }
    }

    fn check_literal(&self, url: &Url) -> Result<(), SourceError> {
        self.check_url(url)
            .map_err(|refusal| refusal.to_error(url.as_str()))
    }
}

/// A refusal of the guard, carried through reqwest as an error source and turned back into
/// a [`SourceError`].
#[derive(Debug, Clone)]
enum Refusal {
    NonPublic {
        host: String,
        address: IpAddr,
        range: &'static str,
    },
    HostNotFound {
        host: String,
        reason: String,
    },
    Scheme {
        url: String,
    },
    TooManyRedirects {
        max: usize,
    },
}

impl Refusal {
    fn to_error(&self, requested: &str) -> SourceError {
        match self.clone() {
            Refusal::NonPublic {
                host,
                address,
                range,
            } => SourceError::NonPublicAddress {
                host,
                address,
                range,
            },
            Refusal::HostNotFound { host, reason } => SourceError::HostNotFound { host, reason },
            Refusal::Scheme { url } => SourceError::SchemeNotAllowed { url },
            Refusal::TooManyRedirects { max } => SourceError::TooManyRedirects {
                url: requested.to_owned(),
                max,
            },
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_error("(requested URL)"), f)
    }
}

impl std::error::Error for Refusal {}

/// reqwest's only name resolution: the injected resolver's answer, every address checked.
#[derive(Debug)]
struct GuardedResolver {
    guard: Arc<Guard>,
    inner: Arc<dyn HostResolver>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let guard = self.guard.clone();
        let inner = self.inner.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let not_found = |reason: String| Refusal::HostNotFound {
                host: host.clone(),
                reason,
            };
            let addresses = inner
                .resolve(&host)
                .await
                .map_err(|error| not_found(error.to_string()))?;
            if addresses.is_empty() {
                return Err(not_found("no address".to_owned()).into());
            }
            for address in &addresses {
                guard.check(&host, *address)?;
            }
            tracing::debug!(%host, ?addresses, "add_url host resolved and checked");
            // Port 0: the connector puts the URL's port in.
            let addrs: Addrs = Box::new(
                addresses
                    .into_iter()
                    .map(|address| SocketAddr::new(address, 0)),
            );
            Ok(addrs)
        })
    }
}

fn redirect_policy(guard: Arc<Guard>, max_redirects: usize) -> redirect::Policy {
    redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() > max_redirects {
            return attempt.error(Refusal::TooManyRedirects { max: max_redirects });
        }
        match guard.check_url(attempt.url()) {
            Ok(()) => {
                tracing::debug!(to = %attempt.url(), "add_url redirect");
                attempt.follow()
            }
            Err(refusal) => attempt.error(refusal),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict() -> Guard {
        Guard {
            allow_private: false,
            allowed_addresses: Vec::new(),
        }
    }

    /// Reference A.13 item 9: CPython 3.12.1's `is_global and not is_multicast`, and where
    /// this crate is stricter (see the module documentation).
    #[test]
    fn the_reference_public_address_table() {
        let guard = strict();
        let public = |text: &str| guard.check("h", text.parse().unwrap()).is_ok();
        for address in [
            "8.8.8.8",
            "93.184.216.34",
            "172.32.0.1",
            "2001:4860:4860::8888",
            "64:ff9b::808:808",
            "::ffff:8.8.8.8",
            "2606:4700::1111",
        ] {
            assert!(public(address), "{address} is public for CPython and here");
        }
        // Public for CPython, refused here on purpose.
        for address in ["192.0.0.9", "192.88.99.1", "2002::1"] {
            assert!(
                !public(address),
                "{address} is refused here (stricter than CPython)"
            );
        }
        for address in [
            "0.0.0.0",
            "10.1.2.3",
            "100.64.0.1",
            "127.0.0.1",
            "127.255.255.254",
            "169.254.169.254",
            "172.16.0.1",
            "192.0.2.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.51.100.1",
            "203.0.113.1",
            "224.0.0.1",
            "239.1.1.1",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd12::1",
            "2001:db8::1",
            "2001::1",
            "::ffff:127.0.0.1",
            "ff02::1",
            "ff0e::1",
        ] {
            assert!(!public(address), "{address} is not public");
        }
    }

    #[test]
    fn the_switches_lift_the_guard() {
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        let open = Guard {
            allow_private: true,
            allowed_addresses: Vec::new(),
        };
        assert!(open.check("h", loopback).is_ok());
        let listed = Guard {
            allow_private: false,
            allowed_addresses: vec![loopback],
        };
        assert!(listed.check("h", loopback).is_ok());
        assert!(listed.check("h", "127.0.0.2".parse().unwrap()).is_err());
    }

    #[derive(Debug)]
    struct Answers(Vec<IpAddr>);

    #[async_trait]
    impl HostResolver for Answers {
        async fn resolve(&self, _host: &str) -> io::Result<Vec<IpAddr>> {
            Ok(self.0.clone())
        }
    }

    async fn resolve(answers: &[&str]) -> Result<Vec<SocketAddr>, String> {
        let resolver = GuardedResolver {
            guard: Arc::new(strict()),
            inner: Arc::new(Answers(
                answers.iter().map(|a| a.parse().unwrap()).collect(),
            )),
        };
        let name: Name = "example.test".parse().unwrap();
        match resolver.resolve(name).await {
            Ok(addrs) => Ok(addrs.collect()),
            Err(error) => Err(error.to_string()),
        }
    }

    /// The hook reqwest resolves through: public answers are handed over as they are (they
    /// are the only addresses reqwest connects to), private or mixed ones refused.
    #[tokio::test]
    async fn fake_dns_answers_public_private_and_mixed() {
        assert_eq!(
            resolve(&["93.184.216.34", "2606:4700::1111"])
                .await
                .unwrap(),
            vec![
                SocketAddr::new("93.184.216.34".parse().unwrap(), 0),
                SocketAddr::new("2606:4700::1111".parse().unwrap(), 0),
            ]
        );
        let refused = resolve(&["10.0.0.5"]).await.unwrap_err();
        assert!(refused.contains("example.test (10.0.0.5"), "{refused}");
        let refused = resolve(&["93.184.216.34", "fd12::1"]).await.unwrap_err();
        assert!(refused.contains("example.test (fd12::1"), "{refused}");
        let refused = resolve(&["8.8.8.8", "::ffff:192.168.0.1"])
            .await
            .unwrap_err();
        assert!(refused.contains("::ffff:192.168.0.1"), "{refused}");
        let empty = resolve(&[]).await.unwrap_err();
        assert!(empty.contains("host not found: example.test"), "{empty}");
    }

    #[test]
    fn charsets() {
        assert_eq!(
            decode(b"caf\xe9", Some("text/html; charset=ISO-8859-1")),
            "café"
        );
        assert_eq!(
            decode(b"caf\xe9", Some("text/html; charset=\"latin1\"")),
            "café"
        );
        assert_eq!(decode("café".as_bytes(), Some("text/html")), "café");
        assert_eq!(decode(b"caf\xe9", None), "caf\u{fffd}");
        assert_eq!(
            decode(b"caf\xe9", Some("text/html; charset=nonsense")),
            "caf\u{fffd}"
        );
    }

    #[test]
    fn url_parsing() {
        assert!(matches!(
            parse_url("not a url"),
            Err(SourceError::SchemeNotAllowed { .. })
        ));
        assert!(matches!(
            parse_url("http://[::1"),
            Err(SourceError::InvalidUrl { .. })
        ));
        assert!(matches!(
            parse_url("file:///etc/passwd"),
            Err(SourceError::SchemeNotAllowed { .. })
        ));
        assert!(parse_url("https://example.org/x").is_ok());
    }
}
