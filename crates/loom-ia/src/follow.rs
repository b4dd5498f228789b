//! Following a run: its journaled events (and its sub-runs', unless asked not to), then the
//! new ones as they are written, until the run closes. The REST API's SSE route and Rust
//! callers share [`Loom::follow`] and [`Loom::follow_with`].
//!
//! The live part waits for a notice of its session (an append in this instance, or a
//! [`loom_core::bus::Signal::Appended`] from another process through `storage.bus`) or, at
//! the latest, its fallback period ([`FALLBACK_PERIOD`] by default, so a lost notice costs at
//! most that), then reads the session after the last seq it saw: one `read(.., after_seq)`
//! per wake, never the whole session again. Its first read starts at the run's `run.started`
//! ([`EventStore::run_start`], from every store's run index). Each read is an indexed range on
//! PostgreSQL and SQLite, a slice of the memory store, and on JSONL a seek through the
//! session's offset index followed by the decoding of the lines returned only: what a wake
//! costs is what it returns, not the length of the session (`tests/follow.rs` counts it).
//!
//! [`EventStore::run_start`]: loom_core::ports::EventStore::run_start

use std::{
    collections::{HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use loom_core::{BoxStream, Event, Payload, ports::EventStore};
use loom_engine::RunRef;

use crate::{Loom, LoomError, notify::SessionWatch};

/// The longest the live part of [`Loom::follow`] waits without a notice before it reads the
/// journal anyway.
pub const FALLBACK_PERIOD: Duration = Duration::from_secs(1);

/// Whether `event` closes its run.
fn is_terminal(event: &Event) -> bool {
    matches!(
        event.payload,
        Payload::RunCompleted(_) | Payload::RunFailed(_) | Payload::RunCancelled(_)
    )
}

/// How [`Loom::follow_with`] follows a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowOptions {
    /// Only events with a greater session seq (`0`: all).
    pub after_seq: u64,
    /// Also the events of the runs it opened (sub-agents), down its tree (default `true`).
    pub subruns: bool,
    /// The longest the live part waits for a notice before it reads the journal anyway
    /// (default [`FALLBACK_PERIOD`]).
    pub fallback: Duration,
}

impl Default for FollowOptions {
    fn default() -> FollowOptions {
        FollowOptions {
            after_seq: 0,
            subruns: true,
            fallback: FALLBACK_PERIOD,
        }
    }
}

struct Follower {
    store: Arc<dyn EventStore>,
    /// The notices of the session (and the bus's catch-ups).
    watch: SessionWatch,
    /// The longest wait for a notice.
    fallback: Duration,
    run: RunRef,
    /// Whether the events of the run's sub-runs are yielded too.
    subruns: bool,
    /// The followed run and, with `subruns`, every run its tree opened so far.
    tree: HashSet<String>,
    /// Events with seq at most this one were read (of any run of the session).
    last_seq: u64,
    /// The client's resume point: events at or before it are not yielded.
    after_seq: u64,
    pending: VecDeque<Event>,
    started: bool,
    done: bool,
}

impl Follower {
    /// Reads the session after the last seq seen; on the first read, from the run's start (the
    /// store's run index tells where it is; else the session's start), to check that the run
    /// exists and whether it already closed before `after_seq`: what a follower reads does not
    /// grow with the runs before its own in the session.
    async fn fill(&mut self) -> Result<(), LoomError> {
        let from = if self.started {
            self.last_seq
        } else {
            self.store
                .run_start(&self.run.tenant_id, &self.run.session_id, &self.run.run_id)
                .await?
                .map_or(0, |seq| seq.saturating_sub(1))
        };
        self.watch.mark_seen();
        let events = self
            .store
            .read(&self.run.tenant_id, &self.run.session_id, from)
            .await?;
        if let Some(last) = events.last() {
            self.last_seq = self.last_seq.max(last.seq);
        }
        let mut seen = false;
        for event in events {
            if self.subruns
                && let Payload::RunStarted(started) = &event.payload
                && started
                    .parent_run_id
                    .as_ref()
                    .is_some_and(|parent| self.tree.contains(parent))
            {
                self.tree.insert(event.run_id.clone());
            }
            if !self.tree.contains(&event.run_id) {
                continue;
            }
            let own = event.run_id == self.run.run_id;
            seen |= own;
            if event.seq <= self.after_seq {
                if own && is_terminal(&event) {
                    self.done = true;
                }
                continue;
            }
            if !self.done {
                self.pending.push_back(event);
            }
        }
        if !self.started && !seen {
            return Err(LoomError::UnknownRun(self.run.run_id.clone()));
        }
        self.started = true;
        Ok(())
    }

    async fn next(mut self) -> Option<(Result<Event, LoomError>, Follower)> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                if event.run_id == self.run.run_id && is_terminal(&event) {
                    self.done = true;
                    self.pending.clear();
                }
                return Some((Ok(event), self));
            }
            if self.done {
                return None;
            }
            if self.started {
                self.watch.wait(self.last_seq, self.fallback).await;
            }
            if let Err(error) = self.fill().await {
                self.done = true;
                return Some((Err(error), self));
            }
        }
    }
}

impl Loom {
    /// The events of `run` and of its sub-runs with `seq > after_seq` (session seq; `0` for
    /// all): [`Loom::follow_with`] with sub-runs, as the reference's `follow` does.
    pub fn follow(
        &self,
        run: &RunRef,
        after_seq: u64,
    ) -> BoxStream<'static, Result<Event, LoomError>> {
        self.follow_with(
            run,
            FollowOptions {
                after_seq,
                ..FollowOptions::default()
            },
        )
    }

    /// The events of `run` with `seq > options.after_seq`, in journal order: those already
    /// written, then the new ones as they are journaled, ending after the run's terminal event
    /// (`run.completed`, `run.failed` or `run.cancelled`). A run that closed at or before
    /// `after_seq` gives an empty stream; an unknown run one [`LoomError::UnknownRun`]. A
    /// paused run keeps the stream open until it closes.
    ///
    /// With `options.subruns`, the events of the runs it opened (sub-agents, down its tree)
    /// come too, in their place in the shared session journal; their own terminal events do
    /// not end the stream. New events are read from the journal at each notice of the
    /// session, and at the latest every `options.fallback`.
    pub fn follow_with(
        &self,
        run: &RunRef,
        options: FollowOptions,
    ) -> BoxStream<'static, Result<Event, LoomError>> {
        self.listen();
        let follower = Follower {
            store: self.event_store(),
            watch: self.notices().watch(&run.tenant_id, &run.session_id),
            fallback: options.fallback,
            run: run.clone(),
            subruns: options.subruns,
            tree: HashSet::from([run.run_id.clone()]),
            last_seq: options.after_seq,
            after_seq: options.after_seq,
            pending: VecDeque::new(),
            started: false,
            done: false,
        };
        Box::pin(futures_util::stream::unfold(follower, Follower::next))
    }
}
