//! Row-level security that holds: connected the way Loom connects (a LOGIN role that owns
//! nothing and is no superuser, member of the application role, `SET ROLE` by the pool), with
//! tenant A set, raw SQL tries to read, write, change and erase tenant B's rows in every
//! table — by id, by event id, by session listing, by search — and gets nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use loom_core::ports::{ArtifactStore, EventStore, IdempotencyScope, IdempotencyStore};
use loom_postgres::{PgArtifacts, PgDatabase, PgIdempotency, PgOptions, PgStore, PoolSettings};
use loom_testkit::conformance::{event, events, started};
use sqlx::{Connection, Executor, PgConnection, Postgres, Transaction};
use support::TestDb;

/// Tenant B's data in every table, written through the stores.
struct Secrets {
    session: String,
    event_id: String,
    run_id: String,
    artifact: String,
}

async fn write_tenant(db: &PgDatabase, tenant: &str, session: &str) -> Secrets {
    let store = PgStore::new(db.clone());
    let mut batch = vec![started(
        tenant,
        session,
        &format!("run-{tenant}"),
        Default::default(),
    )];
    batch.extend(events(tenant, session, 2));
    batch.push(event(tenant, session, &format!("secret-{tenant}")));
    let written = store.append(batch, 0).await.unwrap();
    let idempotency = PgIdempotency::new(db.clone());
    let scope = IdempotencyScope {
        tenant_id: tenant,
        session_id: session,
    };
    idempotency
        .reserve(
            &format!("{tenant}:tool:k"),
            "h",
            scope,
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    let artifact = PgArtifacts::new(db.clone())
        .put(
            tenant,
            session,
            format!("file of {tenant}").into_bytes(),
            "txt",
        )
        .await
        .unwrap();
    Secrets {
        session: session.to_owned(),
        event_id: written[3].event_id.clone(),
        run_id: format!("run-{tenant}"),
        artifact,
    }
}

/// A transaction of the application for `tenant`, as Loom opens them.
async fn as_tenant(pool: &sqlx::PgPool, tenant: &str) -> Transaction<'static, Postgres> {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SELECT set_config('loom.tenant_id', $1, true)")
        .bind(tenant)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx
}

async fn count(tx: &mut Transaction<'static, Postgres>, sql: &str, bind: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .bind(bind)
        .fetch_one(&mut **tx)
        .await
        .unwrap()
}

