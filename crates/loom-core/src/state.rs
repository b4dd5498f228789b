//! The run-state projection: a pure fold over a run's events.
//!
//! [`RunState`] is never stored. It is recomputed from the journal by [`RunState::fold`], one
//! [`RunState::apply`] per event, and the engine decides the next effect from it alone. A
//! journal that breaks the state machine (an event after the run closed, a transition from the
//! wrong state) is refused with a [`ProjectionError`] naming the event.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    approval::{ApprovalRecord, ApprovalStatus, PendingApproval},
    content::{Block, BlockKind, Message, Role},
    event::{Event, Payload},
    tool::ToolOutput,
    usage::Usage,
};

/// `message.user.kind` of a message sent to a running run (`Loom::steer`): it joins the
/// conversation before the run's next model call.
pub const STEER: &str = "steer";

/// The states of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// The next effect is a model call.
    ReadyForModel,
    /// The model asked for tools; the next effect is the tool batch.
    AwaitingTools,
    /// A child run must finish first.
    WaitingChild,
    /// A human must decide.
    Paused,
    /// The iteration cap is reached: one last answer, without tools.
    Finalizing,
    /// Done.
    Completed,
    /// Failed.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl RunStatus {
    /// The journal string.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::ReadyForModel => "ready_for_model",
            RunStatus::AwaitingTools => "awaiting_tools",
            RunStatus::WaitingChild => "waiting_child",
            RunStatus::Paused => "paused",
            RunStatus::Finalizing => "finalizing",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// Completed, failed or cancelled.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tool call the model asked for and that has no result yet.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingCall {
    /// Call id.
    pub call_id: String,
    /// Tool name.
    pub name: String,
    /// Arguments as written by the model.
    pub arguments: Value,
    /// Whether `tool.called` was written (the effect may have happened).
    pub started: bool,
    /// Arguments a `before_tool` policy put in place of the model's (the tool runs with
    /// them; the journal's `tool.called` keeps the model's).
    pub replaced_arguments: Option<Value>,
    /// The child run of a sub-agent call, once opened.
    pub child_run_id: Option<String>,
}

impl PendingCall {
    /// The arguments the tool runs with: the policy's replacement, else the model's.
    pub fn effective_arguments(&self) -> &Value {
        self.replaced_arguments.as_ref().unwrap_or(&self.arguments)
    }
}

/// A repair a policy asked for (`policy.decided` retry), written as a `message.user` of kind
/// `repair` before the next model call.
#[derive(Debug, Clone, PartialEq)]
pub struct Repair {
    /// The policy that refused the output.
    pub policy: String,
    /// Its diagnostic.
    pub feedback: String,
    /// Whether the repair may call tools.
    pub tools: bool,
}

/// A call that ran with other arguments than the model wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Amendment {
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool_name: String,
    /// Who corrected them (the approver, or `policy <name>`).
    pub by: String,
    /// The arguments it ran with.
    pub arguments: Value,
}

impl Amendment {
    /// The note the model reads after the call's result.
    pub fn note(&self) -> String {
        format!(
            "{}: the call {} to {} ran with arguments corrected by {}: {}. The call above \
             shows them; the journal keeps the original ones.]",
            crate::model::SYSTEM_NOTE_PREFIX,
            self.call_id,
            self.tool_name,
            self.by,
            self.arguments
        )
    }
}

/// `message.user.kind` of a repair request.
pub const REPAIR: &str = "repair";

/// The lease a worker holds on the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// Worker.
    pub worker_id: String,
    /// End of the lease.
    pub lease_until: DateTime<Utc>,
}

/// A journal that breaks the state machine.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("run {run_id}, event {event_id} (seq {seq}, {event_type}): {reason}")]
pub struct ProjectionError {
    /// Run.
    pub run_id: String,
    /// Offending event.
    pub event_id: String,
    /// Its seq.
    pub seq: u64,
    /// Its type.
    pub event_type: String,
    /// What is wrong.
    pub reason: String,
}

/// Everything known about a run, recomputed from its events.
#[derive(Debug, Clone, PartialEq)]
pub struct RunState {
    /// Run.
    pub run_id: String,
    /// Session.
    pub session_id: String,
    /// Tenant.
    pub tenant_id: String,
    /// Root run.
    pub root_run_id: String,
    /// Span of `run.started`.
    pub run_span_id: String,
    /// Parent run.
    pub parent_run_id: Option<String>,
    /// Depth.
    pub depth: u32,
    /// Agent.
    pub agent: Option<String>,
    /// "normal" or "compaction".
    pub kind: String,
    /// Current state.
    pub status: RunStatus,
    /// Last step number.
    pub step: u32,
    /// Sum of step durations.
    pub active_ms: f64,
    /// Orchestrator model calls.
    pub iterations: u32,
    /// The run's messages, in journal order.
    pub messages: Vec<Message>,
    /// Tool calls of the last answer still without result, in call order.
    pub pending_calls: Vec<PendingCall>,
    /// Usage.
    pub usage: Usage,
    /// Cost.
    pub cost_usd: f64,
    /// Model calls of every slot.
    pub model_calls: u32,
    /// Final answer.
    pub output: Option<Message>,
    /// Structured final answer.
    pub output_data: Option<Value>,
    /// Failure classification.
    pub error_type: Option<String>,
    /// Failure message.
    pub error: Option<String>,
    /// The current lease.
    pub claim: Option<Claim>,
    /// Whether the closing event was written.
    pub finished: bool,
    /// The model each slot switched to (`model.fell_back`): a run that fell back stays there.
    pub models: std::collections::BTreeMap<String, String>,
    /// URIs of the results moved out of the context in this run (`artifact.stored`, origin
    /// `offload`), which `artifact_read` may page through.
    pub offloaded: Vec<String>,
    /// Every approval request of the run, in journal order, with what became of it.
    pub approvals: Vec<ApprovalRecord>,
    /// Steering messages waiting for the open tool calls to complete.
    pub steering: Vec<Message>,
    /// A repair asked for and not yet written.
    pub pending_repair: Option<Repair>,
    /// Repairs asked per policy (`<policy>` for the output, `<policy>#<call_id>` for a call).
    pub retries: std::collections::BTreeMap<String, u32>,
    /// Whether the last repair forbade tools (the next call is made with `tool_choice: none`).
    pub repair_without_tools: bool,
    /// The final answer an `on_output` policy put in place of the model's.
    pub replaced_output: Option<Message>,
    /// The final output failed its contract or judge and was kept anyway.
    pub unverified: bool,
    /// The final output was replaced by a fallback message.
    pub fallback: bool,
    /// Budget limits already signalled (`<scope>.<limit>`).
    pub exceeded: std::collections::BTreeSet<String>,
    /// How judges run for this run: `auto`, `force` or `skip`.
    pub judges: String,
    /// The run's budget as opened (a sub-agent's share included).
    pub budget: Option<crate::event::RunBudget>,
    /// The parent's call that opened this run (sub-agents).
    pub parent_call_id: Option<String>,
    /// Names of the tools the model called in the run, in the order their results came: run,
    /// refused before launch or denied by a policy, each call the model made and got an answer
    /// to counts (as in the reference, where `loom.require_tool` forces one call, not one
    /// successful call).
    pub tools_called: Vec<String>,
    /// Calls whose arguments were corrected (at approval, or by a `before_tool` policy): the
    /// model is told, after their results, with a system note.
    pub amendments: Vec<Amendment>,
    /// Calls answered by model calls journaled in this run (`model.responded` with a
    /// `call_id`: roles). Their consumption is counted once, from those `model.responded`; the
    /// `usage`/`cost_usd` their `tool.completed` repeats is not added again.
    pub priced_calls: std::collections::BTreeSet<String>,
    /// Seq of the last event applied.
    pub last_seq: u64,
    /// When the run started.
    pub started_at: DateTime<Utc>,
    /// When the last event was written.
    pub updated_at: DateTime<Utc>,
}

impl RunState {
    /// Folds a run's events (other runs' events are skipped).
    pub fn fold<'a>(
        run_id: &str,
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Result<RunState, FoldError> {
        let mut state: Option<RunState> = None;
        for event in events {
            if event.run_id != run_id {
                continue;
            }
            match &mut state {
                None => state = Some(RunState::start(event)?),
                Some(state) => state.apply(event)?,
            }
        }
        state.ok_or(FoldError::Unknown(run_id.to_owned()))
    }

    /// A fresh state from the run's first event, which must be `run.started`.
    pub fn start(event: &Event) -> Result<RunState, ProjectionError> {
        let Payload::RunStarted(started) = &event.payload else {
            return Err(error(event, "the first event of a run must be run.started"));
        };
        Ok(RunState {
            run_id: event.run_id.clone(),
            session_id: event.session_id.clone(),
            tenant_id: event.tenant_id.clone(),
            root_run_id: event.root_run_id.clone(),
            run_span_id: event.span_id.clone(),
            parent_run_id: started.parent_run_id.clone(),
            depth: started.depth,
            agent: event.agent.clone(),
            kind: started.kind.clone(),
            status: RunStatus::ReadyForModel,
            step: 0,
            active_ms: 0.0,
            iterations: 0,
            messages: Vec::new(),
            pending_calls: Vec::new(),
            usage: Usage::default(),
            cost_usd: 0.0,
            model_calls: 0,
            output: None,
            output_data: None,
            error_type: None,
            error: None,
            claim: None,
            finished: false,
            offloaded: Vec::new(),
            approvals: Vec::new(),
            steering: Vec::new(),
            models: std::collections::BTreeMap::new(),
            pending_repair: None,
            retries: std::collections::BTreeMap::new(),
            repair_without_tools: false,
            replaced_output: None,
            unverified: false,
            fallback: false,
            exceeded: std::collections::BTreeSet::new(),
            judges: started.judges.clone(),
            budget: started.budget.clone(),
            parent_call_id: started.parent_call_id.clone(),
            tools_called: Vec::new(),
            amendments: Vec::new(),
            priced_calls: std::collections::BTreeSet::new(),
            last_seq: event.seq,
            started_at: event.ts,
            updated_at: event.ts,
        })
    }

