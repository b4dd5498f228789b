//! The reads pushed down to the store: on PostgreSQL, `Loom::query` is answered by one indexed
//! SQL query (`EventStore::search`) and `Loom::runs` reads the sessions the store's index
//! names (`EventStore::recent_sessions`); the same journal read through a store that does not
//! answer (the scan of the sessions) gives the same events, filter by filter, page by page,
//! and the same runs.
//!
//! Needs `LOOM_TEST_POSTGRES` (skipped without it, failed under `LOOM_REQUIRE_SERVICES=1`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use loom_ia::{
    EventQuery, Loom, LoomError, RunOptions, RunQuery, RunStatus,
    config::{AgentSpec, Config, LoomConfig, ModelSpec, Sdk, ToolRef},
    core::{
        BoxFuture, Category, Event, EventStatus,
        ports::{EventStore, Salvage, SessionSummary, SetAside, StoreError},
        search::{EventFilter, RecentSessions, Searched},
    },
};
use loom_postgres::{PgDatabase, PgOptions, PgStore, PoolSettings};
use serde_json::json;

/// Adds two numbers.
#[loom_ia::tool]
fn add(a: f64, b: f64) -> String {
    format!("{}", a + b)
}

/// The PostgreSQL journal, counting the searches it answered; with `answer` off it declines
/// them, so that `Loom::query` scans the sessions as on any other journal.
#[derive(Debug)]
struct Journal {
    inner: PgStore,
    answer: bool,
    answered: AtomicUsize,
}

impl EventStore for Journal {
    fn append(
        &self,
        batch: Vec<Event>,
        expected: u64,
    ) -> BoxFuture<'_, Result<Vec<Event>, StoreError>> {
        self.inner.append(batch, expected)
    }
    fn read<'a>(
        &'a self,
        t: &'a str,
        s: &'a str,
        after: u64,
    ) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        self.inner.read(t, s, after)
    }
    fn last_seq<'a>(&'a self, t: &'a str, s: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.inner.last_seq(t, s)
    }
    fn sessions<'a>(
        &'a self,
        t: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SessionSummary>, StoreError>> {
        self.inner.sessions(t)
    }
    fn delete<'a>(&'a self, t: &'a str, s: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.inner.delete(t, s)
    }
    fn find_run<'a>(
        &'a self,
        t: &'a str,
        r: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
        self.inner.find_run(t, r)
    }
    fn salvage<'a>(&'a self, t: &'a str, s: &'a str) -> BoxFuture<'a, Result<Salvage, StoreError>> {
        self.inner.salvage(t, s)
    }
    fn set_aside<'a>(
        &'a self,
        t: &'a str,
        s: &'a str,
        lines: Vec<SetAside>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.set_aside(t, s, lines)
    }
    fn recent_sessions<'a>(
        &'a self,
        t: &'a str,
        since: Option<chrono::DateTime<chrono::Utc>>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Option<RecentSessions>, StoreError>> {
        Box::pin(async move {
            if !self.answer {
                return Ok(None);
            }
            let found = self.inner.recent_sessions(t, since, limit).await?;
            if found.is_some() {
                self.answered.fetch_add(1, Ordering::SeqCst);
            }
            Ok(found)
        })
    }
    fn search<'a>(
        &'a self,
        filter: &'a EventFilter,
    ) -> BoxFuture<'a, Result<Option<Searched>, StoreError>> {
        Box::pin(async move {
            if !self.answer {
                return Ok(None);
            }
            let found = self.inner.search(filter).await?;
            if found.is_some() {
                self.answered.fetch_add(1, Ordering::SeqCst);
            }
            Ok(found)
        })
    }
}

