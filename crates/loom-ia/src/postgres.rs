//! The PostgreSQL stores the configuration declares (`storage.events`, `storage.idempotency`,
//! `storage.artifacts` with the `postgres` backend), built when the instance is: the DSN is
//! read from the variable `dsn_env` names (through [`crate::env`]), and the schema is migrated
//! (`storage.migrate: auto`) or checked (`check`, the default) before anything else is done.
//! The PostgreSQL event bus (`storage.bus.backend: postgres`) is built here too, on the
//! journal's database (and pool) unless `storage.bus.dsn_env` names another: it needs no
//! schema, only the application role, which any role may `LISTEN` and `NOTIFY` as.
//! Without the `postgres` feature such a configuration is refused, naming the feature.

use std::sync::Arc;

use loom_config::{BusBackend, Config, EventsBackend, IdempotencyBackend};
use loom_core::{
    bus::EventBus,
    ports::{ArtifactStore, EventStore, IdempotencyStore},
};

#[cfg(not(feature = "postgres"))]
use crate::LoomError;

/// What the PostgreSQL part of the configuration opened: each is `None` when its backend is
/// not `postgres`.
#[derive(Default)]
pub(crate) struct Opened {
    /// The journal.
    pub(crate) journal: Option<Arc<dyn EventStore>>,
    /// The idempotency store.
    pub(crate) idempotency: Option<Arc<dyn IdempotencyStore>>,
    /// The artifacts.
    pub(crate) artifacts: Option<Arc<dyn ArtifactStore>>,
    /// The event bus.
    pub(crate) bus: Option<Arc<dyn EventBus>>,
}

/// Whether any store of the configuration is on PostgreSQL.
pub(crate) fn wanted(config: &Config) -> bool {
    let storage = &config.raw().storage;
    storage.events.backend == EventsBackend::Postgres
        || storage
            .idempotency
            .as_ref()
            .is_some_and(|i| i.backend == IdempotencyBackend::Postgres)
        || config.artifacts_in_postgres()
        || storage.bus.backend == BusBackend::Postgres
}

#[cfg(not(feature = "postgres"))]
fn refused(config: &Config) -> Result<Opened, LoomError> {
    if !wanted(config) {
        return Ok(Opened::default());
    }
    let storage = &config.raw().storage;
    let key = if storage.events.backend == EventsBackend::Postgres {
        "storage.events.backend"
    } else if config.artifacts_in_postgres() {
        "storage.artifacts.backend"
    } else if storage.bus.backend == BusBackend::Postgres {
        "storage.bus.backend"
    } else {
        "storage.idempotency.backend"
    };
    Err(config
        .error_at_root(
            key,
            "backend 'postgres' needs the `postgres` feature of loom-ia, which this build lacks \
             (loom-cli enables it by default)",
        )
        .into())
}

/// Without the `postgres` feature, a `postgres` backend is a configuration error.
#[cfg(not(feature = "postgres"))]
pub(crate) async fn open(config: &Config) -> Result<Opened, LoomError> {
    refused(config)
}

/// Without the `postgres` feature, a `postgres` backend is a configuration error.
#[cfg(not(feature = "postgres"))]
pub(crate) fn open_blocking(config: &Config) -> Result<Opened, LoomError> {
    refused(config)
}

#[cfg(feature = "postgres")]
pub(crate) use with_feature::{open, open_blocking};

/// The whole PostgreSQL schema for the application role `role` (`loom storage sql`): the
/// migrations table, the role, every table with its forced row-level security policy and its
/// grants, as one script a DBA applies with `psql -v ON_ERROR_STOP=1` as the user that will
/// own the tables. Refused ([`crate::LoomError::Invalid`]) for a role that is not a lowercase
/// identifier.
#[cfg(feature = "postgres")]
pub fn storage_sql(role: &str) -> Result<String, crate::LoomError> {
    loom_postgres::schema::sql(role).map_err(|err| crate::LoomError::Invalid(err.to_string()))
}

/// Without the `postgres` feature there is no schema to print: refused, naming the feature.
#[cfg(not(feature = "postgres"))]
pub fn storage_sql(_role: &str) -> Result<String, LoomError> {
    Err(LoomError::Refused(
        "the PostgreSQL schema needs the `postgres` feature of loom-ia, which this build lacks"
            .into(),
    ))
}

