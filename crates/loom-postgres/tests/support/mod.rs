//! A fresh database per test ([`loom_testkit::postgres::TestDb`]: `loom_t_<random>` with its
//! own application role, dropped at the end; skipped without `LOOM_TEST_POSTGRES`, failed
//! under `LOOM_REQUIRE_SERVICES=1`), with what these tests need on top: Loom's options for it,
//! its schema, a connection as the owner of the tables, a login role.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use loom_postgres::{PgDatabase, PgOptions, PoolSettings};
use sqlx::{Connection, PgConnection};

/// A database of its own for one test.
#[derive(Debug)]
pub(crate) struct TestDb {
    inner: loom_testkit::postgres::TestDb,
    /// The database.
    pub(crate) name: String,
    /// Its application role.
    pub(crate) role: String,
    /// Its URL (as the server's user, who owns what it migrates).
    pub(crate) url: String,
}

/// The running test's name, for the skip notice.
fn test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_owned()
}

impl TestDb {
    /// A fresh empty database, or `None` when the test is skipped.
    pub(crate) async fn create() -> Option<TestDb> {
        let inner = loom_testkit::postgres::TestDb::create(&test_name())?;
        Some(TestDb {
            name: inner.name().to_owned(),
            role: inner.role().to_owned(),
            url: inner.url(),
            inner,
        })
    }

    /// Options for this database: its role, small pools (many handles share the server).
    pub(crate) fn options(&self) -> PgOptions {
        PgOptions {
            dsn: self.url.clone(),
            role: self.role.clone(),
            pool: PoolSettings {
                min_size: 1,
                max_size: 2,
                ..PoolSettings::default()
            },
        }
    }

    /// A handle on the database (lazy).
    pub(crate) fn database(&self) -> PgDatabase {
        PgDatabase::new(&self.options()).unwrap()
    }

    /// A fresh database with the schema applied, or `None` when skipped.
    pub(crate) async fn migrated() -> Option<(TestDb, PgDatabase)> {
        let db = TestDb::create().await?;
        let handle = db.database();
        handle.migrate().await.unwrap();
        Some((db, handle))
    }

    /// A raw connection as the server's user (the owner of the tables).
    pub(crate) async fn owner(&self) -> PgConnection {
        PgConnection::connect(&self.url).await.unwrap()
    }

    /// Creates a LOGIN role (no superuser, owning nothing) member of the application role,
    /// and returns the URL connecting as it.
    pub(crate) async fn login_role(&self) -> String {
        self.inner.login(&format!("{}_login", self.role), true)
    }
}
