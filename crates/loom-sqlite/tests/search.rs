//! The reads the SQLite journal answers from its indexes: `EventStore::search` returns, filter
//! by filter, page by page, what a scan of every session with `EventFilter::matches` returns in
//! write order (the order of the appends, as PostgreSQL's `ingested`), and
//! `EventStore::recent_sessions` what `EventStore::sessions` lists, filtered and cut. The
//! journal and the filters are generated (a fixed seed): the expected answers are computed by
//! the scan of `loom_testkit::search_conformance`, never written down. Rows that do not read back, or whose columns disagree
//! with their event, make the store decline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use chrono::{DateTime, TimeDelta, Utc};
use loom_core::{
    event::Event,
    ports::{EventStore, SessionSummary},
    search::{EventFilter, RecentSessions, Searched},
};
use loom_sqlite::SqliteStore;
use loom_testkit::search_conformance::{
    self as conformance, SESSIONS, assert_every_filter, assert_pages, facet, fill, filter, start,
};
use sqlx::{Connection, Row, sqlite::SqliteConnection};

/// The journal written: every event as `append` returned it, in the order of the appends.
struct Written {
    store: SqliteStore,
    events: Vec<Event>,
    _dir: tempfile::TempDir,
}

/// A journal filled by the search conformance (`fill`).
async fn written(twice: bool) -> Written {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::connect(dir.path().join("journal.db"))
        .await
        .unwrap();
    let events = fill(&store, twice).await;
    Written {
        store,
        events,
        _dir: dir,
    }
}

async fn search(store: &SqliteStore, filter: &EventFilter) -> Searched {
    conformance::search(store, filter).await
}

/// One filter per field, then combinations, bounds and cursors, each checked against the scan.
#[tokio::test]
async fn every_filter_answers_as_the_scan() {
    let written = written(true).await;
    assert_every_filter(&written.store, &written.events).await;
}

/// Paging with `after` set to the last event of each page gives the whole answer, in order,
/// with or without a filter (event ids being unique: a cursor names the first event of its id).
#[tokio::test]
async fn pages_follow_each_other() {
    let written = written(false).await;
    assert_pages(&written.store, &written.events).await;
}

/// The order is the order of the writes, as PostgreSQL's: an event written later comes later
/// even when its timestamp is earlier than one of another session (the facade's scan, which
/// interleaves sessions by timestamp, would put it first).
#[tokio::test]
async fn the_order_is_the_order_of_the_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::connect(dir.path().join("journal.db"))
        .await
        .unwrap();
    let at = |ms: i64, session: &str, id: &str| {
        let mut event = loom_testkit::conformance::event("t", session, id);
        event.event_id = id.into();
        event.ts = start() + TimeDelta::milliseconds(ms);
        event
    };
    store.append(vec![at(10, "a", "a1")], 0).await.unwrap();
    store.append(vec![at(5, "b", "b1")], 0).await.unwrap();
    store
        .append(vec![at(20, "a", "a2"), at(1, "a", "a3")], 1)
        .await
        .unwrap();
    store.append(vec![at(15, "b", "b2")], 1).await.unwrap();
    let ids = |found: Searched| match found {
        Searched::Found(events) => events.into_iter().map(|e| e.event_id).collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        ids(search(&store, &filter()).await),
        ["a1", "b1", "a2", "a3", "b2"]
    );
    let after_b1 = EventFilter {
        after: Some("b1".into()),
        ..filter()
    };
    assert_eq!(ids(search(&store, &after_b1).await), ["a2", "a3", "b2"]);
}

/// `recent_sessions` lists what `sessions` lists, filtered on the last write and cut, whatever
/// the bound and the limit; `more` says whether sessions were cut.
#[tokio::test]
async fn recent_sessions_are_the_session_list_filtered_and_cut() {
    let written = written(true).await;
    let store = &written.store;
    for tenant in ["t", "other", "nobody"] {
        let listed = store.sessions(tenant).await.unwrap();
        let mut bounds: Vec<Option<DateTime<Utc>>> = vec![
            None,
            Some(DateTime::<Utc>::MIN_UTC),
            Some(DateTime::<Utc>::MAX_UTC),
        ];
        for session in &listed {
            let ts = session.updated_at.unwrap();
            bounds.extend([
                Some(ts),
                Some(ts - TimeDelta::nanoseconds(1)),
                Some(ts + TimeDelta::nanoseconds(1)),
                Some(ts + TimeDelta::microseconds(1)),
            ]);
        }
        for since in bounds {
            for limit in 0..=listed.len() + 1 {
                let mut expected: Vec<SessionSummary> = listed
                    .iter()
                    .filter(|s| since.is_none_or(|since| s.updated_at.unwrap() >= since))
                    .cloned()
                    .collect();
                let more = expected.len() > limit;
                expected.truncate(limit);
                assert_eq!(
                    store.recent_sessions(tenant, since, limit).await.unwrap(),
                    Some(RecentSessions {
                        sessions: expected,
                        more
                    }),
                    "{tenant} since {since:?}, {limit}"
                );
            }
        }
    }
    // The list is not vacuous, and ordered by the last write: the session appended last first.
    let listed = store.sessions("t").await.unwrap();
    assert_eq!(listed.len(), SESSIONS.len());
    let last = written
        .events
        .iter()
        .rev()
        .find(|e| e.tenant_id == "t")
        .unwrap();
    assert_eq!(listed[0].session_id, last.session_id);
    assert_eq!(listed[0].last_seq, last.seq);
}

