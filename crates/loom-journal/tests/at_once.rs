//! What the JSONL store does at once, on the caller's thread, and what it hands to the blocking
//! pool: each case runs on a runtime whose only blocking thread is held busy, so work handed
//! to the pool stays pending until the test lets it go, and work done at once is ready at the
//! first poll.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    future::Future,
    path::Path,
    pin::Pin,
    sync::mpsc,
    task::{Context, Poll, Waker},
};

use loom_core::{
    event::Event,
    ports::{EventStore, StoreError},
};
use loom_journal::JsonlStore;
use loom_testkit::conformance::{event, events, seqs, started};
use serde_json::Map;

type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Runs `body` on a current-thread runtime with one blocking thread, held busy until `body`
/// calls the function it is given.
fn with_busy_pool(body: impl AsyncFnOnce(Box<dyn FnOnce() + Send>)) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(1)
        .build()
        .unwrap();
    runtime.block_on(async {
        let (release, held) = mpsc::channel::<()>();
        let busy = tokio::task::spawn_blocking(move || held.recv());
        body(Box::new(move || release.send(()).unwrap())).await;
        busy.await.unwrap().ok();
    });
}

/// Polls `future` once: `Some` when it was ready.
fn poll_once<T>(future: &mut Pending<'_, T>) -> Option<Result<T, StoreError>> {
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(result) => Some(result),
        Poll::Pending => None,
    }
}

/// A journal `t/s` holding a run's start and one more event, written before the pool is busy.
fn journal_of_two(root: &Path) -> Vec<Event> {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        JsonlStore::new(root)
            .append(
                vec![started("t", "s", "r", Map::new()), event("t", "s", "a")],
                0,
            )
            .await
            .unwrap()
    })
}

#[test]
fn what_cannot_wait_is_done_at_once_and_the_rest_on_the_blocking_pool() {
    let dir = tempfile::tempdir().unwrap();
    journal_of_two(dir.path());
    let store = JsonlStore::new(dir.path());
    with_busy_pool(async |release| {
        // At once: an append that needs no sync, to a journal that exists, whose lock is free.
        let mut append = store.append(events("t", "s", 2), 2);
        let appended = poll_once(&mut append).expect("done at once").unwrap();
        assert_eq!(seqs(&appended), [3, 4]);
        // At once: reads of a small journal, and of a missing one.
        let mut read = store.read("t", "s", 1);
        assert_eq!(
            seqs(&poll_once(&mut read).expect("at once").unwrap()),
            [2, 3, 4]
        );
        let mut last = store.last_seq("t", "s");
        assert_eq!(poll_once(&mut last).expect("at once").unwrap(), 4);
        let mut start = store.run_start("t", "s", "r");
        assert_eq!(poll_once(&mut start).expect("at once").unwrap(), Some(1));
        let mut kind = store.last_of_type("t", "s", "run.claimed", 5);
        let found = poll_once(&mut kind).expect("at once").unwrap();
        assert_eq!(found.map(|e| e.seq), Some(4));
        let mut missing = store.read("t", "none", 0);
        assert!(
            poll_once(&mut missing)
                .expect("at once")
                .unwrap()
                .is_empty()
        );
        let mut missing_seq = store.last_seq("t", "none");
        assert_eq!(poll_once(&mut missing_seq).expect("at once").unwrap(), 0);

        // On the pool: an append that must be synced, and the first append of a journal (its
        // directory entry is synced).
        let mut synced: Pending<'_, Vec<Event>> =
            store.append(vec![started("t", "s", "r2", Map::new())], 4);
        assert!(poll_once(&mut synced).is_none(), "a synced append waits");
        let mut first = store.append(events("t", "new", 1), 0);
        assert!(poll_once(&mut first).is_none(), "a new journal waits");

        release();
        assert_eq!(seqs(&synced.await.unwrap()), [5]);
        assert_eq!(seqs(&first.await.unwrap()), [1]);
    });
}

#[test]
fn a_journal_locked_by_another_append_is_left_to_the_blocking_pool() {
    let dir = tempfile::tempdir().unwrap();
    journal_of_two(dir.path());
    let store = JsonlStore::new(dir.path());
    // Another process's append holds the file's exclusive lock.
    let path = dir.path().join("t").join("s.jsonl");
    let other = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    other.lock().unwrap();
    with_busy_pool(async |release| {
        let mut append = store.append(events("t", "s", 1), 2);
        assert!(
            poll_once(&mut append).is_none(),
            "the append waits its turn"
        );
        let mut read = store.read("t", "s", 0);
        assert!(poll_once(&mut read).is_none(), "the read waits its turn");
        release();
        other.unlock().unwrap();
        assert_eq!(seqs(&append.await.unwrap()), [3]);
        assert_eq!(seqs(&read.await.unwrap()).len(), 3);
    });
}

#[test]
fn a_long_journal_or_a_torn_one_is_left_to_the_blocking_pool() {
    let dir = tempfile::tempdir().unwrap();
    journal_of_two(dir.path());
    let path = dir.path().join("t").join("s.jsonl");
    // A torn last line: set aside (and synced) by the next append, on the pool.
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(&mut file, b"{\"torn").unwrap();
    let store = JsonlStore::new(dir.path());
    with_busy_pool(async |release| {
        let mut append = store.append(events("t", "s", 1), 2);
        assert!(poll_once(&mut append).is_none(), "a torn journal waits");
        release();
        assert_eq!(seqs(&append.await.unwrap()), [3]);
    });
    assert!(path.with_extension("jsonl.corrupt").exists());

    // Past 64 KiB, a read could take long: the pool reads it.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut seq = 3;
        while std::fs::metadata(&path).unwrap().len() <= 64 * 1024 {
            let batch = events("t", "s", 100);
            seq = store.append(batch, seq).await.unwrap().last().unwrap().seq;
        }
    });
    with_busy_pool(async |release| {
        let mut read = store.read("t", "s", 0);
        assert!(
            poll_once(&mut read).is_none(),
            "a long journal is read on the pool"
        );
        release();
        assert!(read.await.unwrap().len() > 100);
    });
}
