//! Consuming `<prefix>.jobs`: the stream of deliveries handed to a worker, and how each ends.
//!
//! Before a message is handed over, the stream settles what the worker must not see: a message
//! that is not a job goes to the dead-letter queue with its raw text; a job delivered
//! `max_attempts` times already goes there too (reason `delivery limit`); a job delivered
//! before its `not_before` goes back to a delay bucket. Each is published (confirmed) before
//! the message is acknowledged, so a crash in between may duplicate a job, never lose one:
//! duplicates are harmless by design (the run's lease and journal decide).

use std::{fmt, sync::Arc, time::Duration};

use chrono::Utc;
use futures_util::StreamExt;
use lapin::{
    Acker, Channel, Consumer,
    options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions},
    types::FieldTable,
};
use loom_core::{
    BoxFuture,
    queue::{Deliveries, Delivery, Job, QueueError},
};

use crate::{error::RabbitError, headers, link::Shared};

/// Opens a consuming channel with at most `prefetch` deliveries not yet ended, and streams
/// what it receives.
pub(crate) async fn consume(shared: Arc<Shared>, prefetch: u16) -> Result<Deliveries, RabbitError> {
    let channel = shared.channel("opening a consuming channel").await?;
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await
        .map_err(|error| RabbitError::from_lapin("setting the prefetch", &error))?;
    let consumer = channel
        .basic_consume(
            shared.names.jobs.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|error| {
            RabbitError::from_lapin(format!("consuming {}", shared.names.jobs), &error)
        })?;
    let feed = Feed {
        shared,
        channel,
        consumer,
    };
    let stream = futures_util::stream::unfold(Some(feed), |feed| async move {
        let mut feed = feed?;
        match feed.next().await {
            Some(Ok(delivery)) => Some((Ok(delivery), Some(feed))),
            // The error is the last item: the channel is gone, consume again.
            Some(Err(error)) => Some((Err(error.into()), None)),
            None => None,
        }
    });
    Ok(Box::pin(stream))
}

/// A consumer and what settling its messages needs.
struct Feed {
    shared: Arc<Shared>,
    channel: Channel,
    consumer: Consumer,
}

impl Feed {
    /// The next delivery for the worker, settling the messages it must not see.
    async fn next(&mut self) -> Option<Result<Box<dyn Delivery>, RabbitError>> {
        loop {
            let message = match self.consumer.next().await? {
                Ok(message) => message,
                Err(error) => {
                    return Some(Err(RabbitError::from_lapin(
                        format!("consuming {}", self.shared.names.jobs),
                        &error,
                    )));
                }
            };
            match self.settle(message).await {
                Ok(Some(delivery)) => return Some(Ok(delivery)),
                Ok(None) => {}
                Err(error) => return Some(Err(error)),
            }
        }
    }

    /// The delivery to hand over, or `None` once the message was dealt with here.
    async fn settle(
        &self,
        message: lapin::message::Delivery,
    ) -> Result<Option<Box<dyn Delivery>>, RabbitError> {
        let headers = message.properties.headers().as_ref();
        let attempt = headers::attempt(headers);
        let id = message
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str());
        let job = match serde_json::from_slice::<Job>(&message.data) {
            Ok(job) => job,
            Err(error) => {
                let reason = format!("unreadable: {error}");
                self.shared
                    .publish_dead(&message.data, id, &reason, attempt)
                    .await?;
                return settled(&message.acker).await;
            }
        };
        if attempt >= self.shared.max_attempts {
            self.shared
                .publish_dead(&message.data, id, "delivery limit", attempt)
                .await?;
            return settled(&message.acker).await;
        }
        if job.not_before.is_some_and(|at| at > Utc::now()) {
            tracing::debug!(key = %job.key, "job delivered early, delayed again");
            self.shared.publish_job(&job, attempt).await?;
            return settled(&message.acker).await;
        }
        Ok(Some(Box::new(RabbitDelivery {
            job,
            attempt,
            acker: message.acker,
            shared: self.shared.clone(),
            _channel: self.channel.clone(),
        })))
    }
}

/// Acknowledges a message dealt with before the worker saw it.
async fn settled(acker: &Acker) -> Result<Option<Box<dyn Delivery>>, RabbitError> {
    acknowledge(acker).await.map(|()| None)
}

async fn acknowledge(acker: &Acker) -> Result<(), RabbitError> {
    let done = acker
        .ack(BasicAckOptions::default())
        .await
        .map_err(|error| RabbitError::from_lapin("acknowledging a job", &error))?;
    if done {
        Ok(())
    } else {
        Err(RabbitError::Unavailable {
            what: "acknowledging a job".to_owned(),
            detail: "its channel closed first: the job will be delivered again".to_owned(),
        })
    }
}

/// A job handed to a worker.
struct RabbitDelivery {
    job: Job,
    attempt: u32,
    acker: Acker,
    shared: Arc<Shared>,
    /// Keeps the consuming channel open while the delivery lives, even if the stream is
    /// dropped first (closing it would give the job back).
    _channel: Channel,
}

impl fmt::Debug for RabbitDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitDelivery")
            .field("job", &self.job)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

impl RabbitDelivery {
    /// The job again, `delay` from now (due at once without a delay).
    fn later(&self, delay: Duration) -> Job {
        let mut job = self.job.clone();
        job.not_before = chrono::Duration::from_std(delay)
            .ok()
            .filter(|delay| *delay > chrono::Duration::zero())
            .map(|delay| Utc::now() + delay);
        job
    }
}

impl Delivery for RabbitDelivery {
    fn job(&self) -> &Job {
        &self.job
    }

    fn attempt(&self) -> u32 {
        self.attempt
    }

    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), QueueError>> {
        Box::pin(async move { Ok(acknowledge(&self.acker).await?) })
    }

    fn defer(self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), QueueError>> {
        Box::pin(async move {
            let job = self.later(delay);
            self.shared.publish_job(&job, self.attempt).await?;
            Ok(acknowledge(&self.acker).await?)
        })
    }

    fn fail(
        self: Box<Self>,
        reason: String,
        delay: Duration,
    ) -> BoxFuture<'static, Result<(), QueueError>> {
        Box::pin(async move {
            let attempts = self.attempt.saturating_add(1);
            if attempts >= self.shared.max_attempts {
                let body = serde_json::to_vec(&self.job)
                    .map_err(|error| RabbitError::Job(error.to_string()))?;
                self.shared
                    .publish_dead(&body, Some(&self.job.key), &reason, attempts)
                    .await?;
            } else {
                tracing::debug!(key = %self.job.key, attempts, %reason, "job failed, retried later");
                let job = self.later(delay);
                self.shared.publish_job(&job, attempts).await?;
            }
            Ok(acknowledge(&self.acker).await?)
        })
    }
}

impl Drop for RabbitDelivery {
    /// A delivery dropped without an end gives its job back at once (the broker counts the
    /// return); without a runtime to send that, the job comes back when the channel closes.
    fn drop(&mut self) {
        if !self.acker.usable() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let acker = self.acker.clone();
        let key = self.job.key.clone();
        runtime.spawn(async move {
            let requeue = BasicNackOptions {
                requeue: true,
                ..BasicNackOptions::default()
            };
            if let Err(error) = acker.nack(requeue).await {
                tracing::debug!(%key, %error, "giving a dropped job back failed; the channel will");
            }
        });
    }
}
