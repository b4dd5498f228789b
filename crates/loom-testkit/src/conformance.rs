//! The journal conformance suite: scenarios every [`EventStore`] must pass, whatever keeps the
//! events (memory, JSONL files, SQLite, …).
//!
//! Each scenario is a `pub async fn` taking an [`Open`] factory: every call must return a
//! handle on the *same* storage — the same store for an in-process one, a freshly opened store
//! on the same directory or file for a durable one, as another process would have. A scenario
//! panics (through `assert!`) when the store misbehaves.
//!
//! [`store_conformance!`](crate::store_conformance) turns the whole suite into `#[tokio::test]`
//! functions for one kind of store:
//!
//! ```ignore
//! loom_testkit::store_conformance!(memory, {
//!     let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
//!     ((), move || store.clone())
//! });
//! ```
//!
//! Scenarios use fixed, strictly increasing timestamps ([`event`]), so the last event of a
//! journal is also its newest.

// The scenarios are assertions: a failure must panic with the store's error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

use chrono::{DateTime, TimeZone, Utc};
use loom_core::{
    EventStatus,
    event::{
        Envelope, Event, Payload, RunClaimed, RunContext, RunStarted, SessionCompacted,
        SessionSnapshot,
    },
    ports::{EventStore, StoreError},
};
use serde_json::{Map, Value, json};

/// A factory handing out handles on one storage (see the module documentation).
pub type Open<'a> = &'a dyn Fn() -> Arc<dyn EventStore>;

/// Runs every scenario of the suite as a `#[tokio::test]` in a module `$name`.
///
/// `$setup` is evaluated once per test, inside the module (which sees the caller's imports
/// through `use super::*`), and must give `(guard, open)`: `guard` is kept alive for the test
/// (a temporary directory, say) and `open` is a closure `Fn() -> Arc<dyn EventStore>` handing
/// out handles on the same storage. The calling crate needs `tokio` with its `macros` and
/// `rt-multi-thread` features.
#[macro_export]
macro_rules! store_conformance {
    ($name:ident, $setup:expr) => {
        $crate::store_conformance!(@tests $name, $setup;
            seq_starts_at_one_and_is_contiguous,
            stale_expected_seq_conflicts_and_writes_nothing,
            racing_appenders_never_leave_gaps_or_duplicates,
            batch_mixing_journals_is_refused,
            ill_formed_events_are_refused,
            read_after_seq,
            sessions_most_recent_first,
            unsafe_ids_are_refused,
            empty_batch_is_a_no_op,
            delete_erases_one_session,
            unreadable_events_are_refused,
            runs_are_found_by_id,
            a_run_start_is_unknown_or_its_first_seq,
            the_last_event_of_a_type_before_a_seq,
        );
    };
    (@tests $name:ident, $setup:expr; $($scenario:ident),* $(,)?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    let (_guard, open) = $setup;
                    $crate::conformance::$scenario(&open).await;
                }
            )*
        }
    };
}

// ---------------------------------------------------------------------------------------------
// Fixtures

/// Strictly increasing timestamps, so that the last event of a journal is also its newest.
static CLOCK: AtomicI64 = AtomicI64::new(0);

fn now() -> DateTime<Utc> {
    let tick = CLOCK.fetch_add(1, Ordering::Relaxed);
    Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap() + chrono::Duration::milliseconds(tick)
}

/// A well-formed event of `tenant/session` (seq 0: the store assigns it); `label` ends up in
/// its event id and in its payload's worker id (`worker-<label>`).
pub fn event(tenant: &str, session: &str, label: &str) -> Event {
    let ts = now();
    let envelope = Envelope {
        event_id: format!("ev-{session}-{label}-{}", ts.timestamp_micros()),
        ts,
        tenant_id: tenant.into(),
        session_id: session.into(),
        run_id: session.into(),
        root_run_id: session.into(),
        span_id: format!("span-{label}"),
        parent_span_id: None,
        agent: Some("demo".into()),
        role: None,
    };
    let payload = Payload::RunClaimed(RunClaimed {
        worker_id: format!("worker-{label}"),
        lease_until: ts + chrono::Duration::seconds(30),
    });
    Event::new(envelope, payload)
}

