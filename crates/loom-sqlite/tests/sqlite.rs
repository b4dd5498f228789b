//! The SQLite journal through the `EventStore` port: the shared conformance suite, then what
//! only the database shows (settings, verbatim rows, corrupted rows, schema versions, several
//! processes on one file).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Arc,
};

use loom_core::{
    event::{Envelope, Event, EventReadError, Payload, SessionRepaired},
    ports::{EventStore, SetAside, StoreError},
};
use loom_sqlite::SqliteStore;
use loom_testkit::conformance::{assert_invalid, event, events, nested, seqs, started};
use sqlx::{Connection, Row, sqlite::SqliteConnection};

// A freshly opened `SqliteStore` on the same file for every handle, as another process would
// have (each has its own connections).
loom_testkit::store_conformance!(conformance, {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal.db");
    SqliteStore::open(&file).unwrap();
    (dir, move || {
        Arc::new(SqliteStore::open(&file).unwrap()) as Arc<dyn EventStore>
    })
});

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_start_is_answered_from_the_run_index() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal.db");
    SqliteStore::open(&file).unwrap();
    let open = move || Arc::new(SqliteStore::open(&file).unwrap()) as Arc<dyn EventStore>;
    loom_testkit::conformance::run_start_is_indexed(&open).await;
}

// A freshly opened `SqliteIdempotency` on the same file for every handle.
loom_testkit::idempotency_conformance!(idempotency, {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idempotency.db");
    loom_sqlite::SqliteIdempotency::open(&file).unwrap();
    (dir, move || {
        Arc::new(loom_sqlite::SqliteIdempotency::open(&file).unwrap())
            as Arc<dyn loom_core::ports::IdempotencyStore>
    })
});

/// A raw connection to the file, to look at or tamper with the rows.
async fn raw(path: &Path) -> SqliteConnection {
    SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap()
}

async fn pragma(conn: &mut SqliteConnection, name: &'static str) -> String {
    let row = sqlx::query(name).fetch_one(&mut *conn).await.unwrap();
    row.try_get::<String, _>(0)
        .or_else(|_| row.try_get::<i64, _>(0).map(|n| n.to_string()))
        .unwrap()
}

#[tokio::test]
async fn open_creates_the_file_in_wal_mode_with_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    // The directory does not exist yet; opening outside a runtime thread works too.
    let file = dir.path().join("nested").join("loom.db");
    let store = {
        let file = file.clone();
        std::thread::spawn(move || SqliteStore::open(file))
            .join()
            .unwrap()
            .unwrap()
    };
    assert_eq!(store.path(), file);
    assert!(file.exists());
    let mut conn = raw(&file).await;
    assert_eq!(pragma(&mut conn, "PRAGMA journal_mode").await, "wal");
    assert_eq!(pragma(&mut conn, "PRAGMA user_version").await, "1");
    let names: Vec<String> =
        sqlx::query("SELECT name FROM sqlite_master WHERE tbl_name = 'events' ORDER BY name")
            .fetch_all(&mut conn)
            .await
            .unwrap()
            .iter()
            .map(|row| row.try_get("name").unwrap())
            .collect();
    for name in [
        "events",
        "events_event_id",
        "events_ingested",
        "events_run",
        "events_session_type",
        "events_tenant_ingested",
        "events_tenant_type",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} missing: {names:?}");
    }
    // `events_type` is a prefix of `events_tenant_type`: no longer created, and dropped from
    // files an earlier build made.
    assert!(!names.iter().any(|n| n == "events_type"), "{names:?}");
    sqlx::query("CREATE INDEX events_type ON events (tenant_id, type)")
        .execute(&mut conn)
        .await
        .unwrap();
    drop(SqliteStore::open(&file).unwrap());
    let left: i64 = sqlx::query("SELECT count(*) FROM sqlite_master WHERE name = 'events_type'")
        .fetch_one(&mut conn)
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);

    store.append(events("t", "s", 1), 0).await.unwrap();

    // Opening again keeps everything.
    let again = SqliteStore::open(&file).unwrap();
    assert_eq!(again.last_seq("t", "s").await.unwrap(), 1);
}