/// The SQLSTATE of a refused statement (`42501`: insufficient privilege, which is also what a
/// row-level security violation reports).
fn refused<T: std::fmt::Debug>(result: Result<T, sqlx::Error>) -> String {
    match result {
        Err(sqlx::Error::Database(err)) => err.code().map(|c| c.into_owned()).unwrap_or_default(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Runs `sql` (binding `bind`) in its own savepoint-less transaction for `tenant` and returns
/// the refusal's SQLSTATE.
async fn refused_write(pool: &sqlx::PgPool, tenant: &str, sql: &str, bind: &str) -> String {
    let mut tx = as_tenant(pool, tenant).await;
    let code = refused(
        sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .bind(bind)
            .execute(&mut *tx)
            .await,
    );
    tx.rollback().await.unwrap();
    code
}

/// Runs `sql` for `tenant`, committing, and returns the rows it touched.
async fn affected(pool: &sqlx::PgPool, tenant: &str, sql: &str, bind: &str) -> u64 {
    let mut tx = as_tenant(pool, tenant).await;
    let done = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .bind(bind)
        .execute(&mut *tx)
        .await
        .unwrap()
        .rows_affected();
    tx.commit().await.unwrap();
    done
}

#[tokio::test]
async fn tenant_a_can_neither_see_nor_change_tenant_b() {
    let Some((db, owner_handle)) = TestDb::migrated().await else {
        return;
    };
    let a = write_tenant(&owner_handle, "a", "sa").await;
    let b = write_tenant(&owner_handle, "b", "sb").await;

    // Loom's way in: a LOGIN role owning nothing, member of the application role.
    let mut owner = db.owner().await;
    owner
        .execute("INSERT INTO loom_set_aside (tenant_id, session_id, seq, event) VALUES ('b', 'sb', 1, 'old')")
        .await
        .unwrap();
    let login = db.login_role().await;
    let app = PgDatabase::new(&PgOptions {
        dsn: login.clone(),
        role: db.role.clone(),
        pool: PoolSettings {
            min_size: 1,
            max_size: 2,
            ..PoolSettings::default()
        },
    })
    .unwrap();
    let pool = app.pool();
    reads_as_a_find_nothing_of_b(pool, &db.role, &a, &b).await;
    writes_as_a_touch_nothing_of_b(pool).await;
    nothing_without_a_tenant(pool, &login).await;
    the_stores_keep_b_whole(&app, &mut owner, &a, &b).await;
    owner.close().await.unwrap();
}

/// Reads as tenant A, by id, event id, run, session listing and search, in every table: none
/// of B's rows; a query that forgets its tenant sees only A's.
async fn reads_as_a_find_nothing_of_b(pool: &sqlx::PgPool, role: &str, a: &Secrets, b: &Secrets) {
    let mut tx = as_tenant(pool, "a").await;
    let who: (String, String, bool) = sqlx::query_as(
        "SELECT session_user::text, current_user::text, \
         (SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user)",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(who.1, role);
    assert_ne!(who.0, "postgres");
    assert!(!who.2, "the application role bypasses row-level security");

    // Reads: by id, by event id, by run, by session listing, by search, in every table.
    let b_reads = [
        ("SELECT count(*) FROM loom_events WHERE tenant_id = $1", "b"),
        (
            "SELECT count(*) FROM loom_events WHERE session_id = $1",
            b.session.as_str(),
        ),
        (
            "SELECT count(*) FROM loom_events WHERE event_id = $1",
            b.event_id.as_str(),
        ),
        (
            "SELECT count(*) FROM loom_events WHERE run_id = $1",
            b.run_id.as_str(),
        ),
        (
            "SELECT count(*) FROM loom_events WHERE event LIKE '%' || $1 || '%'",
            "secret-b",
        ),
        (
            "SELECT count(*) FROM loom_events WHERE facets @> jsonb_build_object('tenant', $1::text) \
             OR event LIKE '%\"tenant_id\":\"' || $1 || '\"%'",
            "b",
        ),
        (
            "SELECT count(DISTINCT session_id) FROM loom_events WHERE session_id = $1",
            b.session.as_str(),
        ),
        (
            "SELECT count(*) FROM loom_set_aside WHERE tenant_id <> $1",
            "a",
        ),
        (
            "SELECT count(*) FROM loom_sessions WHERE tenant_id = $1",
            "b",
        ),
        (
            "SELECT count(*) FROM loom_sessions WHERE session_id = $1",
            b.session.as_str(),
        ),
        (
            "SELECT count(*) FROM loom_idempotency WHERE tenant_id = $1",
            "b",
        ),
        (
            "SELECT count(*) FROM loom_idempotency WHERE key LIKE $1 || ':%'",
            "b",
        ),
        (
            "SELECT count(*) FROM loom_artifacts WHERE uri = $1",
            b.artifact.as_str(),
        ),
        (
            "SELECT count(*) FROM loom_artifacts WHERE tenant_id = $1",
            "b",
        ),
    ];
    for (sql, bind) in b_reads {
        assert_eq!(count(&mut tx, sql, bind).await, 0, "{sql} [{bind}]");
    }
    // A query that forgets the tenant sees only A's rows.
    let all: Vec<String> = sqlx::query_scalar("SELECT DISTINCT tenant_id FROM loom_events")
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    assert_eq!(all, ["a"]);
    let sessions: Vec<String> = sqlx::query_scalar("SELECT DISTINCT session_id FROM loom_events")
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    assert_eq!(sessions, [a.session.as_str()]);
    assert_eq!(
        count(
            &mut tx,
            "SELECT count(*) FROM loom_artifacts WHERE $1 = $1",
            "x"
        )
        .await,
        1
    );
    tx.commit().await.unwrap();
}

/// Writes as tenant A aimed at B's rows, in every table: refused or touching nothing.
async fn writes_as_a_touch_nothing_of_b(pool: &sqlx::PgPool) {
    // Writes for B are refused (row-level security), UPDATE on the journal is refused to
    // everyone (no grant), and the role cannot lift the policy.
    let insert_b = [
        "INSERT INTO loom_events (tenant_id, session_id, seq, event_id, ts, run_id, root_run_id, \
         type, category, status, facets, event) \
         VALUES ($1, 'sb', 99, 'forged', now(), 'r', 'r', 'run.claimed', 'run', 'ok', '{}', '{}')",
        "INSERT INTO loom_set_aside (tenant_id, session_id, seq, event) VALUES ($1, 'sb', 1, 'x')",
        "INSERT INTO loom_sessions (tenant_id, session_id, last_seq, updated_at, last_ingested) \
         VALUES ($1, 'forged', 1, now(), 1)",
        "INSERT INTO loom_idempotency (tenant_id, key, status, expires_at, holder) \
         VALUES ($1, 'b:tool:forged', 'completed', now() + interval '1 day', 'h')",
        "INSERT INTO loom_artifacts (tenant_id, session_id, uri, bytes) \
         VALUES ($1, 'sb', 'artifact://b/sb/forged.txt', '\\x00')",
    ];
    for sql in insert_b {
        assert_eq!(refused_write(pool, "a", sql, "b").await, "42501", "{sql}");
    }
    for sql in [
        "UPDATE loom_events SET event = 'x' WHERE tenant_id = $1",
        "UPDATE loom_artifacts SET bytes = '\\x00' WHERE tenant_id = $1",
        "UPDATE loom_set_aside SET event = 'x' WHERE tenant_id = $1",
        "ALTER TABLE loom_events DISABLE ROW LEVEL SECURITY -- $1",
        "DROP POLICY loom_events_tenant ON loom_events -- $1",
    ] {
        let sql = sql.replace(" -- $1", "");
        let mut tx = as_tenant(pool, "a").await;
        let result = if sql.contains("$1") {
            sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .bind("a")
                .execute(&mut *tx)
                .await
        } else {
            sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .execute(&mut *tx)
                .await
        };
        assert_eq!(refused(result), "42501", "{sql}");
        tx.rollback().await.unwrap();
    }
    // An UPDATE (granted on the idempotency keys) or a DELETE aimed at B touches nothing.
    for sql in [
        "UPDATE loom_idempotency SET holder = 'stolen' WHERE tenant_id = $1",
        "UPDATE loom_sessions SET last_seq = 1 WHERE tenant_id = $1",
        "DELETE FROM loom_sessions WHERE tenant_id = $1",
        "UPDATE loom_idempotency SET tenant_id = 'a' WHERE key LIKE $1 || ':%'",
        "DELETE FROM loom_events WHERE tenant_id = $1",
        "DELETE FROM loom_set_aside WHERE tenant_id = $1",
        "DELETE FROM loom_idempotency WHERE tenant_id = $1",
        "DELETE FROM loom_artifacts WHERE tenant_id = $1",
    ] {
        assert_eq!(affected(pool, "a", sql, "b").await, 0, "{sql}");
    }
    // Moving A's own row to B is refused too (WITH CHECK).
    assert_eq!(
        refused_write(
            pool,
            "a",
            "UPDATE loom_idempotency SET tenant_id = $1 WHERE tenant_id = 'a'",
            "b"
        )
        .await,
        "42501"
    );
}

/// Without a tenant set, through the pool or as the login role itself: nothing visible, nothing
/// written.
async fn nothing_without_a_tenant(pool: &sqlx::PgPool, login: &str) {
    // Without a tenant set, nothing is visible and nothing can be written.
    let mut bare = pool.acquire().await.unwrap();
    for table in [
        "loom_events",
        "loom_sessions",
        "loom_set_aside",
        "loom_idempotency",
        "loom_artifacts",
    ] {
        let seen: i64 =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
                .fetch_one(&mut *bare)
                .await
                .unwrap();
        assert_eq!(seen, 0, "{table} without a tenant");
    }
    drop(bare);
    // The login role itself, had the pool not switched role, is under the same policy (it
    // inherits the application role's rights, not the owner's): nothing without a tenant.
    let mut raw = PgConnection::connect(login).await.unwrap();
    let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM loom_events")
        .fetch_one(&mut raw)
        .await
        .unwrap();
    assert_eq!(seen, 0);
    raw.close().await.unwrap();

    // A pooled connection whose last transaction set a tenant reads the setting as '' (not
    // NULL) afterwards: a row of the empty tenant is refused too.
    let mut bare = pool.acquire().await.unwrap();
    let refused_bare = sqlx::query(
        "INSERT INTO loom_sessions (tenant_id, session_id, last_seq, updated_at, last_ingested) \
         VALUES ('', 'x', 1, now(), 1)",
    )
    .execute(&mut *bare)
    .await;
    assert_eq!(refused(refused_bare), "42501");
}

/// Through Loom's stores B's data is whole, and A's requests for B's things find nothing.
async fn the_stores_keep_b_whole(
    app: &PgDatabase,
    owner: &mut PgConnection,
    a: &Secrets,
    b: &Secrets,
) {
    // B's data is whole, as B sees it through Loom's stores.
    let b_store = PgStore::new(app.clone());
    assert_eq!(b_store.read("b", &b.session, 0).await.unwrap().len(), 4);
    assert_eq!(
        b_store.find_run("b", &b.run_id).await.unwrap().as_deref(),
        Some(b.session.as_str())
    );
    // And A's stores asked for B's things find nothing.
    assert!(b_store.read("a", &b.session, 0).await.unwrap().is_empty());
    assert_eq!(b_store.find_run("a", &b.run_id).await.unwrap(), None);
    let listed: Vec<String> = b_store
        .sessions("a")
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.session_id)
        .collect();
    assert_eq!(listed, [a.session.as_str()]);
    assert_eq!(b_store.delete("a", &b.session).await.unwrap(), 0);
    let artifacts = PgArtifacts::new(app.clone());
    assert!(artifacts.get(&b.artifact).await.unwrap().is_some());
    assert_eq!(artifacts.delete_session("a", &b.session).await.unwrap(), 0);
    let idempotency = PgIdempotency::new(app.clone());
    assert_eq!(
        idempotency.delete_session("a", &b.session).await.unwrap(),
        0
    );
    let b_rows: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM loom_events WHERE tenant_id = 'b') \
         + (SELECT count(*) FROM loom_idempotency WHERE tenant_id = 'b' AND holder = 'h') \
         + (SELECT count(*) FROM loom_artifacts WHERE tenant_id = 'b') \
         + (SELECT count(*) FROM loom_set_aside WHERE tenant_id = 'b') \
         + (SELECT count(*) FROM loom_sessions WHERE tenant_id = 'b' AND last_seq = 4)",
    )
    .fetch_one(&mut *owner)
    .await
    .unwrap();
    assert_eq!(b_rows, 8, "tenant B's rows changed");
    let forged: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM loom_events WHERE event_id = 'forged') \
         + (SELECT count(*) FROM loom_idempotency WHERE key = 'b:tool:forged') \
         + (SELECT count(*) FROM loom_sessions WHERE session_id = 'forged')",
    )
    .fetch_one(&mut *owner)
    .await
    .unwrap();
    assert_eq!(forged, 0);
}
