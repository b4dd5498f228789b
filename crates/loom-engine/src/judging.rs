//! The judges as points of the loop. A judge is triggered or skipped (by code), calls its
//! model chain, and its verdict lets the output through, asks its author for a repair, or goes
//! to `on_failure`; a judge that errs goes to `on_error` (see [`crate::judges`] for what a judge
//! is and how a verdict reads).
//!
//! Two things are judged: the final output ([`run`], a decision after the output contract and
//! before the `on_output` policies, in the run's root span), and a role's answer (`role_guards.rs`,
//! at `after_tool`, inside the batch's step, in the role call's span). [`judge`] is what both
//! share: it builds the judge's request as the reference does (system [`JUDGE_SYSTEM`], one user
//! message with `<criteria>`, the declared context sections, `<arguments>` for a role, then
//! `<output>`; the forced tool [`VERDICT_TOOL`], or `tool_choice: auto` for a model that declares
//! `forced_tool_choice: false`) and returns the events of the verdict with its [`Ruling`], for the
//! caller to write with what follows from it.

use std::{str::FromStr, sync::Arc};

use loom_core::{
    Block, Event, Message, Role, RunState,
    event::{CriterionScore, GuardChecked, JudgeEvaluated, Payload},
    model::{ModelRequest, ToolChoice, ToolDefinition},
    policy::{DecisionKind, Point},
    ports::EventStore,
};
use serde_json::Value;

use crate::{
    binding::{ModelBinding, PolicyOnError},
    chain::{self, AttemptState, Caller, ChainEnd, Models},
    context::{self, user_input},
    contract::{OnFailure, RepairTools},
    error::EngineError,
    events::RunRef,
    hooks,
    io::Io,
    judges::{
        JUDGE_SYSTEM, JudgeInput, JudgeMode, JudgeRuntime, TARGET, VERDICT_TOOL, criteria_problem,
        diagnostic, parse_verdict, refusals,
    },
    output::{Final, Guarded, terminal_message},
    units::fmt_secs,
};

/// What judging needs besides the run's [`Io`]: the judges, the model calls, and the journal
/// (for the context items that read earlier runs).
pub(crate) struct Judging<'a> {
    /// The judges, in declared order.
    pub(crate) judges: &'a [JudgeRuntime],
    /// What their model calls need.
    pub(crate) models: Models<'a>,
    /// The journal.
    pub(crate) store: &'a dyn EventStore,
}

/// What a judge is given to judge, and where its events go.
pub(crate) struct Judged<'a> {
    /// `output`, or `role:<name>`.
    pub(crate) target: String,
    /// The role call whose answer is judged (`None`: the final output).
    pub(crate) call_id: Option<&'a str>,
    /// The point of the judge's decisions: `on_output`, or `after_tool` for a role.
    pub(crate) point: Point,
    /// The span of the judge's events (its model call gets a span under it).
    pub(crate) span: &'a str,
    /// The parent of that span.
    pub(crate) parent: Option<&'a str>,
    /// The role call's arguments (`<arguments>` in the judge's message).
    pub(crate) arguments: Option<&'a Value>,
    /// The output's text.
    pub(crate) text: String,
    /// The output's structured data, if any.
    pub(crate) data: Option<Value>,
    /// When the run's time runs out (for a role, the batch's deadline, fixed when its step
    /// began).
    pub(crate) run_deadline: Option<tokio::time::Instant>,
}

/// What one judgement decided (its events are in [`Judgement::events`]).
pub(crate) enum Ruling {
    /// The output goes on: the verdict let it through, the judge did not run, or it erred
    /// under `on_error: allow`.
    Pass,
    /// Refused while repairs remain: the author repairs with this diagnostic
    /// (`policy.decided` retry is among the events).
    Repair(String),
    /// Refused for good: `on_failure` applies (its resolution is journaled); the refusals.
    Refused(String),
    /// The judge erred under `on_error: block`: the output fails with this message.
    Error(String),
    /// Cancelled, or the run ran out of time: nothing was decided.
    Interrupted {
        /// Out of time (else cancelled).
        timed_out: bool,
    },
}

