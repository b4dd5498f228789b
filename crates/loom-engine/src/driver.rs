//! The driver: begin a run, then advance it one step at a time until it closes.

use std::{
    collections::{BTreeSet, HashMap},
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::{
    AgentRuntime, BeginRun, BoundTool, Breakers, Cancel, Engine, EngineError, ModelBinding, RunRef,
    request,
    resilience::{self, Admission},
    tools,
    writer::SessionWriter,
};
use loom_core::{
    Event, Message, RunState, RunStatus,
    approval::{ApprovalRecord, Approver, Decision, OnExpiry},
    content::BlockKind,
    event::{
        ApprovalExpired, CircuitOpened, Effect, Envelope, MessageUser, ModelExchanged,
        ModelFellBack, ModelResponded, ModelRetried, Outcome, Payload, RunCancelled, RunClaimed,
        RunCompleted, RunContext, RunFailed, RunStarted, RunTransitioned, StepCompleted,
        StepStarted, ToolSourceUnavailable,
    },
    ids::is_safe_id,
    model::{
        HttpExchange, ModelError, ModelErrorKind, ModelRequest, ModelResponse, StopReason,
        ToolChoice,
    },
    ports::{SourceContext, ToolSource},
    state::session_history,
};

/// How many times opening a run is attempted when the session's journal keeps moving.
const MAX_BEGIN_ATTEMPTS: usize = 5;

/// Receives what a run produces, as it happens: journaled events (after they are durable) and
/// text deltas streamed by the model (before the answer is journaled).
pub trait Observer: Send + Sync {
    /// An event was appended to the journal.
    fn event(&self, _event: &Event) {}
    /// The model streamed some text for `run_id`.
    fn text_delta(&self, _run_id: &str, _text: &str) {}
    /// The model call of `run_id` starts streaming again (a retry, or a fallback model): the
    /// text streamed since the step began will not be journaled, and a live display should drop
    /// it.
    fn reset(&self, _run_id: &str) {}
}

impl Observer for () {}

/// How a step's effect ended.
pub(crate) enum StepEnd<T> {
    Done(T),
    Cancelled,
    TimedOut,
}

impl Engine {
    /// Opens a run: writes `run.started`, one `artifact.stored` per attachment, and
    /// `message.user` (the message, then an `artifact` block per attachment) in one batch.
    ///
    /// Nothing is written when the ids are unusable, an attachment is refused (count, size,
    /// type; see [`crate::AttachmentLimits::check`]), the chosen run id exists in the session,
    /// or the session's journal cannot be folded. Attachments are stored in the artifact store
    /// just before the batch is appended.
    pub async fn begin(
        &self,
        agent: &AgentRuntime,
        begin: BeginRun,
        observer: &dyn Observer,
    ) -> Result<RunRef, EngineError> {
        begin.message.check().map_err(EngineError::Unusable)?;
        for (what, id) in [
            ("tenant", Some(&begin.tenant_id)),
            ("session", begin.session_id.as_ref()),
            ("run", begin.run_id.as_ref()),
        ] {
            if let Some(id) = id
                && !is_safe_id(id)
            {
                return Err(EngineError::Unusable(format!(
                    "{what} id '{id}' is not usable: expected [A-Za-z0-9][A-Za-z0-9._-]{{0,127}}"
                )));
            }
        }
        if !begin.attachments.is_empty() {
            self.attachment_limits
                .check(&begin.attachments)
                .map_err(EngineError::Unusable)?;
            if self.artifacts.is_none() {
                return Err(EngineError::Invalid(
                    "attachments need an artifact store, and this engine has none".into(),
                ));
            }
        }
        let run_id = begin.run_id.clone().unwrap_or_else(|| self.ids.uuid());
        let session_id = begin.session_id.clone().unwrap_or_else(|| run_id.clone());
        let run = RunRef {
            tenant_id: begin.tenant_id.clone(),
            session_id,
            run_id,
        };
        let span = self.ids.uuid();
        let envelope = |payload| self.event(&run, &agent.name, &span, None, None, payload);
        let started = envelope(Payload::RunStarted(RunStarted {
            kind: "normal".into(),
            context: RunContext {
                tenant_id: begin.tenant_id,
                user_id: begin.user_id,
                metadata: begin.metadata,
            },
            parent_run_id: None,
            parent_call_id: None,
            depth: 0,
            triggered_by: None,
            trigger: begin.trigger,
            judges: begin.judges.as_str().into(),
            budget: begin.budget,
            state: Default::default(),
        }));
        let mut message = begin.message;
        // Built once the run is known to be new: attachments are stored then, not before.
        let mut batch: Option<Vec<Event>> = None;
        // Other runs of the session may write in between: re-read and re-check, a few times.
        for _ in 0..MAX_BEGIN_ATTEMPTS {
            let events = self.store.read(&run.tenant_id, &run.session_id, 0).await?;
            if events.iter().any(|e| e.run_id == run.run_id) {
                return Err(EngineError::RunExists {
                    run_id: run.run_id.clone(),
                    session_id: run.session_id.clone(),
                });
            }
            session_history(&events)?;
            crate::ownership::check(&events, &run.session_id, &agent.name)?;
            let opening = match batch.take() {
                Some(opening) => opening,
                None => {
                    let mut opening = vec![started.clone()];
                    if let Some(store) = &self.artifacts
                        && !begin.attachments.is_empty()
                    {
                        let stored = crate::attachments::store(
                            store.as_ref(),
                            &run.tenant_id,
                            &run.session_id,
                            &begin.attachments,
                        )
                        .await?;
                        for (event, block) in stored {
                            opening.push(envelope(Payload::ArtifactStored(event)));
                            message.blocks.push(block);
                        }
                    }
                    opening.push(envelope(Payload::MessageUser(MessageUser {
                        message: message.clone(),
                        kind: "request".into(),
                        policy: None,
                        tools: true,
                    })));
                    opening
                }
            };
            let last_seq = events.last().map_or(0, |e| e.seq);
            match self.store.append(opening.clone(), last_seq).await {
                Ok(written) => {
                    for event in &written {
                        observer.event(event);
                    }
                    tracing::debug!(run_id = %run.run_id, session_id = %run.session_id, agent = %agent.name, "run opened");
                    return Ok(run);
                }
                Err(loom_core::ports::StoreError::Conflict { .. }) => batch = Some(opening),
                Err(other) => return Err(other.into()),
            }
        }
        Err(EngineError::Contention(run.session_id))
    }

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
        let cancel = &cancel;
        let events = self.store.read(&run.tenant_id, &run.session_id, 0).await?;
        let mut state = RunState::fold(&run.run_id, &events)?;
        if state.finished {
            return Ok(state);
        }
        // The conversation of the session's earlier runs: every event before this run began
        // (a store returns events in seq order). A sub-run starts from its message alone.
        let start = events
            .iter()
            .position(|e| e.run_id == run.run_id)
            .unwrap_or(0);
        let history = if state.parent_run_id.is_some() {
            Vec::new()
        } else {
            session_history(&events[..start])?
        };
        let last_seq = events.last().map_or(0, |e| e.seq);
        let mut writer = SessionWriter::new(
            self.store.as_ref(),
            run,
            &self.worker_id,
            observer,
            last_seq,
        );
        let mut names = ModelNames::default();
        for event in &events {
            names.note(event);
        }
        let mut last_ids = LastIds::default();
        for event in events.iter().filter(|e| e.run_id == run.run_id) {
            last_ids.note(event);
        }
        let session_spent = match &agent.budget {
            Some(budget) if !budget.session.is_empty() && state.parent_run_id.is_none() => {
                Some(crate::budget::session_spent(&events, &run.run_id)?)
            }
            _ => None,
        };
        let mut tools = agent.tools.clone();
        tools.extend(crate::subagents::offered(agent, state.depth));
        let role_faces = crate::roles::bind_all(&agent.roles)?;
        let mut driver = Driver {
            engine: self,
            run,
            agent,
            history,
            role_faces,
            last_ids,
            names,
            cancel,
            observer,
            tools,
            opened: Vec::new(),
            approver,
            session_spent,
            sub: state.parent_run_id.is_some(),
            root_run_id: state.root_run_id.clone(),
            children_blocked: state.status == RunStatus::WaitingChild
                && crate::subagents::blocked(&events, &state, self.clock.now()),
            decided: Duration::ZERO,
        };
        let outcome = driver.pilot(&mut state, &mut writer).await;
        // Run-scoped sources close with the pilot, whatever happened.
        let context = driver.source_context();
        for source in &driver.opened {
            source.release(&context).await;
        }
        match outcome {
            // A step abandoned mid-way: what is durable is what the journal says.
            Ok(()) if self.stop.is_interrupted() && !state.finished => {
                let events = self.store.read(&run.tenant_id, &run.session_id, 0).await?;
                return Ok(RunState::fold(&run.run_id, &events)?);
            }
            Ok(()) => {}
            // Closed by someone else (a cancel from another process): that is the outcome.
            Err(EngineError::RunMoved(_)) => {
                let events = self.store.read(&run.tenant_id, &run.session_id, 0).await?;
                return Ok(RunState::fold(&run.run_id, &events)?);
            }
            Err(other) => return Err(other),
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

    /// Hands back this worker's live lease on an open run, read from the journal (a step was
    /// abandoned, so the pilot's own view may lag behind what its last append wrote). Retried
    /// while other runs of the session write meanwhile; nothing is written when the run closed
    /// or the lease is not this worker's.
    async fn hand_back_after_interrupt(
        &self,
        run: &RunRef,
        agent_name: &str,
    ) -> Result<(), EngineError> {
        for _ in 0..MAX_BEGIN_ATTEMPTS {
            let events = self.store.read(&run.tenant_id, &run.session_id, 0).await?;
            let state = RunState::fold(&run.run_id, &events)?;
            let now = self.clock.now();
            let ours = state
                .claim
                .as_ref()
                .is_some_and(|c| c.worker_id == self.worker_id && c.lease_until > now);
            if state.finished || !ours {
                return Ok(());
            }
            let mut event = self.event(
                run,
                agent_name,
                &state.run_span_id,
                None,
                None,
                Payload::RunClaimed(RunClaimed {
                    worker_id: self.worker_id.clone(),
                    lease_until: now,
                }),
            );
            event.root_run_id.clone_from(&state.root_run_id);
            match self
                .store
                .append(vec![event], events.last().map_or(0, |e| e.seq))
                .await
            {
                Ok(_) => return Ok(()),
                Err(loom_core::ports::StoreError::Conflict { .. }) => continue,
                Err(other) => return Err(other.into()),
            }
        }
        Err(EngineError::Contention(run.session_id.clone()))
    }

    /// Sends a message to a run that has not closed: it joins the conversation as a user turn
    /// just before the run's next model call (after the open tool calls have their results),
    /// whether the run is being driven (here or elsewhere) or waiting to be resumed.
    pub async fn steer(
        &self,
        run: &RunRef,
        agent_name: &str,
        message: Message,
    ) -> Result<(), EngineError> {
        message.check().map_err(EngineError::Unusable)?;
        for _ in 0..MAX_BEGIN_ATTEMPTS {
            let events = self.store.read(&run.tenant_id, &run.session_id, 0).await?;
            let state = RunState::fold(&run.run_id, &events)?;
            if state.finished || state.status.is_terminal() {
                return Err(EngineError::Invalid(format!(
                    "run {} has closed ({})",
                    run.run_id, state.status
                )));
            }
            let mut event = self.event(
                run,
                agent_name,
                &state.run_span_id,
                None,
                None,
                Payload::MessageUser(MessageUser {
                    message: message.clone(),
                    kind: loom_core::state::STEER.into(),
                    policy: None,
                    tools: true,
                }),
            );
            event.root_run_id.clone_from(&state.root_run_id);
            match self
                .store
                .append(vec![event], events.last().map_or(0, |e| e.seq))
                .await
            {
                Ok(_) => return Ok(()),
                Err(loom_core::ports::StoreError::Conflict { .. }) => continue,
                Err(other) => return Err(other.into()),
            }
        }
        Err(EngineError::Contention(run.session_id.clone()))
    }

    /// Closes a run that is not being driven by this process as cancelled, after its open
    /// sub-runs (most recent first, reason `parent`). Returns `false` when the run had already
    /// closed.
    pub async fn cancel_idle(
        &self,
        run: &RunRef,
        agent_name: &str,
        by: Option<String>,
    ) -> Result<bool, EngineError> {
        // Other runs of the session may write in between: re-read and retry a few times.
        for _ in 0..MAX_BEGIN_ATTEMPTS {
            let events = self.store.read(&run.tenant_id, &run.session_id, 0).await?;
            let state = RunState::fold(&run.run_id, &events)?;
            if state.finished || state.status.is_terminal() {
                return Ok(false);
            }
            // Open sub-runs are cancelled first, in the same write.
            let mut batch = self.descendants_closing(&events, &run.run_id)?;
            batch.extend(self.cancellation(run, agent_name, &state, "requested", by.clone()));
            match self
                .store
                .append(batch, events.last().map_or(0, |e| e.seq))
                .await
            {
                Ok(_) => return Ok(true),
                Err(loom_core::ports::StoreError::Conflict { .. }) => continue,
                Err(other) => return Err(other.into()),
            }
        }
        Err(EngineError::Contention(run.session_id.clone()))
    }

    /// Journals a human decision on the approval requests of a paused run, or of the open
    /// sub-runs of a run waiting for them (a root run answers for its whole tree): the request
    /// of `call_id` (the run's own first, then its descendants' in the order they started), or
    /// every waiting one. Returns the call ids decided.
    ///
    /// Refused (nothing written) when nothing waits, the call has no waiting request or its
    /// request expired ([`EngineError::Invalid`]), or corrected arguments name no single call or
    /// break the tool's schema ([`EngineError::Unusable`]). The run is not driven: [`Engine::drive`] continues it.
    pub async fn settle(
        &self,
        run: &RunRef,
        agent: &AgentRuntime,
        call_id: Option<&str>,
        decision: &Decision,
    ) -> Result<Vec<String>, EngineError> {
        let corrected = match decision {
            Decision::Approved {
                arguments: Some(arguments),
                ..
            } => Some(arguments),
            _ => None,
        };
        if corrected.is_some() && call_id.is_none() {
            return Err(EngineError::Unusable(
                "corrected arguments apply to one named call: give its call id".into(),
            ));
        }
        for _ in 0..MAX_BEGIN_ATTEMPTS {
            let events = self.store.read(&run.tenant_id, &run.session_id, 0).await?;
            let state = RunState::fold(&run.run_id, &events)?;
            // Requests of the open sub-runs surface on their ancestors.
            let descendants = if state.finished || state.status.is_terminal() {
                Vec::new()
            } else {
                crate::subagents::open_descendants(&events, &run.run_id)?
            };
            let waiting: Vec<(&RunState, &ApprovalRecord)> = std::iter::once(&state)
                .chain(descendants.iter().rev())
                .flat_map(|owner| {
                    owner
                        .waiting_approvals()
                        .into_iter()
                        .map(move |record| (owner, record))
                })
                .collect();
            if waiting.is_empty() {
                return Err(EngineError::Invalid(format!(
                    "run {}: nothing is waiting for a decision",
                    run.run_id
                )));
            }
            let targets: Vec<(&RunState, &ApprovalRecord)> = match call_id {
                Some(call_id) => match waiting.iter().find(|(_, a)| a.call_id == call_id) {
                    Some(target) => vec![*target],
                    None => {
                        let ids: Vec<&str> =
                            waiting.iter().map(|(_, a)| a.call_id.as_str()).collect();
                        return Err(EngineError::Invalid(format!(
                            "run {}: no approval is waiting for call '{call_id}' (waiting: {})",
                            run.run_id,
                            ids.join(", ")
                        )));
                    }
                },
                None => waiting,
            };
            let now = self.clock.now();
            if let Some((_, stale)) = targets.iter().find(|(_, a)| a.is_stale(now)) {
                return Err(EngineError::Invalid(format!(
                    "run {}: the approval request for call '{}' expired at {}; it can no longer be decided",
                    run.run_id,
                    stale.call_id,
                    stale.expire_at.map(|t| t.to_rfc3339()).unwrap_or_default()
                )));
            }
            if let Some(arguments) = corrected {
                let (owner, record) = targets[0];
                if !arguments.is_object() {
                    return Err(EngineError::Unusable(format!(
                        "corrected arguments for call '{}' must be a JSON object",
                        record.call_id
                    )));
                }
                // The tool belongs to the agent of the run that asked.
                let owner_agent = if owner.run_id == run.run_id {
                    Some(agent)
                } else {
                    crate::subagents::find_agent(agent, owner.agent.as_deref().unwrap_or_default())
                };
                if let Some(owner_agent) = owner_agent
                    && let Some(tool) = owner_agent
                        .tools
                        .iter()
                        .find(|t| t.name() == record.tool_name)
                    && owner_agent.validate_arguments
                {
                    let problems = tool.schema_problems(arguments);
                    if !problems.is_empty() {
                        return Err(EngineError::Unusable(format!(
                            "corrected arguments for call '{}' do not match the schema of {}:\n{}",
                            record.call_id,
                            record.tool_name,
                            problems.join("\n")
                        )));
                    }
                }
            }
            let batch: Vec<Event> = targets
                .iter()
                .map(|(owner, record)| {
                    let call = loom_core::state::PendingCall {
                        call_id: record.call_id.clone(),
                        name: record.tool_name.clone(),
                        arguments: record.arguments.clone(),
                        started: false,
                        replaced_arguments: None,
                        child_run_id: None,
                    };
                    let owner_run = RunRef {
                        tenant_id: run.tenant_id.clone(),
                        session_id: run.session_id.clone(),
                        run_id: owner.run_id.clone(),
                    };
                    let mut event = self.event(
                        &owner_run,
                        owner.agent.as_deref().unwrap_or(&agent.name),
                        &record.span_id,
                        record.parent_span_id.as_deref(),
                        None,
                        tools::decision_payload(&call, decision),
                    );
                    event.root_run_id.clone_from(&owner.root_run_id);
                    event
                })
                .collect();
            let decided: Vec<String> = targets.iter().map(|(_, a)| a.call_id.clone()).collect();
            match self
                .store
                .append(batch, events.last().map_or(0, |e| e.seq))
                .await
            {
                Ok(_) => return Ok(decided),
                Err(loom_core::ports::StoreError::Conflict { .. }) => continue,
                Err(other) => return Err(other.into()),
            }
        }
        Err(EngineError::Contention(run.session_id.clone()))
    }

    /// The engine's clock, now.
    pub(crate) fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.clock.now()
    }

    /// The transition to `cancelled` and the closing `run.cancelled` of a run (`reason`:
    /// `requested`, or `parent` for a sub-run closed with its parent).
    pub(crate) fn cancellation(
        &self,
        run: &RunRef,
        agent: &str,
        state: &RunState,
        reason: &str,
        by: Option<String>,
    ) -> Vec<Event> {
        let transition = self.event(
            run,
            agent,
            &state.run_span_id,
            None,
            None,
            Payload::RunTransitioned(RunTransitioned {
                from_state: state.status,
                to_state: RunStatus::Cancelled,
                step_no: state.step,
                cause_type: "cancel".into(),
                cause_event_id: None,
            }),
        );
        let mut transition = transition;
        transition.root_run_id.clone_from(&state.root_run_id);
        vec![transition, self.cancelled(run, agent, state, reason, by)]
    }

    /// The closing `run.cancelled` of a run.
    fn cancelled(
        &self,
        run: &RunRef,
        agent: &str,
        state: &RunState,
        reason: &str,
        by: Option<String>,
    ) -> Event {
        let mut event = self.event(
            run,
            agent,
            &state.run_span_id,
            None,
            None,
            Payload::RunCancelled(RunCancelled {
                reason: reason.into(),
                by,
                iterations: state.iterations,
                usage: state.usage,
                cost_usd: state.cost_usd,
                // Requests still waiting are withdrawn with the run.
                withdrawn: state
                    .waiting_approvals()
                    .into_iter()
                    .map(|a| a.call_id.clone())
                    .collect(),
            }),
        );
        event.root_run_id.clone_from(&state.root_run_id);
        event
    }

    pub(crate) fn event(
        &self,
        run: &RunRef,
        agent: &str,
        span: &str,
        parent_span: Option<&str>,
        role: Option<&str>,
        payload: Payload,
    ) -> Event {
        Event::new(
            Envelope {
                event_id: self.ids.uuid(),
                ts: self.clock.now(),
                tenant_id: run.tenant_id.clone(),
                session_id: run.session_id.clone(),
                run_id: run.run_id.clone(),
                root_run_id: run.run_id.clone(),
                span_id: span.to_owned(),
                parent_span_id: parent_span.map(str::to_owned),
                agent: Some(agent.to_owned()),
                role: role.map(str::to_owned),
            },
            payload,
        )
    }
}

/// One pilot of one run.
pub(crate) struct Driver<'a> {
    pub(crate) engine: &'a Engine,
    pub(crate) run: &'a RunRef,
    pub(crate) agent: &'a AgentRuntime,
    history: Vec<Message>,
    /// The tool faces of the agent's roles.
    role_faces: Vec<BoundTool>,
    pub(crate) last_ids: LastIds,
    /// Which model configs produced each provider model name in the session.
    names: ModelNames,
    /// The tools offered in this pilot: the agent's, then those of the sources that opened.
    pub(crate) tools: Vec<BoundTool>,
    /// Sources opened by this pilot, released when it ends.
    opened: Vec<Arc<dyn ToolSource>>,
    pub(crate) cancel: &'a Cancel,
    pub(crate) observer: &'a dyn Observer,
    /// Decides approvals inline (the run then never pauses).
    pub(crate) approver: Option<Arc<dyn Approver>>,
    /// What the session's earlier runs spent, folded when this pilot began; `None` when no
    /// session limit applies (none set, or a sub-agent run).
    pub(crate) session_spent: Option<crate::budget::Spent>,
    /// A sub-run: its parent pilots it, so it takes no lease (no `run.claimed`).
    sub: bool,
    /// The root of the run tree, in every envelope.
    root_run_id: String,
    /// Waiting for children that cannot move now (each waits for a human).
    pub(crate) children_blocked: bool,
    /// Time spent in decisions outside steps by this pilot (counted in the run's timeout).
    decided: Duration,
}

