//! The in-process store.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard, PoisonError},
};

use loom_core::{
    BoxFuture,
    event::Event,
    ports::{EventStore, SessionSummary, StoreError},
};

use loom_core::journal::{assign_seq, batch_journal, conflict, safe_id};

/// An in-process [`EventStore`]: journals live in a map behind a mutex and are lost at exit.
///
/// Cheap to create ([`Default`]); every operation is synchronous under the lock, which is
/// never held across an `.await`.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    journals: HashMap<(String, String), Journal>,
    /// Incremented at every append; orders sessions by recency.
    clock: u64,
}

#[derive(Debug, Default)]
struct Journal {
    events: Vec<Event>,
    /// Value of [`Inner::clock`] at the last append.
    touched: u64,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic never leaves a journal half-updated (seqs are assigned before the push), so
        // the data behind a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn append_now(&self, mut batch: Vec<Event>, expected: u64) -> Result<Vec<Event>, StoreError> {
        let Some((tenant_id, session_id)) = batch_journal(&batch)? else {
            return Ok(batch);
        };
        let mut inner = self.lock();
        let key = (tenant_id, session_id);
        let last = inner
            .journals
            .get(&key)
            .map_or(0, |journal| journal.events.len() as u64);
        if last != expected {
            return Err(conflict(&key.0, &key.1, expected, last));
        }
        assign_seq(&mut batch, last);
        inner.clock += 1;
        let clock = inner.clock;
        let journal = inner.journals.entry(key).or_default();
        journal.events.extend(batch.iter().cloned());
        journal.touched = clock;
        Ok(batch)
    }

    fn read_now(
        &self,
        tenant_id: &str,
        session_id: &str,
        after: u64,
    ) -> Result<Vec<Event>, StoreError> {
        safe_id("tenant", tenant_id)?;
        safe_id("session", session_id)?;
        let inner = self.lock();
        let Some(journal) = inner
            .journals
            .get(&(tenant_id.to_owned(), session_id.to_owned()))
        else {
            return Ok(Vec::new());
        };
        // Seqs are 1, 2, …: the event with seq `after + 1` sits at index `after`.
        let start = usize::try_from(after).unwrap_or(usize::MAX);
        Ok(journal.events.get(start..).unwrap_or_default().to_vec())
    }

    fn last_seq_now(&self, tenant_id: &str, session_id: &str) -> Result<u64, StoreError> {
        safe_id("tenant", tenant_id)?;
        safe_id("session", session_id)?;
        let inner = self.lock();
        Ok(inner
            .journals
            .get(&(tenant_id.to_owned(), session_id.to_owned()))
            .map_or(0, |journal| journal.events.len() as u64))
    }

    /// The last event of `kind` before `before`, looked for backwards from there.
    fn last_of_type_now(
        &self,
        tenant_id: &str,
        session_id: &str,
        kind: &str,
        before: u64,
    ) -> Result<Option<Event>, StoreError> {
        safe_id("tenant", tenant_id)?;
        safe_id("session", session_id)?;
        let inner = self.lock();
        let Some(journal) = inner
            .journals
            .get(&(tenant_id.to_owned(), session_id.to_owned()))
        else {
            return Ok(None);
        };
        // Seqs are 1, 2, …: the events before seq `before` are the first `before - 1`.
        let end = usize::try_from(before.saturating_sub(1))
            .unwrap_or(usize::MAX)
            .min(journal.events.len());
        Ok(journal.events[..end]
            .iter()
            .rev()
            .find(|event| event.event_type == kind)
            .cloned())
    }

    /// The seq of `run_id`'s `run.started`, looked for backwards (a followed run is usually
    /// one of the last), so that a follower's first read copies its run only.
    fn run_start_now(
        &self,
        tenant_id: &str,
        session_id: &str,
        run_id: &str,
    ) -> Result<Option<u64>, StoreError> {
        safe_id("tenant", tenant_id)?;
        safe_id("session", session_id)?;
        let inner = self.lock();
        Ok(inner
            .journals
            .get(&(tenant_id.to_owned(), session_id.to_owned()))
            .and_then(|journal| {
                journal
                    .events
                    .iter()
                    .rev()
                    .find(|e| e.run_id == run_id && e.event_type == "run.started")
            })
            .map(|event| event.seq))
    }

    fn sessions_now(&self, tenant_id: &str) -> Result<Vec<SessionSummary>, StoreError> {
        safe_id("tenant", tenant_id)?;
        let inner = self.lock();
        let mut found: Vec<(u64, SessionSummary)> = inner
            .journals
            .iter()
            .filter(|((tenant, _), _)| tenant == tenant_id)
            .map(|((_, session), journal)| {
                let summary = SessionSummary {
                    session_id: session.clone(),
                    last_seq: journal.events.len() as u64,
                    updated_at: journal.events.last().map(|event| event.ts),
                };
                (journal.touched, summary)
            })
            .collect();
        drop(inner);
        found.sort_by_key(|(touched, _)| std::cmp::Reverse(*touched));
        Ok(found.into_iter().map(|(_, summary)| summary).collect())
    }
}

impl EventStore for MemoryStore {
    fn append(
        &self,
        batch: Vec<Event>,
        expected_last_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Event>, StoreError>> {
        Box::pin(async move { self.append_now(batch, expected_last_seq) })
    }

    fn read<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        Box::pin(async move { self.read_now(tenant_id, session_id, after_seq) })
    }

    fn last_seq<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move { self.last_seq_now(tenant_id, session_id) })
    }

    fn sessions<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SessionSummary>, StoreError>> {
        Box::pin(async move { self.sessions_now(tenant_id) })
    }

    fn last_of_type<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        event_type: &'a str,
        before_seq: u64,
    ) -> BoxFuture<'a, Result<Option<Event>, StoreError>> {
        Box::pin(
            async move { self.last_of_type_now(tenant_id, session_id, event_type, before_seq) },
        )
    }

    fn run_start<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(async move { self.run_start_now(tenant_id, session_id, run_id) })
    }

    fn delete<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            safe_id("tenant", tenant_id)?;
            safe_id("session", session_id)?;
            let mut inner = self.lock();
            let removed = inner
                .journals
                .remove(&(tenant_id.to_owned(), session_id.to_owned()));
            Ok(removed.map_or(0, |journal| journal.events.len() as u64))
        })
    }
}