#[cfg(feature = "postgres")]
mod with_feature {
    use std::{sync::Arc, time::Duration};

    use loom_config::{
        BusBackend, Config, EventsBackend, IdempotencyBackend, MigrateMode, PostgresPool,
    };
    use loom_core::ports::StoreError;
    use loom_postgres::{
        PgArtifacts, PgBus, PgDatabase, PgError, PgIdempotency, PgOptions, PgStore, PoolSettings,
    };

    use super::{Opened, wanted};
    use crate::LoomError;

    /// Where a store's settings are (`storage.events`, `storage.idempotency`), and what they
    /// are once the idempotency store's defaults (the journal's) are filled in.
    struct Target {
        section: &'static str,
        dsn_env: String,
        role: String,
        pool: PostgresPool,
    }

    fn targets(config: &Config) -> (Option<Target>, Option<Target>) {
        let storage = &config.raw().storage;
        let events = &storage.events;
        let journal = (events.backend == EventsBackend::Postgres || config.artifacts_in_postgres())
            .then(|| Target {
                section: "storage.events",
                dsn_env: events.dsn_env.clone().unwrap_or_default(),
                role: events.role.clone(),
                pool: events.pool,
            });
        let idempotency = storage
            .idempotency
            .as_ref()
            .filter(|i| i.backend == IdempotencyBackend::Postgres)
            .map(|i| Target {
                section: "storage.idempotency",
                dsn_env: i
                    .dsn_env
                    .clone()
                    .or_else(|| events.dsn_env.clone())
                    .unwrap_or_default(),
                role: i.role.clone().unwrap_or_else(|| events.role.clone()),
                pool: i.pool.unwrap_or(events.pool),
            });
        (journal, idempotency)
    }

    fn seconds(value: f64) -> Duration {
        Duration::try_from_secs_f64(value).unwrap_or(Duration::from_secs(1))
    }

    /// The database `target` names, its DSN read from the environment (not reached yet).
    fn database(config: &Config, target: &Target) -> Result<PgDatabase, LoomError> {
        let at = |key: &str, message: String| -> LoomError {
            config
                .error_at_root(&format!("{}.{key}", target.section), message)
                .into()
        };
        let Some(dsn) = crate::env::var(config, &target.dsn_env).filter(|v| !v.is_empty()) else {
            return Err(at(
                "dsn_env",
                format!(
                    "the environment variable {} is not set (it must hold the PostgreSQL DSN, \
                     postgres://user@host:port/db)",
                    target.dsn_env
                ),
            ));
        };
        let options = PgOptions {
            dsn,
            role: target.role.clone(),
            pool: PoolSettings {
                min_size: target.pool.min_size,
                max_size: target.pool.max_size,
                command_timeout: seconds(target.pool.command_timeout),
                lock_timeout: seconds(target.pool.lock_timeout),
                acquire_timeout: seconds(target.pool.acquire_timeout),
            },
        };
        PgDatabase::new(&options).map_err(|err| match err {
            PgError::Dsn => at("dsn_env", format!("the value of {}: {err}", target.dsn_env)),
            PgError::InvalidRole(_) => at("role", err.to_string()),
            other => at("pool", other.to_string()),
        })
    }

    /// Migrates or checks the schema of `db`, as `storage.migrate` says.
    async fn prepare(config: &Config, db: &PgDatabase, section: &str) -> Result<(), LoomError> {
        let prepared = match config.raw().storage.migrate {
            MigrateMode::Auto => db.migrate().await.map(|_| ()),
            MigrateMode::Check => db.check().await,
        };
        prepared.map_err(|err| match err {
            PgError::SchemaMissing { .. } | PgError::NewerSchema { .. } => config
                .error_at_root("storage.migrate", err.to_string())
                .into(),
            PgError::Role { .. } => config
                .error_at_root(&format!("{section}.role"), err.to_string())
                .into(),
            other => LoomError::Journal(StoreError::Io {
                path: db.name().to_owned(),
                source: std::io::Error::other(other),
            }),
        })
    }