impl Driver<'_> {
    /// Builds an event of this run.
    pub(crate) fn event(
        &self,
        span: &str,
        parent: Option<&str>,
        role: Option<&str>,
        payload: Payload,
    ) -> Event {
        let mut event = self
            .engine
            .event(self.run, &self.agent.name, span, parent, role, payload);
        event.root_run_id.clone_from(&self.root_run_id);
        event
    }

    /// Why this run is cancelled, and by whom: `requested` by whoever cancelled it (its
    /// [`Cancel`]'s `by`), or for a sub-run `parent` by its parent run (its token is its
    /// parent's).
    fn cancel_cause(&self, state: &RunState) -> (&'static str, Option<String>) {
        match &state.parent_run_id {
            Some(parent) => ("parent", Some(parent.clone())),
            None => ("requested", self.cancel.by().map(str::to_owned)),
        }
    }

    /// The cancellation of this run: `requested`, or for a sub-run `parent` (its token is its
    /// parent's).
    pub(crate) fn cancellation(&self, state: &RunState) -> Vec<Event> {
        let (reason, by) = self.cancel_cause(state);
        self.engine
            .cancellation(self.run, &self.agent.name, state, reason, by)
    }

    /// Writes `batch`, then applies it to `state`.
    pub(crate) async fn write(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
        batch: Vec<Event>,
    ) -> Result<Vec<Event>, EngineError> {
        // Closing a run whose sub-runs are open cancels them first, in the same write.
        let batch = if state.pending_calls.iter().any(|c| c.child_run_id.is_some())
            && batch
                .iter()
                .any(|e| e.run_id == self.run.run_id && e.payload.is_closing())
        {
            let events = self
                .engine
                .store()
                .read(&self.run.tenant_id, &self.run.session_id, 0)
                .await?;
            let mut closing = self.engine.descendants_closing(&events, &self.run.run_id)?;
            closing.extend(batch);
            closing
        } else {
            batch
        };
        let written = writer.append(batch).await?;
        for event in writer.take_foreign() {
            state.apply(&event)?;
        }
        for event in written.iter().filter(|e| e.run_id == self.run.run_id) {
            state.apply(event)?;
            self.last_ids.note(event);
            self.names.note(event);
        }
        Ok(written)
    }

    /// The tools offered now: the pilot's, then the roles (a role that reads images only when
    /// the run has one), plus `artifact_read` once a result was offloaded.
    pub(crate) fn offered(&self, state: &RunState) -> std::borrow::Cow<'_, [BoundTool]> {
        let reader = match (self.engine.artifacts(), state.offloaded.is_empty()) {
            (Some(store), false) => {
                crate::offload::artifact_read(store.clone(), state.offloaded.clone())
            }
            _ => None,
        };
        let roles = crate::roles::offered(&self.role_faces, &self.agent.roles, state);
        let mut roles = roles.peekable();
        if reader.is_none() && roles.peek().is_none() {
            return std::borrow::Cow::Borrowed(&self.tools);
        }
        let mut tools = self.tools.clone();
        tools.extend(roles.cloned());
        tools.extend(reader);
        std::borrow::Cow::Owned(tools)
    }

    /// Claims the run, opens its tool sources, then steps until the run closes.
    async fn pilot(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
    ) -> Result<(), EngineError> {
        if self.waiting(state) {
            // Paused for a human and nothing has expired: nothing to do, nothing written.
            return Ok(());
        }
        let engine = self.engine;
        if engine.stop.is_requested() && !state.status.is_terminal() {
            // Stopping before it began: nothing claimed, nothing to hand back.
            return Ok(());
        }
        if !state.status.is_terminal() {
            self.claim(state, writer).await?;
            self.open_sources(state, writer).await?;
        }
        tracing::debug!(run_id = %self.run.run_id, worker_id = %self.engine.worker_id, "driving run");
        while !state.finished {
            if self.waiting(state) {
                if self.sub {
                    // A sub-run holds no lease: its parent pilots it.
                    return Ok(());
                }
                // Paused: the lease is handed back, nothing is left running.
                self.hand_back(state, writer).await?;
                tracing::debug!(run_id = %self.run.run_id, "run paused for approval");
                return Ok(());
            }
            if engine.stop.is_requested() && !state.status.is_terminal() {
                // A safe point: the last step's events are written. The run stays open here.
                if !self.sub {
                    self.hand_back(state, writer).await?;
                }
                tracing::debug!(run_id = %self.run.run_id, "run stopped: the engine is stopping");
                return Ok(());
            }
            let before = state.last_seq;
            let abandoned = {
                let step = self.step(state, writer);
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
                if !self.sub {
                    engine
                        .hand_back_after_interrupt(self.run, &self.agent.name)
                        .await?;
                }
                tracing::debug!(run_id = %self.run.run_id, "run interrupted: the engine is stopping");
                return Ok(());
            }
            if state.last_seq == before {
                return Err(EngineError::NoProgress(self.run.run_id.clone()));
            }
        }
        Ok(())
    }

    /// Hands the lease back (`run.claimed` with `lease_until` = now): another driver may take
    /// the run at once.
    async fn hand_back(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
    ) -> Result<(), EngineError> {
        let span = state.run_span_id.clone();
        let event = self.event(
            &span,
            None,
            None,
            Payload::RunClaimed(RunClaimed {
                worker_id: self.engine.worker_id.clone(),
                lease_until: self.engine.clock.now(),
            }),
        );
        self.write(state, writer, vec![event]).await.map(drop)
    }

    pub(crate) fn source_context(&self) -> SourceContext {
        SourceContext {
            tenant_id: self.run.tenant_id.clone(),
            session_id: self.run.session_id.clone(),
            run_id: self.run.run_id.clone(),
        }
    }

    /// Opens every tool source of the agent. A source that fails has its tools withdrawn from
    /// the run (`tool.source_unavailable`, after `circuit.opened` when its breaker opened);
    /// a required one fails the run.
    async fn open_sources(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
    ) -> Result<(), EngineError> {
        let context = self.source_context();
        let mut batch = Vec::new();
        let mut failed_required: Option<String> = None;
        let span = state.run_span_id.clone();
        for bound in &self.agent.sources {
            match bound.source.open(&context).await {
                Ok(tools) => {
                    self.opened.push(bound.source.clone());
                    for tool in tools {
                        if self.tools.iter().any(|t| t.name() == tool.spec().name) {
                            tracing::warn!(tool = %tool.spec().name, source = %bound.source.name(), "tool name already offered; ignored");
                            continue;
                        }
                        let declarations = tool.spec().declarations.clone();
                        let description = tool.spec().description.clone();
                        match BoundTool::new(tool, declarations, description) {
                            Ok(bound_tool) => self.tools.push(bound_tool),
                            Err(error) => {
                                tracing::warn!(source = %bound.source.name(), %error, "tool ignored")
                            }
                        }
                    }
                }
                Err(error) => {
                    if let Some(circuit) = &error.circuit {
                        batch.push(self.event(
                            &span,
                            None,
                            None,
                            Payload::CircuitOpened(CircuitOpened {
                                target_kind: "mcp".into(),
                                target: circuit.target.clone(),
                                failures: circuit.failures,
                                cooldown_s: circuit.cooldown_s,
                                error: Some(circuit.error.clone()),
                                call_id: None,
                                judge: None,
                            }),
                        ));
                    }
                    batch.push(self.event(
                        &span,
                        None,
                        None,
                        Payload::ToolSourceUnavailable(ToolSourceUnavailable {
                            source: bound.source.name().to_owned(),
                            error: error.message.clone(),
                            required: bound.required,
                        }),
                    ));
                    if bound.required && failed_required.is_none() {
                        failed_required = Some(format!(
                            "required tool source '{}' is unavailable: {}",
                            bound.source.name(),
                            error.message
                        ));
                    }
                }
            }
        }
        if let Some(message) = failed_required {
            batch.extend(self.failure(
                state,
                "tool.source_unavailable",
                "tool.source_unavailable",
                &message,
            ));
        }
        if !batch.is_empty() {
            self.write(state, writer, batch).await?;
        }
        Ok(())
    }

    /// Waits for `future` (one step's effect) unless the run is cancelled or `deadline` (the
    /// run's timeout) passes, renewing the lease every third of it meanwhile, so a long tool
    /// call or model stream never outlives the lease.
    pub(crate) async fn wait<T>(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
        future: impl Future<Output = T>,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<StepEnd<T>, EngineError> {
        let cancel = self.cancel;
        // Renewed on entry when a third of the lease has passed: a step waits many times (a
        // tool batch once per result, a model call once per attempt), and each wait starts
        // its own timer below, so waits shorter than the period would otherwise never renew.
        self.renew(state, writer).await?;
        let mut future = std::pin::pin!(future);
        let expiry = async {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        let mut expiry = std::pin::pin!(expiry);
        // A third of the lease, so a live driver's lease never runs out under a peer's sweep
        // (`Loom::watch_leases`), however short it is configured.
        let period = (self.engine.lease / 3).max(Duration::from_millis(10));
        let mut renewal = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => return Ok(StepEnd::Cancelled),
                () = &mut expiry => return Ok(StepEnd::TimedOut),
                output = &mut future => return Ok(StepEnd::Done(output)),
                _ = renewal.tick() => self.write_claim(state, writer).await?,
            }
        }
    }

    /// The instant the run's timeout expires, counted from now with what is left of it.
    pub(crate) fn deadline(&self, state: &RunState) -> Option<tokio::time::Instant> {
        self.budget(state)
            .map(|left| tokio::time::Instant::now() + left)
    }

    /// Takes the lease, refusing when another worker holds a live one.
    async fn claim(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
    ) -> Result<(), EngineError> {
        let now = self.engine.clock.now();
        if let Some(claim) = &state.claim
            && claim.worker_id != self.engine.worker_id
            && claim.lease_until > now
        {
            return Err(EngineError::ClaimConflict {
                run_id: self.run.run_id.clone(),
                worker_id: claim.worker_id.clone(),
                lease_until: claim.lease_until.to_rfc3339(),
            });
        }
        self.write_claim(state, writer).await
    }

    async fn write_claim(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
    ) -> Result<(), EngineError> {
        if self.sub {
            // The parent's pilot holds the lease of the whole tree.
            return Ok(());
        }
        let lease =
            chrono::Duration::from_std(self.engine.lease).unwrap_or(chrono::Duration::seconds(60));
        let payload = Payload::RunClaimed(RunClaimed {
            worker_id: self.engine.worker_id.clone(),
            lease_until: self.engine.clock.now() + lease,
        });
        let span = state.run_span_id.clone();
        let event = self.event(&span, None, None, payload);
        self.write(state, writer, vec![event]).await.map(drop)
    }

    /// Renews the lease when less than two thirds of it remain.
    async fn renew(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
    ) -> Result<(), EngineError> {
        let Some(claim) = &state.claim else {
            return Ok(());
        };
        let third = chrono::Duration::from_std(self.engine.lease / 3)
            .unwrap_or(chrono::Duration::seconds(20));
        if claim.lease_until - self.engine.clock.now() < third * 2 {
            self.write_claim(state, writer).await?;
        }
        Ok(())
    }

    /// One step: a decision if the state calls for one, else the state's effect.
    async fn step(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
    ) -> Result<(), EngineError> {
        if let Some(batch) = self.repair(state) {
            return self.write(state, writer, batch).await.map(drop);
        }
        // A terminal role called alone, and successful: its result is the final output.
        if let Some((output, cause)) = crate::roles::terminal_output(self, state) {
            return self
                .finish(state, writer, output, "tool.completed", Some(cause))
                .await;
        }
        if let Some(batch) = self.decide(state) {
            return self.write(state, writer, batch).await.map(drop);
        }
        if matches!(
            state.status,
            RunStatus::ReadyForModel | RunStatus::Finalizing
        ) && state
            .messages
            .last()
            .is_some_and(|m| m.role == loom_core::Role::Assistant)
        {
            // Decisions count in the run's piloting time (reference §3.3), not only steps.
            let started = Instant::now();
            let reviewed = self.review(state, writer).await;
            self.decided += started.elapsed();
            return reviewed;
        }
        if self.cancel.is_cancelled() {
            let batch = self.cancellation(state);
            return self.write(state, writer, batch).await.map(drop);
        }
        if let Some(limit) = self.agent.timeout {
            let spent = self.piloted(state);
            if spent >= limit {
                let message = format!(
                    "maximum time of {} s exceeded: {:.1} s of piloting already spent before the next step",
                    fmt_secs(limit),
                    spent.as_secs_f64()
                );
                let batch = self.failure(state, "timeout", "timeout", &message);
                return self.write(state, writer, batch).await.map(drop);
            }
        }
        if !state
            .messages
            .iter()
            .any(|m| m.role == loom_core::Role::User)
        {
            // A crash while opening kept run.started but not its message: nothing to answer.
            let batch = self.failure(
                state,
                "message.user",
                "Interrupted",
                "the run's request was not recorded (the run was interrupted while opening)",
            );
            return self.write(state, writer, batch).await.map(drop);
        }
        self.renew(state, writer).await?;
        match state.status {
            RunStatus::ReadyForModel => self.model_step(state, writer, Effect::ModelCall).await,
            RunStatus::Finalizing => self.model_step(state, writer, Effect::Finalize).await,
            RunStatus::AwaitingTools => tools::batch(self, state, writer).await,
            other => Err(EngineError::Invalid(format!(
                "run {}: the state {other} cannot advance in this version",
                self.run.run_id
            ))),
        }
    }

    /// Whether the run is paused for a human, or waits for children that are, and nothing can
    /// move it now.
    fn waiting(&self, state: &RunState) -> bool {
        match state.status {
            RunStatus::Paused => !state.finished && self.resumed(state).is_none(),
            RunStatus::WaitingChild => !state.finished && self.children_blocked,
            _ => false,
        }
    }

    /// The decision of a paused run: expire the requests past their deadline (failing the run
    /// when `on_expiry` is `fail`); with every request settled, back to the tool batch;
    /// otherwise nothing (the run keeps waiting).
    fn resumed(&self, state: &RunState) -> Option<Vec<Event>> {
        let now = self.engine.clock.now();
        let stale: Vec<&ApprovalRecord> =
            state.approvals.iter().filter(|a| a.is_stale(now)).collect();
        if !stale.is_empty() {
            let action = self.agent.approval.on_expiry;
            let mut batch: Vec<Event> = stale
                .iter()
                .map(|a| {
                    self.event(
                        &a.span_id,
                        a.parent_span_id.as_deref(),
                        None,
                        Payload::ApprovalExpired(ApprovalExpired {
                            call_id: a.call_id.clone(),
                            tool_name: a.tool_name.clone(),
                            action: action.as_str().to_owned(),
                            expire_at: a.expire_at,
                        }),
                    )
                })
                .collect();
            if action == OnExpiry::Fail {
                let tools: Vec<&str> = stale.iter().map(|a| a.tool_name.as_str()).collect();
                batch.extend(self.failure(
                    state,
                    "approval.expired",
                    "approval.expired",
                    &format!("approval not obtained in time ({})", tools.join(", ")),
                ));
            }
            return Some(batch);
        }
        if state.approvals.iter().any(ApprovalRecord::is_pending) {
            return None;
        }
        Some(vec![self.transition(
            state,
            RunStatus::AwaitingTools,
            "model.responded",
            self.last_ids.model.clone(),
        )])
    }

    /// The decision the state calls for, written outside any step.
    fn decide(&self, state: &RunState) -> Option<Vec<Event>> {
        let span = state.run_span_id.clone();
        let closing = |payload| vec![self.event(&span, None, None, payload)];
        match state.status {
            RunStatus::Paused => self.resumed(state),
            // Back to the batch, which re-plays the calls of the waiting children: each child
            // run is resumed where it stopped.
            RunStatus::WaitingChild => Some(vec![self.transition(
                state,
                RunStatus::AwaitingTools,
                "model.responded",
                self.last_ids.model.clone(),
            )]),
            RunStatus::AwaitingTools if state.approvals.iter().any(ApprovalRecord::is_pending) => {
                Some(vec![self.transition(
                    state,
                    RunStatus::Paused,
                    "model.responded",
                    self.last_ids.model.clone(),
                )])
            }
            RunStatus::Completed => Some(closing(self.completed(state))),
            RunStatus::Failed => Some(closing(Payload::RunFailed(RunFailed {
                error_type: state
                    .error_type
                    .clone()
                    .unwrap_or_else(|| "Interrupted".into()),
                error: "run interrupted after it failed".into(),
                iterations: state.iterations,
                usage: state.usage,
                cost_usd: state.cost_usd,
            }))),
            RunStatus::Cancelled => {
                let (reason, by) = self.cancel_cause(state);
                Some(vec![self.engine.cancelled(
                    self.run,
                    &self.agent.name,
                    state,
                    reason,
                    by,
                )])
            }
            RunStatus::AwaitingTools if state.pending_calls.is_empty() => {
                let to = if state.iterations >= self.agent.max_iterations {
                    RunStatus::Finalizing
                } else {
                    RunStatus::ReadyForModel
                };
                Some(vec![self.transition(
                    state,
                    to,
                    "tool.completed",
                    self.last_ids.tool.clone(),
                )])
            }
            _ => None,
        }
    }

    fn completed(&self, state: &RunState) -> Payload {
        let output = state
            .messages
            .iter()
            .rev()
            .find(|m| m.role == loom_core::Role::Assistant)
            .cloned();
        Payload::RunCompleted(RunCompleted {
            output,
            output_event_id: None,
            iterations: state.iterations,
            usage: state.usage,
            cost_usd: state.cost_usd,
            data: None,
            unverified: false,
            fallback: false,
        })
    }

    pub(crate) fn transition(
        &self,
        state: &RunState,
        to: RunStatus,
        cause: &str,
        cause_event_id: Option<String>,
    ) -> Event {
        let span = state.run_span_id.clone();
        self.event(
            &span,
            None,
            None,
            Payload::RunTransitioned(RunTransitioned {
                from_state: state.status,
                to_state: to,
                step_no: state.step,
                cause_type: cause.into(),
                cause_event_id,
            }),
        )
    }

    /// A transition to `failed` and the closing `run.failed`.
    pub(crate) fn failure(
        &self,
        state: &RunState,
        cause: &str,
        error_type: &str,
        error: &str,
    ) -> Vec<Event> {
        let span = state.run_span_id.clone();
        vec![
            self.transition(state, RunStatus::Failed, cause, None),
            self.event(
                &span,
                None,
                None,
                Payload::RunFailed(RunFailed {
                    error_type: error_type.into(),
                    error: error.into(),
                    iterations: state.iterations,
                    usage: state.usage,
                    cost_usd: state.cost_usd,
                }),
            ),
        ]
    }

    /// The time left before the run's timeout, if it has one.
    pub(crate) fn budget(&self, state: &RunState) -> Option<Duration> {
        self.agent
            .timeout
            .map(|limit| limit.saturating_sub(self.piloted(state)))
    }

    /// Piloting time spent: the journaled steps, plus the decisions (policies, contracts,
    /// judges) this pilot took outside steps.
    fn piloted(&self, state: &RunState) -> Duration {
        Duration::from_secs_f64(state.active_ms.max(0.0) / 1000.0) + self.decided
    }

    /// Closes a step whose effect was interrupted: cancelled, or out of time.
    pub(crate) async fn interrupted(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
        step: &StepSpan,
        emitted: u32,
        timed_out: bool,
    ) -> Result<(), EngineError> {
        let outcome = if timed_out {
            Outcome::Error
        } else {
            Outcome::Cancelled
        };
        let mut batch = vec![step.completed(self, state, emitted, outcome)];
        if timed_out {
            let limit = self.agent.timeout.unwrap_or_default();
            let message = format!(
                "maximum time of {} s exceeded: step {} was interrupted ({:.1} s of completed steps)",
                fmt_secs(limit),
                step.step_no,
                state.active_ms / 1000.0
            );
            let mut projected = state.clone();
            projected.step = step.step_no;
            batch.extend(self.failure(&projected, "timeout", "timeout", &message));
        } else {
            batch.extend(self.cancellation(state));
        }
        self.write(state, writer, batch).await.map(drop)
    }

    /// One model call (`model_call`, or `finalize` without tools), made resilient: each model
    /// of the slot's chain is tried with its retry policy and timeouts, skipped while its
    /// circuit breaker is open, and left for the next one when it keeps failing. Every
    /// decision is journaled in the step (`model.retried`, `circuit.opened`,
    /// `model.fell_back`); only the answer of the attempt that succeeded is. The request
    /// passes the `before_model` policies first.
    async fn model_step(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
        effect: Effect,
    ) -> Result<(), EngineError> {
        let step = StepSpan::open(self, state, effect);
        self.write(state, writer, vec![step.started(self, state, effect)])
            .await?;
        let finalizing = effect == Effect::Finalize;
        let tools = self.offered(state).into_owned();
        let mut conversation = state.conversation();
        // With a role (or sub-agent) offered, results are numbered for `$ref`.
        let refs = crate::roles::refs_enabled(&tools);
        if refs {
            crate::roles::number_results(&mut conversation);
        }
        let agent = self.agent;
        let chain: Vec<&ModelBinding> = agent.chain().collect();
        // A run that fell back stays on the model it switched to.
        let start = state
            .models
            .get(SLOT)
            .and_then(|id| chain.iter().position(|m| m.config_id == *id))
            .unwrap_or(0);
        let choice = if finalizing || state.repair_without_tools {
            ToolChoice::None
        } else {
            ToolChoice::Auto
        };
        // The closures below outlive mutable uses of the driver: they own what they read.
        let history = self.history.clone();
        let names = self.names.clone();
        let build = |model: &ModelBinding| {
            let mut request = request::build(
                agent,
                model,
                &tools,
                &history,
                conversation.clone(),
                finalizing,
                choice,
            );
            request::strip_foreign_reasoning(&mut request.messages, |id| names.is_own(id, model));
            if refs {
                request.system = crate::roles::with_refs_hint(&request.system);
            }
            request
        };
        let first = build(chain[start]);
        let mut progress = AttemptState::default();
        // Before each orchestrator call (not while finalizing): the budget, then the agent's
        // `before_model` policies, which may replace the request, stop the run or fail it.
        let replaced = if finalizing {
            None
        } else {
            match crate::hooks::before_model(self, state, writer, &step, first.clone()).await? {
                crate::hooks::Gate::Pass(request) => request,
                crate::hooks::Gate::Stopped { emitted } => {
                    progress.emitted += emitted;
                    let mut batch =
                        vec![step.completed(self, state, progress.emitted, Outcome::Ok)];
                    batch.push(self.transition(
                        state,
                        RunStatus::Finalizing,
                        "policy.decided",
                        self.last_ids.policy.clone(),
                    ));
                    return self.write(state, writer, batch).await.map(drop);
                }
                crate::hooks::Gate::Failed {
                    emitted,
                    error_type,
                    error,
                } => {
                    progress.emitted += emitted;
                    let mut batch =
                        vec![step.completed(self, state, progress.emitted, Outcome::Error)];
                    batch.extend(self.failure(state, "policy.decided", &error_type, &error));
                    return self.write(state, writer, batch).await.map(drop);
                }
            }
        };
        let build = |model: &ModelBinding| match &replaced {
            // A replacement decided on the first model's request applies to every model of
            // the chain, each keeping its own name, token cap and parameters.
            Some(request) => {
                let own = build(model);
                ModelRequest {
                    model_id: own.model_id,
                    max_tokens: own.max_tokens,
                    params: own.params,
                    ..(**request).clone()
                }
            }
            None => build(model),
        };
        let caller = Caller {
            slot: SLOT,
            call_id: None,
            judge: None,
            span: &step.span,
            parent: Some(&state.run_span_id.clone()),
        };
        let deadline = self.deadline(state);
        let end = self
            .call_chain(
                state,
                writer,
                caller,
                &chain,
                start,
                &build,
                deadline,
                &mut progress,
            )
            .await?;
        match end {
            ChainEnd::Answered { model, answer } => {
                self.model_answered(
                    state,
                    writer,
                    &step,
                    model,
                    answer,
                    finalizing,
                    progress.emitted,
                )
                .await
            }
            ChainEnd::Interrupted { timed_out } => {
                self.interrupted(state, writer, &step, progress.emitted, timed_out)
                    .await
            }
            ChainEnd::Failed(error) => {
                self.model_failed(state, writer, &step, error, progress.emitted)
                    .await
            }
        }
    }

    /// Calls a slot's model chain from `start` until a model answers: each model is tried
    /// with its retry policy, skipped while its breaker is open, and left for the next one
    /// (`model.fell_back`) when it keeps failing. Events go in `caller.span`, with the
    /// caller's envelope role, `call_id` and `judge`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn call_chain<'m>(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
        caller: Caller<'_>,
        chain: &[&'m ModelBinding],
        start: usize,
        build: &(dyn Fn(&ModelBinding) -> ModelRequest + Sync),
        deadline: Option<tokio::time::Instant>,
        progress: &mut AttemptState,
    ) -> Result<ChainEnd<'m>, EngineError> {
        let mut index = start.min(chain.len().saturating_sub(1));
        let mut last_error: Option<ModelError> = None;
        let mut skipped: Vec<&str> = Vec::new();
        // After a context overflow, only a model with a larger window may follow.
        let mut window_above: Option<u64> = None;
        loop {
            let Some(&model) = chain.get(index) else {
                return Ok(ChainEnd::Failed(ModelError::new(
                    ModelErrorKind::Unavailable,
                    format!("no model for slot '{}'", caller.slot),
                )));
            };
            let admission = match &model.circuit {
                Some(settings) => self.engine.breakers.admit(
                    &Breakers::model_key(&model.config_id),
                    settings,
                    self.engine.clock.now(),
                ),
                None => Admission::Go,
            };
            let (reason, error) = if let Admission::Skip { until } = admission {
                skipped.push(&model.config_id);
                let message = format!(
                    "circuit breaker of model '{}' is open until {}",
                    model.config_id,
                    until.to_rfc3339()
                );
                ("circuit_open".to_owned(), message)
            } else {
                let request = build(model);
                match self
                    .attempts(state, writer, caller, model, request, deadline, progress)
                    .await?
                {
                    Attempts::Answered(answer) => {
                        return Ok(ChainEnd::Answered { model, answer });
                    }
                    Attempts::Interrupted { timed_out } => {
                        return Ok(ChainEnd::Interrupted { timed_out });
                    }
                    Attempts::Fatal(error) => return Ok(ChainEnd::Failed(error)),
                    Attempts::Exhausted(error) => {
                        if error.kind == ModelErrorKind::ContextOverflow {
                            let window = model.context_window.unwrap_or(0);
                            window_above = Some(window_above.map_or(window, |w| w.max(window)));
                        }
                        let reason = error.kind.as_str().to_owned();
                        let message = error.message.clone();
                        last_error = Some(error);
                        (reason, message)
                    }
                }
            };
            let next = chain
                .iter()
                .enumerate()
                .skip(index + 1)
                .find(|(_, m)| window_above.is_none_or(|w| m.context_window.unwrap_or(0) > w))
                .map(|(i, _)| i);
            let Some(next) = next else {
                let error = match last_error {
                    Some(mut error) => {
                        if !skipped.is_empty() {
                            error.message = format!(
                                "{}; no other model available (skipped by their circuit breaker: {})",
                                error.message,
                                skipped.join(", ")
                            );
                        } else if error.kind == ModelErrorKind::ContextOverflow && chain.len() > 1 {
                            error.message = format!(
                                "{}; no following model has a larger context window",
                                error.message
                            );
                        }
                        error
                    }
                    None => ModelError::new(
                        ModelErrorKind::Unavailable,
                        format!("skipped by their circuit breaker: {}", skipped.join(", ")),
                    ),
                };
                return Ok(ChainEnd::Failed(error));
            };
            let fell_back = self.event(
                caller.span,
                caller.parent,
                Some(caller.slot),
                Payload::ModelFellBack(ModelFellBack {
                    slot: caller.slot.into(),
                    from_model: model.config_id.clone(),
                    to_model: chain[next].config_id.clone(),
                    reason,
                    error: Some(error),
                    call_id: caller.call_id.map(str::to_owned),
                    judge: caller.judge.map(str::to_owned),
                }),
            );
            self.write(state, writer, vec![fell_back]).await?;
            progress.emitted += 1;
            index = next;
        }
    }

    /// The `model.responded` of an answer obtained for `caller` from `model`.
    pub(crate) fn responded(
        &self,
        caller: Caller<'_>,
        model: &ModelBinding,
        answer: Answer,
    ) -> (Event, Vec<Event>) {
        let response = answer.response;
        let cost = model.pricing.cost(&response.usage);
        let event = self.event(
            caller.span,
            caller.parent,
            Some(caller.slot),
            Payload::ModelResponded(ModelResponded {
                model_id: response.model_id,
                model: Some(model.config_id.clone()),
                provider: model.client.provider().to_owned(),
                message: response.message,
                usage: response.usage,
                cost_usd: cost,
                stop_reason: response.stop_reason,
                latency_ms: answer.latency_ms,
                attempts: answer.attempts,
                request_hash: Some(answer.request_hash),
                request_parts: answer.request_parts,
                call_id: caller.call_id.map(str::to_owned),
                judge: caller.judge.map(str::to_owned),
            }),
        );
        (event, answer.exchanged)
    }

    /// Tries one model of the chain until it answers, fails for good, or should be left.
    #[allow(clippy::too_many_arguments)]
    async fn attempts(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
        caller: Caller<'_>,
        model: &ModelBinding,
        request: ModelRequest,
        deadline: Option<tokio::time::Instant>,
        progress: &mut AttemptState,
    ) -> Result<Attempts, EngineError> {
        let engine = self.engine;
        let key = Breakers::model_key(&model.config_id);
        let run = self.run;
        let observer = self.observer;
        // Only the orchestrator's text is streamed to a live display (not a sub-run's).
        let live = caller.slot == SLOT && !self.sub;
        let (request_hash, request_parts) = request::request_hash(&request);
        // Images go inline to a model that reads them, once the request is hashed: the hash
        // names the request by its content-addressed references, as the journal knows it.
        let request = if model.vision {
            crate::attachments::inline_images(engine.artifacts(), request).await
        } else {
            request
        };
        let mut attempt = 1u32;
        loop {
            if progress.streamed && live {
                // A live display drops what the failed attempt showed.
                observer.reset(&run.run_id);
            }
            progress.streamed = true;
            let started = Instant::now();
            let mut exchanges = Vec::new();
            let call = resilience::stream_once(
                model.client.clone(),
                request.clone(),
                model.timeouts,
                |text| {
                    if live {
                        observer.text_delta(&run.run_id, text)
                    }
                },
                |exchange| exchanges.push(exchange),
            );
            let end = self.wait(state, writer, call, deadline).await?;
            let exchanged = self.exchanged(state, caller, model, attempt, exchanges);
            let error = match end {
                StepEnd::Done(Ok(response)) => {
                    if model.circuit.is_some() {
                        engine.breakers.success(&key);
                    }
                    return Ok(Attempts::Answered(Answer {
                        response,
                        attempts: attempt,
                        latency_ms: started.elapsed().as_secs_f64() * 1000.0,
                        request_hash,
                        request_parts,
                        exchanged,
                    }));
                }
                StepEnd::Done(Err(error)) => {
                    // The exchange of a failed attempt goes before what its failure leads to.
                    self.write_in_step(state, writer, exchanged, progress)
                        .await?;
                    error
                }
                end @ (StepEnd::Cancelled | StepEnd::TimedOut) => {
                    self.write_in_step(state, writer, exchanged, progress)
                        .await?;
                    if model.circuit.is_some() {
                        // A trial cut short says nothing about the model.
                        engine.breakers.release(&key, engine.clock.now());
                    }
                    let timed_out = matches!(end, StepEnd::TimedOut);
                    return Ok(Attempts::Interrupted { timed_out });
                }
            };
            tracing::debug!(run_id = %run.run_id, model = %model.config_id, attempt, kind = %error.kind, error = %error.message, "model call failed");
            let mut opened = false;
            if let Some(settings) = &model.circuit
                && let Some(failures) =
                    engine
                        .breakers
                        .failure(&key, settings, error.kind, engine.clock.now())
            {
                opened = true;
                let event = self.event(
                    caller.span,
                    caller.parent,
                    Some(caller.slot),
                    Payload::CircuitOpened(CircuitOpened {
                        target_kind: "model".into(),
                        target: model.config_id.clone(),
                        failures,
                        cooldown_s: settings.cooldown.as_secs_f64(),
                        error: Some(error.message.clone()),
                        call_id: caller.call_id.map(str::to_owned),
                        judge: caller.judge.map(str::to_owned),
                    }),
                );
                self.write(state, writer, vec![event]).await?;
                progress.emitted += 1;
            }
            match error.kind {
                kind if kind.is_retryable() => {
                    if opened || attempt >= model.retry.attempts() {
                        return Ok(Attempts::Exhausted(error));
                    }
                    let delay = match error.retry_after {
                        Some(after) if after > model.retry.max_delay => {
                            return Ok(Attempts::Exhausted(error));
                        }
                        Some(after) => after,
                        None => model
                            .retry
                            .delay(attempt, resilience::jitter(&engine.ids.uuid())),
                    };
                    let retried = self.event(
                        caller.span,
                        caller.parent,
                        Some(caller.slot),
                        Payload::ModelRetried(ModelRetried {
                            model_id: model.model_id.clone(),
                            model: Some(model.config_id.clone()),
                            provider: model.client.provider().to_owned(),
                            attempt,
                            error_kind: error.kind.as_str().to_owned(),
                            error: error.message.clone(),
                            http_status: error.http_status,
                            delay_s: delay.as_secs_f64(),
                            call_id: caller.call_id.map(str::to_owned),
                            judge: caller.judge.map(str::to_owned),
                            usage: None,
                            cost_usd: 0.0,
                            r#final: false,
                        }),
                    );
                    // Journaled before the wait, which cancellation and the run timeout cut.
                    self.write(state, writer, vec![retried]).await?;
                    progress.emitted += 1;
                    match self
                        .wait(state, writer, tokio::time::sleep(delay), deadline)
                        .await?
                    {
                        StepEnd::Done(()) => {}
                        StepEnd::Cancelled => {
                            return Ok(Attempts::Interrupted { timed_out: false });
                        }
                        StepEnd::TimedOut => return Ok(Attempts::Interrupted { timed_out: true }),
                    }
                    attempt += 1;
                }
                ModelErrorKind::QuotaExhausted | ModelErrorKind::ContextOverflow => {
                    return Ok(Attempts::Exhausted(error));
                }
                _ => return Ok(Attempts::Fatal(error)),
            }
        }
    }

    /// The `model.exchanged` events of one attempt, from the exchanges its stream captured
    /// (none unless `telemetry.capture.raw_exchanges` is on).
    fn exchanged(
        &self,
        _state: &RunState,
        caller: Caller<'_>,
        model: &ModelBinding,
        attempt: u32,
        exchanges: Vec<HttpExchange>,
    ) -> Vec<Event> {
        exchanges
            .into_iter()
            .map(|exchange| {
                let mut exchanged = ModelExchanged::observed(
                    exchange,
                    model.model_id.clone(),
                    Some(model.config_id.clone()),
                    model.client.provider().to_owned(),
                    attempt,
                );
                exchanged.call_id = caller.call_id.map(str::to_owned);
                exchanged.judge = caller.judge.map(str::to_owned);
                self.event(
                    caller.span,
                    caller.parent,
                    Some(caller.slot),
                    Payload::ModelExchanged(exchanged),
                )
            })
            .collect()
    }

    /// Writes events inside the current model step, counting them.
    pub(crate) async fn write_in_step(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
        events: Vec<Event>,
        progress: &mut AttemptState,
    ) -> Result<(), EngineError> {
        if events.is_empty() {
            return Ok(());
        }
        progress.emitted = progress
            .emitted
            .saturating_add(u32::try_from(events.len()).unwrap_or(u32::MAX));
        self.write(state, writer, events).await.map(drop)
    }

    /// Journals the answer of `model` (after the exchange that brought it, when captured) and
    /// the end of its step, in one append.
    #[allow(clippy::too_many_arguments)]
    async fn model_answered(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
        step: &StepSpan,
        model: &ModelBinding,
        answer: Answer,
        finalizing: bool,
        emitted: u32,
    ) -> Result<(), EngineError> {
        let mut answer = answer;
        if finalizing {
            answer.response = without_calls(answer.response);
        }
        distinct_call_ids(&mut answer.response.message, &state.messages);
        let caller = Caller {
            slot: SLOT,
            call_id: None,
            judge: None,
            span: &step.span,
            parent: Some(&state.run_span_id),
        };
        let (responded, exchanged) = self.responded(caller, model, answer);
        let mut batch = exchanged;
        let inside = u32::try_from(batch.len()).unwrap_or(u32::MAX);
        let done = step.completed(self, state, emitted + inside + 1, Outcome::Ok);
        batch.extend([responded, done]);
        self.write(state, writer, batch).await.map(drop)
    }

    async fn model_failed(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
        step: &StepSpan,
        error: ModelError,
        emitted: u32,
    ) -> Result<(), EngineError> {
        let error_type = format!("model.{}", error.kind.as_str());
        let mut batch = vec![step.completed(self, state, emitted, Outcome::Error)];
        batch.extend(self.failure(state, &error_type, &error_type, &error.message));
        self.write(state, writer, batch).await.map(drop)
    }
}

