//! A fresh PostgreSQL database per test, on the server `LOOM_TEST_POSTGRES` names: created as
//! `loom_t_<random>` with its own application role `loom_app_<random>` (roles are cluster-wide,
//! so tests running at once must not share one), both dropped when the test ends.
//!
//! Without `LOOM_TEST_POSTGRES` the test is skipped with a notice on stderr; under
//! `LOOM_REQUIRE_SERVICES=1` it fails instead.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use loom_postgres::{PgDatabase, PgOptions, PoolSettings};
use sqlx::{Connection, Executor, PgConnection};

/// The server's URL, or `None` (the test returns) when unset and not required.
pub(crate) fn server() -> Option<String> {
    loom_testkit::services::postgres()
}

/// `url` naming the database `name` (and, when given, the user `user`).
pub(crate) fn with_database(url: &str, name: &str, user: Option<&str>) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let (server, _) = base.rsplit_once('/').expect("a URL with a database");
    let server = match user {
        Some(user) => {
            let (scheme, rest) = server.split_once("://").expect("a postgres:// URL");
            let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
            format!("{scheme}://{user}@{host}")
        }
        None => server.to_owned(),
    };
    match query {
        Some(query) => format!("{server}/{name}?{query}"),
        None => format!("{server}/{name}"),
    }
}

fn suffix() -> String {
    let mut bytes = [0u8; 6];
    getrandom::fill(&mut bytes).unwrap();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A database of its own for one test, dropped with its roles at the end.
#[derive(Debug)]
pub(crate) struct TestDb {
    server: String,
    /// The database.
    pub(crate) name: String,
    /// Its application role.
    pub(crate) role: String,
    /// Its URL (as the server's user, who owns what it migrates).
    pub(crate) url: String,
    /// Login roles a test created (dropped too).
    pub(crate) logins: std::sync::Mutex<Vec<String>>,
}

impl TestDb {
    /// A fresh empty database, or `None` when the test is skipped.
    pub(crate) async fn create() -> Option<TestDb> {
        let server = server()?;
        let id = suffix();
        let name = format!("loom_t_{id}");
        let mut admin = PgConnection::connect(&server).await.unwrap();
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .unwrap();
        admin.close().await.unwrap();
        Some(TestDb {
            url: with_database(&server, &name, None),
            server,
            name,
            role: format!("loom_app_{id}"),
            logins: std::sync::Mutex::new(Vec::new()),
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
        let login = format!("{}_login", self.role);
        let mut conn = self.owner().await;
        conn.execute(sqlx::AssertSqlSafe(format!(
            "CREATE ROLE {login} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS; \
             GRANT {} TO {login}",
            self.role
        )))
        .await
        .unwrap();
        conn.close().await.unwrap();
        self.logins.lock().unwrap().push(login.clone());
        with_database(&self.server, &self.name, Some(&login))
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let server = self.server.clone();
        let name = self.name.clone();
        let mut roles = self.logins.lock().map(|l| l.clone()).unwrap_or_default();
        roles.push(self.role.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let mut admin = PgConnection::connect(&server).await.unwrap();
                admin
                    .execute(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .await
                    .unwrap();
                for role in roles {
                    admin
                        .execute(sqlx::AssertSqlSafe(format!("DROP ROLE IF EXISTS {role}")))
                        .await
                        .unwrap();
                }
                admin.close().await.ok();
            })
        })
        .join();
        if dropped.is_err() && !std::thread::panicking() {
            panic!("dropping the test database {} failed", self.name);
        }
    }
}
