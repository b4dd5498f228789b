//! Behaviour of both journals, through the `EventStore` port: the shared conformance suite of
//! `loom-testkit` on the memory and JSONL stores, then what only the JSONL files show (their
//! bytes, torn and corrupted lines).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use chrono::SubsecRound;
use loom_core::{
    event::{Envelope, Event, EventReadError, Payload, SessionRepaired},
    ports::{EventStore, SetAside, StoreError},
};
use loom_journal::{JsonlStore, MemoryStore};
use loom_testkit::conformance::{assert_invalid, event, events, nested, seqs, started};
use serde_json::Map;

fn journal_path(root: &Path, tenant: &str, session: &str) -> PathBuf {
    root.join(tenant).join(format!("{session}.jsonl"))
}

// ---------------------------------------------------------------------------------------------
// Both stores: the conformance suite

loom_testkit::store_conformance!(memory, {
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    ((), move || store.clone())
});

// The memory store answers `run_start` (a follower's first read copies its run only).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_run_start_is_answered() {
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let open = move || store.clone();
    loom_testkit::conformance::run_start_is_indexed(&open).await;
}

// One in-process idempotency store, shared by every handle.
loom_testkit::idempotency_conformance!(idempotency_memory, {
    let store: Arc<dyn loom_core::ports::IdempotencyStore> =
        Arc::new(loom_journal::MemoryIdempotency::new());
    ((), move || store.clone())
});

// A fresh `JsonlStore` on the same root for every handle, as another process would have.
loom_testkit::store_conformance!(jsonl, {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    (dir, move || {
        Arc::new(JsonlStore::new(&root)) as Arc<dyn EventStore>
    })
});

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
async fn jsonl_conflict_leaves_the_file_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    store.append(events("t", "s", 2), 0).await.unwrap();
    let before = std::fs::read(journal_path(dir.path(), "t", "s")).unwrap();
    assert!(matches!(
        store.append(events("t", "s", 2), 1).await,
        Err(StoreError::Conflict { found: 2, .. })
    ));
    assert_eq!(
        std::fs::read(journal_path(dir.path(), "t", "s")).unwrap(),
        before
    );
    // A refused batch creates no file.
    assert_invalid(
        store
            .append(vec![event("t", "a", "1"), event("t", "b", "2")], 0)
            .await,
        "t/b",
    );
    assert!(!journal_path(dir.path(), "t", "a").exists());
    assert!(!journal_path(dir.path(), "t", "b").exists());
}

#[tokio::test]
async fn jsonl_unsafe_ids_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    for bad in ["../escape", "a/b", ".hidden", ""] {
        assert!(store.append(vec![event(bad, "s", "1")], 0).await.is_err());
        assert!(store.append(vec![event("t", bad, "1")], 0).await.is_err());
        assert!(store.delete("t", bad).await.is_err());
    }
    // Nothing escaped the root, nothing was created in it.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn jsonl_delete_removes_the_file_and_its_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let path = journal_path(dir.path(), "t", "s");
    store.append(events("t", "s", 2), 0).await.unwrap();
    append_raw(&path, b"{\"event_id\":");
    store.append(events("t", "s", 1), 2).await.unwrap();
    assert!(path.with_extension("jsonl.corrupt").exists());
    assert_eq!(store.delete("t", "s").await.unwrap(), 3);
    assert!(!path.exists());
    assert!(!path.with_extension("jsonl.corrupt").exists());
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

