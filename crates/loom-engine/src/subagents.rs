//! Sub-agents: a complete agent offered as a tool, each call a child run in the same journal.
//!
//! A call opens a child run in the parent's session: `run.started` with the parent's run and
//! call ids, `depth + 1`, the parent's root, the budget share, then `message.user` with the
//! message. The parent's pilot drives it inline: no `run.claimed` (the parent holds the
//! lease), the same cancellation (a child token of the parent's), observer and approver, and no
//! session history. Only the child's final answer returns, as the call's result; its usage and
//! cost ride on the parent's `tool.completed`, so they roll up into the parent's totals (the
//! child's own model calls stay in its run and are never counted twice).
//!
//! A child that pauses for an approval ends the parent's batch in `waiting_child`, the lease
//! handed back; the request surfaces on the root run ([`crate::Engine::settle`] on the root
//! decides it, [`crate::descendant_approvals`] lists it). Driving the root again re-plays the call,
//! which is started and names its child run: the child is resumed, never relaunched (sub-agent
//! calls are declared irreversible and idempotent). Closing a run that has open descendants
//! first cancels each of them, most recent first (`run.cancelled` reason `parent`, by the
//! closing run), in the same write.

use std::{future::Future, pin::Pin, sync::Arc, time::Instant};

use futures_util::{StreamExt, stream::FuturesUnordered};
use loom_core::{
    BoxFuture, Message, RunState, RunStatus, Usage,
    approval::Approver,
    event::{MessageUser, Payload, RunBudget, RunContext, RunStarted},
    state::PendingCall,
    tool::{
        SideEffects, Tool, ToolContext, ToolDeclarations, ToolError, ToolKind, ToolOutput, ToolSpec,
    },
};
use serde_json::{Map, Value, json};
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::{
    agent::{AgentRuntime, SubAgentRuntime},
    binding::BoundTool,
    budget::{self, BudgetLimits},
    cancel::Cancel,
    engine::Engine,
    error::EngineError,
    events::{Events, RunRef},
    observer::Observer,
    writer::{Attempt, Reading, append_fresh},
};

/// Drives a run until it closes or can no longer advance: the engine's loop, handed to the
/// tool batch so that a child run is driven by the same loop while no point names the driver.
pub(crate) trait Pilot: Send + Sync {
    /// Drives `run` of `agent` (see `Engine::drive_with`).
    fn drive<'a>(
        &'a self,
        run: &'a RunRef,
        agent: &'a AgentRuntime,
        observer: &'a dyn Observer,
        cancel: Cancel,
        approver: Option<Arc<dyn Approver>>,
    ) -> BoxFuture<'a, Result<RunState, EngineError>>;
}

/// What opening and driving child runs needs: the engine (journal, ids, stop signal), its
/// loop, what the parent's pilot shares with its children (observer, approver), and the
/// parent agent's sub-agents and budget.
#[derive(Clone, Copy)]
pub(crate) struct Spawn<'a> {
    /// The engine.
    pub(crate) engine: &'a Engine,
    /// Its loop.
    pub(crate) pilot: &'a dyn Pilot,
    /// Sees the children's events as their parent's.
    pub(crate) observer: &'a dyn Observer,
    /// Decides the children's approvals inline, as their parent's.
    pub(crate) approver: Option<&'a Arc<dyn Approver>>,
    /// The parent agent's sub-agents.
    pub(crate) subagents: &'a [SubAgentRuntime],
    /// The parent agent's budget.
    pub(crate) budget: Option<&'a BudgetLimits>,
}

/// Appended to a sub-agent's description, for the model that may call it.
pub const AGENT_HINT: &str = "This tool hands a task to another agent, which does not see this \
conversation: write in `message` everything it needs. Only its final answer comes back.";

/// The declaration of a sub-agent as a tool: the engine intercepts its calls and drives them as
/// child runs, so [`Tool::call`] is never how a sub-agent runs.
#[derive(Debug)]
struct SubAgentTool {
    spec: ToolSpec,
}

impl Tool for SubAgentTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(
        &self,
        _ctx: ToolContext,
        _arguments: Value,
    ) -> BoxFuture<'_, Result<ToolOutput, ToolError>> {
        let name = self.spec.name.clone();
        Box::pin(async move {
            Err(ToolError::new(format!(
                "the sub-agent {name} runs as a child run driven by the engine, not as a plain \
                 tool call"
            )))
        })
    }
}

