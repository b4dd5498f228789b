//! Projections for people, pure folds over journal events: the trace of a run ([`Trace`]: its
//! spans, sub-runs included) and usage reports of a run, a session and a tenant over a period
//! ([`UsageReport`]: in total, by run, by role, by agent and by model).

mod attributes;
mod spans;
mod trace;
mod usage;

pub use trace::{CONTENT_ATTRIBUTES, Span, SpanEvent, SpanKind, SpanStatus, Trace};
pub use usage::{RunUsage, UsageLine, UsageReport};