/// The slot of the orchestrating model.
const SLOT: &str = "main";

/// Who a model call is for: the orchestrator, a role call or a judge.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller<'s> {
    /// The slot (`main`, a role name, `judge:<name>`): the envelope role and the key of the
    /// model the run switched to.
    pub(crate) slot: &'s str,
    /// The role call answered.
    pub(crate) call_id: Option<&'s str>,
    /// The judge answering.
    pub(crate) judge: Option<&'s str>,
    /// The span the events go in.
    pub(crate) span: &'s str,
    /// Its parent span.
    pub(crate) parent: Option<&'s str>,
}

/// How a model chain call ended.
pub(crate) enum ChainEnd<'m> {
    /// A model answered.
    Answered {
        /// The model that answered.
        model: &'m ModelBinding,
        /// Its answer.
        answer: Answer,
    },
    /// Cancelled or out of time.
    Interrupted {
        /// Out of time (else cancelled).
        timed_out: bool,
    },
    /// Every model failed.
    Failed(ModelError),
}

/// What the attempts of one model step have done so far.
#[derive(Debug, Default)]
pub(crate) struct AttemptState {
    /// Whether an attempt already streamed (the observer is reset before the next one).
    streamed: bool,
    /// Events written inside the step, besides `step.started` and `step.completed`.
    pub(crate) emitted: u32,
}

