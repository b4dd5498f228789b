//! Exact replay ([`Loom::replay`], [`Loom::replay_events`]) and the export it reads
//! ([`Loom::export_run`]): a closed run re-driven with today's configuration, its model calls
//! and tool calls answered from its journal (`loom_engine::replay`), in a scratch memory
//! journal; the report says `identical` or names the first divergence. Variant replay
//! ([`Loom::replay_variant`], [`Loom::replay_variant_events`]): the same conversation with other
//! models for named steps and doubles for named tools (`loom_engine::replay::variant`), reported
//! side by side with the original ([`VariantReport`]).

use std::{collections::BTreeMap, sync::Arc};

use loom_core::{
    Event, Payload,
    tool::{Tool, ToolOutput},
};
use loom_engine::{
    Engine, RunRef,
    replay::{Divergence, Miss, ReplayCounts, ReplayError, VariantCounts, VariantPlan},
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

/// What a variant replay changes ([`Loom::replay_variant`]).
#[derive(Clone, Default)]
pub struct VariantOptions {
    /// The model (a configured `models[].id`) of each named step: `main`, a role's name, or
    /// `judge:<name>`. Every call of a named step is made for real to that model.
    pub models: BTreeMap<String, String>,
    /// The double of each named tool: it answers the calls the journal has no result for, so a
    /// tool with side effects is answered without running.
    pub doubles: BTreeMap<String, Arc<dyn Tool>>,
}

impl std::fmt::Debug for VariantOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VariantOptions")
            .field("models", &self.models)
            .field("doubles", &self.doubles.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl VariantOptions {
    /// Runs `step` (`main`, a role, `judge:<name>`) on the configured model `model`.
    pub fn model(mut self, step: impl Into<String>, model: impl Into<String>) -> VariantOptions {
        self.models.insert(step.into(), model.into());
        self
    }

    /// Answers `tool`'s unrecorded calls with `double` (a [`crate::testing::ToolDouble`], or
    /// any tool).
    pub fn double(
        mut self,
        tool: impl Into<String>,
        double: impl Tool + 'static,
    ) -> VariantOptions {
        self.doubles.insert(tool.into(), Arc::new(double));
        self
    }

    /// Answers `tool`'s unrecorded calls with `result`, always the same.
    pub fn double_result(self, tool: impl Into<String>, result: ToolOutput) -> VariantOptions {
        let tool = tool.into();
        let double = crate::testing::ToolDouble::returning(&tool, result);
        self.double(tool, double)
    }
}

/// One side of a variant report: how the run went, from its events and its sub-runs'.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunSide {
    /// How it ended (`completed`, `failed`, …).
    pub status: String,
    /// The answer's text (`""` when there is none).
    pub text: String,
    /// Model calls (`model.responded`).
    pub model_calls: usize,
    /// Tool calls that completed (`tool.completed`), roles and sub-agents included.
    pub tool_calls: usize,
    /// Input tokens of every model call.
    pub input_tokens: u64,
    /// Output tokens of every model call.
    pub output_tokens: u64,
    /// Cost in dollars of every model call.
    pub cost_usd: f64,
    /// Model latency in milliseconds, summed over the calls (an answer served from the journal
    /// takes next to none).
    pub model_latency_ms: f64,
    /// From the run's first event to its last, in milliseconds.
    pub duration_ms: i64,
    /// Each guard's check (`guard.checked`), as `<guard> <target>: <outcome>`, in order.
    pub guards: Vec<String>,
    /// Whether the answer was kept despite its contract or judge.
    pub unverified: bool,
    /// Whether the answer was replaced by a fallback message.
    pub fallback: bool,
}

impl RunSide {
    /// The side of `run_id` from `events` (the run and its sub-runs).
    fn of(run_id: &str, status: &str, events: &[Event]) -> RunSide {
        let result = crate::RunResult::from_events(run_id, events).ok();
        let mut side = RunSide {
            status: status.to_owned(),
            text: result.as_ref().map(|r| r.text.clone()).unwrap_or_default(),
            model_calls: 0,
            tool_calls: 0,
            input_tokens: 0,
            output_tokens: 0,
            cost_usd: 0.0,
            model_latency_ms: 0.0,
            duration_ms: match (events.first(), events.last()) {
                (Some(first), Some(last)) => (last.ts - first.ts).num_milliseconds(),
                _ => 0,
            },
            guards: Vec::new(),
            unverified: result.as_ref().is_some_and(|r| r.unverified),
            fallback: result.as_ref().is_some_and(|r| r.fallback),
        };
        for event in events {
            match &event.payload {
                Payload::ModelResponded(answer) => {
                    side.model_calls += 1;
                    side.input_tokens += answer.usage.input_tokens;
                    side.output_tokens += answer.usage.output_tokens;
                    side.cost_usd += answer.cost_usd;
                    side.model_latency_ms += answer.latency_ms;
                }
                Payload::ToolCompleted(_) => side.tool_calls += 1,
                Payload::GuardChecked(checked) => side.guards.push(format!(
                    "{} {}: {}",
                    checked.guard, checked.target, checked.outcome
                )),
                _ => {}
            }
        }
        side
    }
}

/// What a variant replay gave, side by side with the original run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct VariantReport {
    /// Tenant.
    pub tenant_id: String,
    /// Session.
    pub session_id: String,
    /// The replayed (root) run.
    pub run_id: String,
    /// Its agent.
    pub agent: String,
    /// The model of each named step.
    pub models: BTreeMap<String, String>,
    /// The tools given a double.
    pub doubles: Vec<String>,
    /// The run as the journal recorded it.
    pub original: RunSide,
    /// The variant.
    pub variant: RunSide,
    /// Whether both answers have the same text.
    pub same_answer: bool,
    /// How the variant's calls were answered.
    pub counts: VariantCounts,
    /// The variant's tool calls refused (never run).
    pub misses: Vec<Miss>,
    /// The variant's journal, in journal order: the session's events before the run, then the
    /// variant run and its sub-runs (what `loom replay --mode variant --export FILE` writes).
    #[serde(skip)]
    pub journal: Vec<Event>,
}

