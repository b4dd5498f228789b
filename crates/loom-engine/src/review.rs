//! Decisions on the orchestrator's answers: the `after_model` point, the final output's guards
//! (`on_output`: contract, then judges (`judges.rs`), then the agent's policies), and the
//! repairs they ask for.
//!
//! These are decisions, written outside any step in the run's root span. A guard or policy
//! that refuses an answer journals `policy.decided` (retry); the next decision writes the
//! repair (`message.user` of kind `repair`, after closing the refused answer's tool calls), and
//! the model that produced the answer gets it back with the diagnostic.

use loom_core::{
    Event, Message, RunState, RunStatus,
    event::{GuardChecked, MessageUser, Payload, RunCompleted},
    policy::{DecisionKind, Point, Subject},
    state::REPAIR,
    tool::ToolOutput,
};
use serde_json::Value;

use crate::{
    EngineError,
    contract::{OnFailure, RepairTools, Verdict},
    driver::Driver,
    hooks::{self, End},
    writer::SessionWriter,
};

/// Name of the built-in contract policy.
pub(crate) const CONTRACT: &str = "loom.contract";

/// The final output as the guards leave it.
pub(crate) struct Final {
    /// The output message (`None`: the output is a terminal tool's result, kept as is).
    pub(crate) message: Option<Message>,
    /// The `tool.completed` whose result is the output (terminal roles).
    pub(crate) output_event_id: Option<String>,
    /// Structured output (validated against the contract's schema).
    pub(crate) data: Option<Value>,
}

/// What a guard made of the output.
pub(crate) enum Guarded {
    /// The output goes on.
    Pass,
    /// The events are written and the run is repaired or failed: nothing more to do.
    Done,
}