/// A model's answer and how it was obtained.
pub(crate) struct Answer {
    pub(crate) response: ModelResponse,
    attempts: u32,
    latency_ms: f64,
    request_hash: String,
    request_parts: serde_json::Map<String, serde_json::Value>,
    /// The `model.exchanged` events of the attempt that answered.
    exchanged: Vec<Event>,
}

/// How the attempts on one model ended.
enum Attempts {
    Answered(Answer),
    Interrupted {
        timed_out: bool,
    },
    /// Retries exhausted, quota, context overflow, or the breaker opened: try the next model.
    Exhausted(ModelError),
    /// A definitive error: the run fails.
    Fatal(ModelError),
}

/// Which model configs produced each provider model name (from `model.responded`), so that
/// reasoning blocks of other models are not sent to a fallback.
#[derive(Debug, Default, Clone)]
pub(crate) struct ModelNames(HashMap<String, BTreeSet<String>>);

impl ModelNames {
    pub(crate) fn note(&mut self, event: &Event) {
        if let Payload::ModelResponded(p) = &event.payload
            && let Some(config) = &p.model
        {
            self.0
                .entry(p.model_id.clone())
                .or_default()
                .insert(config.clone());
        }
    }

    /// Whether a reasoning block produced by the provider model `model_id` belongs to `model`
    /// (a name never seen answering is given the benefit of the doubt).
    fn is_own(&self, model_id: &str, model: &ModelBinding) -> bool {
        model_id == model.model_id
            || self
                .0
                .get(model_id)
                .is_none_or(|configs| configs.contains(&model.config_id))
    }
}

