//! News of journal writes within an instance and between the processes of a service.
//!
//! [`NotifyingStore`] wraps the journal outermost (over the sealing and routing wrappers, so it
//! sees every append of every tenant): after each successful append it tells the local
//! followers at once ([`Notices`]) and publishes a [`Signal::Appended`] on the event bus for
//! the other processes. A publish that fails is logged and never fails the append: the journal
//! is the truth, and a follower that missed a notice reads the journal on its fallback period.
//!
//! [`Notices`] fans the notices out to local waiters: one `watch` per followed session (the
//! greatest seq announced), plus an epoch bumped whenever the bus subscription is made again,
//! which wakes every follower to catch up on what was sent while it was down.

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex, Weak},
    task::{Context, Waker},
    time::Duration,
};

use loom_core::{
    BoxFuture, Event,
    bus::{EventBus, Notice, Signal},
    ports::EventStore,
};
use tokio::sync::watch;

use crate::appended::{AfterAppend, Appended};

/// How long a publish may take before it is given up (with a warning).
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// The followed sessions, by tenant then session (looked up by `&str`, without building a
/// key): the sender of each one's watch, alive while someone follows it.
type Followed = HashMap<String, HashMap<String, Weak<watch::Sender<u64>>>>;

/// The local fan-out of notices: who follows which session.
#[derive(Debug)]
pub(crate) struct Notices {
    sessions: Mutex<Followed>,
    epoch: watch::Sender<u64>,
}

impl Notices {
    /// No follower yet.
    pub(crate) fn new() -> Notices {
        Notices {
            sessions: Mutex::new(HashMap::new()),
            epoch: watch::channel(0).0,
        }
    }

    /// Wakes the followers of the notice's session.
    pub(crate) fn announce(&self, notice: &Notice) {
        let sender = self.sessions.lock().ok().and_then(|sessions| {
            sessions
                .get(&*notice.tenant_id)?
                .get(&*notice.session_id)
                .and_then(Weak::upgrade)
        });
        if let Some(sender) = sender {
            sender.send_modify(|seq| *seq = (*seq).max(notice.last_seq));
        }
    }

    /// Wakes every follower: notices may have been lost (the bus was down).
    pub(crate) fn catch_up(&self) {
        self.epoch
            .send_modify(|epoch| *epoch = epoch.wrapping_add(1));
    }

    /// A watch on `(tenant, session)`, woken by its notices and by [`Notices::catch_up`]. The
    /// session's entry lives as long as one of its watches: the last one dropped takes it away.
    pub(crate) fn watch(self: &Arc<Self>, tenant_id: &str, session_id: &str) -> SessionWatch {
        let key = (tenant_id.to_owned(), session_id.to_owned());
        let mut sessions = self.table();
        let found = sessions
            .get(tenant_id)
            .and_then(|tenant| tenant.get(session_id))
            .and_then(Weak::upgrade);
        let sender = match found {
            Some(sender) => sender,
            None => {
                // An entry whose last watch went while a notice held its sender (a drop that
                // could not take it away) goes now.
                sessions.retain(|_, tenant| {
                    tenant.retain(|_, sender| sender.strong_count() > 0);
                    !tenant.is_empty()
                });
                let sender = Arc::new(watch::channel(0).0);
                sessions
                    .entry(key.0.clone())
                    .or_default()
                    .insert(key.1.clone(), Arc::downgrade(&sender));
                sender
            }
        };
        SessionWatch {
            session: sender.subscribe(),
            epoch: self.epoch.subscribe(),
            sender,
            key,
            notices: Arc::downgrade(self),
        }
    }

    /// How many sessions are followed now (an entry per session with a live watch).
    pub(crate) fn followed(&self) -> usize {
        self.table().values().map(HashMap::len).sum()
    }

    /// The table, also after a panic while it was held (each step leaves it valid).
    fn table(&self) -> std::sync::MutexGuard<'_, Followed> {
        self.sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What one follower waits on: the notices of its session, and the epoch.
#[derive(Debug)]
pub(crate) struct SessionWatch {
    session: watch::Receiver<u64>,
    epoch: watch::Receiver<u64>,
    /// Keeps the session's entry alive while someone follows it.
    sender: Arc<watch::Sender<u64>>,
    /// The session's entry.
    key: (String, String),
    /// Where the entry is, to take it away with the last watch.
    notices: Weak<Notices>,
}

impl Drop for SessionWatch {
    fn drop(&mut self) {
        let Some(notices) = self.notices.upgrade() else {
            return;
        };
        // Under the table's lock, where a new watch of the session would take another sender:
        // this one is the last when it holds the only strong reference.
        let mut sessions = notices.table();
        let (tenant_id, session_id) = &self.key;
        let Some(tenant) = sessions.get_mut(tenant_id) else {
            return;
        };
        if Arc::strong_count(&self.sender) == 1
            && tenant
                .get(session_id)
                .is_some_and(|entry| std::ptr::eq(entry.as_ptr(), Arc::as_ptr(&self.sender)))
        {
            tenant.remove(session_id);
            if tenant.is_empty() {
                sessions.remove(tenant_id);
            }
        }
    }
}

impl SessionWatch {
    /// Marks every notice so far as seen: call it just before reading the journal, so that a
    /// notice sent during the read wakes the next [`SessionWatch::wait`].
    pub(crate) fn mark_seen(&mut self) {
        self.session.borrow_and_update();
        self.epoch.borrow_and_update();
    }

