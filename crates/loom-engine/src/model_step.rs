//! The model step: one call to the orchestrator's model chain (`model_call`, or `finalize`
//! without tools), framed by `step.started`/`step.completed`.
//!
//! The request is built from the state (system prompt, session history, the run's
//! conversation, the tools offered now), passes the `before_model` point (the built-in budget,
//! then the agent's policies, which may replace it, stop the run or fail it), then goes to the
//! chain ([`chain::call`]: retries, fallbacks, breakers). The answer, with the end of the step,
//! is one append; so is a failure or an interruption.

use std::{collections::BTreeSet, sync::Arc};

use loom_core::{
    BlockKind, Message, RunState, RunStatus,
    event::{Effect, Outcome},
    model::{ModelError, ModelRequest, ModelResponse, StopReason, ToolChoice},
    policy::Subject,
};
use serde_json::Value;

use crate::{
    binding::{BoundPolicy, BoundTool, ModelBinding},
    budget::{self, BudgetLimits, Spent},
    chain::{self, Answer, AttemptState, Caller, ChainEnd, Models, SLOT},
    error::EngineError,
    hooks::{self, Chain, End},
    io::{Io, StepSpan},
    request, roles,
};

/// What the model step reads of the agent and the session.
pub(crate) struct Orchestrator<'a> {
    /// The agent's rendered system prompt (with the state hint when it is shown the state).
    pub(crate) system: &'a str,
    /// The session state's message (`main.context`), sent last and never journaled.
    pub(crate) state: Option<Message>,
    /// The `main` slot's chain: `main`, then the fallbacks.
    pub(crate) chain: Vec<&'a ModelBinding>,
    /// The agent's policies (those hooked on `before_model` run here).
    pub(crate) policies: &'a [BoundPolicy],
    /// The agent's run and session budgets.
    pub(crate) budget: Option<&'a BudgetLimits>,
    /// What the session's earlier runs spent, when a session limit applies.
    pub(crate) session_spent: Option<Spent>,
    /// The conversation of the session's earlier runs, shared with each step's requests.
    pub(crate) history: &'a request::History,
    /// The JSON Schema of the agent's output contract, sent as the request's `output_schema`
    /// when the call cannot use tools (a model that declares `native_json` then enforces it).
    pub(crate) output_schema: Option<&'a Value>,
    /// What the model calls need.
    pub(crate) models: Models<'a>,
}

/// What the `before_model` point let through.
pub(crate) enum Gate {
    /// The call goes on, with the replaced request if a policy replaced it.
    Pass(Option<Box<ModelRequest>>),
    /// A policy stopped the run: it finishes without tools.
    Stopped {
        /// Events written inside the step.
        emitted: u32,
    },
    /// A policy failed the run.
    Failed {
        /// Events written inside the step.
        emitted: u32,
        /// `policy.<name>`.
        error_type: String,
        /// Why.
        error: String,
    },
}

