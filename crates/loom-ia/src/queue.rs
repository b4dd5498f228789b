//! The job queue `storage.queue` declares: none for `asyncio` (background runs are driven in
//! the process that accepts them), RabbitMQ for `rabbitmq` (feature `rabbitmq`), its AMQP URL
//! read from the variable `url_env` names.

use std::sync::Arc;

use loom_config::{Config, QueueBackend};
use loom_core::queue::JobQueue;

use crate::LoomError;

/// Whether `storage.queue` declares a broker (`asyncio` does not).
pub(crate) fn declared(config: &Config) -> bool {
    config.raw().storage.queue.backend != QueueBackend::Asyncio
}

/// Connects the broker `storage.queue` declares (see [`declared`]).
pub(crate) async fn connect(config: &Config) -> Result<Arc<dyn JobQueue>, LoomError> {
    rabbitmq(config).await
}

/// The AMQP URL from the variable `storage.queue.url_env` names.
#[cfg_attr(not(feature = "rabbitmq"), allow(dead_code))]
fn url(config: &Config) -> Result<String, LoomError> {
    let name = config
        .raw()
        .storage
        .queue
        .url_env
        .clone()
        .unwrap_or_default();
    crate::env::var(config, &name)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            config
                .error_at_root(
                    "storage.queue.url_env",
                    format!(
                        "the environment variable {name} is not set (it must hold the AMQP URL, \
                         amqp://user:password@host:5672/vhost)"
                    ),
                )
                .into()
        })
}

#[cfg(feature = "rabbitmq")]
async fn rabbitmq(config: &Config) -> Result<Arc<dyn JobQueue>, LoomError> {
    let queue = &config.raw().storage.queue;
    let options = loom_rabbitmq::QueueOptions {
        prefix: queue.name.clone(),
        max_attempts: queue.max_attempts,
    };
    let connected = loom_rabbitmq::RabbitQueue::connect(&url(config)?, options)
        .await
        .map_err(|error| LoomError::Queue(error.into()))?;
    Ok(Arc::new(connected))
}

#[cfg(not(feature = "rabbitmq"))]
async fn rabbitmq(config: &Config) -> Result<Arc<dyn JobQueue>, LoomError> {
    Err(config
        .error_at_root(
            "storage.queue.backend",
            "backend 'rabbitmq' needs the `rabbitmq` feature of loom-ia, which this build lacks \
             (loom-cli enables it by default)",
        )
        .into())
}
