//! The offset index of the JSONL journal (`<session>.jsonl.idx`): `read(after_seq)`,
//! `last_of_type` and `run_start` answer the same as a read of the whole file, whatever state a
//! crash or another writer left the index in (torn, behind, ahead, truncated, garbled, lying,
//! missing), and a read after a seq decodes only what it returns.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::Write,
    path::{Path, PathBuf},
    sync::Arc,
};

use loom_core::{
    event::Event,
    ports::{EventStore, StoreError},
};
use loom_journal::JsonlStore;
use loom_testkit::conformance::{event, events, marker, seqs, started};
use serde_json::Map;

fn journal(root: &Path) -> PathBuf {
    root.join("t").join("s.jsonl")
}

fn index(root: &Path) -> PathBuf {
    root.join("t").join("s.jsonl.idx")
}

fn append_raw(path: &Path, bytes: &[u8]) {
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(bytes).unwrap();
}

/// A session of `n` events: runs started at 1 and 120, snapshots at 50 and 200 (when `n`
/// reaches them), a compaction at 130; the others `run.claimed`.
async fn session(store: &JsonlStore, n: u64) -> Vec<Event> {
    let mut last = 0;
    while last < n {
        let seq = last + 1;
        let next = match seq {
            1 => started("t", "s", "r1", Map::new()),
            120 => started("t", "s", "r2", Map::new()),
            50 | 200 => marker("t", "s", "snapshot", seq - 1),
            130 => marker("t", "s", "compacted", seq - 1),
            _ => event("t", "s", &seq.to_string()),
        };
        // Batches of one to three events.
        let mut batch = vec![next];
        if seq % 3 == 0
            && seq + 1 < n
            && ![49, 50, 119, 120, 129, 130, 199, 200].contains(&(seq + 1))
        {
            batch.push(event("t", "s", &format!("{seq}b")));
        }
        last = store.append(batch, last).await.unwrap().last().unwrap().seq;
    }
    store.read("t", "s", 0).await.unwrap()
}

/// Every read the index answers agrees with the whole file, from a fresh handle.
async fn agrees(root: &Path, all: &[Event], context: &str) {
    agrees_through(&JsonlStore::new(root), all, context).await;
}

/// Every read `store` answers through its index agrees with the whole file.
async fn agrees_through(store: &JsonlStore, all: &[Event], context: &str) {
    let last = all.len() as u64;
    for after in [
        0,
        1,
        2,
        49,
        50,
        63,
        64,
        65,
        100,
        128,
        129,
        last.saturating_sub(1),
        last,
        last + 5,
    ] {
        let read = store.read("t", "s", after).await.unwrap();
        let expected: Vec<Event> = all.iter().filter(|e| e.seq > after).cloned().collect();
        assert_eq!(
            seqs(&read),
            seqs(&expected),
            "{context}: read after {after}"
        );
        assert_eq!(read, expected, "{context}: read after {after}");
    }
    for kind in [
        "session.snapshot",
        "session.compacted",
        "run.started",
        "run.claimed",
    ] {
        for before in [u64::MAX, 201, 200, 131, 130, 51, 50, 2, 1] {
            let found = store.last_of_type("t", "s", kind, before).await.unwrap();
            let expected = all
                .iter()
                .rev()
                .find(|e| e.seq < before && e.event_type == kind);
            assert_eq!(
                found.as_ref(),
                expected,
                "{context}: last {kind} before {before}"
            );
        }
    }
    for run in ["r1", "r2", "r3"] {
        let start = store.run_start("t", "s", run).await.unwrap();
        let expected = all
            .iter()
            .find(|e| e.run_id == run && e.event_type == "run.started")
            .map(|e| e.seq);
        assert_eq!(start, expected, "{context}: run_start {run}");
    }
}

#[tokio::test]
async fn the_index_is_kept_by_appends_and_agrees_with_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let all = session(&store, 260).await;
    assert!(index(dir.path()).exists());
    agrees(dir.path(), &all, "kept by appends").await;
    // Erasing the session erases its index.
    assert_eq!(store.delete("t", "s").await.unwrap(), 260);
    assert!(!index(dir.path()).exists());
}

/// A read after a seq skips the lines before it unread: a line there that does not read back
/// fails a read of the whole session, not a read after it.
#[tokio::test]
async fn a_read_after_a_seq_decodes_only_what_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let all = session(&store, 150).await;
    // Line 70 made unreadable, its length kept (the index still holds).
    let text = std::fs::read_to_string(journal(dir.path())).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines[69] = lines[69].replacen('{', "x", 1);
    std::fs::write(journal(dir.path()), lines.join("\n") + "\n").unwrap();
    assert!(matches!(
        store.read("t", "s", 0).await,
        Err(StoreError::Corrupted { line: 70, .. })
    ));
    assert!(matches!(
        store.read("t", "s", 60).await,
        Err(StoreError::Corrupted { line: 70, .. })
    ));
    assert_eq!(store.read("t", "s", 70).await.unwrap(), all[70..]);
    assert_eq!(store.read("t", "s", 140).await.unwrap(), all[140..]);
    let compacted = store
        .last_of_type("t", "s", "session.compacted", u64::MAX)
        .await
        .unwrap();
    assert_eq!(compacted.as_ref(), Some(&all[129]));
    let claimed = store
        .last_of_type("t", "s", "run.claimed", 75)
        .await
        .unwrap();
    assert_eq!(claimed.as_ref(), Some(&all[73]));
}

