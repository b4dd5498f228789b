//! What every result of a batch goes through on its way to the journal: the `after_tool` point
//! (the tool's output contract, then the agent's policies), the `loom.terminal` note of a
//! terminal role that was not alone in its turn, the session-state writes of the result
//! (accepted in `output.state`, refused in `output.state_refused`), the offload of a large
//! result, then `tool.completed` with what the call consumed.

use loom_core::{
    Event, RunState, Usage,
    event::Payload,
    policy::Subject,
    state::PendingCall,
    tool::{ToolKind, ToolOutput},
};

use super::{Batch, Frame, launch::Launched};
use crate::{
    binding::BoundTool,
    contract::Verdict,
    error::EngineError,
    events::completed_payload,
    hooks::{self, End},
    io::Io,
    offload,
    output::contract_checked,
    roles,
    subagents::{self, ChildDone},
};

/// What a call consumed, restated on its `tool.completed`.
pub(super) enum Consumption {
    /// Nothing (a plain tool).
    None,
    /// The cost of a role's model calls (already counted by their `model.responded`).
    Role(f64),
    /// A sub-agent's child run, rolled up (counted by the parent from `tool.completed`).
    Child(Usage, f64),
}

/// What became of a result on its way to the journal.
pub(super) enum Finished {
    /// The events to write: the `after_tool` decisions, `artifact.stored` when the result was
    /// offloaded, then `tool.completed`.
    Completed(Vec<Event>),
    /// A policy failed the run: the events (ending with `tool.completed`), then the failure.
    Failed {
        events: Vec<Event>,
        error_type: String,
        reason: String,
    },
}

/// One call whose result came.
pub(super) struct Call<'c> {
    pub(super) span: &'c str,
    pub(super) call: &'c PendingCall,
    pub(super) tool: &'c BoundTool,
    /// Whether the `after_tool` policies already decided on the result (a role's answer,
    /// checked in the role's call, where a `retry` is repaired by its model).
    pub(super) checked: bool,
}

