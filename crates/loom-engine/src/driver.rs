//! The driver: the run loop, a short dispatcher over its points.
//!
//! [`Engine::drive`] folds the run from the journal, builds the pilot's [`Io`] (the run's
//! events, journal writer, lease, cancellation and timeout), claims the run, opens its tool
//! sources ([`Offer`]), then steps until the run closes, pauses, or the engine stops. Each step
//! is one of the loop's points, chosen from the state alone and given only what it reads:
//!
//! | the state calls for | point |
//! |---|---|
//! | a decision (a repair, a way out of a pause, a transition, a missing closing event) | [`decide`] |
//! | the final output of a terminal role called alone | [`review::finish`] |
//! | a review of the orchestrator's answer (`after_model`, then the output guards) | [`review::after_model`] |
//! | a stop (cancellation, timeout, a request lost while opening) | [`decide::stopping`] |
//! | a model call | [`model_step::run`] |
//! | a tool batch | [`tools::run`] |
//!
//! No point names this module: a sub-agent's child run is driven by the same loop through the
//! [`Pilot`] it is handed.

use std::{sync::Arc, time::Instant};

use loom_core::{BoxFuture, Role, RunState, RunStatus, approval::Approver, event::Effect};

use crate::{
    agent::AgentRuntime,
    budget::Spent,
    cancel::Cancel,
    chain::Models,
    decide::{self, Rules},
    engine::Engine,
    error::EngineError,
    events::RunRef,
    io::{Io, Lease},
    judging::Judging,
    model_step::{self, Orchestrator},
    observer::Observer,
    offer::Offer,
    review::{self, Guards},
    roles::{self, Roles},
    subagents::{Pilot, Spawn},
    tools::{self, Batch, BatchEnd},
    tree,
    window::Window,
    writer::SessionWriter,
};

impl Engine {
    /// Drives a run until it closes (or can no longer advance), returning its final state.
    ///
    /// `observer` sees every event once durable and the model's text deltas; `cancel` (a
    /// [`Cancel`], which says who cancels, or a plain `&CancellationToken`) stops the run
    /// between or during steps, closing it as `cancelled` (`run.cancelled.by`: the `Cancel`'s).
    pub async fn drive(
        &self,
        run: &RunRef,
        agent: &AgentRuntime,
        observer: &dyn Observer,
        cancel: impl Into<Cancel>,
    ) -> Result<RunState, EngineError> {
        self.drive_with(run, agent, observer, cancel, None).await
    }