/// One judge's events, not written yet, and what they decide.
pub(crate) struct Judgement {
    /// The events to write, in order (the judge's model events, `judge.evaluated`,
    /// `guard.checked`, then any `policy.decided`).
    pub(crate) events: Vec<Event>,
    /// What they decide.
    pub(crate) ruling: Ruling,
}

/// The caller's judges mode of the run (`run.started.judges`).
pub(crate) fn mode(state: &RunState) -> JudgeMode {
    JudgeMode::from_str(&state.judges).unwrap_or_else(|_| {
        tracing::warn!(run_id = %state.run_id, judges = %state.judges, "unknown judges mode; auto used");
        JudgeMode::Auto
    })
}

/// The agent's judges on the final output, in declared order, after the output contract
/// and before the `on_output` policies.
pub(crate) async fn run(
    io: &mut Io<'_>,
    judging: &Judging<'_>,
    state: &mut RunState,
    output: &mut Final,
) -> Result<Guarded, EngineError> {
    if judging.judges.is_empty() {
        return Ok(Guarded::Pass);
    }
    let mode = mode(state);
    for judge in judging.judges {
        // Repaired, failed, cancelled or out of time: nothing more to do.
        if let Guarded::Done = judge_output(io, judging, state, judge, mode, output).await? {
            return Ok(Guarded::Done);
        }
    }
    Ok(Guarded::Pass)
}

/// One judge on the final output: its judgement, then what it leads to, in one append.
async fn judge_output(
    io: &mut Io<'_>,
    judging: &Judging<'_>,
    state: &mut RunState,
    judge: &JudgeRuntime,
    mode: JudgeMode,
    output: &mut Final,
) -> Result<Guarded, EngineError> {
    let text = match &output.message {
        Some(message) => message.text(),
        None => terminal_message(state).text(),
    };
    let span = state.run_span_id.clone();
    let judged = Judged {
        target: TARGET.into(),
        call_id: None,
        point: Point::OnOutput,
        span: &span,
        parent: None,
        arguments: None,
        text,
        data: output.data.clone(),
        run_deadline: io.deadline(state),
    };
    let mut progress = AttemptState::default();
    let Judgement { mut events, ruling } =
        self::judge(io, judging, state, judge, mode, &judged, &mut progress).await?;
    let end = match ruling {
        Ruling::Pass => Guarded::Pass,
        Ruling::Repair(_) => Guarded::Done,
        Ruling::Refused(summary) => match judge.on_failure {
            OnFailure::Fail => {
                let error = format!(
                    "final answer refused by the judge {}: {summary}",
                    judge.name
                );
                events.extend(
                    io.events()
                        .failure(state, "guard.checked", "guard.judge", &error),
                );
                Guarded::Done
            }
            OnFailure::Unverified => Guarded::Pass,
            OnFailure::Fallback => {
                let message =
                    Message::assistant(judge.fallback_message.clone().unwrap_or_default());
                let reason = format!(
                    "fallback message after the judge {} refused the output: {summary}",
                    judge.name
                );
                let payload = hooks::output_replaced(&judge.policy(), reason, &message);
                events.push(io.event(&span, None, None, payload));
                output.message = Some(message);
                output.output_event_id = None;
                output.data = None;
                Guarded::Pass
            }
        },
        Ruling::Error(message) => {
            events.extend(
                io.events()
                    .failure(state, "policy.decided", "guard.judge", &message),
            );
            Guarded::Done
        }
        Ruling::Interrupted { timed_out } => {
            events = if timed_out {
                let limit = io.timeout().unwrap_or_default();
                let message = format!(
                    "maximum time of {} s exceeded: a decision (policies, judges) taken after step {} was interrupted ({:.1} s of completed steps)",
                    fmt_secs(limit),
                    state.step,
                    state.active_ms / 1000.0
                );
                io.events().failure(state, "timeout", "timeout", &message)
            } else {
                io.cancellation(state)
            };
            Guarded::Done
        }
    };
    io.write(state, events).await?;
    Ok(end)
}

