//! A call to a slot's model chain (the orchestrator's, a role's, a judge's), made resilient:
//! each model is tried with its retry policy and stream timeouts, skipped while its circuit
//! breaker is open, and left for the next one when it keeps failing. Every decision is
//! journaled in the caller's span (`model.retried`, `circuit.opened`, `model.fell_back`); the
//! answer of the attempt that succeeded is returned for the caller to journal
//! ([`responded`]).

use std::{sync::Arc, time::Instant};

use loom_core::{
    Event, RunState,
    circuit::Admission,
    event::{CircuitOpened, ModelExchanged, ModelFellBack, ModelResponded, ModelRetried, Payload},
    model::{HttpExchange, ModelError, ModelErrorKind, ModelRequest, ModelResponse},
    ports::ArtifactStore,
};

use crate::{
    binding::ModelBinding,
    error::EngineError,
    io::{Io, StepEnd},
    observer::Observer,
    request,
    resilience::{self, Breakers},
};

/// What a model call needs besides the run's [`Io`]: the engine's breakers, the artifact store
/// (images sent inline to vision models), and where streamed text goes.
#[derive(Clone, Copy)]
pub(crate) struct Models<'a> {
    /// The circuit breakers shared by the engine's runs.
    pub(crate) breakers: &'a Breakers,
    /// The artifact store, if any.
    pub(crate) artifacts: Option<&'a Arc<dyn ArtifactStore>>,
    /// Sees the orchestrator's text deltas.
    pub(crate) observer: &'a dyn Observer,
    /// Whether the orchestrator's text is streamed to the observer (not a sub-run's).
    pub(crate) live: bool,
}

/// The slot of the orchestrating model.
pub(crate) const SLOT: &str = "main";

/// Who a model call is for: the orchestrator, a role call or a judge.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller<'s> {
    /// The slot (`main`, a role name, `judge:<name>`): the envelope role and the key of the
    /// model the run switched to.
    pub(crate) slot: &'s str,
    /// The role call answered.
    pub(crate) call_id: Option<&'s str>,
    /// The judge answering.
    pub(crate) judge: Option<&'s str>,
    /// The span the events go in.
    pub(crate) span: &'s str,
    /// Its parent span.
    pub(crate) parent: Option<&'s str>,
}

/// How a model chain call ended.
pub(crate) enum ChainEnd<'m> {
    /// A model answered.
    Answered {
        /// The model that answered.
        model: &'m ModelBinding,
        /// Its answer.
        answer: Answer,
    },
    /// Cancelled or out of time.
    Interrupted {
        /// Out of time (else cancelled).
        timed_out: bool,
    },
    /// Every model failed.
    Failed(ModelError),
}

/// What the attempts of one model step have done so far.
#[derive(Debug, Default)]
pub(crate) struct AttemptState {
    /// Whether an attempt already streamed (the observer is reset before the next one).
    streamed: bool,
    /// Events written inside the step, besides `step.started` and `step.completed`.
    pub(crate) emitted: u32,
}

/// A model's answer and how it was obtained.
pub(crate) struct Answer {
    pub(crate) response: ModelResponse,
    attempts: u32,
    latency_ms: f64,
    request_hash: String,
    request_parts: serde_json::Map<String, serde_json::Value>,
    /// The `model.exchanged` events of the attempt that answered.
    exchanged: Vec<Event>,
}

/// How the attempts on one model ended.
enum Attempts {
    Answered(Answer),
    Interrupted {
        timed_out: bool,
    },
    /// Retries exhausted, quota, context overflow, or the breaker opened: try the next model.
    Exhausted(ModelError),
    /// A definitive error: the run fails.
    Fatal(ModelError),
}

