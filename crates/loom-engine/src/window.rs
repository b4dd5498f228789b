//! What of a session a run reads ([`Window`]): the events after the last `session.snapshot`
//! that precedes the run, and the snapshot, which sums up everything before them (the history
//! the next run is sent, what the session's runs spent, which model configs answered under
//! which provider names). A run in a long session reads that, never the whole journal; without
//! a snapshot (a young session, or a store that cannot find one cheaply) it reads everything,
//! and both give the same history, spending and names.
//!
//! A snapshot accounts for every root run that began at or before its `up_to_seq`, and all of
//! them had closed by then (see [`crate::snapshot`]): a closed run changes no more, so what the
//! snapshot says of them stays true, and the runs after it are folded from the window.

use std::{borrow::Borrow, sync::Arc};

use loom_core::{
    Event,
    event::{Payload, SessionSnapshot, SessionSpent},
    ports::EventStore,
    state::{
        compaction::{self, TurnGroup},
        session_groups_raw,
    },
};

use crate::{budget, error::EngineError, events::RunRef, names::ModelNames};

/// The `type` of a snapshot event.
pub(crate) const SNAPSHOT: &str = "session.snapshot";

/// The part of a session a run reads (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct Window {
    /// The events with a seq above `after`, in seq order, shared with the store
    /// ([`EventStore::read_shared`]).
    pub(crate) events: Vec<Arc<Event>>,
    /// The seq the window starts after (0: the whole session).
    pub(crate) after: u64,
    /// The snapshot that accounts for everything up to `after` (none when `after` is 0).
    pub(crate) snapshot: Option<Snapshot>,
}

/// A `session.snapshot` event as the store keeps it (shared: a snapshot carries the session's
/// whole history, not copied out of the store for each read), read as its payload.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot(Arc<Event>);

impl Snapshot {
    /// `event` when it is a `session.snapshot`.
    fn of(event: Arc<Event>) -> Option<Snapshot> {
        matches!(event.payload, Payload::SessionSnapshot(_)).then_some(Snapshot(event))
    }
}

impl std::ops::Deref for Snapshot {
    type Target = SessionSnapshot;

    fn deref(&self) -> &SessionSnapshot {
        match &self.0.payload {
            Payload::SessionSnapshot(snapshot) => snapshot,
            // `Snapshot::of` admits no other payload.
            _ => unreachable!("a Snapshot holds a session.snapshot"),
        }
    }
}

impl Window {
    /// The whole session.
    pub(crate) async fn whole(
        store: &dyn EventStore,
        tenant_id: &str,
        session_id: &str,
    ) -> Result<Window, EngineError> {
        Window::from_snapshot(store, tenant_id, session_id, None).await
    }

    /// The events after `snapshot` (the whole session for `None`), with it.
    async fn from_snapshot(
        store: &dyn EventStore,
        tenant_id: &str,
        session_id: &str,
        snapshot: Option<Snapshot>,
    ) -> Result<Window, EngineError> {
        let after = snapshot.as_ref().map_or(0, |s| s.up_to_seq);
        Ok(Window {
            events: store.read_shared(tenant_id, session_id, after).await?,
            after,
            snapshot,
        })
    }

    /// From the session's last snapshot (the whole session without one): what a new run, or a
    /// new snapshot, needs.
    pub(crate) async fn latest(
        store: &dyn EventStore,
        tenant_id: &str,
        session_id: &str,
    ) -> Result<Window, EngineError> {
        let snapshot = snapshot(store, tenant_id, session_id, u64::MAX).await?;
        Window::from_snapshot(store, tenant_id, session_id, snapshot).await
    }

    /// [`Window::latest`] when at least `at_least` events follow the session's last snapshot
    /// (its start without one), `None` without reading the events when fewer do.
    pub(crate) async fn latest_beyond(
        store: &dyn EventStore,
        tenant_id: &str,
        session_id: &str,
        at_least: u64,
    ) -> Result<Option<Window>, EngineError> {
        let snapshot = snapshot(store, tenant_id, session_id, u64::MAX).await?;
        let after = snapshot.as_ref().map_or(0, |s| s.up_to_seq);
        let last = store.last_seq(tenant_id, session_id).await?;
        if last.saturating_sub(after) < at_least {
            return Ok(None);
        }
        Window::from_snapshot(store, tenant_id, session_id, snapshot)
            .await
            .map(Some)
    }

