//! `fetch_page`: GET a public `http`/`https` page and return it as readable text.
//!
//! Before each request, the first and every redirect hop: the scheme must be `http` or
//! `https` (rule `http-only`), and the host, an IP literal or **every** address the injected
//! [`Resolver`] gives for the name, must be public (rule `public-address`, see
//! [`non_public_range`](crate::non_public_range)) unless [`FetchOptions::allow_private`].
//! The checked addresses are then pinned: the HTTP client resolves names only through a
//! per-call table holding them, so a second DNS answer (rebinding) is never used. Proxies from
//! the environment are ignored, redirects are followed by hand (at most
//! [`FetchOptions::max_redirects`], rule `max-redirects`).
//!
//! The body is streamed and decompressed (gzip), and reading **stops at**
//! [`FetchOptions::max_bytes`] of decompressed content: the page is then returned cut, with a
//! line saying so. HTML becomes markdown; other text types come back as they are; anything
//! else is refused (rule `text-only`). The result starts with the final URL and the title.
//!
//! When the call carries the W3C `traceparent` of its span ([`loom_core::tool::ToolContext`],
//! given when traces are exported), every request of the call (the first and each redirect hop)
//! sends it as the `traceparent` HTTP header, so the fetched site's own traces join the run's.

use std::{
    collections::HashMap,
    fmt, io,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use loom_core::{
    BoxFuture,
    tool::{FnTool, ToolDeclarations, ToolError, ToolKind, ToolOutput, ToolSpec},
};
use reqwest::{
    Url,
    dns::{Addrs, Name, Resolve, Resolving},
    header,
};
use serde::Deserialize;
use serde_json::json;

use crate::{markdown, non_public_range, refusal, rules};

const USER_AGENT: &str = concat!("loom-fetch_page/", env!("CARGO_PKG_VERSION"));

/// Resolves host names to addresses for `fetch_page`; tests inject their own.
pub trait Resolver: Send + Sync + fmt::Debug {
    /// The addresses of `host` (a name, never an IP literal) for `port`.
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'_, io::Result<Vec<SocketAddr>>>;
}

/// The system resolver (`tokio::net::lookup_host`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'_, io::Result<Vec<SocketAddr>>> {
        let host = host.to_owned();
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// How `fetch_page` behaves.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// Allow loopback, private, link-local and other non-public addresses (default: `false`).
    pub allow_private: bool,
    /// Non-public addresses reachable anyway (an intranet server the operator trusts); a port
    /// of 0 allows every port of that address. Default: none.
    pub allowed_addresses: Vec<SocketAddr>,
    /// The most decompressed bytes read from a page; the rest is cut (default: 2 MiB).
    pub max_bytes: u64,
    /// The whole call's time limit, redirects and name resolution included (default: 30 s).
    pub timeout: Duration,
    /// The most redirects followed (default: 5).
    pub max_redirects: usize,
    /// The name resolver (default: [`SystemResolver`]).
    pub resolver: Arc<dyn Resolver>,
}

