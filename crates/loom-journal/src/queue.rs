//! `MemoryQueue`: the job queue port in process memory, with the broker's rules (delays,
//! attempts counted per delivery, a dead-letter list, a job given back when its delivery is
//! dropped unended), for tests of workers and of what enqueues, without a broker.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use chrono::{DateTime, Utc};
use futures_util::stream;
use loom_core::{
    BoxFuture,
    queue::{DeadJob, Deliveries, Delivery, Job, JobQueue, QueueDepth, QueueError},
};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// A job waiting, with how many times it was delivered.
#[derive(Debug, Clone)]
struct Entry {
    job: Job,
    attempts: u32,
    /// Not delivered before (the job's `not_before`, or a deferral's or retry's time): the job
    /// itself is delivered as it was enqueued.
    due: Option<DateTime<Utc>>,
}

#[derive(Debug, Default)]
struct Lists {
    /// Ready and delayed jobs, in the order they were put (a job is taken once it is due).
    waiting: VecDeque<Entry>,
    dead: VecDeque<DeadJob>,
    consumers: u64,
}

#[derive(Debug)]
struct Shared {
    lists: Mutex<Lists>,
    changed: Notify,
    max_attempts: u32,
}

impl Shared {
    fn lists(&self) -> MutexGuard<'_, Lists> {
        self.lists.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `entry` back after a delivery that did not end it: a new attempt, or the
    /// dead-letter list once it had its attempts.
    fn give_back(&self, mut entry: Entry, reason: &str, delay: Option<Duration>) {
        entry.attempts += 1;
        let mut lists = self.lists();
        if entry.attempts >= self.max_attempts {
            lists.dead.push_back(DeadJob {
                job: Some(entry.job),
                raw: None,
                attempts: entry.attempts,
                reason: reason.to_owned(),
            });
        } else {
            if let Some(delay) = delay {
                entry.due = Some(after(delay));
            }
            lists.waiting.push_back(entry);
        }
        drop(lists);
        self.changed.notify_waiters();
    }

    fn put(&self, entry: Entry) {
        self.lists().waiting.push_back(entry);
        self.changed.notify_waiters();
    }

    /// The first due job, or when the next one falls due.
    fn take_due(&self, now: DateTime<Utc>) -> Result<Entry, Option<DateTime<Utc>>> {
        let mut lists = self.lists();
        let due = lists
            .waiting
            .iter()
            .position(|e| e.due.is_none_or(|at| at <= now));
        match due {
            Some(index) => lists.waiting.remove(index).ok_or(None),
            None => Err(lists.waiting.iter().filter_map(|e| e.due).min()),
        }
    }
}

fn after(delay: Duration) -> DateTime<Utc> {
    Utc::now() + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX)
}

/// The job queue in process memory: what a broker would do, without one, and nothing survives
/// the process. Clones share the queue.
#[derive(Debug, Clone)]
pub struct MemoryQueue {
    shared: Arc<Shared>,
}

impl MemoryQueue {
    /// An empty queue giving each job `max_attempts` deliveries (at least 1).
    pub fn new(max_attempts: u32) -> MemoryQueue {
        MemoryQueue {
            shared: Arc::new(Shared {
                lists: Mutex::new(Lists::default()),
                changed: Notify::new(),
                max_attempts: max_attempts.max(1),
            }),
        }
    }
}

impl JobQueue for MemoryQueue {
    fn enqueue<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<(), QueueError>> {
        Box::pin(async move {
            self.shared.put(Entry {
                job: job.clone(),
                attempts: 0,
                due: job.not_before,
            });
            Ok(())
        })
    }

    fn consume(&self, prefetch: u16) -> BoxFuture<'_, Result<Deliveries, QueueError>> {
        let shared = self.shared.clone();
        Box::pin(async move {
            shared.lists().consumers += 1;
            let consumer = Consumer {
                permits: Arc::new(Semaphore::new(usize::from(prefetch.max(1)))),
                shared,
            };
            let deliveries = stream::unfold(consumer, |consumer| async move {
                let delivery = consumer.next().await;
                Some((Ok(Box::new(delivery) as Box<dyn Delivery>), consumer))
            });
            Ok(Box::pin(deliveries) as Deliveries)
        })
    }

    fn max_attempts(&self) -> u32 {
        self.shared.max_attempts
    }

    fn depth(&self) -> BoxFuture<'_, Result<QueueDepth, QueueError>> {
        Box::pin(async move {
            let now = Utc::now();
            let lists = self.shared.lists();
            let delayed = lists
                .waiting
                .iter()
                .filter(|e| e.due.is_some_and(|at| at > now))
                .count();
            Ok(QueueDepth {
                ready: (lists.waiting.len() - delayed) as u64,
                delayed: delayed as u64,
                dead: lists.dead.len() as u64,
                consumers: lists.consumers,
            })
        })
    }

    fn dead(&self, limit: usize) -> BoxFuture<'_, Result<Vec<DeadJob>, QueueError>> {
        Box::pin(async move {
            Ok(self
                .shared
                .lists()
                .dead
                .iter()
                .take(limit)
                .cloned()
                .collect())
        })
    }

    fn redrive(&self, limit: usize, drop: bool) -> BoxFuture<'_, Result<u64, QueueError>> {
        Box::pin(async move {
            let mut lists = self.shared.lists();
            let count = limit.min(lists.dead.len());
            let moved: Vec<DeadJob> = lists.dead.drain(..count).collect();
            if !drop {
                for dead in moved.into_iter() {
                    if let Some(job) = dead.job {
                        lists.waiting.push_back(Entry {
                            job,
                            attempts: 0,
                            due: None,
                        });
                    }
                }
            }
            std::mem::drop(lists);
            self.shared.changed.notify_waiters();
            Ok(count as u64)
        })
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), QueueError>> {
        Box::pin(async { Ok(()) })
    }
}

