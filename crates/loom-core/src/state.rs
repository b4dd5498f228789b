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
    content::{Block, BlockKind, Message, Role},
    event::{Event, Payload},
    tool::ToolOutput,
    usage::Usage,
};

/// The states of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
}

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
            last_seq: event.seq,
            started_at: event.ts,
            updated_at: event.ts,
        })
    }

    /// Applies one event of this run.
    pub fn apply(&mut self, event: &Event) -> Result<(), ProjectionError> {
        if event.run_id != self.run_id {
            return Err(error(event, "event of another run"));
        }
        self.last_seq = event.seq;
        self.updated_at = event.ts;
        if let Payload::RunClaimed(claim) = &event.payload {
            self.claim = Some(Claim {
                worker_id: claim.worker_id.clone(),
                lease_until: claim.lease_until,
            });
            return Ok(());
        }
        if self.finished {
            return Err(error(
                event,
                &format!("event after the run closed in state {}", self.status),
            ));
        }
        if self.status.is_terminal() && !closes(self.status, &event.payload) {
            return Err(error(
                event,
                &format!("event after the state {}", self.status),
            ));
        }
        match &event.payload {
            Payload::RunStarted(_) => return Err(error(event, "duplicate run.started")),
            Payload::RunClaimed(_) => {}
            Payload::StepStarted(step) => self.step = step.step_no,
            Payload::StepCompleted(step) => self.active_ms += step.duration_ms,
            Payload::MessageUser(user) => self.messages.push(user.message.clone()),
            Payload::ModelResponded(response) => {
                self.usage.add(&response.usage);
                self.cost_usd += response.cost_usd;
                self.model_calls += 1;
                if response.call_id.is_none() && response.judge.is_none() {
                    self.iterations += 1;
                    self.pending_calls = response
                        .message
                        .tool_calls()
                        .map(|(call_id, name, arguments)| PendingCall {
                            call_id: call_id.to_owned(),
                            name: name.to_owned(),
                            arguments: arguments.clone(),
                            started: false,
                        })
                        .collect();
                    self.messages.push(response.message.clone());
                }
            }
            Payload::ToolCalled(called) => {
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
            }
            Payload::ToolCompleted(completed) => {
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
                self.pending_calls.remove(index);
                if let Some(usage) = &completed.usage {
                    self.usage.add(usage);
                }
                self.cost_usd += completed.cost_usd;
                self.messages
                    .push(tool_message(&completed.call_id, completed.output.clone()));
            }
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
            Payload::RunCompleted(completed) => {
                self.output = completed.output.clone();
                self.output_data = completed.data.clone();
                self.finished = true;
            }
            Payload::RunFailed(failed) => {
                self.error_type = Some(failed.error_type.clone());
                self.error = Some(failed.error.clone());
                self.finished = true;
            }
            Payload::RunCancelled(_) => self.finished = true,
        }
        Ok(())
    }

    /// The conversation to send to the model: the run's messages, with each turn's tool results
    /// grouped in one `tool` message and sorted into the order the model wrote the calls.
    pub fn conversation(&self) -> Vec<Message> {
        order_results(&self.messages)
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
        messages.extend(state.conversation());
    }
    Ok(pair_calls(messages))
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
