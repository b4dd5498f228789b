//! [`SealedJournal`]: any [`EventStore`] with its payloads sealed at rest.
//!
//! `append` seals each event's payload with the tenant's first key, the AAD binding it to the
//! seq the store will give it (`expected_last_seq + 1 + i`: the store writes the batch only if
//! its last seq is `expected_last_seq`, `loom_core::journal::assign_seq`), and hands back the
//! clear events; `read`, `salvage` and `last_of_type` open every sealed payload and check the
//! opened event whole (its envelope must match its clear payload). Envelopes stay clear, so
//! what a store does with them (the run index, listings, seq checks, deletion, the pushed-down
//! search and session index, the offsets and types behind `last_of_type`) needs no key: a
//! session whose key is gone can still be listed and erased.

use std::sync::Arc;

use loom_core::{
    BoxFuture, Event, Payload,
    journal::batch_journal,
    ports::{EventStore, Salvage, SessionSummary, SetAside, StoreError},
};

use crate::{
    keys::{KeySource, Keyring},
    seal::{open_payload, seal_payload},
};

/// An event store whose payloads are sealed with each tenant's key (see the module).
///
/// Without keys for a tenant ([`KeySource::keys`] empty) its events are written clear, and a
/// sealed line met while reading is a [`StoreError::MissingKey`]; clear lines are always read
/// (a journal sealed after the fact).
#[derive(Debug, Clone)]
pub struct SealedJournal {
    inner: Arc<dyn EventStore>,
    keys: Arc<dyn KeySource>,
}

impl SealedJournal {
    /// `inner`, sealed with the keys `keys` gives for each tenant.
    pub fn new(inner: Arc<dyn EventStore>, keys: Arc<dyn KeySource>) -> SealedJournal {
        SealedJournal { inner, keys }
    }

    /// The store underneath, which holds the sealed payloads.
    pub fn inner(&self) -> &Arc<dyn EventStore> {
        &self.inner
    }
}

/// `event` with its payload sealed for `seq`.
fn seal(keyring: &Keyring, event: &Event, seq: u64) -> Result<Event, StoreError> {
    let key = keyring.sealing(&format!("event {}", event.event_id))?;
    let sealed = seal_payload(key, event, seq).map_err(|error| StoreError::Unsealable {
        tenant_id: event.tenant_id.clone(),
        what: format!("event {}", event.event_id),
        reason: error.to_string(),
    })?;
    Ok(Event {
        payload: Payload::Sealed(sealed),
        ..event.clone()
    })
}

/// `event` opened in place when sealed, checked whole once opened.
fn open(keyring: &Keyring, event: &mut Event) -> Result<(), StoreError> {
    let Payload::Sealed(sealed) = &event.payload else {
        return Ok(());
    };
    let key = keyring.opening(&sealed.key_id)?;
    let unsealable = |reason: String| StoreError::Unsealable {
        tenant_id: event.tenant_id.clone(),
        what: format!("event {} (seq {})", event.event_id, event.seq),
        reason,
    };
    let payload = open_payload(key, event, sealed).map_err(|e| unsealable(e.to_string()))?;
    event.payload = payload;
    event
        .check()
        .map_err(|e| unsealable(format!("its envelope does not match its payload: {e}")))
}

/// Every event of `events` opened (all of one tenant).
fn open_all(keys: &dyn KeySource, events: &mut [Event]) -> Result<(), StoreError> {
    let Some(first) = events
        .iter()
        .find(|e| matches!(e.payload, Payload::Sealed(_)))
    else {
        return Ok(());
    };
    let keyring = Keyring::of(keys, &first.tenant_id);
    events
        .iter_mut()
        .try_for_each(|event| open(&keyring, event))
}