#[tokio::test]
async fn jsonl_reads_the_reference_journal() {
    // In `../shared` (the test is skipped on a clone without it).
    let Some(original) = loom_testkit::shared::text("reference/journals/plain-run.jsonl") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = journal_path(dir.path(), "default", "plain-run-1");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
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

// ---------------------------------------------------------------------------------------------
// JSONL only: unreadable lines set aside, the run index

/// A line written before the journal refused events that do not read back: the outside probe's
/// `run.started`, its metadata nested 125 levels deep, as line `seq`.
fn unreadable_line(tenant: &str, session: &str, run: &str, seq: u64) -> String {
    let mut deep = started(tenant, session, run, nested(125));
    deep.seq = seq;
    let line = deep.to_json();
    assert!(Event::from_json(&line).is_err());
    line
}

/// The event that takes the place of line `seq`.
fn repaired(tenant: &str, session: &str, seq: u64, bytes: usize) -> Event {
    let mut event = Event::new(
        Envelope {
            event_id: format!("repair-{seq}"),
            ts: chrono::Utc::now(),
            tenant_id: tenant.into(),
            session_id: session.into(),
            run_id: "r1".into(),
            root_run_id: "r1".into(),
            span_id: "repair".into(),
            parent_span_id: None,
            agent: None,
            role: None,
        },
        Payload::SessionRepaired(SessionRepaired {
            bytes: bytes as u64,
            error: "unreadable".into(),
            moved_to: format!("{session}.jsonl.corrupt"),
            by: Some("ops".into()),
        }),
    );
    event.seq = seq;
    event
}

#[tokio::test]
async fn jsonl_unreadable_lines_are_salvaged_then_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let path = journal_path(dir.path(), "t", "s");
    store.append(events("t", "s", 3), 0).await.unwrap();
    let bad = unreadable_line("t", "s", "r1", 2);
    rewrite_line(&path, 2, |_| bad.clone());
    append_raw(&path, b"{\"torn");
    assert_corrupted(store.read("t", "s", 0).await, &path, 2);

    // What can be read is read; the unreadable line is named, with its bytes and its run.
    let salvage = store.salvage("t", "s").await.unwrap();
    assert_eq!(salvage.path, path.display().to_string());
    assert_eq!(seqs(&salvage.events), [1, 3]);
    assert_eq!(salvage.unreadable.len(), 1);
    let line = &salvage.unreadable[0];
    assert_eq!(line.line, 2);
    assert_eq!(line.bytes, bad.as_bytes());
    assert_eq!(line.run_id.as_deref(), Some("r1"));
    assert!(
        line.error.to_string().contains("recursion limit"),
        "{}",
        line.error
    );
    assert_eq!(salvage.aside, "s.jsonl.corrupt");

    // Refused, touching nothing: a line that changed, a readable line, a wrong seq.
    let before = std::fs::read(&path).unwrap();
    let aside = |line: u64, bytes: &[u8], seq: u64| SetAside {
        line,
        bytes: bytes.to_vec(),
        replacement: repaired("t", "s", seq, bytes.len()),
    };
    assert_invalid(
        store.set_aside("t", "s", vec![aside(2, b"other", 2)]).await,
        "changed since it was read",
    );
    let readable = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_owned();
    assert_invalid(
        store
            .set_aside("t", "s", vec![aside(1, readable.as_bytes(), 1)])
            .await,
        "reads back",
    );
    assert_invalid(
        store
            .set_aside("t", "s", vec![aside(2, bad.as_bytes(), 3)])
            .await,
        "carries seq 3",
    );
    assert_invalid(
        store
            .set_aside("t", "s", vec![aside(9, bad.as_bytes(), 9)])
            .await,
        "has no line 9",
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert!(!path.with_extension("jsonl.corrupt").exists());

    // Set aside: the bytes are kept, the replacement takes the line's seq, the journal reads
    // again and takes appends after its last line (the torn tail then goes aside too).
    store
        .set_aside("t", "s", vec![aside(2, bad.as_bytes(), 2)])
        .await
        .unwrap();
    let all = store.read("t", "s", 0).await.unwrap();
    assert_eq!(seqs(&all), [1, 2, 3]);
    assert!(matches!(all[1].payload, Payload::SessionRepaired(_)));
    assert_eq!(
        std::fs::read_to_string(path.with_extension("jsonl.corrupt")).unwrap(),
        format!("{bad}\n")
    );
    assert!(store.salvage("t", "s").await.unwrap().unreadable.is_empty());
    let next = store.append(events("t", "s", 1), 3).await.unwrap();
    assert_eq!(seqs(&next), [4]);
    assert_eq!(seqs(&store.read("t", "s", 0).await.unwrap()), [1, 2, 3, 4]);
}

/// An append that waited for the lock of a journal file replaced meanwhile (a repair renames
/// its new file over the old one) writes to the new file, not to the old one nobody reads.
#[tokio::test]
async fn jsonl_append_follows_a_journal_file_replaced_while_it_waited() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let path = journal_path(dir.path(), "t", "s");
    store.append(events("t", "s", 2), 0).await.unwrap();
    let old = std::fs::File::open(&path).unwrap();
    old.lock().unwrap();
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move { store.append(events("t", "s", 1), 2).await })
    };
    // Give the append time to open the old file and wait for its lock (without it, the append
    // simply opens the new file: the test then passes without exercising the wait).
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let replacement = path.with_extension("jsonl.new");
    std::fs::copy(&path, &replacement).unwrap();
    std::fs::rename(&replacement, &path).unwrap();
    old.unlock().unwrap();
    let written = waiting.await.unwrap().unwrap();
    assert_eq!(seqs(&written), [3]);
    assert_eq!(seqs(&store.read("t", "s", 0).await.unwrap()), [1, 2, 3]);
}

