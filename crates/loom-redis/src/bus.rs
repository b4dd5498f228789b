//! The event bus on Redis pub/sub ([`RedisBus`]): each signal is published as its JSON on one
//! channel (`loom:events` by default) through a [`ConnectionManager`] (which reconnects by
//! itself), and each subscription is a pub/sub connection of its own.
//!
//! Redis keeps nothing for a subscriber that is not connected: a signal published while a
//! subscription is down is lost for it. The stream then ends after an error item, and the
//! subscriber subscribes again and reads the journal to catch up (the port's contract).

use loom_core::{
    BoxFuture,
    bus::{BusError, EventBus, Signal, Signals},
};
use redis::{Client, aio::ConnectionManager};
use tokio::sync::OnceCell;

use crate::error::{RedisError, is_unavailable};

/// The channel signals travel on unless another is chosen.
pub const DEFAULT_CHANNEL: &str = "loom:events";

/// An [`EventBus`] on Redis pub/sub, shared by every process that names the same server and
/// channel. Connects lazily: building it reaches nothing.
#[derive(Clone)]
pub struct RedisBus {
    client: Client,
    channel: String,
    /// The publishing connection, opened at the first publish or ping.
    publisher: std::sync::Arc<OnceCell<ConnectionManager>>,
}

impl std::fmt::Debug for RedisBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password: only the channel is shown.
        f.debug_struct("RedisBus")
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

impl RedisBus {
    /// A bus on the server `url` names (`redis://host:port[/db]`), on [`DEFAULT_CHANNEL`].
    /// Refused when the URL does not parse; nothing is reached yet.
    pub fn new(url: &str) -> Result<RedisBus, RedisError> {
        let client =
            Client::open(url).map_err(|error| RedisError::Url(format!("{:?}", error.kind())))?;
        Ok(RedisBus {
            client,
            channel: DEFAULT_CHANNEL.to_owned(),
            publisher: std::sync::Arc::new(OnceCell::new()),
        })
    }

    /// The same bus on another channel (tests keep apart this way). Refused when empty.
    pub fn with_channel(mut self, channel: impl Into<String>) -> Result<RedisBus, RedisError> {
        let channel = channel.into();
        if channel.is_empty() {
            return Err(RedisError::Name {
                what: "channel",
                value: channel,
                reason: "it is empty",
            });
        }
        self.channel = channel;
        Ok(self)
    }

    /// The channel signals travel on.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    async fn publisher(&self) -> Result<ConnectionManager, BusError> {
        self.publisher
            .get_or_try_init(|| self.client.get_connection_manager())
            .await
            .cloned()
            .map_err(bus_error)
    }
}

/// A Redis failure as a [`BusError`], by kind.
fn bus_error(error: redis::RedisError) -> BusError {
    if is_unavailable(&error) {
        BusError::Unavailable(format!("redis: {error}"))
    } else {
        BusError::Refused(format!("redis: {error}"))
    }
}

impl EventBus for RedisBus {
    fn publish<'a>(&'a self, signal: &'a Signal) -> BoxFuture<'a, Result<(), BusError>> {
        Box::pin(async move {
            let payload = serde_json::to_string(signal)
                .map_err(|error| BusError::Refused(format!("a signal as JSON: {error}")))?;
            let mut connection = self.publisher().await?;
            redis::cmd("PUBLISH")
                .arg(&self.channel)
                .arg(payload)
                .query_async::<i64>(&mut connection)
                .await
                .map(|_| ())
                .map_err(bus_error)
        })
    }

    fn subscribe(&self) -> BoxFuture<'_, Result<Signals, BusError>> {
        Box::pin(async move {
            let mut pubsub = self.client.get_async_pubsub().await.map_err(bus_error)?;
            pubsub.subscribe(&self.channel).await.map_err(bus_error)?;
            let messages = pubsub.into_on_message();
            let channel = self.channel.clone();
            let signals: Signals = Box::pin(futures_util::stream::unfold(
                Some(messages),
                move |messages| {
                    let channel = channel.clone();
                    async move {
                        let mut messages = messages?;
                        loop {
                            let Some(message) = futures_util::StreamExt::next(&mut messages).await
                            else {
                                let lost = BusError::Unavailable(format!(
                                    "redis: the subscription to {channel} lost its connection"
                                ));
                                return Some((Err(lost), None));
                            };
                            match serde_json::from_slice::<Signal>(message.get_payload_bytes()) {
                                Ok(signal) => return Some((Ok(signal), Some(messages))),
                                Err(error) => tracing::warn!(
                                    %channel,
                                    %error,
                                    "an unreadable message on the event bus was skipped"
                                ),
                            }
                        }
                    }
                },
            ));
            Ok(signals)
        })
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), BusError>> {
        Box::pin(async move {
            let mut connection = self.publisher().await?;
            redis::cmd("PING")
                .query_async::<String>(&mut connection)
                .await
                .map(|_| ())
                .map_err(bus_error)
        })
    }
}
