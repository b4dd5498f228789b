//! What operators see and do (`loom queue`): depths, the dead-letter queue peeked in place,
//! dead jobs moved back or dropped.

use lapin::{
    Channel,
    message::BasicGetMessage,
    options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions},
    types::{FieldTable, ShortString},
};
use loom_core::queue::{DeadJob, Job, QueueDepth};

use crate::{error::RabbitError, headers, link::Shared};

/// Counts the messages of `queue` and its consumers (a passive declare).
async fn count(channel: &Channel, queue: &str) -> Result<(u64, u64), RabbitError> {
    let declared = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions::durable().passive(),
            FieldTable::default(),
        )
        .await
        .map_err(|error| RabbitError::from_lapin(format!("counting queue {queue}"), &error))?;
    Ok((
        u64::from(declared.message_count()),
        u64::from(declared.consumer_count()),
    ))
}

/// Closes a channel used for one operation; a failure only leaves it to the connection.
async fn done(channel: Channel) {
    let _ = channel.close(200, ShortString::from("done")).await;
}

/// The depths of every queue of the prefix.
pub(crate) async fn depth(shared: &Shared) -> Result<QueueDepth, RabbitError> {
    let channel = shared.channel("opening a channel").await?;
    let (ready, consumers) = count(&channel, &shared.names.jobs).await?;
    let mut delayed = 0;
    for bucket in &shared.names.buckets {
        delayed += count(&channel, bucket).await?.0;
    }
    let (dead, _) = count(&channel, &shared.names.dead).await?;
    done(channel).await;
    Ok(QueueDepth {
        ready,
        delayed,
        dead,
        consumers,
    })
}

/// Whether the broker answers and the jobs queue is there.
pub(crate) async fn ping(shared: &Shared) -> Result<(), RabbitError> {
    let channel = shared.channel("opening a channel").await?;
    count(&channel, &shared.names.jobs).await?;
    done(channel).await;
    Ok(())
}

/// Takes the next dead message (not acknowledged: it stays the channel's until acked, or
/// goes back to its place when the channel closes).
async fn take(channel: &Channel, shared: &Shared) -> Result<Option<BasicGetMessage>, RabbitError> {
    channel
        .basic_get(
            shared.names.dead.as_str().into(),
            BasicGetOptions::default(),
        )
        .await
        .map_err(|error| {
            RabbitError::from_lapin(format!("reading queue {}", shared.names.dead), &error)
        })
}

/// A dead message as the port shows it.
fn dead_job(shared: &Shared, message: &BasicGetMessage) -> DeadJob {
    let data = &message.delivery.data;
    let headers = message.delivery.properties.headers().as_ref();
    let job = serde_json::from_slice::<Job>(data).ok();
    let raw = job
        .is_none()
        .then(|| String::from_utf8_lossy(data).into_owned());
    let written = headers::written_attempts(headers);
    let (reason, attempts) = match headers::reason(headers) {
        Some(reason) => (reason, written),
        // Dead-lettered by the broker: the message was returned past the delivery limit.
        None => {
            let deaths = headers::deaths(headers);
            let reason = if deaths.iter().any(|reason| reason == "delivery_limit") {
                "delivery limit".to_owned()
            } else {
                deaths
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "unknown".to_owned())
            };
            (reason, written.saturating_add(shared.max_attempts))
        }
    };
    DeadJob {
        job,
        raw,
        attempts,
        reason,
    }
}

/// Up to `limit` dead jobs, oldest first, left in place: they are read without being
/// acknowledged, then the channel is closed, which puts them back where they were. While they
/// are read, a concurrent redrive does not see them.
pub(crate) async fn dead(shared: &Shared, limit: usize) -> Result<Vec<DeadJob>, RabbitError> {
    let channel = shared.channel("opening a channel").await?;
    let mut jobs = Vec::new();
    while jobs.len() < limit {
        let Some(message) = take(&channel, shared).await? else {
            break;
        };
        jobs.push(dead_job(shared, &message));
    }
    done(channel).await;
    Ok(jobs)
}

/// Moves up to `limit` dead messages back to the jobs queue with their attempts counted from 0
/// (an unreadable one too: a newer version may read it), or drops them.
pub(crate) async fn redrive(shared: &Shared, limit: usize, drop: bool) -> Result<u64, RabbitError> {
    let channel = shared.channel("opening a channel").await?;
    let mut moved = 0;
    while moved < limit {
        let Some(message) = take(&channel, shared).await? else {
            break;
        };
        let delivery = &message.delivery;
        if !drop {
            let id = delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str());
            shared
                .publish(
                    &shared.names.jobs,
                    &delivery.data,
                    id,
                    FieldTable::default(),
                )
                .await?;
        }
        delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .map_err(|error| RabbitError::from_lapin("removing a dead job", &error))?;
        moved += 1;
    }
    done(channel).await;
    tracing::info!(queue = %shared.names.dead, moved, drop, "dead jobs redriven");
    Ok(moved as u64)
}

/// Deletes every queue of the prefix (the jobs in them are lost).
pub(crate) async fn delete(shared: &Shared) -> Result<(), RabbitError> {
    let channel = shared.channel("opening a channel").await?;
    for queue in shared.names.all() {
        channel
            .queue_delete(queue.into(), lapin::options::QueueDeleteOptions::default())
            .await
            .map_err(|error| RabbitError::from_lapin(format!("deleting queue {queue}"), &error))?;
    }
    done(channel).await;
    Ok(())
}
