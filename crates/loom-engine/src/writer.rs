//! Writes into a session's journal, under its optimistic concurrency: an append is made after
//! the last event its writer read, and a conflict means someone else wrote in between.
//!
//! Two writers, for the two situations. [`SessionWriter`] writes the events of a run being
//! driven, in order: a conflict caused by other runs of the session is retried after reading
//! what they wrote, an event of the run itself means another driver took over.
//! [`append_fresh`] is every write made outside a pilot (opening a run or a child run,
//! steering, settling approvals, cancelling a run at rest, handing a lease back): it reads the
//! session, decides what to write from it, and on a conflict reads and decides again.

use std::sync::Arc;

use chrono::SubsecRound;

use loom_core::{
    Event,
    event::Payload,
    ports::{EventStore, StoreError},
};

use crate::{error::EngineError, events::RunRef, observer::Observer, window::Window};

/// How many times a write is attempted when other runs of the session wrote in between.
///
/// The reference gives up after 5; several processes driving runs of one session at once
/// (workers of one tenant's conversation) lose that many races in a row, so Loom tries longer,
/// pausing between attempts ([`contention_pause`]). Every conflict means another writer made
/// progress, so the session as a whole never stalls.
const MAX_CONFLICT_RETRIES: usize = 16;

/// The pause before attempt `attempt` (from 1) of a write that conflicted: doubling from 1 ms
/// up to 64 ms, scaled by a factor in [0.5, 1.5) drawn from the run id and the attempt, so that
/// writers that collided do not collide again in lockstep (and a run's pauses are the same
/// from one execution to the next).
fn contention_pause(run_id: &str, attempt: usize) -> std::time::Duration {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    (run_id, attempt).hash(&mut hasher);
    let spread = 0.5 + (hasher.finish() % 1000) as f64 / 1000.0;
    let base = (1u64 << attempt.saturating_sub(1).min(6)) as f64;
    std::time::Duration::from_secs_f64(base * spread / 1000.0)
}

/// What of the session [`append_fresh`] reads to decide (see [`Window`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Reading<'a> {
    /// The window of this run: every event of it and of its sub-runs, and of the session since
    /// the last snapshot before it began.
    Run(&'a RunRef),
    /// The session since its last snapshot: enough to open a run whose id is generated (a
    /// chosen id is also looked up in the run index first).
    Latest,
}

/// What one attempt of [`append_fresh`] decided from the session's events.
pub(crate) enum Attempt<T> {
    /// Nothing to write: this is the outcome.
    Done(T),
    /// Append the events after those read; the outcome once they are written.
    Write(Vec<Event>, T),
}

/// Reads the session of `run`, lets `decide` choose what to write from its events, and appends
/// it after the last one read. When another writer appended in between, the session is read
/// and `decide` asked again after a short pause, up to [`MAX_CONFLICT_RETRIES`] times
/// ([`EngineError::Contention`] after that). Returns the outcome and the events written (none
/// for [`Attempt::Done`]).
pub(crate) async fn append_fresh<T>(
    store: &dyn EventStore,
    run: &RunRef,
    reading: Reading<'_>,
    mut decide: impl FnMut(&[Arc<Event>]) -> Result<Attempt<T>, EngineError>,
) -> Result<(T, Vec<Event>), EngineError> {
    for attempt in 0..MAX_CONFLICT_RETRIES {
        if attempt > 0 {
            tokio::time::sleep(contention_pause(&run.run_id, attempt)).await;
        }
        let window = match reading {
            Reading::Run(of) => Window::of_run(store, of).await?,
            Reading::Latest => Window::latest(store, &run.tenant_id, &run.session_id).await?,
        };
        let (batch, outcome) = match decide(&window.events)? {
            Attempt::Done(outcome) => return Ok((outcome, Vec::new())),
            Attempt::Write(batch, outcome) => (batch, outcome),
        };
        match store.append(batch, window.last_seq()).await {
            Ok(written) => return Ok((outcome, written)),
            Err(StoreError::Conflict { .. }) => continue,
            Err(other) => return Err(other.into()),
        }
    }
    Err(EngineError::Contention(run.session_id.clone()))
}

/// Writes the events of one run, in order, and tells the observer once they are durable.
pub(crate) struct SessionWriter<'a> {
    store: &'a dyn EventStore,
    run: &'a RunRef,
    worker_id: &'a str,
    observer: &'a dyn Observer,
    last_seq: u64,
    /// Events of this run written by someone else that do not take it over (steering
    /// messages), to apply before the next batch.
    foreign: Vec<Event>,
    /// Every event other writers appended that this writer read on a conflict, in seq order
    /// (for the session's state, which other runs of the session write too).
    seen: Vec<Event>,
}