impl VariantReport {
    /// Whether the variant completed with every call answered (none refused): what
    /// `loom replay --mode variant` exits 0 for.
    pub fn is_success(&self) -> bool {
        self.variant.status == "completed" && self.misses.is_empty()
    }
}

/// The run a replay re-drives, and the agent it is re-driven with.
struct ReplayTarget {
    tenant_id: String,
    session_id: String,
    agent: String,
    runtime: Arc<loom_engine::AgentRuntime>,
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
        let session = self.session_of(run).await?;
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
        let target = self.replay_target(session, run_id)?;
        let engine = self.scratch_engine();
        let replayed = loom_engine::replay::replay_run(
            &engine,
            &target.runtime,
            session,
            run_id,
            self.originals(),
        )
        .await?;
        Ok(ReplayReport {
            tenant_id: target.tenant_id,
            session_id: target.session_id,
            run_id: run_id.to_owned(),
            agent: target.agent,
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

    /// Replays `run` as a variant: the same conversation (its user message, history and state)
    /// re-driven with the agent as configured today, in a scratch memory journal, with the
    /// models of `options`' named steps (every call of theirs made for real) and its doubles.
    /// The other steps' calls are answered from the journal when the journal recorded the same
    /// request, and made for real to their configured models otherwise. A tool call is answered
    /// from the journal (same tool, same arguments), else by its double, else run only when the
    /// tool declares `side_effects: none`; any other call is refused and listed in
    /// [`VariantReport::misses`]: a tool with side effects never runs. See
    /// `loom_engine::replay::variant`.
    pub async fn replay_variant(
        &self,
        run: &RunRef,
        options: &VariantOptions,
    ) -> Result<VariantReport, LoomError> {
        let session = self.session_of(run).await?;
        self.replay_variant_events(&session, &run.run_id, options)
            .await
    }

    /// Replays `run_id` of `session` (a session's events in journal order, read from an
    /// exported file for instance) as a variant: see [`Loom::replay_variant`].
    pub async fn replay_variant_events(
        &self,
        session: &[Event],
        run_id: &str,
        options: &VariantOptions,
    ) -> Result<VariantReport, LoomError> {
        let target = self.replay_target(session, run_id)?;
        let config = &self.inner.config;
        let mut plan = VariantPlan {
            models: BTreeMap::new(),
            doubles: options.doubles.clone(),
            ..VariantPlan::default()
        };
        for (step, model) in &options.models {
            let binding = crate::resolve::model_binding(
                config,
                &self.inner.models,
                &self.inner.sources,
                &target.tenant_id,
                model,
            )
            .map_err(|unknown| {
                LoomError::Invalid(format!("--model {step}={model}: {unknown}"))
            })??;
            plan.models.insert(step.clone(), binding);
        }
        let engine = self.scratch_engine();
        let replayed = loom_engine::replay::replay_variant(
            &engine,
            &target.runtime,
            &plan,
            session,
            run_id,
            self.originals(),
        )
        .await?;
        let original = RunSide::of(run_id, &replayed.recorded_status, &replayed.recorded);
        let variant = RunSide::of(run_id, &replayed.variant_status, &replayed.replayed);
        // The variant's journal: the session's history copied before the run, then the run.
        let journal = engine
            .store()
            .read(&target.tenant_id, &target.session_id, 0)
            .await?;
        Ok(VariantReport {
            tenant_id: target.tenant_id,
            session_id: target.session_id,
            run_id: run_id.to_owned(),
            agent: target.agent,
            models: options.models.clone(),
            doubles: options.doubles.keys().cloned().collect(),
            same_answer: original.text == variant.text,
            original,
            variant,
            counts: replayed.counts,
            misses: replayed.misses,
            journal,
        })
    }

    /// This instance's artifact store, where a replayed run's attached files are read.
    pub(crate) fn originals(&self) -> Option<&dyn loom_core::ports::ArtifactStore> {
        self.inner.engine.artifacts().map(|store| store.as_ref())
    }

    /// The events of `run`'s session in this instance's journal.
    async fn session_of(&self, run: &RunRef) -> Result<Vec<Event>, LoomError> {
        Ok(self
            .inner
            .engine
            .store()
            .read(&run.tenant_id, &run.session_id, 0)
            .await?)
    }

    /// What a replay of `run_id` of `session` re-drives: its tenant (one this configuration
    /// declares), session and agent, and the agent as configured today.
    fn replay_target(&self, session: &[Event], run_id: &str) -> Result<ReplayTarget, LoomError> {
        let start = session
            .iter()
            .find(|e| e.run_id == run_id && matches!(e.payload, Payload::RunStarted(_)))
            .ok_or_else(|| LoomError::UnknownRun(run_id.to_owned()))?;
        self.inner
            .config
            .check_tenant(&start.tenant_id)
            .map_err(|e| LoomError::Refused(e.to_string()))?;
        let agent = start.agent.clone().ok_or_else(|| {
            LoomError::Refused(format!("run {run_id}: its run.started names no agent"))
        })?;
        let runtime = self.agent(&agent, &start.tenant_id)?;
        Ok(ReplayTarget {
            tenant_id: start.tenant_id.clone(),
            session_id: start.session_id.clone(),
            agent,
            runtime,
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
        let session = self.session_of(run).await?;
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
