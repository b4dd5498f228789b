//! What callers ask of the engine outside the loop: open a run ([`Engine::begin`]), steer it,
//! decide its approvals ([`Engine::settle`]), cancel it while no one drives it
//! ([`Engine::cancel_idle`]).
//!
//! Each is one write made with [`append_fresh`]: the session is read, the write decided from
//! what it holds (refused when the run is not in a state that allows it), and decided again
//! when another writer appended in between.

use std::sync::Arc;

use loom_core::{
    Event, Message, RunState,
    approval::{ApprovalRecord, Decision},
    event::{MessageUser, Payload, RunClaimed, RunContext, RunStarted},
    ids::is_safe_id,
    state::{PendingCall, session_history},
};
use serde_json::{Map, Value};

use crate::{
    agent::AgentRuntime,
    attachments::Attachment,
    engine::Engine,
    error::EngineError,
    events::{RunRef, decision_payload},
    judges::JudgeMode,
    observer::Observer,
    ownership, tree,
    window::Window,
    writer::{Attempt, Reading, append_fresh},
};

/// A request to open a run.
#[derive(Debug, Clone)]
pub struct BeginRun {
    /// Tenant.
    pub tenant_id: String,
    /// Session to continue (its conversation is re-read); `None` = the run is its own session.
    pub session_id: Option<String>,
    /// Chosen run id; `None` = a new UUIDv7.
    pub run_id: Option<String>,
    /// End user.
    pub user_id: Option<String>,
    /// Caller metadata.
    pub metadata: Map<String, Value>,
    /// The user's message.
    pub message: Message,
    /// How the agent's judges run (`run.started.judges`).
    pub judges: JudgeMode,
    /// Limits of this run, journaled in `run.started.budget`; they tighten the agent's run
    /// limits key by key.
    pub budget: Option<loom_core::event::RunBudget>,
    /// Files attached to the request (checked against [`Engine::attachment_limits`], stored in
    /// the artifact store, referenced by `artifact` blocks after the message's own blocks).
    pub attachments: Vec<Attachment>,
    /// The trigger (webhook) that opened the run, journaled in `run.started.trigger`.
    pub trigger: Option<String>,
    /// Session-state values set by the caller, journaled in `run.started.state` once checked
    /// against the agent's keys (declared, schema, limits, required keys; see
    /// [`crate::StateSpec::check_given`]).
    pub state: Map<String, Value>,
}