/// Calls a slot's model chain from `start` until a model answers: each model is tried
/// with its retry policy, skipped while its breaker is open, and left for the next one
/// (`model.fell_back`) when it keeps failing. Events go in `caller.span`, with the
/// caller's envelope role, `call_id` and `judge`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn call<'m>(
    io: &mut Io<'_>,
    models: &Models<'_>,
    state: &mut RunState,
    caller: Caller<'_>,
    chain: &[&'m ModelBinding],
    start: usize,
    build: &(dyn Fn(&ModelBinding) -> ModelRequest + Sync),
    deadline: Option<tokio::time::Instant>,
    progress: &mut AttemptState,
) -> Result<ChainEnd<'m>, EngineError> {
    let mut index = start.min(chain.len().saturating_sub(1));
    let mut last_error: Option<ModelError> = None;
    let mut skipped: Vec<&str> = Vec::new();
    // After a context overflow, only a model with a larger window may follow.
    let mut window_above: Option<u64> = None;
    loop {
        let Some(&model) = chain.get(index) else {
            return Ok(ChainEnd::Failed(ModelError::new(
                ModelErrorKind::Unavailable,
                format!("no model for slot '{}'", caller.slot),
            )));
        };
        let admission = match &model.circuit {
            Some(settings) => models.breakers.admit(
                &Breakers::model_key(&model.config_id),
                settings,
                io.events().now(),
            ),
            None => Admission::Go,
        };
        let (reason, error) = if let Admission::Skip { until } = admission {
            skipped.push(&model.config_id);
            let message = format!(
                "circuit breaker of model '{}' is open until {}",
                model.config_id,
                until.to_rfc3339()
            );
            ("circuit_open".to_owned(), message)
        } else {
            let request = build(model);
            match attempts(
                io, models, state, caller, model, request, deadline, progress,
            )
            .await?
            {
                Attempts::Answered(answer) => {
                    return Ok(ChainEnd::Answered { model, answer });
                }
                Attempts::Interrupted { timed_out } => {
                    return Ok(ChainEnd::Interrupted { timed_out });
                }
                Attempts::Fatal(error) => return Ok(ChainEnd::Failed(error)),
                Attempts::Exhausted(error) => {
                    if error.kind == ModelErrorKind::ContextOverflow {
                        let window = model.context_window.unwrap_or(0);
                        window_above = Some(window_above.map_or(window, |w| w.max(window)));
                    }
                    let reason = error.kind.as_str().to_owned();
                    let message = error.message.clone();
                    last_error = Some(error);
                    (reason, message)
                }
            }
        };
        let next = chain
            .iter()
            .enumerate()
            .skip(index + 1)
            .find(|(_, m)| window_above.is_none_or(|w| m.context_window.unwrap_or(0) > w))
            .map(|(i, _)| i);
        let Some(next) = next else {
            let error = match last_error {
                Some(mut error) => {
                    if !skipped.is_empty() {
                        error.message = format!(
                            "{}; no other model available (skipped by their circuit breaker: {})",
                            error.message,
                            skipped.join(", ")
                        );
                    } else if error.kind == ModelErrorKind::ContextOverflow && chain.len() > 1 {
                        error.message = format!(
                            "{}; no following model has a larger context window",
                            error.message
                        );
                    }
                    error
                }
                None => ModelError::new(
                    ModelErrorKind::Unavailable,
                    format!("skipped by their circuit breaker: {}", skipped.join(", ")),
                ),
            };
            return Ok(ChainEnd::Failed(error));
        };
        let fell_back = io.event(
            caller.span,
            caller.parent,
            Some(caller.slot),
            Payload::ModelFellBack(ModelFellBack {
                slot: caller.slot.into(),
                from_model: model.config_id.clone(),
                to_model: chain[next].config_id.clone(),
                reason,
                error: Some(error),
                call_id: caller.call_id.map(str::to_owned),
                judge: caller.judge.map(str::to_owned),
            }),
        );
        io.write(state, vec![fell_back]).await?;
        progress.emitted += 1;
        index = next;
    }
}

/// The `model.responded` of an answer obtained for `caller` from `model`.
pub(crate) fn responded(
    io: &Io<'_>,
    caller: Caller<'_>,
    model: &ModelBinding,
    answer: Answer,
) -> (Event, Vec<Event>) {
    let response = answer.response;
    let cost = model.pricing.cost(&response.usage);
    let event = io.event(
        caller.span,
        caller.parent,
        Some(caller.slot),
        Payload::ModelResponded(ModelResponded {
            model_id: response.model_id,
            model: Some(model.config_id.clone()),
            provider: model.client.provider().to_owned(),
            message: response.message,
            usage: response.usage,
            cost_usd: cost,
            stop_reason: response.stop_reason,
            latency_ms: answer.latency_ms,
            attempts: answer.attempts,
            request_hash: Some(answer.request_hash),
            request_parts: answer.request_parts,
            call_id: caller.call_id.map(str::to_owned),
            judge: caller.judge.map(str::to_owned),
        }),
    );
    (event, answer.exchanged)
}