#[tokio::test]
async fn rows_hold_the_event_line_verbatim_and_its_envelope() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("loom.db");
    let store = SqliteStore::open(&file).unwrap();
    let written = store.append(events("t", "s", 2), 0).await.unwrap();
    let mut conn = raw(&file).await;
    let rows = sqlx::query(
        "SELECT tenant_id, session_id, seq, event_id, ts, run_id, root_run_id, type, category, \
         status, agent, role, facets, event FROM events ORDER BY seq",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(rows.len(), 2);
    for (row, event) in rows.iter().zip(&written) {
        let text = |name: &str| row.try_get::<Option<String>, _>(name).unwrap();
        assert_eq!(text("event").unwrap(), event.to_json());
        assert_eq!(text("tenant_id").unwrap(), "t");
        assert_eq!(text("session_id").unwrap(), "s");
        assert_eq!(row.try_get::<i64, _>("seq").unwrap() as u64, event.seq);
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
    }
}

fn corrupted<T: std::fmt::Debug>(
    result: Result<T, StoreError>,
    file: &Path,
    session: &str,
    line: usize,
) -> EventReadError {
    match result {
        Err(StoreError::Corrupted {
            path,
            line: at,
            source,
        }) => {
            assert_eq!(path, format!("{} (t/{session})", file.display()));
            assert_eq!(at, line);
            source
        }
        other => panic!("expected corruption at seq {line}, got {other:?}"),
    }
}

/// Runs one statement on the file behind the store's back.
async fn tamper(conn: &mut SqliteConnection, sql: &'static str) {
    sqlx::query(sql).execute(&mut *conn).await.unwrap();
}

#[tokio::test]
async fn a_bad_row_is_reported_naming_it_and_never_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("loom.db");
    let store = SqliteStore::open(&file).unwrap();
    store.append(events("t", "bad", 4), 0).await.unwrap();
    let healthy = store.append(events("t", "good", 2), 0).await.unwrap();
    let mut conn = raw(&file).await;

    // Not JSON at all, in the middle: reads through it fail, naming the row.
    tamper(
        &mut conn,
        "UPDATE events SET event = 'not json' WHERE session_id = 'bad' AND seq = 2",
    )
    .await;
    let source = corrupted(store.read("t", "bad", 0).await, &file, "bad", 2);
    assert!(matches!(source, EventReadError::Json(_)), "{source}");
    assert_eq!(seqs(&store.read("t", "bad", 2).await.unwrap()), [3, 4]);
    assert_eq!(store.last_seq("t", "bad").await.unwrap(), 4);

    // An envelope contradicting its payload on the last row: last_seq reports it too.
    tamper(
        &mut conn,
        "UPDATE events SET event = replace(event, '\"status\":\"ok\"', '\"status\":\"error\"') \
         WHERE session_id = 'bad' AND seq = 4",
    )
    .await;
    let source = corrupted(store.last_seq("t", "bad").await, &file, "bad", 4);
    assert!(matches!(
        source,
        EventReadError::Inconsistent {
            field: "status",
            ..
        }
    ));
    // Rows whose last event is unreadable are left out of the session list, not the others.
    let listed: Vec<String> = store
        .sessions("t")
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.session_id)
        .collect();
    assert_eq!(listed, ["good"]);

    // A row holding another row's event.
    tamper(
        &mut conn,
        "UPDATE events SET event = (SELECT event FROM events WHERE session_id = 'bad' AND seq = 1) \
         WHERE session_id = 'bad' AND seq = 2",
    )
    .await;
    let source = corrupted(store.read("t", "bad", 1).await, &file, "bad", 2);
    assert!(source.to_string().contains("row of seq 2"), "{source}");
    // A row of another journal.
    tamper(
        &mut conn,
        "UPDATE events SET event = (SELECT event FROM events WHERE session_id = 'good' AND seq = 1) \
         WHERE session_id = 'bad' AND seq = 1",
    )
    .await;
    let source = corrupted(store.read("t", "bad", 0).await, &file, "bad", 1);
    assert!(source.to_string().contains("t/good"), "{source}");

    // A gap in the seqs.
    store.append(events("t", "gap", 3), 0).await.unwrap();
    tamper(
        &mut conn,
        "DELETE FROM events WHERE session_id = 'gap' AND seq = 2",
    )
    .await;
    let source = corrupted(store.read("t", "gap", 0).await, &file, "gap", 3);
    assert!(
        source.to_string().contains("seq 3 where 2 was expected"),
        "{source}"
    );

    // The other session of the tenant is unaffected.
    assert_eq!(store.read("t", "good", 0).await.unwrap(), healthy);
    assert_eq!(
        seqs(&store.append(events("t", "good", 1), 2).await.unwrap()),
        [3]
    );
}