impl Engine {
    /// Opens a run: writes `run.started`, one `artifact.stored` per attachment, and
    /// `message.user` (the message, then an `artifact` block per attachment) in one batch.
    ///
    /// Nothing is written when the ids are unusable, an attachment is refused (count, size,
    /// type; see [`crate::AttachmentLimits::check`]), the caller's state is refused
    /// ([`EngineError::StateRefused`]), the chosen run id exists in the tenant
    /// (in any session: [`EngineError::RunExists`] names the session that holds it), or the
    /// session's journal cannot be folded. Attachments are stored in the artifact store once
    /// the run is known to be new, just before the batch is appended.
    ///
    /// **What is guaranteed about a chosen run id.** In its own session the check and the
    /// append are one atomic step of the journal (an append after the last seq read, refused
    /// when the session moved), so of two openings of the same id in one session exactly one
    /// is written, from any number of processes. Across sessions the journal's run index ([`EventStore::find_run`]) is asked
    /// first, and the openings of one engine (one `Loom`: a server and all its requests) are
    /// serialized from that question to the append, so one process never opens the same id in
    /// two sessions. Two processes opening the same id in two sessions at the same instant are
    /// not serialized by the journal (each session is written on its own): both can be
    /// written. A generated id (a UUIDv7) is not looked up.
    ///
    /// [`EventStore::find_run`]: loom_core::ports::EventStore::find_run
    pub async fn begin(
        &self,
        agent: &AgentRuntime,
        begin: BeginRun,
        observer: &dyn Observer,
    ) -> Result<RunRef, EngineError> {
        self.check_opening(&begin)?;
        let run_id = begin.run_id.clone().unwrap_or_else(|| self.ids.uuid());
        let session_id = begin.session_id.clone().unwrap_or_else(|| run_id.clone());
        let run = RunRef {
            tenant_id: begin.tenant_id.clone(),
            session_id,
            run_id,
        };
        // A new run is opened in a session whose journal folds, that its agent opened (or a new
        // one), and where its id is unused.
        let is_new = |events: &[Arc<Event>]| -> Result<(), EngineError> {
            if events.iter().any(|e| e.run_id == run.run_id) {
                return Err(EngineError::RunExists {
                    run_id: run.run_id.clone(),
                    session_id: run.session_id.clone(),
                });
            }
            session_history(events)?;
            ownership::check(events, &run.session_id, &agent.name)?;
            agent
                .state
                .check_given(&agent.state.fold_window(events), &begin.state)?;
            Ok(())
        };
        // The values themselves first: a refused state reads no journal.
        for (key, value) in &begin.state {
            agent
                .state
                .check_value(key, value)
                .map_err(EngineError::StateRefused)?;
        }
        // A chosen id names one run of the tenant: held from the index lookup to the append.
        let _opening = match &begin.run_id {
            Some(_) => Some(self.openings.lock().await),
            None => None,
        };
        if begin.run_id.is_some() {
            self.unused_in_tenant(&run).await?;
        }
        let events = self.events(&run, &agent.name, &run.run_id);
        let span = self.ids.uuid();
        let envelope = |payload| events.event(&span, None, None, payload);
        let mut opening = vec![envelope(Payload::RunStarted(RunStarted {
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
            state: begin.state.clone(),
        }))];
        let mut message = begin.message;
        if let Some(store) = &self.artifacts
            && !begin.attachments.is_empty()
        {
            // Stored once the run is known to be new, not before.
            is_new(
                &Window::latest(self.store.as_ref(), &run.tenant_id, &run.session_id)
                    .await?
                    .events,
            )?;
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
            message,
            kind: "request".into(),
            policy: None,
            tools: true,
        })));
        let ((), written) = append_fresh(self.store.as_ref(), &run, Reading::Latest, |events| {
            is_new(events)?;
            Ok(Attempt::Write(opening.clone(), ()))
        })
        .await?;
        for event in &written {
            observer.event(event);
        }
        tracing::debug!(run_id = %run.run_id, session_id = %run.session_id, agent = %agent.name, "run opened");
        Ok(run)
    }

    /// Refuses a chosen run id that a session of the tenant already holds (the run index of
    /// the journal); what the session received since its last snapshot is checked again with
    /// its journal when appending.
    async fn unused_in_tenant(&self, run: &RunRef) -> Result<(), EngineError> {
        match self.store.find_run(&run.tenant_id, &run.run_id).await? {
            Some(session_id) => Err(EngineError::RunExists {
                run_id: run.run_id.clone(),
                session_id,
            }),
            _ => Ok(()),
        }
    }

    /// Refuses a request to open a run that cannot be opened as given: an ill-formed message,
    /// unusable ids, refused attachments or attachments without an artifact store.
    fn check_opening(&self, begin: &BeginRun) -> Result<(), EngineError> {
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
        Ok(())
    }

    /// Hands back this worker's live lease on an open run, read from the journal (a step was
    /// abandoned, so the pilot's own view may lag behind what its last append wrote). Nothing
    /// is written when the run closed or the lease is not this worker's.
    pub(crate) async fn hand_back_after_interrupt(
        &self,
        run: &RunRef,
        agent_name: &str,
    ) -> Result<(), EngineError> {
        append_fresh(self.store.as_ref(), run, Reading::Run(run), |events| {
            let state = RunState::fold(&run.run_id, events)?;
            let now = self.clock.now();
            let ours = state
                .claim
                .as_ref()
                .is_some_and(|c| c.worker_id == self.worker_id && c.lease_until > now);
            if state.finished || !ours {
                return Ok(Attempt::Done(()));
            }
            let claimed = Payload::RunClaimed(RunClaimed {
                worker_id: self.worker_id.clone(),
                lease_until: now,
            });
            let events = self.events(run, agent_name, &state.root_run_id);
            Ok(Attempt::Write(vec![events.decision(&state, claimed)], ()))
        })
        .await
        .map(drop)
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
        append_fresh(self.store.as_ref(), run, Reading::Run(run), |events| {
            let state = RunState::fold(&run.run_id, events)?;
            if state.finished || state.status.is_terminal() {
                return Err(EngineError::Invalid(format!(
                    "run {} has closed ({})",
                    run.run_id, state.status
                )));
            }
            let steer = Payload::MessageUser(MessageUser {
                message: message.clone(),
                kind: loom_core::state::STEER.into(),
                policy: None,
                tools: true,
            });
            let events = self.events(run, agent_name, &state.root_run_id);
            Ok(Attempt::Write(vec![events.decision(&state, steer)], ()))
        })
        .await
        .map(drop)
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
        append_fresh(self.store.as_ref(), run, Reading::Run(run), |events| {
            let state = RunState::fold(&run.run_id, events)?;
            if state.finished || state.status.is_terminal() {
                return Ok(Attempt::Done(false));
            }
            // Open sub-runs are cancelled first, in the same write.
            let own = self.events(run, agent_name, &state.root_run_id);
            let mut batch = tree::closing(&own, events, &run.run_id)?;
            batch.extend(own.cancellation(&state, "requested", by.clone()));
            Ok(Attempt::Write(batch, true))
        })
        .await
        .map(|(closed, _)| closed)
    }

    /// Journals a human decision on the approval requests of a paused run, or of the open
    /// sub-runs of a run waiting for them (a root run answers for its whole tree): the request
    /// of `call_id` (the run's own first, then its descendants' in the order they started), or
    /// every waiting one. Returns the call ids decided.
    ///
    /// Refused (nothing written) when nothing waits or the call has no waiting request
    /// ([`EngineError::UnknownApproval`]), its request expired ([`EngineError::Invalid`]), or
    /// corrected arguments name no single call or
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
        append_fresh(self.store.as_ref(), run, Reading::Run(run), |events| {
            let state = RunState::fold(&run.run_id, events)?;
            // Requests of the open sub-runs surface on their ancestors.
            let descendants = if state.finished || state.status.is_terminal() {
                Vec::new()
            } else {
                tree::open_descendants(events, &run.run_id)?
            };
            let targets = self.settled(run, &state, &descendants, call_id)?;
            if let (Some(arguments), Some((owner, record))) = (corrected, targets.first()) {
                // The tool belongs to the agent of the run that asked.
                let owner_agent = if owner.run_id == run.run_id {
                    Some(agent)
                } else {
                    agent.find(owner.agent.as_deref().unwrap_or_default())
                };
                check_corrected(owner_agent, record, arguments)?;
            }
            let batch: Vec<Event> = targets
                .iter()
                .map(|(owner, record)| {
                    let call = PendingCall {
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
                    let owner_agent = owner.agent.as_deref().unwrap_or(&agent.name);
                    self.events(&owner_run, owner_agent, &owner.root_run_id)
                        .event(
                            &record.span_id,
                            record.parent_span_id.as_deref(),
                            None,
                            decision_payload(&call, decision),
                        )
                })
                .collect();
            let decided: Vec<String> = targets.iter().map(|(_, a)| a.call_id.clone()).collect();
            Ok(Attempt::Write(batch, decided))
        })
        .await
        .map(|(decided, _)| decided)
    }

    /// The waiting requests a decision on `call_id` (or on every waiting one) settles, with the
    /// run that asked each: the run's own first, then its open descendants' in the order they
    /// started. [`EngineError::UnknownApproval`] when nothing waits or the call has no waiting
    /// request; refused when a request expired.
    fn settled<'s>(
        &self,
        run: &RunRef,
        state: &'s RunState,
        descendants: &'s [RunState],
        call_id: Option<&str>,
    ) -> Result<Vec<(&'s RunState, &'s ApprovalRecord)>, EngineError> {
        let waiting: Vec<(&RunState, &ApprovalRecord)> = std::iter::once(state)
            .chain(descendants.iter().rev())
            .flat_map(|owner| {
                owner
                    .waiting_approvals()
                    .into_iter()
                    .map(move |record| (owner, record))
            })
            .collect();
        if waiting.is_empty() {
            return Err(EngineError::UnknownApproval(format!(
                "run {}: nothing is waiting for a decision",
                run.run_id
            )));
        }
        let targets: Vec<(&RunState, &ApprovalRecord)> = match call_id {
            Some(call_id) => match waiting.iter().find(|(_, a)| a.call_id == call_id) {
                Some(target) => vec![*target],
                None => {
                    let ids: Vec<&str> = waiting.iter().map(|(_, a)| a.call_id.as_str()).collect();
                    return Err(EngineError::UnknownApproval(format!(
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
        Ok(targets)
    }
}

/// Refuses corrected arguments that are not an object, or that break the schema of the tool
/// of `agent` (the agent of the run that asked) when it checks arguments.
fn check_corrected(
    agent: Option<&AgentRuntime>,
    record: &ApprovalRecord,
    arguments: &Value,
) -> Result<(), EngineError> {
    if !arguments.is_object() {
        return Err(EngineError::Unusable(format!(
            "corrected arguments for call '{}' must be a JSON object",
            record.call_id
        )));
    }
    if let Some(agent) = agent
        && let Some(tool) = agent.tools.iter().find(|t| t.name() == record.tool_name)
        && agent.validate_arguments
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
    Ok(())
}
