//! Compaction of long sessions (`sessions.compaction`): on demand ([`Loom::compact`], behind
//! `loom compact` and `POST /v1/sessions/{id}/compact`), in the background after a root run
//! whose session history passed `over_tokens` (a task of this process, or a `compaction` job
//! for `loom worker` when there is a job queue), and at a run's opening (`blocking: true`, or
//! past `hard_tokens` whatever `blocking` says).

use loom_core::{
    RunStatus,
    queue::{Job, JobKind},
};
use loom_engine::{Compaction, Compactor, RunRef};

use super::Loom;
use crate::{LoomError, compaction::CompactionNote};

impl Loom {
    /// The `_compaction` agent for `tenant` (its model mapping applied), or `None` without
    /// `sessions.compaction`.
    fn compactor(&self, tenant: &str) -> Result<Option<Compactor>, LoomError> {
        let Some(settings) = &self.config().raw().sessions.compaction else {
            return Ok(None);
        };
        let binding = crate::resolve::compaction_model(
            self.config(),
            &self.inner.models,
            &self.inner.sources,
            tenant,
            &settings.model,
        )?;
        Ok(Some(Compactor::new(
            binding,
            self.config().compaction_system().map(str::to_owned),
            settings.keep_last,
            settings.fidelity_check,
        )))
    }

    /// Compacts `session` now: the turns before the last `keep_last` successful ones are
    /// summarized, checked for fidelity, and replaced by the summary (or kept, when the summary
    /// misses markers of the originals). Refused without `sessions.compaction`;
    /// [`LoomError::UnknownSession`] for a session with no events.
    pub async fn compact(
        &self,
        tenant: Option<&str>,
        session: &str,
    ) -> Result<CompactionNote, LoomError> {
        let tenant = tenant.unwrap_or(super::DEFAULT_TENANT);
        self.config()
            .check_tenant(tenant)
            .map_err(|e| LoomError::Refused(e.to_string()))?;
        let compactor = self.compactor(tenant)?.ok_or_else(|| {
            LoomError::Refused(
                "compaction is not configured: declare sessions.compaction with its model".into(),
            )
        })?;
        let store = self.inner.engine.store();
        if store.last_seq(tenant, session).await? == 0 {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        let done = self
            .inner
            .engine
            .compact(tenant, session, &compactor, None, &())
            .await?;
        Ok(CompactionNote::of(&done))
    }

    /// After a root run closed: when the session's history passed `over_tokens` (and
    /// compaction is not `blocking`), compacts it in the background: a `compaction` job when
    /// there is a job queue, else a task of this process ([`Loom::compactions_idle`] waits for
    /// them).
    pub(super) async fn after_run(&self, run: &RunRef, status: RunStatus) {
        let Some(settings) = &self.config().raw().sessions.compaction else {
            return;
        };
        if settings.blocking || status != RunStatus::Completed {
            return;
        }
        let tokens = match self
            .inner
            .engine
            .history_tokens(&run.tenant_id, &run.session_id)
            .await
        {
            Ok(tokens) => tokens,
            Err(error) => {
                tracing::warn!(session_id = %run.session_id, %error, "session history not estimated: no compaction");
                return;
            }
        };
        if tokens <= settings.over_tokens {
            return;
        }
        tracing::debug!(session_id = %run.session_id, tokens, over = settings.over_tokens, "session history past over_tokens: compaction");
        match self.job_queue().await {
            Ok(Some(queue)) => {
                let job = compaction_job(run);
                match queue.enqueue(&job).await {
                    Ok(()) => return,
                    Err(error) => {
                        tracing::warn!(session_id = %run.session_id, %error, "compaction not queued: done in this process")
                    }
                }
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(%error, "job queue unavailable: compaction done in this process")
            }
        }
        let loom = self.clone();
        let run = run.clone();
        let task = tokio::spawn(async move {
            loom.compact_in_background(&run).await;
        });
        if let Ok(mut tasks) = self.inner.compactions.lock() {
            tasks.retain(|t| !t.is_finished());
            tasks.push(task);
        }
    }

    /// Waits until the compactions this process started in the background are done (`loom
    /// run` waits before it reports and exits); whether there was any.
    pub async fn compactions_idle(&self) -> bool {
        let tasks: Vec<tokio::task::JoinHandle<()>> = match self.inner.compactions.lock() {
            Ok(mut tasks) => tasks.drain(..).collect(),
            Err(_) => return false,
        };
        let any = !tasks.is_empty();
        for task in tasks {
            if let Err(error) = task.await {
                tracing::error!(%error, "a compaction task panicked");
            }
        }
        any
    }

    /// A background compaction triggered by `run` (a task, or a worker's job); its outcome is
    /// journaled, and only logged here.
    pub(super) async fn compact_in_background(&self, run: &RunRef) -> Option<Compaction> {
        let compactor = match self.compactor(&run.tenant_id) {
            Ok(Some(compactor)) => compactor,
            Ok(None) => return None,
            Err(error) => {
                tracing::warn!(session_id = %run.session_id, %error, "compaction model unusable: no compaction");
                return None;
            }
        };
        match self
            .inner
            .engine
            .compact(
                &run.tenant_id,
                &run.session_id,
                &compactor,
                Some(&run.run_id),
                &(),
            )
            .await
        {
            Ok(done) => {
                tracing::debug!(session_id = %run.session_id, ?done, "compaction done");
                Some(done)
            }
            Err(error) => {
                tracing::warn!(session_id = %run.session_id, %error, "compaction stopped");
                None
            }
        }
    }

    /// At a run's opening in an existing session: compacts synchronously when compaction is
    /// `blocking` and the history passed `over_tokens`, or whatever `blocking` says when it
    /// passed `hard_tokens` (the safety net); triggered by the session's last turn. A failure
    /// is logged: the run opens on the history as it is (cut to `hard_tokens` if need be).
    pub(super) async fn compact_at_opening(&self, tenant: &str, session: Option<&str>) {
        let (Some(settings), Some(session)) = (&self.config().raw().sessions.compaction, session)
        else {
            return;
        };
        let engine = &self.inner.engine;
        // From the session's last snapshot: never the whole journal.
        let Ok(groups) = engine.history_groups(tenant, session).await else {
            return;
        };
        let tokens = loom_core::state::compaction::groups_tokens(&groups);
        let due =
            tokens > settings.hard_tokens || (settings.blocking && tokens > settings.over_tokens);
        if !due {
            return;
        }
        let Some(last) = groups.iter().rev().find(|g| !g.summary) else {
            return;
        };
        let trigger = RunRef {
            tenant_id: tenant.to_owned(),
            session_id: session.to_owned(),
            run_id: last.run_id.clone(),
        };
        tracing::debug!(session_id = %session, tokens, "compaction at a run's opening");
        self.compact_in_background(&trigger).await;
    }
}

/// The `compaction` job of the session `run` belongs to, triggered by `run` (dedup key
/// `compact:<session>`).
pub(crate) fn compaction_job(run: &RunRef) -> Job {
    Job::for_run(
        JobKind::Compaction,
        &run.tenant_id,
        &run.session_id,
        &run.run_id,
    )
}

/// The compaction tasks of this process (see [`Loom::compactions_idle`]).
pub(super) type Tasks = std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>;
