//! [`Appended`]: a journal that does something after each successful append (announce it on the
//! bus, count its spending) and hands every other operation to the journal it wraps unchanged;
//! the one pass-through of the `EventStore` port that the facade's wrappers share.

use std::{fmt, sync::Arc};

use loom_core::{
    BoxFuture, Event,
    ports::{EventStore, Salvage, SessionSummary, SetAside, StoreError},
};

/// What a wrapper does once a batch is written (the events as the journal returned them). It
/// never fails the append: a failure is the hook's to log.
pub(crate) trait AfterAppend: Send + Sync + fmt::Debug {
    /// Called with each batch written (owned or shared, as the append returned them).
    fn after<'a>(&'a self, written: &'a [&'a Event]) -> BoxFuture<'a, ()>;
}

/// `inner`, with `hook` run after each successful append.
#[derive(Debug)]
pub(crate) struct Appended<H> {
    inner: Arc<dyn EventStore>,
    hook: H,
}

impl<H> Appended<H> {
    /// Wraps `inner`.
    pub(crate) fn new(inner: Arc<dyn EventStore>, hook: H) -> Appended<H> {
        Appended { inner, hook }
    }
}

impl<H: AfterAppend> EventStore for Appended<H> {
    fn append(
        &self,
        batch: Vec<Event>,
        expected_last_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Event>, StoreError>> {
        Box::pin(async move {
            let written = self.inner.append(batch, expected_last_seq).await?;
            self.hook.after(&written.iter().collect::<Vec<_>>()).await;
            Ok(written)
        })
    }

    fn append_shared<'a>(
        &'a self,
        batch: &'a [Arc<Event>],
        expected_last_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Arc<Event>>, StoreError>> {
        Box::pin(async move {
            let written = self.inner.append_shared(batch, expected_last_seq).await?;
            let events: Vec<&Event> = written.iter().map(|e| &**e).collect();
            self.hook.after(&events).await;
            Ok(written)
        })
    }

    fn read_shared<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Arc<Event>>, StoreError>> {
        self.inner.read_shared(tenant_id, session_id, after_seq)
    }

    fn last_of_type_shared<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        event_type: &'a str,
        before_seq: u64,
    ) -> BoxFuture<'a, Result<Option<Arc<Event>>, StoreError>> {
        self.inner
            .last_of_type_shared(tenant_id, session_id, event_type, before_seq)
    }

    fn read<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        self.inner.read(tenant_id, session_id, after_seq)
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

    fn salvage<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Salvage, StoreError>> {
        self.inner.salvage(tenant_id, session_id)
    }

    fn set_aside<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        lines: Vec<SetAside>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.set_aside(tenant_id, session_id, lines)
    }

    fn search<'a>(
        &'a self,
        filter: &'a loom_core::search::EventFilter,
    ) -> BoxFuture<'a, Result<Option<loom_core::search::Searched>, StoreError>> {
        self.inner.search(filter)
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