/// The ids of the last decisive events, for `cause_event_id`.
#[derive(Debug, Default)]
pub(crate) struct LastIds {
    pub(crate) model: Option<String>,
    pub(crate) tool: Option<String>,
    /// The last `policy.decided`, cause of the transitions a policy decides.
    pub(crate) policy: Option<String>,
}

impl LastIds {
    pub(crate) fn note(&mut self, event: &Event) {
        match &event.payload {
            Payload::ModelResponded(p) if p.call_id.is_none() && p.judge.is_none() => {
                self.model = Some(event.event_id.clone());
            }
            Payload::ToolCompleted(_) => self.tool = Some(event.event_id.clone()),
            Payload::PolicyDecided(_) => self.policy = Some(event.event_id.clone()),
            _ => {}
        }
    }
}

/// The span and number of a step being executed.
pub(crate) struct StepSpan {
    pub(crate) span: String,
    pub(crate) step_no: u32,
    started: Instant,
}

impl StepSpan {
    pub(crate) fn open(driver: &Driver<'_>, state: &RunState, _effect: Effect) -> StepSpan {
        StepSpan {
            span: driver.engine.ids.uuid(),
            step_no: state.step + 1,
            started: Instant::now(),
        }
    }

    pub(crate) fn started(&self, driver: &Driver<'_>, state: &RunState, effect: Effect) -> Event {
        driver.event(
            &self.span,
            Some(&state.run_span_id),
            None,
            Payload::StepStarted(StepStarted {
                step_no: self.step_no,
                state: state.status,
                effect,
            }),
        )
    }