    /// Opens the PostgreSQL stores of the configuration, migrating or checking each database.
    pub(crate) async fn open(config: &Config) -> Result<Opened, LoomError> {
        if !wanted(config) {
            return Ok(Opened::default());
        }
        let (journal, idempotency) = targets(config);
        let mut opened = Opened::default();
        let mut journal_db = None;
        if let Some(target) = &journal {
            let db = database(config, target)?;
            prepare(config, &db, target.section).await?;
            if config.raw().storage.events.backend == EventsBackend::Postgres {
                opened.journal = Some(Arc::new(PgStore::new(db.clone())));
            }
            if config.artifacts_in_postgres() {
                opened.artifacts = Some(Arc::new(PgArtifacts::new(db.clone())));
            }
            journal_db = Some((target, db));
        }
        if let Some(target) = &idempotency {
            // The journal's database (and pool) when it is the same one.
            let shared = journal_db.as_ref().filter(|(j, _)| {
                j.dsn_env == target.dsn_env && j.role == target.role && j.pool == target.pool
            });
            let db = match shared {
                Some((_, db)) => db.clone(),
                None => {
                    let db = database(config, target)?;
                    prepare(config, &db, target.section).await?;
                    db
                }
            };
            opened.idempotency = Some(Arc::new(PgIdempotency::new(db)));
        }
        if config.raw().storage.bus.backend == BusBackend::Postgres {
            opened.bus = Some(bus(config, journal_db.as_ref())?);
        }
        Ok(opened)
    }

    /// The PostgreSQL bus: on the journal's database when `storage.bus.dsn_env` names none or
    /// the journal's, else on its own (no schema to check: `LISTEN/NOTIFY` need none).
    fn bus(
        config: &Config,
        journal: Option<&(&Target, PgDatabase)>,
    ) -> Result<Arc<dyn loom_core::bus::EventBus>, LoomError> {
        let storage = &config.raw().storage;
        let own = storage.bus.dsn_env.as_ref();
        if let Some((target, db)) = journal
            && own.is_none_or(|name| *name == target.dsn_env)
        {
            return Ok(Arc::new(PgBus::new(db.clone())));
        }
        let Some(dsn_env) = own.or(storage.events.dsn_env.as_ref()) else {
            return Err(config
                .error_at_root(
                    "storage.bus.dsn_env",
                    "the postgres bus needs dsn_env (or a postgres journal to share)",
                )
                .into());
        };
        let target = Target {
            section: "storage.bus",
            dsn_env: dsn_env.clone(),
            role: storage.events.role.clone(),
            pool: storage.events.pool,
        };
        Ok(Arc::new(PgBus::new(database(config, &target)?)))
    }

    /// [`open`] for a caller that may be outside a runtime (or inside one, and must not be
    /// re-entered): the schema step runs on a short-lived thread of its own; the pools are
    /// created at first use, in the caller's runtime.
    pub(crate) fn open_blocking(config: &Config) -> Result<Opened, LoomError> {
        if !wanted(config) {
            return Ok(Opened::default());
        }
        let config = config.clone();
        std::thread::Builder::new()
            .name("loom-postgres-open".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|source| {
                        LoomError::Journal(StoreError::Io {
                            path: "postgres".into(),
                            source,
                        })
                    })?;
                runtime.block_on(open(&config))
            })
            .map_err(|source| {
                LoomError::Journal(StoreError::Io {
                    path: "postgres".into(),
                    source,
                })
            })?
            .join()
            .map_err(|_| {
                LoomError::Journal(StoreError::Io {
                    path: "postgres".into(),
                    source: std::io::Error::other("the PostgreSQL setup thread panicked"),
                })
            })?
    }
}

#[cfg(all(test, not(feature = "postgres")))]
mod tests {
    use super::*;

    /// A build without the feature refuses a postgres configuration, naming the feature.
    #[test]
    fn without_the_feature_postgres_is_refused_naming_it() {
        let yaml = "version: 1\nstorage:\n  events: {backend: postgres, dsn_env: PG}\n";
        let dir = std::env::temp_dir();
        let config = loom_config::from_yaml_str(yaml, &dir, None, &|_| None);
        let Ok(config) = config else {
            panic!("the configuration itself is valid: {config:?}");
        };
        let refused = open_blocking(&config).err().map(|e| e.to_string());
        assert!(
            refused
                .as_deref()
                .is_some_and(|m| m.contains("storage.events.backend")
                    && m.contains("`postgres` feature of loom-ia")),
            "{refused:?}"
        );
        assert!(storage_sql("loom_app").is_err());
    }
}
