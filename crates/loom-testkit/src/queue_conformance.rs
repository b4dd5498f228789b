//! The job queue conformance suite: scenarios every [`JobQueue`] must pass, whatever carries
//! the jobs (memory, RabbitMQ, …).
//!
//! Each scenario is a `pub async fn` taking a fresh, empty queue whose
//! [`JobQueue::max_attempts`] is at least 2 (3 is a good value), and panics (through
//! `assert!`) when the queue misbehaves. Delays are short (1 to 3 seconds) and only their
//! order is asserted, never how long anything took; awaiting a delivery fails after
//! [`wait::PATIENCE`].
//!
//! [`queue_conformance!`](macro@crate::queue_conformance) turns the suite into `#[tokio::test]`
//! functions:
//!
//! ```text
//! async fn open(test: &str) -> Option<(RabbitQueue, Arc<dyn JobQueue>)> { … }
//! async fn close(queue: RabbitQueue) { queue.delete_queues().await.unwrap() }
//! loom_testkit::queue_conformance!(rabbitmq, open, close);
//! ```

// The scenarios are assertions: a failure must panic with the queue's error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{any::Any, future::Future, panic::AssertUnwindSafe, sync::Arc, time::Duration};

use chrono::Utc;
use futures_util::{FutureExt, StreamExt};
use loom_core::queue::{Deliveries, Delivery, Job, JobKind, JobQueue, QueueDepth};

use crate::wait;

/// Runs every scenario of the suite as a `#[tokio::test]` in a module `$name`.
///
/// `$open` is called with the test's name and returns a future of
/// `Option<(guard, Arc<dyn JobQueue>)>`: `None` skips the test (a service that is not
/// configured), the queue must be fresh and empty. `$close` is called with the guard once the
/// scenario ended, passed or not (to delete what the test created), and returns a future. The
/// calling crate needs `tokio` with its `macros` and `rt-multi-thread` features.
#[macro_export]
macro_rules! queue_conformance {
    ($name:ident, $open:expr, $close:expr) => {
        $crate::queue_conformance!(@tests $name, $open, $close;
            enqueue_consume_ack,
            a_dropped_delivery_comes_back_as_a_new_attempt,
            failing_max_attempts_times_dead_letters,
            dropping_max_attempts_times_dead_letters,
            failures_and_drops_count_together,
            deferring_is_not_an_attempt,
            delayed_jobs_come_in_the_order_of_their_time,
            dead_jobs_are_peeked_redriven_and_dropped,
        );
    };
    (@tests $name:ident, $open:expr, $close:expr; $($scenario:ident),* $(,)?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    let Some((guard, queue)) = ($open)(stringify!($scenario)).await else {
                        return;
                    };
                    let outcome = $crate::queue_conformance::guarded(
                        $crate::queue_conformance::$scenario(&queue),
                    )
                    .await;
                    drop(queue);
                    ($close)(guard).await;
                    $crate::queue_conformance::finish(outcome);
                }
            )*
        }
    };
}

/// Runs a scenario, catching its panic so the test can clean up before failing.
pub async fn guarded(scenario: impl Future<Output = ()>) -> Result<(), Box<dyn Any + Send>> {
    AssertUnwindSafe(scenario).catch_unwind().await
}

