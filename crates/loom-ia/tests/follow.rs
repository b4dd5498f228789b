//! A follower reads from its position, never from the start of its session: following a run at
//! the end of a 10,000-event JSONL session, every read of the journal (the first one, each
//! wake, the run's events and result, a search of its events) returns only events of that run,
//! counted by a journal wrapper. Listing the recent runs of such a session reads its end only.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use futures_util::StreamExt;
use loom_ia::{
    EventQuery, FollowOptions, Loom, RunQuery, RunRef,
    config::{AgentSpec, Config, EventsBackend, LoomConfig, ModelSpec, Sdk},
    core::{Event, ports::EventStore},
};
use loom_journal::JsonlStore;
use loom_testkit::{
    CountingStore,
    conformance::{event, started},
};
use serde_json::Map;

/// Events of earlier runs before the followed one.
const EARLIER: u64 = 10_000;

fn config(dir: &std::path::Path) -> Config {
    let mut raw = LoomConfig {
        models: vec![ModelSpec::new("fake", Sdk::Fake, "FAKE")],
        agents: vec![AgentSpec::new("echo", "fake")],
        ..LoomConfig::default()
    };
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("data".into());
    Config::new(raw, dir.to_path_buf()).unwrap()
}

/// An event of the followed run.
fn of_live(label: &str) -> Event {
    let mut event = event("default", "s", label);
    event.run_id = "live".into();
    event.root_run_id = "live".into();
    event
}

#[tokio::test]
async fn a_follower_at_the_end_of_a_long_session_reads_only_what_follows() {
    let dir = tempfile::tempdir().unwrap();
    // The JSONL store decodes only the lines it returns: what the reads return is counted.
    let store = Arc::new(CountingStore::new(JsonlStore::new(dir.path().join("data"))));
    // 10,000 events of 100 earlier runs, then the followed run's start.
    for run in 0..100u64 {
        let mut batch = vec![started("default", "s", &format!("old-{run}"), Map::new())];
        batch.extend((1..100).map(|i| event("default", "s", &format!("{run}-{i}"))));
        store.inner.append(batch, run * 100).await.unwrap();
    }
    store
        .inner
        .append(vec![started("default", "s", "live", Map::new())], EARLIER)
        .await
        .unwrap();
    let loom = Loom::with_store(config(dir.path()), store.clone()).unwrap();
    let run = RunRef {
        tenant_id: "default".into(),
        session_id: "s".into(),
        run_id: "live".into(),
    };
    store.reset();

    // The follower's first read, then one wake per event written behind its back (a writer
    // in another process: no notice, the follower reads on its fallback period).
    let options = FollowOptions {
        fallback: Duration::from_millis(10),
        ..FollowOptions::default()
    };
    let mut followed = loom.follow_with(&run, options);
    let first = followed.next().await.unwrap().unwrap();
    assert_eq!(
        (first.seq, first.event_type.as_str()),
        (EARLIER + 1, "run.started")
    );
    for i in 0..20u64 {
        let seq = EARLIER + 1 + i;
        store
            .inner
            .append(vec![of_live(&i.to_string())], seq)
            .await
            .unwrap();
        let next = followed.next().await.unwrap().unwrap();
        assert_eq!(next.seq, seq + 1);
    }
    drop(followed);
    // Every read returned (and decoded) events of the followed run only, each once.
    assert_eq!(store.returned(), 21);
    assert!(store.lowest_after() >= EARLIER);

    // Its events and its result are read from its start too.
    store.reset();
    assert_eq!(loom.events(&run).await.unwrap().len(), 21);
    let result = loom.result(&run).await.unwrap();
    assert_eq!(result.run_id, "live");
    assert_eq!(store.returned(), 42);
    assert_eq!(store.lowest_after(), EARLIER);

    // A search of its events, its session named or not.
    for session in [None, Some("s")] {
        store.reset();
        let query = EventQuery {
            run_id: Some("live".into()),
            session_id: session.map(str::to_owned),
            ..EventQuery::default()
        };
        let found = loom.query(&query).await.unwrap();
        assert_eq!(found.len(), 21, "{session:?}");
        assert!(found.iter().all(|e| e.run_id == "live"));
        assert_eq!(store.returned(), 21, "{session:?}");
    }
}

#[tokio::test]
async fn listing_the_recent_runs_of_a_long_session_reads_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(CountingStore::new(JsonlStore::new(dir.path().join("data"))));
    // 100 runs of 100 events each; every tenth run is of the agent `rare`.
    for run in 0..100u64 {
        let run_id = format!("old-{run}");
        let mut start = started("default", "s", &run_id, Map::new());
        if run % 10 == 9 {
            start.agent = Some("rare".into());
        }
        let mut batch = vec![start];
        batch.extend((1..100).map(|i| {
            let mut event = event("default", "s", &format!("{run}-{i}"));
            event.run_id = run_id.clone();
            event.root_run_id = run_id.clone();
            event
        }));
        store.inner.append(batch, run * 100).await.unwrap();
    }
    let loom = Loom::with_store(config(dir.path()), store.clone()).unwrap();
    let ids = |page: &loom_ia::RunPage| -> Vec<String> {
        page.runs.iter().map(|r| r.run_id.clone()).collect()
    };

    store.reset();
    let page = loom
        .runs(&RunQuery {
            limit: 5,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(
        ids(&page),
        ["old-99", "old-98", "old-97", "old-96", "old-95"]
    );
    assert!(page.truncated);
    assert!(
        page.runs
            .iter()
            .all(|r| r.iterations == 0 && !r.agent.is_empty())
    );
    // Two stretches from the end (320 events, then 1,280), not the 10,000 of the session.
    assert!(store.returned() <= 1_600, "{}", store.returned());

    // A filter that few runs pass reads further back, only as far as it must.
    store.reset();
    let page = loom
        .runs(&RunQuery {
            agent: Some("rare".into()),
            limit: 3,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(ids(&page), ["old-99", "old-89", "old-79"]);
    assert!(page.truncated);
    assert!(store.returned() < 10_000, "{}", store.returned());

    // Everything: the whole session, and nothing left out.
    let page = loom
        .runs(&RunQuery {
            limit: 200,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(page.runs.len(), 100);
    assert!(!page.truncated);
    assert_eq!(page.runs[99].run_id, "old-0");
}