/// One model call, offering `tools` (see the module documentation).
pub(crate) async fn run(
    io: &mut Io<'_>,
    orchestrator: &Orchestrator<'_>,
    state: &mut RunState,
    effect: Effect,
    tools: &[BoundTool],
) -> Result<(), EngineError> {
    let step = StepSpan::open(io, state);
    let started = step.started(io, state, effect);
    io.write(state, vec![started]).await?;
    let finalizing = effect == Effect::Finalize;
    let chain = &orchestrator.chain;
    // A run that fell back stays on the model it switched to.
    let start = state
        .models
        .get(SLOT)
        .and_then(|id| chain.iter().position(|m| m.config_id == *id))
        .unwrap_or(0);
    let build = requests(io, orchestrator, state, effect, tools);
    let mut progress = AttemptState::default();
    // Before each orchestrator call (not while finalizing): the budget, then the agent's
    // `before_model` policies, which may replace the request, stop the run or fail it.
    let replaced = if finalizing {
        None
    } else {
        let first = build(chain[start]);
        match before_model(io, orchestrator, state, &step, first).await? {
            Gate::Pass(request) => request,
            Gate::Stopped { emitted } => {
                progress.emitted += emitted;
                let mut batch = vec![step.completed(io, state, progress.emitted, Outcome::Ok)];
                batch.push(io.events().transition(
                    state,
                    RunStatus::Finalizing,
                    "policy.decided",
                    io.last_ids.policy.clone(),
                ));
                return io.write(state, batch).await.map(drop);
            }
            Gate::Failed {
                emitted,
                error_type,
                error,
            } => {
                progress.emitted += emitted;
                let mut batch = vec![step.completed(io, state, progress.emitted, Outcome::Error)];
                batch.extend(
                    io.events()
                        .failure(state, "policy.decided", &error_type, &error),
                );
                return io.write(state, batch).await.map(drop);
            }
        }
    };
    let build = |model: &ModelBinding| match &replaced {
        // A replacement decided on the first model's request applies to every model of
        // the chain, each keeping its own name, token cap and parameters.
        Some(request) => {
            let own = build(model);
            ModelRequest {
                model_id: own.model_id,
                max_tokens: own.max_tokens,
                params: own.params,
                ..(**request).clone()
            }
        }
        None => build(model),
    };
    let run_span = state.run_span_id.clone();
    let caller = Caller {
        slot: SLOT,
        call_id: None,
        judge: None,
        span: &step.span,
        parent: Some(&run_span),
    };
    let deadline = io.deadline(state);
    let models = &orchestrator.models;
    let end = chain::call(
        io,
        models,
        state,
        caller,
        chain,
        start,
        &build,
        deadline,
        &mut progress,
    )
    .await?;
    match end {
        ChainEnd::Answered { model, answer } => {
            answered(
                io,
                state,
                &step,
                model,
                answer,
                finalizing,
                progress.emitted,
            )
            .await
        }
        ChainEnd::Interrupted { timed_out } => {
            io.interrupted(state, &step, progress.emitted, timed_out)
                .await
        }
        ChainEnd::Failed(error) => failed(io, state, &step, error, progress.emitted).await,
    }
}

/// The orchestrator's request for each model of its chain, from the state as it is now: the
/// system prompt (with the `$ref` hint when results can be referenced), the session history,
/// the run's conversation (results numbered for `$ref`), the tools offered, without the
/// reasoning blocks other models produced, and the output contract's schema when the call
/// cannot use tools (none offered, or `tool_choice: none`), as the reference does. The closure
/// owns what it reads.
fn requests(
    io: &Io<'_>,
    orchestrator: &Orchestrator<'_>,
    state: &RunState,
    effect: Effect,
    tools: &[BoundTool],
) -> impl Fn(&ModelBinding) -> ModelRequest + Sync + use<> {
    let finalizing = effect == Effect::Finalize;
    let mut conversation = state.conversation();
    // With a role (or sub-agent) offered, results are numbered for `$ref`.
    let refs = roles::refs_enabled(tools);
    if refs {
        roles::number_results(&mut conversation);
    }
    let choice = if finalizing || state.repair_without_tools {
        ToolChoice::None
    } else {
        ToolChoice::Auto
    };
    let system = orchestrator.system.to_owned();
    let output_schema = orchestrator
        .output_schema
        .filter(|_| tools.is_empty() || choice == ToolChoice::None)
        .cloned();
    let tools = tools.to_vec();
    let history = orchestrator.history.clone();
    let state_message = orchestrator.state.clone();
    let names = io.names.clone();
    move |model: &ModelBinding| {
        let mut request = request::build(
            &system,
            model,
            &tools,
            &history,
            conversation.clone(),
            finalizing,
            choice,
        );
        if let Some(message) = &state_message {
            // Before the finalize hint, which stays the last word.
            let at = request.messages.len() - usize::from(finalizing);
            request.messages.insert(at, Arc::new(message.clone()));
        }
        request::strip_foreign_reasoning(&mut request.messages, |id| names.is_own(id, model));
        if refs {
            request.system = roles::with_refs_hint(&request.system);
        }
        request.output_schema.clone_from(&output_schema);
        request
    }
}

