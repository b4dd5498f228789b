//! Behaviour of both journals, through the `EventStore` port.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

use chrono::{DateTime, TimeZone, Utc};
use loom_core::{
    event::{Envelope, Event, EventReadError, Payload, RunClaimed},
    ports::{EventStore, StoreError},
};
use loom_journal::{JsonlStore, MemoryStore};
use tempfile::TempDir;

// ---------------------------------------------------------------------------------------------
// Fixtures

/// Strictly increasing timestamps, so that the last event of a journal is also its newest.
static CLOCK: AtomicI64 = AtomicI64::new(0);

fn now() -> DateTime<Utc> {
    let tick = CLOCK.fetch_add(1, Ordering::Relaxed);
    Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap() + chrono::Duration::milliseconds(tick)
}

/// A well-formed event of `tenant/session` (seq 0: the store assigns it).
fn event(tenant: &str, session: &str, label: &str) -> Event {
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

fn events(tenant: &str, session: &str, n: usize) -> Vec<Event> {
    (0..n)
        .map(|i| event(tenant, session, &i.to_string()))
        .collect()
}

fn seqs(events: &[Event]) -> Vec<u64> {
    events.iter().map(|e| e.seq).collect()
}

/// One kind of storage, handing out independent handles to it.
enum Harness {
    Memory(Arc<MemoryStore>),
    Jsonl(TempDir),
}

impl Harness {
    fn memory() -> Harness {
        Harness::Memory(Arc::new(MemoryStore::default()))
    }

    fn jsonl() -> Harness {
        Harness::Jsonl(tempfile::tempdir().unwrap())
    }

    /// A handle on the storage: the same store for memory, a fresh `JsonlStore` on the same
    /// root for JSONL (as another process would have).
    fn store(&self) -> Arc<dyn EventStore> {
        match self {
            Harness::Memory(store) => store.clone(),
            Harness::Jsonl(dir) => Arc::new(JsonlStore::new(dir.path())),
        }
    }

    /// The journal file's bytes (JSONL only).
    fn raw(&self, tenant: &str, session: &str) -> Option<Vec<u8>> {
        match self {
            Harness::Memory(_) => None,
            Harness::Jsonl(dir) => std::fs::read(journal_path(dir.path(), tenant, session)).ok(),
        }
    }
}

fn journal_path(root: &Path, tenant: &str, session: &str) -> PathBuf {
    root.join(tenant).join(format!("{session}.jsonl"))
}

/// Runs a scenario against both stores: `name::memory` and `name::jsonl`.
macro_rules! both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn memory() {
                super::$name(&super::Harness::memory()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn jsonl() {
                super::$name(&super::Harness::jsonl()).await;
            }
        }
    )*};
}

both!(
    seq_starts_at_one_and_is_contiguous,
    stale_expected_seq_conflicts_and_writes_nothing,
    racing_appenders_never_leave_gaps_or_duplicates,
    batch_mixing_journals_is_refused,
    ill_formed_events_are_refused,
    read_after_seq,
    sessions_most_recent_first,
    unsafe_ids_are_refused,
    empty_batch_is_a_no_op,
);

// ---------------------------------------------------------------------------------------------
// Both stores

async fn seq_starts_at_one_and_is_contiguous(h: &Harness) {
    let store = h.store();
    assert_eq!(store.last_seq("t", "s").await.unwrap(), 0);
    assert!(store.read("t", "s", 0).await.unwrap().is_empty());

    let first = store.append(events("t", "s", 3), 0).await.unwrap();
    assert_eq!(seqs(&first), [1, 2, 3]);
    let second = store.append(events("t", "s", 2), 3).await.unwrap();
    assert_eq!(seqs(&second), [4, 5]);
    let third = h.store().append(events("t", "s", 1), 5).await.unwrap();
    assert_eq!(seqs(&third), [6]);

    let all = store.read("t", "s", 0).await.unwrap();
    assert_eq!(seqs(&all), [1, 2, 3, 4, 5, 6]);
    let written: Vec<Event> = first.into_iter().chain(second).chain(third).collect();
    assert_eq!(all, written);
    assert_eq!(store.last_seq("t", "s").await.unwrap(), 6);
    // Another journal starts its own sequence.
    let other = store.append(events("t", "other", 1), 0).await.unwrap();
    assert_eq!(seqs(&other), [1]);
}

