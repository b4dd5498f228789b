//! The guards of a role's answer, at `after_tool`, inside the batch's step: the role's output
//! contract (`loom.contract`), then its judge (`loom.judge.<name>`, the role's name unless the
//! judge is named), then the agent's `after_tool` policies, in the reference's order. Their
//! events go in the role call's span, with the call id.
//!
//! A refusal while repairs remain is repaired by the role's own model, in its own conversation
//! (the first exchange, then a repair request with the diagnostic): repairs are counted per
//! guard and call (`repair.max_attempts`). Once they are spent, `on_failure` decides what the
//! call's result is: `fail` an error result the orchestrator reads, `unverified` the answer
//! flagged, `fallback` the fallback message, flagged. A judge that errs under `on_error: block`
//! fails the run (`guard.judge`). A policy's `retry` is repaired the same way, counted per policy
//! and call (its `max_attempts`); beyond them, or on its `fail`, the run fails (`policy.<name>`)
//! once the call's result is journaled.

use loom_core::{
    RunState,
    event::Payload,
    policy::{DecisionKind, Point, Subject},
    state::PendingCall,
    tool::ToolOutput,
};
use serde_json::Value;

use crate::{
    binding::BoundPolicy,
    chain::{self, AttemptState},
    contract::{Contract, OnFailure, Verdict},
    error::EngineError,
    hooks::{self, End},
    io::{Io, StepSpan},
    judges::JudgeRuntime,
    judging::{self, Judged, Judging, Ruling},
    output::{CONTRACT, contract_checked},
};

/// One call of a role, as its guards see it.
pub(crate) struct RoleCall<'c> {
    /// The role's name.
    pub(crate) name: &'c str,
    /// The call.
    pub(crate) call: &'c PendingCall,
    /// The call's span (the guards' events go there).
    pub(crate) span: &'c str,
    /// The batch's step.
    pub(crate) step: &'c StepSpan,
    /// The call's arguments (what the role's judge reads in `<arguments>`).
    pub(crate) arguments: &'c Value,
    /// When the run's time runs out (the batch's deadline): it bounds the judge's call too.
    pub(crate) run_deadline: Option<tokio::time::Instant>,
}

/// What the guards made of a role's answer.
pub(crate) enum Guarded {
    /// The call's result: the answer (normalized) when every guard let it through; else,
    /// repairs spent, what `on_failure` made of it.
    Output(Box<ToolOutput>),
    /// The role's model repairs: the guard that asked (its policy) and its diagnostic.
    Repair {
        /// `loom.contract` or `loom.judge.<name>`.
        policy: String,
        /// What the role's model is told.
        diagnostic: String,
    },
    /// A judge erred under `on_error: block`, or a policy failed the run: the run fails once
    /// the call's result is journaled.
    Failed {
        /// The call's result.
        output: Box<ToolOutput>,
        /// The run's error type (`guard.judge`, `policy.<name>`).
        error_type: String,
        /// The error message of the run.
        reason: String,
    },
    /// Cancelled, or the run ran out of time, while a judge was called.
    Interrupted {
        /// Out of time (else cancelled).
        timed_out: bool,
    },
}

/// What a role's guards need besides the call: its contract, its judges and their calls.
pub(crate) struct Guards<'g> {
    /// The role's output contract.
    pub(crate) contract: Option<&'g Contract>,
    /// The role's judges, their models and the journal.
    pub(crate) judging: Judging<'g>,
    /// The agent's policies (those hooked on `after_tool` read the answer last).
    pub(crate) policies: &'g [BoundPolicy],
}