/// A judge's `guard.checked` on what it judged (a judge that did not judge has no attempt).
fn checked(
    judge: &JudgeRuntime,
    judged: &Judged<'_>,
    attempt: Option<u32>,
    outcome: &str,
    reason: Option<String>,
    resolution: Option<&str>,
) -> Payload {
    Payload::GuardChecked(GuardChecked {
        guard: "judge".into(),
        target: judged.target.clone(),
        outcome: outcome.into(),
        reason,
        attempt,
        normalized: false,
        resolution: resolution.map(str::to_owned),
        policy: Some(judge.policy()),
        call_id: judged.call_id.map(str::to_owned),
    })
}

/// What the judge's call produced.
enum Call {
    /// Scores (and the model events to write first).
    Verdict {
        events: Vec<Event>,
        model_id: String,
        model: String,
        scores: Vec<CriterionScore>,
    },
    /// The judge erred (after the model events to write, if any).
    Error { events: Vec<Event>, error: String },
    /// The run was cancelled or ran out of time.
    Interrupted { timed_out: bool },
}

/// One judge on `judged`: the trigger, the call, the verdict, and its events. Repairs are
/// counted per judge in the run, and per judge and call for a role.
pub(crate) async fn judge(
    io: &mut Io<'_>,
    judging: &Judging<'_>,
    state: &mut RunState,
    judge: &JudgeRuntime,
    mode: JudgeMode,
    judged: &Judged<'_>,
    progress: &mut AttemptState,
) -> Result<Judgement, EngineError> {
    let policy = judge.policy();
    let key = match judged.call_id {
        Some(call_id) => format!("{policy}#{call_id}"),
        None => policy.clone(),
    };
    let attempt = state.retries.get(&key).copied().unwrap_or(0) + 1;
    let run = io.events().run();
    let skip = judge.skip_reason(mode, &run.run_id, &run.tenant_id, |condition| {
        let input = JudgeInput {
            judge: judge.name.clone(),
            target: judged.target.clone(),
            tenant_id: run.tenant_id.clone(),
            session_id: run.session_id.clone(),
            run_id: run.run_id.clone(),
            agent: io.events().agent().to_owned(),
            profile: judge.profile.clone(),
            user_input: user_input(state),
            output: judged.text.clone(),
            data: judged.data.clone(),
            tools_called: state.tools_called.clone(),
            iterations: state.iterations,
            attempt,
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| condition.holds(&input)))
            .map_err(|_| "its condition panicked".to_owned())
    });
    let call = match skip {
        Ok(Some(reason)) => {
            tracing::debug!(run_id = %run.run_id, judge = %judge.name, reason, "judge skipped");
            let payload = checked(judge, judged, None, "skipped", Some(reason.into()), None);
            return Ok(Judgement {
                events: vec![io.event(judged.span, judged.parent, None, payload)],
                ruling: Ruling::Pass,
            });
        }
        Ok(None) => call_judge(io, judging, state, judge, judged, progress).await?,
        Err(error) => Call::Error {
            events: Vec::new(),
            error,
        },
    };
    Ok(match call {
        Call::Interrupted { timed_out } => Judgement {
            events: Vec::new(),
            ruling: Ruling::Interrupted { timed_out },
        },
        Call::Error { events, error } => judge_failed(io, judge, judged, attempt, events, &error),
        Call::Verdict {
            events,
            model_id,
            model,
            scores,
        } => {
            let evaluated = JudgeEvaluated {
                judge: judge.name.clone(),
                target: judged.target.clone(),
                model_id,
                model: Some(model),
                passed: scores.iter().all(CriterionScore::passed),
                blocked: scores.iter().any(|s| s.blocking && !s.passed()),
                criteria: scores,
                attempt: Some(attempt),
                policy: Some(policy),
                call_id: judged.call_id.map(str::to_owned),
            };
            verdict(io, judge, judged, events, evaluated)
        }
    })
}