async fn stale_expected_seq_conflicts_and_writes_nothing(h: &Harness) {
    let store = h.store();
    store.append(events("t", "s", 2), 0).await.unwrap();
    let before = h.raw("t", "s");

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
    assert_eq!(seqs(&store.read("t", "s", 0).await.unwrap()), [1, 2]);
    assert_eq!(h.raw("t", "s"), before);

    // A conflict on a journal that does not exist yet leaves no session behind.
    assert!(matches!(
        store.append(events("t", "new", 1), 3).await,
        Err(StoreError::Conflict { found: 0, .. })
    ));
    assert_eq!(store.last_seq("t", "new").await.unwrap(), 0);
    let listed: Vec<String> = store
        .sessions("t")
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.session_id)
        .collect();
    assert_eq!(listed, ["s"]);
}

async fn racing_appenders_never_leave_gaps_or_duplicates(h: &Harness) {
    const WRITERS: usize = 8;
    const EACH: usize = 20;
    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let store = h.store();
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
    let all = h.store().read("t", "race", 0).await.unwrap();
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
        h.store().last_seq("t", "race").await.unwrap(),
        (WRITERS * EACH) as u64
    );
}

fn assert_invalid<T: std::fmt::Debug>(result: Result<T, StoreError>, needle: &str) {
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

async fn batch_mixing_journals_is_refused(h: &Harness) {
    let store = h.store();
    let mixed_sessions = vec![event("t", "a", "1"), event("t", "b", "2")];
    assert_invalid(store.append(mixed_sessions, 0).await, "t/b");
    let mixed_tenants = vec![event("t", "a", "1"), event("u", "a", "2")];
    assert_invalid(store.append(mixed_tenants, 0).await, "u/a");
    for (tenant, session) in [("t", "a"), ("t", "b"), ("u", "a")] {
        assert_eq!(store.last_seq(tenant, session).await.unwrap(), 0);
        assert_eq!(h.raw(tenant, session), None);
    }
    assert!(store.sessions("t").await.unwrap().is_empty());
}

async fn ill_formed_events_are_refused(h: &Harness) {
    let store = h.store();
    let mut bad = event("t", "s", "bad");
    bad.status = loom_core::EventStatus::Error;
    let id = bad.event_id.clone();
    assert_invalid(store.append(vec![event("t", "s", "ok"), bad], 0).await, &id);
    assert_eq!(store.last_seq("t", "s").await.unwrap(), 0);
}

async fn read_after_seq(h: &Harness) {
    let store = h.store();
    let written = store.append(events("t", "s", 5), 0).await.unwrap();
    assert_eq!(store.read("t", "s", 0).await.unwrap(), written);
    assert_eq!(store.read("t", "s", 3).await.unwrap(), written[3..]);
    assert_eq!(seqs(&store.read("t", "s", 4).await.unwrap()), [5]);
    assert!(store.read("t", "s", 5).await.unwrap().is_empty());
    assert!(store.read("t", "s", 500).await.unwrap().is_empty());
    assert!(store.read("t", "nobody", 0).await.unwrap().is_empty());
}

async fn sessions_most_recent_first(h: &Harness) {
    let store = h.store();
    assert!(store.sessions("t").await.unwrap().is_empty());
    let mut last_ts = std::collections::HashMap::new();
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

    let sessions = h.store().sessions("t").await.unwrap();
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

async fn unsafe_ids_are_refused(h: &Harness) {
    let store = h.store();
    for bad in ["../escape", "a/b", ".hidden", ""] {
        assert_invalid(store.append(vec![event(bad, "s", "1")], 0).await, bad);
        assert_invalid(store.append(vec![event("t", bad, "1")], 0).await, bad);
        assert_invalid(store.read(bad, "s", 0).await, bad);
        assert_invalid(store.read("t", bad, 0).await, bad);
        assert_invalid(store.last_seq(bad, "s").await, bad);
        assert_invalid(store.last_seq("t", bad).await, bad);
        assert_invalid(store.sessions(bad).await, bad);
    }
    if let Harness::Jsonl(dir) = h {
        // Nothing escaped the root, nothing was created in it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}

async fn empty_batch_is_a_no_op(h: &Harness) {
    let store = h.store();
    assert!(store.append(Vec::new(), 0).await.unwrap().is_empty());
    assert!(store.append(Vec::new(), 9).await.unwrap().is_empty());
    assert!(store.sessions("t").await.unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------------
// JSONL only

fn lines_of(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| format!("{}\n", e.to_json()))
        .collect()
}

fn append_raw(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(bytes).unwrap();
}

#[tokio::test]
async fn jsonl_file_is_one_compact_line_per_event() {
    let dir = tempfile::tempdir().unwrap();
    // The root does not exist yet: it is created with the tenant directory.
    let root = dir.path().join("nested").join("root");
    let store = JsonlStore::new(&root);
    assert_eq!(store.root(), root);
    let mut written = store.append(events("t", "s", 3), 0).await.unwrap();
    written.extend(store.append(events("t", "s", 2), 3).await.unwrap());
    let bytes = std::fs::read_to_string(journal_path(&root, "t", "s")).unwrap();
    assert_eq!(bytes, lines_of(&written));
}

#[tokio::test]
async fn jsonl_torn_last_line_is_ignored_then_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let path = journal_path(dir.path(), "t", "s");
    let mut written = store.append(events("t", "s", 3), 0).await.unwrap();
    let torn = &event("t", "s", "torn").to_json()[..50];
    append_raw(&path, torn.as_bytes());

    // Read: ignored.
    assert_eq!(store.read("t", "s", 0).await.unwrap(), written);
    assert_eq!(store.last_seq("t", "s").await.unwrap(), 3);
    assert_eq!(store.sessions("t").await.unwrap()[0].last_seq, 3);
    // A conflicting append repairs nothing and writes nothing.
    assert!(matches!(
        store.append(events("t", "s", 1), 2).await,
        Err(StoreError::Conflict { found: 3, .. })
    ));
    assert!(!path.with_extension("jsonl.corrupt").exists());

    // Next append: moved aside, seq follows the last complete line.
    let next = store.append(events("t", "s", 2), 3).await.unwrap();
    assert_eq!(seqs(&next), [4, 5]);
    written.extend(next);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), lines_of(&written));
    let aside = path.with_extension("jsonl.corrupt");
    assert_eq!(
        std::fs::read_to_string(&aside).unwrap(),
        format!("{torn}\n")
    );
    assert_eq!(store.read("t", "s", 0).await.unwrap(), written);

    // A second torn tail is appended to the same file.
    append_raw(&path, b"{\"event_id\":");
    store.append(events("t", "s", 1), 5).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(&aside).unwrap(),
        format!("{torn}\n{{\"event_id\":\n")
    );
    assert_eq!(store.last_seq("t", "s").await.unwrap(), 6);
}

#[tokio::test]
async fn jsonl_journal_holding_only_a_torn_line_restarts_at_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let path = journal_path(dir.path(), "t", "s");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, b"{\"event_id\":\"01a2").unwrap();
    assert!(store.read("t", "s", 0).await.unwrap().is_empty());
    assert_eq!(store.last_seq("t", "s").await.unwrap(), 0);
    let written = store.append(events("t", "s", 1), 0).await.unwrap();
    assert_eq!(seqs(&written), [1]);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), lines_of(&written));
}