    /// Like [`Engine::drive`], with an inline `approver` that decides approval requests inside
    /// the loop (the run never pauses; requests and decisions are still journaled). Without
    /// one, a call that needs approval pauses the run: `drive` returns the `paused` state,
    /// the lease handed back.
    pub async fn drive_with(
        &self,
        run: &RunRef,
        agent: &AgentRuntime,
        observer: &dyn Observer,
        cancel: impl Into<Cancel>,
        approver: Option<Arc<dyn Approver>>,
    ) -> Result<RunState, EngineError> {
        let cancel: Cancel = cancel.into();
        // What of the session this run reads: from the last snapshot before it began.
        let window = Window::of_run(self.store.as_ref(), run).await?;
        let journal = &window.events;
        let mut state = RunState::fold(&run.run_id, journal)?;
        if state.finished {
            return Ok(state);
        }
        let sub = state.parent_run_id.is_some();
        // The conversation of the session's earlier runs: the snapshot's turns, then every
        // root run that began after it and before this one, the latest compaction applied,
        // within the caps. A sub-run starts from its message alone; a compaction run reads
        // the turns it summarizes in its request, not as history.
        let (history, trim) = if sub || state.kind != "normal" {
            (Vec::new(), None)
        } else {
            crate::compaction::history(window.groups_before(&run.run_id)?, self.history_caps)
        };
        // What the caps left out is journaled once per run.
        let trimmed = trim
            .filter(|_| !crate::compaction::already_trimmed(journal, &run.run_id))
            .map(|t| crate::compaction::trimmed(&t));
        let session_spent = match &agent.budget {
            Some(limits) if !limits.session.is_empty() && !sub => {
                Some(window.spent_before(&run.run_id)?)
            }
            _ => None,
        };
        // Roles that read the tool results of the whole session read all of it.
        let offer = if roles::read_earlier_results(&agent.roles) && window.after > 0 {
            let whole = Window::whole(self.store.as_ref(), &run.tenant_id, &run.session_id).await?;
            Offer::new(agent, state.depth, &whole.events, &run.run_id)?
        } else {
            Offer::new(agent, state.depth, journal, &run.run_id)?
        };
        let children_blocked = state.status == RunStatus::WaitingChild
            && tree::blocked(journal, &state, self.clock.now());
        let root_run_id = state.root_run_id.clone();
        let writer = SessionWriter::new(
            self.store.as_ref(),
            run,
            &self.worker_id,
            observer,
            window.last_seq(),
        );
        let lease = Lease {
            worker_id: &self.worker_id,
            duration: self.lease,
            sub,
        };
        let events = self.events(run, &agent.name, &root_run_id);
        let mut io = Io::new(
            events,
            self.store.as_ref(),
            writer,
            lease,
            &cancel,
            agent.timeout,
            &window,
        );
        io.session_state = agent.state.fold_window(journal);
        let mut driver = Driver {
            reads: Reads {
                engine: self,
                agent,
                observer,
                sub,
            },
            approver,
            io,
            offer,
            history: crate::request::History::new(history),
            trimmed,
            session_spent,
            children_blocked,
        };
        let outcome = driver.pilot(&mut state).await;
        // Run-scoped sources close with the pilot, whatever happened.
        driver.offer.release(run).await;
        match outcome {
            // A step abandoned mid-way: what is durable is what the journal says.
            Ok(()) if self.stop.is_interrupted() && !state.finished => {
                let window = Window::of_run(self.store.as_ref(), run).await?;
                return Ok(RunState::fold(&run.run_id, &window.events)?);
            }
            Ok(()) => {}
            // Closed by someone else (a cancel from another process): that is the outcome.
            Err(EngineError::RunMoved(_)) => {
                let window = Window::of_run(self.store.as_ref(), run).await?;
                return Ok(RunState::fold(&run.run_id, &window.events)?);
            }
            Err(other) => return Err(other),
        }
        if !sub && state.finished {
            // A snapshot only saves reading: failing to write one loses nothing.
            if let Err(error) = self.snapshot_if_due(run).await {
                tracing::warn!(run_id = %run.run_id, %error, "session snapshot not written");
            }
        }
        tracing::debug!(
            run_id = %run.run_id,
            status = %state.status,
            iterations = state.iterations,
            cost_usd = state.cost_usd,
            "run closed"
        );
        Ok(state)
    }
}

impl Pilot for Engine {
    fn drive<'a>(
        &'a self,
        run: &'a RunRef,
        agent: &'a AgentRuntime,
        observer: &'a dyn Observer,
        cancel: Cancel,
        approver: Option<Arc<dyn Approver>>,
    ) -> BoxFuture<'a, Result<RunState, EngineError>> {
        Box::pin(self.drive_with(run, agent, observer, cancel, approver))
    }
}

/// What the points of one pilot read: the engine's services, the agent, the observer.
#[derive(Clone, Copy)]
struct Reads<'a> {
    engine: &'a Engine,
    agent: &'a AgentRuntime,
    observer: &'a dyn Observer,
    /// A sub-run: its parent pilots it, so it takes no lease (no `run.claimed`) and its text
    /// is not streamed to a live display.
    sub: bool,
}

impl<'a> Reads<'a> {
    /// What the decisions read of the agent.
    fn rules(self) -> Rules {
        Rules {
            max_iterations: self.agent.max_iterations,
            on_expiry: self.agent.approval.on_expiry,
        }
    }