/// A file from before the index of a session's events by type gets it when opened, and
/// `last_of_type` is answered through it.
#[tokio::test]
async fn an_older_file_gets_the_index_by_session_and_type() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("loom.db");
    let store = SqliteStore::open(&file).unwrap();
    store
        .append(
            vec![
                started("t", "s", "r1", serde_json::Map::new()),
                event("t", "s", "x"),
            ],
            0,
        )
        .await
        .unwrap();
    store.close().await;
    let mut conn = raw(&file).await;
    sqlx::query("DROP INDEX events_session_type")
        .execute(&mut conn)
        .await
        .unwrap();
    drop(conn);
    let store = SqliteStore::open(&file).unwrap();
    let found = store
        .last_of_type("t", "s", "run.started", u64::MAX)
        .await
        .unwrap();
    assert_eq!(found.map(|e| e.seq), Some(1));
    let mut conn = raw(&file).await;
    let plan: Vec<String> = sqlx::query(
        "EXPLAIN QUERY PLAN SELECT seq, event FROM events \
         WHERE tenant_id = 't' AND session_id = 's' AND type = 'run.started' AND seq < 9 \
         ORDER BY seq DESC LIMIT 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap()
    .iter()
    .map(|row| row.try_get::<String, _>("detail").unwrap())
    .collect();
    assert!(
        plan.iter().any(|step| step.contains("events_session_type")),
        "{plan:?}"
    );
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("loom.db");
    drop(SqliteStore::open(&file).unwrap());
    let mut conn = raw(&file).await;
    sqlx::query("PRAGMA user_version = 2")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    match SqliteStore::open(&file) {
        Err(StoreError::Invalid(message)) => {
            assert!(message.contains("schema version 2"), "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("loom.db");
    std::fs::write(
        &file,
        "this is not a database, only text long enough to be checked",
    )
    .unwrap();
    assert!(matches!(
        SqliteStore::open(&file),
        Err(StoreError::Io { .. })
    ));
}

#[tokio::test]
async fn delete_leaves_no_trace_in_the_file_or_its_wal() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("loom.db");
    let store = SqliteStore::open(&file).unwrap();
    let mut secret = event("t", "s", "secret-worker-7f3a9c");
    secret.event_id = "ev-secret".into();
    store.append(vec![secret], 0).await.unwrap();
    store.append(events("t", "other", 3), 0).await.unwrap();
    assert_eq!(store.delete("t", "s").await.unwrap(), 1);
    let wal = PathBuf::from(format!("{}-wal", file.display()));
    for path in [&file, &wal] {
        if let Ok(bytes) = std::fs::read(path) {
            let found = bytes
                .windows(b"secret-worker-7f3a9c".len())
                .any(|w| w == b"secret-worker-7f3a9c");
            assert!(!found, "{} still holds the erased event", path.display());
        }
    }
    assert_eq!(store.read("t", "other", 0).await.unwrap().len(), 3);
}

/// A row written before the journal refused events that do not read back: the outside probe's
/// `run.started`, metadata nested 125 levels deep, as the event of row `seq` of `t/s`.
async fn write_unreadable_row(conn: &mut SqliteConnection, seq: i64) -> String {
    let mut deep = started("t", "s", "r1", nested(125));
    deep.seq = u64::try_from(seq).unwrap();
    let line = deep.to_json();
    sqlx::query(
        "UPDATE events SET event = ?1, run_id = 'r1', type = 'run.started' \
         WHERE tenant_id = 't' AND session_id = 's' AND seq = ?2",
    )
    .bind(&line)
    .bind(seq)
    .execute(&mut *conn)
    .await
    .unwrap();
    line
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
            moved_to: "set_aside".into(),
            by: None,
        }),
    );
    event.seq = seq;
    event
}