    /// Applies one event of this run.
    pub fn apply(&mut self, event: &Event) -> Result<(), ProjectionError> {
        // A line set aside and replaced (`session.repaired`) says nothing about the run.
        if matches!(event.payload, Payload::SessionRepaired(_)) {
            return Ok(());
        }
        self.apply_payload(event)?;
        self.last_seq = event.seq;
        self.updated_at = event.ts;
        Ok(())
    }

    fn apply_payload(&mut self, event: &Event) -> Result<(), ProjectionError> {
        if event.run_id != self.run_id {
            return Err(error(event, "event of another run"));
        }
        if let Payload::RunClaimed(claim) = &event.payload {
            self.claim = Some(Claim {
                worker_id: claim.worker_id.clone(),
                lease_until: claim.lease_until,
            });
            return Ok(());
        }
        // A decision that arrives after the run closed (cancelled meanwhile) changes nothing.
        if (self.finished || self.status.is_terminal())
            && matches!(
                &event.payload,
                Payload::ApprovalGranted(_) | Payload::ApprovalRejected(_)
            )
        {
            return Ok(());
        }
        self.check_order(event)?;
        match &event.payload {
            Payload::RunStarted(_) => return Err(error(event, "duplicate run.started")),
            Payload::StepStarted(step) => self.step = step.step_no,
            Payload::StepCompleted(step) => self.active_ms += step.duration_ms,
            Payload::MessageUser(user) => self.apply_user(user),
            Payload::ModelResponded(response) => self.apply_response(response),
            Payload::ModelRetried(retried) => {
                if let Some(usage) = &retried.usage {
                    self.usage.add(usage);
                }
                self.cost_usd += retried.cost_usd;
            }
            Payload::ModelFellBack(fell_back) => {
                self.models
                    .insert(fell_back.slot.clone(), fell_back.to_model.clone());
            }
            Payload::ToolCalled(called) => self.apply_called(event, called)?,
            Payload::ToolCompleted(completed) => self.apply_completed(event, completed)?,
            Payload::RunTransitioned(transition) => {
                if transition.from_state != self.status {
                    return Err(error(
                        event,
                        &format!(
                            "transition from {} while the run is {}",
                            transition.from_state, self.status
                        ),
                    ));
                }
                self.status = transition.to_state;
            }
            Payload::RunCompleted(completed) => self.apply_completion(completed),
            Payload::RunFailed(failed) => {
                self.error_type = Some(failed.error_type.clone());
                self.error = Some(failed.error.clone());
                self.finished = true;
            }
            Payload::RunCancelled(_) => self.finished = true,
            Payload::PolicyDecided(decided) => self.apply_decision(event, decided)?,
            Payload::GuardChecked(checked) => {
                if checked.target == "output" && checked.outcome == "failed" {
                    match checked.resolution.as_deref() {
                        Some("unverified") => self.unverified = true,
                        Some("fallback") => self.fallback = true,
                        _ => {}
                    }
                }
            }
            Payload::BudgetExceeded(exceeded) => {
                self.exceeded
                    .insert(format!("{}.{}", exceeded.scope, exceeded.limit));
            }
            Payload::ArtifactStored(stored) => {
                if stored.origin == "offload" {
                    self.offloaded.push(stored.uri.clone());
                }
            }
            Payload::ApprovalRequested(requested) => self.apply_request(event, requested)?,
            Payload::ApprovalGranted(_)
            | Payload::ApprovalRejected(_)
            | Payload::ApprovalExpired(_) => self.apply_approval_decision(event)?,
            Payload::Sealed(_) => {
                return Err(error(
                    event,
                    "sealed payload that was not opened (a journal sealed with storage.encryption \
                     is read through the sealing journal of the `crypto` feature)",
                ));
            }
            Payload::RunClaimed(_)
            | Payload::JudgeEvaluated(_)
            | Payload::ToolSourceUnavailable(_)
            | Payload::CircuitOpened(_)
            | Payload::ModelExchanged(_)
            | Payload::IdempotencyRecorded(_)
            | Payload::IdempotencyReused(_)
            | Payload::SessionRepaired(_) => {}
        }
        Ok(())
    }

    /// Refuses an event the state machine does not allow now: anything after the closing
    /// event, a closing event before a terminal transition, anything but the closing event
    /// after a terminal transition.
    fn check_order(&self, event: &Event) -> Result<(), ProjectionError> {
        if self.finished {
            return Err(error(
                event,
                &format!("event after the run closed in state {}", self.status),
            ));
        }
        if event.payload.is_closing() && !self.status.is_terminal() {
            return Err(error(
                event,
                &format!(
                    "closing event while the run is {} (a terminal transition must come first)",
                    self.status
                ),
            ));
        }
        if self.status.is_terminal() && !closes(self.status, &event.payload) {
            return Err(error(
                event,
                &format!("event after the state {}", self.status),
            ));
        }
        Ok(())
    }

    /// `message.user`: a turn of the conversation. A steering message that arrives while
    /// tool calls are open waits for their results, so a call and its result are never split
    /// by a user turn; a repair starts the answer's checks afresh.
    fn apply_user(&mut self, user: &crate::event::MessageUser) {
        if user.kind == STEER && !self.pending_calls.is_empty() {
            self.steering.push(user.message.clone());
            return;
        }
        if user.kind == REPAIR {
            self.pending_repair = None;
            self.repair_without_tools = !user.tools;
            self.replaced_output = None;
            // The repaired answer is checked afresh.
            self.unverified = false;
            self.fallback = false;
        }
        self.messages.push(user.message.clone());
    }

    /// `model.responded`: every answer is counted in the run's consumption; the orchestrator's
    /// (not a role's nor a judge's) is an iteration, joins the conversation and opens its calls.
    fn apply_response(&mut self, response: &crate::event::ModelResponded) {
        self.usage.add(&response.usage);
        self.cost_usd += response.cost_usd;
        self.model_calls += 1;
        if let Some(call_id) = &response.call_id {
            self.priced_calls.insert(call_id.clone());
        }
        if response.call_id.is_some() || response.judge.is_some() {
            return;
        }
        self.iterations += 1;
        self.repair_without_tools = false;
        self.pending_calls = response
            .message
            .tool_calls()
            .map(|(call_id, name, arguments)| PendingCall {
                call_id: call_id.to_owned(),
                name: name.to_owned(),
                arguments: arguments.clone(),
                started: false,
                replaced_arguments: None,
                child_run_id: None,
            })
            .collect();
        self.messages.push(response.message.clone());
    }

    /// `tool.called`: the call started (with its child run, for a sub-agent), which uses up
    /// the grant it ran under.
    fn apply_called(
        &mut self,
        event: &Event,
        called: &crate::event::ToolCalled,
    ) -> Result<(), ProjectionError> {
        let Some(call) = self
            .pending_calls
            .iter_mut()
            .find(|c| c.call_id == called.call_id)
        else {
            return Err(error(
                event,
                &format!("tool.called for unknown call '{}'", called.call_id),
            ));
        };
        call.started = true;
        if called.child_run_id.is_some() {
            call.child_run_id = called.child_run_id.clone();
        }
        if let Some(approval) = self
            .approvals
            .iter_mut()
            .rev()
            .find(|a| a.call_id == called.call_id)
            && approval.status == ApprovalStatus::Granted
        {
            approval.launched = true;
        }
        Ok(())
    }

    /// `tool.completed`: the call's result joins the conversation (then the steering messages
    /// that waited, once no call is open), with what it consumed unless its model calls were
    /// counted already.
    fn apply_completed(
        &mut self,
        event: &Event,
        completed: &crate::event::ToolCompleted,
    ) -> Result<(), ProjectionError> {
        let Some(index) = self
            .pending_calls
            .iter()
            .position(|c| c.call_id == completed.call_id)
        else {
            return Err(error(
                event,
                &format!("tool.completed for unknown call '{}'", completed.call_id),
            ));
        };
        let answered = self.pending_calls.remove(index);
        self.tools_called.push(answered.name);
        // A call whose model calls are journaled in this run (a role) was already
        // counted by its `model.responded`: its `tool.completed` only restates it.
        if !self.priced_calls.contains(&completed.call_id) {
            if let Some(usage) = &completed.usage {
                self.usage.add(usage);
            }
            self.cost_usd += completed.cost_usd;
        }
        self.messages
            .push(tool_message(&completed.call_id, completed.output.clone()));
        if self.pending_calls.is_empty() {
            self.messages.append(&mut self.steering);
        }
        Ok(())
    }

    /// `run.completed`: the final output. A terminal role's result is the answer (`output`
    /// null, `output_event_id` on its `tool.completed`, the last result of the run).
    fn apply_completion(&mut self, completed: &crate::event::RunCompleted) {
        self.output = completed.output.clone();
        self.output_data = completed.data.clone();
        if self.output.is_none()
            && completed.output_event_id.is_some()
            && let Some(result) = last_result(&self.messages)
        {
            self.output = Some(Message::assistant(result.visible_text()));
            if self.output_data.is_none() {
                self.output_data = result.data.clone();
            }
        }
        self.finished = true;
    }