/// Tries one model of the chain until it answers, fails for good, or should be left.
#[allow(clippy::too_many_arguments)]
async fn attempts(
    io: &mut Io<'_>,
    models: &Models<'_>,
    state: &mut RunState,
    caller: Caller<'_>,
    model: &ModelBinding,
    request: ModelRequest,
    deadline: Option<tokio::time::Instant>,
    progress: &mut AttemptState,
) -> Result<Attempts, EngineError> {
    let key = Breakers::model_key(&model.config_id);
    let run = io.events().run();
    let observer = models.observer;
    // Only the orchestrator's text is streamed to a live display (not a sub-run's).
    let live = caller.slot == SLOT && models.live;
    let (request_hash, request_parts) = request::request_hash(&request);
    // Images go inline to a model that reads them, once the request is hashed: the hash
    // names the request by its content-addressed references, as the journal knows it.
    let request = if model.vision {
        crate::attachments::inline_images(models.artifacts, request).await
    } else {
        request
    };
    let mut attempt = 1u32;
    loop {
        if progress.streamed && live {
            // A live display drops what the failed attempt showed.
            observer.reset(&run.run_id);
        }
        progress.streamed = true;
        let started = Instant::now();
        let mut exchanges = Vec::new();
        let call = resilience::stream_once(
            model.client.clone(),
            &request,
            model.timeouts,
            |text| {
                if live {
                    observer.text_delta(&run.run_id, text)
                }
            },
            |exchange| exchanges.push(exchange),
        );
        let end = io.wait(state, call, deadline).await?;
        let exchanged = exchanged(io, caller, model, attempt, exchanges);
        let error = match end {
            StepEnd::Done(Ok(response)) => {
                if model.circuit.is_some() {
                    models.breakers.success(&key);
                }
                return Ok(Attempts::Answered(Answer {
                    response,
                    attempts: attempt,
                    latency_ms: started.elapsed().as_secs_f64() * 1000.0,
                    request_hash,
                    request_parts,
                    exchanged,
                }));
            }
            StepEnd::Done(Err(error)) => {
                // The exchange of a failed attempt goes before what its failure leads to.
                write_in_step(io, state, exchanged, progress).await?;
                error
            }
            end @ (StepEnd::Cancelled | StepEnd::TimedOut) => {
                write_in_step(io, state, exchanged, progress).await?;
                if model.circuit.is_some() {
                    // A trial cut short says nothing about the model.
                    models.breakers.release(&key, io.events().now());
                }
                let timed_out = matches!(end, StepEnd::TimedOut);
                return Ok(Attempts::Interrupted { timed_out });
            }
        };
        tracing::debug!(run_id = %run.run_id, model = %model.config_id, attempt, kind = %error.kind, error = %error.message, "model call failed");
        let trying = Trying {
            caller,
            model,
            key: &key,
        };
        let opened = trying.failed(io, models, state, &error, progress).await?;
        if let Some(end) = trying
            .retry(io, state, attempt, error, opened, deadline, progress)
            .await?
        {
            return Ok(end);
        }
        attempt += 1;
    }
}

/// One model of a chain being tried for a caller.
struct Trying<'c> {
    caller: Caller<'c>,
    model: &'c ModelBinding,
    /// Its breaker's key.
    key: &'c str,
}

