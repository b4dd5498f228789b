//! # loom-rabbitmq
//!
//! Loom's job queue on RabbitMQ (`storage.queue: {backend: rabbitmq}`): [`RabbitQueue`]
//! implements [`JobQueue`] for `loom serve` (which enqueues) and `loom worker` (which
//! consumes). Needs RabbitMQ 3.10 or later (quorum queues with message TTL and at-least-once
//! dead-lettering).
//!
//! ## Topology (prefix `loom` by default)
//!
//! - `loom.jobs`: a durable **quorum** queue. The broker counts each message's returns (a
//!   worker that died, a dropped delivery, a closed channel) in `x-delivery-count`, and
//!   dead-letters a message returned `max_attempts` times into `loom.jobs.dead`
//!   (`x-delivery-limit`), at least once (`x-dead-letter-strategy: at-least-once`).
//! - `loom.jobs.delayed.1s`, `.2s`, `.4s`, … `.32768s`: quorum queues whose messages all
//!   live that long, then go back (dead-lettered, at least once) to `loom.jobs`. A delayed job
//!   goes into the largest bucket not longer than its remaining delay; one TTL per queue means
//!   a short delay never waits behind a long one. A job that comes out before its
//!   `not_before` (a delay longer than the largest bucket, or one that did not fall on a
//!   bucket) is delayed again by the consuming stream and never handed over: a job is never
//!   early, and at most about a second late.
//! - `loom.jobs.dead`: a durable classic queue (so peeking keeps its order).
//!
//! The topology is declared at [`RabbitQueue::connect`] and after every reconnection;
//! declaring is idempotent, but a queue that exists with other arguments (another
//! `max_attempts`, a classic `loom.jobs`) is refused ([`QueueError::Refused`], naming the
//! queue): delete it, or keep the old value.
//!
//! ## Guarantees
//!
//! Messages are persistent, keyed by the job's key (`message_id`), published with the job as
//! JSON and awaited until the broker confirms them. A delivery's attempt is the deliveries the
//! queue recorded on the message when it republished it (`x-loom-attempts`) plus the broker's
//! count of its returns (`x-delivery-count`); the stream dead-letters (reason `delivery
//! limit`) a job delivered `max_attempts` times already, and the broker's own limit catches a
//! message whose workers keep dying. [`Delivery::defer`], [`Delivery::fail`], a re-delay and a
//! dead-lettering publish the new message (confirmed) **then** acknowledge the old one: a
//! crash in between duplicates the job, never loses it, which is harmless by design (the
//! run's lease and journal decide). A message that is not a job goes to the dead-letter queue
//! with its raw text, never dropped.
//!
//! lapin does not reconnect by itself: every operation first checks the connection and dials
//! it again when it was lost (up to 4 tries, 100 ms then doubling), declaring the topology and
//! enabling publisher confirms anew. A consuming stream ends with an error item when its
//! connection is lost; consume again.

mod admin;
mod delivery;
mod error;
mod headers;
mod link;
mod topology;

use std::sync::Arc;

pub use error::RabbitError;
#[cfg(doc)]
use loom_core::queue::Delivery;
use loom_core::{
    BoxFuture,
    queue::{DeadJob, Deliveries, Job, JobQueue, QueueDepth, QueueError},
};

use crate::link::Shared;

/// Where the queues are and how many deliveries a job gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueOptions {
    /// The queues' name prefix (`loom`: `loom.jobs`, `loom.jobs.dead`,
    /// `loom.jobs.delayed.<n>s`). ASCII letters, digits, `.`, `-` and `_`.
    pub prefix: String,
    /// How many deliveries a job gets before it is dead-lettered (at least 1).
    pub max_attempts: u32,
}

impl Default for QueueOptions {
    fn default() -> QueueOptions {
        QueueOptions {
            prefix: "loom".to_owned(),
            max_attempts: 5,
        }
    }
}

/// The job queue on RabbitMQ (see the crate documentation). Cheap to clone: clones share one
/// connection.
#[derive(Debug, Clone)]
pub struct RabbitQueue {
    shared: Arc<Shared>,
}

impl RabbitQueue {
    /// Connects to the broker at `url` (`amqp://user:password@host:5672/%2f`) and declares the
    /// queues of `options.prefix`.
    pub async fn connect(url: &str, options: QueueOptions) -> Result<RabbitQueue, RabbitError> {
        if options.max_attempts == 0 {
            return Err(RabbitError::Options(
                "max_attempts must be at least 1".to_owned(),
            ));
        }
        let names = topology::Names::new(&options.prefix)?;
        let shared = Shared::connect(url, names, options.max_attempts).await?;
        Ok(RabbitQueue {
            shared: Arc::new(shared),
        })
    }

    /// The name of the queue jobs are consumed from (`<prefix>.jobs`).
    pub fn jobs_queue(&self) -> &str {
        &self.shared.names.jobs
    }

    /// Publishes a raw message to the jobs queue as another program (or an older version)
    /// might, bypassing the job encoding: for tests and tools.
    pub async fn publish_raw(&self, body: &[u8]) -> Result<(), RabbitError> {
        self.shared
            .publish(
                &self.shared.names.jobs,
                body,
                None,
                lapin::types::FieldTable::default(),
            )
            .await
    }

    /// Closes the connection: deliveries not yet ended go back to the queue, counted as an
    /// attempt. The next operation connects again.
    pub async fn close(&self) -> Result<(), RabbitError> {
        self.shared.close().await
    }

    /// Deletes every queue of the prefix, with the jobs they hold (tests, decommissioning).
    pub async fn delete_queues(&self) -> Result<(), RabbitError> {
        admin::delete(&self.shared).await
    }
}

impl JobQueue for RabbitQueue {
    fn enqueue<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<(), QueueError>> {
        Box::pin(async move {
            match self.shared.publish_job(job, 0).await {
                // A connection lost since the last operation is found out here: one more try
                // on a fresh one (a duplicate, if the first was taken, is harmless).
                Err(error) if error.is_unavailable() => {
                    tracing::debug!(%error, "enqueue failed, trying once more");
                    Ok(self.shared.publish_job(job, 0).await?)
                }
                other => Ok(other?),
            }
        })
    }

    fn consume(&self, prefetch: u16) -> BoxFuture<'_, Result<Deliveries, QueueError>> {
        Box::pin(async move { Ok(delivery::consume(self.shared.clone(), prefetch).await?) })
    }

    fn max_attempts(&self) -> u32 {
        self.shared.max_attempts
    }

    fn depth(&self) -> BoxFuture<'_, Result<QueueDepth, QueueError>> {
        Box::pin(async move { Ok(admin::depth(&self.shared).await?) })
    }

    fn dead(&self, limit: usize) -> BoxFuture<'_, Result<Vec<DeadJob>, QueueError>> {
        Box::pin(async move { Ok(admin::dead(&self.shared, limit).await?) })
    }

    fn redrive(&self, limit: usize, drop: bool) -> BoxFuture<'_, Result<u64, QueueError>> {
        Box::pin(async move { Ok(admin::redrive(&self.shared, limit, drop).await?) })
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), QueueError>> {
        Box::pin(async move { Ok(admin::ping(&self.shared).await?) })
    }
}