impl Default for FetchOptions {
    fn default() -> FetchOptions {
        FetchOptions {
            allow_private: false,
            allowed_addresses: Vec::new(),
            max_bytes: 2 * 1024 * 1024,
            timeout: Duration::from_secs(30),
            max_redirects: 5,
            resolver: Arc::new(SystemResolver),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    url: String,
}

/// The `fetch_page` tool: `{url}` → the page as text (markdown for HTML), headed by its final
/// URL and title. Declared without side effects.
pub fn fetch_page(options: FetchOptions) -> FnTool {
    let spec = ToolSpec {
        name: "fetch_page".to_owned(),
        description: format!(
            "Fetch a public web page (http or https) and return it as readable text: HTML is \
             turned into markdown. Pages above {} bytes are cut.",
            options.max_bytes
        ),
        input_schema: json!({
            "type": "object",
            "properties": {
                "url": {"type": "string", "description": "The http or https URL of the page."}
            },
            "required": ["url"],
            "additionalProperties": false
        }),
        kind: ToolKind::Builtin,
        declarations: ToolDeclarations {
            idempotent: true,
            ..ToolDeclarations::default()
        },
    };
    let options = Arc::new(options);
    FnTool::new(spec, move |ctx, arguments| {
        let options = options.clone();
        // A value that is not a valid header (never the engine's) is not sent.
        let trace = ctx
            .traceparent
            .as_deref()
            .and_then(|t| header::HeaderValue::from_str(t).ok());
        Box::pin(async move {
            let args: Args = serde_json::from_value(arguments)
                .map_err(|error| ToolError::new(format!("invalid arguments: {error}")))?;
            let result =
                tokio::time::timeout(options.timeout, fetch(&options, &args.url, trace)).await;
            let result = result.unwrap_or_else(|_| {
                Err(ToolError::new(format!(
                    "'{}' did not load within {} s",
                    args.url,
                    options.timeout.as_secs_f64()
                )))
            });
            if let Err(error) = &result {
                tracing::info!(url = %args.url, error = %error, "fetch_page refused or failed");
            }
            result
        }) as BoxFuture<'static, _>
    })
}

/// The header carrying the W3C trace context.
const TRACEPARENT: &str = "traceparent";

async fn fetch(
    options: &FetchOptions,
    raw: &str,
    trace: Option<header::HeaderValue>,
) -> Result<ToolOutput, ToolError> {
    let mut url = Url::parse(raw.trim())
        .map_err(|error| ToolError::new(format!("'{raw}' is not a valid URL: {error}")))?;
    let pins = Arc::new(PinnedResolver::default());
    let client = client(options, pins.clone())?;
    let mut redirects = 0;
    loop {
        check_and_pin(options, &url, &pins).await?;
        tracing::debug!(%url, "fetch_page request");
        let mut request = client.get(url.clone()).header(
            header::ACCEPT,
            "text/html,application/xhtml+xml,text/*;q=0.9,*/*;q=0.5",
        );
        if let Some(trace) = &trace {
            request = request.header(TRACEPARENT, trace.clone());
        }
        let response = request
            .send()
            .await
            .map_err(|error| request_failed(&url, &error))?;
        let location = response
            .status()
            .is_redirection()
            .then(|| response.headers().get(header::LOCATION))
            .flatten();
        let Some(location) = location else {
            return read_page(options, response).await;
        };
        if redirects >= options.max_redirects {
            return Err(refusal(
                rules::MAX_REDIRECTS,
                format!(
                    "'{raw}' redirects more than {} times",
                    options.max_redirects
                ),
            ));
        }
        redirects += 1;
        let next = location
            .to_str()
            .ok()
            .and_then(|location| url.join(location).ok())
            .ok_or_else(|| ToolError::new(format!("{url} redirects to an invalid location")))?;
        tracing::debug!(from = %url, to = %next, "fetch_page redirect");
        url = next;
    }
}

/// Checks the URL's scheme and addresses, and pins the checked addresses of its host name.
async fn check_and_pin(
    options: &FetchOptions,
    url: &Url,
    pins: &PinnedResolver,
) -> Result<(), ToolError> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(refusal(
            rules::HTTP_ONLY,
            format!(
                "only http and https URLs can be fetched, not {} ({url})",
                url.scheme()
            ),
        ));
    }
    let host = url
        .host_str()
        .ok_or_else(|| ToolError::new(format!("'{url}' has no host")))?;
    let port = url.port_or_known_default().unwrap_or(80);
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = literal.parse::<IpAddr>() {
        return check_address(options, url, None, SocketAddr::new(ip, port));
    }
    let addresses = options
        .resolver
        .resolve(host, port)
        .await
        .map_err(|error| ToolError::new(format!("cannot resolve '{host}': {error}")))?;
    if addresses.is_empty() {
        return Err(ToolError::new(format!("'{host}' has no address")));
    }
    let addresses: Vec<SocketAddr> = addresses
        .into_iter()
        .map(|address| SocketAddr::new(address.ip(), port))
        .collect();
    for address in &addresses {
        check_address(options, url, Some(host), *address)?;
    }
    pins.pin(host, addresses);
    Ok(())
}

fn check_address(
    options: &FetchOptions,
    url: &Url,
    host: Option<&str>,
    address: SocketAddr,
) -> Result<(), ToolError> {
    if options.allow_private {
        return Ok(());
    }
    let Some(range) = non_public_range(address.ip()) else {
        return Ok(());
    };
    let allowed = options.allowed_addresses.iter().any(|allowed| {
        allowed.ip() == address.ip() && (allowed.port() == 0 || allowed.port() == address.port())
    });
    if allowed {
        return Ok(());
    }
    let what = match host {
        Some(host) => format!("'{host}' resolves to {}, a", address.ip()),
        None => format!("{} is a", address.ip()),
    };
    Err(refusal(
        rules::PUBLIC_ADDRESS,
        format!("{what} {range} address; only public addresses can be fetched ({url})"),
    ))
}

/// The only name resolution the HTTP client gets: the addresses checked for this call.
#[derive(Debug, Default)]
struct PinnedResolver {
    pins: Mutex<HashMap<String, Vec<SocketAddr>>>,
}

impl PinnedResolver {
    fn pin(&self, host: &str, addresses: Vec<SocketAddr>) {
        let mut pins = self
            .pins
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        pins.insert(host.to_ascii_lowercase(), addresses);
    }
}

impl Resolve for PinnedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let pinned = self
            .pins
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .get(&name.as_str().to_ascii_lowercase())
            .cloned();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            match pinned {
                Some(addresses) => Ok(Box::new(addresses.into_iter()) as Addrs),
                None => Err(io::Error::other(format!(
                    "'{host}' was not checked; it cannot be connected to"
                ))
                .into()),
            }
        })
    }
}