impl<'a> SessionWriter<'a> {
    pub(crate) fn new(
        store: &'a dyn EventStore,
        run: &'a RunRef,
        worker_id: &'a str,
        observer: &'a dyn Observer,
        last_seq: u64,
    ) -> SessionWriter<'a> {
        SessionWriter {
            store,
            run,
            worker_id,
            observer,
            last_seq,
            foreign: Vec::new(),
            seen: Vec::new(),
        }
    }

    /// Appends a batch. Conflicts caused by other runs of the session are retried; an event
    /// of this run written by someone else means another driver took over: nothing is written.
    /// The batch is shared with the store, never copied here: each event is numbered after
    /// the last seq known and given its timestamp at the microsecond (as its line keeps it),
    /// so that a store keeping events (the memory journal) keeps these very ones. It is kept
    /// for the next attempt, numbered again, and the events written come back shared.
    pub(crate) async fn append(
        &mut self,
        batch: Vec<Event>,
    ) -> Result<Vec<Arc<Event>>, EngineError> {
        let mut batch: Vec<Arc<Event>> = batch
            .into_iter()
            .map(|mut event| {
                event.ts = event.ts.trunc_subsecs(6);
                Arc::new(event)
            })
            .collect();
        for attempt in 0..MAX_CONFLICT_RETRIES {
            if attempt > 0 {
                tokio::time::sleep(contention_pause(&self.run.run_id, attempt)).await;
            }
            for (seq, event) in (self.last_seq + 1..).zip(&mut batch) {
                if event.seq != seq {
                    // The store left the batch when it refused it: nothing else shares it.
                    Arc::make_mut(event).seq = seq;
                }
            }
            match self.store.append_shared(&batch, self.last_seq).await {
                Ok(written) => {
                    if let Some(last) = written.last() {
                        self.last_seq = last.seq;
                    }
                    for event in &written {
                        self.observer.event(event);
                    }
                    return Ok(written);
                }
                Err(StoreError::Conflict { found, .. }) => {
                    let newer = self
                        .store
                        .read(&self.run.tenant_id, &self.run.session_id, self.last_seq)
                        .await?;
                    let mine = newer.iter().filter(|e| e.run_id == self.run.run_id);
                    if let Some(intruder) = mine.clone().find(|e| !is_steering(e)) {
                        return Err(self.taken_over(intruder));
                    }
                    for event in mine {
                        self.observer.event(event);
                        self.foreign.push(event.clone());
                    }
                    self.seen.extend(newer.iter().cloned());
                    self.last_seq = newer.last().map_or(found, |e| e.seq);
                }
                Err(other) => return Err(other.into()),
            }
        }
        Err(EngineError::Contention(self.run.session_id.clone()))
    }

    /// The events other writers appended, read since the last call, in journal order.
    pub(crate) fn take_seen(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.seen)
    }

    /// Steering messages that arrived since the last write, in journal order.
    pub(crate) fn take_foreign(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.foreign)
    }

    fn taken_over(&self, intruder: &Event) -> EngineError {
        match &intruder.payload {
            payload if payload.is_closing() => EngineError::RunMoved(self.run.run_id.clone()),
            Payload::RunTransitioned(t) if t.to_state.is_terminal() => {
                EngineError::RunMoved(self.run.run_id.clone())
            }
            Payload::RunClaimed(claim) if claim.worker_id != self.worker_id => {
                EngineError::ClaimConflict {
                    run_id: self.run.run_id.clone(),
                    worker_id: claim.worker_id.clone(),
                    lease_until: claim.lease_until.to_rfc3339(),
                }
            }
            _ => EngineError::ClaimConflict {
                run_id: self.run.run_id.clone(),
                worker_id: "another driver".into(),
                lease_until: intruder.ts.to_rfc3339(),
            },
        }
    }
}