    /// `approval.requested`: a request for an open call, unless one already waits.
    fn apply_request(
        &mut self,
        event: &Event,
        requested: &crate::event::ApprovalRequested,
    ) -> Result<(), ProjectionError> {
        if !self
            .pending_calls
            .iter()
            .any(|c| c.call_id == requested.call_id)
        {
            return Err(error(
                event,
                &format!(
                    "approval.requested for unknown call '{}'",
                    requested.call_id
                ),
            ));
        }
        if self
            .approval(&requested.call_id)
            .is_some_and(ApprovalRecord::is_pending)
        {
            return Err(error(
                event,
                &format!(
                    "a request for call '{}' is already waiting",
                    requested.call_id
                ),
            ));
        }
        self.approvals.push(ApprovalRecord {
            call_id: requested.call_id.clone(),
            tool_name: requested.tool_name.clone(),
            arguments: requested.arguments.clone(),
            reason: requested.reason.clone(),
            policy: requested.policy.clone(),
            scope: requested.scope.clone(),
            expire_at: requested.expire_at,
            status: ApprovalStatus::Pending,
            by: None,
            decision_reason: None,
            granted_arguments: None,
            launched: false,
            span_id: event.span_id.clone(),
            parent_span_id: event.parent_span_id.clone(),
        });
        Ok(())
    }

    /// `approval.granted`, `approval.rejected`, `approval.expired`: settles the waiting
    /// request. Arguments corrected at the grant are what the call runs with, and what the
    /// conversation shows (the journal's `tool.called` keeps what the model wrote).
    fn apply_approval_decision(&mut self, event: &Event) -> Result<(), ProjectionError> {
        match &event.payload {
            Payload::ApprovalGranted(granted) => {
                let record = self.settle(event, &granted.call_id, ApprovalStatus::Granted)?;
                record.by = Some(granted.by.clone());
                record.decision_reason = granted.reason.clone();
                record.granted_arguments = granted.arguments.clone();
                if let Some(arguments) = &granted.arguments {
                    rewrite_call(&mut self.messages, &granted.call_id, arguments);
                    self.amendments.push(Amendment {
                        call_id: granted.call_id.clone(),
                        tool_name: granted.tool_name.clone(),
                        by: granted.by.clone(),
                        arguments: arguments.clone(),
                    });
                }
            }
            Payload::ApprovalRejected(rejected) => {
                let record = self.settle(event, &rejected.call_id, ApprovalStatus::Rejected)?;
                record.by = Some(rejected.by.clone());
                record.decision_reason = rejected.reason.clone();
            }
            Payload::ApprovalExpired(expired) => {
                self.settle(
                    event,
                    &expired.call_id,
                    ApprovalStatus::Expired {
                        action: expired.action.clone(),
                    },
                )?;
            }
            _ => {}
        }
        Ok(())
    }

