//! The checks of the services a deployment of several processes shares: `storage.queue`
//! (RabbitMQ), `storage.bus` (Redis or PostgreSQL), `storage.limits` and the Redis idempotency
//! store: each backend's address named by an environment variable, no key of another backend.

use crate::error::{ConfigError, ConfigErrorKind};
use crate::model::{
    BusBackend, EventsBackend, IdempotencyBackend, LimitsBackend, LoomConfig, QueueBackend,
};
use crate::yaml::KeyPath;

use super::Doc;

/// Checks `storage.queue`, `storage.bus`, `storage.limits` and a Redis `storage.idempotency`.
pub(super) fn check_services(doc: &Doc, raw: &LoomConfig) -> Result<(), ConfigError> {
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    let storage = &raw.storage;
    let root = KeyPath::root().key("storage");
    let journal = storage.events.backend;

    let queue = &storage.queue;
    let qp = root.key("queue");
    if queue.max_running == 0 {
        return Err(invalid(&qp.key("max_running"), "must be 1 or more".into()));
    }
    if queue.max_attempts == 0 {
        return Err(invalid(&qp.key("max_attempts"), "must be 1 or more".into()));
    }
    let name_ok = !queue.name.is_empty()
        && queue.name.len() <= 64
        && queue
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if !name_ok {
        return Err(invalid(
            &qp.key("name"),
            format!(
                "queue name prefix '{}' must be 1 to 64 characters among [A-Za-z0-9_.-]",
                queue.name
            ),
        ));
    }
    match queue.backend {
        QueueBackend::Rabbitmq => {
            required_env(
                doc,
                &qp,
                queue.url_env.as_deref(),
                "url_env",
                "rabbitmq",
                "AMQP URL",
            )?;
            if journal == EventsBackend::Memory {
                return Err(invalid(
                    &qp.key("backend"),
                    "backend 'rabbitmq' hands runs to `loom worker` processes, which cannot \
                     read a memory journal: declare a durable storage.events (postgres for \
                     workers on several hosts)"
                        .into(),
                ));
            }
        }
        QueueBackend::Asyncio => {
            only_for(doc, &qp, "url_env", queue.url_env.is_some(), "rabbitmq")?
        }
    }

    let bus = &storage.bus;
    let bp = root.key("bus");
    match bus.backend {
        BusBackend::Redis => {
            required_env(
                doc,
                &bp,
                bus.url_env.as_deref(),
                "url_env",
                "redis",
                "Redis URL",
            )?;
            only_for(doc, &bp, "dsn_env", bus.dsn_env.is_some(), "postgres")?;
        }
        BusBackend::Postgres => {
            if bus.dsn_env.is_none() && journal != EventsBackend::Postgres {
                return Err(invalid(
                    &bp.key("backend"),
                    "backend 'postgres' requires 'dsn_env' (or a postgres journal to share)".into(),
                ));
            }
            if let Some(name) = bus.dsn_env.as_deref() {
                check_env_name(doc, &bp.key("dsn_env"), name)?;
            }
            only_for(doc, &bp, "url_env", bus.url_env.is_some(), "redis")?;
        }
        BusBackend::Memory => {
            only_for(doc, &bp, "url_env", bus.url_env.is_some(), "redis")?;
            only_for(doc, &bp, "dsn_env", bus.dsn_env.is_some(), "postgres")?;
        }
    }

    let limits = &storage.limits;
    let lp = root.key("limits");
    match limits.backend {
        LimitsBackend::Redis => {
            required_env(
                doc,
                &lp,
                limits.url_env.as_deref(),
                "url_env",
                "redis",
                "Redis URL",
            )?;
        }
        LimitsBackend::Memory => only_for(doc, &lp, "url_env", limits.url_env.is_some(), "redis")?,
    }

    if let Some(idempotency) = &storage.idempotency {
        let ip = root.key("idempotency");
        if idempotency.backend == IdempotencyBackend::Redis {
            required_env(
                doc,
                &ip,
                idempotency.url_env.as_deref(),
                "url_env",
                "redis",
                "Redis URL",
            )?;
            only_for(doc, &ip, "path", idempotency.path.is_some(), "sqlite")?;
        } else {
            only_for(doc, &ip, "url_env", idempotency.url_env.is_some(), "redis")?;
        }
    }
    Ok(())
}

/// `key` at `path` names the variable holding the backend's address, and must be given.
fn required_env(
    doc: &Doc,
    path: &KeyPath,
    value: Option<&str>,
    key: &str,
    backend: &str,
    what: &str,
) -> Result<(), ConfigError> {
    match value {
        None => Err(doc.error(
            &path.key("backend"),
            ConfigErrorKind::Invalid,
            format!(
                "backend '{backend}' requires '{key}' (the name of the environment variable \
                 holding the {what})"
            ),
        )),
        Some(name) => check_env_name(doc, &path.key(key), name),
    }
}

fn check_env_name(doc: &Doc, path: &KeyPath, name: &str) -> Result<(), ConfigError> {
    if super::storage::env_name(name) {
        Ok(())
    } else {
        Err(doc.error(
            path,
            ConfigErrorKind::Invalid,
            format!(
                "'{name}' is not an environment variable name (it names the variable holding \
                 the address, not the address)"
            ),
        ))
    }
}

/// Refuses `key` at `path` when `set`: it belongs to the backend `backend` only.
fn only_for(
    doc: &Doc,
    path: &KeyPath,
    key: &str,
    set: bool,
    backend: &str,
) -> Result<(), ConfigError> {
    if set {
        Err(doc.error(
            &path.key(key),
            ConfigErrorKind::Invalid,
            format!("'{key}' is only for the {backend} backend"),
        ))
    } else {
        Ok(())
    }
}
