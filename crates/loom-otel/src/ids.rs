//! Trace and span ids derived from a run's ids: the same on every process and at every export,
//! and computable while the run goes on, so that a call can carry its span's W3C `traceparent`.
//!
//! A trace id is the first 16 bytes of SHA-256 over `loom/trace`, the tenant and the root run
//! id; a span id the first 8 bytes of SHA-256 over `loom/span` and the span id the journal
//! records. An all-zero id, invalid in OpenTelemetry, becomes 1 in its last byte.

use sha2::{Digest, Sha256};

/// A 128-bit trace id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

/// A 64-bit span id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

impl TraceId {
    /// Lowercase hexadecimal, 32 characters.
    pub fn to_hex(self) -> String {
        hex(&self.0)
    }
}

impl SpanId {
    /// Lowercase hexadecimal, 16 characters.
    pub fn to_hex(self) -> String {
        hex(&self.0)
    }
}

fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

fn digest(parts: &[&str]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in parts {
        // Each part is followed by a NUL, so that ("ab", "c") and ("a", "bc") differ.
        hasher.update(part.as_bytes());
        hasher.update([0u8]);
    }
    hasher.finalize().into()
}

fn nonzero<const N: usize>(mut bytes: [u8; N]) -> [u8; N] {
    if bytes.iter().all(|byte| *byte == 0)
        && let Some(last) = bytes.last_mut()
    {
        *last = 1;
    }
    bytes
}

/// The trace id of the run tree whose root run is `root_run_id` in `tenant`.
pub fn trace_id(tenant: &str, root_run_id: &str) -> TraceId {
    let full = digest(&["loom/trace", tenant, root_run_id]);
    let mut id = [0u8; 16];
    id.copy_from_slice(&full[..16]);
    TraceId(nonzero(id))
}

/// The span id of the journal span `journal_span_id` (a run's, a step's, a tool call's…).
pub fn span_id(journal_span_id: &str) -> SpanId {
    let full = digest(&["loom/span", journal_span_id]);
    let mut id = [0u8; 8];
    id.copy_from_slice(&full[..8]);
    SpanId(nonzero(id))
}

/// The W3C `traceparent` header value of a sampled span: `00-<trace>-<span>-01`.
pub fn traceparent(trace: TraceId, span: SpanId) -> String {
    format!("00-{}-{}-01", trace.to_hex(), span.to_hex())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_deterministic_and_distinct() {
        let a = trace_id("default", "run-1");
        assert_eq!(a, trace_id("default", "run-1"));
        assert_ne!(a, trace_id("default", "run-2"));
        assert_ne!(a, trace_id("other", "run-1"));
        // The separator keeps the parts apart.
        assert_ne!(trace_id("ab", "c"), trace_id("a", "bc"));
        assert_eq!(span_id("s"), span_id("s"));
        assert_ne!(span_id("s"), span_id("t"));
    }

    #[test]
    fn ids_are_sha256_prefixes() {
        // sha256("loom/span\0x\0"), computed with Python's hashlib.
        assert_eq!(span_id("x").to_hex(), "8d4d9640884b2482");
        assert_eq!(trace_id("t", "r").to_hex().len(), 32);
    }

    #[test]
    fn traceparent_has_the_w3c_shape() {
        let header = traceparent(trace_id("default", "r"), span_id("s"));
        let parts: Vec<&str> = header.split('-').collect();
        assert_eq!(parts.len(), 4);
        assert_eq!(parts[0], "00");
        assert_eq!(parts[1].len(), 32);
        assert_eq!(parts[2].len(), 16);
        assert_eq!(parts[3], "01");
        assert!(header.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
        assert!(!header.chars().any(|c| c.is_ascii_uppercase()));
    }
}
