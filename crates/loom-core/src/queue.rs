//! The job queue port: background work handed from the process that accepts it (`loom serve`,
//! a trigger, an approval) to the processes that do it (`loom worker`).
//!
//! A job names a run (or a session) and what to do with it; the journal stays the truth. A job
//! is acknowledged only once what it asked is journaled (the run closed or paused), so a worker
//! that dies mid-run leaves its job to be delivered again, and the run's lease makes sure one
//! worker drives it. Delivering a job twice is therefore harmless: the second delivery finds
//! the run closed (acknowledged at once) or driven elsewhere (put back until the lease ends).
//!
//! The queue counts the deliveries of each job; after [`JobQueue::max_attempts`] a job that
//! never got acknowledged (a poison job: its worker crashes, or it keeps failing) is moved to
//! the dead-letter queue, where `loom queue` shows it and an operator may retry or drop it.

use std::{fmt, time::Duration};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{BoxFuture, BoxStream};

/// What a job asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// Drive a run that was opened (journaled) to its end or its next pause.
    Run,
    /// Drive a run again after a decision (an approval, a rejection) or a crash.
    Resume,
    /// Expire the approvals of a paused run whose deadline passed, then drive it.
    ExpireApproval,
    /// Compact the session's history (`sessions.compaction`); the job's run is the one that
    /// triggered it.
    Compaction,
}

impl JobKind {
    /// The name jobs carry on the wire (`run`, `resume`, `expire_approval`, `compaction`).
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Run => "run",
            JobKind::Resume => "resume",
            JobKind::ExpireApproval => "expire_approval",
            JobKind::Compaction => "compaction",
        }
    }
}

impl fmt::Display for JobKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One job: what to do, to which run of which session of which tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// What to do.
    pub kind: JobKind,
    /// The tenant.
    pub tenant_id: String,
    /// The session.
    pub session_id: String,
    /// The run.
    pub run_id: String,
    /// The dedup key: `run:<run id>` for runs and resumes, `expire:<run id>` for expiries,
    /// `compact:<session id>` for compactions.
    /// Two jobs with one key ask the same thing.
    pub key: String,
    /// What the kind needs beyond the ids (a JSON object; empty for most).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub params: serde_json::Map<String, serde_json::Value>,
    /// Not before this instant (a delayed job: an approval's deadline, a retry after a lease).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<DateTime<Utc>>,
}

impl Job {
    /// A job of `kind` on a run, keyed by the run (`run:<id>`, or `expire:<id>` for expiries),
    /// or by its session for a compaction (`compact:<session>`).
    pub fn for_run(
        kind: JobKind,
        tenant_id: impl Into<String>,
        session_id: impl Into<String>,
        run_id: impl Into<String>,
    ) -> Job {
        let run_id = run_id.into();
        let session_id = session_id.into();
        let key = match kind {
            JobKind::ExpireApproval => format!("expire:{run_id}"),
            JobKind::Run | JobKind::Resume => format!("run:{run_id}"),
            JobKind::Compaction => format!("compact:{session_id}"),
        };
        Job {
            kind,
            tenant_id: tenant_id.into(),
            session_id,
            run_id,
            key,
            params: serde_json::Map::new(),
            not_before: None,
        }
    }

    /// The same job, not to be done before `at`.
    #[must_use]
    pub fn not_before(mut self, at: DateTime<Utc>) -> Job {
        self.not_before = Some(at);
        self
    }
}

/// Why a queue operation failed, classified by kind.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The broker cannot be reached, or the connection or channel was lost: retry later.
    #[error("job queue unavailable: {0}")]
    Unavailable(String),
    /// A message on the queue is not a job this version reads (it is moved to the dead-letter
    /// queue, never dropped).
    #[error("unreadable job: {0}")]
    Unreadable(String),
    /// The broker refused the operation (a topology that differs, a permission).
    #[error("job queue refused: {0}")]
    Refused(String),
}

/// A job handed to a consumer, with how it ends.
///
/// Dropping a delivery without ending it gives the job back to the queue (as a worker that
/// dies does), and counts as an attempt.
pub trait Delivery: Send + fmt::Debug {
    /// The job.
    fn job(&self) -> &Job;

