//! The engine: the journal and the services every run of it shares (clock, ids, lease,
//! artifact and idempotency stores, breakers, attachment limits, stop signal). What it does is
//! in the modules that extend it: `commands` (open, steer, settle, cancel a run) and `driver`
//! (drive a run).

use std::{sync::Arc, time::Duration};

use loom_core::ports::{ArtifactStore, Clock, EventStore, IdempotencyStore};

use crate::{
    attachments::AttachmentLimits,
    events::{Events, RunRef},
    ids::Ids,
    resilience::Breakers,
    stop::StopSignal,
};

/// The lease a driver takes on a run (`execution.lease`).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// Events between two `session.snapshot`s at least, by default (`sessions.snapshot_every`).
pub const DEFAULT_SNAPSHOT_EVERY: u32 = 50;

/// The engine: drives runs against a journal.
#[derive(Debug, Clone)]
pub struct Engine {
    pub(crate) store: Arc<dyn EventStore>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) ids: Ids,
    pub(crate) worker_id: String,
    pub(crate) lease: Duration,
    pub(crate) artifacts: Option<Arc<dyn ArtifactStore>>,
    pub(crate) idempotency: Option<Arc<dyn IdempotencyStore>>,
    pub(crate) breakers: Arc<Breakers>,
    pub(crate) attachment_limits: Arc<AttachmentLimits>,
    pub(crate) stop: StopSignal,
    /// Held while a run with a chosen id is opened, from the check that the id is unused in the
    /// tenant to the append of its `run.started` (see [`Engine::begin`]).
    pub(crate) openings: Arc<tokio::sync::Mutex<()>>,
    /// Events between two `session.snapshot`s at least (`None`: no snapshot is written).
    pub(crate) snapshot_every: Option<u32>,
    /// Caps on the history a run is sent (see [`Engine::with_history_caps`]).
    pub(crate) history_caps: loom_core::state::compaction::Caps,
    /// Whether tool calls are given their span's `traceparent`.
    pub(crate) trace_context: bool,
}

impl Engine {
    /// An engine over `store`, reading time from `clock`.
    pub fn new(store: Arc<dyn EventStore>, clock: Arc<dyn Clock>) -> Engine {
        let ids = Ids::new(clock.clone());
        let id = ids.uuid();
        let worker_id = format!("worker-{}", &id[id.len() - 12..]);
        Engine {
            store,
            clock,
            ids,
            worker_id,
            lease: DEFAULT_LEASE,
            artifacts: None,
            idempotency: None,
            breakers: Arc::new(Breakers::new()),
            attachment_limits: Arc::new(AttachmentLimits::default()),
            stop: StopSignal::new(),
            openings: Arc::new(tokio::sync::Mutex::new(())),
            snapshot_every: Some(DEFAULT_SNAPSHOT_EVERY),
            history_caps: loom_core::state::compaction::Caps::default(),
            trace_context: false,
        }
    }

    /// Gives each tool call the W3C `traceparent` of its span ([`crate::traceparent`]), as the
    /// facade does when traces are exported; off by default.
    pub fn with_trace_context(mut self, on: bool) -> Engine {
        self.trace_context = on;
        self
    }

    /// Writes a `session.snapshot` after a root run once at least `every` events were written
    /// since the last one (and the history grew by a quarter; see [`Engine::snapshot_if_due`]);
    /// `None` writes none. The default is 50, as `sessions.snapshot_every`.
    pub fn with_snapshots(mut self, every: Option<u32>) -> Engine {
        self.snapshot_every = every.filter(|every| *every > 0);
        self
    }

    /// The engine's stop signal, shared by its clones: once raised, every run it drives lets
    /// go without closing (see [`StopSignal`]), and [`Engine::drive`] returns the open state.
    pub fn stop_signal(&self) -> &StopSignal {
        &self.stop
    }

    /// Shares `breakers` with other engines (by default each engine, and its clones, has its
    /// own).
    pub fn with_breakers(mut self, breakers: Arc<Breakers>) -> Engine {
        self.breakers = breakers;
        self
    }

    /// The circuit breakers shared by every run of this engine.
    pub fn breakers(&self) -> &Arc<Breakers> {
        &self.breakers
    }

    /// Sets the lease duration.
    pub fn with_lease(mut self, lease: Duration) -> Engine {
        self.lease = lease;
        self
    }

    /// The lease a run's driver takes (`run.claimed` until now + lease), renewed while the run
    /// is driven every third of it, at least every second (never later than two thirds of the
    /// lease its last claim gave).
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Sets the artifact store: where large results are moved out of the context, and where
    /// the files attached to a run are kept.
    pub fn with_artifacts(mut self, artifacts: Arc<dyn ArtifactStore>) -> Engine {
        self.artifacts = Some(artifacts);
        self
    }

    /// Sets the limits on the files attached to a run (default [`AttachmentLimits::default`]).
    pub fn with_attachment_limits(mut self, limits: AttachmentLimits) -> Engine {
        self.attachment_limits = Arc::new(limits);
        self
    }

    /// The limits on the files attached to a run.
    pub fn attachment_limits(&self) -> &AttachmentLimits {
        &self.attachment_limits
    }

    /// The artifact store, if any.
    pub fn artifacts(&self) -> Option<&Arc<dyn ArtifactStore>> {
        self.artifacts.as_ref()
    }

    /// Sets the idempotency store that tools with a business key go through: a call whose key
    /// was already completed (by any run) is not run again and gets the recorded result.
    pub fn with_idempotency(mut self, store: Arc<dyn IdempotencyStore>) -> Engine {
        self.idempotency = Some(store);
        self
    }

    /// The idempotency store, if any.
    pub fn idempotency(&self) -> Option<&Arc<dyn IdempotencyStore>> {
        self.idempotency.as_ref()
    }

    /// This engine's worker id (`worker-<12 hex>`).
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// The journal.
    pub fn store(&self) -> &Arc<dyn EventStore> {
        &self.store
    }

    /// The id generator.
    pub fn ids(&self) -> &Ids {
        &self.ids
    }

    /// The events of `run`, of `agent`, in the tree rooted at `root_run_id`.
    pub(crate) fn events<'a>(
        &'a self,
        run: &'a RunRef,
        agent: &'a str,
        root_run_id: &'a str,
    ) -> Events<'a> {
        Events::new(&self.ids, self.clock.as_ref(), run, agent, root_run_id)
    }
}
