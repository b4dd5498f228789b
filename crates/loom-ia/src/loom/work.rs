//! Background work through a job queue (`storage.queue`): what enqueues jobs (a submitted run,
//! a trigger, a decision on a paused run, the expiry of its approvals) and what does them
//! ([`Loom::work`], behind `loom worker`).
//!
//! The journal stays the truth and the queue only says *when* to drive a run. A job is
//! acknowledged once its run closed or paused (journaled); a worker that dies leaves its job
//! unacknowledged, the broker delivers it again, and the run's lease makes sure one worker
//! drives it: a delivery that finds the run driven elsewhere is deferred until the lease can
//! have run out, one that finds it closed is acknowledged at once. Duplicated jobs are
//! therefore harmless, which is what lets the queue publish before it acknowledges.

use std::{sync::Arc, time::Duration};

use chrono::Utc;
use futures_util::StreamExt;
use loom_core::{
    RunStatus,
    queue::{Delivery, Job, JobKind, JobQueue},
};
use loom_engine::RunRef;
use tokio::task::JoinSet;

use super::Loom;
use crate::LoomError;

/// How a worker runs ([`Loom::work`]).
#[derive(Debug, Clone, Copy)]
pub struct WorkOptions {
    /// How many jobs (runs) it drives at once.
    pub jobs: u16,
}

/// What became of a job.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Its run closed or paused: acknowledged.
    Done,
    /// Its run is driven elsewhere (or this process is stopping): back after the delay,
    /// without counting as a failed attempt.
    Later(Duration),
    /// It failed: back as a new attempt after a pause, dead-lettered after the last.
    Failed(String),
}

/// The pause before a failed job comes back: 1 s doubling per attempt, at most a minute.
fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.min(6)).min(Duration::from_secs(60))
}

impl Loom {
    /// The job queue of this instance: the one given with [`Loom::with_queue`], else the one
    /// `storage.queue` declares (connected at first use), else `None` (`asyncio`: background
    /// runs are driven in this process).
    pub async fn job_queue(&self) -> Result<Option<Arc<dyn JobQueue>>, LoomError> {
        if let Some(queue) = self.inner.queue.get() {
            return Ok(Some(queue.clone()));
        }
        if !crate::queue::declared(self.config()) {
            return Ok(None);
        }
        let queue = self
            .inner
            .queue
            .get_or_try_init(|| crate::queue::connect(self.config()))
            .await?;
        Ok(Some(queue.clone()))
    }

    /// The same instance, its background work going through `queue` whatever `storage.queue`
    /// says (tests, and embedders with their own broker).
    #[must_use]
    pub fn with_queue(self, queue: Arc<dyn JobQueue>) -> Loom {
        // Set once: an instance's queue never changes under a running worker.
        let _ = self.inner.queue.set(queue);
        self
    }

    /// Hands `run` to the queue as a job of `kind` (no queue: `false`, the caller drives it).
    pub(crate) async fn enqueue_run(&self, kind: JobKind, run: &RunRef) -> Result<bool, LoomError> {
        let Some(queue) = self.job_queue().await? else {
            return Ok(false);
        };
        let job = Job::for_run(kind, &run.tenant_id, &run.session_id, &run.run_id);
        queue.enqueue(&job).await?;
        Ok(true)
    }

    /// Drives `run` in the background: through the queue when there is one, else in this
    /// process. A run the queue could not take is journaled all the same: the lease sweep of a
    /// `loom serve` hands it to the queue once it has been silent for a lease.
    pub(crate) async fn start_background(
        &self,
        run: RunRef,
        runtime: Arc<loom_engine::AgentRuntime>,
    ) {
        match self.enqueue_run(JobKind::Run, &run).await {
            Ok(true) => {}
            Ok(false) => self.spawn_drive(run, runtime),
            Err(error) => tracing::error!(
                run_id = %run.run_id,
                %error,
                "run journaled but not queued: the lease sweep queues it again once it has been silent for a lease"
            ),
        }
    }

    /// Consumes the job queue until [`Loom::stop`]: at most `options.jobs` runs driven at once,
    /// each job acknowledged when its run closed or paused. Refused without a queue.
    pub async fn work(&self, options: WorkOptions) -> Result<(), LoomError> {
        let queue = self.job_queue().await?.ok_or_else(|| {
            LoomError::Refused(
                "a worker consumes a job queue: declare storage.queue with backend rabbitmq".into(),
            )
        })?;
        let stop = self.inner.engine.stop_signal().clone();
        let mut running = JoinSet::new();
        let mut pause = Duration::from_millis(500);
        'consume: while !stop.is_requested() {
            let mut deliveries = match queue.consume(options.jobs.max(1)).await {
                Ok(deliveries) => deliveries,
                Err(error) => {
                    tracing::warn!(%error, retry_in_ms = pause.as_millis(), "job queue unavailable");
                    tokio::select! {
                        () = stop.requested() => break 'consume,
                        () = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(Duration::from_secs(30));
                    continue;
                }
            };
            pause = Duration::from_millis(500);
            loop {
                tokio::select! {
                    () = stop.requested() => break 'consume,
                    Some(done) = running.join_next(), if !running.is_empty() => {
                        if let Err(error) = done {
                            tracing::error!(%error, "a job's task panicked");
                        }
                    }
                    next = deliveries.next() => match next {
                        Some(Ok(delivery)) => {
                            let loom = self.clone();
                            running.spawn(async move { loom.handle(delivery).await });
                        }
                        Some(Err(error)) => {
                            tracing::warn!(%error, "job queue consumer lost");
                            break;
                        }
                        None => break,
                    },
                }
            }
        }
        // Stopping: the pilots let their runs go at the next safe point (`Loom::stop`), and
        // each job goes back to the queue for another worker.
        while let Some(done) = running.join_next().await {
            if let Err(error) = done {
                tracing::error!(%error, "a job's task panicked");
            }
        }
        Ok(())
    }