/// The run index is a cache checked against the files: runs written by a writer that does not
/// keep it are found, its lies are not believed, and a garbled or missing index is rebuilt.
#[tokio::test]
async fn jsonl_run_index_is_checked_against_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let index = dir.path().join("t").join(".runs");
    store
        .append(vec![started("t", "s1", "r1", Map::new())], 0)
        .await
        .unwrap();
    store
        .append(vec![started("t", "s2", "r2", Map::new())], 0)
        .await
        .unwrap();
    assert_eq!(
        store.find_run("t", "r1").await.unwrap().as_deref(),
        Some("s1")
    );
    assert!(index.exists());

    // Another writer, which keeps no index: a new session, then a run added to s1.
    let mut r3 = started("t", "s3", "r3", Map::new());
    r3.seq = 1;
    std::fs::write(
        journal_path(dir.path(), "t", "s3"),
        format!("{}\n", r3.to_json()),
    )
    .unwrap();
    let mut r4 = started("t", "s1", "r4", Map::new());
    r4.seq = 2;
    append_raw(
        &journal_path(dir.path(), "t", "s1"),
        format!("{}\n", r4.to_json()).as_bytes(),
    );
    assert_eq!(
        store.find_run("t", "r3").await.unwrap().as_deref(),
        Some("s3")
    );
    assert_eq!(
        store.find_run("t", "r4").await.unwrap().as_deref(),
        Some("s1")
    );

    // An entry that points at the wrong line is not believed.
    append_raw(&index, b"run r5 s1 0\nrun r2 s1 0\n");
    assert_eq!(store.find_run("t", "r5").await.unwrap(), None);
    assert_eq!(
        store.find_run("t", "r2").await.unwrap().as_deref(),
        Some("s2")
    );

    // A session file replaced by hand (another inode, another content): read again.
    let mut r6 = started("t", "s2", "r6", Map::new());
    r6.seq = 1;
    std::fs::remove_file(journal_path(dir.path(), "t", "s2")).unwrap();
    std::fs::write(
        journal_path(dir.path(), "t", "s2"),
        format!("{}\n", r6.to_json()),
    )
    .unwrap();
    assert_eq!(store.find_run("t", "r2").await.unwrap(), None);
    assert_eq!(
        store.find_run("t", "r6").await.unwrap().as_deref(),
        Some("s2")
    );

    // A file rewritten in place (same inode), longer than what the index read: its start is
    // not what the index saw, so it is read again from its start.
    let mut r8 = started("t", "s3", "r8-rewritten", Map::new());
    r8.seq = 1;
    std::fs::write(
        journal_path(dir.path(), "t", "s3"),
        format!("{}\n", r8.to_json()),
    )
    .unwrap();
    assert_eq!(
        store
            .find_run("t", "r8-rewritten")
            .await
            .unwrap()
            .as_deref(),
        Some("s3")
    );
    assert_eq!(store.find_run("t", "r3").await.unwrap(), None);

    // A garbled index, then no index: rebuilt from the files.
    std::fs::write(&index, "not an index\n").unwrap();
    assert_eq!(
        store.find_run("t", "r4").await.unwrap().as_deref(),
        Some("s1")
    );
    std::fs::remove_file(&index).unwrap();
    assert_eq!(
        store
            .find_run("t", "r8-rewritten")
            .await
            .unwrap()
            .as_deref(),
        Some("s3")
    );
    assert_eq!(store.find_run("t", "nobody").await.unwrap(), None);

    // A run whose line does not read back is still found: its session says where it breaks.
    let bad = unreadable_line("t", "s7", "r7", 1);
    std::fs::write(journal_path(dir.path(), "t", "s7"), format!("{bad}\n")).unwrap();
    assert_eq!(
        store.find_run("t", "r7").await.unwrap().as_deref(),
        Some("s7")
    );
    assert_corrupted(
        store.read("t", "s7", 0).await,
        &journal_path(dir.path(), "t", "s7"),
        1,
    );
}