#[tokio::test]
async fn an_unreadable_row_is_salvaged_set_aside_then_erased_with_its_session() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("loom.db");
    let store = SqliteStore::open(&file).unwrap();
    store.append(events("t", "s", 3), 0).await.unwrap();
    let mut conn = raw(&file).await;
    let bad = write_unreadable_row(&mut conn, 2).await;
    corrupted(store.read("t", "s", 0).await, &file, "s", 2);
    // The run is found by its row's columns, so its session says where it breaks.
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
    assert_eq!(salvage.aside, "the SQLite table set_aside");

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
    let kept: String = sqlx::query("SELECT event FROM set_aside WHERE seq = 2")
        .fetch_one(&mut conn)
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, bad);
    assert_eq!(
        seqs(&store.append(events("t", "s", 1), 3).await.unwrap()),
        [4]
    );

    // Erasing the session erases what was set aside from it.
    assert_eq!(store.delete("t", "s").await.unwrap(), 4);
    let left: i64 = sqlx::query("SELECT COUNT(*) FROM set_aside")
        .fetch_one(&mut conn)
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
}

/// `connect` sets the file up without holding the runtime's thread: on a one-thread runtime,
/// another task runs while it waits for SQLite (`open` would block the thread throughout).
#[tokio::test(flavor = "current_thread")]
async fn connect_lets_the_runtime_run_other_tasks_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nested").join("loom.db");
    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = ran.clone();
    let other = tokio::spawn(async move { flag.store(true, std::sync::atomic::Ordering::SeqCst) });
    let store = SqliteStore::connect(&file).await.unwrap();
    assert!(
        ran.load(std::sync::atomic::Ordering::SeqCst),
        "the runtime's only thread was held while the file was set up"
    );
    other.await.unwrap();
    assert_eq!(
        seqs(&store.append(events("t", "s", 1), 0).await.unwrap()),
        [1]
    );
    let mut conn = raw(&file).await;
    assert_eq!(pragma(&mut conn, "PRAGMA journal_mode").await, "wal");
}

// ---------------------------------------------------------------------------------------------
// Several processes on one file

/// Environment variable naming the database a child process writes to.
const CHILD_DB: &str = "LOOM_SQLITE_TEST_CHILD_DB";
const CHILDREN: usize = 4;
const EACH: usize = 25;

/// Runs as a child process only (spawned by the test below): appends `EACH` events, one at a
/// time, retrying on conflicts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_writer() {
    let (Ok(file), Ok(name)) = (std::env::var(CHILD_DB), std::env::var("LOOM_CHILD_NAME")) else {
        return;
    };
    let store = SqliteStore::open(file).unwrap();
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
    store.close().await;
}