/// The tools offered for an agent's sub-agents to a run at `depth`: none once the depth
/// reaches the agent's `max_depth` (a call then is refused as an unknown tool).
pub(crate) fn offered(agent: &AgentRuntime, depth: u32) -> Vec<BoundTool> {
    if depth >= agent.max_depth {
        return Vec::new();
    }
    let declarations = ToolDeclarations {
        side_effects: SideEffects::Irreversible,
        idempotent: true,
        ..ToolDeclarations::default()
    };
    let input_schema = json!({
        "type": "object",
        "properties": {
            "message": {
                "type": "string",
                "minLength": 1,
                "description": "The task, with everything the agent needs to do it."
            }
        },
        "required": ["message"],
        "additionalProperties": false
    });
    agent
        .subagents
        .iter()
        .filter_map(|sub| {
            let description = if sub.description.trim().is_empty() {
                AGENT_HINT.to_owned()
            } else {
                format!("{}\n\n{AGENT_HINT}", sub.description.trim_end())
            };
            let tool = SubAgentTool {
                spec: ToolSpec {
                    name: sub.name.clone(),
                    description: description.clone(),
                    input_schema: input_schema.clone(),
                    kind: ToolKind::Agent,
                    declarations: declarations.clone(),
                },
            };
            match BoundTool::new(Arc::new(tool), declarations.clone(), description) {
                Ok(bound) => Some(bound),
                Err(error) => {
                    tracing::warn!(subagent = %sub.name, %error, "sub-agent not offered");
                    None
                }
            }
        })
        .collect()
}

/// The child run a launched call drives: the one its `tool.called` already names (a re-played
/// call), else a new id; `None` when the call is not a sub-agent's.
pub(crate) fn child_id(
    spawn: &Spawn<'_>,
    events: Events<'_>,
    tool: &BoundTool,
    call: &PendingCall,
) -> Option<String> {
    let is_subagent = tool.tool.spec().kind == ToolKind::Agent
        && spawn.subagents.iter().any(|s| s.name == call.name);
    is_subagent.then(|| call.child_run_id.clone().unwrap_or_else(|| events.uuid()))
}

/// How a child run ended, for its parent.
#[derive(Debug)]
pub(crate) enum ChildEnd {
    /// The child closed (completed or failed): its result, and its consumption to roll up.
    Answered {
        output: Box<ToolOutput>,
        usage: Usage,
        cost_usd: f64,
    },
    /// The child waits for a human (or for its own children): the parent waits for it.
    Waiting,
    /// The child was cancelled: the parent is cancelled too.
    Cancelled { usage: Usage, cost_usd: f64 },
    /// The engine is stopping ([`crate::StopSignal`]): the child stopped at a safe point,
    /// open; the parent's call stays open and driving the parent again resumes the child.
    Stopped,
}

impl ChildEnd {
    /// The result journaled for the call, with the consumption to roll up (`None` for a child
    /// that waits: its call stays open).
    pub(crate) fn result(self, name: &str) -> Option<(ToolOutput, Usage, f64)> {
        match self {
            ChildEnd::Answered {
                output,
                usage,
                cost_usd,
            } => Some((*output, usage, cost_usd)),
            ChildEnd::Cancelled { usage, cost_usd } => Some((
                ToolOutput::error(format!("The sub-agent {name} was cancelled.")),
                usage,
                cost_usd,
            )),
            ChildEnd::Waiting | ChildEnd::Stopped => None,
        }
    }
}

/// A child run driven to where it stops, with the index of its call in the batch.
#[derive(Debug)]
pub(crate) struct ChildDone {
    pub(crate) index: usize,
    pub(crate) end: Result<ChildEnd, EngineError>,
    pub(crate) latency_ms: f64,
}

/// The child runs of one batch, driven concurrently with its tools.
pub(crate) type Children<'a> =
    FuturesUnordered<Pin<Box<dyn Future<Output = ChildDone> + Send + 'a>>>;

/// What finished next in a batch.
pub(crate) enum Next<T> {
    /// A tool task.
    Tool(Result<T, JoinError>),
    /// A child run.
    Child(Box<ChildDone>),
    /// Nothing is left running.
    Empty,
}