/// The shared forms of the port hand out the events a store keeps decoded (the same
/// allocation each time) and read exactly what `append`, `read` and `last_of_type` do; a batch lent to
/// `append_shared` is refused on a conflict as `append` refuses it.
#[tokio::test]
async fn shared_reads_hand_out_the_kept_events_and_read_what_read_reads() {
    let dir = tempfile::tempdir().unwrap();
    let stores: [(&str, Arc<dyn EventStore>); 2] = [
        ("memory", Arc::new(MemoryStore::new())),
        ("jsonl", Arc::new(JsonlStore::new(dir.path()))),
    ];
    for (name, store) in stores {
        let batch: Vec<Arc<Event>> = events("t", "s", 3).into_iter().map(Arc::new).collect();
        let written = store.append_shared(&batch, 0).await.unwrap();
        let written_seqs: Vec<u64> = written.iter().map(|e| e.seq).collect();
        assert_eq!(written_seqs, [1, 2, 3], "{name}");
        // A batch not numbered yet is numbered in a copy: the lent events are left as they are.
        assert!(batch.iter().all(|e| e.seq == 0), "{name}");
        let conflict = store.append_shared(&batch, 0).await.unwrap_err();
        assert!(
            matches!(conflict, StoreError::Conflict { .. }),
            "{name}: {conflict}"
        );
        let owned = store.read("t", "s", 0).await.unwrap();
        let first = store.read_shared("t", "s", 0).await.unwrap();
        let again = store.read_shared("t", "s", 1).await.unwrap();
        let shared: Vec<Event> = first.iter().map(|e| Event::clone(e)).collect();
        assert_eq!(shared, owned, "{name}: read_shared reads what read reads");
        assert_eq!(first.len(), 3, "{name}");
        assert_eq!(again.len(), 2, "{name}");
        for (a, b) in first[1..].iter().zip(&again) {
            assert!(
                Arc::ptr_eq(a, b),
                "{name}: a second read shares the kept event"
            );
        }
        let kind = owned[2].event_type.as_str();
        let last = store.last_of_type_shared("t", "s", kind, 3).await.unwrap();
        let last = last.expect("an event of that type before seq 3");
        let owned_last = store.last_of_type("t", "s", kind, 3).await.unwrap();
        assert_eq!(Some(Event::clone(&last)), owned_last, "{name}");
        assert_eq!(last.seq, 2, "{name}");
        assert!(
            Arc::ptr_eq(&last, &first[1]),
            "{name}: the kept event, not a copy"
        );
        if name == "memory" {
            // The memory journal keeps the very events it returned from the append.
            for (a, b) in written.iter().zip(&first) {
                assert!(
                    Arc::ptr_eq(a, b),
                    "memory: the appended event is the one kept"
                );
            }
        }
        // A batch numbered after the last seq, its timestamps at the microsecond, is kept as
        // given: the memory journal shares the writer's events.
        let mut next = events("t", "s", 2);
        for (seq, event) in (4..).zip(&mut next) {
            event.seq = seq;
            event.ts = event.ts.trunc_subsecs(6);
        }
        let next: Vec<Arc<Event>> = next.into_iter().map(Arc::new).collect();
        let kept = store.append_shared(&next, 3).await.unwrap();
        assert_eq!(kept, next, "{name}");
        let read = store.read_shared("t", "s", 3).await.unwrap();
        assert_eq!(read, next, "{name}");
        if name == "memory" {
            for ((given, kept), read) in next.iter().zip(&kept).zip(&read) {
                assert!(
                    Arc::ptr_eq(given, kept) && Arc::ptr_eq(given, read),
                    "memory"
                );
            }
        }
    }
}
