//! The event bus the configuration declares (`storage.bus`), built when the instance is:
//! `memory` (the default: within this process), `redis` (feature `redis`: the URL read from
//! the variable `url_env` names, through [`crate::env`]) or `postgres` (feature `postgres`:
//! built with the PostgreSQL stores, see [`crate::postgres`]). A backend the build lacks is
//! refused, naming the feature.

use std::sync::Arc;

use loom_config::{BusBackend, Config};
use loom_core::bus::EventBus;
use loom_journal::MemoryBus;

use crate::LoomError;

/// An instance's event bus, and whether it reaches other processes.
#[derive(Debug, Clone)]
pub(crate) struct Bus {
    /// The bus.
    pub(crate) bus: Arc<dyn EventBus>,
    /// Whether other processes hear it (`redis`, `postgres`, a bus the caller gave); a
    /// `memory` bus does not, so a cancellation never waits for a driver it cannot reach.
    pub(crate) shared: bool,
}

/// The bus of `config`; `postgres` is the one [`crate::postgres`] built, if any.
pub(crate) fn event_bus(
    config: &Config,
    postgres: Option<Arc<dyn EventBus>>,
) -> Result<Bus, LoomError> {
    let bus = match config.raw().storage.bus.backend {
        BusBackend::Memory => {
            return Ok(Bus {
                bus: Arc::new(MemoryBus::new()),
                shared: false,
            });
        }
        BusBackend::Redis => redis_bus(config),
        // Without the `postgres` feature, `crate::postgres` refused it before this is asked.
        BusBackend::Postgres => postgres.ok_or_else(|| {
            config
                .error_at_root(
                    "storage.bus.backend",
                    "the postgres bus is opened with the PostgreSQL stores (Loom::new, Loom::open)",
                )
                .into()
        }),
    }?;
    Ok(Bus { bus, shared: true })
}

/// The Redis bus, its URL read from the variable `storage.bus.url_env` names.
#[cfg(feature = "redis")]
fn redis_bus(config: &Config) -> Result<Arc<dyn EventBus>, LoomError> {
    let at = |message: String| -> LoomError {
        config.error_at_root("storage.bus.url_env", message).into()
    };
    let Some(name) = config.raw().storage.bus.url_env.as_deref() else {
        return Err(at(
            "the redis bus needs url_env, the variable holding its URL".into(),
        ));
    };
    let Some(url) = crate::env::var(config, name).filter(|v| !v.is_empty()) else {
        return Err(at(format!(
            "the environment variable {name} is not set (it must hold the Redis URL, \
             redis://host:port[/db])"
        )));
    };
    loom_redis::RedisBus::new(&url)
        .map(|bus| Arc::new(bus) as Arc<dyn EventBus>)
        .map_err(|error| at(format!("the value of {name}: {error}")))
}

/// Without the `redis` feature, the `redis` bus is a configuration error.
#[cfg(not(feature = "redis"))]
fn redis_bus(config: &Config) -> Result<Arc<dyn EventBus>, LoomError> {
    Err(config
        .error_at_root(
            "storage.bus.backend",
            "backend 'redis' needs the `redis` feature of loom-ia, which this build lacks \
             (loom-cli enables it by default)",
        )
        .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> Config {
        let dir = std::env::temp_dir();
        match loom_config::from_yaml_str(yaml, &dir, None, &|_| None) {
            Ok(config) => config,
            Err(error) => panic!("the configuration itself is valid: {error}"),
        }
    }

    /// A build without the feature refuses a redis bus, naming the feature; with it, a
    /// missing variable is refused naming it.
    #[test]
    fn a_redis_bus_needs_its_feature_and_its_variable() {
        let config = config(
            "version: 1\nstorage:\n  bus: {backend: redis, url_env: LOOM_BUS_TEST_UNSET_URL}\n",
        );
        let refused = event_bus(&config, None).err().map(|e| e.to_string());
        let expected = if cfg!(feature = "redis") {
            "LOOM_BUS_TEST_UNSET_URL is not set"
        } else {
            "`redis` feature of loom-ia"
        };
        assert!(
            refused.as_deref().is_some_and(|m| m.contains(expected)),
            "{refused:?}"
        );
    }

    #[test]
    fn the_default_bus_is_in_memory() {
        let config = config("version: 1\n");
        assert!(event_bus(&config, None).is_ok());
    }
}