/// A raw connection to the file, to tamper with the rows.
async fn raw(path: &Path) -> SqliteConnection {
    SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap()
}

/// A row that does not read back makes the store decline what it would return, and only that;
/// so does a row whose columns say what its event does not; a `facets` column that is not
/// JSON fails nothing.
#[tokio::test]
async fn rows_that_do_not_read_back_make_the_store_decline() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal.db");
    let store = SqliteStore::connect(&file).await.unwrap();
    for session in ["a", "b", "c"] {
        store
            .append(loom_testkit::conformance::events("t", session, 3), 0)
            .await
            .unwrap();
    }
    let mut conn = raw(&file).await;
    sqlx::query("UPDATE events SET event = '{not json' WHERE session_id = 'b' AND seq = 2")
        .execute(&mut conn)
        .await
        .unwrap();
    let of = |session: &str| EventFilter {
        session_id: Some(session.into()),
        ..filter()
    };
    assert_eq!(store.search(&filter()).await.unwrap(), None);
    assert_eq!(store.search(&of("b")).await.unwrap(), None);
    match store.search(&of("a")).await.unwrap() {
        Some(Searched::Found(events)) => assert_eq!(events.len(), 3),
        other => panic!("{other:?}"),
    }
    // The unreadable row is not reached: the page ends before it.
    match store
        .search(&EventFilter {
            limit: 4,
            ..filter()
        })
        .await
        .unwrap()
    {
        Some(Searched::Found(events)) => assert_eq!(events.len(), 4),
        other => panic!("{other:?}"),
    }
    // Its last event reads back: the session list holds all three.
    let recent = store.recent_sessions("t", None, 10).await.unwrap().unwrap();
    assert_eq!(recent.sessions.len(), 3);

    // A last event that does not read back: the list is declined while it is within the
    // limit, and `sessions` leaves that session out.
    sqlx::query("UPDATE events SET event = '{not json' WHERE session_id = 'c' AND seq = 3")
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(store.recent_sessions("t", None, 10).await.unwrap(), None);
    let listed: Vec<String> = store
        .sessions("t")
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.session_id)
        .collect();
    assert_eq!(listed, ["b", "a"]);

    // Columns that disagree with their event: the event would not pass the filter.
    sqlx::query("UPDATE events SET agent = 'mallory' WHERE session_id = 'a' AND seq = 1")
        .execute(&mut conn)
        .await
        .unwrap();
    let mallory = EventFilter {
        agent: Some("mallory".into()),
        ..of("a")
    };
    assert_eq!(store.search(&mallory).await.unwrap(), None);

    // A `facets` column that is not JSON matches no facet and fails nothing.
    sqlx::query("UPDATE events SET facets = '{oops' WHERE session_id = 'a' AND seq = 2")
        .execute(&mut conn)
        .await
        .unwrap();
    let worker = EventFilter {
        facets: vec![facet("worker_id", "worker-1")],
        ..of("a")
    };
    match store.search(&worker).await.unwrap() {
        Some(Searched::Found(events)) => assert!(events.is_empty(), "{events:?}"),
        other => panic!("{other:?}"),
    }
    let worker = EventFilter {
        facets: vec![facet("worker_id", "worker-2")],
        ..of("a")
    };
    match store.search(&worker).await.unwrap() {
        Some(Searched::Found(events)) => assert_eq!(events.len(), 1),
        other => panic!("{other:?}"),
    }
    // Only a string is a facet's value: not the JSON text of an array.
    sqlx::query(
        "UPDATE events SET facets = '{\"worker_id\":[\"w\"]}' WHERE session_id = 'a' AND seq = 3",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let listed = EventFilter {
        facets: vec![facet("worker_id", r#"["w"]"#)],
        ..of("a")
    };
    match store.search(&listed).await.unwrap() {
        Some(Searched::Found(events)) => assert!(events.is_empty(), "{events:?}"),
        other => panic!("{other:?}"),
    }
}

/// A file from before the search's indexes gets them when opened, and is searched through them.
#[tokio::test]
async fn an_older_file_gets_the_search_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal.db");
    let store = SqliteStore::connect(&file).await.unwrap();
    store
        .append(loom_testkit::conformance::events("t", "s", 3), 0)
        .await
        .unwrap();
    store.close().await;
    let mut conn = raw(&file).await;
    let indexes = ["events_tenant_ingested", "events_tenant_type"];
    for drop in [
        "DROP INDEX events_tenant_ingested",
        "DROP INDEX events_tenant_type",
    ] {
        sqlx::query(drop).execute(&mut conn).await.unwrap();
    }
    drop(conn);
    let store = SqliteStore::connect(&file).await.unwrap();
    let types = EventFilter {
        types: vec!["run.claimed".into()],
        ..filter()
    };
    for filter in [filter(), types] {
        match store.search(&filter).await.unwrap() {
            Some(Searched::Found(events)) => assert_eq!(events.len(), 3),
            other => panic!("{other:?}"),
        }
    }
    let mut conn = raw(&file).await;
    let names: Vec<String> =
        sqlx::query("SELECT name FROM sqlite_master WHERE type = 'index' ORDER BY name")
            .fetch_all(&mut conn)
            .await
            .unwrap()
            .iter()
            .map(|row| row.try_get::<String, _>("name").unwrap())
            .collect();
    for index in indexes {
        assert!(names.iter().any(|name| name == index), "{names:?}");
    }
}
