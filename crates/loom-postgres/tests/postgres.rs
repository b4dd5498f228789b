//! The PostgreSQL journal through the `EventStore` port: the shared conformance suite (each
//! test on a fresh database), then what only the database shows: the schema and its checks,
//! verbatim rows, corrupted rows, set-aside rows, racing writers in several processes and
//! behind the session lock's back, the idempotency keys and the artifacts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{
    process::{Command, Stdio},
    sync::Arc,
};

use loom_core::{
    event::{Envelope, Event, EventReadError, Payload, SessionRepaired},
    ports::{
        ArtifactStore, EventStore, IdempotencyScope, IdempotencyStore, Reservation, SetAside,
        StoreError,
    },
    tool::ToolOutput,
};
use loom_postgres::{PgArtifacts, PgError, PgIdempotency, PgStore, schema};
use loom_testkit::conformance::{assert_invalid, event, events, nested, seqs, started};
use sqlx::{Connection, Executor, PgConnection, Row};
use support::TestDb;

// A fresh `PgStore` (its own pool) for every handle, as another process would have.
loom_testkit::store_conformance!(conformance, {
    let Some((db, _)) = TestDb::migrated().await else {
        return;
    };
    let options = db.options();
    (db, move || {
        let handle = loom_postgres::PgDatabase::new(&options).unwrap();
        Arc::new(PgStore::new(handle)) as Arc<dyn EventStore>
    })
});

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_start_is_answered_from_the_run_index() {
    let Some((db, _)) = TestDb::migrated().await else {
        return;
    };
    let options = db.options();
    let open = move || {
        let handle = loom_postgres::PgDatabase::new(&options).unwrap();
        Arc::new(PgStore::new(handle)) as Arc<dyn EventStore>
    };
    loom_testkit::conformance::run_start_is_indexed(&open).await;
}

// A fresh `PgIdempotency` (its own pool) for every handle, as another process would have.
loom_testkit::idempotency_conformance!(idempotency, {
    let Some((db, _)) = TestDb::migrated().await else {
        return;
    };
    let options = db.options();
    (db, move || {
        let handle = loom_postgres::PgDatabase::new(&options).unwrap();
        Arc::new(PgIdempotency::new(handle)) as Arc<dyn IdempotencyStore>
    })
});

/// Runs one statement as the owner of the tables, behind the store's back.
async fn tamper(conn: &mut PgConnection, sql: &'static str) {
    conn.execute(sql).await.unwrap();
}

#[tokio::test]
async fn migrate_is_idempotent_and_check_names_what_is_missing() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let handle = db.database();
    match handle.check().await {
        Err(PgError::SchemaMissing { component, version }) => {
            assert_eq!((component.as_str(), version), ("events", 1));
        }
        other => panic!("expected a missing schema, got {other:?}"),
    }
    let message = handle.check().await.unwrap_err().to_string();
    assert!(message.contains("loom storage sql"), "{message}");
    assert!(message.contains("storage.migrate: auto"), "{message}");

    let applied = handle.migrate().await.unwrap();
    assert_eq!(
        applied,
        [
            "events v1",
            "idempotency v1",
            "artifacts v1",
            "events v2",
            "events v3"
        ]
    );
    assert!(handle.migrate().await.unwrap().is_empty(), "applied twice");
    handle.check().await.unwrap();

    // Several processes starting at once apply it once (the advisory lock).
    let again: Vec<_> = (0..3)
        .map(|_| {
            let handle = db.database();
            tokio::spawn(async move { handle.migrate().await })
        })
        .collect();
    for task in again {
        assert!(task.await.unwrap().unwrap().is_empty());
    }

    // One migration removed: check names it.
    let mut owner = db.owner().await;
    tamper(
        &mut owner,
        "DELETE FROM loom_schema WHERE component = 'artifacts'",
    )
    .await;
    match handle.check().await {
        Err(PgError::SchemaMissing { component, .. }) => assert_eq!(component, "artifacts"),
        other => panic!("expected artifacts missing, got {other:?}"),
    }
    // A version this build does not know is refused, by check and by migrate.
    tamper(
        &mut owner,
        "INSERT INTO loom_schema (component, version) VALUES ('events', 99)",
    )
    .await;
    assert!(matches!(
        handle.check().await,
        Err(PgError::NewerSchema { version: 99, .. })
    ));
    assert!(matches!(
        handle.migrate().await,
        Err(PgError::NewerSchema { .. })
    ));
}

