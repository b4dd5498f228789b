//! The checks of the PostgreSQL storage settings: `storage.events` (`dsn_env`, `role`, `pool`),
//! `storage.idempotency` and `storage.artifacts` with the `postgres` backend.

use crate::error::{ConfigError, ConfigErrorKind};
use crate::model::{ArtifactsBackend, EventsBackend, IdempotencyBackend, LoomConfig, PostgresPool};
use crate::yaml::KeyPath;

use super::Doc;

/// Whether `name` can name an environment variable (`[A-Za-z_][A-Za-z0-9_]*`).
pub(super) fn env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'A'..=b'Z' | b'a'..=b'z' | b'_'))
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Whether `role` can name the application role: a plain lowercase identifier of at most 63
/// bytes (it reads the same quoted or not).
pub(crate) fn is_postgres_role(role: &str) -> bool {
    let mut bytes = role.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
        && role.len() <= 63
}

/// Checks the pool at `path`: sizes from 1 with `min_size <= max_size`, timeouts positive.
fn check_pool(doc: &Doc, path: &KeyPath, pool: &PostgresPool) -> Result<(), ConfigError> {
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    if pool.min_size == 0 {
        return Err(invalid(&path.key("min_size"), "must be 1 or more".into()));
    }
    if pool.max_size < pool.min_size {
        return Err(invalid(
            &path.key("max_size"),
            format!(
                "max_size {} is below min_size {}",
                pool.max_size, pool.min_size
            ),
        ));
    }
    for (key, seconds) in [
        ("command_timeout", pool.command_timeout),
        ("lock_timeout", pool.lock_timeout),
        ("acquire_timeout", pool.acquire_timeout),
    ] {
        if !(seconds.is_finite() && seconds > 0.0 && seconds <= 86_400.0) {
            return Err(invalid(
                &path.key(key),
                "must be a number of seconds above 0 (at most a day)".into(),
            ));
        }
    }
    Ok(())
}

/// Checks `dsn_env` and `role` of a PostgreSQL store at `path`.
fn check_names(
    doc: &Doc,
    path: &KeyPath,
    dsn_env: Option<&str>,
    role: Option<&str>,
) -> Result<(), ConfigError> {
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    if let Some(name) = dsn_env
        && !env_name(name)
    {
        return Err(invalid(
            &path.key("dsn_env"),
            format!(
                "'{name}' is not an environment variable name (it names the variable holding the DSN, not the DSN)"
            ),
        ));
    }
    if let Some(role) = role
        && !is_postgres_role(role)
    {
        return Err(invalid(
            &path.key("role"),
            format!(
                "role '{role}' is not a lowercase identifier [a-z_][a-z0-9_]* of at most 63 bytes"
            ),
        ));
    }
    Ok(())
}

/// The PostgreSQL settings of `storage`: required where the backend is `postgres`, refused
/// elsewhere, well-formed.
pub(super) fn check_postgres(doc: &Doc, raw: &LoomConfig) -> Result<(), ConfigError> {
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    let storage = &raw.storage;
    let events = &storage.events;
    let ep = KeyPath::root().key("storage").key("events");
    let postgres = events.backend == EventsBackend::Postgres;
    if postgres {
        if events.dsn_env.is_none() {
            return Err(invalid(
                &ep.key("backend"),
                "backend 'postgres' requires 'dsn_env' (the name of the environment variable \
                 holding the DSN)"
                    .into(),
            ));
        }
        if events.path.is_some() {
            return Err(invalid(
                &ep.key("path"),
                "the postgres journal has no path (its database is named by dsn_env)".into(),
            ));
        }
        check_names(doc, &ep, events.dsn_env.as_deref(), Some(&events.role))?;
        check_pool(doc, &ep.key("pool"), &events.pool)?;
    } else {
        let pool_set = events.pool != PostgresPool::default();
        let role_set = events.role != crate::model::DEFAULT_POSTGRES_ROLE;
        for (key, set) in [
            ("dsn_env", events.dsn_env.is_some()),
            ("role", role_set),
            ("pool", pool_set),
        ] {
            if set {
                return Err(invalid(
                    &ep.key(key),
                    format!("'{key}' is only for the postgres backend"),
                ));
            }
        }
    }
    if let Some(idempotency) = &storage.idempotency {
        let ip = KeyPath::root().key("storage").key("idempotency");
        if idempotency.backend == IdempotencyBackend::Postgres {
            if idempotency.dsn_env.is_none() && !postgres {
                return Err(invalid(
                    &ip.key("backend"),
                    "backend 'postgres' requires 'dsn_env' (or a postgres journal to share)".into(),
                ));
            }
            if idempotency.path.is_some() {
                return Err(invalid(
                    &ip.key("path"),
                    "the postgres idempotency store has no path (its database is named by \
                     dsn_env)"
                        .into(),
                ));
            }
            check_names(
                doc,
                &ip,
                idempotency.dsn_env.as_deref(),
                idempotency.role.as_deref(),
            )?;
            if let Some(pool) = &idempotency.pool {
                check_pool(doc, &ip.key("pool"), pool)?;
            }
        } else {
            for (key, set) in [
                ("dsn_env", idempotency.dsn_env.is_some()),
                ("role", idempotency.role.is_some()),
                ("pool", idempotency.pool.is_some()),
            ] {
                if set {
                    return Err(invalid(
                        &ip.key(key),
                        format!("'{key}' is only for the postgres backend"),
                    ));
                }
            }
        }
    }
    let artifacts = &storage.artifacts;
    let ap = KeyPath::root().key("storage").key("artifacts");
    if artifacts.backend == Some(ArtifactsBackend::Postgres) {
        if !postgres {
            return Err(invalid(
                &ap.key("backend"),
                "backend 'postgres' keeps artifacts in the journal's database: it needs \
                 storage.events.backend: postgres"
                    .into(),
            ));
        }
        if artifacts.path.is_some() {
            return Err(invalid(
                &ap.key("path"),
                "artifacts in postgres have no path".into(),
            ));
        }
    }
    if postgres && artifacts.backend == Some(ArtifactsBackend::Local) && artifacts.path.is_none() {
        return Err(invalid(
            &ap.key("backend"),
            "backend 'local' requires 'path' beside a postgres journal (by default artifacts \
             follow it into the database)"
                .into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(env_name("LOOM_PG_DSN") && env_name("_x1"));
        assert!(!env_name("") && !env_name("1A") && !env_name("postgres://x"));
        assert!(is_postgres_role("loom_app"));
        assert!(!is_postgres_role("Loom") && !is_postgres_role("a-b"));
    }
}