impl RoleCall<'_> {
    /// The role's answer `text` through its contract, its judges, then the agent's
    /// `after_tool` policies. `cost_usd` gets the cost of the judges' model calls.
    pub(crate) async fn guard(
        &self,
        io: &mut Io<'_>,
        guards: &Guards<'_>,
        state: &mut RunState,
        text: &str,
        progress: &mut AttemptState,
        cost_usd: &mut f64,
    ) -> Result<Guarded, EngineError> {
        match self
            .checks(io, guards, state, text, progress, cost_usd)
            .await?
        {
            Guarded::Output(output) => {
                self.policies(io, guards.policies, state, *output, progress)
                    .await
            }
            other => Ok(other),
        }
    }

    /// The agent's `after_tool` policies on the role's result (`policy.decided` in the call's
    /// span, with the call id): a `retry` is repaired by the role's model, a `fail` (or a
    /// `retry` beyond the policy's `max_attempts`) fails the run once the result is journaled.
    async fn policies(
        &self,
        io: &mut Io<'_>,
        policies: &[BoundPolicy],
        state: &mut RunState,
        output: ToolOutput,
        progress: &mut AttemptState,
    ) -> Result<Guarded, EngineError> {
        let subject = Subject::Result {
            tool: self.name.to_owned(),
            call_id: self.call.call_id.clone(),
            output: output.clone(),
        };
        let chain = hooks::run(
            policies,
            &io.events(),
            state,
            subject,
            Some(&self.call.call_id),
        )
        .await;
        let events = io.events();
        let decided = chain
            .decisions
            .into_iter()
            .map(|payload| events.event(self.span, Some(&self.step.span), None, payload))
            .collect();
        chain::write_in_step(io, state, decided, progress).await?;
        let output = match chain.subject {
            Subject::Result {
                output: replaced, ..
            } if chain.replaced => replaced,
            _ => output,
        };
        Ok(match chain.end {
            End::Retry { policy, feedback } => Guarded::Repair {
                policy,
                diagnostic: feedback,
            },
            End::Fail { error_type, reason } => Guarded::Failed {
                output: Box::new(output),
                error_type,
                reason,
            },
            // `decide` allows nothing else at `after_tool`.
            _ => Guarded::Output(Box::new(output)),
        })
    }

    /// The role's answer `text` through its contract, then its judges.
    async fn checks(
        &self,
        io: &mut Io<'_>,
        guards: &Guards<'_>,
        state: &mut RunState,
        text: &str,
        progress: &mut AttemptState,
        cost_usd: &mut f64,
    ) -> Result<Guarded, EngineError> {
        let (text, data) = match guards.contract {
            None => (text.to_owned(), None),
            Some(contract) => match self.check(io, state, contract, text, progress).await? {
                Checked::Passed { text, data } => (text, data),
                Checked::Guarded(guarded) => return Ok(guarded),
            },
        };
        let mode = judging::mode(state);
        for judge in guards.judging.judges {
            let judged = Judged {
                target: format!("role:{}", self.name),
                call_id: Some(&self.call.call_id),
                point: Point::AfterTool,
                span: self.span,
                parent: Some(&self.step.span),
                arguments: Some(self.arguments),
                text: text.clone(),
                data: data.clone(),
                run_deadline: self.run_deadline,
            };
            let judgement =
                judging::judge(io, &guards.judging, state, judge, mode, &judged, progress).await?;
            *cost_usd += judgement
                .events
                .iter()
                .filter_map(|e| match &e.payload {
                    Payload::ModelResponded(p) => Some(p.cost_usd),
                    _ => None,
                })
                .sum::<f64>();
            chain::write_in_step(io, state, judgement.events, progress).await?;
            match judgement.ruling {
                Ruling::Pass => {}
                Ruling::Repair(diagnostic) => {
                    return Ok(Guarded::Repair {
                        policy: judge.policy(),
                        diagnostic,
                    });
                }
                Ruling::Refused(summary) => {
                    return Ok(Guarded::Output(Box::new(
                        self.judged_out(judge, &text, &summary),
                    )));
                }
                Ruling::Error(reason) => {
                    return Ok(Guarded::Failed {
                        output: Box::new(ToolOutput::error(format!(
                            "The result of {} could not be judged: {reason}",
                            self.name
                        ))),
                        error_type: "guard.judge".into(),
                        reason,
                    });
                }
                Ruling::Interrupted { timed_out } => {
                    return Ok(Guarded::Interrupted { timed_out });
                }
            }
        }
        let mut output = ToolOutput::text(text);
        output.data = data;
        Ok(Guarded::Output(Box::new(output)))
    }

    /// What a judge's `on_failure` makes of an answer it still refuses.
    fn judged_out(&self, judge: &JudgeRuntime, text: &str, summary: &str) -> ToolOutput {
        match judge.on_failure {
            OnFailure::Fail => ToolOutput::error(format!(
                "The result of {} was refused by its judge {} (a rule of the configuration, not \
                 a failure): {summary}",
                self.name, judge.name
            )),
            OnFailure::Unverified => ToolOutput {
                unverified: true,
                ..ToolOutput::text(text)
            },
            OnFailure::Fallback => ToolOutput {
                fallback: true,
                ..ToolOutput::text(judge.fallback_message.clone().unwrap_or_default())
            },
        }
    }

    /// Checks the role's answer `text` against its contract (`guard.checked` with target
    /// `role:<name>`, then `policy.decided` retry while repairs remain).
    async fn check(
        &self,
        io: &mut Io<'_>,
        state: &mut RunState,
        contract: &Contract,
        text: &str,
        progress: &mut AttemptState,
    ) -> Result<Checked, EngineError> {
        let call = self.call;
        let key = format!("{CONTRACT}#{}", call.call_id);
        let attempt = state.retries.get(&key).copied().unwrap_or(0);
        let target = format!("role:{}", self.name);
        let checked = |outcome: &str, reason, normalized, resolution| {
            contract_checked(
                &target,
                attempt + 1,
                Some(&call.call_id),
                outcome,
                reason,
                normalized,
                resolution,
            )
        };
        let events = io.events();
        let event = |payload| events.event(self.span, Some(&self.step.span), None, payload);
        let (problems, diagnostic) = match contract.check(text, None) {
            Verdict::Passed {
                text: checked_text,
                data,
                normalized,
            } => {
                let passed = vec![event(checked("passed", None, normalized, None))];
                chain::write_in_step(io, state, passed, progress).await?;
                return Ok(Checked::Passed {
                    text: checked_text,
                    data,
                });
            }
            Verdict::Failed {
                problems,
                diagnostic,
            } => (problems, diagnostic),
        };
        let spec = contract.spec();
        if attempt < spec.repair.max_attempts {
            let mut decided = hooks::decided(
                CONTRACT,
                Point::AfterTool,
                DecisionKind::Retry,
                Some(diagnostic.clone()),
                Some(&call.call_id),
                false,
            );
            if let Payload::PolicyDecided(p) = &mut decided {
                p.attempt = Some(attempt + 1);
                p.tools = Some(false);
            }
            let batch = vec![
                event(checked(
                    "failed",
                    Some(diagnostic.clone()),
                    false,
                    Some("retry"),
                )),
                event(decided),
            ];
            chain::write_in_step(io, state, batch, progress).await?;
            return Ok(Checked::Guarded(Guarded::Repair {
                policy: CONTRACT.into(),
                diagnostic,
            }));
        }
        let resolution = spec.on_failure.as_str();
        let failed = vec![event(checked(
            "failed",
            Some(diagnostic),
            false,
            Some(resolution),
        ))];
        chain::write_in_step(io, state, failed, progress).await?;
        Ok(Checked::Guarded(Guarded::Output(Box::new(
            match spec.on_failure {
                OnFailure::Fail => ToolOutput::error(format!(
                    "The result of {} was refused by its output contract (a rule of the \
                     configuration, not a failure): {}",
                    self.name,
                    problems.join("; ")
                )),
                OnFailure::Unverified => ToolOutput {
                    unverified: true,
                    ..ToolOutput::text(text)
                },
                OnFailure::Fallback => ToolOutput {
                    fallback: true,
                    ..ToolOutput::text(spec.fallback_message.clone().unwrap_or_default())
                },
            },
        ))))
    }
}

/// What a role's contract made of its answer.
enum Checked {
    /// It passed: the answer after normalization, and its structured data.
    Passed { text: String, data: Option<Value> },
    /// It did not: a repair, or the call's result once repairs are spent.
    Guarded(Guarded),
}
