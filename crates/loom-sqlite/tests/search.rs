//! The reads the SQLite journal answers from its indexes: `EventStore::search` returns, filter
//! by filter, page by page, what a scan of every session with `EventFilter::matches` returns in
//! write order (the order of the appends, as PostgreSQL's `ingested`), and
//! `EventStore::recent_sessions` what `EventStore::sessions` lists, filtered and cut. The
//! journal and the filters are generated (a fixed seed): the expected answers are computed by
//! the scan below, never written down. Rows that do not read back, or whose columns disagree
//! with their event, make the store decline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::HashMap, path::Path};

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use loom_core::{
    event::{Category, Envelope, Event, EventStatus, Payload},
    ports::{EventStore, SessionSummary},
    search::{EventFilter, RecentSessions, Searched},
};
use loom_sqlite::SqliteStore;
use serde_json::json;
use sqlx::{Connection, Row, sqlite::SqliteConnection};

/// A small deterministic generator (a linear congruential one): the same journal and filters
/// at every run.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    /// A number in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// One in `n`.
    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Some of `items` (possibly none), in their order.
    fn some_of<T: Clone>(&mut self, items: &[T]) -> Vec<T> {
        items.iter().filter(|_| self.one_in(3)).cloned().collect()
    }
}

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap()
}

const SESSIONS: [&str; 5] = ["s1", "s2", "s3", "s4", "s5"];
const RUNS: [&str; 4] = ["r1", "r2", "r3", "r4"];
const AGENTS: [Option<&str>; 3] = [Some("calc"), Some("autre"), None];
const ROLES: [Option<&str>; 3] = [None, Some("main"), Some("critic")];
const TOOLS: [&str; 2] = ["add", "mul"];
const MODELS: [(&str, Option<&str>); 3] = [
    ("gpt-x", Some("fast")),
    ("gpt-y", Some("slow")),
    ("gpt-x", None),
];

/// A payload of one of the kinds the journal is filled with (its facets: `tool_name`,
/// `model_id`, `model`, numbers and booleans too).
fn payload(dice: &mut Dice, tenant: &str) -> Payload {
    let output = |is_error: bool| {
        json!({"blocks": [{"cache_breakpoint": false, "provider_meta": {}, "type": "text",
            "text": "42"}], "data": null, "is_error": is_error, "artifacts": [],
            "offloaded": null, "unverified": false})
    };
    let value = match dice.below(7) {
        0 => json!({"type": "run.started", "kind": "normal",
            "context": {"tenant_id": tenant, "user_id": null, "metadata": {}},
            "parent_run_id": null, "parent_call_id": null, "depth": 0, "triggered_by": null,
            "trigger": null, "judges": "auto", "budget": null, "state": {}}),
        1 => json!({"type": "tool.called", "call_id": "c1", "tool_name": dice.pick(&TOOLS),
            "tool_kind": "python", "arguments": {"a": 1}}),
        2 => json!({"type": "tool.completed", "call_id": "c1", "tool_name": dice.pick(&TOOLS),
            "output": output(dice.one_in(2)), "latency_ms": 1.5, "size": 10}),
        3 => {
            let (model_id, model) = *dice.pick(&MODELS);
            json!({"type": "model.retried", "model_id": model_id, "model": model,
                "provider": "openai", "attempt": 1, "error_kind": "transient", "error": "busy",
                "delay_s": 0.5})
        }
        4 => json!({"type": "run.failed", "error_type": "timeout", "error": "late",
            "iterations": 1, "usage": {"input_tokens": 1, "output_tokens": 2}, "cost_usd": 0.0}),
        5 => json!({"type": "run.cancelled", "reason": "requested", "by": null,
            "iterations": 1, "usage": {"input_tokens": 0, "output_tokens": 0}, "cost_usd": 0.0}),
        _ => json!({"type": "run.claimed", "worker_id": "w1",
            "lease_until": "2026-11-29T13:00:00.000000Z"}),
    };
    serde_json::from_value(value).unwrap()
}

