//! The connection to a Loom database: options (DSN, role, pool settings), the pool whose every
//! connection runs as the application role, the tenant transaction, and the schema steps run
//! as the DSN's own user ([`PgDatabase::migrate`], [`PgDatabase::check`]).

use std::{
    fmt, io,
    sync::{Arc, OnceLock},
    time::Duration,
};

use loom_core::ports::StoreError;
use sqlx::{
    Connection, Postgres, Transaction,
    postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions},
};
use tracing::{debug, info, warn};

use crate::{
    PgError,
    schema::{self, DEFAULT_ROLE, quote},
};

/// How Loom's pool is sized and how long it waits (reference §4.4 `pool`), all durations
/// strictly positive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolSettings {
    /// Connections kept open (at least 1).
    pub min_size: u32,
    /// Connections at most (at least `min_size`).
    pub max_size: u32,
    /// The longest a statement may run (`statement_timeout`).
    pub command_timeout: Duration,
    /// The longest a statement waits for a lock (`lock_timeout`), the session's write lock
    /// included.
    pub lock_timeout: Duration,
    /// The longest a caller waits for a free connection.
    pub acquire_timeout: Duration,
}

impl Default for PoolSettings {
    fn default() -> PoolSettings {
        PoolSettings {
            min_size: 1,
            max_size: 10,
            command_timeout: Duration::from_secs(60),
            lock_timeout: Duration::from_secs(10),
            acquire_timeout: Duration::from_secs(30),
        }
    }
}

/// Where and how to connect. The DSN is a `postgres://` (or `postgresql://`) URL, without TLS:
/// this build has no TLS feature, so it reaches a server on a Unix socket or plain TCP
/// (`sslmode=prefer`, the default, falls back to plain; `require` is refused at connection).
#[derive(Clone)]
pub struct PgOptions {
    /// The DSN (never printed: it may hold a password).
    pub dsn: String,
    /// The application role every pooled connection switches to (`SET ROLE`).
    pub role: String,
    /// Pool size and timeouts.
    pub pool: PoolSettings,
}

impl PgOptions {
    /// Options for `dsn` with the default role and pool.
    pub fn new(dsn: impl Into<String>) -> PgOptions {
        PgOptions {
            dsn: dsn.into(),
            role: DEFAULT_ROLE.to_owned(),
            pool: PoolSettings::default(),
        }
    }

    /// The same options with another role.
    pub fn with_role(mut self, role: impl Into<String>) -> PgOptions {
        self.role = role.into();
        self
    }
}

impl fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgOptions")
            .field("dsn", &"<redacted>")
            .field("role", &self.role)
            .field("pool", &self.pool)
            .finish()
    }
}

/// A Loom database: a pool of connections running as the application role, shared by the
/// journal ([`crate::PgStore`]), the idempotency keys ([`crate::PgIdempotency`]) and the
/// artifacts ([`crate::PgArtifacts`]). Cheap to clone.
#[derive(Clone)]
pub struct PgDatabase {
    inner: Arc<Inner>,
}

struct Inner {
    connect: PgConnectOptions,
    role: String,
    pool_settings: PoolSettings,
    /// `postgres://host:port/db` (no user, no password): how errors name the database.
    name: String,
    /// Created at first use, inside the caller's tokio runtime.
    pool: OnceLock<PgPool>,
}

impl fmt::Debug for PgDatabase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgDatabase")
            .field("name", &self.inner.name)
            .field("role", &self.inner.role)
            .finish_non_exhaustive()
    }
}