fn config(dir: &std::path::Path) -> Config {
    let mut model = ModelSpec::new("fake-1", Sdk::Fake, "FAKE");
    model.params.insert(
        "script".into(),
        json!([
            {"text": "Je calcule.", "tool_calls": [{"name": "add", "arguments": {"a": 12, "b": 30}}]},
            {"text": "Résultat : {{ tool_result }}."}
        ]),
    );
    let mut calc = AgentSpec::new("calc", "fake-1");
    calc.main.system = "Tu calcules avec les outils.".into();
    calc.tools = vec![ToolRef::new("add")];
    let mut other = AgentSpec::new("autre", "fake-1");
    other.main.system = "Tu calcules aussi.".into();
    other.tools = vec![ToolRef::new("add")];
    let raw = LoomConfig {
        models: vec![model],
        agents: vec![calc, other],
        ..LoomConfig::default()
    };
    Config::new(raw, dir.to_path_buf()).unwrap()
}

fn loom(dir: &std::path::Path, journal: Arc<Journal>) -> Loom {
    let loom = Loom::with_store(config(dir), journal).unwrap();
    loom.register("add", add_tool()).unwrap();
    loom
}

async fn both(sql: &Loom, scan: &Loom, query: &EventQuery) -> Vec<Event> {
    let pushed = sql.query(query).await;
    let scanned = scan.query(query).await;
    match (pushed, scanned) {
        (Ok(pushed), Ok(scanned)) => {
            assert_eq!(
                pushed.iter().map(|e| &e.event_id).collect::<Vec<_>>(),
                scanned.iter().map(|e| &e.event_id).collect::<Vec<_>>(),
                "{query:?}"
            );
            assert_eq!(pushed, scanned, "{query:?}");
            pushed
        }
        (
            Err(LoomError::InvalidQuery {
                parameter: a,
                reason: ra,
            }),
            Err(LoomError::InvalidQuery {
                parameter: b,
                reason: rb,
            }),
        ) => {
            assert_eq!((a, ra), (b, rb));
            Vec::new()
        }
        other => panic!("{query:?}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_reads_and_the_scan_agree() {
    let Some(db) = loom_testkit::postgres::TestDb::create("the_sql_reads_and_the_scan_agree")
    else {
        return;
    };
    let handle = PgDatabase::new(&PgOptions {
        dsn: db.url(),
        role: db.role().to_owned(),
        pool: PoolSettings {
            min_size: 1,
            max_size: 4,
            ..PoolSettings::default()
        },
    })
    .unwrap();
    handle.migrate().await.unwrap();
    let journal = |answer| {
        Arc::new(Journal {
            inner: PgStore::new(handle.clone()),
            answer,
            answered: AtomicUsize::new(0),
        })
    };
    let (pushed, scanned) = (journal(true), journal(false));
    let dir = tempfile::tempdir().unwrap();
    let sql = loom(dir.path(), pushed.clone());
    let scan = loom(dir.path(), scanned.clone());

    // Runs one after another: two agents, two sessions continued, runs on their own.
    let mut runs = Vec::new();
    for (agent, session) in [
        ("calc", Some("s1")),
        ("autre", None),
        ("calc", Some("s2")),
        ("calc", Some("s1")),
        ("autre", Some("s3")),
        ("calc", None),
    ] {
        let options = RunOptions {
            session_id: session.map(str::to_owned),
            ..RunOptions::default()
        };
        runs.push(
            sql.run(agent, "Combien font 12 + 30 ?", options)
                .await
                .unwrap(),
        );
    }
    let middle = sql
        .query(&EventQuery {
            limit: 10_000,
            ..EventQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(middle.len(), 6 * 17);
    let since = middle[40].ts;

    let queries = event_queries(&runs, &middle);
    for query in &queries {
        both(&sql, &scan, query).await;
    }
    // Paging through everything, 13 at a time, gives the whole journal in order.
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = both(
            &sql,
            &scan,
            &EventQuery {
                after: after.clone(),
                limit: 13,
                ..EventQuery::default()
            },
        )
        .await;
        let Some(last) = page.last() else { break };
        after = Some(last.event_id.clone());
        paged.extend(page);
    }
    assert_eq!(paged, middle);
    // The run list reads the same sessions, whoever names them.
    let answered = pushed.answered.load(Ordering::SeqCst);
    let run_queries = run_queries(since);
    for query in &run_queries {
        let pushed_page = sql.runs(query).await.unwrap();
        let scanned_page = scan.runs(query).await.unwrap();
        assert_eq!(pushed_page, scanned_page, "{query:?}");
    }
    assert_eq!(sql.runs(&RunQuery::default()).await.unwrap().runs.len(), 6);
    let two = sql
        .runs(&RunQuery {
            sessions: 2,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert_eq!((two.scanned, two.truncated), (2, true));
    assert_eq!(
        pushed.answered.load(Ordering::SeqCst),
        answered + run_queries.len() + 2
    );
    // Every read of the pushed-down side was answered by the store, none of the other's.
    assert!(answered >= queries.len());
    assert_eq!(scanned.answered.load(Ordering::SeqCst), 0);
}

/// Event searches covering every filter, a page, a cursor, an unknown cursor, another tenant.
fn event_queries(runs: &[loom_ia::RunResult], middle: &[Event]) -> Vec<EventQuery> {
    let since = middle[40].ts;
    vec![
        EventQuery::default(),
        EventQuery {
            limit: 5,
            ..EventQuery::default()
        },
        EventQuery {
            types: vec!["tool.called".into(), "run.completed".into()],
            ..EventQuery::default()
        },
        EventQuery {
            categories: vec![Category::Model],
            ..EventQuery::default()
        },
        EventQuery {
            statuses: vec![EventStatus::Ok],
            limit: 30,
            ..EventQuery::default()
        },
        EventQuery {
            agent: Some("autre".into()),
            ..EventQuery::default()
        },
        EventQuery {
            agents: Some(vec!["calc".into()]),
            limit: 1000,
            ..EventQuery::default()
        },
        EventQuery {
            agents: Some(Vec::new()),
            ..EventQuery::default()
        },
        EventQuery {
            role: Some("main".into()),
            ..EventQuery::default()
        },
        EventQuery {
            session_id: Some("s1".into()),
            ..EventQuery::default()
        },
        EventQuery {
            run_id: Some(runs[3].run_id.clone()),
            ..EventQuery::default()
        },
        EventQuery {
            tool_name: Some("add".into()),
            ..EventQuery::default()
        },
        EventQuery {
            model: Some("fake-1".into()),
            model_id: Some("FAKE".into()),
            ..EventQuery::default()
        },
        EventQuery {
            tool_name: Some("nope".into()),
            ..EventQuery::default()
        },
        EventQuery {
            since: Some(since),
            ..EventQuery::default()
        },
        EventQuery {
            until: Some(since),
            ..EventQuery::default()
        },
        EventQuery {
            after: Some(middle[50].event_id.clone()),
            limit: 7,
            ..EventQuery::default()
        },
        EventQuery {
            after: Some(middle[50].event_id.clone()),
            session_id: Some("s1".into()),
            ..EventQuery::default()
        },
        EventQuery {
            after: Some("no-such-event".into()),
            ..EventQuery::default()
        },
        EventQuery {
            tenant_id: Some("other".into()),
            ..EventQuery::default()
        },
    ]
}

/// Run lists covering every filter, fewer sessions than written, another tenant.
fn run_queries(since: chrono::DateTime<chrono::Utc>) -> Vec<RunQuery> {
    vec![
        RunQuery::default(),
        RunQuery {
            sessions: 2,
            ..RunQuery::default()
        },
        RunQuery {
            limit: 3,
            ..RunQuery::default()
        },
        RunQuery {
            agent: Some("autre".into()),
            ..RunQuery::default()
        },
        RunQuery {
            since: Some(since),
            ..RunQuery::default()
        },
        RunQuery {
            since: Some(since),
            sessions: 1,
            ..RunQuery::default()
        },
        RunQuery {
            until: Some(since),
            ..RunQuery::default()
        },
        RunQuery {
            statuses: vec![RunStatus::Completed],
            ..RunQuery::default()
        },
        RunQuery {
            tenant_id: Some("other".into()),
            ..RunQuery::default()
        },
    ]
}
