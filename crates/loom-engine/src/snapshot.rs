//! Writing `session.snapshot` events ([`Engine::snapshot_if_due`]): after a root run closes,
//! the session history as the next run would be sent it is written into the journal, with what
//! the session's runs spent and the provider model names seen, so that the next run reads that
//! event and what follows instead of the whole journal (see [`crate::window`]).
//!
//! **When.** A snapshot covers the events up to `up_to_seq`, chosen so that every root run that
//! began by then had closed by then (a run paused for an approval holds the next snapshot back
//! to just before its start: a closed run changes no more, an open one could). It is written
//! once at least `snapshot_every` events since the last one are covered **and** the history
//! grew by at least a quarter of what the last snapshot held. The reference writes one every
//! 50 events whatever its size, so its snapshots weigh the square of the history; here their
//! sizes grow geometrically, and all of them together weigh at most about five times the final
//! history.
//!
//! A snapshot is never the truth: it is derived from the events before it, and a lost race (a
//! conflict with another writer) only means it is written after a later run.

use std::sync::Arc;

use loom_core::{
    Event, RunState,
    event::{Payload, SessionSnapshot},
    ports::{StoreError, owned_events},
    state::compaction,
};

use crate::{
    budget, engine::Engine, error::EngineError, events::RunRef, window::Window,
    window::session_spent,
};

impl Engine {
    /// Writes a `session.snapshot` for the session of `run` when one is due (see the module
    /// documentation), as an event of `run` (a root run that just closed) in the name of the
    /// session's agent. Returns whether one was written.
    pub async fn snapshot_if_due(&self, run: &RunRef) -> Result<bool, EngineError> {
        let Some(every) = self.snapshot_every else {
            return Ok(false);
        };
        // A snapshot covers at least `every` events after the last one: a session that has
        // not written that many since is not read.
        let Some(window) = Window::latest_beyond(
            self.store.as_ref(),
            &run.tenant_id,
            &run.session_id,
            u64::from(every),
        )
        .await?
        else {
            return Ok(false);
        };
        let Some(snapshot) = plan(&window, every)? else {
            return Ok(false);
        };
        let Some(root) = window
            .events
            .iter()
            .find(|e| e.run_id == run.run_id)
            .map(|e| e.root_run_id.clone())
        else {
            return Ok(false);
        };
        let Some(agent) = crate::ownership::owner(&window.events).map(str::to_owned) else {
            return Ok(false);
        };
        let span = self.ids.uuid();
        let event = self.events(run, &agent, &root).event(
            &span,
            None,
            None,
            Payload::SessionSnapshot(snapshot),
        );
        match self.store.append(vec![event], window.last_seq()).await {
            Ok(_) => Ok(true),
            // Someone wrote meanwhile: the snapshot waits for a later run.
            Err(StoreError::Conflict { .. }) => Ok(false),
            Err(other) => Err(other.into()),
        }
    }
}

/// The snapshot due after `window`, if one is (see the module documentation).
pub(crate) fn plan(window: &Window, every: u32) -> Result<Option<SessionSnapshot>, EngineError> {
    let up_to = match first_open_root(&window.events)? {
        Some(start) => start.saturating_sub(1),
        None => window.last_seq(),
    };
    if up_to <= window.after {
        return Ok(None);
    }
    let covered_len = window.events.partition_point(|e| e.seq <= up_to);
    let covered = &window.events[..covered_len];
    if covered.len() < every as usize {
        return Ok(None);
    }
    let base = window.snapshot.as_deref();
    let base_tokens = base.map_or(0, |s| s.tokens);
    // Every earlier turn, the latest compaction applied (a compaction since the last snapshot
    // is always worth a snapshot: it changed what the history holds).
    let groups = crate::window::groups(base, covered)?;
    let tokens = compaction::groups_tokens(&groups);
    let compacted = compaction::latest_compaction(covered).is_some();
    if !compacted && tokens.saturating_sub(base_tokens).saturating_mul(4) < base_tokens {
        return Ok(None);
    }
    let (messages, turns) = SessionSnapshot::describe(&groups);
    let mut spent = budget::root_runs_spent(covered)?
        .into_iter()
        .fold(budget::Spent::default(), |sum, run| sum.plus(run.spent));
    let names = crate::window::names(base, covered);
    let mut state = base.and_then(|s| s.state.clone()).unwrap_or_default();
    for event in covered {
        state.apply(event);
    }
    let state = (!state.values().is_empty()).then_some(state);
    if let Some(base) = base {
        spent.cost_usd += base.spent.cost_usd;
        spent.tokens += base.spent.tokens;
        spent.calls += base.spent.calls;
    }
    Ok(Some(SessionSnapshot {
        up_to_seq: up_to,
        messages,
        tokens,
        spent: session_spent(&spent),
        models: names.into_map(),
        state,
        turns,
    }))
}

/// The seq of the `run.started` of the first root run of `events` that has not closed.
fn first_open_root(events: &[Arc<Event>]) -> Result<Option<u64>, EngineError> {
    let mut roots: Vec<(u64, RunState)> = Vec::new();
    let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for event in events {
        if let Payload::RunStarted(started) = &event.payload
            && started.parent_run_id.is_none()
        {
            index.insert(&event.run_id, roots.len());
            roots.push((event.seq, RunState::start(event)?));
            continue;
        }
        if let Some(&at) = index.get(event.run_id.as_str()) {
            roots[at].1.apply(event)?;
        }
    }
    Ok(roots
        .into_iter()
        .find(|(_, state)| !state.finished)
        .map(|(seq, _)| seq))
}

impl Engine {
    /// Events of `run`'s session from which the run and its sub-runs fold: from the run's
    /// start when the store's run index knows it, else from the last snapshot before the run
    /// (see the `window` module), else the whole session. Never fewer than the run's own events.
    pub async fn read_run(&self, run: &RunRef) -> Result<Vec<Event>, EngineError> {
        let events = self.read_run_shared(run).await?;
        Ok(owned_events(events))
    }

    /// [`Engine::read_run`], the events shared with the store ([`EventStore::read_shared`]):
    /// for a reader that only reads them (a run's result).
    ///
    /// [`EventStore::read_shared`]: loom_core::ports::EventStore::read_shared
    pub async fn read_run_shared(&self, run: &RunRef) -> Result<Vec<Arc<Event>>, EngineError> {
        let store = self.store.as_ref();
        if let Some(start) = store
            .run_start(&run.tenant_id, &run.session_id, &run.run_id)
            .await?
        {
            let events = store
                .read_shared(&run.tenant_id, &run.session_id, start.saturating_sub(1))
                .await?;
            if events.first().is_some_and(|e| {
                e.run_id == run.run_id && matches!(e.payload, Payload::RunStarted(_))
            }) {
                return Ok(events);
            }
        }
        Ok(Window::of_run(store, run).await?.events)
    }
}

impl Engine {
    /// The events of a session from its last `session.snapshot` on (the snapshot event among
    /// them, [`SessionSnapshot::base_of`]), or the whole session without one: what the
    /// session's history, spending and state fold from.
    ///
    /// [`SessionSnapshot::base_of`]: loom_core::event::SessionSnapshot::base_of
    pub async fn read_latest(
        &self,
        tenant_id: &str,
        session_id: &str,
    ) -> Result<Vec<Event>, EngineError> {
        let window = Window::latest(self.store.as_ref(), tenant_id, session_id).await?;
        Ok(owned_events(window.events))
    }
}