impl PgDatabase {
    /// A database handle for `options`, connecting lazily (nothing is reached yet). Refuses a
    /// DSN that does not parse, a role that is not a plain identifier, and pool settings out of
    /// range.
    pub fn new(options: &PgOptions) -> Result<PgDatabase, PgError> {
        schema::check_role(&options.role)?;
        let pool = options.pool;
        if pool.min_size == 0 || pool.max_size < pool.min_size {
            return Err(PgError::Pool(format!(
                "min_size {} and max_size {}: need 1 <= min_size <= max_size",
                pool.min_size, pool.max_size
            )));
        }
        for (what, value) in [
            ("command_timeout", pool.command_timeout),
            ("lock_timeout", pool.lock_timeout),
            ("acquire_timeout", pool.acquire_timeout),
        ] {
            if value.is_zero() {
                return Err(PgError::Pool(format!("{what} must be more than 0")));
            }
        }
        // The parser's message may quote the DSN (and its password): it is not repeated.
        let url = options.dsn.trim();
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(PgError::Dsn);
        }
        let connect: PgConnectOptions = url.parse().map_err(|_| PgError::Dsn)?;
        let connect = connect.application_name("loom");
        let name = match connect.get_socket() {
            Some(socket) => format!(
                "postgres://{}/{}",
                socket.display(),
                connect.get_database().unwrap_or_default()
            ),
            None => format!(
                "postgres://{}:{}/{}",
                connect.get_host(),
                connect.get_port(),
                connect.get_database().unwrap_or_default()
            ),
        };
        Ok(PgDatabase {
            inner: Arc::new(Inner {
                connect,
                role: options.role.clone(),
                pool_settings: pool,
                name,
                pool: OnceLock::new(),
            }),
        })
    }

    /// The database as errors name it: `postgres://host:port/db`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The application role.
    pub fn role(&self) -> &str {
        &self.inner.role
    }

    /// A connection as the DSN's own user (no `SET ROLE`): for the schema steps.
    async fn owner_connection(&self) -> Result<PgConnection, PgError> {
        PgConnection::connect_with(&self.inner.connect)
            .await
            .map_err(|source| PgError::Connect {
                database: self.inner.name.clone(),
                source,
            })
    }

    /// Whether the DSN's user may switch to the application role, as every pooled connection
    /// will: refused at start ([`PgError::Role`]) rather than at the first run.
    async fn check_role_usable(&self, conn: &mut PgConnection) -> Result<(), PgError> {
        let switch = format!("SET ROLE {}; RESET ROLE", quote(&self.inner.role));
        sqlx::raw_sql(sqlx::AssertSqlSafe(switch))
            .execute(&mut *conn)
            .await
            .map(|_| ())
            .map_err(|source| PgError::Role {
                role: self.inner.role.clone(),
                source,
            })
    }

    /// Applies the migrations the database lacks (see [`schema::migrate`]), on a connection of
    /// its own as the DSN's user, who then owns the tables. Returns what was applied.
    pub async fn migrate(&self) -> Result<Vec<String>, PgError> {
        let mut conn = self.owner_connection().await?;
        let applied = match schema::migrate(&mut conn, &self.inner.role).await {
            Ok(applied) => self.check_role_usable(&mut conn).await.map(|()| applied),
            Err(err) => Err(err),
        };
        close(conn).await;
        let applied = applied?;
        if !applied.is_empty() {
            info!(database = %self.inner.name, applied = ?applied, "PostgreSQL schema migrated");
        }
        Ok(applied)
    }

    /// Checks that the schema is this build's (see [`schema::check`]) and that the DSN's user
    /// may switch to the application role, changing nothing.
    pub async fn check(&self) -> Result<(), PgError> {
        let mut conn = self.owner_connection().await?;
        let checked = match schema::check(&mut conn).await {
            Ok(()) => self.check_role_usable(&mut conn).await,
            Err(err) => Err(err),
        };
        close(conn).await;
        checked
    }

    /// The pool, created at first use (it needs the tokio runtime). Every connection runs
    /// `SET ROLE <role>` and the timeouts when it opens, so that Loom's statements run as the
    /// application role, which is neither the owner of the tables nor a superuser: row-level
    /// security applies to them.
    pub fn pool(&self) -> &PgPool {
        self.inner.pool.get_or_init(|| {
            let settings = self.inner.pool_settings;
            self.new_pool(
                PgPoolOptions::new()
                    .min_connections(settings.min_size)
                    .max_connections(settings.max_size)
                    .acquire_timeout(settings.acquire_timeout)
                    .idle_timeout(Some(Duration::from_secs(300))),
            )
        })
    }

    /// A pool of one connection, apart from [`PgDatabase::pool`], set up like it (`SET ROLE`,
    /// timeouts): what a `LISTEN` holds for as long as it listens, so that it never takes a
    /// connection from the statements. Connects lazily.
    pub(crate) fn single_pool(&self) -> PgPool {
        self.new_pool(
            PgPoolOptions::new()
                .min_connections(0)
                .max_connections(1)
                .acquire_timeout(self.inner.pool_settings.acquire_timeout)
                .idle_timeout(None)
                .max_lifetime(None),
        )
    }

    /// A lazy pool with `options` whose every connection runs as the application role, with
    /// the statement and lock timeouts.
    fn new_pool(&self, options: PgPoolOptions) -> PgPool {
        let settings = self.inner.pool_settings;
        let setup = format!(
            "SET ROLE {}; SET statement_timeout = {}; SET lock_timeout = {}",
            quote(&self.inner.role),
            millis(settings.command_timeout),
            millis(settings.lock_timeout)
        );
        let setup: Arc<str> = setup.into();
        options
            .after_connect(move |conn, _meta| {
                let setup = setup.clone();
                Box::pin(async move {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(setup.to_string()))
                        .execute(&mut *conn)
                        .await
                        .map(|_| ())
                })
            })
            .connect_lazy_with(self.inner.connect.clone())
    }

    /// A transaction for `tenant_id`: its first statement sets `loom.tenant_id` for this
    /// transaction only (`set_config(…, true)`), so that row-level security restricts every
    /// statement to the tenant, and a pooled connection never carries it to the next user.
    pub(crate) async fn begin(
        &self,
        tenant_id: &str,
    ) -> Result<Transaction<'static, Postgres>, StoreError> {
        let mut tx = self.pool().begin().await.map_err(|e| self.error(e))?;
        sqlx::query("SELECT set_config('loom.tenant_id', $1, true)")
            .bind(tenant_id)
            .execute(&mut *tx)
            .await
            .map_err(|e| self.error(e))?;
        Ok(tx)
    }

    /// Ends `tx`: commits on success, rolls back (logging a failed rollback) otherwise.
    pub(crate) async fn finish<T>(
        &self,
        tx: Transaction<'static, Postgres>,
        result: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match result {
            Ok(value) => {
                tx.commit().await.map_err(|err| self.error(err))?;
                Ok(value)
            }
            Err(err) => {
                if let Err(undo) = tx.rollback().await {
                    warn!(database = %self.inner.name, error = %undo, "rollback failed");
                }
                Err(err)
            }
        }
    }

    /// A database error as a [`StoreError`] naming the database.
    pub(crate) fn error(&self, err: sqlx::Error) -> StoreError {
        let source = match err {
            sqlx::Error::Io(source) => source,
            other => io::Error::other(other),
        };
        StoreError::Io {
            path: self.inner.name.clone(),
            source,
        }
    }

    /// Closes the pool (waiting for the connections in use). The handle must not be used
    /// afterwards.
    pub async fn close(&self) {
        if let Some(pool) = self.inner.pool.get() {
            pool.close().await;
        }
    }
}

/// Milliseconds, as `SET …_timeout` takes them (at least 1).
fn millis(duration: Duration) -> u128 {
    duration.as_millis().max(1)
}

/// Closes a connection, logging (not failing) when the goodbye fails.
async fn close(conn: PgConnection) {
    if let Err(err) = conn.close().await {
        debug!(error = %err, "closing a schema connection failed");
    }
}