/// The journal written: every event as `append` returned it, in the order of the appends.
struct Written {
    store: SqliteStore,
    events: Vec<Event>,
    _dir: tempfile::TempDir,
}

/// Fills a journal: 150 appends of 1 to 3 events, in tenant `t` mostly (some in `other`), over
/// five sessions, four runs, three agents and roles; timestamps mostly follow the writes but
/// some go back in time, some repeat one already written, some are finer than a millisecond;
/// with `twice`, one event id is written twice (in two sessions of `t`).
async fn written(twice: bool) -> Written {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::connect(dir.path().join("journal.db"))
        .await
        .unwrap();
    let mut dice = Dice(7);
    let mut last_seq: HashMap<(String, String), u64> = HashMap::new();
    let mut events: Vec<Event> = Vec::new();
    let mut clock = start();
    for append in 0..150 {
        let elsewhere = dice.one_in(6);
        let tenant = if elsewhere && !(twice && append == 120) {
            "other"
        } else {
            "t"
        };
        let session = *dice.pick(&SESSIONS);
        let mut batch = Vec::new();
        for n in 0..1 + dice.below(3) {
            clock += TimeDelta::microseconds(1 + dice.below(3_000) as i64);
            let ts = match dice.below(10) {
                // Back in time: another session may already hold later events.
                0 => clock - TimeDelta::milliseconds(50),
                // The instant of an event already written.
                1 if !events.is_empty() => events[dice.below(events.len())].ts,
                _ => clock,
            };
            let run = *dice.pick(&RUNS);
            let event_id = if twice && append == 120 && n == 0 {
                // The id of an event of another session (an id written twice).
                events
                    .iter()
                    .find(|e| e.tenant_id == tenant && e.session_id != session)
                    .unwrap()
                    .event_id
                    .clone()
            } else {
                format!("ev-{append}-{n}")
            };
            batch.push(Event::new(
                Envelope {
                    event_id,
                    ts,
                    tenant_id: tenant.into(),
                    session_id: session.into(),
                    run_id: run.into(),
                    root_run_id: run.into(),
                    span_id: format!("span-{append}-{n}"),
                    parent_span_id: None,
                    agent: dice.pick(&AGENTS).map(str::to_owned),
                    role: dice.pick(&ROLES).map(str::to_owned),
                },
                payload(&mut dice, tenant),
            ));
        }
        let key = (tenant.to_owned(), session.to_owned());
        let expected = last_seq.get(&key).copied().unwrap_or(0);
        let appended = store.append(batch, expected).await.unwrap();
        last_seq.insert(key, appended.last().unwrap().seq);
        events.extend(appended);
    }
    // What the journal reads back is what was appended, session by session.
    for ((tenant, session), _) in last_seq {
        let read = store.read(&tenant, &session, 0).await.unwrap();
        let appended: Vec<&Event> = events
            .iter()
            .filter(|e| e.tenant_id == tenant && e.session_id == session)
            .collect();
        assert_eq!(read.iter().collect::<Vec<_>>(), appended);
    }
    Written {
        store,
        events,
        _dir: dir,
    }
}

/// The scan: the tenant's events in write order, from the one after the first event `after`
/// names (in `session_id` when given), those passing `EventFilter::matches`, at most `limit`.
fn scan(written: &[Event], filter: &EventFilter) -> Searched {
    let journal: Vec<&Event> = written
        .iter()
        .filter(|e| e.tenant_id == filter.tenant_id)
        .collect();
    let from = match &filter.after {
        None => 0,
        Some(after) => {
            let named = journal.iter().position(|e| {
                e.event_id == *after
                    && filter
                        .session_id
                        .as_ref()
                        .is_none_or(|s| e.session_id == *s)
            });
            match named {
                Some(at) => at + 1,
                None => return Searched::UnknownAfter,
            }
        }
    };
    Searched::Found(
        journal[from..]
            .iter()
            .filter(|e| filter.matches(e))
            .take(filter.limit)
            .map(|e| (*e).clone())
            .collect(),
    )
}

