//! The event search every store that answers [`EventStore::search`] from its indexes must
//! agree with: a journal generated with a fixed seed ([`fill`]: five sessions, four runs,
//! agents, roles, facets, timestamps that go back in time or repeat, one event id written
//! twice), the filters ([`filters`]: one per field, combinations, bounds finer than a
//! microsecond, cursors, 400 generated ones) and the expected answers computed by a scan of the
//! journal in the store's write order ([`scan`]), never written down.
//!
//! Each store gives its write order: the order of the appends (SQLite, PostgreSQL), or the
//! JSONL store's (each session's order, sessions interleaved by time).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::missing_panics_doc)]

use std::collections::HashMap;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use loom_core::{
    event::{Category, Envelope, Event, EventStatus, Payload},
    ports::EventStore,
    search::{EventFilter, Searched},
};
use serde_json::json;

/// A small deterministic generator (a linear congruential one): the same journal and filters
/// at every run.
#[derive(Debug)]
pub struct Dice(pub u64);

impl Dice {
    /// The next number.
    pub fn roll(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.roll() % n as u64) as usize
    }

    /// One in `n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Some of `items` (possibly none), in their order.
    pub fn some_of<T: Clone>(&mut self, items: &[T]) -> Vec<T> {
        items.iter().filter(|_| self.one_in(3)).cloned().collect()
    }
}

/// The instant the generated journal starts at.
pub fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap()
}

/// The sessions of the generated journal.
pub const SESSIONS: [&str; 5] = ["s1", "s2", "s3", "s4", "s5"];
/// Its runs.
pub const RUNS: [&str; 4] = ["r1", "r2", "r3", "r4"];
/// Its agents.
pub const AGENTS: [Option<&str>; 3] = [Some("calc"), Some("autre"), None];
/// Its roles.
pub const ROLES: [Option<&str>; 3] = [None, Some("main"), Some("critic")];
/// Its tools.
pub const TOOLS: [&str; 2] = ["add", "mul"];
/// Its models (`model_id`, `model`).
pub const MODELS: [(&str, Option<&str>); 3] = [
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

/// Fills `store`: 150 appends of 1 to 3 events, in tenant `t` mostly (some in `other`), over
/// five sessions, four runs, three agents and roles; timestamps mostly follow the writes but
/// some go back in time, some repeat one already written, some are finer than a millisecond;
/// with `twice`, one event id is written twice (in two sessions of `t`).
pub async fn fill(store: &dyn EventStore, twice: bool) -> Vec<Event> {
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
    events
}

/// The scan: the tenant's events of `written` (in the store's write order), from the one after the first event `after`
/// names (in `session_id` when given), those passing `EventFilter::matches`, at most `limit`.
pub fn scan(written: &[Event], filter: &EventFilter) -> Searched {
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

/// A search of tenant `t` with no filter and a limit of 10,000.
pub fn filter() -> EventFilter {
    EventFilter {
        tenant_id: "t".into(),
        limit: 10_000,
        ..EventFilter::default()
    }
}

/// A facet filter.
pub fn facet(name: &str, value: &str) -> (String, String) {
    (name.into(), value.into())
}

/// The filters every store is checked with: one per field, then combinations, bounds and
/// cursors, then 400 generated combinations of every field, for a journal [`fill`]ed with
/// `twice` (`all`: what it returned).
pub fn filters(all: &[Event]) -> Vec<EventFilter> {
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
    filters
}

/// The searches paged through by [`assert_pages`].
pub fn paged_filters() -> Vec<EventFilter> {
    vec![
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
    ]
}

/// What `store` answers to `filter`; panics when it declines.
pub async fn search(store: &dyn EventStore, filter: &EventFilter) -> Searched {
    store
        .search(filter)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("the store declined {filter:?}"))
}

/// Asserts that `store` answers `filter` as the scan of `ordered` (the journal in the store's
/// write order) does; gives the events found.
pub async fn agrees(store: &dyn EventStore, ordered: &[Event], filter: &EventFilter) -> Vec<Event> {
    let expected = scan(ordered, filter);
    let found = search(store, filter).await;
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

/// Every filter of [`filters`] answers as the scan; the filters are not vacuous (they find
/// events, and some cursors are unknown). `ordered`: the journal [`fill`]ed with `twice`, in
/// the store's write order.
pub async fn assert_every_filter(store: &dyn EventStore, ordered: &[Event]) {
    let mut found = 0;
    let mut unknown = 0;
    for filter in &filters(ordered) {
        match scan(ordered, filter) {
            Searched::Found(events) => found += events.len(),
            Searched::UnknownAfter => unknown += 1,
        }
        agrees(store, ordered, filter).await;
    }
    assert!(found > 2_000, "{found}");
    assert!(unknown > 5, "{unknown}");
}

/// Paging with `after` set to the last event of each page gives the whole answer, in order,
/// with or without a filter (event ids being unique: a journal [`fill`]ed without `twice`).
pub async fn assert_pages(store: &dyn EventStore, ordered: &[Event]) {
    for whole in paged_filters() {
        let everything = agrees(store, ordered, &whole).await;
        assert!(everything.len() > 10, "{whole:?}");
        for size in [1, 7, 13] {
            let mut paged = Vec::new();
            let mut after = None;
            for _ in 0..=everything.len() {
                let page = agrees(
                    store,
                    ordered,
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