#[tokio::test]
async fn a_torn_last_line_of_the_journal_is_not_indexed() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let mut all = session(&store, 140).await;
    // A crash mid-append: part of line 141 (a snapshot).
    let torn = marker("t", "s", "snapshot", 140);
    let mut line = torn.to_json();
    line.truncate(line.len() / 2);
    append_raw(&journal(dir.path()), line.as_bytes());
    agrees(dir.path(), &all, "torn journal").await;
    // The next append moves the torn bytes aside and continues after line 140.
    let written = store.append(events("t", "s", 2), 140).await.unwrap();
    assert_eq!(seqs(&written), [141, 142]);
    all = store.read("t", "s", 0).await.unwrap();
    agrees(dir.path(), &all, "after the torn line").await;
}

#[tokio::test]
async fn an_index_behind_the_file_is_caught_up() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    session(&store, 100).await;
    // Another writer, which keeps no index (or a crash between the journal's write and the
    // index's): 110 lines more, a snapshot and a run among them.
    let mut lines = String::new();
    for seq in 101..=210u64 {
        let mut next = match seq {
            120 => started("t", "s", "r2", Map::new()),
            130 => marker("t", "s", "compacted", 129),
            200 => marker("t", "s", "snapshot", 199),
            _ => event("t", "s", &format!("other-{seq}")),
        };
        next.seq = seq;
        lines.push_str(&next.to_json());
        lines.push('\n');
    }
    append_raw(&journal(dir.path()), lines.as_bytes());
    let all = store.read("t", "s", 0).await.unwrap();
    assert_eq!(all.len(), 210);
    agrees(dir.path(), &all, "index behind").await;
    let written = store.append(events("t", "s", 1), 210).await.unwrap();
    assert_eq!(seqs(&written), [211]);
    let all = store.read("t", "s", 0).await.unwrap();
    agrees(dir.path(), &all, "index behind, then appended").await;
}

#[tokio::test]
async fn an_index_ahead_of_the_file_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let all = session(&store, 230).await;
    // The file loses its last 100 lines in place (same file): the index names lines, a
    // snapshot and a run that are no longer there.
    let text = std::fs::read_to_string(journal(dir.path())).unwrap();
    let keep: usize = text.lines().take(130).map(|l| l.len() + 1).sum();
    std::fs::OpenOptions::new()
        .write(true)
        .open(journal(dir.path()))
        .unwrap()
        .set_len(keep as u64)
        .unwrap();
    agrees(dir.path(), &all[..130], "index ahead").await;
    let written = store.append(events("t", "s", 1), 130).await.unwrap();
    assert_eq!(seqs(&written), [131]);
    let all = store.read("t", "s", 0).await.unwrap();
    agrees(dir.path(), &all, "index ahead, then appended").await;
}

#[tokio::test]
async fn a_truncated_garbled_lying_or_missing_index_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let all = session(&store, 230).await;
    let original = std::fs::read_to_string(index(dir.path())).unwrap();

    // Truncated mid-entry (a crash while it was written).
    for cut in [
        original.len() / 3,
        original.len() / 2 + 3,
        original.len() - 2,
        10,
        0,
    ] {
        std::fs::write(index(dir.path()), &original[..cut]).unwrap();
        agrees(dir.path(), &all, &format!("index cut at {cut}")).await;
    }

    // Entries pointing at the wrong place: a checkpoint one byte off, a checkpoint naming
    // another line, marks naming another line.
    let lie = |from: &str, to: &str| {
        assert!(original.contains(from), "{from}");
        std::fs::write(index(dir.path()), original.replacen(from, to, 1)).unwrap();
    };
    let offset = |seq: usize| -> u64 {
        let text = std::fs::read_to_string(journal(dir.path())).unwrap();
        text.lines().take(seq - 1).map(|l| l.len() as u64 + 1).sum()
    };
    lie(
        &format!("at 129 {}\n", offset(129)),
        &format!("at 129 {}\n", offset(129) + 1),
    );
    agrees(dir.path(), &all, "checkpoint off by one byte").await;
    lie(
        &format!("at 129 {}\n", offset(129)),
        &format!("at 129 {}\n", offset(125)),
    );
    agrees(dir.path(), &all, "checkpoint on another line").await;
    lie(
        &format!("mark session.snapshot 200 {}", offset(200)),
        &format!("mark session.snapshot 200 {}", offset(199)),
    );
    agrees(dir.path(), &all, "snapshot mark on another line").await;
    lie(
        &format!("mark run.started 120 {}", offset(120)),
        &format!("mark run.started 120 {}", offset(121)),
    );
    agrees(dir.path(), &all, "run mark on another line").await;

    // Not an index, an index of another file, no index.
    std::fs::write(index(dir.path()), "garbage\n").unwrap();
    agrees(dir.path(), &all, "garbled index").await;
    lie("loom-jsonl-index 1 ", "loom-jsonl-index 1 9");
    agrees(dir.path(), &all, "index of another file").await;
    std::fs::remove_file(index(dir.path())).unwrap();
    agrees(dir.path(), &all, "no index").await;
    // Each rebuild wrote it again.
    assert!(index(dir.path()).exists());
    store.append(events("t", "s", 1), 230).await.unwrap();
    let all = store.read("t", "s", 0).await.unwrap();
    agrees(dir.path(), &all, "rebuilt, then appended").await;
}

