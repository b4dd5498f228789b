//! The in-process store.
//!
//! A finished run costs here only its events, kept as their journal lines and compressed once
//! their session goes quiet ([`journal`]): the memory journal is the truth of a process that
//! keeps it, so it keeps every event, and nothing else per run.

mod journal;
mod search;

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use loom_core::{
    BoxFuture,
    event::Event,
    ports::{EventStore, SessionSummary, StoreError, owned_events},
};

use loom_core::journal::{Batch, conflict, safe_id};

use journal::Journal;

/// How many appends (to any session) a session goes without one before its lines are packed.
const QUIET: u64 = 256;

/// An in-process [`EventStore`]: journals live in a map behind a mutex and are lost at exit.
///
/// Each event is kept as its journal line (the JSON the JSONL store writes) and decoded on
/// read; a session not written to during the last 256 appends of the store, or whose unpacked
/// lines reach 256, has them compressed together (LZ4). Reads return exactly the events written, as
/// the other journals return them (timestamps to the microsecond).
///
/// An event search (`EventStore::search`) reads each tenant's events in append order (the
/// store's write order) from 20 bytes of postings per event, those of the types asked for only,
/// and decodes only the events it looks at.
///
/// Cheap to create ([`Default`]); every operation is synchronous under the lock, which is
/// never held across an `.await`.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

/// What a [`MemoryStore`] holds ([`MemoryStore::footprint`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Sessions.
    pub sessions: usize,
    /// Events, in every session.
    pub events: u64,
    /// Bytes of the journal lines not packed yet.
    pub line_bytes: usize,
    /// Bytes of the packed (compressed) lines.
    pub packed_bytes: usize,
    /// Bytes of the search postings (the events' order, id hashes and types).
    pub index_bytes: usize,
}

#[derive(Debug, Default)]
struct Inner {
    journals: HashMap<(String, String), Journal>,
    /// Incremented at every append; orders sessions by recency.
    clock: u64,
    /// The sessions appended to during the last [`QUIET`] appends, oldest first, with the clock
    /// of that append: a session whose last append leaves this window is packed.
    recent: VecDeque<(u64, (String, String))>,
    /// Each tenant's events in write order, by type, for `search`.
    postings: HashMap<String, search::Postings>,
}

impl Inner {
    /// Packs the sessions whose last append is [`QUIET`] appends old.
    fn pack_quiet(&mut self) {
        while let Some((at, _)) = self.recent.front()
            && at + QUIET <= self.clock
        {
            let Some((at, key)) = self.recent.pop_front() else {
                break;
            };
            if let Some(journal) = self.journals.get_mut(&key)
                && journal.touched == at
            {
                journal.pack();
            }
        }
    }
}

/// How errors name a journal of this store.
fn name(tenant_id: &str, session_id: &str) -> String {
    format!("memory:{tenant_id}/{session_id}")
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// What the store holds: sessions, events, and the bytes their lines and postings take.
    pub fn footprint(&self) -> Footprint {
        let inner = self.lock();
        let mut footprint = Footprint {
            sessions: inner.journals.len(),
            ..Footprint::default()
        };
        for journal in inner.journals.values() {
            let bytes = journal.bytes();
            footprint.events += journal.last_seq();
            footprint.line_bytes += bytes.lines;
            footprint.packed_bytes += bytes.packed;
        }
        footprint.index_bytes = inner.postings.values().map(search::Postings::bytes).sum();
        footprint
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic never leaves a journal half-updated (seqs are assigned before the push), so
        // the data behind a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn append_now(
        &self,
        batch: Vec<Arc<Event>>,
        expected: u64,
    ) -> Result<Vec<Arc<Event>>, StoreError> {
        let mut batch = match Batch::check(batch)? {
            Ok(batch) => batch,
            Err(empty) => return Ok(empty),
        };
        let mut inner = self.lock();
        let key = (batch.tenant_id.clone(), batch.session_id.clone());
        let last = inner.journals.get(&key).map_or(0, Journal::last_seq);
        if last != expected {
            return Err(conflict(&key.0, &key.1, expected, last));
        }
        batch.assign_seq(last);
        inner.clock += 1;
        let clock = inner.clock;
        inner
            .postings
            .entry(key.0.clone())
            .or_default()
            .add(&key.1, batch.events());
        let (events, lines) = batch.into_parts();
        let journal = inner.journals.entry(key.clone()).or_default();
        let kept = journal.push(events, lines);
        journal.touched = clock;
        inner.recent.push_back((clock, key));
        inner.pack_quiet();
        Ok(kept)
    }

    fn read_now(
        &self,
        tenant_id: &str,
        session_id: &str,
        after: u64,
    ) -> Result<Vec<Arc<Event>>, StoreError> {
        safe_id("tenant", tenant_id)?;
        safe_id("session", session_id)?;
        let lines = match self
            .lock()
            .journals
            .get(&(tenant_id.to_owned(), session_id.to_owned()))
        {
            Some(journal) => journal.lines(after, u64::MAX),
            None => return Ok(Vec::new()),
        };
        // Decoded once the lock is released.
        lines.read(&name(tenant_id, session_id))
    }

    fn last_seq_now(&self, tenant_id: &str, session_id: &str) -> Result<u64, StoreError> {
        safe_id("tenant", tenant_id)?;
        safe_id("session", session_id)?;
        let inner = self.lock();
        Ok(inner
            .journals
            .get(&(tenant_id.to_owned(), session_id.to_owned()))
            .map_or(0, Journal::last_seq))
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
        let lines = match self
            .lock()
            .journals
            .get(&(tenant_id.to_owned(), session_id.to_owned()))
        {
            Some(journal) => journal.lines(0, u64::MAX),
            None => return Ok(None),
        };
        lines.run_start(run_id, &name(tenant_id, session_id))
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
                    last_seq: journal.last_seq(),
                    updated_at: journal.updated_at(),
                };
                (journal.touched, summary)
            })
            .collect();
        drop(inner);
        found.sort_by_key(|(touched, _)| std::cmp::Reverse(*touched));
        Ok(found.into_iter().map(|(_, summary)| summary).collect())
    }

    fn last_of_type_now(
        &self,
        tenant_id: &str,
        session_id: &str,
        event_type: &str,
        before_seq: u64,
    ) -> Result<Option<Arc<Event>>, StoreError> {
        safe_id("tenant", tenant_id)?;
        safe_id("session", session_id)?;
        let lines = match self
            .lock()
            .journals
            .get(&(tenant_id.to_owned(), session_id.to_owned()))
        {
            Some(journal) => journal.lines(0, before_seq),
            None => return Ok(None),
        };
        lines.last_of_type(event_type, before_seq, &name(tenant_id, session_id))
    }
}