    /// What the guards of the orchestrator's answers read.
    fn guards(self) -> Guards<'a> {
        Guards {
            policies: &self.agent.policies,
            output: self.agent.output.as_ref(),
            judges: Judging {
                judges: &self.agent.judges,
                models: self.models(),
                store: self.engine.store.as_ref(),
            },
            fidelity: self.agent.fidelity.as_ref(),
        }
    }

    /// What model calls need.
    fn models(self) -> Models<'a> {
        Models {
            breakers: &self.engine.breakers,
            artifacts: self.engine.artifacts.as_ref(),
            observer: self.observer,
            live: !self.sub,
        }
    }
}

/// One pilot of one run: what the points read, and the [`Io`] they act through.
struct Driver<'a> {
    reads: Reads<'a>,
    /// Decides approvals inline (the run then never pauses).
    approver: Option<Arc<dyn Approver>>,
    io: Io<'a>,
    /// The tools offered to the model.
    offer: Offer,
    /// The conversation of the session's earlier runs, shared by each step's requests.
    history: crate::request::History,
    /// The `session.trimmed` to journal once the run is claimed (the caps cut its history).
    trimmed: Option<loom_core::event::Payload>,
    /// What the session's earlier runs spent, folded when this pilot began; `None` when no
    /// session limit applies (none set, or a sub-agent run).
    session_spent: Option<Spent>,
    /// Waiting for children that cannot move now (each waits for a human).
    children_blocked: bool,
}