/// One consumer: at most its prefetch of deliveries outstanding.
struct Consumer {
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
}

impl Consumer {
    async fn next(&self) -> MemoryDelivery {
        // The semaphore is never closed.
        let permit = self.permits.clone().acquire_owned().await.ok();
        loop {
            let changed = self.shared.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            match self.shared.take_due(Utc::now()) {
                Ok(entry) => {
                    return MemoryDelivery {
                        shared: self.shared.clone(),
                        entry,
                        ended: false,
                        _permit: permit,
                    };
                }
                Err(None) => changed.await,
                Err(Some(at)) => {
                    let wait = (at - Utc::now()).to_std().unwrap_or_default();
                    let _ = tokio::time::timeout(wait, changed).await;
                }
            }
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let mut lists = self.shared.lists();
        lists.consumers = lists.consumers.saturating_sub(1);
    }
}

/// A job handed out by [`MemoryQueue`]; dropped unended, it goes back as a new attempt.
#[derive(Debug)]
struct MemoryDelivery {
    shared: Arc<Shared>,
    entry: Entry,
    /// Acknowledged, deferred or failed: not given back when dropped.
    ended: bool,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Delivery for MemoryDelivery {
    fn job(&self) -> &Job {
        &self.entry.job
    }

    fn attempt(&self) -> u32 {
        self.entry.attempts
    }

    fn ack(mut self: Box<Self>) -> BoxFuture<'static, Result<(), QueueError>> {
        self.ended = true;
        Box::pin(async { Ok(()) })
    }

    fn defer(mut self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), QueueError>> {
        self.ended = true;
        // A deferred job carries its new time, as a republished message would.
        let mut entry = self.entry.clone();
        let due = after(delay);
        entry.due = Some(due);
        entry.job.not_before = Some(due);
        self.shared.put(entry);
        Box::pin(async { Ok(()) })
    }

    fn fail(
        mut self: Box<Self>,
        reason: String,
        delay: Duration,
    ) -> BoxFuture<'static, Result<(), QueueError>> {
        self.ended = true;
        self.shared
            .give_back(self.entry.clone(), &reason, Some(delay));
        Box::pin(async { Ok(()) })
    }
}

impl Drop for MemoryDelivery {
    fn drop(&mut self) {
        if !self.ended {
            self.shared.give_back(
                self.entry.clone(),
                "delivery limit: its consumer went away",
                None,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use futures_util::StreamExt;
    use loom_core::queue::JobKind;

    fn job(run: &str) -> Job {
        Job::for_run(JobKind::Run, "acme", "s1", run)
    }

    #[tokio::test]
    async fn a_dropped_delivery_comes_back_then_goes_dead() {
        let queue = MemoryQueue::new(2);
        queue.enqueue(&job("r1")).await.unwrap();
        let mut deliveries = queue.consume(1).await.unwrap();
        let first = deliveries.next().await.unwrap().unwrap();
        assert_eq!((first.job().run_id.as_str(), first.attempt()), ("r1", 0));
        drop(first);
        let second = deliveries.next().await.unwrap().unwrap();
        assert_eq!(second.attempt(), 1);
        drop(second);
        let dead = queue.dead(10).await.unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].attempts, 2);
        assert_eq!(queue.redrive(10, false).await.unwrap(), 1);
        let again = deliveries.next().await.unwrap().unwrap();
        assert_eq!(again.attempt(), 0);
        again.ack().await.unwrap();
        assert_eq!(
            queue.depth().await.unwrap(),
            QueueDepth {
                consumers: 1,
                ..QueueDepth::default()
            }
        );
    }

    #[tokio::test]
    async fn a_deferred_job_is_not_an_attempt_and_waits_its_time() {
        let queue = MemoryQueue::new(1);
        queue
            .enqueue(&job("late").not_before(after(Duration::from_secs(3600))))
            .await
            .unwrap();
        queue.enqueue(&job("now")).await.unwrap();
        let mut deliveries = queue.consume(4).await.unwrap();
        let now = deliveries.next().await.unwrap().unwrap();
        assert_eq!(now.job().run_id, "now");
        now.defer(Duration::ZERO).await.unwrap();
        let again = deliveries.next().await.unwrap().unwrap();
        assert_eq!((again.job().run_id.as_str(), again.attempt()), ("now", 0));
        let depth = queue.depth().await.unwrap();
        assert_eq!((depth.ready, depth.delayed), (0, 1));
    }
}
