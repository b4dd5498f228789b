//! The instance's lifecycle: recovery of abandoned runs, the lease watch, and stopping or
//! shutting down with the runs it drives.

use super::{DEFAULT_TENANT, Loom};
use crate::LoomError;
use loom_engine::RunRef;
use std::collections::HashMap;

/// What an instance keeps in memory about runs besides its journal ([`Loom::residents`]): a
/// run leaves both once it is no longer driven here and nobody follows its session, so a
/// long-running server keeps nothing per finished run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Residents {
    /// Runs this instance drives now (each with its cancellation token).
    pub driving: usize,
    /// Sessions followed now (each with the watch that wakes its followers at a notice).
    pub followed_sessions: usize,
}

impl Loom {
    /// What this instance keeps in memory about runs now (see [`Residents`]).
    pub fn residents(&self) -> Residents {
        Residents {
            driving: self.inner.active.lock().map(|a| a.len()).unwrap_or(0),
            followed_sessions: self.notices().followed(),
        }
    }

    /// Stops what the instance started: MCP server connections and their child processes.
    /// Call it before the process exits.
    pub async fn shutdown(&self) {
        for source in self.inner.sources.values() {
            source.shutdown().await;
        }
        self.inner.tool_sources.shutdown().await;
    }

    /// Re-drives, in the background, every run of the tenant left unfinished (a crash, a
    /// `kill -9`) whose lease has expired (a run never claimed: whose last event is older than
    /// one lease), skipping runs this instance drives, runs paused for a human and runs whose
    /// agent is no longer declared. Returns the runs re-queued. Reads every session of the
    /// tenant; [`Loom::lease_watch`] remembers what it read and reads only what changed.
    pub async fn recover(&self, tenant: Option<&str>) -> Result<Vec<RunRef>, LoomError> {
        let tenant = tenant.unwrap_or(DEFAULT_TENANT).to_owned();
        crate::recovery::LeaseWatch::new(self.clone(), vec![tenant])
            .sweep()
            .await
    }

    /// A sweep of every tenant the configuration knows (`default`, and each of `tenants`) for
    /// runs another process abandoned (see [`Loom::recover`]); each [`LeaseWatch::sweep`]
    /// after the first reads only the sessions that changed or hold a lease that ran out.
    ///
    /// [`LeaseWatch::sweep`]: crate::LeaseWatch::sweep
    pub fn lease_watch(&self) -> crate::LeaseWatch {
        crate::recovery::LeaseWatch::new(self.clone(), self.known_tenants())
    }

    /// Sweeps the journal for abandoned runs every [`LeaseWatch::period`] (half of
    /// `execution.lease`, between 1 and 30 s) and resumes them, until `stop` resolves or
    /// [`Loom::stop`] is called. What `loom serve` runs beside the API, so that a run left by
    /// a crashed process sharing the journal goes on once its lease expires. Several
    /// processes may watch one journal: a run's lease is taken by one driver only (its
    /// `run.claimed` is appended under the journal's optimistic concurrency).
    ///
    /// [`LeaseWatch::period`]: crate::LeaseWatch::period
    pub async fn watch_leases(&self, stop: impl std::future::Future<Output = ()>) {
        let mut watch = self.lease_watch();
        let period = watch.period();
        let mut stop = std::pin::pin!(stop);
        let signal = self.inner.engine.stop_signal().clone();
        loop {
            tokio::select! {
                () = &mut stop => return,
                () = signal.requested() => return,
                () = tokio::time::sleep(period) => {}
            }
            match watch.sweep().await {
                Ok(runs) => {
                    for run in runs {
                        tracing::warn!(
                            run_id = %run.run_id,
                            session_id = %run.session_id,
                            tenant = %run.tenant_id,
                            "resuming a run whose lease expired (its driver stopped without handing it back)"
                        );
                    }
                }
                Err(error) => tracing::warn!(%error, "the sweep for abandoned runs failed"),
            }
        }
    }

    /// `default` and each tenant of the configuration.
    pub(super) fn known_tenants(&self) -> Vec<String> {
        let mut tenants = vec![DEFAULT_TENANT.to_owned()];
        for tenant in &self.config().raw().tenants {
            if !tenants.contains(&tenant.id) {
                tenants.push(tenant.id.clone());
            }
        }
        tenants
    }

    /// `execution.shutdown_timeout`: how long a stop lets a step finish ([`Loom::stop`]), and
    /// how long [`Loom::cancel`] waits for a drive to journal a cancellation.
    pub fn shutdown_timeout(&self) -> std::time::Duration {
        std::time::Duration::try_from_secs_f64(self.config().raw().execution.shutdown_timeout)
            .unwrap_or(std::time::Duration::from_secs(30))
    }

    /// Stops driving, for a process that shuts down without closing its runs: every run this
    /// instance drives stops at its next safe point (after the step in progress has written
    /// its events) and hands its lease back, open in its journal; a run asked for afterwards
    /// stops before its first step. Waits until no run is driven; runs still in a step after
    /// `grace` have that step abandoned as a crash would leave it (and their lease handed
    /// back); it waits at most `grace` again for them. A caller driving a stopped run gets
    /// [`LoomError::Interrupted`]; the runs resume with [`Loom::resume`] or [`Loom::recover`]
    /// (what the next `loom serve` does).
    pub async fn stop(&self, grace: std::time::Duration) {
        let signal = self.inner.engine.stop_signal();
        signal.request();
        if tokio::time::timeout(grace, self.idle()).await.is_err() {
            let left = self.inner.active.lock().map(|a| a.len()).unwrap_or(0);
            tracing::warn!(
                runs = left,
                grace_s = grace.as_secs_f64(),
                "runs still in a step after the shutdown timeout: their steps are abandoned"
            );
            signal.interrupt();
            // An abandoned step lets go at once; only a pilot stuck outside its steps (opening
            // a tool source) can keep it: such a run resumes once its lease expires.
            let bound = grace.max(std::time::Duration::from_secs(1));
            if tokio::time::timeout(bound, self.idle()).await.is_err() {
                tracing::warn!("runs did not let go: they resume once their lease expires");
            }
        }
    }

    /// Whether [`Loom::stop`] was called: runs are no longer driven by this instance.
    pub fn is_stopping(&self) -> bool {
        self.inner.engine.stop_signal().is_requested()
    }

    /// Resolves when this instance drives no run.
    pub(super) async fn idle(&self) {
        self.until_active(HashMap::is_empty).await;
    }

    /// [`Loom::recover`] for every tenant the configuration knows (`default`, and each of
    /// `tenants`): what a server does when it starts, so the runs a previous process left
    /// open (a shutdown, a crash) go on.
    pub async fn recover_all(&self) -> Result<Vec<RunRef>, LoomError> {
        self.lease_watch().sweep().await
    }
}