    /// `policy.decided`: a retry asks for a repair (counted per policy, or per policy and
    /// call); a `before_tool` replacement changes what the call runs with and how the
    /// conversation shows it; an `on_output` replacement changes the final answer.
    fn apply_decision(
        &mut self,
        event: &Event,
        decided: &crate::event::PolicyDecided,
    ) -> Result<(), ProjectionError> {
        match (decided.decision.as_str(), decided.point.as_str()) {
            ("retry", _) => {
                let key = match &decided.call_id {
                    Some(call_id) => format!("{}#{call_id}", decided.policy),
                    None => decided.policy.clone(),
                };
                *self.retries.entry(key).or_insert(0) += 1;
                if decided.call_id.is_none() {
                    self.pending_repair = Some(Repair {
                        policy: decided.policy.clone(),
                        feedback: decided.reason.clone().unwrap_or_default(),
                        tools: decided.tools.unwrap_or(true),
                    });
                }
            }
            ("replace", "before_tool") => {
                let (Some(call_id), Some(arguments)) = (&decided.call_id, &decided.arguments)
                else {
                    return Err(error(
                        event,
                        "a before_tool replacement names no call or no arguments",
                    ));
                };
                let Some(call) = self
                    .pending_calls
                    .iter_mut()
                    .find(|c| &c.call_id == call_id)
                else {
                    return Err(error(
                        event,
                        &format!("policy.decided for unknown call '{call_id}'"),
                    ));
                };
                call.replaced_arguments = Some(arguments.clone());
                let tool_name = call.name.clone();
                rewrite_call(&mut self.messages, call_id, arguments);
                self.amendments.push(Amendment {
                    call_id: call_id.clone(),
                    tool_name,
                    by: format!("policy {}", decided.policy),
                    arguments: arguments.clone(),
                });
            }
            ("replace", "on_output") => {
                if let Some(output) = &decided.output {
                    let message: Message = serde_json::from_value(output.clone()).map_err(|e| {
                        error(
                            event,
                            &format!("the replacement output is not a message: {e}"),
                        )
                    })?;
                    self.replaced_output = Some(message);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Settles the last request of `call_id`, which must be waiting.
    fn settle(
        &mut self,
        event: &Event,
        call_id: &str,
        status: ApprovalStatus,
    ) -> Result<&mut ApprovalRecord, ProjectionError> {
        let record = self
            .approvals
            .iter_mut()
            .rev()
            .find(|a| a.call_id == call_id);
        match record {
            Some(record) if record.is_pending() => {
                record.status = status;
                Ok(record)
            }
            Some(_) => Err(error(
                event,
                &format!("the request for call '{call_id}' was already decided"),
            )),
            None => Err(error(
                event,
                &format!("decision without a request for call '{call_id}'"),
            )),
        }
    }

    /// The last approval request of a call.
    pub fn approval(&self, call_id: &str) -> Option<&ApprovalRecord> {
        self.approvals.iter().rev().find(|a| a.call_id == call_id)
    }

    /// The requests waiting for a decision, in request order (none once the run closed: a
    /// cancel withdraws them).
    pub fn waiting_approvals(&self) -> Vec<&ApprovalRecord> {
        if self.status.is_terminal() {
            return Vec::new();
        }
        self.approvals.iter().filter(|a| a.is_pending()).collect()
    }

    /// The requests waiting for a decision, as callers see them.
    pub fn pending_approvals(&self) -> Vec<PendingApproval> {
        self.waiting_approvals()
            .into_iter()
            .map(|a| PendingApproval {
                call_id: a.call_id.clone(),
                tool_name: a.tool_name.clone(),
                arguments: a.arguments.clone(),
                reason: a.reason.clone(),
                policy: a.policy.clone(),
                scope: a.scope.clone(),
                expire_at: a.expire_at,
                run_id: self.run_id.clone(),
                session_id: self.session_id.clone(),
                tenant_id: self.tenant_id.clone(),
            })
            .collect()
    }

    /// The conversation to send to the model: the run's messages, with each turn's tool results
    /// grouped in one `tool` message and sorted into the order the model wrote the calls.
    ///
    /// After the results of calls whose arguments were corrected, a system note says so.
    pub fn conversation(&self) -> Vec<Message> {
        let ordered = order_results(&self.messages);
        if self.amendments.is_empty() {
            return ordered;
        }
        let mut out = Vec::with_capacity(ordered.len() + self.amendments.len());
        for message in ordered {
            let notes: Vec<String> = if message.role == Role::Tool {
                message
                    .blocks
                    .iter()
                    .filter_map(|b| match &b.kind {
                        BlockKind::ToolResult { call_id, .. } => self
                            .amendments
                            .iter()
                            .rev()
                            .find(|a| &a.call_id == call_id)
                            .map(Amendment::note),
                        _ => None,
                    })
                    .collect()
            } else {
                Vec::new()
            };
            out.push(message);
            if !notes.is_empty() {
                out.push(Message::user(notes.join("\n")));
            }
        }
        out
    }

    /// The final text, if any.
    pub fn output_text(&self) -> Option<String> {
        self.output.as_ref().map(Message::text)
    }
}

fn closes(status: RunStatus, payload: &Payload) -> bool {
    matches!(
        (status, payload),
        (RunStatus::Completed, Payload::RunCompleted(_))
            | (RunStatus::Failed, Payload::RunFailed(_))
            | (RunStatus::Cancelled, Payload::RunCancelled(_))
    )
}

fn error(event: &Event, reason: &str) -> ProjectionError {
    ProjectionError {
        run_id: event.run_id.clone(),
        event_id: event.event_id.clone(),
        seq: event.seq,
        event_type: event.event_type.clone(),
        reason: reason.to_owned(),
    }
}

/// Rewrites the arguments of the tool call `call_id` in the last assistant message that has it.
fn rewrite_call(messages: &mut [Message], call_id: &str, new: &Value) {
    for message in messages.iter_mut().rev() {
        for block in &mut message.blocks {
            if let BlockKind::ToolCall {
                call_id: id,
                arguments,
                ..
            } = &mut block.kind
                && id == call_id
            {
                *arguments = new.clone();
                return;
            }
        }
    }
}

/// The last tool result of `messages`.
fn last_result(messages: &[Message]) -> Option<&ToolOutput> {
    messages.iter().rev().find_map(|m| {
        m.blocks.iter().rev().find_map(|b| match &b.kind {
            BlockKind::ToolResult { output, .. } => Some(output),
            _ => None,
        })
    })
}

fn tool_message(call_id: &str, output: ToolOutput) -> Message {
    Message {
        role: Role::Tool,
        blocks: vec![Block::new(BlockKind::ToolResult {
            call_id: call_id.to_owned(),
            output,
        })],
    }
}

/// Groups consecutive tool messages into one and sorts their results into call order.
fn order_results(messages: &[Message]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len());
    let mut call_order: Vec<String> = Vec::new();
    for message in messages {
        match message.role {
            Role::Tool => {
                if let Some(last) = out.last_mut().filter(|m| m.role == Role::Tool) {
                    last.blocks.extend(message.blocks.iter().cloned());
                } else {
                    out.push(message.clone());
                }
                if let Some(last) = out.last_mut() {
                    let rank = |b: &Block| match &b.kind {
                        BlockKind::ToolResult { call_id, .. } => call_order
                            .iter()
                            .position(|c| c == call_id)
                            .unwrap_or(usize::MAX),
                        _ => usize::MAX,
                    };
                    last.blocks.sort_by_key(rank);
                }
            }
            Role::Assistant => {
                call_order = message
                    .tool_calls()
                    .map(|(id, _, _)| id.to_owned())
                    .collect();
                out.push(message.clone());
            }
            Role::User => out.push(message.clone()),
        }
    }
    out
}

/// Why a run could not be folded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FoldError {
    /// No event of that run.
    #[error("run {0} not found")]
    Unknown(String),
    /// The journal breaks the state machine.
    #[error(transparent)]
    Projection(#[from] ProjectionError),
}

/// The conversation of a session's earlier root runs, for a new run of the same session.
///
/// Tool calls and results stay in pairs: a call without result (a run that failed mid-batch)
/// and a result without call are dropped, so the history is always acceptable to a provider.
pub fn session_history(events: &[Event]) -> Result<Vec<Message>, FoldError> {
    let mut run_ids: Vec<&str> = Vec::new();
    for event in events {
        if matches!(&event.payload, Payload::RunStarted(p) if p.parent_run_id.is_none() && p.kind == "normal")
            && !run_ids.contains(&event.run_id.as_str())
        {
            run_ids.push(&event.run_id);
        }
    }
    let mut messages = Vec::new();
    for run_id in run_ids {
        let state = RunState::fold(run_id, events)?;
        // Paired per run: call ids are only unique within a run.
        messages.extend(pair_calls(state.conversation()));
    }
    Ok(messages)
}

fn pair_calls(messages: Vec<Message>) -> Vec<Message> {
    let mut calls = std::collections::HashSet::new();
    let mut results = std::collections::HashSet::new();
    for message in &messages {
        for block in &message.blocks {
            match &block.kind {
                BlockKind::ToolCall { call_id, .. } => {
                    calls.insert(call_id.clone());
                }
                BlockKind::ToolResult { call_id, .. } => {
                    results.insert(call_id.clone());
                }
                _ => {}
            }
        }
    }
    messages
        .into_iter()
        .filter_map(|mut message| {
            message.blocks.retain(|b| match &b.kind {
                BlockKind::ToolCall { call_id, .. } => results.contains(call_id),
                BlockKind::ToolResult { call_id, .. } => calls.contains(call_id),
                _ => true,
            });
            (!message.blocks.is_empty()).then_some(message)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use chrono::{TimeDelta, TimeZone};
    use serde_json::{Map, json};

    use super::*;
    use crate::{
        event::{
            Effect, Envelope, MessageUser, ModelResponded, Outcome, RunCancelled, RunClaimed,
            RunCompleted, RunContext, RunFailed, RunStarted, RunTransitioned, StepCompleted,
            StepStarted, ToolCalled, ToolCompleted,
        },
        model::StopReason,
        tool::ToolKind,
    };

    const SESSION: &str = "sess-1";
    const RUN: &str = "run-1";

    const PLAIN_RUN: &str = "reference/journals/plain-run.jsonl";
    const TERMINAL_ROLE: &str = "reference/journals/policies-terminal-role.jsonl";
    const SESSION_TWO_RUNS: &str = "reference/journals/session-two-runs.jsonl";

    // ---------------------------------------------------------------------------------------
    // Builder: one session journal, events appended for the current run with increasing seq.
    // ---------------------------------------------------------------------------------------

    fn ts(seq: u64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap()
            + TimeDelta::seconds(i64::try_from(seq).unwrap())
    }

    struct Journal {
        run_id: String,
        step: u32,
        events: Vec<Event>,
    }

    impl Journal {
        fn new() -> Journal {
            Journal {
                run_id: RUN.to_owned(),
                step: 0,
                events: Vec::new(),
            }
        }

        /// The following events belong to `run_id` (same session, seq keeps increasing).
        fn switch_to(&mut self, run_id: &str) {
            self.run_id = run_id.to_owned();
            self.step = 0;
        }

        fn push(&mut self, payload: Payload) -> Event {
            let seq = self.events.len() as u64 + 1;
            let mut event = Event::new(
                Envelope {
                    event_id: format!("{}-ev{seq}", self.run_id),
                    ts: ts(seq),
                    tenant_id: "default".into(),
                    session_id: SESSION.into(),
                    run_id: self.run_id.clone(),
                    root_run_id: self.run_id.clone(),
                    span_id: format!("span-{seq}"),
                    parent_span_id: None,
                    agent: Some("demo".into()),
                    role: None,
                },
                payload,
            );
            event.seq = seq;
            self.events.push(event.clone());
            event
        }

        /// The current run's state after every event so far.
        fn state(&self) -> RunState {
            self.state_of(&self.run_id)
        }

        /// Any run's state after every event so far.
        fn state_of(&self, run_id: &str) -> RunState {
            RunState::fold(run_id, &self.events).expect("the journal folds")
        }

        /// Appends `payload` and returns the refusal the projection gives it.
        fn refused(&mut self, payload: Payload) -> (Event, ProjectionError) {
            let mut state = self.state();
            let event = self.push(payload);
            let error = state
                .apply(&event)
                .expect_err("the projection should refuse the event");
            (event, error)
        }

        /// `run.started`, the question, a claim.
        fn begin(&mut self, question: &str) {
            self.push(started());
            self.push(user(question));
            self.push(claimed("worker-1", 60));
        }

        fn step_started(&mut self, state: RunStatus, effect: Effect) {
            self.step += 1;
            self.push(step_started(self.step, state, effect));
        }

        fn step_completed(&mut self, duration_ms: f64) {
            self.push(step_completed(self.step, duration_ms));
        }

        /// A model step from `from`, then the transition the answer calls for.
        fn model_turn(&mut self, from: RunStatus, answer: Message, to: RunStatus) {
            let effect = if from == RunStatus::Finalizing {
                Effect::Finalize
            } else {
                Effect::ModelCall
            };
            self.step_started(from, effect);
            self.push(responded(answer));
            self.step_completed(10.0);
            self.push(transition(from, to));
        }

        /// A tool batch where every call runs and completes in the given order.
        fn tool_batch(&mut self, call_ids: &[&str], to: RunStatus) {
            self.step_started(RunStatus::AwaitingTools, Effect::ToolBatch);
            for call_id in call_ids {
                self.push(called(call_id));
                self.push(tool_completed(call_id, &format!("result of {call_id}")));
            }
            self.step_completed(5.0);
            self.push(transition(RunStatus::AwaitingTools, to));
        }

        /// The reference's plain run: one tool turn, then the final answer, completed.
        fn plain_run(&mut self, question: &str, call_id: &str, answer: &str) {
            self.begin(question);
            self.model_turn(
                RunStatus::ReadyForModel,
                asks("Je calcule.", &[call_id]),
                RunStatus::AwaitingTools,
            );
            self.tool_batch(&[call_id], RunStatus::ReadyForModel);
            self.model_turn(
                RunStatus::ReadyForModel,
                Message::assistant(answer),
                RunStatus::Completed,
            );
            self.push(run_completed(Some(Message::assistant(answer))));
        }
    }

    // Payloads ------------------------------------------------------------------------------

    fn run_started(kind: &str, parent_run_id: Option<&str>, depth: u32) -> Payload {
        Payload::RunStarted(RunStarted {
            kind: kind.into(),
            context: RunContext {
                tenant_id: "default".into(),
                user_id: None,
                metadata: Map::new(),
            },
            parent_run_id: parent_run_id.map(str::to_owned),
            parent_call_id: None,
            depth,
            triggered_by: None,
            trigger: None,
            judges: "auto".into(),
            budget: None,
            state: Map::new(),
        })
    }

    fn started() -> Payload {
        run_started("normal", None, 0)
    }

    fn user(text: &str) -> Payload {
        Payload::MessageUser(MessageUser {
            message: Message::user(text),
            kind: "request".into(),
            policy: None,
            tools: true,
        })
    }

    fn claimed(worker_id: &str, lease_secs: i64) -> Payload {
        Payload::RunClaimed(RunClaimed {
            worker_id: worker_id.into(),
            lease_until: ts(0) + TimeDelta::seconds(lease_secs),
        })
    }

    fn step_started(step_no: u32, state: RunStatus, effect: Effect) -> Payload {
        Payload::StepStarted(StepStarted {
            step_no,
            state,
            effect,
        })
    }

    fn step_completed(step_no: u32, duration_ms: f64) -> Payload {
        Payload::StepCompleted(StepCompleted {
            step_no,
            duration_ms,
            events_emitted: 1,
            outcome: Outcome::Ok,
        })
    }

    fn usage(input_tokens: u64, output_tokens: u64) -> Usage {
        Usage {
            input_tokens,
            output_tokens,
            ..Usage::default()
        }
    }

    fn args(call_id: &str) -> Value {
        json!({ "call": call_id })
    }

    /// An assistant message with a text block and one `calculer` call per id, in that order.
    fn asks(text: &str, call_ids: &[&str]) -> Message {
        let mut message = Message::assistant(text);
        for call_id in call_ids {
            message
                .blocks
                .push(Block::tool_call(*call_id, "calculer", args(call_id)));
        }
        message
    }

    fn model_response(message: Message, usage: Usage, cost_usd: f64) -> ModelResponded {
        let stop_reason = if message.tool_calls().next().is_some() {
            StopReason::ToolUse
        } else {
            StopReason::End
        };
        ModelResponded {
            model_id: "fake".into(),
            model: None,
            provider: "fake".into(),
            message,
            usage,
            cost_usd,
            stop_reason,
            latency_ms: 1.0,
            attempts: 1,
            request_hash: None,
            request_parts: Map::new(),
            call_id: None,
            judge: None,
        }
    }

    fn responded(message: Message) -> Payload {
        responded_with(message, usage(100, 10), 0.0)
    }

    fn responded_with(message: Message, usage: Usage, cost_usd: f64) -> Payload {
        Payload::ModelResponded(model_response(message, usage, cost_usd))
    }

    fn role_responded(call_id: &str, usage: Usage, cost_usd: f64) -> Payload {
        Payload::ModelResponded(ModelResponded {
            call_id: Some(call_id.into()),
            ..model_response(Message::assistant("role answer"), usage, cost_usd)
        })
    }

    fn judge_responded(judge: &str, usage: Usage, cost_usd: f64) -> Payload {
        Payload::ModelResponded(ModelResponded {
            judge: Some(judge.into()),
            ..model_response(Message::assistant("verdict"), usage, cost_usd)
        })
    }

    fn called(call_id: &str) -> Payload {
        Payload::ToolCalled(ToolCalled {
            call_id: call_id.into(),
            tool_name: "calculer".into(),
            tool_kind: ToolKind::Python,
            arguments: args(call_id),
            refs: Vec::new(),
            resumed: false,
            child_run_id: None,
        })
    }

    fn tool_completed(call_id: &str, text: &str) -> Payload {
        tool_completed_with(call_id, ToolOutput::text(text), None, 0.0)
    }

    fn tool_completed_with(
        call_id: &str,
        output: ToolOutput,
        usage: Option<Usage>,
        cost_usd: f64,
    ) -> Payload {
        Payload::ToolCompleted(ToolCompleted {
            call_id: call_id.into(),
            tool_name: "calculer".into(),
            output,
            latency_ms: 0.5,
            size: 0,
            usage,
            cost_usd,
        })
    }

    fn transition(from_state: RunStatus, to_state: RunStatus) -> Payload {
        Payload::RunTransitioned(RunTransitioned {
            from_state,
            to_state,
            step_no: 0,
            cause_type: "test".into(),
            cause_event_id: None,
        })
    }

    fn run_completed(output: Option<Message>) -> Payload {
        run_completed_with_data(output, None)
    }

    fn run_completed_with_data(output: Option<Message>, data: Option<Value>) -> Payload {
        Payload::RunCompleted(RunCompleted {
            output,
            output_event_id: None,
            iterations: 0,
            usage: Usage::default(),
            cost_usd: 0.0,
            data,
            unverified: false,
            fallback: false,
        })
    }

    fn run_failed(error_type: &str, error: &str) -> Payload {
        Payload::RunFailed(RunFailed {
            error_type: error_type.into(),
            error: error.into(),
            iterations: 0,
            usage: Usage::default(),
            cost_usd: 0.0,
        })
    }

    fn run_cancelled() -> Payload {
        Payload::RunCancelled(RunCancelled {
            reason: "requested".into(),
            by: Some("alice".into()),
            iterations: 0,
            usage: Usage::default(),
            cost_usd: 0.0,
            withdrawn: Vec::new(),
        })
    }

    // Reading results -----------------------------------------------------------------------

    /// The (call id, visible text) of each tool result of a message, in block order.
    fn results(message: &Message) -> Vec<(String, String)> {
        message
            .blocks
            .iter()
            .filter_map(|b| match &b.kind {
                BlockKind::ToolResult { call_id, output } => {
                    Some((call_id.clone(), output.visible_text()))
                }
                _ => None,
            })
            .collect()
    }

    fn result_ids(message: &Message) -> Vec<String> {
        results(message).into_iter().map(|(id, _)| id).collect()
    }

    fn call_ids(message: &Message) -> Vec<String> {
        message
            .tool_calls()
            .map(|(id, _, _)| id.to_owned())
            .collect()
    }

    fn roles(messages: &[Message]) -> Vec<Role> {
        messages.iter().map(|m| m.role).collect()
    }

    fn pending_ids(state: &RunState) -> Vec<&str> {
        state
            .pending_calls
            .iter()
            .map(|c| c.call_id.as_str())
            .collect()
    }

    /// The events of a reference journal of `../shared`; `None` (the test is skipped) on a
    /// clone without it.
    fn read_journal(path: &str) -> Option<Vec<Event>> {
        let text = loom_testkit::shared::text(path)?;
        let events = text
            .lines()
            .enumerate()
            .filter(|(_, line)| !line.trim().is_empty())
            .map(|(n, line)| {
                Event::from_json(line).unwrap_or_else(|e| panic!("{path}:{}: {e}", n + 1))
            })
            .collect();
        Some(events)
    }

    // ---------------------------------------------------------------------------------------
    // Start
    // ---------------------------------------------------------------------------------------

    #[test]
    fn start_takes_identity_from_the_envelope_and_begins_ready_for_model() {
        let mut journal = Journal::new();
        let first = journal.push(run_started("normal", Some("parent-run"), 2));

        let state = RunState::start(&first).unwrap();

        assert_eq!(state.run_id, RUN);
        assert_eq!(state.session_id, SESSION);
        assert_eq!(state.tenant_id, "default");
        assert_eq!(state.root_run_id, RUN);
        assert_eq!(state.run_span_id, first.span_id);
        assert_eq!(state.parent_run_id.as_deref(), Some("parent-run"));
        assert_eq!(state.depth, 2);
        assert_eq!(state.agent.as_deref(), Some("demo"));
        assert_eq!(state.kind, "normal");
        assert_eq!(state.status, RunStatus::ReadyForModel);
        assert!(!state.finished);
        assert!(state.messages.is_empty() && state.pending_calls.is_empty());
        assert_eq!((state.iterations, state.model_calls, state.step), (0, 0, 0));
        assert_eq!(state.last_seq, 1);
        assert_eq!((state.started_at, state.updated_at), (first.ts, first.ts));
    }

    #[test]
    fn first_event_must_be_run_started() {
        let mut journal = Journal::new();
        let first = journal.push(user("hello"));

        let error = RunState::start(&first).unwrap_err();
        assert_eq!(error.event_id, first.event_id);
        assert_eq!(error.seq, 1);
        assert_eq!(error.event_type, "message.user");
        assert!(error.reason.contains("must be run.started"), "{error}");

        match RunState::fold(RUN, &journal.events) {
            Err(FoldError::Projection(e)) => assert_eq!(e, error),
            other => panic!("expected a projection error, got {other:?}"),
        }
    }

    #[test]
    fn duplicate_run_started_is_refused() {
        let mut journal = Journal::new();
        journal.begin("hello");

        let (event, error) = journal.refused(started());

        assert_eq!(error.event_id, event.event_id);
        assert_eq!(error.reason, "duplicate run.started");
    }

    #[test]
    fn a_closing_event_needs_a_terminal_transition_first() {
        let mut journal = Journal::new();
        journal.begin("hello");

        let (event, error) = journal.refused(run_completed(None));

        assert_eq!(error.event_id, event.event_id);
        assert!(
            error
                .reason
                .contains("a terminal transition must come first"),
            "{error}"
        );
    }

    #[test]
    fn a_refused_event_leaves_the_state_unchanged() {
        let mut journal = Journal::new();
        journal.begin("hello");
        let before = journal.state();

        let mut state = journal.state();
        let event = journal.push(started());
        assert!(state.apply(&event).is_err());

        assert_eq!(state, before);
    }

    #[test]
    fn fold_of_an_unknown_run_is_an_error() {
        let mut journal = Journal::new();
        journal.begin("hello");

        assert_eq!(
            RunState::fold("nobody", &journal.events),
            Err(FoldError::Unknown("nobody".into()))
        );
    }

    #[test]
    fn fold_skips_the_events_of_other_runs() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.switch_to("child-run");
        journal.push(run_started("normal", Some(RUN), 1));
        journal.push(user("sub-question"));
        journal.switch_to(RUN);
        journal.push(user("follow-up"));

        let state = journal.state();

        assert_eq!(state.messages.len(), 2);
        assert_eq!(state.messages[1].text(), "follow-up");
        assert_eq!(state.last_seq, 6);
    }

    #[test]
    fn apply_refuses_an_event_of_another_run() {
        let mut journal = Journal::new();
        journal.begin("hello");
        let mut state = journal.state();
        journal.switch_to("other-run");
        let intruder = journal.push(user("intruder"));

        let error = state.apply(&intruder).unwrap_err();

        assert_eq!(error.run_id, "other-run");
        assert_eq!(error.event_id, intruder.event_id);
        assert_eq!(error.reason, "event of another run");
    }

    // ---------------------------------------------------------------------------------------
    // Transitions and closing events
    // ---------------------------------------------------------------------------------------

    #[test]
    fn tool_turn_then_answer_completes_the_run() {
        let mut journal = Journal::new();
        journal.begin("12 × 7 + 3 ?");

        journal.model_turn(
            RunStatus::ReadyForModel,
            asks("Je calcule.", &["c1"]),
            RunStatus::AwaitingTools,
        );
        assert_eq!(journal.state().status, RunStatus::AwaitingTools);

        journal.tool_batch(&["c1"], RunStatus::ReadyForModel);
        assert_eq!(journal.state().status, RunStatus::ReadyForModel);

        journal.model_turn(
            RunStatus::ReadyForModel,
            Message::assistant("87"),
            RunStatus::Completed,
        );
        let state = journal.state();
        assert_eq!(state.status, RunStatus::Completed);
        assert!(!state.finished, "finished waits for the closing event");
        assert_eq!(state.output, None);

        journal.push(run_completed(Some(Message::assistant("87"))));
        let state = journal.state();
        assert_eq!(state.status, RunStatus::Completed);
        assert!(state.finished);
        assert_eq!(state.output_text().as_deref(), Some("87"));
        assert_eq!(state.iterations, 2);
        assert!(state.pending_calls.is_empty());
    }

    #[test]
    fn run_completed_records_structured_output() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.model_turn(
            RunStatus::ReadyForModel,
            Message::assistant("{\"n\":87}"),
            RunStatus::Completed,
        );
        journal.push(run_completed_with_data(
            Some(Message::assistant("{\"n\":87}")),
            Some(json!({ "n": 87 })),
        ));

        assert_eq!(journal.state().output_data, Some(json!({ "n": 87 })));
    }

    #[test]
    fn finalizing_path_completes_from_finalizing() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.model_turn(
            RunStatus::ReadyForModel,
            asks("tool", &["c1"]),
            RunStatus::AwaitingTools,
        );
        journal.tool_batch(&["c1"], RunStatus::Finalizing);
        assert_eq!(journal.state().status, RunStatus::Finalizing);

        journal.model_turn(
            RunStatus::Finalizing,
            Message::assistant("last answer"),
            RunStatus::Completed,
        );
        journal.push(run_completed(Some(Message::assistant("last answer"))));

        let state = journal.state();
        assert_eq!(state.status, RunStatus::Completed);
        assert!(state.finished);
        assert_eq!(state.iterations, 2);
        assert_eq!(state.output_text().as_deref(), Some("last answer"));
    }

    #[test]
    fn failed_transition_then_run_failed_records_the_error() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(transition(RunStatus::ReadyForModel, RunStatus::Failed));
        assert!(!journal.state().finished);

        journal.push(run_failed("model.auth", "invalid API key"));

        let state = journal.state();
        assert_eq!(state.status, RunStatus::Failed);
        assert!(state.finished);
        assert_eq!(state.error_type.as_deref(), Some("model.auth"));
        assert_eq!(state.error.as_deref(), Some("invalid API key"));
        assert_eq!(state.output, None);
    }

    #[test]
    fn cancelled_transition_then_run_cancelled_finishes_the_run() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.model_turn(
            RunStatus::ReadyForModel,
            asks("tool", &["c1"]),
            RunStatus::AwaitingTools,
        );
        journal.push(transition(RunStatus::AwaitingTools, RunStatus::Cancelled));
        journal.push(run_cancelled());

        let state = journal.state();
        assert_eq!(state.status, RunStatus::Cancelled);
        assert!(state.finished);
        assert_eq!((state.error_type, state.error), (None, None));
        assert_eq!(pending_ids(&journal.state()), ["c1"]);
    }