/// The `before_model` point: the built-in budget policy (`loom.budget`), then the agent's
/// policies, on the request about to be sent. Their decisions are journaled in the model step,
/// in one append.
async fn before_model(
    io: &mut Io<'_>,
    orchestrator: &Orchestrator<'_>,
    state: &mut RunState,
    step: &StepSpan,
    request: ModelRequest,
) -> Result<Gate, EngineError> {
    let budget = budget::check(orchestrator.budget, state, orchestrator.session_spent);
    let mut decisions = budget.payloads;
    let chain = match budget.stop {
        Some(reason) => Chain {
            subject: Subject::Request(request),
            replaced: false,
            decisions: Vec::new(),
            end: End::Stop { reason },
        },
        None => {
            let events = io.events();
            hooks::run(
                orchestrator.policies,
                &events,
                state,
                Subject::Request(request),
                None,
            )
            .await
        }
    };
    decisions.extend(chain.decisions);
    let emitted = u32::try_from(decisions.len()).unwrap_or(u32::MAX);
    if !decisions.is_empty() {
        let parent = state.run_span_id.clone();
        let events = decisions
            .into_iter()
            .map(|payload| io.event(&step.span, Some(&parent), None, payload))
            .collect();
        io.write(state, events).await?;
    }
    Ok(match chain.end {
        End::Continue => match (chain.replaced, chain.subject) {
            (true, Subject::Request(request)) => Gate::Pass(Some(Box::new(request))),
            _ => Gate::Pass(None),
        },
        End::Stop { .. } => Gate::Stopped { emitted },
        End::Fail { error_type, reason } => Gate::Failed {
            emitted,
            error_type,
            error: reason,
        },
        // Not allowed at this point; `hooks::run` refuses them.
        End::Retry { policy, .. } | End::Deny { policy, .. } | End::Pause { policy, .. } => {
            Gate::Failed {
                emitted,
                error_type: format!("policy.{policy}"),
                error: format!("policy {policy} returned a decision not allowed before_model"),
            }
        }
    })
}

/// Journals the answer of `model` (after the exchange that brought it, when captured) and
/// the end of its step, in one append.
async fn answered(
    io: &mut Io<'_>,
    state: &mut RunState,
    step: &StepSpan,
    model: &ModelBinding,
    answer: Answer,
    finalizing: bool,
    emitted: u32,
) -> Result<(), EngineError> {
    let mut answer = answer;
    if finalizing {
        answer.response = without_calls(answer.response);
    }
    distinct_call_ids(&mut answer.response.message, &state.messages);
    let caller = Caller {
        slot: SLOT,
        call_id: None,
        judge: None,
        span: &step.span,
        parent: Some(&state.run_span_id),
    };
    let (responded, exchanged) = chain::responded(io, caller, model, answer);
    let mut batch = exchanged;
    let inside = u32::try_from(batch.len()).unwrap_or(u32::MAX);
    let done = step.completed(io, state, emitted + inside + 1, Outcome::Ok);
    batch.extend([responded, done]);
    io.write(state, batch).await.map(drop)
}

/// Journals the end of a step whose every model failed, and the run's failure, in one append.
async fn failed(
    io: &mut Io<'_>,
    state: &mut RunState,
    step: &StepSpan,
    error: ModelError,
    emitted: u32,
) -> Result<(), EngineError> {
    let error_type = format!("model.{}", error.kind.as_str());
    let mut batch = vec![step.completed(io, state, emitted, Outcome::Error)];
    batch.extend(
        io.events()
            .failure(state, &error_type, &error_type, &error.message),
    );
    io.write(state, batch).await.map(drop)
}

/// A finalizing answer keeps its text and drops any tool call.
/// Renames the tool calls of `answer` whose id is already used in the run (`earlier`) or twice
/// in the answer: `<id>_2`, `<id>_3`… A call id then names one call of the run, so a result,
/// an approval or a policy decision can never be taken for another call's.
fn distinct_call_ids(answer: &mut Message, earlier: &[Message]) {
    let mut used: BTreeSet<String> = earlier
        .iter()
        .flat_map(|m| m.tool_calls().map(|(id, _, _)| id.to_owned()))
        .collect();
    for block in &mut answer.blocks {
        if let BlockKind::ToolCall { call_id, .. } = &mut block.kind {
            if used.contains(call_id.as_str()) {
                let base = call_id.clone();
                let fresh = (2u32..)
                    .map(|n| format!("{base}_{n}"))
                    .find(|candidate| !used.contains(candidate))
                    .unwrap_or(base);
                tracing::debug!(from = %call_id, to = %fresh, "tool call id already used in the run: renamed");
                *call_id = fresh;
            }
            used.insert(call_id.clone());
        }
    }
}

fn without_calls(mut response: ModelResponse) -> ModelResponse {
    response
        .message
        .blocks
        .retain(|b| !matches!(b.kind, BlockKind::ToolCall { .. }));
    if response.message.blocks.is_empty() {
        response.message.blocks.push(loom_core::Block::text(""));
    }
    if response.stop_reason == StopReason::ToolUse {
        response.stop_reason = StopReason::End;
    }
    response
}
