//! A fresh PostgreSQL database per test, on the server `LOOM_TEST_POSTGRES` names.
//!
//! A test that needs PostgreSQL asks [`TestDb::create`] first. When `LOOM_TEST_POSTGRES` is
//! unset (a developer's quick run) the test writes `skipped <test>: LOOM_TEST_POSTGRES is not
//! set` on stderr and returns early; with `LOOM_REQUIRE_SERVICES=1`, which `.ci/run` sets, it
//! fails instead: there, the tests that need the services must run.
//!
//! Each database is named `loom_t_<random>` and dropped (`WITH (FORCE)`) when the [`TestDb`]
//! is dropped, with the roles made for it. Roles are cluster-wide, so each test database gets
//! its own application role name ([`TestDb::role`]): tests running at once never race to
//! create the same role.

use sqlx::{Connection, Executor, PgConnection};

/// The variable naming the test server (`postgres://postgres@127.0.0.1:5432/test`).
pub const SERVER: &str = "LOOM_TEST_POSTGRES";
/// The variable that turns a skip into a failure when set to `1`.
pub const REQUIRE_SERVICES: &str = "LOOM_REQUIRE_SERVICES";

/// Whether the tests that need a service must fail rather than skip when it is not given.
pub fn services_required() -> bool {
    std::env::var(REQUIRE_SERVICES).as_deref() == Ok("1")
}

/// The test server's URL, or `None` after printing the skip notice for `test`; panics under
/// `LOOM_REQUIRE_SERVICES=1` when it is not set.
pub fn server(test: &str) -> Option<String> {
    match std::env::var(SERVER) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if services_required() => panic!(
            "{test} needs PostgreSQL: {SERVER} is not set and {REQUIRE_SERVICES}=1 requires it"
        ),
        _ => {
            eprintln!("skipped {test}: {SERVER} is not set");
            None
        }
    }
}

/// A database made for one test, dropped with it.
#[derive(Debug)]
pub struct TestDb {
    server: String,
    name: String,
    role: String,
    logins: std::sync::Mutex<Vec<String>>,
}

impl TestDb {
    /// A fresh empty database on the test server, or `None` when the test is skipped (see
    /// the module documentation). Callable inside or outside a Tokio runtime.
    pub fn create(test: &str) -> Option<TestDb> {
        let server = server(test)?;
        let suffix = random_suffix();
        let db = TestDb {
            name: format!("loom_t_{suffix}"),
            role: format!("loom_app_{suffix}"),
            server,
            logins: std::sync::Mutex::new(Vec::new()),
        };
        let statement = format!("CREATE DATABASE {}", db.name);
        db.admin(&[statement.as_str()]);
        Some(db)
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The application role name this database's tests use (`loom_app_<random>`), dropped
    /// with the database.
    pub fn role(&self) -> &str {
        &self.role
    }

    /// The URL of this database, as the server's user.
    pub fn url(&self) -> String {
        with_database(&self.server, &self.name)
    }

    /// Creates a LOGIN role `name` (neither superuser nor owner of anything), member of
    /// [`TestDb::role`] when `member` is set, and returns the URL of this database as that
    /// user (trust authentication, as on the test server). Dropped with the database.
    pub fn login(&self, name: &str, member: bool) -> String {
        let mut statements = vec![format!(
            "CREATE ROLE {name} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS"
        )];
        if member {
            statements.push(format!("GRANT {} TO {name}", self.role));
        }
        let refs: Vec<&str> = statements.iter().map(String::as_str).collect();
        self.admin(&refs);
        self.logins
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(name.to_owned());
        let url = url::Url::parse(&self.url());
        match url {
            Ok(mut url) => {
                let _ = url.set_username(name);
                let _ = url.set_password(None);
                url.to_string()
            }
            Err(error) => panic!("{SERVER} is not a URL: {error}"),
        }
    }

    /// Runs `statements` on the server's maintenance connection (outside any transaction),
    /// on a thread of its own so it works inside and outside a runtime; panics on failure.
    pub fn admin(&self, statements: &[&str]) {
        let server = self.server.clone();
        let statements: Vec<String> = statements.iter().map(|s| (*s).to_owned()).collect();
        let outcome = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async move {
                let mut conn = PgConnection::connect(&server)
                    .await
                    .map_err(|e| format!("connecting to {server}: {e}"))?;
                for statement in &statements {
                    conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(statement.clone())))
                        .await
                        .map_err(|e| format!("{statement}: {e}"))?;
                }
                let _ = conn.close().await;
                Ok::<(), String>(())
            })
        })
        .join();
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(error)) => panic!("test database setup failed: {error}"),
            Err(_) => panic!("test database setup thread panicked"),
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let mut statements = vec![format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )];
        let logins = std::mem::take(
            &mut *self
                .logins
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for login in logins {
            statements.push(format!("DROP ROLE IF EXISTS {login}"));
        }
        statements.push(format!("DROP ROLE IF EXISTS {}", self.role));
        let refs: Vec<&str> = statements.iter().map(String::as_str).collect();
        if std::thread::panicking() {
            // A failing test keeps its database for inspection only if dropping would panic
            // again; try, but never panic inside a panic.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.admin(&refs)));
        } else {
            self.admin(&refs);
        }
    }
}

/// `url` with its path (the database) replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            parsed.set_path(&format!("/{database}"));
            parsed.to_string()
        }
        Err(error) => panic!("{SERVER} is not a URL: {error}"),
    }
}

/// 12 lowercase hex digits from the operating system's generator.
fn random_suffix() -> String {
    let mut bytes = [0u8; 6];
    if let Err(error) = getrandom::fill(&mut bytes) {
        panic!("no randomness for a test database name: {error}");
    }
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_url_keeps_the_server_and_changes_the_database() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/test", "loom_t_1"),
            "postgres://postgres@127.0.0.1:5432/loom_t_1"
        );
    }

    #[test]
    fn a_database_is_created_then_dropped() {
        let Some(db) = TestDb::create("a_database_is_created_then_dropped") else {
            return;
        };
        let name = db.name().to_owned();
        db.admin(&["SELECT 1"]);
        let url = db.url();
        let exists = move |name: String| {
            let url = url.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async move {
                    let server = with_database(&url, "postgres");
                    let mut conn = PgConnection::connect(&server).await.unwrap();
                    let found: Option<(i32,)> =
                        sqlx::query_as("SELECT 1 FROM pg_database WHERE datname = $1")
                            .bind(&name)
                            .fetch_optional(&mut conn)
                            .await
                            .unwrap();
                    found.is_some()
                })
            })
            .join()
            .unwrap()
        };
        assert!(exists(name.clone()), "{name} was not created");
        drop(db);
        assert!(!exists(name.clone()), "{name} was not dropped");
    }
}
