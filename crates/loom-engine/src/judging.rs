//! The judges of the final output, as a point of the loop: after the output contract and
//! before the `on_output` policies, each judge of the agent is triggered or skipped (by code),
//! calls its model chain, and its verdict passes the output, asks the orchestrator for a
//! repair, or goes to `on_failure`; a judge that errs goes to `on_error` (see [`crate::judges`]
//! for what a judge is and how a verdict reads).

use std::str::FromStr;

use loom_core::{
    Event, Message, RunState,
    event::{CriterionScore, GuardChecked, JudgeEvaluated, Payload},
    model::{ModelRequest, ToolChoice, ToolDefinition},
    policy::{DecisionKind, Point},
    ports::EventStore,
};

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

/// What judging the final output needs besides the run's [`Io`]: the agent's judges, the model
/// calls, and the journal (for the context items that read earlier runs).
pub(crate) struct Judging<'a> {
    /// The agent's judges, in declared order.
    pub(crate) judges: &'a [JudgeRuntime],
    /// What their model calls need.
    pub(crate) models: Models<'a>,
    /// The journal.
    pub(crate) store: &'a dyn EventStore,
}

/// A judge's `guard.checked` on the output (a judge that did not judge has no attempt).
fn checked(
    judge: &JudgeRuntime,
    attempt: Option<u32>,
    outcome: &str,
    reason: Option<String>,
    resolution: Option<&str>,
) -> Payload {
    Payload::GuardChecked(GuardChecked {
        guard: "judge".into(),
        target: TARGET.into(),
        outcome: outcome.into(),
        reason,
        attempt,
        normalized: false,
        resolution: resolution.map(str::to_owned),
        policy: Some(judge.policy()),
        call_id: None,
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
    /// The run was cancelled or ran out of time: those events are written.
    Over,
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
    let mode = JudgeMode::from_str(&state.judges).unwrap_or_else(|_| {
        tracing::warn!(run_id = %state.run_id, judges = %state.judges, "unknown judges mode; auto used");
        JudgeMode::Auto
    });
    for judge in judging.judges {
        // Repaired, failed, cancelled or out of time: nothing more to do.
        if let Guarded::Done = judge_output(io, judging, state, judge, mode, output).await? {
            return Ok(Guarded::Done);
        }
    }
    Ok(Guarded::Pass)
}

/// One judge on the output: the trigger, the call, the verdict and what it leads to.
async fn judge_output(
    io: &mut Io<'_>,
    judging: &Judging<'_>,
    state: &mut RunState,
    judge: &JudgeRuntime,
    mode: JudgeMode,
    output: &mut Final,
) -> Result<Guarded, EngineError> {
    let attempt = state.retries.get(&judge.policy()).copied().unwrap_or(0) + 1;
    let text = match &output.message {
        Some(message) => message.text(),
        None => terminal_message(state).text(),
    };
    let run = io.events().run();
    let skip = judge.skip_reason(mode, &run.run_id, &run.tenant_id, |condition| {
        let input = JudgeInput {
            judge: judge.name.clone(),
            target: TARGET.into(),
            tenant_id: run.tenant_id.clone(),
            session_id: run.session_id.clone(),
            run_id: run.run_id.clone(),
            agent: io.events().agent().to_owned(),
            profile: judge.profile.clone(),
            user_input: user_input(state),
            output: text.clone(),
            data: output.data.clone(),
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
            let span = state.run_span_id.clone();
            let payload = checked(judge, None, "skipped", Some(reason.into()), None);
            let event = io.event(&span, None, None, payload);
            io.write(state, vec![event]).await?;
            return Ok(Guarded::Pass);
        }
        Ok(None) => call_judge(io, judging, state, judge, &text).await?,
        Err(error) => Call::Error {
            events: Vec::new(),
            error,
        },
    };
    match call {
        Call::Over => Ok(Guarded::Done),
        Call::Error { events, error } => {
            judge_failed(io, state, judge, attempt, events, &error).await
        }
        Call::Verdict {
            events,
            model_id,
            model,
            scores,
        } => {
            let evaluated = JudgeEvaluated {
                judge: judge.name.clone(),
                target: TARGET.into(),
                model_id,
                model: Some(model),
                passed: scores.iter().all(CriterionScore::passed),
                blocked: scores.iter().any(|s| s.blocking && !s.passed()),
                criteria: scores,
                attempt: Some(attempt),
                policy: Some(judge.policy()),
                call_id: None,
            };
            judged(io, state, judge, events, evaluated, output).await
        }
    }
}

/// A judge that erred: `on_error` decides. `block` fails the run (`guard.judge`); `allow`
/// lets the output through, with a `skipped` trace naming the error.
async fn judge_failed(
    io: &mut Io<'_>,
    state: &mut RunState,
    judge: &JudgeRuntime,
    attempt: u32,
    mut batch: Vec<Event>,
    error: &str,
) -> Result<Guarded, EngineError> {
    tracing::warn!(run_id = %state.run_id, judge = %judge.name, %error, "judge failed");
    let span = state.run_span_id.clone();
    let policy = judge.policy();
    let reason = Some(format!("judge_error: {error}"));
    let message = format!("judge {} failed: {error}", judge.name);
    let (check, kind) = match judge.on_error {
        PolicyOnError::Allow => (
            checked(judge, None, "skipped", reason, None),
            DecisionKind::Continue,
        ),
        PolicyOnError::Block => (
            checked(judge, Some(attempt), "failed", reason, Some("fail")),
            DecisionKind::Fail,
        ),
    };
    let decided = hooks::decided(
        &policy,
        Point::OnOutput,
        kind,
        Some(message.clone()),
        None,
        true,
    );
    batch.push(io.event(&span, None, None, check));
    batch.push(io.event(&span, None, None, decided));
    if judge.on_error == PolicyOnError::Allow {
        io.write(state, batch).await?;
        return Ok(Guarded::Pass);
    }
    batch.extend(
        io.events()
            .failure(state, "policy.decided", "guard.judge", &message),
    );
    io.write(state, batch).await?;
    Ok(Guarded::Done)
}

/// The verdict's events after the judge's call (`batch`): `judge.evaluated`, then
/// `guard.checked`, then what a refusal leads to — a repair while attempts remain, else
/// `on_failure`.
async fn judged(
    io: &mut Io<'_>,
    state: &mut RunState,
    judge: &JudgeRuntime,
    mut batch: Vec<Event>,
    evaluated: JudgeEvaluated,
    output: &mut Final,
) -> Result<Guarded, EngineError> {
    let span = state.run_span_id.clone();
    let policy = judge.policy();
    let attempt = evaluated.attempt.unwrap_or(1);
    let refused = refusals(&evaluated.criteria, true);
    let noted = refusals(&evaluated.criteria, false);
    let blocked = evaluated.blocked;
    batch.push(io.event(&span, None, None, Payload::JudgeEvaluated(evaluated)));
    if !blocked {
        let reason = (!noted.is_empty()).then(|| {
            format!(
                "non-blocking criteria under their threshold: {}",
                noted.join("; ")
            )
        });
        batch.push(io.event(
            &span,
            None,
            None,
            checked(judge, Some(attempt), "passed", reason, None),
        ));
        io.write(state, batch).await?;
        return Ok(Guarded::Pass);
    }
    let summary = refused.join("; ");
    if attempt <= judge.repair.max_attempts {
        let mut decided = hooks::decided(
            &policy,
            Point::OnOutput,
            DecisionKind::Retry,
            Some(diagnostic(&judge.name, &refused)),
            None,
            false,
        );
        if let Payload::PolicyDecided(p) = &mut decided {
            p.attempt = Some(attempt);
            // A judge's repair keeps the tools unless told otherwise.
            p.tools = Some(judge.repair.tools != RepairTools::None);
        }
        let check = checked(judge, Some(attempt), "failed", Some(summary), Some("retry"));
        batch.push(io.event(&span, None, None, check));
        batch.push(io.event(&span, None, None, decided));
        io.write(state, batch).await?;
        return Ok(Guarded::Done);
    }
    let resolution = judge.on_failure.as_str();
    let check = checked(
        judge,
        Some(attempt),
        "failed",
        Some(summary.clone()),
        Some(resolution),
    );
    batch.push(io.event(&span, None, None, check));
    let end = match judge.on_failure {
        OnFailure::Fail => {
            let error = format!(
                "final answer refused by the judge {}: {summary}",
                judge.name
            );
            batch.extend(
                io.events()
                    .failure(state, "guard.checked", "guard.judge", &error),
            );
            Guarded::Done
        }
        OnFailure::Unverified => Guarded::Pass,
        OnFailure::Fallback => {
            let message = Message::assistant(judge.fallback_message.clone().unwrap_or_default());
            let reason = format!(
                "fallback message after the judge {} refused the output: {summary}",
                judge.name
            );
            let payload = hooks::output_replaced(&policy, reason, &message);
            batch.push(io.event(&span, None, None, payload));
            output.message = Some(message);
            output.output_event_id = None;
            output.data = None;
            Guarded::Pass
        }
    };
    io.write(state, batch).await?;
    Ok(end)
}

/// Calls the judge's model chain on `text` and reads its verdict. A cancellation or the
/// run's timeout is written here ([`Call::Over`]).
async fn call_judge(
    io: &mut Io<'_>,
    judging: &Judging<'_>,
    state: &mut RunState,
    judge: &JudgeRuntime,
    text: &str,
) -> Result<Call, EngineError> {
    if let Some(problem) = criteria_problem(&judge.criteria) {
        return Ok(Call::Error {
            events: Vec::new(),
            error: problem,
        });
    }
    let prompt = prompt(judging.store, io.events().run(), state, judge, text).await?;
    let tool = ToolDefinition {
        name: VERDICT_TOOL.into(),
        description: "Gives the verdict: one score between 0 and 1 per criterion, with a \
            short reason."
            .into(),
        input_schema: judge.verdict_schema(),
    };
    let build = |model: &ModelBinding| ModelRequest {
        model_id: model.model_id.clone(),
        system: JUDGE_SYSTEM.into(),
        messages: vec![Message::user(prompt.clone())],
        tools: vec![tool.clone()],
        tool_choice: ToolChoice::Required,
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
    let run_span = state.run_span_id.clone();
    let span = io.events().uuid();
    let caller = Caller {
        slot: &slot,
        call_id: None,
        judge: Some(&judge.name),
        span: &span,
        parent: Some(&run_span),
    };
    let run_deadline = io.deadline(state);
    let judge_deadline = judge.timeout.map(|t| tokio::time::Instant::now() + t);
    let deadline = match (run_deadline, judge_deadline) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let mut progress = AttemptState::default();
    let end = chain::call(
        io,
        &judging.models,
        state,
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
        ChainEnd::Interrupted { timed_out } => {
            let batch = if timed_out {
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
            io.write(state, batch).await?;
            Ok(Call::Over)
        }
    }
}

/// The judge's user message: criteria, declared context sections, then the output.
async fn prompt(
    store: &dyn EventStore,
    run: &RunRef,
    state: &RunState,
    judge: &JudgeRuntime,
    text: &str,
) -> Result<String, EngineError> {
    let mut prompt = String::from("<criteria>\n");
    for criterion in &judge.criteria {
        prompt.push_str(&format!("{}: {}\n", criterion.name, criterion.rule));
    }
    prompt.push_str("</criteria>\n");
    for block in context::gather(store, run, state, &judge.context)
        .await?
        .blocks
    {
        prompt.push_str(&block);
        prompt.push('\n');
    }
    prompt.push_str(&format!("<output>\n{text}\n</output>"));
    Ok(prompt)
}
