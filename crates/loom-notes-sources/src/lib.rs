//! # loom-notes-sources
//!
//! Where loom-notes' `add_file` and `add_url` get their text, behind their access controls
//! (reference `loom-notes.md`, A.5, A.9 and A.10):
//!
//! - [`FileAccess`]: a local file is read only when its resolved path (`~` expanded, `..` and
//!   symbolic links resolved) is inside one of the allowed roots, no component of its path
//!   under that root matches a deny pattern (the built-in [`BASE_DENY`] plus configured ones),
//!   its extension is `.md`, `.markdown` or `.txt`, and it is a regular, non-empty, UTF-8 file
//!   under the size cap.
//! - [`UrlFetcher`]: a web page is fetched only from public addresses (checked before every
//!   request, redirects included, on the very addresses connected to), within a time limit
//!   and a size limit, and only when it is HTML or XML; [`extract_from_html`] turns it into a
//!   title and markdown text.
//!
//! Where this crate differs from the Python version (all deliberate, each documented on
//! its item): messages are in English; the SSRF check and the connection use the same
//! addresses (no rebinding window) and the public-address table is stricter on three
//! addresses; files are size-capped, opened without blocking or following a final link, and
//! a path that is not a regular file has its own error; a page nested too deeply is refused.
//!
//! Every refusal is a [`SourceError`] variant: callers match the kind, and its message names
//! the rule and the offending value.
//!
//! **Architecture invariant:** this crate does not depend on `loom-notes-core`; the service
//! turns a [`SourceDocument`] into its own `Extracted`.

mod error;
mod fetch;
mod file;
mod glob;
mod html;

pub use error::SourceError;
pub use fetch::{
    ACCEPT, DEFAULT_USER_AGENT, FetchSettings, HostResolver, SystemResolver, UrlFetcher,
};
pub use file::{ALLOWED_EXTENSIONS, BASE_DENY, DEFAULT_MAX_FILE_BYTES, FileAccess};
pub use glob::fnmatch_case;
pub use html::{ExtractedPage, MAX_HTML_DEPTH, extract_from_html};

/// A document read from a source: its title, its text (trimmed) and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceDocument {
    /// The first `# heading` of a file, or its stem; the page title for a URL.
    pub title: String,
    /// The text, trimmed; markdown for a web page.
    pub text: String,
    /// The resolved absolute path of a file, or the requested URL (trimmed) of a page.
    pub source: String,
}