    pub(crate) fn completed(
        &self,
        driver: &Driver<'_>,
        state: &RunState,
        emitted: u32,
        outcome: Outcome,
    ) -> Event {
        driver.event(
            &self.span,
            Some(&state.run_span_id),
            None,
            Payload::StepCompleted(StepCompleted {
                step_no: self.step_no,
                duration_ms: self.started.elapsed().as_secs_f64() * 1000.0,
                events_emitted: emitted,
                outcome,
            }),
        )
    }
}

/// A finalizing answer keeps its text and drops any tool call.
/// Renames the tool calls of `answer` whose id is already used in the run (`earlier`) or twice
/// in the answer: `<id>_2`, `<id>_3`… A call id then names one call of the run, so a result,
/// an approval or a policy decision can never be taken for another call's.
fn distinct_call_ids(answer: &mut Message, earlier: &[Message]) {
    let mut used: BTreeSet<String> = earlier
        .iter()
        .flat_map(|m| m.tool_calls().map(|(id, _, _)| id.to_owned()))
        .collect();
    for block in &mut answer.blocks {
        if let loom_core::BlockKind::ToolCall { call_id, .. } = &mut block.kind {
            if used.contains(call_id.as_str()) {
                let base = call_id.clone();
                let fresh = (2u32..)
                    .map(|n| format!("{base}_{n}"))
                    .find(|candidate| !used.contains(candidate))
                    .unwrap_or(base);
                tracing::debug!(from = %call_id, to = %fresh, "tool call id already used in the run: renamed");
                *call_id = fresh;
            }
            used.insert(call_id.clone());
        }
    }
}

fn without_calls(mut response: ModelResponse) -> ModelResponse {
    response
        .message
        .blocks
        .retain(|b| !matches!(b.kind, BlockKind::ToolCall { .. }));
    if response.message.blocks.is_empty() {
        response.message.blocks.push(loom_core::Block::text(""));
    }
    if response.stop_reason == StopReason::ToolUse {
        response.stop_reason = StopReason::End;
    }
    response
}

/// Seconds as the user wrote them: `30`, `0.2`.
pub(crate) fn fmt_secs(duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs.fract() == 0.0 {
        format!("{secs:.0}")
    } else {
        format!("{secs}")
    }
}