/// The next tool task or child run of the batch to finish.
pub(crate) async fn next<T: Send + 'static>(
    running: &mut JoinSet<T>,
    children: &mut Children<'_>,
) -> Next<T> {
    tokio::select! {
        Some(joined) = running.join_next(), if !running.is_empty() => Next::Tool(joined),
        Some(done) = children.next(), if !children.is_empty() => Next::Child(Box::new(done)),
        else => Next::Empty,
    }
}

/// Stops the batch's child runs (each closes itself as cancelled, reason `parent`) and waits
/// until they have.
pub(crate) async fn stop(
    cancel: &CancellationToken,
    children: &mut Children<'_>,
) -> Vec<ChildDone> {
    cancel.cancel();
    let mut done = Vec::with_capacity(children.len());
    while let Some(child) = children.next().await {
        done.push(child);
    }
    done
}

/// Sets the consumption of a sub-agent on its `tool.completed`.
pub(crate) fn rolled_up(payload: Payload, usage: Usage, cost_usd: f64) -> Payload {
    match payload {
        Payload::ToolCompleted(mut completed) => {
            completed.usage = Some(usage);
            completed.cost_usd = cost_usd;
            Payload::ToolCompleted(completed)
        }
        other => other,
    }
}

/// What opening a child run needs to know of its parent.
struct Opening {
    run: RunRef,
    root_run_id: String,
    parent_run_id: String,
    parent_call_id: String,
    /// The span of the parent's call: the parent span of the child's `run.started`.
    parent_span: String,
    depth: u32,
    judges: String,
    budget: Option<RunBudget>,
    message: Option<String>,
}

/// The child run of call `call` (its `tool.called` in span `span` names `child_run_id`):
/// opened unless it exists, then driven until it closes or waits.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch<'d>(
    spawn: &Spawn<'d>,
    run: &RunRef,
    state: &RunState,
    call: &PendingCall,
    span: &str,
    child_run_id: &str,
    arguments: &Value,
    index: usize,
    cancel: CancellationToken,
) -> Pin<Box<dyn Future<Output = ChildDone> + Send + 'd>> {
    let spawn = *spawn;
    let sub = spawn
        .subagents
        .iter()
        .find(|s| s.name == call.name)
        .cloned();
    // The child's budget: its share of what remains of the parent's limits (the agent's,
    // tightened by the parent's own share).
    let budget = sub.as_ref().and_then(|s| s.budget_share).and_then(|part| {
        budget::share(
            &budget::run_limits(spawn.budget, state),
            budget::Spent::of(state),
            part,
        )
    });
    let opening = Opening {
        run: RunRef {
            tenant_id: run.tenant_id.clone(),
            session_id: run.session_id.clone(),
            run_id: child_run_id.to_owned(),
        },
        root_run_id: state.root_run_id.clone(),
        parent_run_id: state.run_id.clone(),
        parent_call_id: call.call_id.clone(),
        parent_span: span.to_owned(),
        depth: state.depth + 1,
        judges: state.judges.clone(),
        budget,
        message: arguments
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_owned),
    };
    let name = call.name.clone();
    Box::pin(async move {
        let started = Instant::now();
        let end = match sub {
            Some(sub) => run_child(spawn, cancel, sub, opening).await,
            None => Err(EngineError::Invalid(format!("no sub-agent named '{name}'"))),
        };
        ChildDone {
            index,
            end,
            latency_ms: started.elapsed().as_secs_f64() * 1000.0,
        }
    })
}

async fn run_child(
    spawn: Spawn<'_>,
    cancel: CancellationToken,
    sub: SubAgentRuntime,
    opening: Opening,
) -> Result<ChildEnd, EngineError> {
    let engine = spawn.engine;
    if !engine
        .open_child(&sub.agent, &opening, spawn.observer)
        .await?
    {
        return Ok(ChildEnd::Answered {
            output: Box::new(ToolOutput::error(format!(
                "The sub-agent {} needs a non-empty `message` (a string) describing its task.",
                sub.name
            ))),
            usage: Usage::default(),
            cost_usd: 0.0,
        });
    }
    let state = spawn
        .pilot
        .drive(
            &opening.run,
            &sub.agent,
            spawn.observer,
            Cancel::from(&cancel),
            spawn.approver.cloned(),
        )
        .await?;
    let waits = matches!(state.status, RunStatus::Paused | RunStatus::WaitingChild);
    if engine.stop_signal().is_requested() && !state.finished && !waits {
        return Ok(ChildEnd::Stopped);
    }
    end_of(&sub.name, &state)
}