/// A judge that erred: `on_error` decides. `block` fails the output; `allow` lets it through,
/// with a `skipped` trace naming the error.
fn judge_failed(
    io: &Io<'_>,
    judge: &JudgeRuntime,
    judged: &Judged<'_>,
    attempt: u32,
    mut events: Vec<Event>,
    error: &str,
) -> Judgement {
    tracing::warn!(run_id = %io.events().run().run_id, judge = %judge.name, %error, "judge failed");
    let reason = Some(format!("judge_error: {error}"));
    let message = format!("judge {} failed: {error}", judge.name);
    let (check, kind) = match judge.on_error {
        PolicyOnError::Allow => (
            checked(judge, judged, None, "skipped", reason, None),
            DecisionKind::Continue,
        ),
        PolicyOnError::Block => (
            checked(judge, judged, Some(attempt), "failed", reason, Some("fail")),
            DecisionKind::Fail,
        ),
    };
    let decided = hooks::decided(
        &judge.policy(),
        judged.point,
        kind,
        Some(message.clone()),
        judged.call_id,
        true,
    );
    events.push(io.event(judged.span, judged.parent, None, check));
    events.push(io.event(judged.span, judged.parent, None, decided));
    Judgement {
        events,
        ruling: match judge.on_error {
            PolicyOnError::Allow => Ruling::Pass,
            PolicyOnError::Block => Ruling::Error(message),
        },
    }
}

/// The verdict's events after the judge's call (`events`): `judge.evaluated`, then
/// `guard.checked`, then a repair's `policy.decided` while attempts remain.
fn verdict(
    io: &Io<'_>,
    judge: &JudgeRuntime,
    judged: &Judged<'_>,
    mut events: Vec<Event>,
    evaluated: JudgeEvaluated,
) -> Judgement {
    let event = |payload| io.event(judged.span, judged.parent, None, payload);
    let attempt = evaluated.attempt.unwrap_or(1);
    let refused = refusals(&evaluated.criteria, true);
    let noted = refusals(&evaluated.criteria, false);
    let blocked = evaluated.blocked;
    events.push(event(Payload::JudgeEvaluated(evaluated)));
    if !blocked {
        let reason = (!noted.is_empty()).then(|| {
            format!(
                "non-blocking criteria under their threshold: {}",
                noted.join("; ")
            )
        });
        events.push(event(checked(
            judge,
            judged,
            Some(attempt),
            "passed",
            reason,
            None,
        )));
        return Judgement {
            events,
            ruling: Ruling::Pass,
        };
    }
    let summary = refused.join("; ");
    if attempt <= judge.repair.max_attempts {
        let diagnostic = diagnostic(&judge.name, &refused);
        let mut decided = hooks::decided(
            &judge.policy(),
            judged.point,
            DecisionKind::Retry,
            Some(diagnostic.clone()),
            judged.call_id,
            false,
        );
        if let Payload::PolicyDecided(p) = &mut decided {
            p.attempt = Some(attempt);
            // A judge's repair keeps the tools unless told otherwise.
            p.tools = Some(judge.repair.tools != RepairTools::None);
        }
        events.push(event(checked(
            judge,
            judged,
            Some(attempt),
            "failed",
            Some(summary),
            Some("retry"),
        )));
        events.push(event(decided));
        return Judgement {
            events,
            ruling: Ruling::Repair(diagnostic),
        };
    }
    events.push(event(checked(
        judge,
        judged,
        Some(attempt),
        "failed",
        Some(summary.clone()),
        Some(judge.on_failure.as_str()),
    )));
    Judgement {
        events,
        ruling: Ruling::Refused(summary),
    }
}