impl EventStore for SealedJournal {
    fn append(
        &self,
        batch: Vec<Event>,
        expected_last_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Event>, StoreError>> {
        Box::pin(async move {
            let Some(first) = batch.first() else {
                return self.inner.append(batch, expected_last_seq).await;
            };
            let keyring = Keyring::of(self.keys.as_ref(), &first.tenant_id);
            if !keyring.seals() {
                return self.inner.append(batch, expected_last_seq).await;
            }
            // The clear batch is checked whole (one journal, well-formed events that read back)
            // before it is sealed: the store underneath sees only sealed payloads.
            batch_journal(&batch)?;
            let sealed = (expected_last_seq + 1..)
                .zip(&batch)
                .map(|(seq, event)| seal(&keyring, event, seq))
                .collect::<Result<Vec<_>, _>>()?;
            let written = self.inner.append(sealed, expected_last_seq).await?;
            // The store gave the seqs the AAD was bound to; hand back the clear events.
            Ok(batch
                .into_iter()
                .zip(written)
                .map(|(mut clear, written)| {
                    clear.seq = written.seq;
                    clear
                })
                .collect())
        })
    }

    fn read<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        Box::pin(async move {
            let mut events = self.inner.read(tenant_id, session_id, after_seq).await?;
            open_all(self.keys.as_ref(), &mut events)?;
            Ok(events)
        })
    }

    fn last_seq<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.inner.last_seq(tenant_id, session_id)
    }

    fn sessions<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SessionSummary>, StoreError>> {
        self.inner.sessions(tenant_id)
    }

    fn delete<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.inner.delete(tenant_id, session_id)
    }

    fn find_run<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
        self.inner.find_run(tenant_id, run_id)
    }

    /// The store's own search (its filters read the clear envelopes and facets), each event
    /// found opened; when one cannot be opened the search is declined, so that the caller's
    /// scan leaves out only that session, naming it.
    fn search<'a>(
        &'a self,
        filter: &'a loom_core::search::EventFilter,
    ) -> BoxFuture<'a, Result<Option<loom_core::search::Searched>, StoreError>> {
        Box::pin(async move {
            match self.inner.search(filter).await? {
                Some(loom_core::search::Searched::Found(mut events)) => {
                    match open_all(self.keys.as_ref(), &mut events) {
                        Ok(()) => Ok(Some(loom_core::search::Searched::Found(events))),
                        Err(_) => Ok(None),
                    }
                }
                other => Ok(other),
            }
        })
    }

    fn recent_sessions<'a>(
        &'a self,
        tenant_id: &'a str,
        since: Option<chrono::DateTime<chrono::Utc>>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Option<loom_core::search::RecentSessions>, StoreError>> {
        self.inner.recent_sessions(tenant_id, since, limit)
    }

    fn run_start<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        self.inner.run_start(tenant_id, session_id, run_id)
    }

    /// The store's own answer (it finds the type by the clear envelope), opened.
    fn last_of_type<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        event_type: &'a str,
        before_seq: u64,
    ) -> BoxFuture<'a, Result<Option<Event>, StoreError>> {
        Box::pin(async move {
            let found = self
                .inner
                .last_of_type(tenant_id, session_id, event_type, before_seq)
                .await?;
            let mut events: Vec<Event> = found.into_iter().collect();
            open_all(self.keys.as_ref(), &mut events)?;
            Ok(events.pop())
        })
    }

    fn salvage<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Salvage, StoreError>> {
        Box::pin(async move {
            let mut salvage = self.inner.salvage(tenant_id, session_id).await?;
            open_all(self.keys.as_ref(), &mut salvage.events)?;
            Ok(salvage)
        })
    }

    fn set_aside<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        lines: Vec<SetAside>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let keyring = Keyring::of(self.keys.as_ref(), tenant_id);
            let lines = if keyring.seals() {
                lines
                    .into_iter()
                    .map(|aside| {
                        let replacement = seal(&keyring, &aside.replacement, aside.line)?;
                        Ok(SetAside {
                            replacement,
                            ..aside
                        })
                    })
                    .collect::<Result<Vec<_>, StoreError>>()?
            } else {
                lines
            };
            self.inner.set_aside(tenant_id, session_id, lines).await
        })
    }
}