/// Fails the test with the scenario's panic, if it panicked.
pub fn finish(outcome: Result<(), Box<dyn Any + Send>>) {
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// A run job named `run`.
pub fn job(run: &str) -> Job {
    Job::for_run(JobKind::Run, "acme", "s1", run)
}

/// The next delivery of the stream; fails the test when the stream ends, errs or stays silent
/// past [`wait::PATIENCE`].
pub async fn next(deliveries: &mut Deliveries) -> Box<dyn Delivery> {
    let item = tokio::time::timeout(wait::PATIENCE, deliveries.next())
        .await
        .expect("a delivery within the patience")
        .expect("the stream to go on");
    let delivery = item.expect("a delivery, not an error");
    if let Some(at) = delivery.job().not_before {
        assert!(
            Utc::now() >= at,
            "{} delivered before its not_before {at}",
            delivery.job().key
        );
    }
    delivery
}

/// Waits until the queue's depths satisfy `holds`.
pub async fn depth_until(
    queue: &Arc<dyn JobQueue>,
    what: &str,
    holds: impl Fn(&QueueDepth) -> bool,
) -> QueueDepth {
    wait::until(what, async || match queue.depth().await {
        Ok(depth) if holds(&depth) => Ok(depth),
        Ok(depth) => Err(format!("{depth:?}")),
        Err(error) => Err(error.to_string()),
    })
    .await
}

/// Enqueues a marker job and checks it is the next delivery (nothing else is pending), then
/// acknowledges it.
async fn nothing_else_pending(queue: &Arc<dyn JobQueue>, deliveries: &mut Deliveries) {
    let marker = job("marker");
    queue.enqueue(&marker).await.unwrap();
    let delivery = next(deliveries).await;
    assert_eq!(
        delivery.job(),
        &marker,
        "a job came back that should not have"
    );
    delivery.ack().await.unwrap();
}

/// Jobs are delivered in order with attempt 0; acknowledged, they do not come back.
pub async fn enqueue_consume_ack(queue: &Arc<dyn JobQueue>) {
    queue.ping().await.unwrap();
    let (a, b) = (job("a"), job("b"));
    queue.enqueue(&a).await.unwrap();
    queue.enqueue(&b).await.unwrap();
    depth_until(queue, "two ready jobs", |depth| depth.ready == 2).await;
    let mut deliveries = queue.consume(10).await.unwrap();
    let first = next(&mut deliveries).await;
    let second = next(&mut deliveries).await;
    assert_eq!((first.job(), second.job()), (&a, &b));
    assert_eq!((first.attempt(), second.attempt()), (0, 0));
    depth_until(queue, "a consumer", |depth| depth.consumers >= 1).await;
    first.ack().await.unwrap();
    second.ack().await.unwrap();
    nothing_else_pending(queue, &mut deliveries).await;
    depth_until(queue, "an empty queue", |depth| {
        depth.ready == 0 && depth.delayed == 0 && depth.dead == 0
    })
    .await;
}

/// A delivery dropped without an end gives its job back, one attempt further.
pub async fn a_dropped_delivery_comes_back_as_a_new_attempt(queue: &Arc<dyn JobQueue>) {
    let a = job("a");
    queue.enqueue(&a).await.unwrap();
    let mut deliveries = queue.consume(1).await.unwrap();
    let delivery = next(&mut deliveries).await;
    assert_eq!(delivery.attempt(), 0);
    drop(delivery);
    let again = next(&mut deliveries).await;
    assert_eq!((again.job(), again.attempt()), (&a, 1));
    again.ack().await.unwrap();
    nothing_else_pending(queue, &mut deliveries).await;
}

/// A job failed `max_attempts` times goes to the dead-letter queue with the last reason.
pub async fn failing_max_attempts_times_dead_letters(queue: &Arc<dyn JobQueue>) {
    let max = queue.max_attempts();
    assert!(max >= 2, "the suite needs max_attempts >= 2, not {max}");
    let a = job("a");
    queue.enqueue(&a).await.unwrap();
    let mut deliveries = queue.consume(1).await.unwrap();
    for n in 0..max {
        let delivery = next(&mut deliveries).await;
        assert_eq!((delivery.job(), delivery.attempt()), (&a, n));
        delivery
            .fail(format!("failure {n}"), Duration::ZERO)
            .await
            .unwrap();
    }
    nothing_else_pending(queue, &mut deliveries).await;
    depth_until(queue, "one dead job", |depth| depth.dead == 1).await;
    let dead = queue.dead(10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].job.as_ref(), Some(&a));
    assert_eq!(dead[0].attempts, max);
    assert_eq!(dead[0].reason, format!("failure {}", max - 1));
}

/// A job whose deliveries are all dropped (a worker that keeps dying) is dead-lettered after
/// `max_attempts` deliveries, with the reason `delivery limit`.
pub async fn dropping_max_attempts_times_dead_letters(queue: &Arc<dyn JobQueue>) {
    let max = queue.max_attempts();
    let a = job("a");
    queue.enqueue(&a).await.unwrap();
    let mut deliveries = queue.consume(1).await.unwrap();
    for n in 0..max {
        let delivery = next(&mut deliveries).await;
        assert_eq!((delivery.job(), delivery.attempt()), (&a, n));
        drop(delivery);
    }
    nothing_else_pending(queue, &mut deliveries).await;
    depth_until(queue, "one dead job", |depth| depth.dead == 1).await;
    let dead = queue.dead(10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].job.as_ref(), Some(&a));
    assert_eq!(dead[0].attempts, max);
    assert!(dead[0].reason.contains("delivery limit"), "{dead:?}");
}

