//! The Redis stores the configuration declares for a service of several processes
//! (`storage.limits` `backend: redis`, `storage.idempotency` `backend: redis`), built when the
//! instance is: the URL is read from the variable `url_env` names (through [`crate::env`]) and
//! checked, the server reached at the first operation (a server down when the instance starts
//! refuses the limits it checks, [`LoomError::LimitsUnavailable`], until it is back). Without
//! the `redis` feature such a configuration is refused, naming the feature.
//!
//! `backend: memory` (the default) counts in this process ([`crate::quota::MemoryCounters`]).

use std::sync::Arc;

use loom_config::{Config, IdempotencyBackend, LimitsBackend};
use loom_core::{counters::Counters, ports::IdempotencyStore};

use crate::LoomError;

/// The counters of `storage.limits`.
pub(crate) fn counters(config: &Config) -> Result<Arc<dyn Counters>, LoomError> {
    let limits = &config.raw().storage.limits;
    match limits.backend {
        LimitsBackend::Memory => Ok(Arc::new(crate::quota::MemoryCounters::new())),
        LimitsBackend::Redis => {
            redis::available(config, "storage.limits.backend")?;
            let url = url(config, "storage.limits", limits.url_env.as_deref())?;
            redis::counters(config, &url)
        }
    }
}

/// The idempotency store of `storage.idempotency` when its backend is `redis`.
pub(crate) fn idempotency(config: &Config) -> Result<Option<Arc<dyn IdempotencyStore>>, LoomError> {
    match &config.raw().storage.idempotency {
        Some(storage) if storage.backend == IdempotencyBackend::Redis => {
            redis::available(config, "storage.idempotency.backend")?;
            let url = url(config, "storage.idempotency", storage.url_env.as_deref())?;
            redis::idempotency(config, &url).map(Some)
        }
        _ => Ok(None),
    }
}

/// The Redis URL of `section`, from the variable its `url_env` names.
fn url(config: &Config, section: &str, url_env: Option<&str>) -> Result<String, LoomError> {
    let Some(name) = url_env else {
        return Err(config
            .error_at_root(
                &format!("{section}.url_env"),
                "backend 'redis' needs url_env, the variable holding the Redis URL",
            )
            .into());
    };
    match crate::env::var(config, name) {
        Some(url) if !url.trim().is_empty() => Ok(url),
        _ => Err(config
            .error_at_root(
                &format!("{section}.url_env"),
                format!("the variable {name} (the Redis URL) is not set"),
            )
            .into()),
    }
}

#[cfg(feature = "redis")]
mod redis {
    use std::sync::Arc;

    use loom_config::Config;
    use loom_core::{counters::Counters, ports::IdempotencyStore};
    use loom_redis::{RedisCounters, RedisIdempotency};

    use crate::LoomError;

    /// The `redis` feature is built.
    pub(super) fn available(_config: &Config, _key: &str) -> Result<(), LoomError> {
        Ok(())
    }

    pub(super) fn counters(config: &Config, url: &str) -> Result<Arc<dyn Counters>, LoomError> {
        RedisCounters::new(url)
            .map(|counters| Arc::new(counters) as Arc<dyn Counters>)
            .map_err(|err| {
                config
                    .error_at_root("storage.limits.url_env", err.to_string())
                    .into()
            })
    }

    pub(super) fn idempotency(
        config: &Config,
        url: &str,
    ) -> Result<Arc<dyn IdempotencyStore>, LoomError> {
        RedisIdempotency::new(url)
            .map(|store| Arc::new(store) as Arc<dyn IdempotencyStore>)
            .map_err(|err| {
                config
                    .error_at_root("storage.idempotency.url_env", err.to_string())
                    .into()
            })
    }
}

#[cfg(not(feature = "redis"))]
mod redis {
    use std::sync::Arc;

    use loom_config::Config;
    use loom_core::{counters::Counters, ports::IdempotencyStore};

    use crate::LoomError;

    /// Without the `redis` feature, a `redis` backend is a configuration error.
    pub(super) fn available(config: &Config, key: &str) -> Result<(), LoomError> {
        Err(config
            .error_at_root(
                key,
                "backend 'redis' needs the `redis` feature of loom-ia, which this build lacks \
                 (loom-cli enables it by default)",
            )
            .into())
    }

    /// Refused: see [`available`].
    pub(super) fn counters(config: &Config, _url: &str) -> Result<Arc<dyn Counters>, LoomError> {
        available(config, "storage.limits.backend").and(Err(LoomError::Refused(
            "backend 'redis' needs the `redis` feature of loom-ia".into(),
        )))
    }

    /// Refused: see [`available`].
    pub(super) fn idempotency(
        config: &Config,
        _url: &str,
    ) -> Result<Arc<dyn IdempotencyStore>, LoomError> {
        available(config, "storage.idempotency.backend").and(Err(LoomError::Refused(
            "backend 'redis' needs the `redis` feature of loom-ia".into(),
        )))
    }
}