/// The `run.started` of `run` in `tenant/session`, its context carrying `metadata`.
pub fn started(tenant: &str, session: &str, run: &str, metadata: Map<String, Value>) -> Event {
    let ts = now();
    let envelope = Envelope {
        event_id: format!("ev-{session}-{run}-{}", ts.timestamp_micros()),
        ts,
        tenant_id: tenant.into(),
        session_id: session.into(),
        run_id: run.into(),
        root_run_id: run.into(),
        span_id: format!("span-{run}"),
        parent_span_id: None,
        agent: Some("demo".into()),
        role: None,
    };
    let payload = Payload::RunStarted(RunStarted {
        kind: "normal".into(),
        context: RunContext {
            tenant_id: tenant.into(),
            user_id: None,
            metadata,
        },
        parent_run_id: None,
        parent_call_id: None,
        depth: 0,
        triggered_by: None,
        trigger: None,
        judges: "auto".into(),
        budget: None,
        state: Map::new(),
    });
    Event::new(envelope, payload)
}

/// A `session.snapshot` (`kind` "snapshot") or `session.compacted` (any other `kind`) of
/// `tenant/session` accounting for the events up to `up_to_seq`.
pub fn marker(tenant: &str, session: &str, kind: &str, up_to_seq: u64) -> Event {
    let mut event = event(tenant, session, &format!("{kind}-{up_to_seq}"));
    event.payload = if kind == "snapshot" {
        Payload::SessionSnapshot(SessionSnapshot {
            up_to_seq,
            messages: Vec::new(),
            tokens: 0,
            spent: Default::default(),
            models: Default::default(),
            state: None,
            turns: Vec::new(),
        })
    } else {
        Payload::SessionCompacted(SessionCompacted {
            up_to_seq,
            summary: format!("up to {up_to_seq}"),
            kept: 1,
            tokens_before: 100,
            tokens_after: 10,
            cost_usd: 0.0,
            fidelity: "ok".into(),
            run_id: None,
            missing: Vec::new(),
        })
    };
    Event::new(
        Envelope {
            event_id: event.event_id.clone(),
            ts: event.ts,
            tenant_id: event.tenant_id.clone(),
            session_id: event.session_id.clone(),
            run_id: event.run_id.clone(),
            root_run_id: event.root_run_id.clone(),
            span_id: event.span_id.clone(),
            parent_span_id: None,
            agent: event.agent.clone(),
            role: None,
        },
        event.payload,
    )
}

/// An object nested `levels` deep (itself the first level).
pub fn nested(levels: usize) -> Map<String, Value> {
    let inner = (1..levels).fold(json!(1), |inner, _| json!({ "a": inner }));
    let mut object = Map::new();
    object.insert("a".into(), inner);
    object
}

/// `n` well-formed events of `tenant/session`, labelled `0`, `1`, …
pub fn events(tenant: &str, session: &str, n: usize) -> Vec<Event> {
    (0..n)
        .map(|i| event(tenant, session, &i.to_string()))
        .collect()
}

/// The seqs of `events`.
pub fn seqs(events: &[Event]) -> Vec<u64> {
    events.iter().map(|e| e.seq).collect()
}

/// Asserts that `result` is [`StoreError::Invalid`] with a message containing `needle`.
pub fn assert_invalid<T: std::fmt::Debug>(result: Result<T, StoreError>, needle: &str) {
    match result {
        Err(StoreError::Invalid(message)) => {
            assert!(
                message.contains(needle),
                "{message:?} should name {needle:?}"
            );
        }
        other => panic!("expected Invalid naming {needle:?}, got {other:?}"),
    }
}

async fn session_ids(store: &dyn EventStore, tenant: &str) -> Vec<String> {
    store
        .sessions(tenant)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.session_id)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Scenarios