/// `last_of_type` is one row of the index by session and type (events v3), whatever the
/// session's length: the planner reaches it through `loom_events_session_type`.
#[tokio::test]
async fn the_last_event_of_a_type_is_read_through_its_index() {
    let Some((db, handle)) = TestDb::migrated().await else {
        return;
    };
    let store = PgStore::new(handle);
    store
        .append(vec![started("t", "s", "r1", serde_json::Map::new())], 0)
        .await
        .unwrap();
    store.append(events("t", "s", 50), 1).await.unwrap();
    let found = store
        .last_of_type("t", "s", "run.started", u64::MAX)
        .await
        .unwrap();
    assert_eq!(found.map(|e| e.seq), Some(1));
    let mut owner = db.owner().await;
    // Without it, so few rows would be read by a sequential scan.
    tamper(&mut owner, "SET enable_seqscan = off").await;
    let plan: Vec<String> = sqlx::query(
        "EXPLAIN SELECT seq, event FROM loom_events \
         WHERE tenant_id = 't' AND session_id = 's' AND type = 'run.started' AND seq < 99 \
         ORDER BY seq DESC LIMIT 1",
    )
    .fetch_all(&mut owner)
    .await
    .unwrap()
    .iter()
    .map(|row| row.try_get::<String, _>(0).unwrap())
    .collect();
    assert!(
        plan.iter()
            .any(|line| line.contains("loom_events_session_type")),
        "{plan:?}"
    );
}

/// A database at events v1 (before the index of sessions) holding journals is migrated to v2:
/// the index is filled from every tenant's journal, and the sessions list as before.
#[tokio::test]
async fn events_v2_fills_the_index_of_sessions_from_the_journal() {
    let Some((db, handle)) = TestDb::migrated().await else {
        return;
    };
    let store = PgStore::new(handle.clone());
    store.append(events("t", "old", 3), 0).await.unwrap();
    store.append(events("t", "new", 2), 0).await.unwrap();
    store.append(events("u", "other", 1), 0).await.unwrap();
    let before = store.sessions("t").await.unwrap();
    let mut owner = db.owner().await;
    tamper(&mut owner, "DROP TABLE loom_sessions").await;
    tamper(
        &mut owner,
        "DELETE FROM loom_schema WHERE component = 'events' AND version = 2",
    )
    .await;
    assert!(matches!(
        handle.check().await,
        Err(PgError::SchemaMissing { version: 2, .. })
    ));
    assert_eq!(handle.migrate().await.unwrap(), ["events v2"]);
    assert_eq!(store.sessions("t").await.unwrap(), before);
    let listed: Vec<(String, i64)> =
        sqlx::query_as("SELECT session_id, last_seq FROM loom_sessions ORDER BY session_id")
            .fetch_all(&mut owner)
            .await
            .unwrap();
    assert_eq!(
        listed,
        [("new".into(), 2), ("old".into(), 3), ("other".into(), 1)]
    );
    // The journal's policy is forced again.
    let forced: bool = sqlx::query_scalar(
        "SELECT relforcerowsecurity FROM pg_class WHERE relname = 'loom_events'",
    )
    .fetch_one(&mut owner)
    .await
    .unwrap();
    assert!(forced);
}