impl Driver<'_> {
    /// Writes the repair a policy asked for: the refused answer's open calls are closed
    /// without running, then the diagnostic goes to the model as a user message.
    pub(crate) fn repair(&self, state: &RunState) -> Option<Vec<Event>> {
        let repair = state.pending_repair.as_ref()?;
        let span = state.run_span_id.clone();
        let mut batch: Vec<Event> = state
            .pending_calls
            .iter()
            .map(|call| {
                let call_span = self.engine.ids().uuid();
                self.event(
                    &call_span,
                    Some(&span),
                    None,
                    crate::tools::completed_payload(
                        call,
                        ToolOutput::error(hooks::not_run_refused(&repair.policy)),
                        0.0,
                    ),
                )
            })
            .collect();
        batch.push(self.event(
            &span,
            None,
            None,
            Payload::MessageUser(MessageUser {
                message: Message::user(hooks::repair_text(&repair.policy, &repair.feedback)),
                kind: REPAIR.into(),
                policy: Some(repair.policy.clone()),
                tools: repair.tools,
            }),
        ));
        if state.status == RunStatus::AwaitingTools {
            let to = if state.iterations >= self.agent.max_iterations {
                RunStatus::Finalizing
            } else {
                RunStatus::ReadyForModel
            };
            batch.push(self.transition(state, to, "policy.decided", self.last_ids.policy.clone()));
        }
        Some(batch)
    }

    /// The orchestrator answered: `after_model` policies, then either the tool batch or the
    /// final output.
    pub(crate) async fn review(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
    ) -> Result<(), EngineError> {
        let finalizing = state.status == RunStatus::Finalizing;
        let Some(answer) = state.messages.last().cloned() else {
            return Ok(());
        };
        let cause = self.last_ids.model.clone();
        let chain = hooks::run(self, state, Subject::Response(answer.clone()), None).await;
        let span = state.run_span_id.clone();
        let mut batch: Vec<Event> = chain
            .decisions
            .into_iter()
            .map(|payload| self.event(&span, None, None, payload))
            .collect();
        match chain.end {
            End::Retry { .. } => return self.write(state, writer, batch).await.map(drop),
            End::Fail { error_type, reason } => {
                batch.extend(self.failure(state, "policy.decided", &error_type, &reason));
                return self.write(state, writer, batch).await.map(drop);
            }
            // A stop closes the answer's calls and finishes without tools; an answer without
            // calls is already final (reference §3.3).
            End::Stop { reason, .. } if !finalizing && !state.pending_calls.is_empty() => {
                for call in &state.pending_calls {
                    let call_span = self.engine.ids().uuid();
                    batch.push(self.event(
                        &call_span,
                        Some(&span),
                        None,
                        crate::tools::completed_payload(
                            call,
                            ToolOutput::error(hooks::not_run_stopped(&reason)),
                            0.0,
                        ),
                    ));
                }
                let cause = batch
                    .iter()
                    .rev()
                    .find(|e| matches!(e.payload, Payload::PolicyDecided(_)))
                    .map(|e| e.event_id.clone());
                batch.push(self.transition(state, RunStatus::Finalizing, "policy.decided", cause));
                return self.write(state, writer, batch).await.map(drop);
            }
            _ => {}
        }
        if !state.pending_calls.is_empty() && !finalizing {
            batch.push(self.transition(state, RunStatus::AwaitingTools, "model.responded", cause));
            return self.write(state, writer, batch).await.map(drop);
        }
        if !batch.is_empty() {
            self.write(state, writer, batch).await?;
        }
        let output = Final {
            message: Some(answer),
            output_event_id: None,
            data: None,
        };
        self.finish(state, writer, output, "model.responded", cause)
            .await
    }

    /// The final output: the agent's contract, then its judges, then its `on_output` policies;
    /// the run completes with what they let through, or goes back to the model for a repair,
    /// or fails.
    pub(crate) async fn finish(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
        mut output: Final,
        cause: &str,
        cause_event_id: Option<String>,
    ) -> Result<(), EngineError> {
        if let Guarded::Done = self.output_contract(state, writer, &mut output).await? {
            return Ok(());
        }
        if let Guarded::Done = self.output_judges(state, writer, &mut output).await? {
            return Ok(());
        }
        let span = state.run_span_id.clone();
        let subject = output
            .message
            .clone()
            .unwrap_or_else(|| terminal_message(state));
        let chain = hooks::run(self, state, Subject::Output(subject), None).await;
        let mut batch: Vec<Event> = chain
            .decisions
            .into_iter()
            .map(|payload| self.event(&span, None, None, payload))
            .collect();
        match chain.end {
            End::Retry { .. } => return self.write(state, writer, batch).await.map(drop),
            End::Fail { error_type, reason } => {
                batch.extend(self.failure(state, "policy.decided", &error_type, &reason));
                return self.write(state, writer, batch).await.map(drop);
            }
            _ => {}
        }
        if chain.replaced
            && let Subject::Output(message) = chain.subject
        {
            output.message = Some(message);
            output.output_event_id = None;
            // The contract's data described the text that was replaced.
            output.data = None;
        }
        // The decisions and the completion they allow go to the journal in one append.
        let done = self.transition(state, RunStatus::Completed, cause, cause_event_id);
        let completed = self.event(
            &span,
            None,
            None,
            Payload::RunCompleted(RunCompleted {
                output: output.message,
                output_event_id: output.output_event_id,
                iterations: state.iterations,
                usage: state.usage,
                cost_usd: state.cost_usd,
                data: output.data,
                unverified: state.unverified,
                fallback: state.fallback,
            }),
        );
        batch.extend([done, completed]);
        self.write(state, writer, batch).await.map(drop)
    }

    /// The agent's output contract (`loom.contract`) on the final output: a pass may
    /// normalize it and give its structured data; a failure is repaired by the model within
    /// `repair.max_attempts`, then `on_failure` decides.
    async fn output_contract(
        &mut self,
        state: &mut RunState,
        writer: &mut SessionWriter<'_>,
        output: &mut Final,
    ) -> Result<Guarded, EngineError> {
        let Some(contract) = self.agent.output.clone() else {
            return Ok(Guarded::Pass);
        };
        let span = state.run_span_id.clone();
        let text = match &output.message {
            Some(message) => message.text(),
            None => terminal_message(state).text(),
        };
        let attempt = state.retries.get(CONTRACT).copied().unwrap_or(0);
        let checked = |outcome: &str, reason, normalized, resolution| {
            contract_checked(
                "output",
                attempt + 1,
                None,
                outcome,
                reason,
                normalized,
                resolution,
            )
        };
        match contract.check(&text, None) {
            Verdict::Passed {
                text: normalized_text,
                data,
                normalized,
            } => {
                let mut batch =
                    vec![self.event(&span, None, None, checked("passed", None, normalized, None))];
                if normalized {
                    let message = Message::assistant(normalized_text);
                    let payload = hooks::output_replaced(
                        CONTRACT,
                        "output normalized (code fence or surrounding text removed)".into(),
                        &message,
                    );
                    batch.push(self.event(&span, None, None, payload));
                    output.message = Some(message);
                    output.output_event_id = None;
                }
                output.data = data;
                self.write(state, writer, batch).await?;
                Ok(Guarded::Pass)
            }
            Verdict::Failed {
                problems,
                diagnostic,
            } => {
                let spec = contract.spec();
                if attempt < spec.repair.max_attempts {
                    let mut decided = hooks::decided(
                        CONTRACT,
                        Point::OnOutput,
                        DecisionKind::Retry,
                        Some(diagnostic.clone()),
                        None,
                        false,
                    );
                    if let Payload::PolicyDecided(p) = &mut decided {
                        p.attempt = Some(attempt + 1);
                        // A contract repair rewrites the answer: tools only when allowed.
                        p.tools = Some(spec.repair.tools == RepairTools::Allowed);
                    }
                    let batch = vec![
                        self.event(
                            &span,
                            None,
                            None,
                            checked("failed", Some(diagnostic), false, Some("retry")),
                        ),
                        self.event(&span, None, None, decided),
                    ];
                    self.write(state, writer, batch).await?;
                    return Ok(Guarded::Done);
                }
                let summary = problems.join("; ");
                let resolution = spec.on_failure.as_str();
                let mut batch = vec![self.event(
                    &span,
                    None,
                    None,
                    checked("failed", Some(diagnostic), false, Some(resolution)),
                )];
                match spec.on_failure {
                    OnFailure::Fail => {
                        batch.extend(self.failure(
                            state,
                            "guard.checked",
                            "guard.contract",
                            &format!("the final answer does not meet its contract: {summary}"),
                        ));
                        self.write(state, writer, batch).await?;
                        Ok(Guarded::Done)
                    }
                    OnFailure::Unverified => {
                        self.write(state, writer, batch).await?;
                        Ok(Guarded::Pass)
                    }
                    OnFailure::Fallback => {
                        let message =
                            Message::assistant(spec.fallback_message.clone().unwrap_or_default());
                        let payload = hooks::output_replaced(
                            CONTRACT,
                            format!("fallback message after a failed contract: {summary}"),
                            &message,
                        );
                        batch.push(self.event(&span, None, None, payload));
                        output.message = Some(message);
                        output.output_event_id = None;
                        self.write(state, writer, batch).await?;
                        Ok(Guarded::Pass)
                    }
                }
            }
        }
    }
}

/// The `guard.checked` of an output contract (`loom.contract`) on `target` (`output`,
/// `role:<name>`, `tool:<name>`).
pub(crate) fn contract_checked(
    target: &str,
    attempt: u32,
    call_id: Option<&str>,
    outcome: &str,
    reason: Option<String>,
    normalized: bool,
    resolution: Option<&str>,
) -> Payload {
    Payload::GuardChecked(GuardChecked {
        guard: "contract".into(),
        target: target.into(),
        outcome: outcome.into(),
        reason,
        attempt: Some(attempt),
        normalized,
        resolution: resolution.map(str::to_owned),
        policy: Some(CONTRACT.into()),
        call_id: call_id.map(str::to_owned),
    })
}

/// The output of a terminal tool call as an assistant message: the last tool result's blocks.
pub(crate) fn terminal_message(state: &RunState) -> Message {
    state
        .messages
        .iter()
        .rev()
        .find_map(|m| {
            m.blocks.iter().find_map(|b| match &b.kind {
                loom_core::BlockKind::ToolResult { output, .. } => {
                    Some(Message::assistant(output.visible_text()))
                }
                _ => None,
            })
        })
        .unwrap_or_else(|| Message::assistant(""))
}