fn assert_corrupted<T: std::fmt::Debug>(
    result: Result<T, StoreError>,
    path: &Path,
    line: usize,
) -> EventReadError {
    match result {
        Err(StoreError::Corrupted {
            path: p,
            line: l,
            source,
        }) => {
            assert_eq!(p, path.display().to_string());
            assert_eq!(l, line);
            source
        }
        other => panic!("expected corruption at line {line}, got {other:?}"),
    }
}

/// Rewrites line `n` (from 1) of a journal.
fn rewrite_line(path: &Path, n: usize, edit: impl Fn(&str) -> String) {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, line)| {
            if i + 1 == n {
                edit(line)
            } else {
                line.to_owned()
            }
        })
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

#[tokio::test]
async fn jsonl_corrupted_complete_line_is_reported_with_its_number() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let path = journal_path(dir.path(), "t", "bad");
    store.append(events("t", "bad", 4), 0).await.unwrap();
    let healthy = store.append(events("t", "good", 2), 0).await.unwrap();

    // Unparseable line in the middle: read fails, naming line 2.
    rewrite_line(&path, 2, |_| "not json".into());
    let source = assert_corrupted(store.read("t", "bad", 0).await, &path, 2);
    assert!(matches!(source, EventReadError::Json(_)));
    // The tail is intact: appends still find the last seq cheaply.
    assert_eq!(store.last_seq("t", "bad").await.unwrap(), 4);

    // Envelope contradicting its payload on the last line: every operation reports it.
    rewrite_line(&path, 2, |_| event("t", "bad", "x").to_json());
    rewrite_line(&path, 4, |line| {
        line.replace(r#""status":"ok""#, r#""status":"error""#)
    });
    let before = std::fs::read(&path).unwrap();
    let source = assert_corrupted(store.read("t", "bad", 0).await, &path, 2);
    assert!(matches!(source, EventReadError::Invalid { .. }), "{source}");
    let source = assert_corrupted(store.last_seq("t", "bad").await, &path, 4);
    assert!(matches!(
        source,
        EventReadError::Inconsistent {
            field: "status",
            ..
        }
    ));
    assert_corrupted(store.append(events("t", "bad", 1), 4).await, &path, 4);
    assert_eq!(std::fs::read(&path).unwrap(), before, "nothing written");

    // The other session of the tenant is unaffected.
    assert_eq!(store.read("t", "good", 0).await.unwrap(), healthy);
    let more = store.append(events("t", "good", 1), 2).await.unwrap();
    assert_eq!(seqs(&more), [3]);
    let listed: Vec<String> = store
        .sessions("t")
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.session_id)
        .collect();
    assert_eq!(listed, ["good"]);
}