async fn search(store: &SqliteStore, filter: &EventFilter) -> Searched {
    store
        .search(filter)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("the store declined {filter:?}"))
}

/// Asserts that the store answers `filter` as the scan does; gives the events found.
async fn agrees(written: &Written, filter: &EventFilter) -> Vec<Event> {
    let expected = scan(&written.events, filter);
    let found = search(&written.store, filter).await;
    if let (Searched::Found(found), Searched::Found(expected)) = (&found, &expected) {
        assert_eq!(
            found.iter().map(|e| &e.event_id).collect::<Vec<_>>(),
            expected.iter().map(|e| &e.event_id).collect::<Vec<_>>(),
            "{filter:?}"
        );
    }
    assert_eq!(found, expected, "{filter:?}");
    match found {
        Searched::Found(events) => events,
        Searched::UnknownAfter => Vec::new(),
    }
}

fn filter() -> EventFilter {
    EventFilter {
        tenant_id: "t".into(),
        limit: 10_000,
        ..EventFilter::default()
    }
}

fn facet(name: &str, value: &str) -> (String, String) {
    (name.into(), value.into())
}

/// One filter per field, then combinations, bounds and cursors, each checked against the scan.
#[tokio::test]
async fn every_filter_answers_as_the_scan() {
    let written = written(true).await;
    let all = &written.events;
    let mine: Vec<&Event> = all.iter().filter(|e| e.tenant_id == "t").collect();
    let middle = mine[mine.len() / 2];
    let duplicate = &all
        .iter()
        .find(|e| e.span_id == "span-120-0")
        .unwrap()
        .event_id;
    let twice: Vec<&Event> = all.iter().filter(|e| e.event_id == *duplicate).collect();
    assert_eq!(twice.len(), 2);
    assert_ne!(twice[0].session_id, twice[1].session_id);
    let mut filters = vec![
        filter(),
        EventFilter {
            limit: 5,
            ..filter()
        },
        EventFilter {
            limit: 1,
            ..filter()
        },
        EventFilter {
            limit: 0,
            ..filter()
        },
        EventFilter {
            tenant_id: "other".into(),
            ..filter()
        },
        EventFilter {
            tenant_id: "nobody".into(),
            ..filter()
        },
        EventFilter {
            session_id: Some("s2".into()),
            ..filter()
        },
        EventFilter {
            session_id: Some("s9".into()),
            ..filter()
        },
        EventFilter {
            run_id: Some("r3".into()),
            ..filter()
        },
        EventFilter {
            types: vec!["tool.called".into(), "run.failed".into()],
            ..filter()
        },
        EventFilter {
            types: vec!["no.such.type".into()],
            ..filter()
        },
        EventFilter {
            categories: vec![Category::Model],
            ..filter()
        },
        EventFilter {
            categories: vec![Category::Tool, Category::Run],
            limit: 20,
            ..filter()
        },
        EventFilter {
            statuses: vec![EventStatus::Error],
            ..filter()
        },
        EventFilter {
            statuses: vec![EventStatus::Ok, EventStatus::Warning],
            ..filter()
        },
        EventFilter {
            agent: Some("autre".into()),
            ..filter()
        },
        EventFilter {
            agents: Some(vec!["calc".into()]),
            ..filter()
        },
        EventFilter {
            agents: Some(vec!["calc".into(), "autre".into()]),
            ..filter()
        },
        EventFilter {
            agents: Some(Vec::new()),
            ..filter()
        },
        EventFilter {
            role: Some("main".into()),
            ..filter()
        },
        EventFilter {
            facets: vec![facet("tool_name", "add")],
            ..filter()
        },
        EventFilter {
            facets: vec![facet("model", "fast"), facet("model_id", "gpt-x")],
            ..filter()
        },
        EventFilter {
            facets: vec![facet("model_id", "gpt-x")],
            ..filter()
        },
        // A facet that is a number or a boolean is no string: it never matches.
        EventFilter {
            facets: vec![facet("attempt", "1")],
            ..filter()
        },
        EventFilter {
            facets: vec![facet("is_error", "true")],
            ..filter()
        },
        // Names that a JSON path would read otherwise are only keys.
        EventFilter {
            facets: vec![facet("$.tool_name", "add")],
            ..filter()
        },
        EventFilter {
            facets: vec![facet("tool_name' OR 1=1 --", "add")],
            ..filter()
        },
        EventFilter {
            facets: vec![facet("tool_name", "add' OR '1'='1")],
            ..filter()
        },
        EventFilter {
            since: Some(middle.ts),
            ..filter()
        },
        EventFilter {
            until: Some(middle.ts),
            ..filter()
        },
        // Bounds finer than the journal's microseconds.
        EventFilter {
            since: Some(middle.ts + TimeDelta::nanoseconds(1)),
            ..filter()
        },
        EventFilter {
            until: Some(middle.ts + TimeDelta::nanoseconds(1)),
            ..filter()
        },
        EventFilter {
            since: Some(middle.ts - TimeDelta::nanoseconds(999)),
            until: Some(middle.ts + TimeDelta::nanoseconds(999)),
            ..filter()
        },
        // Bounds beyond any year the journal can hold.
        EventFilter {
            since: Some(DateTime::<Utc>::MIN_UTC),
            until: Some(DateTime::<Utc>::MAX_UTC),
            ..filter()
        },
        EventFilter {
            since: Some(DateTime::<Utc>::MAX_UTC),
            ..filter()
        },
        EventFilter {
            until: Some(DateTime::<Utc>::MIN_UTC),
            ..filter()
        },
        EventFilter {
            session_id: Some("s1".into()),
            types: vec!["tool.completed".into()],
            statuses: vec![EventStatus::Error],
            facets: vec![facet("tool_name", "mul")],
            ..filter()
        },
        EventFilter {
            run_id: Some("r1".into()),
            agent: Some("calc".into()),
            role: Some("critic".into()),
            since: Some(mine[10].ts),
            until: Some(mine[mine.len() - 10].ts),
            ..filter()
        },
        EventFilter {
            after: Some(middle.event_id.clone()),
            limit: 7,
            ..filter()
        },
        EventFilter {
            after: Some(middle.event_id.clone()),
            session_id: Some(middle.session_id.clone()),
            ..filter()
        },
        // The cursor names an event of another session than the one searched.
        EventFilter {
            after: Some(middle.event_id.clone()),
            session_id: Some(
                SESSIONS
                    .iter()
                    .find(|s| **s != middle.session_id)
                    .unwrap()
                    .to_string(),
            ),
            ..filter()
        },
        EventFilter {
            after: Some("no-such-event".into()),
            ..filter()
        },
        // An event of another tenant is no cursor.
        EventFilter {
            after: Some(
                all.iter()
                    .find(|e| e.tenant_id == "other")
                    .unwrap()
                    .event_id
                    .clone(),
            ),
            ..filter()
        },
        // An id written twice: the cursor is its first event.
        EventFilter {
            after: Some(duplicate.clone()),
            ..filter()
        },
        EventFilter {
            after: Some(duplicate.clone()),
            session_id: Some(twice[1].session_id.clone()),
            ..filter()
        },
        EventFilter {
            after: Some(mine.last().unwrap().event_id.clone()),
            ..filter()
        },
        EventFilter {
            after: Some(middle.event_id.clone()),
            types: vec!["model.retried".into()],
            since: Some(mine[5].ts),
            limit: 3,
            ..filter()
        },
    ];
    // Generated combinations of every field.
    let mut dice = Dice(11);
    let types = [
        "run.started",
        "tool.called",
        "tool.completed",
        "model.retried",
        "run.failed",
        "run.cancelled",
        "run.claimed",
    ];
    let all_ids: Vec<&str> = all.iter().map(|e| e.event_id.as_str()).collect();
    for _ in 0..400 {
        let instant = |dice: &mut Dice| {
            let ts = dice.pick(&mine).ts;
            match dice.below(4) {
                0 => ts - TimeDelta::nanoseconds(1),
                1 => ts + TimeDelta::nanoseconds(1),
                2 => ts + TimeDelta::microseconds(1),
                _ => ts,
            }
        };
        filters.push(EventFilter {
            tenant_id: if dice.one_in(8) { "other" } else { "t" }.into(),
            session_id: dice.one_in(4).then(|| dice.pick(&SESSIONS).to_string()),
            run_id: dice.one_in(4).then(|| dice.pick(&RUNS).to_string()),
            types: dice
                .some_of(&types)
                .into_iter()
                .map(str::to_owned)
                .collect(),
            categories: dice.some_of(&[Category::Run, Category::Tool, Category::Model]),
            statuses: dice.some_of(&[EventStatus::Ok, EventStatus::Warning, EventStatus::Error]),
            agent: dice
                .one_in(5)
                .then(|| dice.pick(&AGENTS).unwrap_or("nobody").to_owned()),
            agents: dice.one_in(5).then(|| {
                dice.some_of(&["calc", "autre"])
                    .into_iter()
                    .map(str::to_owned)
                    .collect()
            }),
            role: dice
                .one_in(5)
                .then(|| dice.pick(&ROLES).unwrap_or("nobody").to_owned()),
            facets: dice.some_of(&[
                facet("tool_name", "add"),
                facet("tool_name", "mul"),
                facet("model_id", "gpt-x"),
                facet("model", "fast"),
                facet("model", "slow"),
            ]),
            since: dice.one_in(3).then(|| instant(&mut dice)),
            until: dice.one_in(3).then(|| instant(&mut dice)),
            after: dice.one_in(3).then(|| dice.pick(&all_ids).to_string()),
            limit: if dice.one_in(2) {
                1 + dice.below(20)
            } else {
                10_000
            },
        });
    }
    let mut found = 0;
    let mut unknown = 0;
    for filter in &filters {
        match scan(all, filter) {
            Searched::Found(events) => found += events.len(),
            Searched::UnknownAfter => unknown += 1,
        }
        agrees(&written, filter).await;
    }
    // The filters are not vacuous: they find events, and some cursors are unknown.
    assert!(found > 2_000, "{found}");
    assert!(unknown > 5, "{unknown}");
}

