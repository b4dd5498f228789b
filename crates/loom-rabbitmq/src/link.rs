//! The connection to the broker, shared by every operation of one [`crate::RabbitQueue`]: made
//! again lazily, with a bounded backoff, after it was lost (lapin does not reconnect by itself),
//! each time declaring the topology and enabling publisher confirms on a fresh publishing
//! channel.

use std::{sync::Arc, time::Duration};

use chrono::Utc;
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties,
    options::{BasicPublishOptions, ConfirmSelectOptions},
    types::{AMQPValue, FieldTable, LongString, ShortString},
};
use loom_core::queue::Job;
use tokio::sync::Mutex;

use crate::{error::RabbitError, headers, topology};

/// How many times a lost connection is dialled before giving up (the next operation tries
/// again).
const DIAL_TRIES: u32 = 4;

/// The pause before the second try, doubled before each next one (100, 200, 400 ms).
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// An open connection and its publishing channel (confirms enabled).
struct Link {
    connection: Arc<Connection>,
    publisher: Channel,
}

/// What every operation and delivery of one queue shares.
pub(crate) struct Shared {
    url: String,
    pub(crate) names: topology::Names,
    pub(crate) max_attempts: u32,
    link: Mutex<Option<Link>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password: only the queue names are shown.
        f.debug_struct("Shared")
            .field("jobs", &self.names.jobs)
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// Dials the broker and declares the topology.
    pub(crate) async fn connect(
        url: &str,
        names: topology::Names,
        max_attempts: u32,
    ) -> Result<Shared, RabbitError> {
        let shared = Shared {
            url: url.to_owned(),
            names,
            max_attempts,
            link: Mutex::new(None),
        };
        shared.connection().await?;
        Ok(shared)
    }

    /// The connection, dialled again if it was lost.
    pub(crate) async fn connection(&self) -> Result<Arc<Connection>, RabbitError> {
        let mut slot = self.link.lock().await;
        self.ensure(&mut slot)
            .await
            .map(|link| link.connection.clone())
    }

    /// A fresh channel on the connection (for consuming, inspecting, redriving: a refusal
    /// closes that channel only).
    pub(crate) async fn channel(&self, what: &str) -> Result<Channel, RabbitError> {
        let connection = self.connection().await?;
        connection
            .create_channel()
            .await
            .map_err(|error| RabbitError::from_lapin(what, &error))
    }

    /// Closes the connection (deliveries not ended go back to the queue).
    pub(crate) async fn close(&self) -> Result<(), RabbitError> {
        let link = self.link.lock().await.take();
        if let Some(link) = link
            && link.connection.status().connected()
        {
            link.connection
                .close(200, ShortString::from("closed"))
                .await
                .map_err(|error| RabbitError::from_lapin("closing the connection", &error))?;
        }
        Ok(())
    }

