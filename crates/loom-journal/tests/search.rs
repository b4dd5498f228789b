//! The event search of the memory store (its postings: each tenant's events in append order,
//! by type) and of the JSONL store (`EventStore::search`, answered from the tenant's search
//! index `<tenant>/.search/`): filter by filter and page by page it returns what a scan of the
//! journal in the store's write order returns (`loom_testkit::search_conformance`), and it stays
//! right whatever happened to the files since the last search: appends by a writer that keeps
//! no index, a session deleted or rewritten, the index deleted, torn or garbled. A session
//! holding a line that does not read back, or an index entry that lies about its line, makes
//! the store decline (the caller scans).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::HashMap, io::Write, path::Path};

use loom_core::{
    event::Event,
    ports::EventStore,
    search::{EventFilter, Searched},
};
use loom_journal::{JsonlStore, MemoryStore};
use loom_testkit::{
    conformance::events,
    search_conformance::{agrees, assert_every_filter, assert_pages, fill, filter},
};

/// The JSONL store's write order: each session's journal order, sessions interleaved by the
/// largest `ts` seen so far in each, then by session id.
fn write_order(written: &[Event]) -> Vec<Event> {
    let mut latest: HashMap<(&str, &str), i64> = HashMap::new();
    let mut keyed: Vec<(i64, &Event)> = written
        .iter()
        .map(|event| {
            let order = latest
                .entry((&event.tenant_id, &event.session_id))
                .or_insert(i64::MIN);
            *order = (*order).max(event.ts.timestamp_micros());
            (*order, event)
        })
        .collect();
    keyed.sort_by(|(a, x), (b, y)| (a, &x.session_id, x.seq).cmp(&(b, &y.session_id, y.seq)));
    keyed.into_iter().map(|(_, event)| event.clone()).collect()
}

fn ids(found: Option<Searched>) -> Vec<String> {
    match found {
        Some(Searched::Found(events)) => events.into_iter().map(|e| e.event_id).collect(),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn every_filter_answers_as_the_scan() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let written = fill(&store, true).await;
    assert_every_filter(&store, &write_order(&written)).await;
}

#[tokio::test]
async fn pages_follow_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let written = fill(&store, false).await;
    assert_pages(&store, &write_order(&written)).await;
}

#[tokio::test]
async fn the_memory_store_answers_every_filter_as_the_scan() {
    let store = MemoryStore::new();
    // The memory store's write order is the order of the appends.
    let written = fill(&store, true).await;
    assert_every_filter(&store, &written).await;
}

#[tokio::test]
async fn the_memory_store_pages_follow_each_other() {
    let store = MemoryStore::new();
    let written = fill(&store, false).await;
    assert_pages(&store, &written).await;
}

/// A deleted session leaves the memory store's answers; one written again comes back with its
/// new events only; what went quiet (compressed) is read as well as what did not.
#[tokio::test]
async fn the_memory_store_forgets_deleted_sessions() {
    let store = MemoryStore::new();
    let mut written = fill(&store, false).await;
    store.delete("t", "s2").await.unwrap();
    written.retain(|e| !(e.tenant_id == "t" && e.session_id == "s2"));
    agrees(&store, &written, &filter()).await;
    written.extend(store.append(events("t", "s2", 2), 0).await.unwrap());
    // Enough appends elsewhere for every session of `t` to be packed.
    for i in 0..300 {
        store
            .append(events("u", &format!("q{i}"), 1), 0)
            .await
            .unwrap();
    }
    assert!(store.footprint().packed_bytes > 0);
    agrees(&store, &written, &filter()).await;
    let claimed = EventFilter {
        types: vec!["run.claimed".into()],
        after: Some(written[40].event_id.clone()),
        ..filter()
    };
    agrees(&store, &written, &claimed).await;
}

/// Appends after a search are found by the next one; so are appends by another store on the
/// same root (a writer that keeps no index), and by a second process's handle.
#[tokio::test]
async fn appends_since_the_last_search_are_found() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let mut written = fill(&store, false).await;
    agrees(&store, &write_order(&written), &filter()).await;
    let other = JsonlStore::new(dir.path());
    let last = other.last_seq("t", "s1").await.unwrap();
    let mut more = events("t", "s1", 3);
    for event in &mut more {
        event.ts = written.last().unwrap().ts + chrono::TimeDelta::seconds(1);
    }
    written.extend(other.append(more, last).await.unwrap());
    written.extend(other.append(events("t", "new", 2), 0).await.unwrap());
    agrees(&store, &write_order(&written), &filter()).await;
    let claimed = EventFilter {
        types: vec!["run.claimed".into()],
        ..filter()
    };
    agrees(&store, &write_order(&written), &claimed).await;
}