/// Paging with `after` set to the last event of each page gives the whole answer, in order,
/// with or without a filter (event ids being unique: a cursor names the first event of its id).
#[tokio::test]
async fn pages_follow_each_other() {
    let written = written(false).await;
    for whole in [
        filter(),
        EventFilter {
            types: vec!["tool.called".into(), "model.retried".into()],
            ..filter()
        },
        EventFilter {
            session_id: Some("s3".into()),
            ..filter()
        },
        EventFilter {
            agents: Some(vec!["calc".into()]),
            since: Some(start() + TimeDelta::milliseconds(100)),
            ..filter()
        },
    ] {
        let everything = agrees(&written, &whole).await;
        assert!(everything.len() > 10, "{whole:?}");
        for size in [1, 7, 13] {
            let mut paged = Vec::new();
            let mut after = None;
            for _ in 0..=everything.len() {
                let page = agrees(
                    &written,
                    &EventFilter {
                        after: after.clone(),
                        limit: size,
                        ..whole.clone()
                    },
                )
                .await;
                let Some(last) = page.last() else { break };
                after = Some(last.event_id.clone());
                paged.extend(page);
                assert!(paged.len() <= everything.len(), "{whole:?} by {size}");
            }
            assert_eq!(paged, everything, "{whole:?} by {size}");
        }
    }
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