    async fn ensure<'s>(&self, slot: &'s mut Option<Link>) -> Result<&'s mut Link, RabbitError> {
        let alive = slot
            .as_ref()
            .is_some_and(|link| link.connection.status().connected());
        if !alive {
            *slot = None;
            *slot = Some(self.dial().await?);
        }
        let link = slot.as_mut().ok_or_else(|| RabbitError::Unavailable {
            what: "connecting".to_owned(),
            detail: "no connection".to_owned(),
        })?;
        if !link.publisher.status().connected() {
            link.publisher = publisher(&link.connection).await?;
        }
        Ok(link)
    }

    async fn dial(&self) -> Result<Link, RabbitError> {
        let mut backoff = FIRST_BACKOFF;
        let mut tries = 1;
        loop {
            match self.dial_once().await {
                Ok(link) => return Ok(link),
                Err(error) if error.is_unavailable() && tries < DIAL_TRIES => {
                    tracing::warn!(%error, try_ = tries, "RabbitMQ connection failed, retrying");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                    tries += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn dial_once(&self) -> Result<Link, RabbitError> {
        let connection = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .map_err(|error| RabbitError::from_lapin("connecting", &error))?;
        let setup = connection
            .create_channel()
            .await
            .map_err(|error| RabbitError::from_lapin("opening a channel", &error))?;
        topology::declare(&setup, &self.names, self.max_attempts).await?;
        // A failed close leaves the channel to the connection; nothing is lost.
        let _ = setup.close(200, ShortString::from("declared")).await;
        let publisher = publisher(&connection).await?;
        tracing::debug!(queue = %self.names.jobs, "connected to RabbitMQ");
        Ok(Link {
            connection: Arc::new(connection),
            publisher,
        })
    }

    /// Publishes `body` to `queue` (persistent, mandatory) and waits for the broker's confirm.
    pub(crate) async fn publish(
        &self,
        queue: &str,
        body: &[u8],
        message_id: Option<&str>,
        headers: FieldTable,
    ) -> Result<(), RabbitError> {
        let what = || format!("publishing to {queue}");
        let channel = {
            let mut slot = self.link.lock().await;
            self.ensure(&mut slot).await?.publisher.clone()
        };
        let mut properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type(ShortString::from("application/json"))
            .with_headers(headers);
        if let Some(id) = message_id {
            let id = ShortString::try_new(id).map_err(|_| {
                RabbitError::Job(format!(
                    "key {id:?} is longer than the 255 bytes of an AMQP message id"
                ))
            })?;
            properties = properties.with_message_id(id);
        }
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirm = channel
            .basic_publish("".into(), queue.into(), options, body, properties)
            .await
            .map_err(|error| RabbitError::from_lapin(what(), &error))?
            .await
            .map_err(|error| RabbitError::from_lapin(what(), &error))?;
        match confirm {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) => Err(RabbitError::Refused {
                what: what(),
                detail: "no such queue (returned unroutable)".to_owned(),
            }),
            Confirmation::Nack(_) => Err(RabbitError::Refused {
                what: what(),
                detail: "the broker did not take the message (nack)".to_owned(),
            }),
            Confirmation::NotRequested => Err(RabbitError::Unavailable {
                what: what(),
                detail: "publisher confirms are off on the channel".to_owned(),
            }),
        }
    }

    /// Publishes `job` where its `not_before` sends it, having been delivered `attempts` times.
    pub(crate) async fn publish_job(&self, job: &Job, attempts: u32) -> Result<(), RabbitError> {
        let body = serde_json::to_vec(job).map_err(|error| RabbitError::Job(error.to_string()))?;
        let queue = self.names.route(job.not_before, Utc::now());
        let mut table = FieldTable::default();
        if attempts > 0 {
            table.insert(
                ShortString::from(headers::ATTEMPTS),
                AMQPValue::LongLongInt(i64::from(attempts)),
            );
        }
        self.publish(queue, &body, Some(&job.key), table).await
    }

    /// Publishes a message (`body` as it was) to the dead-letter queue with why and after how
    /// many deliveries it was given up.
    pub(crate) async fn publish_dead(
        &self,
        body: &[u8],
        message_id: Option<&str>,
        reason: &str,
        attempts: u32,
    ) -> Result<(), RabbitError> {
        let mut table = FieldTable::default();
        table
            .insert(
                ShortString::from(headers::ATTEMPTS),
                AMQPValue::LongLongInt(i64::from(attempts)),
            )
            .insert(
                ShortString::from(headers::REASON),
                AMQPValue::LongString(LongString::from(reason)),
            );
        tracing::warn!(queue = %self.names.dead, reason, attempts, "job dead-lettered");
        let id = message_id.filter(|id| id.len() <= 255);
        self.publish(&self.names.dead, body, id, table).await
    }
}

async fn publisher(connection: &Connection) -> Result<Channel, RabbitError> {
    let channel = connection
        .create_channel()
        .await
        .map_err(|error| RabbitError::from_lapin("opening the publishing channel", &error))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|error| RabbitError::from_lapin("enabling publisher confirms", &error))?;
    Ok(channel)
}