    /// Does one job and ends its delivery.
    async fn handle(&self, delivery: Box<dyn Delivery>) {
        let job = delivery.job().clone();
        let outcome = self.do_job(&job).await;
        tracing::debug!(key = %job.key, kind = %job.kind, ?outcome, "job handled");
        let ended = match outcome {
            Outcome::Done => delivery.ack().await,
            Outcome::Later(delay) => delivery.defer(delay).await,
            Outcome::Failed(reason) => {
                let attempt = delivery.attempt();
                tracing::warn!(key = %job.key, attempt, %reason, "job failed");
                delivery.fail(reason, backoff(attempt)).await
            }
        };
        if let Err(error) = ended {
            // Not ended: the broker gives it again (harmless, see the module documentation).
            tracing::warn!(key = %job.key, %error, "job not ended on the queue");
        }
    }

    async fn do_job(&self, job: &Job) -> Outcome {
        let run = RunRef {
            tenant_id: job.tenant_id.clone(),
            session_id: job.session_id.clone(),
            run_id: job.run_id.clone(),
        };
        if job.kind == JobKind::Compaction {
            // The outcome is journaled (or logged); a failed compaction is tried again after
            // the session's next run.
            self.compact_in_background(&run).await;
            return Outcome::Done;
        }
        let state = match self.state(&run).await {
            Ok(state) => state,
            Err(error) => return Outcome::Failed(error.to_string()),
        };
        // A sub-run is driven by its root.
        let root = RunRef {
            run_id: state.root_run_id.clone(),
            ..run
        };
        let state = if root.run_id == job.run_id {
            state
        } else {
            match self.state(&root).await {
                Ok(state) => state,
                Err(error) => return Outcome::Failed(error.to_string()),
            }
        };
        if state.finished {
            return Outcome::Done;
        }
        if job.kind == JobKind::ExpireApproval && state.status != RunStatus::Paused {
            // Decided meanwhile: the decision queued its own resume.
            if state.status != RunStatus::WaitingChild {
                return Outcome::Done;
            }
        }
        if self.is_stopping() {
            return Outcome::Later(Duration::ZERO);
        }
        let Some(agent) = state.agent.clone() else {
            return Outcome::Failed(format!("run {} names no agent", root.run_id));
        };
        let runtime = match self.agent(&agent, &root.tenant_id) {
            Ok(runtime) => runtime,
            Err(error) => return Outcome::Failed(error.to_string()),
        };
        match self.drive(&root, &runtime, &()).await {
            Ok(result) => {
                if matches!(result.status, RunStatus::Paused | RunStatus::WaitingChild) {
                    self.schedule_expiry(&root, &result).await;
                }
                Outcome::Done
            }
            Err(LoomError::Conflict(reason)) => {
                tracing::debug!(run_id = %root.run_id, %reason, "run driven elsewhere: job deferred");
                Outcome::Later(self.takeover_delay())
            }
            Err(LoomError::Interrupted(_)) => Outcome::Later(Duration::ZERO),
            Err(error) => Outcome::Failed(error.to_string()),
        }
    }

    /// When a run driven elsewhere is looked at again: half a lease, within 1–30 s.
    fn takeover_delay(&self) -> Duration {
        (self.lease() / 2).clamp(Duration::from_secs(1), Duration::from_secs(30))
    }

    /// Queues the expiry of the first approval of a paused run that has a deadline.
    async fn schedule_expiry(&self, run: &RunRef, result: &crate::RunResult) {
        let Some(at) = result
            .pending_approvals
            .iter()
            .filter_map(|a| a.expire_at)
            .min()
        else {
            return;
        };
        let Ok(Some(queue)) = self.job_queue().await else {
            return;
        };
        // A moment after the deadline, so that the expiry is due when the job runs.
        let due = at.max(Utc::now()) + chrono::Duration::milliseconds(500);
        let job = Job::for_run(
            JobKind::ExpireApproval,
            &run.tenant_id,
            &run.session_id,
            &run.run_id,
        )
        .not_before(due);
        if let Err(error) = queue.enqueue(&job).await {
            tracing::warn!(run_id = %run.run_id, %error, "approval expiry not queued: the run expires when it is next driven");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_jobs_back_off_to_a_minute() {
        assert_eq!(backoff(0), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(8));
        assert_eq!(backoff(40), Duration::from_secs(60));
    }
}