    #[test]
    fn paused_run_resumes_to_awaiting_tools_under_a_new_claim() {
        // §2.3 approval: awaiting_tools→paused, lease handed back, new worker, paused→awaiting_tools.
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.model_turn(
            RunStatus::ReadyForModel,
            asks("tool", &["c1"]),
            RunStatus::AwaitingTools,
        );
        journal.push(transition(RunStatus::AwaitingTools, RunStatus::Paused));
        journal.push(claimed("worker-1", 0));
        assert_eq!(journal.state().status, RunStatus::Paused);

        journal.push(claimed("worker-2", 120));
        journal.push(transition(RunStatus::Paused, RunStatus::AwaitingTools));

        let state = journal.state();
        assert_eq!(state.status, RunStatus::AwaitingTools);
        assert_eq!(state.claim.unwrap().worker_id, "worker-2");
        assert_eq!(pending_ids(&journal.state()), ["c1"]);
    }

    #[test]
    fn waiting_child_returns_to_awaiting_tools() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.model_turn(
            RunStatus::ReadyForModel,
            asks("delegate", &["c1"]),
            RunStatus::AwaitingTools,
        );
        journal.push(transition(
            RunStatus::AwaitingTools,
            RunStatus::WaitingChild,
        ));
        assert_eq!(journal.state().status, RunStatus::WaitingChild);

