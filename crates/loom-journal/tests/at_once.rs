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

/// Holds the lock of the file at `path` from another thread (exclusive, or shared as a reader
/// does) until the returned sender is used or dropped, or for 10 s at most: work that wrongly
/// waits for it on the test's thread ends up done, and its test fails instead of hanging.
fn lock_elsewhere(path: &Path, exclusive: bool) -> mpsc::Sender<()> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let (locked, taken) = mpsc::channel();
    let (release, held) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        if exclusive {
            file.lock().unwrap();
        } else {
            file.lock_shared().unwrap();
        }
        locked.send(()).unwrap();
        let _ = held.recv_timeout(std::time::Duration::from_secs(10));
    });
    taken.recv().unwrap();
    release
}

#[test]
fn a_journal_locked_by_another_append_is_left_to_the_blocking_pool() {
    let dir = tempfile::tempdir().unwrap();
    journal_of_two(dir.path());
    let store = JsonlStore::new(dir.path());
    let path = dir.path().join("t").join("s.jsonl");
    // Another process's append holds the file's exclusive lock.
    let other = lock_elsewhere(&path, true);
    with_busy_pool(async |release| {
        let mut append = store.append(events("t", "s", 1), 2);
        assert!(
            poll_once(&mut append).is_none(),
            "the append waits its turn"
        );
        let mut read = store.read("t", "s", 0);
        assert!(poll_once(&mut read).is_none(), "the read waits its turn");
        release();
        other.send(()).unwrap();
        assert_eq!(seqs(&append.await.unwrap()), [3]);
        assert_eq!(read.await.unwrap().len(), 3);
    });

    // A reader's shared lock: an append waits for it, a read does not.
    let reader = lock_elsewhere(&path, false);
    with_busy_pool(async |release| {
        let mut read = store.last_seq("t", "s");
        assert_eq!(poll_once(&mut read).expect("at once").unwrap(), 3);
        let mut append = store.append(events("t", "s", 1), 3);
        assert!(
            poll_once(&mut append).is_none(),
            "the append waits for the reader"
        );
        release();
        reader.send(()).unwrap();
        assert_eq!(seqs(&append.await.unwrap()), [4]);
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

/// An append done at once reads nothing beyond the journal's tail: a long journal whose offset
/// index is missing gets it back from its next reader, not from the append.
#[test]
fn an_append_at_once_leaves_a_missing_index_to_the_next_reader() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t").join("s.jsonl");
    let index = dir.path().join("t").join("s.jsonl.idx");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut seq = 0;
    runtime.block_on(async {
        let store = JsonlStore::new(dir.path());
        while std::fs::metadata(&path).map_or(0, |m| m.len()) <= 32 * 1024 {
            seq = store
                .append(events("t", "s", 50), seq)
                .await
                .unwrap()
                .last()
                .unwrap()
                .seq;
        }
    });
    assert!(index.exists(), "a journal past 16 KiB has its index");
    std::fs::remove_file(&index).unwrap();
    // Another process, nothing kept: the append is done at once and writes no index.
    let store = JsonlStore::new(dir.path());
    with_busy_pool(async |release| {
        let mut append = store.append(events("t", "s", 1), seq);
        assert_eq!(
            seqs(&poll_once(&mut append).expect("done at once").unwrap()),
            [seq + 1]
        );
        release();
    });
    assert!(!index.exists(), "the append rebuilt the index");
    runtime.block_on(async {
        let all = store.read("t", "s", 0).await.unwrap();
        assert_eq!(all.len() as u64, seq + 1);
        assert_eq!(
            seqs(&store.read("t", "s", seq - 1).await.unwrap()),
            [seq, seq + 1]
        );
    });
    assert!(index.exists(), "the reader rebuilt the index");
}