    /// From the last snapshot before `run` began: every event of the run and of its sub-runs
    /// is in the window. A run that began before the session's last snapshot (one that waited
    /// for an approval meanwhile) reads from the snapshot before it, found from the store's run
    /// index; the whole session when the store cannot say where the run began.
    pub(crate) async fn of_run(
        store: &dyn EventStore,
        run: &RunRef,
    ) -> Result<Window, EngineError> {
        let (tenant, session) = (run.tenant_id.as_str(), run.session_id.as_str());
        let latest = Window::latest(store, tenant, session).await?;
        if latest.after == 0 || latest.holds_start(&run.run_id) {
            return Ok(latest);
        }
        let Some(start) = store.run_start(tenant, session, &run.run_id).await? else {
            return Window::whole(store, tenant, session).await;
        };
        if let Some(snapshot) = snapshot(store, tenant, session, start).await? {
            let window = Window::from_snapshot(store, tenant, session, Some(snapshot)).await?;
            if window.holds_start(&run.run_id) {
                return Ok(window);
            }
        }
        Window::whole(store, tenant, session).await
    }

    /// Whether the window holds the `run.started` of `run_id`.
    pub(crate) fn holds_start(&self, run_id: &str) -> bool {
        self.events
            .iter()
            .any(|e| e.run_id == run_id && matches!(e.payload, Payload::RunStarted(_)))
    }

    /// The seq of the last event read (`after` when the window is empty).
    pub(crate) fn last_seq(&self) -> u64 {
        self.events.last().map_or(self.after, |e| e.seq)
    }

    /// The events of the window before the first event of `run_id` (all of them when the run
    /// is not there).
    pub(crate) fn before(&self, run_id: &str) -> &[Arc<Event>] {
        let start = self
            .events
            .iter()
            .position(|e| e.run_id == run_id)
            .unwrap_or(self.events.len());
        &self.events[..start]
    }

    /// The session's earlier turns before `run_id` (all of them when the run is not in the
    /// window): the snapshot's, then one per root run that began after it, the latest
    /// compaction among the events applied over both.
    pub(crate) fn groups_before(&self, run_id: &str) -> Result<Vec<TurnGroup>, EngineError> {
        groups(self.snapshot.as_deref(), self.before(run_id))
    }

    /// What the session's root runs that began before `run_id` spent.
    pub(crate) fn spent_before(&self, run_id: &str) -> Result<budget::Spent, EngineError> {
        let mut spent = budget::session_spent(&self.events, run_id)?;
        if let Some(base) = &self.snapshot {
            spent.cost_usd += base.spent.cost_usd;
            spent.tokens += base.spent.tokens;
            spent.calls += base.spent.calls;
        }
        Ok(spent)
    }

    /// The provider model names seen answering in the session, with their configs.
    pub(crate) fn names(&self) -> ModelNames {
        names(self.snapshot.as_deref(), &self.events)
    }
}

/// The turns of `snapshot` (none: the session's start), then one per root run that begins in
/// `events` (the events that follow it, in seq order), the latest compaction among them
/// applied over both.
pub(crate) fn groups<E: Borrow<Event>>(
    snapshot: Option<&SessionSnapshot>,
    events: &[E],
) -> Result<Vec<TurnGroup>, EngineError> {
    let mut groups = snapshot.map(SessionSnapshot::groups).unwrap_or_default();
    groups.extend(session_groups_raw(events)?);
    Ok(match compaction::latest_compaction(events) {
        Some(compacted) => compaction::apply_compaction(groups, compacted),
        None => groups,
    })
}

/// The provider model names of `snapshot`, then those seen answering in `events`.
pub(crate) fn names<E: Borrow<Event>>(
    snapshot: Option<&SessionSnapshot>,
    events: &[E],
) -> ModelNames {
    let mut names = ModelNames::from_map(snapshot.map(|s| s.models.clone()).unwrap_or_default());
    for event in events {
        names.note(event.borrow());
    }
    names
}

/// The last snapshot of a session with a seq below `before`, if any.
async fn snapshot(
    store: &dyn EventStore,
    tenant_id: &str,
    session_id: &str,
    before: u64,
) -> Result<Option<Snapshot>, EngineError> {
    let found = store
        .last_of_type_shared(tenant_id, session_id, SNAPSHOT, before)
        .await?;
    Ok(found.and_then(Snapshot::of))
}

/// A snapshot's spending, from a [`budget::Spent`].
pub(crate) fn session_spent(spent: &budget::Spent) -> SessionSpent {
    SessionSpent {
        cost_usd: spent.cost_usd,
        tokens: spent.tokens,
        calls: spent.calls,
    }
}
