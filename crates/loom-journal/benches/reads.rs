//! Reads of a long JSONL session through its offset index: the last 20 events of a
//! 10,000-event session (`read(after_seq)`) against the whole session (`read(0)`), the last
//! `session.snapshot` (`last_of_type`), a run's start (`run_start`) and `last_seq`.
//!
//! ```text
//! cargo bench -p loom-journal --bench reads
//! ```
//!
//! The session is written once, through the store (so its index is kept by the appends), in
//! batches of 5: 10,000 events of about 870 bytes (8.3 MiB; the 10,030-event devis session of
//! issue 17 is 7.4 MiB), a `run.started` every 20 events and a `session.snapshot` every 1,000.
//! See `bench/README.md` for the numbers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::LazyLock;

use divan::{Bencher, counter::ItemsCount};
use loom_core::ports::EventStore;
use loom_journal::JsonlStore;
use loom_testkit::conformance::{event, marker, started};
use serde_json::{Map, Value};
use tempfile::TempDir;
use tokio::runtime::Runtime;

/// Events in the session.
const EVENTS: u64 = 10_000;

/// The session, written once.
struct Fixture {
    _dir: TempDir,
    store: JsonlStore,
    runtime: Runtime,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A label of 110 bytes lands in the event id, the span and the payload.
    let pad = "x".repeat(110);
    runtime.block_on(async {
        let mut last = 0;
        while last < EVENTS {
            let batch = (last + 1..=last + 5)
                .map(|seq| match seq {
                    s if s % 1000 == 0 => marker("t", "s", "snapshot", s - 1),
                    s if s % 20 == 1 => {
                        let mut metadata = Map::new();
                        metadata.insert("note".into(), Value::String(pad.repeat(2)));
                        started("t", "s", &format!("run-{s}"), metadata)
                    }
                    s => event("t", "s", &format!("{s}-{pad}")),
                })
                .collect();
            last = store.append(batch, last).await.unwrap().last().unwrap().seq;
        }
        let all = store.read("t", "s", 0).await.unwrap();
        assert_eq!(all.len() as u64, EVENTS);
    });
    let bytes = std::fs::metadata(dir.path().join("t").join("s.jsonl"))
        .unwrap()
        .len();
    eprintln!(
        "session: {EVENTS} events, {:.1} MiB",
        bytes as f64 / (1024.0 * 1024.0)
    );
    Fixture {
        _dir: dir,
        store,
        runtime,
    }
});

fn main() {
    divan::main();
}

/// The last 20 events (what a follower or a run after a snapshot reads).
#[divan::bench]
fn read_last_20(bencher: Bencher) {
    let f = &*FIXTURE;
    bencher.counter(ItemsCount::new(20usize)).bench_local(|| {
        let events = f
            .runtime
            .block_on(f.store.read("t", "s", EVENTS - 20))
            .unwrap();
        assert_eq!(events.len(), 20);
    });
}

/// The whole session (what every read cost before the index).
#[divan::bench(sample_count = 20)]
fn read_all(bencher: Bencher) {
    let f = &*FIXTURE;
    bencher.counter(ItemsCount::new(EVENTS)).bench_local(|| {
        let events = f.runtime.block_on(f.store.read("t", "s", 0)).unwrap();
        assert_eq!(events.len() as u64, EVENTS);
    });
}

/// The last `session.snapshot` (where a run's history starts).
#[divan::bench]
fn last_snapshot(bencher: Bencher) {
    let f = &*FIXTURE;
    bencher.bench_local(|| {
        let found = f
            .runtime
            .block_on(f.store.last_of_type("t", "s", "session.snapshot", u64::MAX))
            .unwrap();
        assert_eq!(found.map(|e| e.seq), Some(EVENTS));
    });
}

/// The last `run.claimed` before seq 5,000: a type the index does not mark, found backwards.
#[divan::bench]
fn last_unmarked_type(bencher: Bencher) {
    let f = &*FIXTURE;
    bencher.bench_local(|| {
        let found = f
            .runtime
            .block_on(f.store.last_of_type("t", "s", "run.claimed", 5_000))
            .unwrap();
        assert_eq!(found.map(|e| e.seq), Some(4_999));
    });
}

/// Where the last run starts (a follower's first read).
#[divan::bench]
fn run_start(bencher: Bencher) {
    let f = &*FIXTURE;
    bencher.bench_local(|| {
        let found = f
            .runtime
            .block_on(f.store.run_start("t", "s", "run-9981"))
            .unwrap();
        assert_eq!(found, Some(9_981));
    });
}

/// The last seq (what an append reads first).
#[divan::bench]
fn last_seq(bencher: Bencher) {
    let f = &*FIXTURE;
    bencher.bench_local(|| {
        let seq = f.runtime.block_on(f.store.last_seq("t", "s")).unwrap();
        assert_eq!(seq, EVENTS);
    });
}