fn tenant_dir(root: &Path) -> std::path::PathBuf {
    root.join("t")
}

/// A session deleted, or rewritten under its name, leaves no trace in the answers; the index
/// deleted, torn or garbled is rebuilt.
#[tokio::test]
async fn the_index_follows_the_files_and_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let mut written = fill(&store, false).await;
    agrees(&store, &write_order(&written), &filter()).await;

    // Deleted.
    store.delete("t", "s2").await.unwrap();
    written.retain(|e| !(e.tenant_id == "t" && e.session_id == "s2"));
    agrees(&store, &write_order(&written), &filter()).await;

    // Rewritten: the same name now holds another journal (fewer, other events).
    let s3 = tenant_dir(dir.path()).join("s3.jsonl");
    std::fs::remove_file(&s3).unwrap();
    std::fs::remove_file(tenant_dir(dir.path()).join("s3.jsonl.idx")).ok();
    written.retain(|e| !(e.tenant_id == "t" && e.session_id == "s3"));
    written.extend(store.append(events("t", "s3", 2), 0).await.unwrap());
    agrees(&store, &write_order(&written), &filter()).await;

    // The index deleted.
    let index = tenant_dir(dir.path()).join(".search");
    std::fs::remove_dir_all(&index).unwrap();
    agrees(&store, &write_order(&written), &filter()).await;

    // A torn last line in the records and in a type file: ignored.
    for file in ["scanned", "t.run.claimed"] {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(index.join(file))
            .unwrap();
        f.write_all(b"scanned s1 9").unwrap();
    }
    agrees(&store, &write_order(&written), &filter()).await;

    // Garbled records: rebuilt.
    std::fs::write(index.join("scanned"), "not an index\n").unwrap();
    agrees(&store, &write_order(&written), &filter()).await;
    let tool = EventFilter {
        types: vec!["tool.called".into()],
        ..filter()
    };
    agrees(&store, &write_order(&written), &tool).await;
}

/// A line that does not read back makes the store decline (the caller's scan names the
/// session); so does an entry that names another line than its own.
#[tokio::test]
async fn what_the_index_cannot_vouch_for_is_declined() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    store.append(events("t", "a", 3), 0).await.unwrap();
    store.append(events("t", "b", 3), 0).await.unwrap();
    assert_eq!(ids(store.search(&filter()).await.unwrap()).len(), 6);

    // An entry pointing at another line of its file.
    let index = tenant_dir(dir.path()).join(".search");
    let entries = std::fs::read_to_string(index.join("t.run.claimed")).unwrap();
    let lines: Vec<&str> = entries.lines().collect();
    let mut first: Vec<&str> = lines[0].split(' ').collect();
    let second: Vec<&str> = lines[1].split(' ').collect();
    first[3] = second[3];
    let mut lying = vec![first.join(" ")];
    lying.extend(lines[1..].iter().map(|l| (*l).to_owned()));
    std::fs::write(index.join("t.run.claimed"), lying.join("\n") + "\n").unwrap();
    assert_eq!(store.search(&filter()).await.unwrap(), None);
    std::fs::remove_dir_all(&index).unwrap();
    assert_eq!(ids(store.search(&filter()).await.unwrap()).len(), 6);

    // A line that does not read back, written by hand.
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(tenant_dir(dir.path()).join("b.jsonl"))
        .unwrap();
    file.write_all(b"{not json\n").unwrap();
    assert_eq!(store.search(&filter()).await.unwrap(), None);

    // Another tenant is not concerned; a tenant with no journal finds nothing.
    store.append(events("u", "c", 2), 0).await.unwrap();
    let of = |tenant: &str| EventFilter {
        tenant_id: tenant.into(),
        ..filter()
    };
    assert_eq!(ids(store.search(&of("u")).await.unwrap()).len(), 2);
    assert!(ids(store.search(&of("nobody")).await.unwrap()).is_empty());
    let unknown = EventFilter {
        after: Some("x".into()),
        ..of("nobody")
    };
    assert_eq!(
        store.search(&unknown).await.unwrap(),
        Some(Searched::UnknownAfter)
    );
}
