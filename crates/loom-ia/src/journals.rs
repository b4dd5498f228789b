//! Reading many sessions at once (a tenant's run list, event search, budget, report): one
//! session that cannot be read costs that session only. It is left out with a `tracing`
//! warning naming the file and the line where it breaks, and the others are read.

use std::collections::BTreeMap;

use loom_core::{Event, Payload, RunState, ports::EventStore, ports::StoreError};

use crate::LoomError;

/// A session's events for a listing over its tenant: `None`, with a warning naming the file
/// and the line, when its journal is corrupted (or naming the key, when it is sealed with a key
/// the tenant does not have). Other failures (the storage itself) are errors.
pub(crate) async fn read_listed(
    store: &dyn EventStore,
    tenant: &str,
    session: &str,
) -> Result<Option<Vec<Event>>, LoomError> {
    read_listed_after(store, tenant, session, 0).await
}

/// [`read_listed`] of the events after `after_seq` only.
pub(crate) async fn read_listed_after(
    store: &dyn EventStore,
    tenant: &str,
    session: &str,
    after_seq: u64,
) -> Result<Option<Vec<Event>>, LoomError> {
    match store.read(tenant, session, after_seq).await {
        Ok(events) => Ok(Some(events)),
        Err(StoreError::Corrupted { path, line, source }) => {
            tracing::warn!(
                tenant,
                session,
                file = %path,
                line,
                error = %source,
                "session skipped: its journal is corrupted at {path}:{line} (loom sessions repair)"
            );
            Ok(None)
        }
        // Sealed with a key the tenant no longer has: unreadable for good, like a corrupted
        // journal it costs that session only (reading it alone says so: 424, exit code 2).
        Err(StoreError::MissingKey { key_id, .. }) => {
            tracing::warn!(
                tenant,
                session,
                key_id,
                "session skipped: it is sealed with a key the tenant does not have"
            );
            Ok(None)
        }
        Err(other) => Err(other.into()),
    }
}

/// The runs of a session's journal, in the order they started: the runs a `run.started` opens
/// (events of a run whose `run.started` was set aside, or of none, open nothing).
pub(crate) fn started_runs(events: &[Event]) -> Vec<&str> {
    let mut runs: Vec<&str> = Vec::new();
    for event in events {
        if matches!(event.payload, Payload::RunStarted(_)) && !runs.contains(&event.run_id.as_str())
        {
            runs.push(&event.run_id);
        }
    }
    runs
}

/// The state of each run of a listed session, in the order they started; a run that cannot be
/// folded is left out with a warning naming it.
pub(crate) fn listed_states(session: &str, events: &[Event]) -> Vec<RunState> {
    let by_run = by_run(events);
    started_runs(events)
        .into_iter()
        .filter_map(|run_id| match fold(run_id, &by_run) {
            Ok(state) => Some(state),
            Err(error) => {
                tracing::warn!(session, run_id, %error, "run skipped: its journal cannot be folded");
                None
            }
        })
        .collect()
}

/// A journal's events grouped by run, each run's in journal order.
pub(crate) fn by_run(events: &[Event]) -> BTreeMap<&str, Vec<&Event>> {
    let mut by_run: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for event in events {
        by_run.entry(event.run_id.as_str()).or_default().push(event);
    }
    by_run
}

/// Folds `run_id` from its events as [`by_run`] grouped them.
pub(crate) fn fold(
    run_id: &str,
    by_run: &BTreeMap<&str, Vec<&Event>>,
) -> Result<RunState, loom_core::state::FoldError> {
    RunState::fold(run_id, by_run.get(run_id).into_iter().flatten().copied())
}