/// Seqs start at 1 in every journal and follow each other across appends and handles; what is
/// read back equals what `append` returned.
pub async fn seq_starts_at_one_and_is_contiguous(open: Open<'_>) {
    let store = open();
    assert_eq!(store.last_seq("t", "s").await.unwrap(), 0);
    assert!(store.read("t", "s", 0).await.unwrap().is_empty());

    let first = store.append(events("t", "s", 3), 0).await.unwrap();
    assert_eq!(seqs(&first), [1, 2, 3]);
    let second = store.append(events("t", "s", 2), 3).await.unwrap();
    assert_eq!(seqs(&second), [4, 5]);
    let third = open().append(events("t", "s", 1), 5).await.unwrap();
    assert_eq!(seqs(&third), [6]);

    let all = store.read("t", "s", 0).await.unwrap();
    assert_eq!(seqs(&all), [1, 2, 3, 4, 5, 6]);
    let written: Vec<Event> = first.into_iter().chain(second).chain(third).collect();
    assert_eq!(all, written);
    assert_eq!(open().read("t", "s", 0).await.unwrap(), written);
    assert_eq!(store.last_seq("t", "s").await.unwrap(), 6);
    // Another journal starts its own sequence.
    let other = store.append(events("t", "other", 1), 0).await.unwrap();
    assert_eq!(seqs(&other), [1]);
}

