//! OpenTelemetry export for Loom: spans sent over OTLP/HTTP (protobuf, the SDK's exporter on the
//! blocking reqwest client, on a thread of its own), the redaction applied to every text before
//! it leaves the process, and the trace and span ids derived from a run's ids, so that the ids
//! a run's spans are exported with can be computed while it runs (W3C `traceparent`).
//!
//! The crate knows nothing of traces as Loom folds them: it exports [`ExportSpan`]s, a neutral
//! description that the facade builds from its trace of a run.

mod error;
mod exporter;
pub mod ids;
pub mod redact;
mod span;

pub use error::OtelError;
pub use exporter::{ExporterSettings, OtlpExporter, parse_headers};
pub use ids::{SpanId, TraceId, span_id, trace_id, traceparent};
pub use redact::{Pattern, Redactor};
pub use span::{ExportEvent, ExportSpan, ExportStatus, OtelKind};