/// Calls the judge's model chain on what is judged and reads its verdict.
async fn call_judge(
    io: &mut Io<'_>,
    judging: &Judging<'_>,
    state: &mut RunState,
    judge: &JudgeRuntime,
    judged: &Judged<'_>,
    progress: &mut AttemptState,
) -> Result<Call, EngineError> {
    if let Some(problem) = criteria_problem(&judge.criteria) {
        return Ok(Call::Error {
            events: Vec::new(),
            error: problem,
        });
    }
    let message = prompt(judging.store, io.events().run(), state, judge, judged).await?;
    let tool = ToolDefinition {
        name: VERDICT_TOOL.into(),
        description: "Gives the verdict: one score between 0 and 1 per criterion, with a \
            short reason."
            .into(),
        input_schema: Arc::new(judge.verdict_schema()),
    };
    let build = |model: &ModelBinding| ModelRequest {
        model_id: model.model_id.clone(),
        system: JUDGE_SYSTEM.into(),
        messages: vec![Arc::new(message.clone())],
        tools: vec![tool.clone()],
        // A model that cannot be forced to call a tool is asked for it.
        tool_choice: if model.forced_tool_choice {
            ToolChoice::Required
        } else {
            ToolChoice::Auto
        },
        max_tokens: judge.max_tokens.or(model.max_tokens),
        params: model.params.clone(),
        output_schema: None,
    };
    let slot = judge.slot();
    let chain: Vec<&ModelBinding> = judge.chain().collect();
    // A run whose judge fell back stays on the model it switched to.
    let start = state
        .models
        .get(&slot)
        .and_then(|id| chain.iter().position(|m| m.config_id == *id))
        .unwrap_or(0);
    let span = io.events().uuid();
    let caller = Caller {
        slot: &slot,
        call_id: judged.call_id,
        judge: Some(&judge.name),
        span: &span,
        parent: Some(judged.span),
    };
    let run_deadline = judged.run_deadline;
    let judge_deadline = judge.timeout.map(|t| tokio::time::Instant::now() + t);
    let deadline = match (run_deadline, judge_deadline) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let end = chain::call(
        io,
        &judging.models,
        state,
        caller,
        &chain,
        start,
        &build,
        deadline,
        progress,
    )
    .await?;
    match end {
        ChainEnd::Answered { model, answer } => {
            let message = answer.response.message.clone();
            let model_id = answer.response.model_id.clone();
            let (responded, exchanged) = chain::responded(io, caller, model, answer);
            let mut events = exchanged;
            events.push(responded);
            Ok(match parse_verdict(&message, &judge.criteria) {
                Ok(scores) => Call::Verdict {
                    events,
                    model_id,
                    model: model.config_id.clone(),
                    scores,
                },
                Err(problem) => Call::Error {
                    events,
                    error: format!("unusable verdict: {problem}"),
                },
            })
        }
        ChainEnd::Failed(error) => Ok(Call::Error {
            events: Vec::new(),
            error: format!("model.{}: {}", error.kind.as_str(), error.message),
        }),
        ChainEnd::Interrupted { timed_out: true }
            if run_deadline.is_none_or(|r| judge_deadline.is_some_and(|j| j < r)) =>
        {
            Ok(Call::Error {
                events: Vec::new(),
                error: format!(
                    "no verdict within {} s",
                    fmt_secs(judge.timeout.unwrap_or_default())
                ),
            })
        }
        ChainEnd::Interrupted { timed_out } => Ok(Call::Interrupted { timed_out }),
    }
}

/// The judge's user message: the criteria, the declared context sections, the role call's
/// arguments, then the output; the run's images after the text when the judge reads them.
async fn prompt(
    store: &dyn EventStore,
    run: &RunRef,
    state: &RunState,
    judge: &JudgeRuntime,
    judged: &Judged<'_>,
) -> Result<Message, EngineError> {
    let mut prompt = String::from("<criteria>\n");
    for criterion in &judge.criteria {
        prompt.push_str(&format!("{}: {}\n", criterion.name, criterion.rule));
    }
    prompt.push_str("</criteria>\n");
    let gathered = context::gather(store, run, state, &judge.context, None).await?;
    for block in gathered.blocks {
        prompt.push_str(&block);
        prompt.push('\n');
    }
    if let Some(arguments) = judged.arguments {
        prompt.push_str(&format!("<arguments>\n{arguments}\n</arguments>\n"));
    }
    prompt.push_str(&format!("<output>\n{}\n</output>", judged.text));
    let mut blocks = vec![Block::text(prompt)];
    blocks.extend(gathered.images);
    Ok(Message {
        role: Role::User,
        blocks,
    })
}
