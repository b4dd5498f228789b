//! Letting go of runs without closing them: what a worker does when it shuts down.
//!
//! Cancelling a run closes it (`run.cancelled`, terminal). Stopping is the other way out: the
//! engine stops driving, the run stays open in its journal at a point from which any driver
//! continues it, and the lease is handed back (`run.claimed` with `lease_until` = now, as when
//! a run pauses for a human) so the next driver need not wait for it to expire.
//!
//! Two levels, both on the engine (every run it drives obeys them):
//!
//! - [`StopSignal::request`]: each run stops at its next safe point — after the step in
//!   progress has written its events (a model answer, a tool batch's results), before the
//!   next step or decision. A child run of a sub-agent call stops too; its parent's call stays
//!   open (no result), and driving the parent again resumes the child.
//! - [`StopSignal::interrupt`]: a step still running is abandoned where it is, as a crash
//!   would leave it (its tool tasks aborted; a call with `tool.called` and no
//!   `tool.completed` is re-run on resume when it is safe to, else answered `UNKNOWN_STATE`),
//!   and the lease handed back.
//!
//! Once requested, a stop is for good: an engine that stops does not start driving again.

use tokio_util::sync::CancellationToken;

/// The stop signal of an engine and its clones (see the module documentation).
#[derive(Debug, Clone, Default)]
pub struct StopSignal {
    requested: CancellationToken,
    interrupted: CancellationToken,
}

impl StopSignal {
    /// A signal not raised.
    pub fn new() -> StopSignal {
        StopSignal::default()
    }

    /// Asks every run to stop at its next safe point.
    pub fn request(&self) {
        self.requested.cancel();
    }

    /// Abandons the steps still running (implies [`StopSignal::request`]).
    pub fn interrupt(&self) {
        self.requested.cancel();
        self.interrupted.cancel();
    }

    /// Whether a stop was requested.
    pub fn is_requested(&self) -> bool {
        self.requested.is_cancelled()
    }

    /// Whether the steps in progress are abandoned.
    pub fn is_interrupted(&self) -> bool {
        self.interrupted.is_cancelled()
    }

    /// Resolves once a stop is requested.
    pub async fn requested(&self) {
        self.requested.cancelled().await;
    }

    /// Resolves once the steps in progress are to be abandoned.
    pub async fn interrupted(&self) {
        self.interrupted.cancelled().await;
    }
}
