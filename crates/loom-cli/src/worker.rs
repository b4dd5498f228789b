//! `loom worker [--jobs N]`: consumes the job queue (`storage.queue: rabbitmq`) until SIGTERM or
//! Ctrl-C; `loom queue [--json]`: its depths and the jobs of its dead-letter queue;
//! `loom queue redrive [--limit N] [--drop]`: dead jobs back to the queue, or dropped.

use std::future::Future;

use loom_ia::{Loom, LoomError, WorkOptions, core::queue::JobQueue};
use serde_json::json;

use crate::{OK, REFUSED, cli::print_json, output::outln};

/// Runs the worker until `stop`; the runs in flight then stop at a safe point, their jobs back
/// on the queue for another worker.
pub(crate) async fn worker(
    loom: &Loom,
    jobs: Option<u16>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<u8, LoomError> {
    let Some(queue) = loom.job_queue().await? else {
        eprintln!(
            "error: loom worker consumes a job queue: declare storage.queue with backend rabbitmq"
        );
        return Ok(REFUSED);
    };
    let configured = loom.config().raw().storage.queue.max_running;
    let jobs = jobs.unwrap_or_else(|| u16::try_from(configured).unwrap_or(u16::MAX));
    if jobs == 0 {
        eprintln!("error: --jobs must be 1 or more");
        return Ok(REFUSED);
    }
    queue.ping().await?;
    eprintln!(
        "Worker {}: {jobs} job(s) at once from queue '{}'",
        loom.worker_id(),
        loom.config().raw().storage.queue.name
    );
    let stopper = {
        let loom = loom.clone();
        tokio::spawn(async move {
            stop.await;
            eprintln!(
                "Stopping: the runs in flight stop at a safe point, their jobs go back to the queue"
            );
            loom.stop(loom.shutdown_timeout()).await;
        })
    };
    let worked = loom.work(WorkOptions { jobs }).await;
    stopper.abort();
    worked.map(|()| OK)
}

/// `loom queue`: the depths, then the dead-letter queue's first jobs.
pub(crate) async fn status(loom: &Loom, limit: usize, json: bool) -> Result<u8, LoomError> {
    let queue = queue(loom).await?;
    let depth = queue.depth().await?;
    let dead = queue.dead(limit).await?;
    if json {
        return Ok(print_json(&json!({ "depth": depth, "dead": dead })));
    }
    outln!(
        "Queue '{}': {} ready, {} delayed, {} dead, {} consumer(s)",
        loom.config().raw().storage.queue.name,
        depth.ready,
        depth.delayed,
        depth.dead,
        depth.consumers
    );
    if !dead.is_empty() {
        outln!(
            "Dead jobs (after {} attempt(s) at most):",
            queue.max_attempts()
        );
    }
    for job in &dead {
        match &job.job {
            Some(j) => outln!(
                "  {} {} tenant {} session {} — {} attempt(s): {}",
                j.key,
                j.kind,
                j.tenant_id,
                j.session_id,
                job.attempts,
                job.reason
            ),
            None => outln!(
                "  (unreadable) {} — {}",
                job.raw.as_deref().unwrap_or_default(),
                job.reason
            ),
        }
    }
    if depth.dead > dead.len() as u64 {
        outln!("  … and {} more", depth.dead - dead.len() as u64);
    }
    Ok(OK)
}

/// `loom queue redrive`: dead jobs back to the queue (attempts from 0), or dropped.
pub(crate) async fn redrive(
    loom: &Loom,
    limit: usize,
    drop: bool,
    json: bool,
) -> Result<u8, LoomError> {
    let queue = queue(loom).await?;
    let count = queue.redrive(limit, drop).await?;
    if json {
        return Ok(print_json(
            &json!({ "moved": if drop { 0 } else { count }, "dropped": if drop { count } else { 0 } }),
        ));
    }
    if drop {
        outln!("{count} dead job(s) dropped");
    } else {
        outln!("{count} dead job(s) back on the queue");
    }
    Ok(OK)
}

async fn queue(loom: &Loom) -> Result<std::sync::Arc<dyn JobQueue>, LoomError> {
    loom.job_queue().await?.ok_or_else(|| {
        LoomError::Refused(
            "there is no job queue: storage.queue.backend is asyncio (background runs are driven \
             in the process that accepts them)"
                .into(),
        )
    })
}