#[tokio::test]
async fn the_printed_sql_is_the_schema_migrate_applies() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let text = schema::sql(&db.role).unwrap();
    let mut owner = db.owner().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(text.clone()))
        .execute(&mut owner)
        .await
        .unwrap();
    let handle = db.database();
    handle.check().await.unwrap();
    assert!(handle.migrate().await.unwrap().is_empty());
    let store = PgStore::new(handle);
    assert_eq!(
        seqs(&store.append(events("t", "s", 2), 0).await.unwrap()),
        [1, 2]
    );
    store.append(events("u", "s", 1), 0).await.unwrap();
    // Applying it again, over journals, changes nothing.
    sqlx::raw_sql(sqlx::AssertSqlSafe(text))
        .execute(&mut owner)
        .await
        .unwrap();
    assert_eq!(store.sessions("t").await.unwrap().len(), 1);
    assert_eq!(
        seqs(&store.append(events("t", "s", 1), 2).await.unwrap()),
        [3]
    );
    let forced: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class WHERE relname LIKE 'loom_%' AND relkind = 'r' \
         AND relname <> 'loom_schema' AND relforcerowsecurity AND relrowsecurity",
    )
    .fetch_one(&mut owner)
    .await
    .unwrap();
    assert_eq!(
        forced, 5,
        "every table holding tenant data has its policy forced"
    );
}

