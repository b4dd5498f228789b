//! What a caller sees of a run as it is driven.

use loom_core::Event;

/// Receives what a run produces, as it happens: journaled events (after they are durable) and
/// text deltas streamed by the model (before the answer is journaled).
pub trait Observer: Send + Sync {
    /// An event was appended to the journal.
    fn event(&self, _event: &Event) {}
    /// The model streamed some text for `run_id`.
    fn text_delta(&self, _run_id: &str, _text: &str) {}
    /// The model call of `run_id` starts streaming again (a retry, or a fallback model): the
    /// text streamed since the step began will not be journaled, and a live display should drop
    /// it.
    fn reset(&self, _run_id: &str) {}
}

impl Observer for () {}