impl Call<'_> {
    /// The end of the call (see the module documentation).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn finish(
        &self,
        io: &Io<'_>,
        batch: &Batch<'_>,
        state: &RunState,
        frame: &Frame,
        output: ToolOutput,
        latency: f64,
        consumption: Consumption,
    ) -> Result<Finished, EngineError> {
        let completed = |output| {
            let payload = completed_payload(self.call, output, latency);
            let payload = match &consumption {
                Consumption::None => payload,
                Consumption::Role(cost) => match payload {
                    Payload::ToolCompleted(mut p) => {
                        p.cost_usd = *cost;
                        Payload::ToolCompleted(p)
                    }
                    other => other,
                },
                Consumption::Child(usage, cost) => subagents::rolled_up(payload, *usage, *cost),
            };
            self.event(io, frame, payload)
        };
        let (output, mut events) = match self.after_tool(io, batch, state, frame, output).await {
            AfterTool::Result { output, events } => (output, events),
            AfterTool::Failed {
                mut output,
                mut events,
                error_type,
                reason,
            } => {
                batch
                    .agent
                    .state
                    .fill(&self.call.name, &mut output, &io.session_state);
                events.push(completed(output));
                return Ok(Finished::Failed {
                    events,
                    error_type,
                    reason,
                });
            }
        };
        if let Some(payload) = roles::not_alone(&batch.agent.roles, state, self.call) {
            events.push(self.event(io, frame, payload));
        }
        // The session-state writes of the result, checked before it is journaled.
        let mut output = output;
        batch
            .agent
            .state
            .fill(&self.call.name, &mut output, &io.session_state);
        let output = match (offload_limit(batch, self.tool), batch.artifacts) {
            (Some(limit), Some(store)) => {
                let run = io.events().run();
                let moved = offload::offload(
                    store.as_ref(),
                    &run.tenant_id,
                    &run.session_id,
                    &self.call.name,
                    &self.call.call_id,
                    &output,
                    limit,
                )
                .await?;
                match moved {
                    Some((stored, preview)) => {
                        events.push(self.event(io, frame, Payload::ArtifactStored(stored)));
                        preview
                    }
                    None => output,
                }
            }
            _ => output,
        };
        events.push(completed(output));
        Ok(Finished::Completed(events))
    }

    /// An event of the call, in its span under the step's.
    fn event(&self, io: &Io<'_>, frame: &Frame, payload: Payload) -> Event {
        io.event(self.span, Some(&frame.step.span), None, payload)
    }

    /// The `after_tool` point: the tool's output contract (a result that breaks it becomes an
    /// error with the diagnostic: a tool is never repaired), then the agent's policies (unless
    /// they already decided, in a role's call: `checked`). A `retry` on a plain tool's result
    /// becomes the error result "Result refused (<policy>): <feedback>".
    async fn after_tool(
        &self,
        io: &Io<'_>,
        batch: &Batch<'_>,
        state: &RunState,
        frame: &Frame,
        output: ToolOutput,
    ) -> AfterTool {
        let (call, tool) = (self.call, self.tool);
        let mut events = Vec::new();
        let mut output = output;
        if let Some(contract) = &tool.contract
            && !output.is_error
        {
            let target = format!("tool:{}", call.name);
            let checked = |outcome: &str, reason, normalized, resolution| {
                contract_checked(
                    &target,
                    1,
                    Some(&call.call_id),
                    outcome,
                    reason,
                    normalized,
                    resolution,
                )
            };
            match contract.check(&output.visible_text(), output.data.as_ref()) {
                Verdict::Passed {
                    text,
                    data,
                    normalized,
                } => {
                    events.push(self.event(io, frame, checked("passed", None, normalized, None)));
                    if normalized {
                        let mut checked_output = ToolOutput::text(text);
                        checked_output.data = data.or(output.data.take());
                        output = checked_output;
                    }
                }
                Verdict::Failed { diagnostic, .. } => {
                    events.push(self.event(
                        io,
                        frame,
                        checked("failed", Some(diagnostic.clone()), false, Some("fail")),
                    ));
                    output = ToolOutput::error(format!(
                        "The result of {} was refused by its output contract (a rule of the \
                         configuration, not a failure): {diagnostic}",
                        call.name
                    ));
                }
            }
        }
        if self.checked {
            return AfterTool::Result { output, events };
        }
        let subject = Subject::Result {
            tool: call.name.clone(),
            call_id: call.call_id.clone(),
            output: output.clone(),
        };
        let chain = hooks::run(
            &batch.agent.policies,
            &io.events(),
            state,
            subject,
            Some(&call.call_id),
        )
        .await;
        events.extend(
            chain
                .decisions
                .into_iter()
                .map(|payload| self.event(io, frame, payload)),
        );
        if chain.replaced
            && let Subject::Result {
                output: replaced, ..
            } = chain.subject
        {
            output = replaced;
        }
        match chain.end {
            End::Retry {
                policy, feedback, ..
            } => AfterTool::Result {
                output: ToolOutput::error(hooks::result_refused(&policy, &feedback)),
                events,
            },
            End::Fail { error_type, reason } => AfterTool::Failed {
                output,
                events,
                error_type,
                reason,
            },
            _ => AfterTool::Result { output, events },
        }
    }
}

/// What the `after_tool` point made of a result.
enum AfterTool {
    /// The result to journal, after the events that decided it.
    Result {
        output: ToolOutput,
        events: Vec<Event>,
    },
    /// A policy failed the run.
    Failed {
        output: ToolOutput,
        events: Vec<Event>,
        error_type: String,
        reason: String,
    },
}

/// The size above which this tool's results are offloaded (never for built-in tools nor
/// terminal roles, whose result may be the final answer).
fn offload_limit(batch: &Batch<'_>, tool: &BoundTool) -> Option<u64> {
    if tool.tool.spec().kind == ToolKind::Builtin
        || roles::is_terminal(&batch.agent.roles, tool.name())
    {
        return None;
    }
    tool.declarations.offload_over.or(batch.agent.offload_over)
}

/// The results of sub-agent calls whose child runs were stopped with the batch (a child that
/// waits keeps its call open: closing the parent cancels it).
pub(super) fn stopped_children(
    io: &Io<'_>,
    frame: &Frame,
    launched: &[Launched],
    stopped: Vec<ChildDone>,
) -> Vec<Event> {
    stopped
        .into_iter()
        .filter_map(|done| {
            let Launched { span, call, .. } = &launched[done.index];
            let end = match done.end {
                Ok(end) => end,
                Err(error) => {
                    tracing::warn!(run_id = %io.events().run().run_id, call_id = %call.call_id, %error, "sub-run stopped with an error");
                    return None;
                }
            };
            let (output, usage, cost) = end.result(&call.name)?;
            Some(io.event(
                span,
                Some(&frame.step.span),
                None,
                subagents::rolled_up(completed_payload(call, output, done.latency_ms), usage, cost),
            ))
        })
        .collect()
}