    /// Resolves at a notice of a seq after `last_seq`, a catch-up, or after `fallback`,
    /// whichever comes first.
    pub(crate) async fn wait(&mut self, last_seq: u64, fallback: Duration) {
        let deadline = tokio::time::Instant::now() + fallback;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return,
                changed = self.session.changed() => {
                    if changed.is_err() {
                        tokio::time::sleep_until(deadline).await;
                        return;
                    }
                    if *self.session.borrow_and_update() > last_seq {
                        return;
                    }
                }
                changed = self.epoch.changed() => {
                    if changed.is_err() {
                        tokio::time::sleep_until(deadline).await;
                    }
                    return;
                }
            }
        }
    }
}

/// The journal wrapper that announces every successful append (see the module documentation).
#[derive(Debug)]
pub(crate) struct NotifyingStore {
    bus: Arc<dyn EventBus>,
    notices: Arc<Notices>,
    /// The tenant and session of the last notice: a run's appends are all to one session, so
    /// their notices share its names instead of copying them at each append.
    last_names: Mutex<Option<(Arc<str>, Arc<str>)>>,
}

impl NotifyingStore {
    /// `inner`, announcing its appends to `notices` and on `bus`.
    pub(crate) fn wrap(
        inner: Arc<dyn EventStore>,
        bus: Arc<dyn EventBus>,
        notices: Arc<Notices>,
    ) -> Appended<NotifyingStore> {
        Appended::new(
            inner,
            NotifyingStore {
                bus,
                notices,
                last_names: Mutex::default(),
            },
        )
    }

    /// `tenant` and `session` as shared names: the last notice's when they are the same.
    fn names(&self, tenant: &str, session: &str) -> (Arc<str>, Arc<str>) {
        let mut last = self
            .last_names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((t, s)) = last.as_ref()
            && **t == *tenant
            && **s == *session
        {
            return (Arc::clone(t), Arc::clone(s));
        }
        let names = (Arc::<str>::from(tenant), Arc::<str>::from(session));
        *last = Some(names.clone());
        names
    }

    /// Tells the local followers, then the other processes (the append never waits for the
    /// bus: a publish that does not complete at once goes on in a task of its own).
    fn announce(&self, written: &[&Event]) {
        let (Some(first), Some(last)) = (written.first(), written.last()) else {
            return;
        };
        let (tenant_id, session_id) = self.names(&first.tenant_id, &first.session_id);
        let notice = Notice {
            tenant_id,
            session_id,
            first_seq: first.seq,
            last_seq: last.seq,
        };
        self.notices.announce(&notice);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let bus = self.bus.clone();
        let mut publish = Box::pin(async move {
            let signal = Signal::Appended(notice);
            let published = tokio::time::timeout(PUBLISH_TIMEOUT, bus.publish(&signal)).await;
            let failure = match published {
                Ok(Ok(())) => return,
                Ok(Err(error)) => error.to_string(),
                Err(_) => format!("no answer within {} s", PUBLISH_TIMEOUT.as_secs()),
            };
            tracing::warn!(
                tenant_id = %signal.tenant_id(),
                session_id = %signal.session_id(),
                error = %failure,
                "the event bus did not take a notice (followers elsewhere read the journal later)"
            );
        });
        // A bus that takes the signal at once (the in-process one) is done with it here,
        // without a task; any other finishes in the background, polled again by its task.
        if publish
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending()
        {
            runtime.spawn(publish);
        }
    }
}

