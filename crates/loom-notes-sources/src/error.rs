//! The one error type of the crate: a variant per rule.

use std::{net::IpAddr, path::PathBuf};

/// Why a source could not be read: one variant per rule, each message naming the rule's
/// subject and the offending value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// `add_file` is disabled: no allowed root is configured.
    #[error("add_file disabled: no root in LOOM_NOTES_ALLOWED_ROOTS")]
    NoRoots,
    /// The resolved path is inside none of the allowed roots.
    #[error("path outside the allowed roots: {}", target.display())]
    OutsideRoots {
        /// The resolved path (`~`, `..` and symbolic links resolved).
        target: PathBuf,
    },
    /// A component of the path under its root matches a deny pattern.
    #[error("path refused by the pattern '{pattern}': {}", target.display())]
    Denied {
        /// The first matching pattern (built-in or configured).
        pattern: String,
        /// The resolved path.
        target: PathBuf,
    },
    /// The extension is not one of `.md`, `.markdown`, `.txt` (any case).
    #[error(
        "extension not allowed ({}); expected: .markdown, .md, .txt",
        suffix.as_deref().unwrap_or("none")
    )]
    Extension {
        /// The extension found, with its dot, or `None` when the name has none.
        suffix: Option<String>,
    },
    /// The path cannot be resolved (a symbolic link loop, an unreadable link, no working
    /// directory).
    #[error("path cannot be resolved: {} ({reason})", path.display())]
    Unresolvable {
        /// The path as given.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// Nothing exists at the resolved path.
    #[error("file not found: {}", path.display())]
    FileNotFound {
        /// The resolved path.
        path: PathBuf,
    },
    /// The resolved path exists but is not a regular file (a directory, a FIFO, a device...).
    #[error("not a regular file ({kind}): {}", path.display())]
    NotRegularFile {
        /// The resolved path.
        path: PathBuf,
        /// What it is instead (`directory`, `fifo`, `character device`, ...).
        kind: &'static str,
    },
    /// The file is larger than the size cap.
    #[error("file too large: {} is more than {max} bytes", path.display())]
    FileTooLarge {
        /// The resolved path.
        path: PathBuf,
        /// The cap, in bytes.
        max: u64,
    },
    /// The file is empty (or only whitespace).
    #[error("empty file: {}", path.display())]
    EmptyFile {
        /// The resolved path.
        path: PathBuf,
    },
    /// The file is not valid UTF-8.
    #[error("invalid UTF-8 in {}: invalid byte 0x{byte:02x} at position {position}", path.display())]
    InvalidUtf8 {
        /// The resolved path.
        path: PathBuf,
        /// The offset of the first invalid byte.
        position: usize,
        /// That byte.
        byte: u8,
    },
    /// The file could not be opened or read (permissions, I/O error).
    #[error("cannot read {}: {source}", path.display())]
    FileRead {
        /// The resolved path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The URL does not parse.
    #[error("invalid URL: {url} ({reason})")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// The parser's complaint.
        reason: String,
    },
    /// The URL's scheme is not `http` or `https` (or it has none), on the first request or
    /// a redirect.
    #[error("only http(s) URLs are accepted: {url}")]
    SchemeNotAllowed {
        /// The refused URL.
        url: String,
    },
    /// The host name does not resolve, or resolves to no address.
    #[error("host not found: {host} ({reason})")]
    HostNotFound {
        /// The host name.
        host: String,
        /// The resolver's answer.
        reason: String,
    },
    /// The host is, or resolves to, an address that is not public (the SSRF guard), and
    /// private addresses are not allowed.
    #[error(
        "non-public address refused: {host} ({address}, {range}). \
         Set LOOM_NOTES_FETCH_ALLOW_PRIVATE=true to allow it."
    )]
    NonPublicAddress {
        /// The host as written in the URL (a name or an IP literal).
        host: String,
        /// The refused address.
        address: IpAddr,
        /// The non-public range it belongs to (`loopback (127.0.0.0/8)`, ...).
        range: &'static str,
    },
    /// More redirects than allowed.
    #[error("download failed: {url} (more than {max} redirects)")]
    TooManyRedirects {
        /// The requested URL.
        url: String,
        /// The redirect limit.
        max: usize,
    },
    /// The page did not load within the time limit.
    #[error("download failed: {url} (no complete answer within {seconds} s)")]
    Timeout {
        /// The requested URL.
        url: String,
        /// The time limit, in seconds.
        seconds: f64,
    },
    /// The server answered with an error status (4xx, 5xx) or another non-success status.
    #[error("download failed: {url} (HTTP status {status})")]
    HttpStatus {
        /// The requested URL.
        url: String,
        /// The status code.
        status: u16,
    },
    /// The request failed (connection refused, TLS, broken body...).
    #[error("download failed: {url} ({reason})")]
    Download {
        /// The requested URL.
        url: String,
        /// The client's error, with its causes.
        reason: String,
    },
    /// The content type names neither HTML nor XML.
    #[error("unsupported content type: {}", content_type.as_deref().unwrap_or("unknown"))]
    UnsupportedContentType {
        /// The `Content-Type` header, `None` when absent.
        content_type: Option<String>,
    },
    /// The declared `Content-Length` is over the limit.
    #[error("page too large: {declared} bytes (maximum {max})")]
    DeclaredTooLarge {
        /// The declared length.
        declared: u64,
        /// The limit, in bytes.
        max: u64,
    },
    /// The body (after decompression) grew over the limit while it was read.
    #[error("page too large: more than {max} bytes")]
    BodyTooLarge {
        /// The limit, in bytes.
        max: u64,
    },
    /// The HTML cannot be used (empty document, nested too deep).
    #[error("unreadable HTML: {url} ({reason})")]
    HtmlUnreadable {
        /// The final URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Nothing readable is left once the page's noise is removed.
    #[error("no usable content extracted from {url}")]
    NoContent {
        /// The final URL.
        url: String,
    },
    /// The HTTP client cannot be built.
    #[error("the HTTP client cannot start: {reason}")]
    Client {
        /// The builder's error.
        reason: String,
    },
}