/// Failures and dropped deliveries add up to `max_attempts`: a job failed once, then dropped
/// until its attempts are spent, is dead-lettered with the reason `delivery limit`.
pub async fn failures_and_drops_count_together(queue: &Arc<dyn JobQueue>) {
    let max = queue.max_attempts();
    let a = job("a");
    queue.enqueue(&a).await.unwrap();
    let mut deliveries = queue.consume(1).await.unwrap();
    let delivery = next(&mut deliveries).await;
    delivery
        .fail("first".to_owned(), Duration::ZERO)
        .await
        .unwrap();
    for n in 1..max {
        let delivery = next(&mut deliveries).await;
        assert_eq!((delivery.job(), delivery.attempt()), (&a, n));
        drop(delivery);
    }
    nothing_else_pending(queue, &mut deliveries).await;
    depth_until(queue, "one dead job", |depth| depth.dead == 1).await;
    let dead = queue.dead(10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!((dead[0].job.as_ref(), dead[0].attempts), (Some(&a), max));
    assert!(dead[0].reason.contains("delivery limit"), "{dead:?}");
}

/// A deferred job comes back after its delay with the same attempt (crashes still count).
pub async fn deferring_is_not_an_attempt(queue: &Arc<dyn JobQueue>) {
    let a = job("a");
    queue.enqueue(&a).await.unwrap();
    let mut deliveries = queue.consume(1).await.unwrap();
    drop(next(&mut deliveries).await);
    let delivery = next(&mut deliveries).await;
    assert_eq!(delivery.attempt(), 1);
    delivery.defer(Duration::from_secs(1)).await.unwrap();
    let delivery = next(&mut deliveries).await;
    assert_eq!(
        (delivery.job().key.as_str(), delivery.attempt()),
        ("run:a", 1)
    );
    assert!(
        delivery.job().not_before.is_some(),
        "a deferred job keeps its time"
    );
    delivery.defer(Duration::ZERO).await.unwrap();
    let delivery = next(&mut deliveries).await;
    assert_eq!(delivery.attempt(), 1);
    delivery.ack().await.unwrap();
    nothing_else_pending(queue, &mut deliveries).await;
}

/// Delayed jobs wait for their time (checked by [`next`]), a short delay enqueued behind a
/// long one comes first, and a job without a delay comes before both.
pub async fn delayed_jobs_come_in_the_order_of_their_time(queue: &Arc<dyn JobQueue>) {
    let now = Utc::now();
    let long = job("long").not_before(now + chrono::Duration::seconds(3));
    let short = job("short").not_before(now + chrono::Duration::seconds(1));
    let due = job("due").not_before(now - chrono::Duration::seconds(60));
    queue.enqueue(&long).await.unwrap();
    queue.enqueue(&short).await.unwrap();
    queue.enqueue(&due).await.unwrap();
    let mut deliveries = queue.consume(10).await.unwrap();
    for expected in [&due, &short, &long] {
        let delivery = next(&mut deliveries).await;
        assert_eq!(delivery.job(), expected);
        assert_eq!(delivery.attempt(), 0);
        delivery.ack().await.unwrap();
    }
    nothing_else_pending(queue, &mut deliveries).await;
    depth_until(queue, "no delayed job", |depth| depth.delayed == 0).await;
}

/// Dead jobs are listed oldest first without being removed, moved back (attempts from 0) or
/// dropped.
pub async fn dead_jobs_are_peeked_redriven_and_dropped(queue: &Arc<dyn JobQueue>) {
    let max = queue.max_attempts();
    let (a, b) = (job("a"), job("b"));
    queue.enqueue(&a).await.unwrap();
    queue.enqueue(&b).await.unwrap();
    let mut deliveries = queue.consume(1).await.unwrap();
    for _ in 0..2 * max {
        let delivery = next(&mut deliveries).await;
        delivery
            .fail("boom".to_owned(), Duration::ZERO)
            .await
            .unwrap();
    }
    depth_until(queue, "two dead jobs", |depth| depth.dead == 2).await;
    let first = queue.dead(1).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].job.as_ref(), Some(&a), "oldest first");
    let both = queue.dead(10).await.unwrap();
    let jobs: Vec<_> = both.iter().map(|dead| dead.job.clone()).collect();
    assert_eq!(jobs, [Some(a.clone()), Some(b.clone())]);
    assert!(
        both.iter()
            .all(|dead| dead.reason == "boom" && dead.attempts == max)
    );
    depth_until(queue, "two dead jobs left in place", |depth| {
        depth.dead == 2
    })
    .await;

    assert_eq!(queue.redrive(1, false).await.unwrap(), 1);
    let delivery = next(&mut deliveries).await;
    assert_eq!((delivery.job(), delivery.attempt()), (&a, 0));
    delivery.ack().await.unwrap();
    depth_until(queue, "one dead job", |depth| depth.dead == 1).await;

    assert_eq!(queue.redrive(10, true).await.unwrap(), 1);
    depth_until(queue, "no dead job", |depth| depth.dead == 0).await;
    assert!(queue.dead(10).await.unwrap().is_empty());
    assert_eq!(queue.redrive(10, true).await.unwrap(), 0);
    nothing_else_pending(queue, &mut deliveries).await;
}