impl AfterAppend for NotifyingStore {
    fn after<'a>(&'a self, written: &'a [&'a Event]) -> BoxFuture<'a, ()> {
        self.announce(written);
        crate::telemetry::log_calls(written);
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A bus whose publish completes only once it is let through, recording what it took.
    #[derive(Debug, Default)]
    struct HeldBus {
        through: tokio::sync::Notify,
        taken: Mutex<Vec<Signal>>,
        /// Told after each signal taken.
        took: tokio::sync::Notify,
    }

    impl EventBus for HeldBus {
        fn publish<'a>(
            &'a self,
            signal: &'a Signal,
        ) -> BoxFuture<'a, Result<(), loom_core::bus::BusError>> {
            Box::pin(async move {
                self.through.notified().await;
                self.taken.lock().unwrap().push(signal.clone());
                self.took.notify_one();
                Ok(())
            })
        }

        fn subscribe(
            &self,
        ) -> BoxFuture<'_, Result<loom_core::bus::Signals, loom_core::bus::BusError>> {
            Box::pin(async { Ok(Box::pin(futures_util::stream::empty()) as _) })
        }

        fn ping(&self) -> BoxFuture<'_, Result<(), loom_core::bus::BusError>> {
            Box::pin(async { Ok(()) })
        }
    }

    /// A memory journal announcing its appends on an in-process bus, and that bus's signals.
    async fn on_memory_bus() -> (loom_core::bus::Signals, Appended<NotifyingStore>) {
        let bus = Arc::new(loom_journal::MemoryBus::new());
        let signals = bus.subscribe().await.unwrap();
        let store = NotifyingStore::wrap(
            Arc::new(loom_journal::MemoryStore::new()),
            bus,
            Arc::new(Notices::new()),
        );
        (signals, store)
    }

    /// The in-process bus takes the notice of an append before the append returns (no task is
    /// spawned for it); a bus that makes the append wait is finished in the background.
    #[tokio::test]
    async fn a_notice_is_published_in_place_when_the_bus_takes_it_at_once() {
        use futures_util::{FutureExt, StreamExt};

        let (mut signals, store) = on_memory_bus().await;
        store
            .append(loom_testkit::conformance::events("t", "s1", 1), 0)
            .await
            .unwrap();
        // Without yielding to any task: it is already on the bus.
        let Some(Some(Ok(Signal::Appended(notice)))) = signals.next().now_or_never() else {
            panic!("the notice is not on the bus yet");
        };
        assert_eq!((&*notice.session_id, notice.last_seq), ("s1", 1));

        let held = Arc::new(HeldBus::default());
        let store = NotifyingStore::wrap(
            Arc::new(loom_journal::MemoryStore::new()),
            held.clone(),
            Arc::new(Notices::new()),
        );
        store
            .append(loom_testkit::conformance::events("t", "s1", 1), 0)
            .await
            .unwrap();
        assert!(held.taken.lock().unwrap().is_empty());
        // Its task waits on the bus with its own waker, and finishes once let through.
        held.through.notify_one();
        tokio::time::timeout(Duration::from_secs(5), held.took.notified())
            .await
            .expect("the publish finishes in the background");
        assert_eq!(held.taken.lock().unwrap().len(), 1);
    }

    /// The notices of one session's appends share its names; another session's carry its own.
    #[tokio::test]
    async fn the_notices_of_a_session_share_its_names() {
        use futures_util::StreamExt;

        let (mut signals, store) = on_memory_bus().await;
        let events = loom_testkit::conformance::events;
        store.append(events("t", "s1", 1), 0).await.unwrap();
        store.append(events("t", "s1", 1), 1).await.unwrap();
        store.append(events("t", "s2", 1), 0).await.unwrap();
        let mut notices = Vec::new();
        for _ in 0..3 {
            let Some(Ok(Signal::Appended(notice))) = signals.next().await else {
                panic!("a notice per append");
            };
            notices.push(notice);
        }
        assert!(Arc::ptr_eq(&notices[0].session_id, &notices[1].session_id));
        assert!(Arc::ptr_eq(&notices[0].tenant_id, &notices[1].tenant_id));
        assert_eq!(
            (&*notices[2].tenant_id, &*notices[2].session_id),
            ("t", "s2")
        );
        assert_eq!(notices[1].last_seq, 2);
    }

    fn notice(session: &str, seq: u64) -> Notice {
        Notice {
            tenant_id: "t".into(),
            session_id: session.into(),
            first_seq: seq,
            last_seq: seq,
        }
    }

    #[tokio::test]
    async fn a_session_is_in_the_table_while_one_of_its_watches_lives() {
        let notices = Arc::new(Notices::new());
        let mut first = notices.watch("t", "s1");
        let second = notices.watch("t", "s1");
        let other = notices.watch("t", "s2");
        assert_eq!(notices.followed(), 2);
        drop(second);
        assert_eq!(notices.followed(), 2);
        // The remaining watch still hears its session.
        first.mark_seen();
        notices.announce(&notice("s1", 4));
        tokio::time::timeout(
            Duration::from_secs(5),
            first.wait(3, Duration::from_secs(60)),
        )
        .await
        .expect("the notice wakes the watch");
        drop(first);
        assert_eq!(notices.followed(), 1);
        drop(other);
        assert_eq!(notices.followed(), 0);
        // Followed again: a new entry, taken away again.
        let again = notices.watch("t", "s1");
        assert_eq!(notices.followed(), 1);
        drop(again);
        assert_eq!(notices.followed(), 0);
    }

    #[test]
    fn an_entry_left_by_a_drop_during_a_notice_goes_with_the_next_new_session() {
        let notices = Arc::new(Notices::new());
        let watch = notices.watch("t", "s1");
        // A notice being sent holds the sender while the last watch goes.
        let held = notices
            .table()
            .get("t")
            .and_then(|tenant| tenant.get("s1"))
            .and_then(Weak::upgrade);
        drop(watch);
        assert_eq!(notices.followed(), 1);
        drop(held);
        let _next = notices.watch("t", "s2");
        assert_eq!(notices.followed(), 1);
    }
}