/// What the state a child's drive returned means for its parent.
fn end_of(name: &str, state: &RunState) -> Result<ChildEnd, EngineError> {
    let (usage, cost_usd) = (state.usage, state.cost_usd);
    match state.status {
        RunStatus::Completed if state.finished => {
            let mut output = ToolOutput::text(state.output_text().unwrap_or_default());
            output.data = state.output_data.clone();
            output.unverified = state.unverified;
            output.fallback = state.fallback;
            Ok(ChildEnd::Answered {
                output: Box::new(output),
                usage,
                cost_usd,
            })
        }
        RunStatus::Failed if state.finished => Ok(ChildEnd::Answered {
            output: Box::new(ToolOutput::error(format!(
                "The sub-agent {name} failed ({}): {}",
                state.error_type.as_deref().unwrap_or("error"),
                state.error.as_deref().unwrap_or("no message")
            ))),
            usage,
            cost_usd,
        }),
        RunStatus::Cancelled if state.finished => Ok(ChildEnd::Cancelled { usage, cost_usd }),
        RunStatus::Paused | RunStatus::WaitingChild if !state.finished => Ok(ChildEnd::Waiting),
        other => Err(EngineError::Invalid(format!(
            "sub-run {} stopped in state {other} without closing",
            state.run_id
        ))),
    }
}

impl Engine {
    /// Writes the child's `run.started` and `message.user` in one batch, unless the child run
    /// exists (a re-played call resumes it). `false` when it does not exist and the call gave
    /// no usable message.
    async fn open_child(
        &self,
        agent: &AgentRuntime,
        opening: &Opening,
        observer: &dyn Observer,
    ) -> Result<bool, EngineError> {
        let run = &opening.run;
        let parent = RunRef {
            run_id: opening.parent_run_id.clone(),
            ..run.clone()
        };
        let reading = Reading::Run(&parent);
        let (opened, written) = append_fresh(self.store.as_ref(), run, reading, |events| {
            if events.iter().any(|e| e.run_id == run.run_id) {
                return Ok(Attempt::Done(true));
            }
            let Some(text) = opening.message.as_deref().filter(|t| !t.is_empty()) else {
                return Ok(Attempt::Done(false));
            };
            // The child runs for the same end user as its parent.
            let context = events
                .iter()
                .find_map(|e| match &e.payload {
                    Payload::RunStarted(started) if e.run_id == opening.parent_run_id => {
                        Some(started.context.clone())
                    }
                    _ => None,
                })
                .unwrap_or_else(|| RunContext {
                    tenant_id: run.tenant_id.clone(),
                    user_id: None,
                    metadata: Map::new(),
                });
            let span = self.ids.uuid();
            let child = self.events(run, &agent.name, &opening.root_run_id);
            let batch = vec![
                child.event(
                    &span,
                    Some(&opening.parent_span),
                    None,
                    Payload::RunStarted(RunStarted {
                        kind: "normal".into(),
                        context,
                        parent_run_id: Some(opening.parent_run_id.clone()),
                        parent_call_id: Some(opening.parent_call_id.clone()),
                        depth: opening.depth,
                        triggered_by: None,
                        trigger: None,
                        judges: opening.judges.clone(),
                        budget: opening.budget.clone(),
                        state: Map::new(),
                    }),
                ),
                child.event(
                    &span,
                    None,
                    None,
                    Payload::MessageUser(MessageUser {
                        message: Message::user(text),
                        kind: "request".into(),
                        policy: None,
                        tools: true,
                    }),
                ),
            ];
            Ok(Attempt::Write(batch, true))
        })
        .await?;
        if !written.is_empty() {
            for event in &written {
                observer.event(event);
            }
            tracing::debug!(run_id = %run.run_id, parent_run_id = %opening.parent_run_id, agent = %agent.name, "sub-run opened");
        }
        Ok(opened)
    }
}
