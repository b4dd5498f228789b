//! [`CountingStore`]: a journal that counts what its reads return, to prove that a reader
//! reads only what it needs (a follower, a run in a long session), and records which of its
//! appends a durable journal would sync.

use std::sync::{
    Mutex, PoisonError,
    atomic::{AtomicU64, Ordering},
};

use loom_core::{
    BoxFuture, Event,
    ports::{EventStore, SessionSummary, StoreError},
};

/// Wraps a journal: every method is the inner journal's; `read` also counts the events it
/// returns and remembers the lowest `after_seq` asked for, and `append` records each batch's
/// types and whether a durable journal syncs it ([`loom_core::event::must_sync`]). The index lookups (`find_run`,
/// `run_start`, `last_of_type`) are the inner journal's own, uncounted: what is counted is
/// what the reads return.
#[derive(Debug)]
pub struct CountingStore<S> {
    /// The journal read and written.
    pub inner: S,
    returned: AtomicU64,
    lowest_after: AtomicU64,
    appended: Mutex<Vec<(Vec<String>, bool)>>,
}

impl<S: EventStore> CountingStore<S> {
    /// Counts the reads of `inner`.
    pub fn new(inner: S) -> CountingStore<S> {
        CountingStore {
            inner,
            returned: AtomicU64::new(0),
            lowest_after: AtomicU64::new(u64::MAX),
            appended: Mutex::new(Vec::new()),
        }
    }

    /// The types of the batches appended so far that a durable journal syncs before answering.
    pub fn synced_batches(&self) -> Vec<Vec<String>> {
        let appended = self.appended.lock().unwrap_or_else(PoisonError::into_inner);
        appended
            .iter()
            .filter(|(_, synced)| *synced)
            .map(|(types, _)| types.clone())
            .collect()
    }

    /// Starts counting again.
    pub fn reset(&self) {
        self.returned.store(0, Ordering::SeqCst);
        self.lowest_after.store(u64::MAX, Ordering::SeqCst);
    }

    /// Events returned by reads since the last [`CountingStore::reset`].
    pub fn returned(&self) -> u64 {
        self.returned.load(Ordering::SeqCst)
    }

    /// The lowest `after_seq` a read asked for since the last reset (`u64::MAX`: none).
    pub fn lowest_after(&self) -> u64 {
        self.lowest_after.load(Ordering::SeqCst)
    }
}

impl<S: EventStore> EventStore for CountingStore<S> {
    fn append(
        &self,
        batch: Vec<Event>,
        expected_last_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Event>, StoreError>> {
        let types = batch.iter().map(|e| e.event_type.clone()).collect();
        let synced = loom_core::event::must_sync(&batch);
        self.appended
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((types, synced));
        self.inner.append(batch, expected_last_seq)
    }

    fn read<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        Box::pin(async move {
            self.lowest_after.fetch_min(after_seq, Ordering::SeqCst);
            let events = self.inner.read(tenant_id, session_id, after_seq).await?;
            self.returned
                .fetch_add(events.len() as u64, Ordering::SeqCst);
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

    fn run_start<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        self.inner.run_start(tenant_id, session_id, run_id)
    }

    fn last_of_type<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        event_type: &'a str,
        before_seq: u64,
    ) -> BoxFuture<'a, Result<Option<Event>, StoreError>> {
        self.inner
            .last_of_type(tenant_id, session_id, event_type, before_seq)
    }
}
