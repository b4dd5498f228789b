//! What can go wrong with an MCP server, classified by kind.
//!
//! The breaker and the reconnection logic decide on the variant ([`McpError::is_connection_failure`]),
//! never on the message.

use std::time::Duration;

/// Why an MCP server could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The server name does not fit `^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$` (≤ 40 characters).
    #[error(
        "invalid MCP server name '{name}': use letters, digits, '-' and single '_' (no '__'), at most 40 characters"
    )]
    InvalidName {
        /// The name.
        name: String,
    },
    /// The HTTP URL is not an absolute http(s) URL.
    #[error("MCP server '{server}': '{url}' is not an http:// or https:// URL")]
    InvalidUrl {
        /// Server.
        server: String,
        /// The URL.
        url: String,
    },
    /// A header name or value cannot be sent (the value is never shown).
    #[error("MCP server '{server}': header '{header}' has an invalid name or value")]
    InvalidHeader {
        /// Server.
        server: String,
        /// The header's name.
        header: String,
    },
    /// The child process could not be started.
    #[error("MCP server '{server}': cannot start '{command}': {source}")]
    Spawn {
        /// Server.
        server: String,
        /// The program.
        command: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The HTTP client could not be built.
    #[error("MCP server '{server}': cannot build the HTTP client: {message}")]
    HttpClient {
        /// Server.
        server: String,
        /// Cause.
        message: String,
    },
    /// Connecting (spawn or HTTP, handshake, tool listing) took longer than `connect_timeout`.
    #[error("MCP server '{server}' did not answer within {after:?} while connecting ({during})")]
    ConnectTimeout {
        /// Server.
        server: String,
        /// The limit.
        after: Duration,
        /// The step that was under way (`the MCP handshake`, `waiting for the SSE endpoint
        /// event`, …).
        during: &'static str,
    },
    /// The SSE stream of an `sse` server could not be opened (network, HTTP status, not an
    /// event stream).
    #[error("MCP server '{server}': cannot open the SSE stream at {url}: {message}")]
    SseOpen {
        /// Server.
        server: String,
        /// The SSE endpoint.
        url: String,
        /// Cause.
        message: String,
    },
    /// The SSE stream failed or ended before its `endpoint` event (the URL to post to).
    #[error(
        "MCP server '{server}' did not send the `endpoint` event of the HTTP+SSE transport: {message}"
    )]
    SseNoEndpoint {
        /// Server.
        server: String,
        /// What happened instead.
        message: String,
    },
    /// The `endpoint` event names a URL Loom will not post to: unreadable, or on another origin
    /// than the SSE stream (messages, and the headers sent with them, go to the configured
    /// origin only).
    #[error("MCP server '{server}': message endpoint refused: {reason}")]
    SseEndpointRefused {
        /// Server.
        server: String,
        /// Why, naming both origins for another origin.
        reason: String,
    },
    /// The server no longer offers a tool the run was given: it changed its tool list
    /// (`notifications/tools/list_changed`) after the run opened it.
    #[error(
        "MCP server '{server}' no longer offers the tool '{tool}': it changed its tool list after this run opened it"
    )]
    Withdrawn {
        /// Server.
        server: String,
        /// The server's tool name.
        tool: String,
    },
    /// The MCP handshake failed (process exited, connection refused, protocol mismatch).
    #[error("MCP server '{server}' is unreachable: {message}")]
    Handshake {
        /// Server.
        server: String,
        /// Cause.
        message: String,
    },
    /// Listing the tools failed.
    #[error("MCP server '{server}' could not list its tools: {message}")]
    ListTools {
        /// Server.
        server: String,
        /// Cause.
        message: String,
    },
    /// The connection dropped while a call was in flight (crash, network).
    #[error("connection to MCP server '{server}' lost during the call: {message}")]
    ConnectionLost {
        /// Server.
        server: String,
        /// Cause.
        message: String,
    },
    /// The breaker is open: no attempt is made.
    #[error(
        "MCP server '{server}' is unavailable: its circuit breaker is open for {remaining:.1?} more after repeated failures"
    )]
    CircuitOpen {
        /// Server.
        server: String,
        /// Time until the next trial.
        remaining: Duration,
    },
    /// A reconnection is not due yet (growing delay after failures).
    #[error("MCP server '{server}' is unavailable: next reconnection attempt in {remaining:.1?}")]
    Backoff {
        /// Server.
        server: String,
        /// Time until the next attempt.
        remaining: Duration,
    },
    /// The run's connection was already released (run scope).
    #[error("MCP server '{server}': this run's connection was already closed")]
    Released {
        /// Server.
        server: String,
    },
    /// [`crate::McpServer::shutdown`] was called.
    #[error("MCP server '{server}' was shut down")]
    ShutDown {
        /// Server.
        server: String,
    },
    /// The server answered the call with a JSON-RPC error (unknown tool, invalid params, …).
    #[error("MCP server '{server}' refused the call to '{tool}': {message}")]
    Refused {
        /// Server.
        server: String,
        /// The server's tool name.
        tool: String,
        /// The server's message.
        message: String,
    },
    /// The server did not answer the call within `call_timeout`.
    #[error("MCP server '{server}' did not answer the call to '{tool}' within {after:?}")]
    CallTimeout {
        /// Server.
        server: String,
        /// The server's tool name.
        tool: String,
        /// The limit.
        after: Duration,
    },
    /// The arguments are not a JSON object.
    #[error("the arguments of '{tool}' must be a JSON object")]
    BadArguments {
        /// The tool, as the model sees it.
        tool: String,
    },
    /// The server answered something the client did not expect.
    #[error("MCP server '{server}' sent an unexpected answer to the call to '{tool}': {message}")]
    Protocol {
        /// Server.
        server: String,
        /// The server's tool name.
        tool: String,
        /// What was wrong.
        message: String,
    },
}

impl McpError {
    /// Whether this is a failure of the connection itself: counted by the circuit breaker and
    /// followed by a reconnection with a growing delay.
    pub fn is_connection_failure(&self) -> bool {
        matches!(
            self,
            McpError::Spawn { .. }
                | McpError::HttpClient { .. }
                | McpError::ConnectTimeout { .. }
                | McpError::Handshake { .. }
                | McpError::ListTools { .. }
                | McpError::ConnectionLost { .. }
                | McpError::SseOpen { .. }
                | McpError::SseNoEndpoint { .. }
                | McpError::SseEndpointRefused { .. }
        )
    }
}

impl From<McpError> for loom_core::tool::ToolError {
    fn from(error: McpError) -> loom_core::tool::ToolError {
        loom_core::tool::ToolError::new(error.to_string())
    }
}