#[tokio::test]
async fn several_processes_share_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("loom.db");
    let store = SqliteStore::open(&file).unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..CHILDREN)
        .map(|n| {
            Command::new(&exe)
                .args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
                .env(CHILD_DB, &file)
                .env("LOOM_CHILD_NAME", format!("p{n}"))
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
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

#[tokio::test]
async fn the_idempotency_table_is_shared_by_every_store_of_the_file() {
    use loom_core::{
        ports::{IdempotencyScope, IdempotencyStore, Reservation},
        tool::ToolOutput,
    };
    use loom_sqlite::SqliteIdempotency;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loom.db");
    let journal = SqliteStore::open(&path).unwrap();
    let one = SqliteIdempotency::of(journal.clone());
    let two = SqliteIdempotency::open(&path).unwrap();
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
    // A failed action gives the key back.
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
    // Releasing a completed key does nothing; an expired record is free again.
    two.release(key, "b").await.unwrap();
    assert!(matches!(
        one.reserve(key, "c", s, ttl).await.unwrap(),
        Reservation::Completed(_)
    ));
    assert_eq!(
        one.reserve("other", "x", s, std::time::Duration::ZERO)
            .await
            .unwrap(),
        Reservation::Reserved
    );
    assert_eq!(
        one.reserve("other", "y", s, ttl).await.unwrap(),
        Reservation::Reserved
    );
}

#[tokio::test]
async fn deleting_a_session_erases_its_idempotency_keys_only() {
    use loom_core::{
        ports::{IdempotencyScope, IdempotencyStore, Reservation},
        tool::ToolOutput,
    };
    use loom_sqlite::SqliteIdempotency;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loom.db");
    let store = SqliteIdempotency::open(&path).unwrap();
    let ttl = std::time::Duration::from_secs(60);
    let scope = |tenant_id, session_id| IdempotencyScope {
        tenant_id,
        session_id,
    };
    let output = ToolOutput::text("sent");
    store
        .reserve("done", "a", scope("t", "s1"), ttl)
        .await
        .unwrap();
    store.complete("done", "a", &output).await.unwrap();
    store
        .reserve("running", "b", scope("t", "s1"), ttl)
        .await
        .unwrap();
    store
        .reserve("kept", "c", scope("t", "s2"), ttl)
        .await
        .unwrap();
    store
        .reserve("other", "d", scope("u", "s1"), ttl)
        .await
        .unwrap();
    assert_eq!(store.delete_session("t", "s1").await.unwrap(), 2);
    assert_eq!(store.delete_session("t", "s1").await.unwrap(), 0);
    let mut conn = raw(&path).await;
    let keys: Vec<String> = sqlx::query("SELECT key FROM idempotency ORDER BY key")
        .fetch_all(&mut conn)
        .await
        .unwrap()
        .iter()
        .map(|row| row.try_get(0).unwrap())
        .collect();
    assert_eq!(keys, ["kept", "other"]);
    assert_eq!(
        store
            .reserve("done", "e", scope("t", "s3"), ttl)
            .await
            .unwrap(),
        Reservation::Reserved
    );
}

#[tokio::test]
async fn an_older_idempotency_table_gains_the_session_columns() {
    use loom_core::ports::{IdempotencyScope, IdempotencyStore};
    use loom_sqlite::SqliteIdempotency;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    std::fs::write(&path, b"").unwrap();
    {
        let mut conn = raw(&path).await;
        sqlx::query(
            "CREATE TABLE idempotency (key TEXT PRIMARY KEY, status TEXT NOT NULL, result TEXT, \
             expires_at TEXT NOT NULL, holder TEXT NOT NULL)",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO idempotency VALUES ('old', 'in_progress', NULL, \
             '2999-01-01T00:00:00Z', 'h')",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
    }
    let store = SqliteIdempotency::open(&path).unwrap();
    let scope = IdempotencyScope {
        tenant_id: "t",
        session_id: "s1",
    };
    store
        .reserve("new", "a", scope, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(store.delete_session("t", "s1").await.unwrap(), 1);
    let mut conn = raw(&path).await;
    let keys: Vec<String> = sqlx::query("SELECT key FROM idempotency")
        .fetch_all(&mut conn)
        .await
        .unwrap()
        .iter()
        .map(|row| row.try_get(0).unwrap())
        .collect();
    assert_eq!(keys, ["old"], "records without a session are kept");
}
