//! [`EventReadError`]: why a journal line cannot be accepted as an event.

use super::SCHEMA_VERSION;

/// A journal line that cannot be accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EventReadError {
    /// Not an event at all.
    #[error("unreadable event: {0}")]
    Json(String),
    /// A schema version this build does not read.
    #[error(
        "event {event_id}: unsupported event schema version {found} (expected {SCHEMA_VERSION})"
    )]
    Version {
        /// The event.
        event_id: String,
        /// The version found.
        found: u32,
    },
    /// The envelope contradicts the payload.
    #[error("event {event_id} (seq {seq}): field '{field}' contradicts the payload")]
    Inconsistent {
        /// The event.
        event_id: String,
        /// Its seq.
        seq: u64,
        /// The contradicting field.
        field: &'static str,
    },
    /// The payload breaks an invariant.
    #[error("event {event_id} (seq {seq}): {reason}")]
    Invalid {
        /// The event.
        event_id: String,
        /// Its seq.
        seq: u64,
        /// What is wrong.
        reason: String,
    },
}