        journal.push(transition(
            RunStatus::WaitingChild,
            RunStatus::AwaitingTools,
        ));
        assert_eq!(journal.state().status, RunStatus::AwaitingTools);
    }

    #[test]
    fn transition_from_another_state_is_refused_with_the_event_named() {
        let mut journal = Journal::new();
        journal.begin("hello");

        let (event, error) = journal.refused(transition(
            RunStatus::AwaitingTools,
            RunStatus::ReadyForModel,
        ));

        assert_eq!(error.run_id, RUN);
        assert_eq!(error.event_id, event.event_id);
        assert_eq!(error.seq, event.seq);
        assert_eq!(error.event_type, "run.transitioned");
        assert!(
            error.reason.contains("awaiting_tools") && error.reason.contains("ready_for_model"),
            "{error}"
        );
        let text = error.to_string();
        assert!(text.contains(&event.event_id), "{text}");
        assert!(text.contains(&format!("seq {}", event.seq)), "{text}");
    }

    #[test]
    fn mismatched_transition_in_a_journal_fails_the_fold() {
        let mut journal = Journal::new();
        journal.begin("hello");
        let bad = journal.push(transition(RunStatus::Finalizing, RunStatus::Completed));

        match RunState::fold(RUN, &journal.events) {
            Err(FoldError::Projection(e)) => {
                assert_eq!((e.event_id, e.seq), (bad.event_id, bad.seq));
            }
            other => panic!("expected a projection error, got {other:?}"),
        }
    }

    #[test]
    fn events_after_the_closing_event_are_refused() {
        let mut journal = Journal::new();
        journal.plain_run("q", "c1", "a");

        let (event, error) = journal.refused(user("one more thing"));
        assert_eq!(error.event_id, event.event_id);
        assert!(error.reason.contains("after the run closed"), "{error}");

        let mut journal = Journal::new();
        journal.plain_run("q", "c1", "a");
        let (_, error) = journal.refused(run_completed(Some(Message::assistant("again"))));
        assert!(error.reason.contains("after the run closed"), "{error}");
    }

    #[test]
    fn run_claimed_after_the_closing_event_is_recorded() {
        let mut journal = Journal::new();
        journal.plain_run("q", "c1", "a");
        let claim = journal.push(claimed("worker-9", 300));

        let state = journal.state();

        assert!(state.finished);
        assert_eq!(
            state.claim,
            Some(Claim {
                worker_id: "worker-9".into(),
                lease_until: ts(0) + TimeDelta::seconds(300),
            })
        );
        assert_eq!(state.last_seq, claim.seq);
        assert_eq!(state.updated_at, claim.ts);
    }

    #[test]
    fn after_a_terminal_transition_only_the_matching_closing_event_is_accepted() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(transition(RunStatus::ReadyForModel, RunStatus::Completed));

        let (_, error) = journal.refused(run_failed("timeout", "too late"));
        assert!(
            error.reason.contains("after the state completed"),
            "{error}"
        );

        journal.events.pop();
        let (_, error) = journal.refused(run_cancelled());
        assert!(
            error.reason.contains("after the state completed"),
            "{error}"
        );

        journal.events.pop();
        let (_, error) = journal.refused(step_started(1, RunStatus::Completed, Effect::ModelCall));
        assert!(
            error.reason.contains("after the state completed"),
            "{error}"
        );

        journal.events.pop();
        journal.push(run_completed(None));
        assert!(journal.state().finished);
    }

    #[test]
    fn run_failed_state_accepts_only_run_failed() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(transition(RunStatus::ReadyForModel, RunStatus::Failed));

        let (_, error) = journal.refused(run_completed(None));
        assert!(error.reason.contains("after the state failed"), "{error}");

        journal.events.pop();
        journal.push(run_failed("timeout", "too late"));
        assert!(journal.state().finished);
    }

    #[test]
    fn run_claimed_between_terminal_transition_and_closing_event_is_accepted() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(transition(RunStatus::ReadyForModel, RunStatus::Cancelled));
        journal.push(claimed("worker-2", 30));
        journal.push(run_cancelled());

        let state = journal.state();
        assert!(state.finished);
        assert_eq!(state.claim.unwrap().worker_id, "worker-2");
    }

    #[test]
    fn transition_out_of_a_terminal_state_is_refused() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(transition(RunStatus::ReadyForModel, RunStatus::Failed));

        let (_, error) = journal.refused(transition(RunStatus::Failed, RunStatus::ReadyForModel));

        assert!(error.reason.contains("after the state failed"), "{error}");
    }

    // ---------------------------------------------------------------------------------------
    // Messages, model answers and tools
    // ---------------------------------------------------------------------------------------

    #[test]
    fn user_messages_are_appended_in_journal_order() {
        let mut journal = Journal::new();
        journal.begin("first");
        journal.push(user("second"));

        let state = journal.state();
        assert_eq!(roles(&state.messages), [Role::User, Role::User]);
        assert_eq!(state.messages[0].text(), "first");
        assert_eq!(state.messages[1].text(), "second");
    }

    #[test]
    fn orchestrator_answer_appends_a_message_and_counts_an_iteration() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(responded(Message::assistant("hi")));

        let state = journal.state();
        assert_eq!(roles(&state.messages), [Role::User, Role::Assistant]);
        assert_eq!((state.iterations, state.model_calls), (1, 1));
        assert!(state.pending_calls.is_empty());
    }

    #[test]
    fn model_responded_sets_pending_calls_in_call_order() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(responded(asks("three tools", &["b", "a", "c"])));

        let state = journal.state();

        assert_eq!(pending_ids(&state), ["b", "a", "c"]);
        for call in &state.pending_calls {
            assert_eq!(call.name, "calculer");
            assert_eq!(call.arguments, args(&call.call_id));
            assert!(!call.started);
        }
    }

    #[test]
    fn role_answer_adds_cost_and_model_calls_only() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(responded_with(
            asks("ask the role", &["r1"]),
            usage(100, 10),
            0.5,
        ));
        journal.push(called("r1"));
        let before = journal.state();

        journal.push(role_responded("r1", usage(20, 5), 0.25));
        let after = journal.state();

        assert_eq!(after.messages, before.messages);
        assert_eq!(after.iterations, before.iterations);
        assert_eq!(after.pending_calls, before.pending_calls);
        assert_eq!(after.model_calls, before.model_calls + 1);
        assert_eq!(after.cost_usd, 0.75);
        assert_eq!(after.usage, usage(120, 15));
    }

    #[test]
    fn judge_answer_adds_cost_and_model_calls_only() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(responded_with(
            Message::assistant("answer"),
            usage(100, 10),
            0.5,
        ));
        let before = journal.state();

        journal.push(judge_responded("quality", usage(30, 3), 0.125));
        let after = journal.state();

        assert_eq!(after.messages, before.messages);
        assert_eq!(after.iterations, 1);
        assert_eq!(after.model_calls, 2);
        assert_eq!(after.cost_usd, 0.625);
        assert_eq!(after.usage, usage(130, 13));
    }

    #[test]
    fn tool_called_marks_only_its_call_started() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(responded(asks("two tools", &["c1", "c2"])));
        journal.push(called("c2"));

        let state = journal.state();
        let started: Vec<(&str, bool)> = state
            .pending_calls
            .iter()
            .map(|c| (c.call_id.as_str(), c.started))
            .collect();
        assert_eq!(started, [("c1", false), ("c2", true)]);
    }

    #[test]
    fn tool_called_for_an_unknown_call_is_refused() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(responded(asks("one tool", &["c1"])));

        let (event, error) = journal.refused(called("ghost"));

        assert_eq!(error.event_id, event.event_id);
        assert!(error.reason.contains("'ghost'"), "{error}");
    }

    #[test]
    fn tool_completed_for_an_unknown_call_is_refused() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(responded(asks("one tool", &["c1"])));

        let (event, error) = journal.refused(tool_completed("ghost", "?"));

        assert_eq!(error.event_id, event.event_id);
        assert_eq!(error.event_type, "tool.completed");
        assert!(
            error
                .reason
                .contains("tool.completed for unknown call 'ghost'"),
            "{error}"
        );
    }

    #[test]
    fn tool_completed_twice_for_the_same_call_is_refused() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(responded(asks("one tool", &["c1"])));
        journal.push(tool_completed("c1", "87"));

        let (_, error) = journal.refused(tool_completed("c1", "87 again"));

        assert!(error.reason.contains("unknown call 'c1'"), "{error}");
    }

    #[test]
    fn tool_completed_without_tool_called_is_accepted() {
        // A refused call (rejected approval, invalid arguments) writes only tool.completed.
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(responded(asks("one tool", &["c1"])));
        journal.push(tool_completed_with(
            "c1",
            ToolOutput::error("rejected"),
            None,
            0.0,
        ));

        let state = journal.state();
        assert!(state.pending_calls.is_empty());
        assert!(
            results(state.messages.last().unwrap())[0]
                .1
                .contains("rejected")
        );
    }

    #[test]
    fn tool_completed_removes_the_call_and_appends_a_tool_message() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(responded(asks("two tools", &["c1", "c2"])));
        journal.push(called("c1"));
        journal.push(tool_completed("c1", "87"));

        let state = journal.state();

        assert_eq!(pending_ids(&state), ["c2"]);
        let last = state.messages.last().unwrap();
        assert_eq!(last.role, Role::Tool);
        assert_eq!(last.blocks.len(), 1);
        match &last.blocks[0].kind {
            BlockKind::ToolResult { call_id, output } => {
                assert_eq!(call_id, "c1");
                assert_eq!(output, &ToolOutput::text("87"));
            }
            other => panic!("expected a tool result, got {other:?}"),
        }
    }

    #[test]
    fn tool_completed_adds_its_usage_and_cost() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(responded_with(
            asks("delegate", &["c1"]),
            usage(100, 10),
            0.5,
        ));
        journal.push(called("c1"));
        journal.push(tool_completed_with(
            "c1",
            ToolOutput::text("sub-agent answer"),
            Some(usage(40, 4)),
            0.25,
        ));

        let state = journal.state();
        assert_eq!(state.usage, usage(140, 14));
        assert_eq!(state.cost_usd, 0.75);
        assert_eq!(state.model_calls, 1, "a tool result is not a model call");
    }

    #[test]
    fn step_started_sets_the_step_and_step_completed_accumulates_active_time() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(step_started(1, RunStatus::ReadyForModel, Effect::ModelCall));
        journal.push(step_completed(1, 12.5));
        journal.push(step_started(2, RunStatus::ReadyForModel, Effect::ModelCall));
        journal.push(step_completed(2, 30.25));

        let state = journal.state();
        assert_eq!(state.step, 2);
        assert_eq!(state.active_ms, 42.75);
    }

    #[test]
    fn usage_and_cost_accumulate_across_calls() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(responded_with(asks("tool", &["c1"]), usage(100, 10), 0.5));
        journal.push(tool_completed_with(
            "c1",
            ToolOutput::text("ok"),
            Some(usage(7, 3)),
            0.125,
        ));
        journal.push(judge_responded("quality", usage(20, 2), 0.0625));
        journal.push(responded_with(
            Message::assistant("done"),
            Usage {
                cache_read_tokens: 50,
                reasoning_tokens: 5,
                ..usage(200, 20)
            },
            0.25,
        ));

        let state = journal.state();
        assert_eq!(
            state.usage,
            Usage {
                input_tokens: 327,
                output_tokens: 35,
                cache_read_tokens: 50,
                cache_write_tokens: 0,
                reasoning_tokens: 5,
            }
        );
        assert_eq!(state.cost_usd, 0.9375);
        assert_eq!((state.model_calls, state.iterations), (3, 2));
    }

    #[test]
    fn last_seq_and_updated_at_follow_the_last_event() {
        let mut journal = Journal::new();
        journal.begin("hello");
        let last = journal.push(user("again"));

        let state = journal.state();
        assert_eq!(state.last_seq, last.seq);
        assert_eq!(state.updated_at, last.ts);
        assert_eq!(state.started_at, journal.events[0].ts);
    }

    // ---------------------------------------------------------------------------------------
    // Conversation
    // ---------------------------------------------------------------------------------------

    #[test]
    fn conversation_groups_a_turns_results_in_call_order() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(responded(asks("three tools", &["c1", "c2", "c3"])));
        for call_id in ["c3", "c1", "c2"] {
            journal.push(called(call_id));
        }
        journal.push(tool_completed("c3", "three"));
        journal.push(tool_completed("c2", "two"));
        journal.push(tool_completed("c1", "one"));

        let state = journal.state();
        // The journal order is kept in `messages`...
        assert_eq!(
            roles(&state.messages),
            [
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Tool,
                Role::Tool
            ]
        );
        // ...the conversation has one tool message in the model's order.
        let conversation = state.conversation();
        assert_eq!(
            roles(&conversation),
            [Role::User, Role::Assistant, Role::Tool]
        );
        assert_eq!(
            results(&conversation[2]),
            [
                ("c1".to_owned(), "one".to_owned()),
                ("c2".to_owned(), "two".to_owned()),
                ("c3".to_owned(), "three".to_owned()),
            ]
        );
    }

    #[test]
    fn conversation_keeps_each_turns_results_apart() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.model_turn(
            RunStatus::ReadyForModel,
            asks("first", &["a2", "a1"]),
            RunStatus::AwaitingTools,
        );
        journal.tool_batch(&["a1", "a2"], RunStatus::ReadyForModel);
        journal.model_turn(
            RunStatus::ReadyForModel,
            asks("second", &["b1"]),
            RunStatus::AwaitingTools,
        );
        journal.tool_batch(&["b1"], RunStatus::ReadyForModel);

        let conversation = journal.state().conversation();

        assert_eq!(
            roles(&conversation),
            [
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Assistant,
                Role::Tool
            ]
        );
        assert_eq!(result_ids(&conversation[2]), ["a2", "a1"]);
        assert_eq!(result_ids(&conversation[4]), ["b1"]);
    }

    // ---------------------------------------------------------------------------------------
    // Session history
    // ---------------------------------------------------------------------------------------

    #[test]
    fn session_history_concatenates_the_runs_of_the_session() {
        let mut journal = Journal::new();
        journal.plain_run("first question", "c1", "first answer");
        journal.switch_to("run-2");
        journal.plain_run("second question", "c2", "second answer");

        let history = session_history(&journal.events).unwrap();

        assert_eq!(
            roles(&history),
            [
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Assistant,
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Assistant
            ]
        );
        assert_eq!(history[0].text(), "first question");
        assert_eq!(history[4].text(), "second question");
        assert_eq!(call_ids(&history[5]), ["c2"]);
        assert_eq!(result_ids(&history[6]), ["c2"]);
    }

    #[test]
    fn session_history_drops_a_call_without_result_from_a_run_failed_mid_batch() {
        let mut journal = Journal::new();
        journal.plain_run("first question", "a1", "first answer");
        journal.switch_to("run-2");
        journal.begin("second question");
        journal.model_turn(
            RunStatus::ReadyForModel,
            asks("two tools", &["b1", "b2"]),
            RunStatus::AwaitingTools,
        );
        journal.step_started(RunStatus::AwaitingTools, Effect::ToolBatch);
        journal.push(called("b1"));
        journal.push(called("b2"));
        journal.push(tool_completed("b1", "one"));
        journal.push(transition(RunStatus::AwaitingTools, RunStatus::Failed));
        journal.push(run_failed("timeout", "b2 never answered"));

        let history = session_history(&journal.events).unwrap();

        assert_eq!(history.len(), 7);
        assert_eq!(history[..4], journal.state_of(RUN).conversation()[..]);
        assert_eq!(history[4].text(), "second question");
        assert_eq!(
            history[5].text(),
            "two tools",
            "the text of the answer stays"
        );
        assert_eq!(call_ids(&history[5]), ["b1"], "b2 has no result");
        assert_eq!(result_ids(&history[6]), ["b1"]);
    }

    #[test]
    fn session_history_pairs_calls_within_each_run_even_when_ids_repeat() {
        // Call ids are only unique within a run (the fake provider restarts at fake_0_0 in
        // each run, as in session-two-runs.jsonl): run 1's result must not keep run 2's
        // unanswered call of the same id.
        let mut journal = Journal::new();
        journal.plain_run("first question", "fake_0_0", "first answer");
        journal.switch_to("run-2");
        journal.begin("second question");
        journal.model_turn(
            RunStatus::ReadyForModel,
            asks("Je calcule.", &["fake_0_0"]),
            RunStatus::AwaitingTools,
        );
        journal.push(transition(RunStatus::AwaitingTools, RunStatus::Failed));
        journal.push(run_failed("timeout", "the tool never answered"));

        let history = session_history(&journal.events).unwrap();

        assert_eq!(history.len(), 6);
        assert_eq!(history[5].role, Role::Assistant);
        assert!(
            call_ids(&history[5]).is_empty(),
            "run 2's call has no result in run 2: {:?}",
            history[5]
        );
    }

    #[test]
    fn session_history_skips_child_and_compaction_runs() {
        let mut journal = Journal::new();
        journal.plain_run("root question", "c1", "root answer");
        journal.switch_to("child-run");
        journal.push(run_started("normal", Some(RUN), 1));
        journal.push(user("child question"));
        journal.switch_to("compaction-run");
        journal.push(run_started("compaction", None, 0));
        journal.push(user("summarize"));

        let history = session_history(&journal.events).unwrap();

        assert_eq!(history.len(), 4);
        assert!(
            history
                .iter()
                .all(|m| !m.text().contains("child") && m.text() != "summarize")
        );
    }

    #[test]
    fn session_history_of_an_empty_journal_is_empty() {
        assert_eq!(session_history(&[]), Ok(Vec::new()));
    }

    #[test]
    fn session_history_reports_a_broken_run() {
        let mut journal = Journal::new();
        journal.begin("hello");
        let bad = journal.push(tool_completed("ghost", "?"));

        match session_history(&journal.events) {
            Err(FoldError::Projection(e)) => assert_eq!(e.event_id, bad.event_id),
            other => panic!("expected a projection error, got {other:?}"),
        }
    }

    // ---------------------------------------------------------------------------------------
    // Reference journals
    // ---------------------------------------------------------------------------------------

    #[test]
    fn reference_plain_run_folds_to_its_recorded_outcome() {
        let Some(events) = read_journal(PLAIN_RUN) else {
            return;
        };
        assert_eq!(events.len(), 17);

        let state = RunState::fold("plain-run-1", &events).unwrap();

        assert_eq!(state.status, RunStatus::Completed);
        assert!(state.finished);
        assert_eq!(state.iterations, 2);
        assert_eq!(state.model_calls, 2);
        assert_eq!(
            (state.usage.input_tokens, state.usage.output_tokens),
            (496, 93)
        );
        assert_eq!(
            state.output_text().as_deref(),
            Some("12 fois 7, plus 3, font 87.")
        );
        assert!(state.pending_calls.is_empty());
        assert_eq!(state.last_seq, 17);
        assert!(state.claim.is_some());
        assert_eq!(
            roles(&state.conversation()),
            [Role::User, Role::Assistant, Role::Tool, Role::Assistant]
        );
    }

    #[test]
    fn reference_plain_run_totals_match_its_run_completed() {
        let Some(events) = read_journal(PLAIN_RUN) else {
            return;
        };
        let state = RunState::fold("plain-run-1", &events).unwrap();
        let Some(Payload::RunCompleted(done)) = events.last().map(|e| &e.payload) else {
            panic!("the reference run ends with run.completed");
        };

        assert_eq!(state.usage, done.usage);
        assert_eq!(state.iterations, done.iterations);
        assert_eq!(state.cost_usd, done.cost_usd);
        assert_eq!(state.output, done.output);
    }

    #[test]
    fn reference_terminal_role_answer_is_the_roles_result() {
        let Some(events) = read_journal(TERMINAL_ROLE) else {
            return;
        };
        let state = RunState::fold("j3-run", &events).unwrap();
        let Some(Payload::RunCompleted(done)) = events.last().map(|e| &e.payload) else {
            panic!("the reference run ends with run.completed");
        };
        assert!(done.output.is_none());
        assert!(done.output_event_id.is_some());
        assert_eq!(state.status, RunStatus::Completed);
        // The journal's answer is null: the state exposes the terminal role's result.
        assert_eq!(
            state.output_text().as_deref(),
            Some(
                "Objet : votre devis D-2026-042\n\nBonjour Madame Martin, devis D-2026-042 de 1 840 €."
            )
        );
        // The role's model calls are counted once (run totals = every model.responded).
        assert_eq!(state.usage, done.usage);
        assert_eq!(state.iterations, done.iterations);
        assert_eq!(state.model_calls, 6);
        assert_eq!(state.priced_calls.len(), 2);
    }

    #[test]
    fn a_role_call_is_priced_once() {
        let mut journal = Journal::new();
        journal.begin("hello");
        journal.push(responded_with(asks("a role", &["c1"]), usage(100, 10), 0.5));
        journal.push(called("c1"));
        journal.push(role_responded("c1", usage(20, 5), 0.25));
        // The role's tool.completed restates its model's consumption.
        journal.push(tool_completed_with(
            "c1",
            ToolOutput::text("role answer"),
            Some(usage(20, 5)),
            0.25,
        ));
        let state = journal.state();
        assert_eq!(state.usage, usage(120, 15));
        assert_eq!(state.cost_usd, 0.75);
        assert_eq!(state.iterations, 1);
        assert_eq!(state.model_calls, 2);
    }

    #[test]
    fn reference_session_folds_each_run() {
        let Some(events) = read_journal(SESSION_TWO_RUNS) else {
            return;
        };

        for run_id in ["sess-a-run1", "sess-a-run2"] {
            let state = RunState::fold(run_id, &events).unwrap();
            let Some(Payload::RunCompleted(done)) = events
                .iter()
                .rev()
                .find(|e| e.run_id == run_id)
                .map(|e| &e.payload)
            else {
                panic!("{run_id} ends with run.completed");
            };
            assert_eq!(state.status, RunStatus::Completed, "{run_id}");
            assert!(state.finished, "{run_id}");
            assert_eq!(state.iterations, 2, "{run_id}");
            assert_eq!(state.usage, done.usage, "{run_id}");
            assert_eq!(
                state.output_text().as_deref(),
                Some("12 fois 7, plus 3, font 87."),
                "{run_id}"
            );
        }
    }

    #[test]
    fn reference_session_history_puts_the_first_run_before_the_second() {
        let Some(events) = read_journal(SESSION_TWO_RUNS) else {
            return;
        };
        let second_start = events
            .iter()
            .position(|e| e.run_id == "sess-a-run2")
            .unwrap();
        let first = RunState::fold("sess-a-run1", &events).unwrap();

        // What the second run is given when it starts: the first run's 4 messages.
        let before_second = session_history(&events[..second_start]).unwrap();
        assert_eq!(before_second.len(), 4);
        assert_eq!(before_second, first.conversation());
        assert_eq!(before_second[0].text(), "Combien font 12 × 7 + 3 ?");

        // The whole session: the first run's messages, then the second run's.
        let whole = session_history(&events).unwrap();
        assert_eq!(whole.len(), 8);
        assert_eq!(whole[..4], before_second[..]);
        assert_eq!(whole[4].text(), "Et encore ?");
        assert_eq!(call_ids(&whole[5]), ["fake_0_0"]);
        assert_eq!(result_ids(&whole[6]), ["fake_0_0"]);
    }
}