impl Driver<'_> {
    /// Claims the run, opens its tool sources, then steps until the run closes.
    async fn pilot(&mut self, state: &mut RunState) -> Result<(), EngineError> {
        if self.waiting(state) {
            // Paused for a human and nothing has expired: nothing to do, nothing written.
            return Ok(());
        }
        let Reads { engine, agent, .. } = self.reads;
        let sub = self.reads.sub;
        let run = self.io.events().run();
        if engine.stop.is_requested() && !state.status.is_terminal() {
            // Stopping before it began: nothing claimed, nothing to hand back.
            return Ok(());
        }
        if !state.status.is_terminal() {
            self.io.claim(state).await?;
            if let Some(trimmed) = self.trimmed.take() {
                let event = self.io.events().decision(state, trimmed);
                self.io.write(state, vec![event]).await?;
            }
            self.offer.open(&mut self.io, &agent.sources, state).await?;
        }
        tracing::debug!(run_id = %run.run_id, worker_id = %engine.worker_id, "driving run");
        while !state.finished {
            if self.waiting(state) {
                if sub {
                    // A sub-run holds no lease: its parent pilots it.
                    return Ok(());
                }
                // Paused: the lease is handed back, nothing is left running.
                self.io.hand_back(state).await?;
                tracing::debug!(run_id = %run.run_id, "run paused for approval");
                return Ok(());
            }
            if engine.stop.is_requested() && !state.status.is_terminal() {
                // A safe point: the last step's events are written. The run stays open here.
                if !sub {
                    self.io.hand_back(state).await?;
                }
                tracing::debug!(run_id = %run.run_id, "run stopped: the engine is stopping");
                return Ok(());
            }
            let before = state.last_seq;
            let abandoned = {
                let step = self.step(state);
                tokio::select! {
                    biased;
                    outcome = step => {
                        outcome?;
                        false
                    }
                    () = engine.stop.interrupted() => true,
                }
            };
            if abandoned {
                // The step is dropped where it was (its tool tasks aborted), as a crash would
                // leave it; the journal is re-read to hand the lease back.
                if !sub {
                    engine.hand_back_after_interrupt(run, &agent.name).await?;
                }
                tracing::debug!(run_id = %run.run_id, "run interrupted: the engine is stopping");
                return Ok(());
            }
            if state.last_seq == before {
                return Err(EngineError::NoProgress(run.run_id.clone()));
            }
        }
        Ok(())
    }

    /// One step: a decision if the state calls for one, else the state's effect.
    async fn step(&mut self, state: &mut RunState) -> Result<(), EngineError> {
        let reads = self.reads;
        let rules = reads.rules();
        if let Some(batch) = decide::repair(&self.io, &rules, state) {
            return self.io.write(state, batch).await.map(drop);
        }
        // A terminal role called alone, and successful: its result is the final output.
        if let Some((output, cause)) =
            roles::terminal_output(&reads.agent.roles, &self.io.last_ids, state)
        {
            let guards = reads.guards();
            return review::finish(
                &mut self.io,
                &guards,
                state,
                output,
                "tool.completed",
                Some(cause),
            )
            .await;
        }
        if let Some(batch) = decide::next(&self.io, &rules, state) {
            return self.io.write(state, batch).await.map(drop);
        }
        if matches!(
            state.status,
            RunStatus::ReadyForModel | RunStatus::Finalizing
        ) && state
            .messages
            .last()
            .is_some_and(|m| m.role == Role::Assistant)
        {
            // Decisions count in the run's piloting time (reference §3.3), not only steps.
            let started = Instant::now();
            let guards = reads.guards();
            let reviewed = review::after_model(&mut self.io, &guards, state).await;
            self.io.count_decision(started.elapsed());
            return reviewed;
        }
        if let Some(batch) = decide::stopping(&self.io, state) {
            return self.io.write(state, batch).await.map(drop);
        }
        self.io.renew(state).await?;
        match state.status {
            RunStatus::ReadyForModel => self.model_step(state, Effect::ModelCall).await,
            RunStatus::Finalizing => self.model_step(state, Effect::Finalize).await,
            RunStatus::AwaitingTools => self.tool_batch(state).await,
            other => Err(EngineError::Invalid(format!(
                "run {}: the state {other} cannot advance in this version",
                state.run_id
            ))),
        }
    }

    /// The model step, offering the tools offered now.
    async fn model_step(
        &mut self,
        state: &mut RunState,
        effect: Effect,
    ) -> Result<(), EngineError> {
        let Reads { engine, agent, .. } = self.reads;
        let tools = self
            .offer
            .now(&agent.roles, engine.artifacts.as_ref(), state)
            .into_owned();
        // With `main.context`, every call ends with the session state and the system prompt
        // says what it is.
        let system = agent.state.system(&agent.system);
        let orchestrator = Orchestrator {
            system: &system,
            state: agent.state.message(&self.io.session_state),
            chain: agent.chain().collect(),
            policies: &agent.policies,
            budget: agent.budget.as_ref(),
            session_spent: self.session_spent,
            history: &self.history,
            output_schema: agent
                .output
                .as_ref()
                .and_then(|contract| contract.spec().schema.as_ref()),
            models: self.reads.models(),
        };
        model_step::run(&mut self.io, &orchestrator, state, effect, &tools).await
    }

    /// The tool batch of the last answer's calls.
    async fn tool_batch(&mut self, state: &mut RunState) -> Result<(), EngineError> {
        let Reads {
            engine,
            agent,
            observer,
            ..
        } = self.reads;
        let offered = self
            .offer
            .now(&agent.roles, engine.artifacts.as_ref(), state)
            .into_owned();
        let batch = Batch {
            agent,
            offered: &offered,
            idempotency: engine.idempotency.as_ref(),
            artifacts: engine.artifacts.as_ref(),
            approver: self.approver.as_ref(),
            roles: Roles {
                roles: &agent.roles,
                models: self.reads.models(),
                store: engine.store.as_ref(),
                policies: &agent.policies,
            },
            spawn: Spawn {
                engine,
                pilot: engine,
                observer,
                approver: self.approver.as_ref(),
                subagents: &agent.subagents,
                budget: agent.budget.as_ref(),
            },
        };
        if tools::run(&mut self.io, &batch, state).await? == BatchEnd::ChildrenWait {
            self.children_blocked = true;
        }
        Ok(())
    }

    /// Whether the run is paused for a human, or waits for children that are, and nothing can
    /// move it now.
    fn waiting(&self, state: &RunState) -> bool {
        decide::waiting(&self.io, &self.reads.rules(), state, self.children_blocked)
    }
}