/// A store keeps the index it read (the reads of one run do not parse the `.idx` file each
/// time), checked before each use like the file: it follows another writer's appends and a
/// journal replaced under its name, and its own appends keep it.
#[tokio::test]
async fn a_kept_index_follows_other_writers_and_a_replaced_journal() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let all = session(&store, 150).await;
    agrees_through(&store, &all, "own appends").await;
    // Kept: the `.idx` file is not read again (removed, it is not rebuilt by this store's
    // reads), while a new store rebuilds it.
    std::fs::remove_file(index(dir.path())).unwrap();
    agrees_through(&store, &all, "kept index").await;
    assert!(!index(dir.path()).exists());
    agrees(dir.path(), &all, "a new store").await;
    assert!(index(dir.path()).exists());
    // Another writer appends: this store's kept index is caught up from the file.
    let other = JsonlStore::new(dir.path());
    let mut last = all.len() as u64;
    for seq in 151..=212 {
        let next = match seq {
            200 => marker("t", "s", "snapshot", seq - 1),
            _ => event("t", "s", &format!("o{seq}")),
        };
        last = other.append(vec![next], last).await.unwrap()[0].seq;
    }
    let all = store.read("t", "s", 0).await.unwrap();
    assert_eq!(all.len(), 212);
    agrees_through(&store, &all, "another writer's appends").await;
    // The journal replaced under its name: the kept index no longer describes it.
    let elsewhere = tempfile::tempdir().unwrap();
    let replaced = session(&JsonlStore::new(elsewhere.path()), 140).await;
    let replacement = journal(dir.path()).with_extension("new");
    std::fs::copy(journal(elsewhere.path()), &replacement).unwrap();
    std::fs::rename(&replacement, journal(dir.path())).unwrap();
    agrees_through(&store, &replaced, "replaced journal").await;
    // Its own appends after that keep it.
    let more = store
        .append(vec![event("t", "s", "after")], 140)
        .await
        .unwrap();
    let mut replaced = replaced;
    replaced.extend(more);
    agrees_through(&store, &replaced, "appends after the replacement").await;
    agrees(dir.path(), &replaced, "a new store after the replacement").await;
}

/// A journal replaced under its name (what a repair does) is indexed again.
#[tokio::test]
async fn a_journal_replaced_under_its_name_is_indexed_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    session(&store, 210).await;
    let other = tempfile::tempdir().unwrap();
    let all = session(&JsonlStore::new(other.path()), 140).await;
    let replacement = journal(dir.path()).with_extension("new");
    std::fs::copy(journal(other.path()), &replacement).unwrap();
    std::fs::rename(&replacement, journal(dir.path())).unwrap();
    agrees(dir.path(), &all, "replaced journal").await;
}

// The JSONL store answers `run_start` from its index.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_start_is_answered_from_the_offset_index() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let open = move || Arc::new(JsonlStore::new(&root)) as Arc<dyn EventStore>;
    loom_testkit::conformance::run_start_is_indexed(&open).await;
}

/// A short journal (a session of one run) has no `.idx` file: creating one cost more than
/// reading the journal whole. Reads agree with the file all the same, and the index is written
/// once the journal passes 16 KiB.
#[tokio::test]
async fn a_short_journal_has_no_index_file_until_it_grows() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let all = session(&store, 20).await;
    let len = std::fs::metadata(journal(dir.path())).unwrap().len();
    assert!(len < 16 * 1024, "{len} bytes");
    assert!(!index(dir.path()).exists());
    agrees_through(&store, &all, "short, this store").await;
    agrees(dir.path(), &all, "short, a new store").await;
    assert!(!index(dir.path()).exists(), "reads do not write it either");
    // Grown past 16 KiB by its appends: the index file follows.
    let mut last = all.len() as u64;
    while std::fs::metadata(journal(dir.path())).unwrap().len() < 16 * 1024 {
        last = store
            .append(vec![event("t", "s", &format!("g{last}"))], last)
            .await
            .unwrap()[0]
            .seq;
    }
    store
        .append(vec![event("t", "s", "past")], last)
        .await
        .unwrap();
    assert!(index(dir.path()).exists());
    let all = store.read("t", "s", 0).await.unwrap();
    agrees(dir.path(), &all, "grown").await;
}