impl Trying<'_> {
    /// Reports a failed attempt to the model's breaker; when that opens it, `circuit.opened` is
    /// journaled in the step. Returns whether it opened.
    async fn failed(
        &self,
        io: &mut Io<'_>,
        models: &Models<'_>,
        state: &mut RunState,
        error: &ModelError,
        progress: &mut AttemptState,
    ) -> Result<bool, EngineError> {
        let (caller, model) = (self.caller, self.model);
        let Some(settings) = &model.circuit else {
            return Ok(false);
        };
        let Some(failures) =
            models
                .breakers
                .failure(self.key, settings, error.kind, io.events().now())
        else {
            return Ok(false);
        };
        let event = io.event(
            caller.span,
            caller.parent,
            Some(caller.slot),
            Payload::CircuitOpened(CircuitOpened {
                target_kind: "model".into(),
                target: model.config_id.clone(),
                failures,
                cooldown_s: settings.cooldown.as_secs_f64(),
                error: Some(error.message.clone()),
                call_id: caller.call_id.map(str::to_owned),
                judge: caller.judge.map(str::to_owned),
            }),
        );
        io.write(state, vec![event]).await?;
        progress.emitted += 1;
        Ok(true)
    }

    /// What failed attempt `attempt` leads to: `None` to try the model again, after the
    /// retry's delay (`model.retried`, journaled before the wait, which cancellation and the
    /// run timeout cut); else leave the model (retries exhausted, the breaker `opened`, a
    /// `Retry-After` too long, quota, context overflow) or fail for good.
    #[allow(clippy::too_many_arguments)]
    async fn retry(
        &self,
        io: &mut Io<'_>,
        state: &mut RunState,
        attempt: u32,
        error: ModelError,
        opened: bool,
        deadline: Option<tokio::time::Instant>,
        progress: &mut AttemptState,
    ) -> Result<Option<Attempts>, EngineError> {
        let (caller, model) = (self.caller, self.model);
        match error.kind {
            kind if kind.is_retryable() => {}
            ModelErrorKind::QuotaExhausted | ModelErrorKind::ContextOverflow => {
                return Ok(Some(Attempts::Exhausted(error)));
            }
            _ => return Ok(Some(Attempts::Fatal(error))),
        }
        if opened || attempt >= model.retry.attempts() {
            return Ok(Some(Attempts::Exhausted(error)));
        }
        let delay = match error.retry_after {
            Some(after) if after > model.retry.max_delay => {
                return Ok(Some(Attempts::Exhausted(error)));
            }
            Some(after) => after,
            None => model
                .retry
                .delay(attempt, resilience::jitter(&io.events().uuid())),
        };
        let retried = io.event(
            caller.span,
            caller.parent,
            Some(caller.slot),
            Payload::ModelRetried(ModelRetried {
                model_id: model.model_id.clone(),
                model: Some(model.config_id.clone()),
                provider: model.client.provider().to_owned(),
                attempt,
                error_kind: error.kind.as_str().to_owned(),
                error: error.message.clone(),
                http_status: error.http_status,
                delay_s: delay.as_secs_f64(),
                call_id: caller.call_id.map(str::to_owned),
                judge: caller.judge.map(str::to_owned),
                usage: None,
                cost_usd: 0.0,
                r#final: false,
            }),
        );
        io.write(state, vec![retried]).await?;
        progress.emitted += 1;
        Ok(
            match io.wait(state, tokio::time::sleep(delay), deadline).await? {
                StepEnd::Done(()) => None,
                StepEnd::Cancelled => Some(Attempts::Interrupted { timed_out: false }),
                StepEnd::TimedOut => Some(Attempts::Interrupted { timed_out: true }),
            },
        )
    }
}

/// The `model.exchanged` events of one attempt, from the exchanges its stream captured
/// (none unless `telemetry.capture.raw_exchanges` is on).
fn exchanged(
    io: &Io<'_>,
    caller: Caller<'_>,
    model: &ModelBinding,
    attempt: u32,
    exchanges: Vec<HttpExchange>,
) -> Vec<Event> {
    exchanges
        .into_iter()
        .map(|exchange| {
            let mut exchanged = ModelExchanged::observed(
                exchange,
                model.model_id.clone(),
                Some(model.config_id.clone()),
                model.client.provider().to_owned(),
                attempt,
            );
            exchanged.call_id = caller.call_id.map(str::to_owned);
            exchanged.judge = caller.judge.map(str::to_owned);
            io.event(
                caller.span,
                caller.parent,
                Some(caller.slot),
                Payload::ModelExchanged(exchanged),
            )
        })
        .collect()
}

/// Writes events inside the current model step, counting them.
pub(crate) async fn write_in_step(
    io: &mut Io<'_>,
    state: &mut RunState,
    events: Vec<Event>,
    progress: &mut AttemptState,
) -> Result<(), EngineError> {
    if events.is_empty() {
        return Ok(());
    }
    progress.emitted = progress
        .emitted
        .saturating_add(u32::try_from(events.len()).unwrap_or(u32::MAX));
    io.write(state, events).await.map(drop)
}
