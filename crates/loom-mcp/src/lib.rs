//! # loom-mcp
//!
//! MCP servers as Loom tool sources, through the official Rust SDK (`rmcp`).
//!
//! An [`McpServer`] is built from [`McpServerOptions`] (the facade reads them from
//! `mcp_servers[]`) and implements [`loom_core::ports::ToolSource`]:
//!
//! - **transports**: stdio (a child process in its own process group, stderr copied to the logs
//!   under target `loom_mcp::stderr`, killed with its group on shutdown or drop; when Loom is
//!   killed outright nothing signals it, and it exits by itself only if it exits when its stdin
//!   closes, as the MCP stdio transport asks: no parent-death signal is set, since that needs
//!   `unsafe` code between fork and exec), streamable HTTP (headers on every request, never
//!   logged), and the older HTTP+SSE transport of protocol 2024-11-05 (`sse.rs`: a GET opens
//!   the stream, its `endpoint` event names where to POST, on the stream's origin only);
//! - **tools** named `<server>__<tool>` (names that do not fit `^[A-Za-z0-9_-]{1,64}$` are
//!   dropped with a warning), kind [`loom_core::tool::ToolKind::Mcp`], the server's input schema,
//!   declarations from the MCP annotations ([`declarations_from_annotations`]) then the
//!   server-level [`ToolOverrides`];
//! - **calls** carry `_meta: {"loom-ia/idempotency_key": …}` (and `"traceparent"`, the W3C trace
//!   context of the call's span, when traces are exported; over streamable HTTP it also goes as
//!   the W3C `traceparent` HTTP header of the call's request); text, structured content, images
//!   and resources become content blocks; `isError` becomes `is_error`; a crash or protocol
//!   failure mid-call is an error result, never a hang;
//! - **connections** follow the [`Scope`], are reused by every call, and are replaced after a
//!   growing delay when they drop, under a circuit breaker whose opening is reported once as a
//!   [`loom_core::ports::CircuitNotice`]; shared and tenant connections unused for
//!   [`McpServerOptions::idle_timeout`] are closed and reopened at their next use, never while
//!   a call is in flight;
//! - **tool list changes** (`notifications/tools/list_changed`) make the next use read the list
//!   again: each [`loom_core::ports::ToolSource::open`] gives the latest list (the engine
//!   journals it per opening), a run keeps the list it opened with, and a call to a tool the
//!   server withdrew since is refused ([`McpError::Withdrawn`]).
//!
//! Errors are classified by kind in [`McpError`].

mod breaker;
mod connection;
mod convert;
mod declarations;
mod error;
mod options;
mod server;
mod sse;
mod traced;

pub use declarations::{AnnotationHints, apply_overrides, declarations_from_annotations};
pub use error::McpError;
pub use options::{
    CircuitSettings, MAX_SERVER_NAME_LEN, McpServerOptions, Scope, ToolOverrides, Transport,
    valid_server_name, valid_tool_name,
};
pub use server::{IDEMPOTENCY_META_KEY, McpServer};

#[cfg(test)]
mod tests {
    #[test]
    fn http_clients_can_be_built_once_the_provider_is_installed() {
        loom_tls::install_crypto_provider();
        assert!(reqwest::Client::builder().build().is_ok());
    }
}
