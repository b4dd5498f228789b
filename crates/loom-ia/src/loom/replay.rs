//! Exact replay ([`Loom::replay`], [`Loom::replay_events`]) and the export it reads
//! ([`Loom::export_run`]): a closed run re-driven with today's configuration, its model calls
//! and tool calls answered from its journal (`loom_engine::replay`), in a scratch memory
//! journal; the report says `identical` or names the first divergence.

use std::sync::Arc;

use loom_core::{Event, Payload};
use loom_engine::{
    Engine, RunRef,
    replay::{Divergence, Miss, ReplayCounts, ReplayError},
};
use loom_journal::{MemoryArtifacts, MemoryIdempotency, MemoryStore};

use super::Loom;
use crate::{LoomError, SystemClock};

/// What an exact replay found.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReplayReport {
    /// Tenant.
    pub tenant_id: String,
    /// Session.
    pub session_id: String,
    /// The replayed (root) run.
    pub run_id: String,
    /// Its agent.
    pub agent: String,
    /// `identical` or `divergent`.
    pub outcome: &'static str,
    /// How the run ended in the journal.
    pub recorded_status: String,
    /// How it ended in the replay.
    pub replay_status: String,
    /// Model answers and tool results recorded, and served to the replay.
    pub counts: ReplayCounts,
    /// Calls the journal had no answer for (never made for real).
    pub misses: Vec<Miss>,
    /// The first divergence, when there is one.
    pub divergence: Option<Divergence>,
}

impl ReplayReport {
    /// Whether the replay reproduced the journal, event by event.
    pub fn is_identical(&self) -> bool {
        self.divergence.is_none()
    }
}

impl From<ReplayError> for LoomError {
    fn from(error: ReplayError) -> LoomError {
        match error {
            ReplayError::UnknownRun(run) => LoomError::UnknownRun(run),
            ReplayError::Engine(engine) => LoomError::from(engine),
            other => LoomError::Refused(other.to_string()),
        }
    }
}

impl Loom {
    /// Replays `run` exactly: the session's journal is read, the run re-driven with the agent
    /// as configured today in a scratch memory journal, every model call answered from the
    /// journal's `model.responded` and every tool call from its `tool.completed` (no provider is
    /// asked, no tool runs, nothing is written to this instance's journal), and its events are
    /// compared with the journal's. What is compared, and what is refused, is documented in
    /// `loom_engine::replay`.
    pub async fn replay(&self, run: &RunRef) -> Result<ReplayReport, LoomError> {
        let session = self
            .inner
            .engine
            .store()
            .read(&run.tenant_id, &run.session_id, 0)
            .await?;
        self.replay_events(&session, &run.run_id).await
    }

    /// Replays `run_id` from `session`, a session's events in journal order (read from an
    /// exported file, for instance): see [`Loom::replay`]. The run's tenant must be one this
    /// configuration declares.
    pub async fn replay_events(
        &self,
        session: &[Event],
        run_id: &str,
    ) -> Result<ReplayReport, LoomError> {
        let start = session
            .iter()
            .find(|e| e.run_id == run_id && matches!(e.payload, Payload::RunStarted(_)))
            .ok_or_else(|| LoomError::UnknownRun(run_id.to_owned()))?;
        let config = &self.inner.config;
        config
            .check_tenant(&start.tenant_id)
            .map_err(|e| LoomError::Refused(e.to_string()))?;
        let agent = start.agent.clone().ok_or_else(|| {
            LoomError::Refused(format!("run {run_id}: its run.started names no agent"))
        })?;
        let runtime = self.agent(&agent, &start.tenant_id)?;
        let engine = self.scratch_engine();
        let replayed = loom_engine::replay::replay_run(&engine, &runtime, session, run_id).await?;
        Ok(ReplayReport {
            tenant_id: start.tenant_id.clone(),
            session_id: start.session_id.clone(),
            run_id: run_id.to_owned(),
            agent,
            outcome: if replayed.divergence.is_none() {
                "identical"
            } else {
                "divergent"
            },
            recorded_status: replayed.recorded_status,
            replay_status: replayed.replay_status,
            counts: replayed.counts,
            misses: replayed.misses,
            divergence: replayed.divergence,
        })
    }

    /// The root runs of `session` that closed, in the order they started: what
    /// `loom replay --journal FILE` replays when no run is named.
    pub fn closed_root_runs(session: &[Event]) -> Vec<String> {
        let closed = |run_id: &str| {
            session.iter().any(|e| {
                e.run_id == run_id
                    && matches!(
                        e.payload,
                        Payload::RunCompleted(_) | Payload::RunFailed(_) | Payload::RunCancelled(_)
                    )
            })
        };
        session
            .iter()
            .filter_map(|e| match &e.payload {
                Payload::RunStarted(started)
                    if started.parent_run_id.is_none()
                        && started.kind == "normal"
                        && closed(&e.run_id) =>
                {
                    Some(e.run_id.clone())
                }
                _ => None,
            })
            .collect()
    }

    /// What a replay of `run` needs, to be kept as a file: the events of its session before it
    /// (its history) and those of the run and its sub-runs, in journal order. Events of other
    /// runs written while it ran are left out.
    pub async fn export_run(&self, run: &RunRef) -> Result<Vec<Event>, LoomError> {
        let session = self
            .inner
            .engine
            .store()
            .read(&run.tenant_id, &run.session_id, 0)
            .await?;
        let start = session
            .iter()
            .find(|e| e.run_id == run.run_id && matches!(e.payload, Payload::RunStarted(_)))
            .map(|e| e.seq)
            .ok_or_else(|| LoomError::UnknownRun(run.run_id.clone()))?;
        Ok(session
            .into_iter()
            .filter(|e| e.seq < start || e.root_run_id == run.run_id)
            .collect())
    }

    /// An engine over a fresh memory journal and artifact store, with this instance's history
    /// caps and lease (and a fresh idempotency store when this instance has one): where a
    /// replay writes.
    pub(super) fn scratch_engine(&self) -> Engine {
        let live = &self.inner.engine;
        let mut engine = Engine::new(Arc::new(MemoryStore::new()), Arc::new(SystemClock))
            .with_artifacts(Arc::new(MemoryArtifacts::new()))
            .with_lease(live.lease())
            .with_snapshots(None)
            .with_history_caps(live.history_caps());
        if live.idempotency().is_some() {
            engine = engine.with_idempotency(Arc::new(MemoryIdempotency::new()));
        }
        engine
    }
}
