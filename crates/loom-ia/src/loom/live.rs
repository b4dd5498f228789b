//! Live text: the text deltas the models stream while this process drives a run, fanned out
//! to whoever listens ([`Loom::text_deltas`]), e.g. an HTTP client following the run's events.
//!
//! Deltas are never journaled: a listener receives those written after it subscribed, only for
//! the runs this process drives (a run driven by a worker streams its deltas there), and a
//! listener too slow for the buffer ([`LIVE_BUFFER`] deltas) loses the oldest ones.

use loom_engine::{Observer, RunRef};
use tokio::sync::broadcast;

use super::Loom;
use loom_core::Event;

/// How many deltas wait for a slow listener before the oldest are dropped for it.
pub const LIVE_BUFFER: usize = 1024;

/// Text a model streamed for a run driven by this process, before its answer is journaled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveDelta {
    /// The tenant of the run's session.
    pub tenant_id: String,
    /// The session (a sub-run shares its root run's session).
    pub session_id: String,
    /// The run that streamed it (the root run, or one of its sub-runs).
    pub run_id: String,
    /// The text.
    pub text: String,
}

/// The fan-out of [`LiveDelta`]s of one instance.
#[derive(Debug)]
pub(super) struct Live {
    sender: broadcast::Sender<LiveDelta>,
}

impl Default for Live {
    fn default() -> Self {
        Live {
            sender: broadcast::channel(LIVE_BUFFER).0,
        }
    }
}

impl Loom {
    /// The text deltas of the runs this process drives from now on, every tenant and session
    /// (the listener filters): subscribe before following a run's events, so that no delta
    /// written after the subscription is missed.
    pub fn text_deltas(&self) -> broadcast::Receiver<LiveDelta> {
        self.inner.live.sender.subscribe()
    }
}

/// An observer that also publishes each text delta of `run`'s drive to the instance's
/// listeners.
pub(super) struct Publishing<'a> {
    pub(super) observer: &'a dyn Observer,
    pub(super) run: &'a RunRef,
    pub(super) live: &'a Live,
}

impl Observer for Publishing<'_> {
    fn event(&self, event: &Event) {
        self.observer.event(event);
    }

    fn text_delta(&self, run_id: &str, text: &str) {
        self.observer.text_delta(run_id, text);
        // Nobody listening is the usual case: nothing is kept then.
        if self.live.sender.receiver_count() > 0 {
            let _ = self.live.sender.send(LiveDelta {
                tenant_id: self.run.tenant_id.clone(),
                session_id: self.run.session_id.clone(),
                run_id: run_id.to_owned(),
                text: text.to_owned(),
            });
        }
    }

    fn reset(&self, run_id: &str) {
        self.observer.reset(run_id);
    }
}