fn client(options: &FetchOptions, pins: Arc<PinnedResolver>) -> Result<reqwest::Client, ToolError> {
    loom_tls::install_crypto_provider();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(pins)
        .connect_timeout(options.timeout)
        .user_agent(USER_AGENT)
        .build()
        .map_err(|error| ToolError::new(format!("the HTTP client cannot start: {error}")))
}

fn request_failed(url: &Url, error: &reqwest::Error) -> ToolError {
    let mut message = format!("fetching {url} failed: {error}");
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    ToolError::new(message)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Html,
    Text,
}

/// What the content type says, `None` when it names something other than text.
fn kind_of(content_type: &str) -> Option<Kind> {
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match mime.as_str() {
        "text/html" | "application/xhtml+xml" => Some(Kind::Html),
        "application/json"
        | "application/xml"
        | "application/javascript"
        | "application/x-javascript"
        | "application/ecmascript"
        | "application/yaml"
        | "application/x-yaml"
        | "application/toml"
        | "application/x-ndjson"
        | "application/sql"
        | "application/graphql" => Some(Kind::Text),
        _ if mime.starts_with("text/") || mime.ends_with("+json") || mime.ends_with("+xml") => {
            Some(Kind::Text)
        }
        _ => None,
    }
}

async fn read_page(
    options: &FetchOptions,
    mut response: reqwest::Response,
) -> Result<ToolOutput, ToolError> {
    let status = response.status();
    let url = response.url().clone();
    if !status.is_success() {
        return Err(ToolError::new(format!("{url} answered HTTP {status}")));
    }
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let declared = match &content_type {
        Some(content_type) => match kind_of(content_type) {
            Some(kind) => Some(kind),
            None => {
                return Err(refusal(
                    rules::TEXT_ONLY,
                    format!(
                        "{url} is '{content_type}', not text; this tool reads HTML and text pages"
                    ),
                ));
            }
        },
        None => None,
    };
    let mut body = Vec::new();
    let mut truncated = false;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| request_failed(&url, &error))?
    {
        let room = usize::try_from(options.max_bytes)
            .unwrap_or(usize::MAX)
            .saturating_sub(body.len());
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            truncated = true;
            break;
        }
        body.extend_from_slice(&chunk);
    }
    drop(response);
    let kind = match declared {
        Some(kind) => kind,
        None => sniff(&body).ok_or_else(|| {
            refusal(
                rules::TEXT_ONLY,
                format!("{url} has no content type and is not text"),
            )
        })?,
    };
    let text = String::from_utf8_lossy(&body).into_owned();
    let (title, content) = match kind {
        Kind::Text => (None, text),
        Kind::Html => tokio::task::spawn_blocking(move || {
            (markdown::title(&text), markdown::to_markdown(&text))
        })
        .await
        .map_err(|error| ToolError::new(format!("converting {url} failed: {error}")))?,
    };
    let mut out = format!("URL: {url}\n");
    if let Some(title) = title {
        out.push_str(&format!("Title: {title}\n"));
    }
    if truncated {
        out.push_str(&format!(
            "[cut: the page is larger than {} bytes; only its beginning is shown]\n",
            options.max_bytes
        ));
    }
    out.push('\n');
    out.push_str(&content);
    Ok(ToolOutput::text(out))
}

/// The kind of an untyped body: HTML when it looks like it, text when it is UTF-8.
fn sniff(body: &[u8]) -> Option<Kind> {
    let text = match std::str::from_utf8(body) {
        Ok(text) => text,
        // A body cut in the middle of a character is still text.
        Err(error) if error.error_len().is_none() => {
            std::str::from_utf8(&body[..error.valid_up_to()]).ok()?
        }
        Err(_) => return None,
    };
    let start: String = text
        .trim_start()
        .chars()
        .take(15)
        .collect::<String>()
        .to_ascii_lowercase();
    if start.starts_with("<!doctype html") || start.starts_with("<html") {
        Some(Kind::Html)
    } else {
        Some(Kind::Text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        assert_eq!(kind_of("text/html; charset=utf-8"), Some(Kind::Html));
        assert_eq!(kind_of("TEXT/PLAIN"), Some(Kind::Text));
        assert_eq!(kind_of("application/ld+json"), Some(Kind::Text));
        assert_eq!(kind_of("image/png"), None);
        assert_eq!(kind_of("application/octet-stream"), None);
    }

    #[test]
    fn sniffing() {
        assert_eq!(sniff(b"  <!DOCTYPE html><p>x"), Some(Kind::Html));
        assert_eq!(sniff(b"plain"), Some(Kind::Text));
        assert_eq!(sniff(&[0xff, 0xfe, 0x00]), None);
    }
}