#[tokio::test]
async fn connections_run_as_the_role_with_the_timeouts() {
    let Some((db, handle)) = TestDb::migrated().await else {
        return;
    };
    let mut conn = handle.pool().acquire().await.unwrap();
    let row = sqlx::query(
        "SELECT current_user::text, current_setting('statement_timeout'), \
         current_setting('lock_timeout'), \
         (SELECT rolsuper FROM pg_roles WHERE rolname = current_user), \
         (SELECT tableowner::text FROM pg_tables WHERE tablename = 'loom_events')",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!(row.get::<String, _>(0), db.role);
    assert_eq!(row.get::<String, _>(1), "1min");
    assert_eq!(row.get::<String, _>(2), "10s");
    assert!(!row.get::<bool, _>(3), "the role is a superuser");
    assert_ne!(
        row.get::<String, _>(4),
        db.role,
        "the role owns the journal"
    );
    // Outside a transaction of Loom's, no tenant is set.
    let tenant: Option<String> =
        sqlx::query_scalar("SELECT current_setting('loom.tenant_id', true)")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    assert!(tenant.unwrap_or_default().is_empty());
}

/// A role the DSN's user cannot switch to is refused when the schema is checked, before any
/// connection of the pool needs it.
#[tokio::test]
async fn a_role_the_user_cannot_take_is_refused_at_check() {
    let Some((db, _)) = TestDb::migrated().await else {
        return;
    };
    let other =
        loom_postgres::PgDatabase::new(&db.options().with_role("loom_no_such_role_x")).unwrap();
    match other.check().await {
        Err(err @ PgError::Role { .. }) => {
            let message = err.to_string();
            assert!(
                message.contains("cannot SET ROLE loom_no_such_role_x"),
                "{message}"
            );
        }
        other => panic!("expected a role refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_bad_dsn_role_or_pool_is_refused_without_repeating_the_dsn() {
    use loom_postgres::{PgDatabase, PgOptions, PoolSettings};
    let err = PgDatabase::new(&PgOptions::new("mysql://user:s3cret@h/db")).unwrap_err();
    assert!(matches!(err, PgError::Dsn));
    assert!(!err.to_string().contains("s3cret"));
    let err =
        PgDatabase::new(&PgOptions::new("postgres://h/db").with_role("Bad-Role")).unwrap_err();
    assert!(matches!(err, PgError::InvalidRole(_)));
    let mut options = PgOptions::new("postgres://h/db");
    options.pool = PoolSettings {
        min_size: 5,
        max_size: 2,
        ..PoolSettings::default()
    };
    assert!(matches!(PgDatabase::new(&options), Err(PgError::Pool(_))));
    assert!(!format!("{options:?}").contains("postgres://h/db"));
}

#[tokio::test]
async fn rows_hold_the_event_line_verbatim_and_its_envelope() {
    let Some((db, handle)) = TestDb::migrated().await else {
        return;
    };
    let store = PgStore::new(handle);
    let written = store.append(events("t", "s", 2), 0).await.unwrap();
    let mut owner = db.owner().await;
    let rows = sqlx::query(
        "SELECT tenant_id, session_id, seq, event_id, \
         to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS ts, run_id, \
         root_run_id, type, category, status, agent, role, facets::text AS facets, event, \
         ingested FROM loom_events ORDER BY seq",
    )
    .fetch_all(&mut owner)
    .await
    .unwrap();
    assert_eq!(rows.len(), 2);
    let mut last_ingested = 0;
    for (row, event) in rows.iter().zip(&written) {
        let text = |name: &str| row.try_get::<Option<String>, _>(name).unwrap();
        assert_eq!(text("event").unwrap(), event.to_json());
        assert_eq!(text("tenant_id").unwrap(), "t");
        assert_eq!(text("session_id").unwrap(), "s");
        assert_eq!(row.get::<i64, _>("seq") as u64, event.seq);
        assert_eq!(text("event_id").unwrap(), event.event_id);
        assert_eq!(
            text("ts").unwrap(),
            event
                .ts
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        );
        assert_eq!(text("run_id").unwrap(), event.run_id);
        assert_eq!(text("root_run_id").unwrap(), event.root_run_id);
        assert_eq!(text("type").unwrap(), "run.claimed");
        assert_eq!(text("category").unwrap(), "run");
        assert_eq!(text("status").unwrap(), "ok");
        assert_eq!(text("agent").unwrap(), "demo");
        assert_eq!(text("role"), None);
        let facets: serde_json::Value = serde_json::from_str(&text("facets").unwrap()).unwrap();
        assert_eq!(facets, serde_json::Value::Object(event.facets.clone()));
        let ingested: i64 = row.get("ingested");
        assert!(ingested > last_ingested);
        last_ingested = ingested;
    }
}

fn corrupted<T: std::fmt::Debug>(
    result: Result<T, StoreError>,
    db: &TestDb,
    session: &str,
    line: usize,
) -> EventReadError {
    match result {
        Err(StoreError::Corrupted {
            path,
            line: at,
            source,
        }) => {
            assert!(
                path.ends_with(&format!("/{} (t/{session})", db.name)),
                "{path}"
            );
            assert_eq!(at, line);
            source
        }
        other => panic!("expected corruption at seq {line}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_bad_row_is_reported_naming_it_and_never_skipped() {
    let Some((db, handle)) = TestDb::migrated().await else {
        return;
    };
    let store = PgStore::new(handle);
    store.append(events("t", "bad", 4), 0).await.unwrap();
    let healthy = store.append(events("t", "good", 2), 0).await.unwrap();
    let mut owner = db.owner().await;

    tamper(
        &mut owner,
        "UPDATE loom_events SET event = 'not json' WHERE session_id = 'bad' AND seq = 2",
    )
    .await;
    let source = corrupted(store.read("t", "bad", 0).await, &db, "bad", 2);
    assert!(matches!(source, EventReadError::Json(_)), "{source}");
    assert_eq!(seqs(&store.read("t", "bad", 2).await.unwrap()), [3, 4]);

    tamper(
        &mut owner,
        "UPDATE loom_events SET event = replace(event, '\"status\":\"ok\"', '\"status\":\"error\"') \
         WHERE session_id = 'bad' AND seq = 4",
    )
    .await;
    let source = corrupted(store.last_seq("t", "bad").await, &db, "bad", 4);
    assert!(matches!(
        source,
        EventReadError::Inconsistent {
            field: "status",
            ..
        }
    ));
    let listed: Vec<String> = store
        .sessions("t")
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.session_id)
        .collect();
    assert_eq!(listed, ["good"]);

    // A row of another journal.
    tamper(
        &mut owner,
        "UPDATE loom_events SET event = (SELECT event FROM loom_events \
         WHERE session_id = 'good' AND seq = 1) WHERE session_id = 'bad' AND seq = 1",
    )
    .await;
    let source = corrupted(store.read("t", "bad", 0).await, &db, "bad", 1);
    assert!(source.to_string().contains("t/good"), "{source}");

    // A gap in the seqs.
    store.append(events("t", "gap", 3), 0).await.unwrap();
    tamper(
        &mut owner,
        "DELETE FROM loom_events WHERE session_id = 'gap' AND seq = 2",
    )
    .await;
    let source = corrupted(store.read("t", "gap", 0).await, &db, "gap", 3);
    assert!(
        source.to_string().contains("seq 3 where 2 was expected"),
        "{source}"
    );
    assert_eq!(store.read("t", "good", 0).await.unwrap(), healthy);
}

fn repaired(seq: u64) -> Event {
    let mut event = Event::new(
        Envelope {
            event_id: format!("repair-{seq}"),
            ts: chrono::Utc::now(),
            tenant_id: "t".into(),
            session_id: "s".into(),
            run_id: "r1".into(),
            root_run_id: "r1".into(),
            span_id: "repair".into(),
            parent_span_id: None,
            agent: None,
            role: None,
        },
        Payload::SessionRepaired(SessionRepaired {
            bytes: 1,
            error: "unreadable".into(),
            moved_to: "loom_set_aside".into(),
            by: None,
        }),
    );
    event.seq = seq;
    event
}

#[tokio::test]
async fn an_unreadable_row_is_salvaged_set_aside_then_erased_with_its_session() {
    let Some((db, handle)) = TestDb::migrated().await else {
        return;
    };
    let store = PgStore::new(handle);
    store.append(events("t", "s", 3), 0).await.unwrap();
    let mut owner = db.owner().await;
    // A row written before the journal refused events that do not read back.
    let mut deep = started("t", "s", "r1", nested(125));
    deep.seq = 2;
    let bad = deep.to_json();
    sqlx::query(
        "UPDATE loom_events SET event = $1, run_id = 'r1', type = 'run.started' \
         WHERE tenant_id = 't' AND session_id = 's' AND seq = 2",
    )
    .bind(&bad)
    .execute(&mut owner)
    .await
    .unwrap();
    corrupted(store.read("t", "s", 0).await, &db, "s", 2);
    assert_eq!(
        store.find_run("t", "r1").await.unwrap().as_deref(),
        Some("s")
    );

    let salvage = store.salvage("t", "s").await.unwrap();
    assert_eq!(seqs(&salvage.events), [1, 3]);
    assert_eq!(salvage.unreadable.len(), 1);
    assert_eq!(salvage.unreadable[0].line, 2);
    assert_eq!(salvage.unreadable[0].bytes, bad.as_bytes());
    assert_eq!(salvage.unreadable[0].run_id.as_deref(), Some("r1"));
    assert_eq!(salvage.aside, "the PostgreSQL table loom_set_aside");

    let aside = |line: u64, bytes: &[u8]| SetAside {
        line,
        bytes: bytes.to_vec(),
        replacement: repaired(line),
    };
    assert_invalid(
        store.set_aside("t", "s", vec![aside(2, b"other")]).await,
        "changed since it was read",
    );
    let first = salvage.events[0].to_json();
    assert_invalid(
        store
            .set_aside("t", "s", vec![aside(1, first.as_bytes())])
            .await,
        "reads back",
    );
    store
        .set_aside("t", "s", vec![aside(2, bad.as_bytes())])
        .await
        .unwrap();
    let all = store.read("t", "s", 0).await.unwrap();
    assert_eq!(seqs(&all), [1, 2, 3]);
    assert!(matches!(all[1].payload, Payload::SessionRepaired(_)));
    let kept: String = sqlx::query_scalar("SELECT event FROM loom_set_aside WHERE seq = 2")
        .fetch_one(&mut owner)
        .await
        .unwrap();
    assert_eq!(kept, bad);
    assert_eq!(
        seqs(&store.append(events("t", "s", 1), 3).await.unwrap()),
        [4]
    );
    assert_eq!(store.delete("t", "s").await.unwrap(), 4);
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM loom_set_aside")
        .fetch_one(&mut owner)
        .await
        .unwrap();
    assert_eq!(left, 0);
}

#[tokio::test]
async fn an_event_id_already_journaled_is_refused() {
    let Some((_db, handle)) = TestDb::migrated().await else {
        return;
    };
    let store = PgStore::new(handle);
    let first = store.append(events("t", "a", 1), 0).await.unwrap();
    let mut again = first[0].clone();
    again.session_id = "b".into();
    again.seq = 0;
    assert_invalid(store.append(vec![again], 0).await, "already in the journal");
    assert!(store.read("t", "b", 0).await.unwrap().is_empty());
}

/// A writer that bypasses the session lock (here a raw transaction) takes the next seq first:
/// the store's insert waits on it, then fails on the primary key and reports a conflict,
/// having written nothing.
#[tokio::test]
async fn a_row_taken_behind_the_lock_s_back_is_a_conflict() {
    let Some((db, handle)) = TestDb::migrated().await else {
        return;
    };
    let store = PgStore::new(handle.clone());
    store.append(events("t", "s", 1), 0).await.unwrap();
    let mut intruder = db.owner().await;
    let mut tx = intruder.begin().await.unwrap();
    let mut stolen = event("t", "s", "intruder");
    stolen.seq = 2;
    sqlx::query(
        "INSERT INTO loom_events (tenant_id, session_id, seq, event_id, ts, run_id, root_run_id, \
         type, category, status, facets, event) \
         VALUES ('t', 's', 2, $1, now(), 's', 's', 'run.claimed', 'run', 'ok', '{}', $2)",
    )
    .bind(&stolen.event_id)
    .bind(stolen.to_json())
    .execute(&mut *tx)
    .await
    .unwrap();
    let racing = {
        let store = store.clone();
        tokio::spawn(async move { store.append(events("t", "s", 1), 1).await })
    };
    // Wait until the store's insert waits on the intruder's uncommitted row.
    let mut watcher = db.owner().await;
    loom_testkit::wait::until("the append to wait on the row", async || {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock' \
             AND query LIKE 'INSERT INTO loom_events%'",
        )
        .fetch_one(&mut watcher)
        .await
        .unwrap();
        waiting > 0
    })
    .await;
    tx.commit().await.unwrap();
    match racing.await.unwrap() {
        Err(StoreError::Conflict {
            expected: 1,
            found: 2,
            ..
        }) => {}
        other => panic!("expected a conflict, got {other:?}"),
    }
    let all = store.read("t", "s", 0).await.unwrap();
    assert_eq!(seqs(&all), [1, 2]);
    assert_eq!(all[1].event_id, stolen.event_id);
}

// ---------------------------------------------------------------------------------------------
// Several processes on one session

/// The URL and role a child process writes with.
const CHILD_DB: &str = "LOOM_PG_TEST_CHILD_DB";
const CHILD_ROLE: &str = "LOOM_PG_TEST_CHILD_ROLE";
const CHILDREN: usize = 4;
const EACH: usize = 25;

/// Runs as a child process only (spawned by the test below): appends `EACH` events, one at a
/// time, retrying on conflicts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_writer() {
    let (Ok(url), Ok(role), Ok(name)) = (
        std::env::var(CHILD_DB),
        std::env::var(CHILD_ROLE),
        std::env::var("LOOM_CHILD_NAME"),
    ) else {
        return;
    };
    let options = loom_postgres::PgOptions::new(url).with_role(role);
    let db = loom_postgres::PgDatabase::new(&options).unwrap();
    db.check().await.unwrap();
    let store = PgStore::new(db.clone());
    for i in 0..EACH {
        let event = event("t", "shared", &format!("{name}-{i}"));
        loop {
            let last = store.last_seq("t", "shared").await.unwrap();
            match store.append(vec![event.clone()], last).await {
                Ok(_) => break,
                Err(StoreError::Conflict { .. }) => tokio::task::yield_now().await,
                Err(err) => panic!("{name}: {err}"),
            }
        }
    }
    db.close().await;
}

#[tokio::test]
async fn four_processes_write_one_session() {
    let Some((db, handle)) = TestDb::migrated().await else {
        return;
    };
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..CHILDREN)
        .map(|n| {
            Command::new(&exe)
                .args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
                .env(CHILD_DB, &db.url)
                .env(CHILD_ROLE, &db.role)
                .env("LOOM_CHILD_NAME", format!("p{n}"))
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let store = PgStore::new(handle);
    let all = store.read("t", "shared", 0).await.unwrap();
    assert_eq!(
        seqs(&all),
        (1..=(CHILDREN * EACH) as u64).collect::<Vec<_>>()
    );
    for n in 0..CHILDREN {
        let mine: Vec<String> = all
            .iter()
            .filter(|e| e.event_id.contains(&format!("-p{n}-")))
            .map(|e| e.event_id.split('-').nth(3).unwrap_or_default().to_owned())
            .collect();
        let expected: Vec<String> = (0..EACH).map(|i| i.to_string()).collect();
        assert_eq!(mine, expected, "process p{n}");
    }
}

// ---------------------------------------------------------------------------------------------
// Idempotency keys and artifacts

#[tokio::test]
async fn the_idempotency_keys_are_shared_by_every_handle() {
    let Some((db, handle)) = TestDb::migrated().await else {
        return;
    };
    let one = PgIdempotency::new(handle);
    let two = PgIdempotency::new(db.database());
    let ttl = std::time::Duration::from_secs(60);
    let key = "default:relancer:relance:D-1";
    let s = IdempotencyScope {
        tenant_id: "default",
        session_id: "s1",
    };
    assert_eq!(
        one.reserve(key, "a", s, ttl).await.unwrap(),
        Reservation::Reserved
    );
    assert_eq!(
        one.reserve(key, "a", s, ttl).await.unwrap(),
        Reservation::Reserved
    );
    assert_eq!(
        two.reserve(key, "b", s, ttl).await.unwrap(),
        Reservation::Held
    );
    one.release(key, "a").await.unwrap();
    assert_eq!(
        two.reserve(key, "b", s, ttl).await.unwrap(),
        Reservation::Reserved
    );
    let output = ToolOutput::text("relance envoyée");
    two.complete(key, "b", &output).await.unwrap();
    assert_eq!(
        one.reserve(key, "c", s, ttl).await.unwrap(),
        Reservation::Completed(Box::new(output))
    );
    two.release(key, "b").await.unwrap();
    assert!(matches!(
        one.reserve(key, "c", s, ttl).await.unwrap(),
        Reservation::Completed(_)
    ));
    let other = "default:t:other";
    assert_eq!(
        one.reserve(other, "x", s, std::time::Duration::ZERO)
            .await
            .unwrap(),
        Reservation::Reserved
    );
    assert_eq!(
        one.reserve(other, "y", s, ttl).await.unwrap(),
        Reservation::Reserved
    );

    // A key of another tenant, or without one, is refused.
    assert_invalid(
        one.reserve("acme:t:k", "a", s, ttl).await,
        "belongs to tenant acme",
    );
    assert_invalid(
        one.reserve("bare", "a", s, ttl).await,
        "does not start with its tenant",
    );
    assert_invalid(
        one.complete("bare", "a", &ToolOutput::text("x")).await,
        "tenant",
    );
}

#[tokio::test]
async fn racing_reservations_give_the_key_to_one_holder() {
    let Some((db, _handle)) = TestDb::migrated().await else {
        return;
    };
    let ttl = std::time::Duration::from_secs(60);
    let tasks: Vec<_> = (0..6)
        .map(|n| {
            let store = PgIdempotency::new(db.database());
            tokio::spawn(async move {
                let scope = IdempotencyScope {
                    tenant_id: "t",
                    session_id: "s",
                };
                store
                    .reserve("t:tool:k", &format!("h{n}"), scope, ttl)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut reserved = 0;
    for task in tasks {
        match task.await.unwrap() {
            Reservation::Reserved => reserved += 1,
            Reservation::Held => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(reserved, 1);
}

#[tokio::test]
async fn deleting_a_session_erases_its_idempotency_keys_only() {
    let Some((db, handle)) = TestDb::migrated().await else {
        return;
    };
    let store = PgIdempotency::new(handle);
    let ttl = std::time::Duration::from_secs(60);
    let scope = |tenant_id, session_id| IdempotencyScope {
        tenant_id,
        session_id,
    };
    let output = ToolOutput::text("sent");
    store
        .reserve("t:x:done", "a", scope("t", "s1"), ttl)
        .await
        .unwrap();
    store.complete("t:x:done", "a", &output).await.unwrap();
    store
        .reserve("t:x:running", "b", scope("t", "s1"), ttl)
        .await
        .unwrap();
    store
        .reserve("t:x:kept", "c", scope("t", "s2"), ttl)
        .await
        .unwrap();
    store
        .reserve("u:x:other", "d", scope("u", "s1"), ttl)
        .await
        .unwrap();
    assert_eq!(store.delete_session("t", "s1").await.unwrap(), 2);
    assert_eq!(store.delete_session("t", "s1").await.unwrap(), 0);
    let mut owner = db.owner().await;
    let keys: Vec<String> = sqlx::query_scalar("SELECT key FROM loom_idempotency ORDER BY key")
        .fetch_all(&mut owner)
        .await
        .unwrap();
    assert_eq!(keys, ["t:x:kept", "u:x:other"]);
    assert_eq!(
        store
            .reserve("t:x:done", "e", scope("t", "s3"), ttl)
            .await
            .unwrap(),
        Reservation::Reserved
    );
}

#[tokio::test]
async fn artifacts_round_trip_and_are_erased_by_session() {
    let Some((db, handle)) = TestDb::migrated().await else {
        return;
    };
    let store = PgArtifacts::new(handle);
    let uri = store
        .put("default", "s1", b"hello".to_vec(), "txt")
        .await
        .unwrap();
    assert_eq!(
        uri,
        "artifact://default/s1/2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824.txt"
    );
    assert_eq!(
        store
            .put("default", "s1", b"hello".to_vec(), "txt")
            .await
            .unwrap(),
        uri
    );
    // Another handle (another worker) reads it.
    let other = PgArtifacts::new(db.database());
    assert_eq!(
        other.get(&uri).await.unwrap().as_deref(),
        Some(&b"hello"[..])
    );
    store
        .put("default", "s1", vec![0, 159, 255], "bin")
        .await
        .unwrap();
    let kept = store
        .put("default", "s2", b"kept".to_vec(), "txt")
        .await
        .unwrap();
    assert_eq!(
        store.get("artifact://default/s1/nope.txt").await.unwrap(),
        None
    );
    assert!(matches!(
        store.put("default", "../x", b"x".to_vec(), "txt").await,
        Err(StoreError::Invalid(_))
    ));
    assert_eq!(store.delete_session("default", "s1").await.unwrap(), 2);
    assert_eq!(store.get(&uri).await.unwrap(), None);
    assert_eq!(
        other.get(&kept).await.unwrap().as_deref(),
        Some(&b"kept"[..])
    );
}