/// A message sent to the run while it is driven (`Loom::steer`): not a takeover.
fn is_steering(event: &Event) -> bool {
    matches!(&event.payload, Payload::MessageUser(user) if user.kind == loom_core::state::STEER)
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    use loom_core::{BoxFuture, ports::SessionSummary};
    use loom_journal::MemoryStore;
    use loom_testkit::conformance::event;

    use super::*;

    /// A journal where another writer appends an event just before each of the next
    /// `interferences` appends: each of them then conflicts.
    #[derive(Debug)]
    struct Interfering {
        inner: MemoryStore,
        interferences: AtomicUsize,
    }

    impl Interfering {
        fn new(interferences: usize) -> Interfering {
            Interfering {
                inner: MemoryStore::new(),
                interferences: AtomicUsize::new(interferences),
            }
        }

        /// Another writer's append, while interferences are left.
        async fn interfere(&self) -> Result<(), StoreError> {
            let interfere = self
                .interferences
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if interfere {
                let last = self.inner.last_seq("t", "s").await?;
                self.inner
                    .append(vec![event("t", "s", &format!("other-{last}"))], last)
                    .await?;
            }
            Ok(())
        }
    }

    impl EventStore for Interfering {
        fn append(
            &self,
            batch: Vec<Event>,
            expected_last_seq: u64,
        ) -> BoxFuture<'_, Result<Vec<Event>, StoreError>> {
            Box::pin(async move {
                self.interfere().await?;
                self.inner.append(batch, expected_last_seq).await
            })
        }

        fn append_shared<'a>(
            &'a self,
            batch: &'a [Arc<Event>],
            expected_last_seq: u64,
        ) -> BoxFuture<'a, Result<Vec<Arc<Event>>, StoreError>> {
            Box::pin(async move {
                self.interfere().await?;
                self.inner.append_shared(batch, expected_last_seq).await
            })
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
    }

    fn run() -> RunRef {
        RunRef {
            tenant_id: "t".into(),
            session_id: "s".into(),
            run_id: "s".into(),
        }
    }

    #[test]
    fn pauses_grow_to_a_bound_and_differ_between_runs() {
        let pauses: Vec<_> = (1..=MAX_CONFLICT_RETRIES)
            .map(|attempt| contention_pause("run-a", attempt))
            .collect();
        for pause in &pauses {
            assert!(pause.as_secs_f64() < 0.096, "{pause:?}");
        }
        assert!(pauses[0].as_secs_f64() < 0.0015 && pauses[0].as_secs_f64() >= 0.0005);
        assert!(pauses[8].as_secs_f64() >= 0.032, "{:?}", pauses[8]);
        assert_eq!(contention_pause("run-a", 3), contention_pause("run-a", 3));
        let others: Vec<_> = (1..=MAX_CONFLICT_RETRIES)
            .map(|attempt| contention_pause("run-b", attempt))
            .collect();
        assert_ne!(pauses, others, "two runs do not retry in lockstep");
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_is_decided_again_on_what_each_conflict_brought() {
        let store = Arc::new(Interfering::new(2));
        let mut seen = Vec::new();
        let (outcome, written) = append_fresh(store.as_ref(), &run(), Reading::Latest, |events| {
            seen.push(events.len());
            Ok(Attempt::Write(vec![event("t", "s", "mine")], "written"))
        })
        .await
        .unwrap();
        assert_eq!(outcome, "written");
        // Each attempt read what the other writer had appended before it.
        assert_eq!(seen, [0, 1, 2]);
        assert_eq!(written.len(), 1);
        assert_eq!(written[0].seq, 3);
        let journal = store.read("t", "s", 0).await.unwrap();
        assert_eq!(journal.len(), 3);
    }

    /// A pilot's batch refused on a conflict is numbered again after what the other writer
    /// appended, and the memory journal keeps the writer's very events, renumbered in place.
    #[tokio::test(start_paused = true)]
    async fn a_batch_refused_on_a_conflict_is_numbered_again_and_kept_as_shared() {
        let store = Interfering::new(2);
        let run = RunRef {
            tenant_id: "t".into(),
            session_id: "s".into(),
            run_id: "mine".into(),
        };
        let mut writer = SessionWriter::new(&store, &run, "worker", &(), 0);
        let batch = vec![event("t", "s", "a"), event("t", "s", "b")];
        let written = writer.append(batch).await.unwrap();
        let seqs: Vec<u64> = written.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [3, 4]);
        assert!(written.iter().all(|e| e.ts == e.ts.trunc_subsecs(6)));
        // What the other writer appended meanwhile was read, for the session's state.
        assert_eq!(writer.take_seen().len(), 2);
        let kept = store.inner.read_shared("t", "s", 2).await.unwrap();
        assert_eq!(kept.len(), 2);
        for (written, kept) in written.iter().zip(&kept) {
            assert!(Arc::ptr_eq(written, kept));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn sixteen_conflicts_in_a_row_give_up_and_write_nothing() {
        let store = Interfering::new(usize::MAX);
        let mut attempts = 0;
        let result = append_fresh(&store, &run(), Reading::Latest, |_| {
            attempts += 1;
            Ok(Attempt::Write(vec![event("t", "s", "mine")], ()))
        })
        .await;
        assert!(
            matches!(&result, Err(EngineError::Contention(session)) if session == "s"),
            "{result:?}"
        );
        assert_eq!(attempts, MAX_CONFLICT_RETRIES);
        let journal = store.read("t", "s", 0).await.unwrap();
        assert!(journal.iter().all(|e| !e.event_id.contains("mine")));
    }

    #[tokio::test]
    async fn a_decision_to_write_nothing_or_a_refusal_writes_nothing() {
        let store = Interfering::new(0);
        let (outcome, written) = append_fresh(&store, &run(), Reading::Latest, |_| {
            Ok(Attempt::<u8>::Done(7))
        })
        .await
        .unwrap();
        assert_eq!((outcome, written.len()), (7, 0));
        let refused: Result<((), Vec<Event>), EngineError> =
            append_fresh(&store, &run(), Reading::Latest, |_| {
                Err(EngineError::Invalid("no".into()))
            })
            .await;
        assert!(matches!(refused, Err(EngineError::Invalid(_))));
        assert!(store.read("t", "s", 0).await.unwrap().is_empty());
    }
}