impl MemoryStore {
    /// An event search from the tenant's postings (see `search.rs`): the lines it needs taken
    /// under the lock, decoded once it is released.
    fn search_now(
        &self,
        filter: &loom_core::search::EventFilter,
    ) -> Result<Option<loom_core::search::Searched>, StoreError> {
        use loom_core::search::Searched;
        safe_id("tenant", &filter.tenant_id)?;
        let plan = {
            let inner = self.lock();
            let Some(postings) = inner.postings.get(&filter.tenant_id) else {
                return Ok(Some(match filter.after {
                    Some(_) => Searched::UnknownAfter,
                    None => Searched::Found(Vec::new()),
                }));
            };
            postings.plan(filter, |session| {
                inner
                    .journals
                    .get(&(filter.tenant_id.clone(), session.to_owned()))
                    .map(|journal| journal.lines(0, u64::MAX))
            })
        };
        plan.answer(filter, |session| name(&filter.tenant_id, session))
    }
}

impl EventStore for MemoryStore {
    fn append(
        &self,
        batch: Vec<Event>,
        expected_last_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Event>, StoreError>> {
        Box::pin(async move {
            let batch = batch.into_iter().map(Arc::new).collect();
            Ok(owned_events(self.append_now(batch, expected_last_seq)?))
        })
    }

    fn append_shared<'a>(
        &'a self,
        batch: &'a [Arc<Event>],
        expected_last_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Arc<Event>>, StoreError>> {
        Box::pin(async move { self.append_now(batch.to_vec(), expected_last_seq) })
    }

    fn read<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        Box::pin(async move {
            Ok(owned_events(
                self.read_now(tenant_id, session_id, after_seq)?,
            ))
        })
    }

    fn read_shared<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Arc<Event>>, StoreError>> {
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
        Box::pin(async move {
            let found = self.last_of_type_now(tenant_id, session_id, event_type, before_seq)?;
            Ok(found.map(Arc::unwrap_or_clone))
        })
    }

