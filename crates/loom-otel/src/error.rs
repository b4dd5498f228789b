//! `OtelError`: what can go wrong building an exporter or exporting.

/// An error of the OpenTelemetry adapter.
#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    /// The exporter could not be built (an endpoint that is not a URL, a header that is not
    /// one).
    #[error("OTLP exporter to {endpoint}: {reason}")]
    Build {
        /// The traces endpoint.
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// The receiver did not take the spans (unreachable, refused, timed out).
    #[error("OTLP export to {endpoint} failed: {reason}")]
    Export {
        /// The traces endpoint.
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// A headers value that is not `key=value` pairs separated by commas.
    #[error("OTLP headers: {0}")]
    Headers(String),
    /// A redaction pattern that does not compile.
    #[error("redaction pattern '{name}': {reason}")]
    Pattern {
        /// The pattern's name.
        name: String,
        /// The regex error.
        reason: String,
    },
}