#[tokio::test]
async fn jsonl_lines_of_another_journal_or_out_of_order_are_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let path = journal_path(dir.path(), "t", "s");
    store.append(events("t", "s", 3), 0).await.unwrap();
    let foreign = store.append(events("t", "x", 1), 0).await.unwrap();
    rewrite_line(&path, 3, |_| foreign[0].to_json());
    assert_corrupted(store.read("t", "s", 0).await, &path, 3);

    let mut dup = store.read("t", "x", 0).await.unwrap().remove(0);
    dup.tenant_id = "t".into();
    dup.session_id = "s".into();
    dup.seq = 1;
    rewrite_line(&path, 3, |_| dup.to_json());
    let source = assert_corrupted(store.read("t", "s", 0).await, &path, 3);
    assert!(
        source.to_string().contains("seq 1 where 3 was expected"),
        "{source}"
    );
}

fn reference_journal() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference/journals/plain-run.jsonl")
}

#[tokio::test]
async fn jsonl_reads_the_reference_journal() {
    let dir = tempfile::tempdir().unwrap();
    let path = journal_path(dir.path(), "default", "plain-run-1");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let original = std::fs::read_to_string(reference_journal()).unwrap();
    std::fs::write(&path, &original).unwrap();
    let store = JsonlStore::new(dir.path());

    let events = store.read("default", "plain-run-1", 0).await.unwrap();
    assert_eq!(events.len(), 17);
    assert_eq!(seqs(&events), (1..=17).collect::<Vec<_>>());
    assert!(
        events
            .iter()
            .all(|e| e.tenant_id == "default" && e.session_id == "plain-run-1")
    );
    assert_eq!(store.last_seq("default", "plain-run-1").await.unwrap(), 17);
    let sessions = store.sessions("default").await.unwrap();
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0].session_id, "plain-run-1");
    assert_eq!(sessions[0].last_seq, 17);
    assert_eq!(sessions[0].updated_at, Some(events[16].ts));

    // Appending never rewrites the existing lines and continues the sequence.
    let next = store
        .append(vec![event("default", "plain-run-1", "after")], 17)
        .await
        .unwrap();
    assert_eq!(seqs(&next), [18]);
    let now = std::fs::read_to_string(&path).unwrap();
    assert_eq!(now, original + &lines_of(&next));
}
