//! The RabbitMQ job queue against a real broker (`LOOM_TEST_RABBITMQ`): the queue conformance
//! suite, then what only RabbitMQ shows (unreadable messages, a lost consumer's jobs, a
//! topology that differs). Every test uses its own queue prefix and deletes its queues.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use futures_util::StreamExt;

use loom_core::queue::{JobQueue, QueueError};
use loom_rabbitmq::{QueueOptions, RabbitQueue};
use loom_testkit::{
    queue_conformance::{depth_until, finish, guarded, job, next},
    services,
};

fn options(prefix: &str) -> QueueOptions {
    QueueOptions {
        prefix: prefix.to_owned(),
        max_attempts: 3,
    }
}

async fn fresh(test: &str) -> Option<RabbitQueue> {
    let url = services::rabbitmq(test)?;
    let prefix = services::unique("loomtest");
    Some(RabbitQueue::connect(&url, options(&prefix)).await.unwrap())
}

async fn open(test: &str) -> Option<(RabbitQueue, Arc<dyn JobQueue>)> {
    let queue = fresh(test).await?;
    Some((queue.clone(), Arc::new(queue)))
}

async fn close(queue: RabbitQueue) {
    queue.delete_queues().await.unwrap();
    queue.close().await.unwrap();
}

loom_testkit::queue_conformance!(rabbitmq, open, close);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreadable_message_is_dead_lettered_with_its_text() {
    let Some(raw) = fresh("an_unreadable_message_is_dead_lettered_with_its_text").await else {
        return;
    };
    let queue: Arc<dyn JobQueue> = Arc::new(raw.clone());
    let outcome = guarded(async {
        raw.publish_raw(b"{\"kind\": \"teleport\"}").await.unwrap();
        let mut deliveries = queue.consume(5).await.unwrap();
        let a = job("a");
        queue.enqueue(&a).await.unwrap();
        let delivery = next(&mut deliveries).await;
        assert_eq!(
            delivery.job(),
            &a,
            "the unreadable message is not handed over"
        );
        delivery.ack().await.unwrap();
        depth_until(&queue, "one dead message", |depth| depth.dead == 1).await;
        let dead = queue.dead(10).await.unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].job, None);
        assert_eq!(dead[0].raw.as_deref(), Some("{\"kind\": \"teleport\"}"));
        assert!(dead[0].reason.starts_with("unreadable"), "{dead:?}");
    })
    .await;
    close(raw).await;
    finish(outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_whose_connection_closes_gives_its_job_to_another_and_reconnects() {
    let test = "a_consumer_whose_connection_closes_gives_its_job_to_another_and_reconnects";
    let Some(first) = fresh(test).await else {
        return;
    };
    let url = services::rabbitmq(test).unwrap();
    let prefix = first.jobs_queue().trim_end_matches(".jobs").to_owned();
    let second = RabbitQueue::connect(&url, options(&prefix)).await.unwrap();
    let outcome = guarded(async {
        let a = job("a");
        first.enqueue(&a).await.unwrap();
        let mut deliveries = first.consume(1).await.unwrap();
        let held = next(&mut deliveries).await;
        assert_eq!(held.attempt(), 0);
        // The worker's connection goes away with the job neither acknowledged nor dropped.
        first.close().await.unwrap();
        let mut others = second.consume(1).await.unwrap();
        let delivery = next(&mut others).await;
        assert_eq!((delivery.job(), delivery.attempt()), (&a, 1));
        delivery.ack().await.unwrap();
        let error = held.ack().await.unwrap_err();
        assert!(matches!(error, QueueError::Unavailable(_)), "{error}");
        // The lost consumer's stream hands nothing more and ends.
        while let Some(item) = deliveries.next().await {
            assert!(item.is_err(), "no job after the connection closed");
        }
        // The next operation of the closed queue connects again.
        first.ping().await.unwrap();
        let b = job("b");
        first.enqueue(&b).await.unwrap();
        let delivery = next(&mut others).await;
        assert_eq!((delivery.job(), delivery.attempt()), (&b, 0));
        delivery.ack().await.unwrap();
    })
    .await;
    close(second).await;
    finish(outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queue_declared_with_other_attempts_is_refused() {
    let test = "a_queue_declared_with_other_attempts_is_refused";
    let Some(queue) = fresh(test).await else {
        return;
    };
    let url = services::rabbitmq(test).unwrap();
    let prefix = queue.jobs_queue().trim_end_matches(".jobs").to_owned();
    let other = RabbitQueue::connect(
        &url,
        QueueOptions {
            prefix: prefix.clone(),
            max_attempts: 7,
        },
    )
    .await
    .unwrap_err();
    close(queue).await;
    let error = QueueError::from(other);
    assert!(matches!(error, QueueError::Refused(_)), "{error}");
    assert!(
        error.to_string().contains(&format!("{prefix}.jobs")),
        "{error}"
    );
}

#[tokio::test]
async fn bad_options_are_named() {
    let error = RabbitQueue::connect("amqp://127.0.0.1:1/%2f", options("bad prefix"))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("\"bad prefix\""), "{error}");
}