    fn last_of_type_shared<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        event_type: &'a str,
        before_seq: u64,
    ) -> BoxFuture<'a, Result<Option<Arc<Event>>, StoreError>> {
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

    fn search<'a>(
        &'a self,
        filter: &'a loom_core::search::EventFilter,
    ) -> BoxFuture<'a, Result<Option<loom_core::search::Searched>, StoreError>> {
        Box::pin(async move { self.search_now(filter) })
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
            if let Some(postings) = inner.postings.get_mut(tenant_id) {
                postings.remove(session_id);
                if postings.is_empty() {
                    inner.postings.remove(tenant_id);
                }
            }
            Ok(removed.map_or(0, |journal| journal.last_seq()))
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use loom_core::{
        Message,
        event::{MessageUser, Payload},
    };
    use loom_testkit::conformance::{event, started};
    use serde_json::Map;

    /// A user message of `session`, with text a line must escape.
    fn said(session: &str, text: &str) -> Event {
        let mut event = event("t", session, text);
        let message = MessageUser {
            message: Message::user(format!("« {text} »\n\t\"quoted\" — 🧵")),
            kind: "request".into(),
            policy: None,
            tools: true,
        };
        event = Event::new(
            loom_core::event::Envelope {
                event_id: event.event_id,
                ts: event.ts,
                tenant_id: event.tenant_id,
                session_id: event.session_id,
                run_id: event.run_id,
                root_run_id: event.root_run_id,
                span_id: event.span_id,
                parent_span_id: event.parent_span_id,
                agent: event.agent,
                role: event.role,
            },
            Payload::MessageUser(message),
        );
        event
    }

    /// A run's worth of events in `session`: its start, then `n - 1` messages and claims.
    fn run(session: &str, n: usize) -> Vec<Event> {
        let mut events = vec![started("t", session, session, Map::new())];
        for i in 1..n {
            events.push(if i % 2 == 0 {
                event("t", session, &i.to_string())
            } else {
                said(session, &format!("message {i}"))
            });
        }
        events
    }

    async fn append_all(store: &MemoryStore, session: &str, events: Vec<Event>) -> Vec<Event> {
        let last = store.last_seq("t", session).await.unwrap();
        store.append(events, last).await.unwrap()
    }

    /// Appends to other sessions until every earlier session is quiet; returns the bytes of
    /// the lines written.
    async fn quieten(store: &MemoryStore) -> usize {
        let mut bytes = 0;
        for i in 0..QUIET {
            let session = format!("other{i}");
            let written = append_all(store, &session, vec![event("t", &session, "q")]).await;
            bytes += written.iter().map(|e| e.to_json().len()).sum::<usize>();
        }
        bytes
    }

    #[tokio::test]
    async fn every_event_reads_back_as_written_from_lines_and_packed_blocks() {
        let store = MemoryStore::new();
        let mut written = Vec::new();
        // 600 events in batches of 7: the tail is packed at 256 lines, twice.
        for batch in run("s", 600).chunks(7) {
            written.extend(append_all(&store, "s", batch.to_vec()).await);
        }
        assert!(store.footprint().packed_bytes > 0);
        assert!(store.footprint().line_bytes > 0);
        for after in [0, 1, 255, 256, 257, 300, 511, 512, 513, 599, 600, 601] {
            let from = usize::try_from(after).unwrap().min(written.len());
            assert_eq!(
                store.read("t", "s", after).await.unwrap(),
                written[from..],
                "after {after}"
            );
        }
        // Quiet: everything packed, still read whole.
        quieten(&store).await;
        assert_eq!(store.read("t", "s", 0).await.unwrap(), written);
        assert_eq!(store.read("t", "s", 590).await.unwrap(), written[590..]);
        // Written to again: the new lines after the blocks.
        let more = append_all(&store, "s", run("s", 3)[1..].to_vec()).await;
        written.extend(more);
        assert_eq!(store.read("t", "s", 0).await.unwrap(), written);
        assert_eq!(store.last_seq("t", "s").await.unwrap(), 602);
    }

    #[tokio::test]
    async fn a_quiet_session_is_compressed_to_a_fraction_of_its_lines() {
        let store = MemoryStore::new();
        let mut written = Vec::new();
        for i in 0..20 {
            let session = format!("run{i}");
            written.push(append_all(&store, &session, run(&session, 17)).await);
        }
        let before = store.footprint();
        assert_eq!(before.events, 20 * 17);
        assert_eq!(before.packed_bytes, 0);
        let others = quieten(&store).await;
        let after = store.footprint();
        assert_eq!(after.sessions, 20 + usize::try_from(QUIET).unwrap());
        // Only the other sessions' recent lines are left unpacked.
        assert_eq!(after.line_bytes, others, "{after:?}");
        assert!(
            after.packed_bytes < before.line_bytes / 3,
            "{after:?} against {before:?}"
        );
        for (i, events) in written.iter().enumerate() {
            assert_eq!(
                &store.read("t", &format!("run{i}"), 0).await.unwrap(),
                events
            );
        }
    }

    #[tokio::test]
    async fn the_summary_and_the_last_event_of_a_type_match_a_read() {
        let store = MemoryStore::new();
        let mut written = Vec::new();
        for batch in run("s", 300).chunks(5) {
            written.extend(append_all(&store, "s", batch.to_vec()).await);
        }
        let read = store.read("t", "s", 0).await.unwrap();
        let summary = &store.sessions("t").await.unwrap()[0];
        assert_eq!(summary.last_seq, 300);
        assert_eq!(summary.updated_at, read.last().map(|e| e.ts));
        for (kind, before) in [
            ("message.user", u64::MAX),
            ("message.user", 300),
            ("run.claimed", 200),
            ("run.claimed", 3),
            ("run.started", 2),
            ("run.started", 1),
            ("run.completed", u64::MAX),
        ] {
            let expected = written
                .iter()
                .rev()
                .find(|e| e.seq < before && e.event_type == kind);
            assert_eq!(
                store
                    .last_of_type("t", "s", kind, before)
                    .await
                    .unwrap()
                    .as_ref(),
                expected,
                "{kind} before {before}"
            );
        }
        assert_eq!(store.delete("t", "s").await.unwrap(), 300);
        assert_eq!(store.footprint(), Footprint::default());
    }
}
