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
    event::{Payload, RunCompleted},
    policy::{DecisionKind, Point, Subject},
    tool::ToolOutput,
};

use crate::{
    binding::BoundPolicy,
    contract::{Contract, OnFailure, RepairTools, Verdict},
    error::EngineError,
    events::completed_payload,
    hooks::{self, End},
    io::Io,
    judging::{self, Judging},
    output::{CONTRACT, Final, Guarded, contract_checked, terminal_message},
};

/// What the guards of the orchestrator's answers read: the agent's policies, the contract of
/// its final output, its judges.
pub(crate) struct Guards<'a> {
    /// The agent's policies (those hooked on `after_model` and `on_output` run here).
    pub(crate) policies: &'a [BoundPolicy],
    /// The contract of the final output.
    pub(crate) output: Option<&'a Contract>,
    /// The judges of the final output.
    pub(crate) judges: Judging<'a>,
    /// The markers a compaction summary must keep (the `_compaction` agent only).
    pub(crate) fidelity: Option<&'a crate::fidelity::Fidelity>,
}

/// The orchestrator answered: `after_model` policies, then either the tool batch or the
/// final output.
pub(crate) async fn after_model(
    io: &mut Io<'_>,
    guards: &Guards<'_>,
    state: &mut RunState,
) -> Result<(), EngineError> {
    let finalizing = state.status == RunStatus::Finalizing;
    let Some(answer) = state.messages.last().cloned() else {
        return Ok(());
    };
    let cause = io.last_ids.model.clone();
    let chain = hooks::run(
        guards.policies,
        &io.events(),
        state,
        Subject::Response(answer.clone()),
        None,
    )
    .await;
    let span = state.run_span_id.clone();
    let mut batch: Vec<Event> = chain
        .decisions
        .into_iter()
        .map(|payload| io.event(&span, None, None, payload))
        .collect();
    match chain.end {
        End::Retry { .. } => return io.write(state, batch).await.map(drop),
        End::Fail { error_type, reason } => {
            batch.extend(
                io.events()
                    .failure(state, "policy.decided", &error_type, &reason),
            );
            return io.write(state, batch).await.map(drop);
        }
        // A stop closes the answer's calls and finishes without tools; an answer without
        // calls is already final (reference §3.3).
        End::Stop { reason, .. } if !finalizing && !state.pending_calls.is_empty() => {
            for call in &state.pending_calls {
                let call_span = io.events().uuid();
                batch.push(io.event(
                    &call_span,
                    Some(&span),
                    None,
                    completed_payload(
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
            batch.push(io.events().transition(
                state,
                RunStatus::Finalizing,
                "policy.decided",
                cause,
            ));
            return io.write(state, batch).await.map(drop);
        }
        _ => {}
    }
    if !state.pending_calls.is_empty() && !finalizing {
        batch.push(io.events().transition(
            state,
            RunStatus::AwaitingTools,
            "model.responded",
            cause,
        ));
        return io.write(state, batch).await.map(drop);
    }
    if !batch.is_empty() {
        io.write(state, batch).await?;
    }
    let output = Final {
        message: Some(answer),
        output_event_id: None,
        data: None,
    };
    finish(io, guards, state, output, "model.responded", cause).await
}

/// The final output: the agent's contract, then its judges, then its `on_output` policies;
/// the run completes with what they let through, or goes back to the model for a repair,
/// or fails.
pub(crate) async fn finish(
    io: &mut Io<'_>,
    guards: &Guards<'_>,
    state: &mut RunState,
    mut output: Final,
    cause: &str,
    cause_event_id: Option<String>,
) -> Result<(), EngineError> {
    if let Guarded::Done = output_contract(io, guards.output, state, &mut output).await? {
        return Ok(());
    }
    if let Guarded::Done = crate::fidelity::guard(io, guards.fidelity, state, &output).await? {
        return Ok(());
    }
    if let Guarded::Done = judging::run(io, &guards.judges, state, &mut output).await? {
        return Ok(());
    }
    let span = state.run_span_id.clone();
    let subject = output
        .message
        .clone()
        .unwrap_or_else(|| terminal_message(state));
    let chain = hooks::run(
        guards.policies,
        &io.events(),
        state,
        Subject::Output(subject),
        None,
    )
    .await;
    let mut batch: Vec<Event> = chain
        .decisions
        .into_iter()
        .map(|payload| io.event(&span, None, None, payload))
        .collect();
    match chain.end {
        End::Retry { .. } => return io.write(state, batch).await.map(drop),
        End::Fail { error_type, reason } => {
            batch.extend(
                io.events()
                    .failure(state, "policy.decided", &error_type, &reason),
            );
            return io.write(state, batch).await.map(drop);
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
    let done = io
        .events()
        .transition(state, RunStatus::Completed, cause, cause_event_id);
    let completed = io.event(
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
    io.write(state, batch).await.map(drop)
}

/// The agent's output contract (`loom.contract`) on the final output: a pass may
/// normalize it and give its structured data; a failure is repaired by the model within
/// `repair.max_attempts`, then `on_failure` decides.
async fn output_contract(
    io: &mut Io<'_>,
    contract: Option<&Contract>,
    state: &mut RunState,
    output: &mut Final,
) -> Result<Guarded, EngineError> {
    let Some(contract) = contract else {
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
                vec![io.event(&span, None, None, checked("passed", None, normalized, None))];
            if normalized {
                let message = Message::assistant(normalized_text);
                let payload = hooks::output_replaced(
                    CONTRACT,
                    "output normalized (code fence or surrounding text removed)".into(),
                    &message,
                );
                batch.push(io.event(&span, None, None, payload));
                output.message = Some(message);
                output.output_event_id = None;
            }
            output.data = data;
            io.write(state, batch).await?;
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
                    io.event(
                        &span,
                        None,
                        None,
                        checked("failed", Some(diagnostic), false, Some("retry")),
                    ),
                    io.event(&span, None, None, decided),
                ];
                io.write(state, batch).await?;
                return Ok(Guarded::Done);
            }
            let summary = problems.join("; ");
            let resolution = spec.on_failure.as_str();
            let mut batch = vec![io.event(
                &span,
                None,
                None,
                checked("failed", Some(diagnostic), false, Some(resolution)),
            )];
            match spec.on_failure {
                OnFailure::Fail => {
                    batch.extend(io.events().failure(
                        state,
                        "guard.checked",
                        "guard.contract",
                        &format!("the final answer does not meet its contract: {summary}"),
                    ));
                    io.write(state, batch).await?;
                    Ok(Guarded::Done)
                }
                OnFailure::Unverified => {
                    io.write(state, batch).await?;
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
                    batch.push(io.event(&span, None, None, payload));
                    output.message = Some(message);
                    output.output_event_id = None;
                    io.write(state, batch).await?;
                    Ok(Guarded::Pass)
                }
            }
        }
    }
}
