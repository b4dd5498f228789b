//! The PostgreSQL bus through the `EventBus` port: the shared bus conformance suite, each test
//! on a fresh database (notifications never cross databases), every instance a `PgDatabase`
//! of its own as another process would have; then what only the database shows: a signal too
//! large for `NOTIFY`, an unreadable notification, a listening connection killed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use futures_util::StreamExt;
use loom_core::{
    BoxFuture,
    bus::{BusError, EventBus, Signal},
};
use loom_postgres::{CHANNEL, PgBus};
use loom_testkit::bus_conformance::{appended, next_signal};
use support::TestDb;

/// The instances of one test: each a `PgBus` on a new `PgDatabase` of the test's database.
fn opener(db: &TestDb) -> impl Fn() -> BoxFuture<'static, Arc<dyn EventBus>> + use<> {
    let options = db.options();
    move || {
        let bus: Arc<dyn EventBus> = Arc::new(PgBus::new(
            loom_postgres::PgDatabase::new(&options).unwrap(),
        ));
        Box::pin(async move { bus })
    }
}

mod conformance {
    use super::*;

    /// Skips (returns early) when the server is not given; the guard drops the database.
    macro_rules! setup {
        () => {{
            let Some((db, _)) = TestDb::migrated().await else {
                return;
            };
            let open = opener(&db);
            (db, open)
        }};
    }

    loom_testkit::bus_conformance!(postgres, setup!());
}

#[tokio::test]
async fn a_signal_too_large_for_notify_is_refused() {
    let Some((db, _)) = TestDb::migrated().await else {
        return;
    };
    let bus = PgBus::new(db.database());
    let huge = Signal::Cancel {
        tenant_id: "acme".into(),
        session_id: "s1".into(),
        run_id: "r1".into(),
        by: Some("x".repeat(9000)),
    };
    let refused = bus.publish(&huge).await.unwrap_err();
    assert!(
        matches!(&refused, BusError::Refused(m) if m.contains("8000")),
        "{refused:?}"
    );
}

#[tokio::test]
async fn an_unreadable_notification_is_skipped() {
    let Some((db, _)) = TestDb::migrated().await else {
        return;
    };
    let bus = PgBus::new(db.database());
    let mut signals = bus.subscribe().await.unwrap();
    let mut owner = db.owner().await;
    let notify = format!("NOTIFY {CHANNEL}, '{{not a signal'");
    sqlx::raw_sql(sqlx::AssertSqlSafe(notify))
        .execute(&mut owner)
        .await
        .unwrap();
    let signal = appended("s1", 1, 1);
    bus.publish(&signal).await.unwrap();
    assert_eq!(
        next_signal(&mut signals, "the readable signal").await,
        signal
    );
}

#[tokio::test]
async fn a_lost_listening_connection_ends_the_stream_after_an_error() {
    let Some((db, _)) = TestDb::migrated().await else {
        return;
    };
    let bus = PgBus::new(db.database());
    let mut signals = bus.subscribe().await.unwrap();
    let mut owner = db.owner().await;
    let killed: Vec<(bool,)> = sqlx::query_as(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = $1 AND query ILIKE 'LISTEN%'",
    )
    .bind(&db.name)
    .fetch_all(&mut owner)
    .await
    .unwrap();
    assert_eq!(killed, vec![(true,)], "one listening connection");
    let ended = tokio::time::timeout(loom_testkit::wait::PATIENCE, signals.next())
        .await
        .expect("the stream reports the lost connection");
    assert!(
        matches!(ended, Some(Err(BusError::Unavailable(_)))),
        "{ended:?}"
    );
    assert!(signals.next().await.is_none(), "then the stream ends");
    // A new subscription works.
    let mut again = bus.subscribe().await.unwrap();
    let signal = appended("s1", 2, 2);
    bus.publish(&signal).await.unwrap();
    assert_eq!(next_signal(&mut again, "after resubscribing").await, signal);
}