    /// How many times the job was delivered before this one (0 on its first delivery).
    fn attempt(&self) -> u32;

    /// The job is done (its run closed or paused, journaled): the queue forgets it.
    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), QueueError>>;

    /// The job is not done yet and must come back after `delay` (a run another worker drives:
    /// after its lease), without counting as a failed attempt.
    fn defer(self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), QueueError>>;

    /// The job failed: it comes back after `delay` as a new attempt, or goes to the dead-letter
    /// queue with `reason` once it reached the queue's attempts.
    fn fail(
        self: Box<Self>,
        reason: String,
        delay: Duration,
    ) -> BoxFuture<'static, Result<(), QueueError>>;
}

/// A job in the dead-letter queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadJob {
    /// The job (`None` when its message could not be read: `raw` holds it).
    pub job: Option<Job>,
    /// Its message as it was, when it could not be read as a job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<String>,
    /// How many times it was delivered.
    pub attempts: u32,
    /// Why it was given up (the last failure, or `delivery limit` for a job whose worker kept
    /// dying).
    pub reason: String,
}

/// How many jobs wait where.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueDepth {
    /// Ready to be consumed.
    pub ready: u64,
    /// Waiting for their time (delayed).
    pub delayed: u64,
    /// In the dead-letter queue.
    pub dead: u64,
    /// Consumers attached.
    pub consumers: u64,
}

/// The jobs a consumer is handed, as [`JobQueue::consume`] streams them.
pub type Deliveries = BoxStream<'static, Result<Box<dyn Delivery>, QueueError>>;

/// The job queue port (`storage.queue`).
pub trait JobQueue: Send + Sync + fmt::Debug {
    /// Adds a job, to be delivered at its `not_before` (at once without one). Returns once the
    /// broker holds it (a publisher confirm).
    fn enqueue<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<(), QueueError>>;

    /// Starts consuming: at most `prefetch` jobs are delivered and not yet ended at any time.
    /// The stream ends when the connection is lost (an error item first); consume again.
    fn consume(&self, prefetch: u16) -> BoxFuture<'_, Result<Deliveries, QueueError>>;

    /// How many deliveries a job gets before it is dead-lettered.
    fn max_attempts(&self) -> u32;

    /// The queue's depths.
    fn depth(&self) -> BoxFuture<'_, Result<QueueDepth, QueueError>>;

    /// Up to `limit` jobs of the dead-letter queue, oldest first, left in place.
    fn dead(&self, limit: usize) -> BoxFuture<'_, Result<Vec<DeadJob>, QueueError>>;

    /// Moves up to `limit` dead jobs back to the queue (their attempts counted from 0), or
    /// drops them when `drop` is set. Returns how many were moved or dropped.
    fn redrive(&self, limit: usize, drop: bool) -> BoxFuture<'_, Result<u64, QueueError>>;

    /// Whether the broker answers (the readiness check).
    fn ping(&self) -> BoxFuture<'_, Result<(), QueueError>>;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_job_reads_back_and_is_keyed_by_its_run() {
        let job = Job::for_run(JobKind::Run, "acme", "s1", "r1");
        assert_eq!(job.key, "run:r1");
        assert_eq!(
            Job::for_run(JobKind::ExpireApproval, "acme", "s1", "r1").key,
            "expire:r1"
        );
        let text = serde_json::to_string(&job).unwrap();
        assert_eq!(
            text,
            r#"{"kind":"run","tenant_id":"acme","session_id":"s1","run_id":"r1","key":"run:r1"}"#
        );
        assert_eq!(serde_json::from_str::<Job>(&text).unwrap(), job);
    }

    #[test]
    fn a_compaction_job_is_keyed_by_its_session() {
        let job = Job::for_run(JobKind::Compaction, "acme", "s1", "r1");
        assert_eq!(job.key, "compact:s1");
        let text = serde_json::to_string(&job).unwrap();
        assert!(text.starts_with(r#"{"kind":"compaction","#), "{text}");
        assert_eq!(serde_json::from_str::<Job>(&text).unwrap(), job);
    }
}