/// An append with a stale `expected_last_seq` gets a conflict naming the journal and both seqs,
/// and writes nothing — not even an empty journal.
pub async fn stale_expected_seq_conflicts_and_writes_nothing(open: Open<'_>) {
    let store = open();
    store.append(events("t", "s", 2), 0).await.unwrap();
    let before = store.read("t", "s", 0).await.unwrap();

    for stale in [0, 1, 3, 7] {
        match store.append(events("t", "s", 2), stale).await {
            Err(StoreError::Conflict {
                tenant_id,
                session_id,
                expected,
                found,
            }) => {
                assert_eq!((tenant_id.as_str(), session_id.as_str()), ("t", "s"));
                assert_eq!((expected, found), (stale, 2));
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
    }
    assert_eq!(store.last_seq("t", "s").await.unwrap(), 2);
    assert_eq!(open().read("t", "s", 0).await.unwrap(), before);

    // A conflict on a journal that does not exist yet leaves no session behind.
    assert!(matches!(
        store.append(events("t", "new", 1), 3).await,
        Err(StoreError::Conflict { found: 0, .. })
    ));
    assert_eq!(store.last_seq("t", "new").await.unwrap(), 0);
    assert_eq!(session_ids(store.as_ref(), "t").await, ["s"]);
}

/// Eight writers on eight handles race on one journal, retrying on conflicts: the journal ends
/// with every event exactly once, seqs 1..=n, each writer's events in its order.
pub async fn racing_appenders_never_leave_gaps_or_duplicates(open: Open<'_>) {
    const WRITERS: usize = 8;
    const EACH: usize = 20;
    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let store = open();
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0;
            for i in 0..EACH {
                let event = event("t", "race", &format!("w{writer}-{i}"));
                loop {
                    let last = store.last_seq("t", "race").await.unwrap();
                    match store.append(vec![event.clone()], last).await {
                        Ok(written) => {
                            assert_eq!(seqs(&written), [last + 1]);
                            break;
                        }
                        Err(StoreError::Conflict { .. }) => {
                            conflicts += 1;
                            tokio::task::yield_now().await;
                        }
                        Err(err) => panic!("writer {writer}: {err}"),
                    }
                }
            }
            conflicts
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let all = open().read("t", "race", 0).await.unwrap();
    assert_eq!(all.len(), WRITERS * EACH);
    assert_eq!(
        seqs(&all),
        (1..=(WRITERS * EACH) as u64).collect::<Vec<_>>()
    );
    let ids: HashSet<&str> = all.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids.len(), WRITERS * EACH, "an event was written twice");
    // Each writer's events keep their order.
    for writer in 0..WRITERS {
        let mine: Vec<String> = all
            .iter()
            .filter_map(|e| match &e.payload {
                Payload::RunClaimed(p) => p
                    .worker_id
                    .strip_prefix(&format!("worker-w{writer}-"))
                    .map(str::to_owned),
                _ => None,
            })
            .collect();
        let expected: Vec<String> = (0..EACH).map(|i| i.to_string()).collect();
        assert_eq!(mine, expected);
    }
    assert_eq!(
        open().last_seq("t", "race").await.unwrap(),
        (WRITERS * EACH) as u64
    );
}

/// A batch targets one journal: mixing sessions or tenants is refused and writes nothing.
pub async fn batch_mixing_journals_is_refused(open: Open<'_>) {
    let store = open();
    let mixed_sessions = vec![event("t", "a", "1"), event("t", "b", "2")];
    assert_invalid(store.append(mixed_sessions, 0).await, "t/b");
    let mixed_tenants = vec![event("t", "a", "1"), event("u", "a", "2")];
    assert_invalid(store.append(mixed_tenants, 0).await, "u/a");
    for (tenant, session) in [("t", "a"), ("t", "b"), ("u", "a")] {
        assert_eq!(store.last_seq(tenant, session).await.unwrap(), 0);
        assert!(store.read(tenant, session, 0).await.unwrap().is_empty());
    }
    assert!(store.sessions("t").await.unwrap().is_empty());
    assert!(store.sessions("u").await.unwrap().is_empty());
}

/// An event that could not be read back (envelope contradicting its payload) is refused, with
/// the rest of its batch.
pub async fn ill_formed_events_are_refused(open: Open<'_>) {
    let store = open();
    let mut bad = event("t", "s", "bad");
    bad.status = EventStatus::Error;
    let id = bad.event_id.clone();
    assert_invalid(store.append(vec![event("t", "s", "ok"), bad], 0).await, &id);
    assert_eq!(store.last_seq("t", "s").await.unwrap(), 0);
    assert!(store.sessions("t").await.unwrap().is_empty());
}

/// `read(after_seq)` gives the events with a greater seq, in order.
pub async fn read_after_seq(open: Open<'_>) {
    let store = open();
    let written = store.append(events("t", "s", 5), 0).await.unwrap();
    assert_eq!(store.read("t", "s", 0).await.unwrap(), written);
    assert_eq!(store.read("t", "s", 3).await.unwrap(), written[3..]);
    assert_eq!(seqs(&store.read("t", "s", 4).await.unwrap()), [5]);
    assert!(store.read("t", "s", 5).await.unwrap().is_empty());
    assert!(store.read("t", "s", 500).await.unwrap().is_empty());
    assert!(store.read("t", "s", u64::MAX).await.unwrap().is_empty());
    assert!(store.read("t", "nobody", 0).await.unwrap().is_empty());
}

/// `sessions` lists a tenant's journals, most recently appended first, with their last seq and
/// the timestamp of their last event.
pub async fn sessions_most_recent_first(open: Open<'_>) {
    let store = open();
    assert!(store.sessions("t").await.unwrap().is_empty());
    let mut last_ts = HashMap::new();
    for (session, expected, n) in [("s1", 0, 2), ("s2", 0, 1), ("s3", 0, 3), ("s1", 2, 1)] {
        let written = store
            .append(events("t", session, n), expected)
            .await
            .unwrap();
        last_ts.insert(session, written.last().unwrap().ts);
        // Let file mtimes tell the appends apart.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    store.append(events("other", "s9", 1), 0).await.unwrap();

    let sessions = open().sessions("t").await.unwrap();
    let listed: Vec<(&str, u64)> = sessions
        .iter()
        .map(|s| (s.session_id.as_str(), s.last_seq))
        .collect();
    assert_eq!(listed, [("s1", 3), ("s3", 3), ("s2", 1)]);
    for summary in &sessions {
        assert_eq!(
            summary.updated_at,
            Some(last_ts[summary.session_id.as_str()])
        );
    }
    assert!(store.sessions("nobody").await.unwrap().is_empty());
}

/// Ids that could not name a journal (path separators, leading dot, empty) are refused by every
/// operation.
pub async fn unsafe_ids_are_refused(open: Open<'_>) {
    let store = open();
    for bad in ["../escape", "a/b", ".hidden", ""] {
        assert_invalid(store.append(vec![event(bad, "s", "1")], 0).await, bad);
        assert_invalid(store.append(vec![event("t", bad, "1")], 0).await, bad);
        assert_invalid(store.read(bad, "s", 0).await, bad);
        assert_invalid(store.read("t", bad, 0).await, bad);
        assert_invalid(store.last_seq(bad, "s").await, bad);
        assert_invalid(store.last_seq("t", bad).await, bad);
        assert_invalid(store.sessions(bad).await, bad);
        assert_invalid(store.delete(bad, "s").await, bad);
        assert_invalid(store.delete("t", bad).await, bad);
    }
}

/// An empty batch writes nothing, whatever the expected seq.
pub async fn empty_batch_is_a_no_op(open: Open<'_>) {
    let store = open();
    assert!(store.append(Vec::new(), 0).await.unwrap().is_empty());
    assert!(store.append(Vec::new(), 9).await.unwrap().is_empty());
    assert!(store.sessions("t").await.unwrap().is_empty());
}

/// `delete` erases one session's journal and returns how many events it held; other sessions
/// and the same session id of another tenant are untouched; an unknown session gives 0; a
/// deleted session starts again at seq 1.
pub async fn delete_erases_one_session(open: Open<'_>) {
    let store = open();
    store.append(events("t", "gone", 2), 0).await.unwrap();
    store.append(events("t", "gone", 1), 2).await.unwrap();
    let kept = store.append(events("t", "kept", 2), 0).await.unwrap();
    let elsewhere = store.append(events("u", "gone", 1), 0).await.unwrap();

    assert_eq!(open().delete("t", "gone").await.unwrap(), 3);
    assert!(store.read("t", "gone", 0).await.unwrap().is_empty());
    assert!(open().read("t", "gone", 0).await.unwrap().is_empty());
    assert_eq!(store.last_seq("t", "gone").await.unwrap(), 0);
    assert_eq!(session_ids(store.as_ref(), "t").await, ["kept"]);
    assert_eq!(store.read("t", "kept", 0).await.unwrap(), kept);
    assert_eq!(store.read("u", "gone", 0).await.unwrap(), elsewhere);
    assert_eq!(session_ids(store.as_ref(), "u").await, ["gone"]);

    // Deleting again, or a session that never existed, erases nothing.
    assert_eq!(store.delete("t", "gone").await.unwrap(), 0);
    assert_eq!(store.delete("t", "nobody").await.unwrap(), 0);
    assert_eq!(store.delete("nobody", "gone").await.unwrap(), 0);

    // A writer that read the journal before the erasure conflicts; a new journal starts at 1.
    assert!(matches!(
        store.append(events("t", "gone", 1), 3).await,
        Err(StoreError::Conflict {
            expected: 3,
            found: 0,
            ..
        })
    ));
    let again = store.append(events("t", "gone", 2), 0).await.unwrap();
    assert_eq!(seqs(&again), [1, 2]);
    assert_eq!(open().read("t", "gone", 0).await.unwrap(), again);
}

/// An event that would not read back (metadata nested 125 levels deep: under the JSON reader's
/// recursion limit on its own, past it inside the event) is refused with its batch, naming it;
/// nothing is written, and the journal stays readable.
pub async fn unreadable_events_are_refused(open: Open<'_>) {
    let store = open();
    store
        .append(vec![started("t", "s", "r0", nested(64))], 0)
        .await
        .unwrap();
    let deep = started("t", "s", "r1", nested(125));
    let id = deep.event_id.clone();
    assert_invalid(
        store.append(vec![event("t", "s", "ok"), deep], 1).await,
        &format!("{id} (run.started) would not read back"),
    );
    assert_eq!(store.last_seq("t", "s").await.unwrap(), 1);
    assert_eq!(open().read("t", "s", 0).await.unwrap().len(), 1);
}

/// `find_run` names the session holding a run's `run.started`, across sessions and handles;
/// an unknown run, a run of another tenant and a run of an erased session are not found.
pub async fn runs_are_found_by_id(open: Open<'_>) {
    let store = open();
    assert_eq!(store.find_run("t", "r1").await.unwrap(), None);
    store
        .append(vec![started("t", "s1", "r1", Map::new())], 0)
        .await
        .unwrap();
    store
        .append(
            vec![started("t", "s2", "r2", Map::new()), event("t", "s2", "x")],
            0,
        )
        .await
        .unwrap();
    store
        .append(
            vec![event("t", "s1", "y"), started("t", "s1", "r3", Map::new())],
            1,
        )
        .await
        .unwrap();
    store
        .append(vec![started("u", "s9", "r9", Map::new())], 0)
        .await
        .unwrap();
    for (run, session) in [("r1", "s1"), ("r2", "s2"), ("r3", "s1")] {
        assert_eq!(
            open().find_run("t", run).await.unwrap().as_deref(),
            Some(session),
            "{run}"
        );
    }
    // Only run.started names a run's session: `s1` is the run id of no run.
    for unknown in ["nobody", "r9", "s1", "../x", ""] {
        assert_eq!(
            open().find_run("t", unknown).await.unwrap(),
            None,
            "{unknown}"
        );
    }
    assert_eq!(
        store.find_run("u", "r9").await.unwrap().as_deref(),
        Some("s9")
    );
    assert_invalid(store.find_run("../t", "r1").await, "../t");

    assert_eq!(open().delete("t", "s2").await.unwrap(), 2);
    assert_eq!(store.find_run("t", "r2").await.unwrap(), None);
    // The session id is used again, by another run: the new file is what counts.
    store
        .append(
            vec![event("t", "s2", "z"), started("t", "s2", "r4", Map::new())],
            0,
        )
        .await
        .unwrap();
    assert_eq!(store.find_run("t", "r2").await.unwrap(), None);
    assert_eq!(
        open().find_run("t", "r4").await.unwrap().as_deref(),
        Some("s2")
    );
}

/// [`EventStore::run_start`] is a hint: `None`, or the seq of the run's first event in that
/// session (its `run.started`), never another run's or another session's.
pub async fn a_run_start_is_unknown_or_its_first_seq(open: Open<'_>) {
    let store = open();
    store
        .append(
            vec![
                event("t", "s1", "a"),
                event("t", "s1", "b"),
                started("t", "s1", "r1", Map::new()),
            ],
            0,
        )
        .await
        .unwrap();
    store
        .append(vec![started("t", "s2", "r2", Map::new())], 0)
        .await
        .unwrap();
    let known = |seq: Option<u64>, expected: u64| seq.is_none() || seq == Some(expected);
    let r1 = open().run_start("t", "s1", "r1").await.unwrap();
    assert!(known(r1, 3), "{r1:?}");
    let r2 = open().run_start("t", "s2", "r2").await.unwrap();
    assert!(known(r2, 1), "{r2:?}");
    for (session, run) in [("s1", "r2"), ("s2", "r1"), ("s1", "nobody")] {
        assert_eq!(
            open().run_start("t", session, run).await.unwrap(),
            None,
            "{session}/{run}"
        );
    }
    assert_eq!(open().run_start("u", "s1", "r1").await.unwrap(), None);
}

/// For a store with a run index (SQLite, PostgreSQL, JSONL, memory):
/// [`EventStore::run_start`] answers the seq of the run's `run.started`, not `None`.
pub async fn run_start_is_indexed(open: Open<'_>) {
    let store = open();
    store
        .append(
            vec![event("t", "s1", "a"), started("t", "s1", "r1", Map::new())],
            0,
        )
        .await
        .unwrap();
    assert_eq!(open().run_start("t", "s1", "r1").await.unwrap(), Some(2));
    assert_eq!(open().run_start("t", "s1", "r0").await.unwrap(), None);
}

/// [`EventStore::last_of_type`]: the last event of the type before the seq given (`u64::MAX`:
/// anywhere), whole and read back, from any handle; `None` when there is none, in another
/// session or tenant, or the session does not exist.
pub async fn the_last_event_of_a_type_before_a_seq(open: Open<'_>) {
    let store = open();
    assert_eq!(
        store
            .last_of_type("t", "s", "session.snapshot", u64::MAX)
            .await
            .unwrap(),
        None
    );
    // 1 run.started, 2-3 events, 4 snapshot, 5 event, 6 compacted, 7-8 events, 9 snapshot,
    // then enough events that a store reading backwards crosses a checkpoint or two.
    let mut batch = vec![started("t", "s", "r1", Map::new())];
    batch.extend(events("t", "s", 2));
    batch.push(marker("t", "s", "snapshot", 3));
    store.append(batch, 0).await.unwrap();
    let mut batch = events("t", "s", 1);
    batch.push(marker("t", "s", "compacted", 5));
    batch.extend(events("t", "s", 2));
    store.append(batch, 4).await.unwrap();
    store
        .append(vec![marker("t", "s", "snapshot", 8)], 8)
        .await
        .unwrap();
    store.append(events("t", "s", 150), 9).await.unwrap();
    store
        .append(vec![started("t", "other", "r2", Map::new())], 0)
        .await
        .unwrap();
    let written = store.read("t", "s", 0).await.unwrap();

    let last = |kind: &'static str, before: u64| {
        let store = open();
        async move { store.last_of_type("t", "s", kind, before).await.unwrap() }
    };
    let snapshot = last("session.snapshot", u64::MAX).await.unwrap();
    assert_eq!(snapshot, written[8]);
    assert!(matches!(&snapshot.payload, Payload::SessionSnapshot(s) if s.up_to_seq == 8));
    assert_eq!(
        last("session.snapshot", 10).await.as_ref(),
        Some(&written[8])
    );
    assert_eq!(
        last("session.snapshot", 9).await.as_ref(),
        Some(&written[3])
    );
    assert_eq!(last("session.snapshot", 4).await, None);
    assert_eq!(last("session.snapshot", 0).await, None);
    assert_eq!(
        last("session.compacted", u64::MAX).await.as_ref(),
        Some(&written[5])
    );
    assert_eq!(last("session.compacted", 6).await, None);
    assert_eq!(
        last("run.started", u64::MAX).await.as_ref(),
        Some(&written[0])
    );
    // A type no index marks: found backwards, across checkpoints.
    assert_eq!(last("run.claimed", u64::MAX).await.as_ref(), written.last());
    assert_eq!(last("run.claimed", 4).await.as_ref(), Some(&written[2]));
    assert_eq!(last("run.claimed", 2).await, None);
    assert_eq!(last("session.trimmed", u64::MAX).await, None);
    // Other sessions and tenants see none of them.
    for (tenant, session) in [("t", "other"), ("t", "absent"), ("u", "s")] {
        assert_eq!(
            open()
                .last_of_type(tenant, session, "session.snapshot", u64::MAX)
                .await
                .unwrap(),
            None,
            "{tenant}/{session}"
        );
    }
    assert_invalid(
        open()
            .last_of_type("../t", "s", "session.snapshot", u64::MAX)
            .await,
        "../t",
    );
    // After more appends, the newest marker is found.
    store
        .append(vec![marker("t", "s", "snapshot", 159)], 159)
        .await
        .unwrap();
    assert_eq!(last("session.snapshot", u64::MAX).await.unwrap().seq, 160);
}
