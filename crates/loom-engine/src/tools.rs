//! The tool batch: every call of one model turn, validated, launched concurrently, journaled.
//!
//! Journal order: first the calls refused before launch (unknown tool, unreadable or invalid
//! arguments; a `tool.completed` error each, no `tool.called`), in call order; then every
//! `tool.called` of the batch in one write; then each `tool.completed` as its tool finishes.
//! The next model request re-sorts results into call order, so requests stay deterministic.
//! Sub-agent calls run alongside as child runs ([`crate::subagents`]); a child that waits for a
//! human ends the batch with the run in `waiting_child`.

use std::{any::Any, panic::AssertUnwindSafe, time::Instant};

use futures_util::FutureExt;

use loom_core::{
    RunState, RunStatus,
    approval::{ApprovalStatus, Decision, PendingApproval, expiry_message, rejection_message},
    event::{
        ApprovalGranted, ApprovalRejected, ApprovalRequested, Effect, IdempotencyRecorded,
        IdempotencyReused, Outcome, Payload, ToolCalled, ToolCompleted,
    },
    policy::Subject,
    ports::{DEFAULT_IDEMPOTENCY_TTL, IdempotencyScope, IdempotencyStore, Reservation},
    state::PendingCall,
    tool::{Approval, OnUnknown, SideEffects, ToolContext, ToolKind, ToolOutput},
};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::task::JoinSet;

use crate::{
    BoundTool, EngineError,
    driver::{Driver, StepEnd, StepSpan, fmt_secs},
    hooks::{self, End},
    roles::RoleEnd,
    subagents::{self, ChildDone, ChildEnd, Next},
    writer::SessionWriter,
};

/// Result given to the model for a call interrupted mid-flight whose effect may have happened.
pub const UNKNOWN_STATE: &str = "Unknown state: this tool's execution was interrupted and it may have \
produced its effect. It was not run again automatically; check before calling it again.";

/// What the business key of a call did to its launch.
enum Business {
    /// No business key (or no store).
    None,
    /// The key was already completed: the recorded result is reused, the tool does not run.
    Reused(String),
    /// The key is held by this call: its result is recorded when it completes.
    Held {
        store: std::sync::Arc<dyn IdempotencyStore>,
        key: String,
        holder: String,
    },
}

/// A call accepted for launch.
struct Launch {
    call: PendingCall,
    tool: BoundTool,
    span: String,
    resumed: bool,
    /// What the tool receives: the model's arguments, or those corrected at approval.
    arguments: Value,
    /// The child run of a sub-agent call.
    child: Option<String>,
    /// The `$ref`s resolved in its arguments (`tool.called.refs`).
    refs: Vec<Value>,
}

/// What the batch does with one call.
enum Plan {
    Launch {
        tool: BoundTool,
        resumed: bool,
        arguments: Value,
    },
    Refuse(String),
    /// Held until a human decides.
    Ask {
        reason: String,
        arguments: Value,
        /// The policy that asked (none: the tool's declaration).
        policy: Option<String>,
    },
    /// Already held by a request that waits.
    Wait,
}

/// Why a call that was interrupted mid-flight waits for a human (`on_unknown: pause`).
pub const UNKNOWN_REASON: &str = "the call was interrupted mid-flight and may have produced its \
effect; it runs again only if approved";

pub(crate) async fn batch<'d>(
    driver: &mut Driver<'d>,
    state: &mut RunState,
    writer: &mut SessionWriter<'_>,
) -> Result<(), EngineError> {
    let step = StepSpan::open(driver, state, Effect::ToolBatch);
    driver
        .write(
            state,
            writer,
            vec![step.started(driver, state, Effect::ToolBatch)],
        )
        .await?;
    let mut emitted = 0u32;

    let offered = driver.offered(state).into_owned();
    let mut refusals = Vec::new();
    let mut launches = Vec::new();
    let mut requests = Vec::new();
    let refs_on = crate::roles::refs_enabled(&offered);
    for call in state.pending_calls.clone() {
        let span = driver.engine.ids().uuid();
        let tool = offered.iter().find(|t| t.name() == call.name);
        // `$ref`s are resolved first: the schema check, the policies and the tool see the
        // results they name; `tool.called` keeps what the model wrote.
        let mut call = call;
        let mut resolved = None;
        if refs_on && tool.is_some() {
            match crate::roles::resolve_refs(driver, state, call.effective_arguments()).await {
                Ok(None) => {}
                Ok(Some((arguments, refs))) => {
                    call.replaced_arguments = Some(arguments.clone());
                    resolved = Some((arguments, refs));
                }
                Err(message) => {
                    refusals.push(driver.event(
                        &span,
                        Some(&step.span),
                        None,
                        completed_payload(&call, ToolOutput::error(message), 0.0),
                    ));
                    continue;
                }
            }
        }
        // A fresh call passes the `before_tool` policies first; their decisions are journaled
        // before anything else happens to the call.
        let mut policy_plan = None;
        if let Some(tool) = tool
            && !call.started
            && state.approval(&call.call_id).is_none()
            && check_arguments(driver, tool, call.effective_arguments()).is_ok()
        {
            let subject = Subject::Call {
                tool: call.name.clone(),
                call_id: call.call_id.clone(),
                arguments: call.effective_arguments().clone(),
            };
            let chain = hooks::run(driver, state, subject, Some(&call.call_id)).await;
            let decided: Vec<_> = chain
                .decisions
                .into_iter()
                .map(|payload| driver.event(&span, Some(&step.span), None, payload))
                .collect();
            if !decided.is_empty() {
                emitted += decided.len() as u32;
                driver.write(state, writer, decided).await?;
            }
            policy_plan = match chain.end {
                End::Continue => None,
                End::Deny { policy, reason } => Some(Plan::Refuse(hooks::denied(&policy, &reason))),
                End::Pause { policy, reason } => Some(Plan::Ask {
                    reason,
                    arguments: state
                        .pending_calls
                        .iter()
                        .find(|c| c.call_id == call.call_id)
                        .map_or_else(
                            || call.arguments.clone(),
                            |c| c.effective_arguments().clone(),
                        ),
                    policy: Some(policy),
                }),
                End::Fail { error_type, reason } => {
                    let mut batch = vec![step.completed(driver, state, emitted, Outcome::Error)];
                    batch.extend(driver.failure(state, "policy.decided", &error_type, &reason));
                    return driver.write(state, writer, batch).await.map(drop);
                }
                // Not allowed before_tool: `hooks::run` refuses them.
                End::Retry { .. } | End::Stop { .. } => None,
            };
        }
        // The call as the policies left it (arguments replaced), else with its `$ref`s resolved.
        let mut call = state
            .pending_calls
            .iter()
            .find(|c| c.call_id == call.call_id)
            .cloned()
            .unwrap_or(call);
        if call.replaced_arguments.is_none() {
            call.replaced_arguments = resolved.as_ref().map(|(arguments, _)| arguments.clone());
        }
        let plan = match (tool, policy_plan) {
            (_, Some(plan)) => plan,
            (None, None) => Plan::Refuse(unknown_tool(&offered, &call.name)),
            (Some(tool), None) => plan_call(driver, state, &call, tool),
        };
        let plan = match plan {
            Plan::Ask {
                reason,
                arguments,
                policy,
            } => {
                let Some(tool) = tool else { continue };
                let requested = request(driver, &call, tool, reason, arguments, policy);
                let request_event = driver.event(&span, Some(&step.span), None, requested);
                let Some(approver) = driver.approver.clone() else {
                    requests.push(request_event);
                    continue;
                };
                // An inline approver decides now: the request and its decision are journaled,
                // and the call runs (or not) in this batch.
                let pending = pending_of(driver, &request_event);
                driver.write(state, writer, vec![request_event]).await?;
                emitted += 1;
                let decision = match driver
                    .wait(state, writer, approver.decide(pending), None)
                    .await?
                {
                    StepEnd::Done(decision) => decision,
                    _ => {
                        return driver
                            .interrupted(state, writer, &step, emitted, false)
                            .await;
                    }
                };
                let payload = decision_payload(&call, &decision);
                let decided = driver.event(&span, Some(&step.span), None, payload);
                driver.write(state, writer, vec![decided]).await?;
                emitted += 1;
                plan_call(driver, state, &call, tool)
            }
            other => other,
        };
        match plan {
            Plan::Launch {
                tool,
                resumed,
                arguments,
            } => launches.push(Launch {
                child: subagents::child_id(driver, &tool, &call),
                call,
                tool,
                span,
                resumed,
                arguments,
                refs: resolved.map(|(_, refs)| refs).unwrap_or_default(),
            }),
            Plan::Refuse(message) => refusals.push(driver.event(
                &span,
                Some(&step.span),
                None,
                completed_payload(&call, ToolOutput::error(message), 0.0),
            )),
            Plan::Ask { .. } | Plan::Wait => {}
        }
    }
    if !refusals.is_empty() {
        emitted += refusals.len() as u32;
        driver.write(state, writer, refusals).await?;
    }
    let calls: Vec<_> = launches
        .iter()
        .map(|l| {
            driver.event(
                &l.span,
                Some(&step.span),
                None,
                Payload::ToolCalled(ToolCalled {
                    call_id: l.call.call_id.clone(),
                    tool_name: l.call.name.clone(),
                    tool_kind: l.tool.tool.spec().kind,
                    arguments: l.call.arguments.clone(),
                    refs: l.refs.clone(),
                    resumed: l.resumed,
                    child_run_id: l.child.clone(),
                }),
            )
        })
        .collect();
    // A cancel that arrived meanwhile stops the batch before any tool is launched.
    if driver.cancel.is_cancelled() {
        return driver
            .interrupted(state, writer, &step, emitted, false)
            .await;
    }
    if !calls.is_empty() {
        emitted += calls.len() as u32;
        driver.write(state, writer, calls).await?;
    }

    // Plain tools and sub-agents run concurrently in the background; roles then run one after
    // another.
    let (role_launches, launches): (Vec<Launch>, Vec<Launch>) = launches
        .into_iter()
        .partition(|l| l.tool.tool.spec().kind == ToolKind::Role);
    let mut running = JoinSet::new();
    let mut spans = Vec::with_capacity(launches.len());
    // Child runs of sub-agent calls: driven here, stopped with the batch.
    let mut children = subagents::Children::new();
    let stop_children = driver.cancel.child_token();
    let mut children_wait = false;
    for (index, launch) in launches.into_iter().enumerate() {
        if let Some(child) = &launch.child {
            children.push(subagents::launch(
                driver,
                state,
                &launch.call,
                &launch.span,
                child,
                &launch.arguments,
                index,
                stop_children.clone(),
            ));
            spans.push((launch.span, launch.call, launch.tool, Business::None));
            continue;
        }
        let ctx = ToolContext {
            tenant_id: driver.run.tenant_id.clone(),
            session_id: driver.run.session_id.clone(),
            run_id: driver.run.run_id.clone(),
            call_id: launch.call.call_id.clone(),
            idempotency_key: idempotency_key(&driver.run.run_id, &launch.call.call_id),
        };
        let timeout = launch
            .tool
            .declarations
            .timeout
            .or(driver.agent.tool_timeout);
        let tool = launch.tool.tool.clone();
        let arguments = launch.arguments.clone();
        let name = launch.call.name.clone();
        // A business key: reserve it before running, or reuse what another run recorded.
        let key = match (
            driver.engine.idempotency(),
            &launch.tool.declarations.business_key,
        ) {
            (Some(store), Some(business)) => business
                .key(&arguments)
                .map(|key| (store.clone(), format!("{}:{name}:{key}", ctx.tenant_id))),
            _ => None,
        };
        let mut business = Business::None;
        let mut ready = None;
        if let Some((store, key)) = key {
            let holder = ctx.idempotency_key.clone();
            let scope = IdempotencyScope {
                tenant_id: &ctx.tenant_id,
                session_id: &ctx.session_id,
            };
            match store
                .reserve(&key, &holder, scope, DEFAULT_IDEMPOTENCY_TTL)
                .await?
            {
                Reservation::Reserved => {
                    business = Business::Held { store, key, holder };
                }
                Reservation::Completed(output) => {
                    ready = Some(*output);
                    business = Business::Reused(key);
                }
                Reservation::Held => {
                    ready = Some(ToolOutput::error(format!(
                        "the same action is in progress in another run (key {key}); \
                         it was not run again"
                    )));
                }
            }
        }
        spans.push((launch.span, launch.call, launch.tool, business));
        if let Some(output) = ready {
            running.spawn(async move { (index, output, 0.0) });
            continue;
        }
        running.spawn(async move {
            let started = Instant::now();
            let call = AssertUnwindSafe(async {
                match timeout {
                    Some(limit) => tokio::time::timeout(limit, tool.call(ctx, arguments))
                        .await
                        .map_err(|_| limit),
                    None => Ok(tool.call(ctx, arguments).await),
                }
            });
            let output = match call.catch_unwind().await {
                Ok(Ok(Ok(output))) => output,
                Ok(Ok(Err(error))) => ToolOutput::error(error.message),
                Ok(Err(limit)) => {
                    ToolOutput::error(format!("Timed out: no answer in {} s.", fmt_secs(limit)))
                }
                Err(panic) => ToolOutput::error(format!(
                    "The tool {name} stopped abnormally: {}",
                    panic_message(&panic)
                )),
            };
            (index, output, started.elapsed().as_secs_f64() * 1000.0)
        });
    }

    // The run's timeout counts from the start of the batch, not from each result.
    let deadline = driver.deadline(state);
    for launch in role_launches {
        let started = Instant::now();
        let end = crate::roles::call(
            driver,
            state,
            writer,
            &step,
            &launch.call,
            &launch.span,
            &launch.arguments,
            deadline,
        )
        .await?;
        let (output, cost_usd) = match end {
            RoleEnd::Done {
                output,
                cost_usd,
                emitted: inside,
            } => {
                emitted += inside;
                (*output, cost_usd)
            }
            RoleEnd::Interrupted {
                timed_out,
                emitted: inside,
            } => {
                emitted += inside;
                running.abort_all();
                // Children close themselves (reason `parent`) before their parent does.
                let stopped = subagents::stop(&stop_children, &mut children).await;
                let results = stopped_children(driver, &step, &spans, stopped);
                if !results.is_empty() {
                    emitted += results.len() as u32;
                    driver.write(state, writer, results).await?;
                }
                return driver
                    .interrupted(state, writer, &step, emitted, timed_out)
                    .await;
            }
        };
        let latency = started.elapsed().as_secs_f64() * 1000.0;
        let finished = finish_call(
            driver,
            state,
            &launch.span,
            &step,
            &launch.call,
            &launch.tool,
            output,
            latency,
            Consumption::Role(cost_usd),
        )
        .await?;
        match finished {
            Finished::Completed(events) => {
                emitted += events.len() as u32;
                driver.write(state, writer, events).await?;
            }
            Finished::Failed {
                events,
                error_type,
                reason,
            } => {
                running.abort_all();
                let stopped = subagents::stop(&stop_children, &mut children).await;
                let mut batch = stopped_children(driver, &step, &spans, stopped);
                batch.extend(events);
                emitted += batch.len() as u32;
                batch.push(step.completed(driver, state, emitted, Outcome::Error));
                batch.extend(driver.failure(state, "policy.decided", &error_type, &reason));
                return driver.write(state, writer, batch).await.map(drop);
            }
        }
    }
    while !running.is_empty() || !children.is_empty() {
        let next = driver
            .wait(
                state,
                writer,
                subagents::next(&mut running, &mut children),
                deadline,
            )
            .await?;
        // A sub-agent's result carries the child run's consumption, rolled up.
        let (index, output, latency, rolled) = match next {
            // Panics are caught inside the task, so a join error can only be an abort.
            StepEnd::Done(Next::Tool(joined)) => match joined {
                Ok((index, output, latency)) => (index, output, latency, None),
                Err(_) => continue,
            },
            StepEnd::Done(Next::Child(done)) => {
                let ChildDone {
                    index,
                    end,
                    latency_ms,
                } = *done;
                let end = match end {
                    Ok(end) => end,
                    Err(error) => {
                        running.abort_all();
                        subagents::stop(&stop_children, &mut children).await;
                        return Err(error);
                    }
                };
                let cancelled = matches!(end, ChildEnd::Cancelled { .. });
                let waits = matches!(end, ChildEnd::Waiting);
                let Some((output, usage, cost)) = end.result(&spans[index].1.name) else {
                    // The child waits for a human, or stopped with the engine: its call stays
                    // open.
                    children_wait |= waits;
                    continue;
                };
                if cancelled {
                    // A cancelled child cancels its parent.
                    running.abort_all();
                    let (span, call, ..) = &spans[index];
                    let mut batch = vec![driver.event(
                        span,
                        Some(&step.span),
                        None,
                        subagents::rolled_up(
                            completed_payload(call, output, latency_ms),
                            usage,
                            cost,
                        ),
                    )];
                    let stopped = subagents::stop(&stop_children, &mut children).await;
                    batch.extend(stopped_children(driver, &step, &spans, stopped));
                    emitted += batch.len() as u32;
                    driver.write(state, writer, batch).await?;
                    return driver
                        .interrupted(state, writer, &step, emitted, false)
                        .await;
                }
                (index, output, latency_ms, Some((usage, cost)))
            }
            StepEnd::Done(Next::Empty) => break,
            end @ (StepEnd::Cancelled | StepEnd::TimedOut) => {
                running.abort_all();
                // Children close themselves (reason `parent`) before their parent does.
                let stopped = subagents::stop(&stop_children, &mut children).await;
                let results = stopped_children(driver, &step, &spans, stopped);
                if !results.is_empty() {
                    emitted += results.len() as u32;
                    driver.write(state, writer, results).await?;
                }
                let timed_out = matches!(end, StepEnd::TimedOut);
                return driver
                    .interrupted(state, writer, &step, emitted, timed_out)
                    .await;
            }
        };
        let (span, call, tool, business) = &spans[index];
        let mut batch = Vec::with_capacity(4);
        match business {
            Business::None => {}
            Business::Reused(key) => {
                emitted += 1;
                batch.push(driver.event(
                    span,
                    Some(&step.span),
                    None,
                    Payload::IdempotencyReused(IdempotencyReused {
                        key: key.clone(),
                        call_id: call.call_id.clone(),
                        tool_name: call.name.clone(),
                    }),
                ));
            }
            Business::Held { store, key, holder } => {
                if output.is_error {
                    // The action failed: the next run may try it.
                    store.release(key, holder).await?;
                } else {
                    store.complete(key, holder, &output).await?;
                    emitted += 1;
                    batch.push(driver.event(
                        span,
                        Some(&step.span),
                        None,
                        Payload::IdempotencyRecorded(IdempotencyRecorded {
                            key: key.clone(),
                            call_id: call.call_id.clone(),
                            tool_name: call.name.clone(),
                            result: output.clone(),
                        }),
                    ));
                }
            }
        }
        // The tool's output contract, the `after_tool` policies, the offload.
        let consumption = match rolled {
            Some((usage, cost)) => Consumption::Child(usage, cost),
            None => Consumption::None,
        };
        let finished = finish_call(
            driver,
            state,
            span,
            &step,
            call,
            tool,
            output,
            latency,
            consumption,
        )
        .await?;
        match finished {
            Finished::Completed(events) => {
                emitted += events.len() as u32;
                batch.extend(events);
            }
            Finished::Failed {
                events,
                error_type,
                reason,
            } => {
                running.abort_all();
                let stopped = subagents::stop(&stop_children, &mut children).await;
                let results = stopped_children(driver, &step, &spans, stopped);
                emitted += results.len() as u32;
                batch.extend(results);
                emitted += events.len() as u32;
                batch.extend(events);
                batch.push(step.completed(driver, state, emitted, Outcome::Error));
                batch.extend(driver.failure(state, "policy.decided", &error_type, &reason));
                return driver.write(state, writer, batch).await.map(drop);
            }
        }
        if running.is_empty() && children.is_empty() {
            // The last result and the end of the step go to the journal in one append;
            // earlier results were each made durable as soon as they came. Approval requests
            // come after the results of the calls that ran.
            emitted += requests.len() as u32;
            batch.append(&mut requests);
            batch.push(step.completed(driver, state, emitted, Outcome::Ok));
            batch.extend(waiting_children(driver, state, children_wait));
            return driver.write(state, writer, batch).await.map(drop);
        }
        driver.write(state, writer, batch).await?;
    }
    emitted += requests.len() as u32;
    let done = step.completed(driver, state, emitted, Outcome::Ok);
    requests.push(done);
    requests.extend(waiting_children(driver, state, children_wait));
    driver.write(state, writer, requests).await.map(drop)
}

/// After a batch in which child runs stopped to wait for a human: the run waits for them
/// (`awaiting_tools` → `waiting_child`), and its pilot hands the lease back.
fn waiting_children(
    driver: &mut Driver<'_>,
    state: &RunState,
    children_wait: bool,
) -> Option<loom_core::Event> {
    if !children_wait {
        return None;
    }
    driver.children_blocked = true;
    Some(driver.transition(
        state,
        RunStatus::WaitingChild,
        "model.responded",
        driver.last_ids.model.clone(),
    ))
}

/// The results of sub-agent calls whose child runs were stopped with the batch (a child that
/// waits keeps its call open: closing the parent cancels it).
fn stopped_children(
    driver: &Driver<'_>,
    step: &StepSpan,
    spans: &[(String, PendingCall, BoundTool, Business)],
    stopped: Vec<ChildDone>,
) -> Vec<loom_core::Event> {
    stopped
        .into_iter()
        .filter_map(|done| {
            let (span, call, ..) = &spans[done.index];
            let end = match done.end {
                Ok(end) => end,
                Err(error) => {
                    tracing::warn!(run_id = %driver.run.run_id, call_id = %call.call_id, %error, "sub-run stopped with an error");
                    return None;
                }
            };
            let (output, usage, cost) = end.result(&call.name)?;
            Some(driver.event(
                span,
                Some(&step.span),
                None,
                subagents::rolled_up(completed_payload(call, output, done.latency_ms), usage, cost),
            ))
        })
        .collect()
}

/// What a call consumed, restated on its `tool.completed`.
enum Consumption {
    /// Nothing (a plain tool).
    None,
    /// The cost of a role's model calls (already counted by their `model.responded`).
    Role(f64),
    /// A sub-agent's child run, rolled up (counted by the parent from `tool.completed`).
    Child(loom_core::Usage, f64),
}

/// What became of a result on its way to the journal.
enum Finished {
    /// The events to write: the `after_tool` decisions, `artifact.stored` when the result was
    /// offloaded, then `tool.completed`.
    Completed(Vec<loom_core::Event>),
    /// A policy failed the run: the events (ending with `tool.completed`), then the failure.
    Failed {
        events: Vec<loom_core::Event>,
        error_type: String,
        reason: String,
    },
}

/// The end of one call: the `after_tool` point (the tool's contract, the policies), the
/// `loom.terminal` note of a terminal role that was not alone in its turn, the offload of a
/// large result, then `tool.completed` with what the call consumed.
#[allow(clippy::too_many_arguments)]
async fn finish_call(
    driver: &Driver<'_>,
    state: &RunState,
    span: &str,
    step: &StepSpan,
    call: &PendingCall,
    tool: &BoundTool,
    output: ToolOutput,
    latency: f64,
    consumption: Consumption,
) -> Result<Finished, EngineError> {
    let completed = |output| {
        let payload = completed_payload(call, output, latency);
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
        driver.event(span, Some(&step.span), None, payload)
    };
    let (output, mut events) = match after_tool(driver, state, span, step, call, tool, output).await
    {
        AfterTool::Result { output, events } => (output, events),
        AfterTool::Failed {
            output,
            mut events,
            error_type,
            reason,
        } => {
            events.push(completed(output));
            return Ok(Finished::Failed {
                events,
                error_type,
                reason,
            });
        }
    };
    if let Some(payload) = crate::roles::not_alone(driver, state, call) {
        events.push(driver.event(span, Some(&step.span), None, payload));
    }
    let output = match (offload_limit(driver, tool), driver.engine.artifacts()) {
        (Some(limit), Some(store)) => {
            let moved = crate::offload::offload(
                store.as_ref(),
                &driver.run.tenant_id,
                &driver.run.session_id,
                &call.name,
                &call.call_id,
                &output,
                limit,
            )
            .await?;
            match moved {
                Some((stored, preview)) => {
                    events.push(driver.event(
                        span,
                        Some(&step.span),
                        None,
                        Payload::ArtifactStored(stored),
                    ));
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

/// What the `after_tool` point made of a result.
enum AfterTool {
    /// The result to journal, after the events that decided it.
    Result {
        output: ToolOutput,
        events: Vec<loom_core::Event>,
    },
    /// A policy failed the run.
    Failed {
        output: ToolOutput,
        events: Vec<loom_core::Event>,
        error_type: String,
        reason: String,
    },
}

/// The `after_tool` point: the tool's output contract (a result that breaks it becomes an
/// error with the diagnostic: a tool is never repaired), then the agent's policies.
async fn after_tool(
    driver: &Driver<'_>,
    state: &RunState,
    span: &str,
    step: &StepSpan,
    call: &PendingCall,
    tool: &BoundTool,
    output: ToolOutput,
) -> AfterTool {
    let mut events = Vec::new();
    let mut output = output;
    if let Some(contract) = &tool.contract
        && !output.is_error
    {
        let target = format!("tool:{}", call.name);
        let checked = |outcome: &str, reason, normalized, resolution| {
            crate::review::contract_checked(
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
            crate::contract::Verdict::Passed {
                text,
                data,
                normalized,
            } => {
                events.push(driver.event(
                    span,
                    Some(&step.span),
                    None,
                    checked("passed", None, normalized, None),
                ));
                if normalized {
                    let mut checked_output = ToolOutput::text(text);
                    checked_output.data = data.or(output.data.take());
                    output = checked_output;
                }
            }
            crate::contract::Verdict::Failed { diagnostic, .. } => {
                events.push(driver.event(
                    span,
                    Some(&step.span),
                    None,
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
    let subject = Subject::Result {
        tool: call.name.clone(),
        call_id: call.call_id.clone(),
        output: output.clone(),
    };
    let chain = hooks::run(driver, state, subject, Some(&call.call_id)).await;
    events.extend(
        chain
            .decisions
            .into_iter()
            .map(|payload| driver.event(span, Some(&step.span), None, payload)),
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

/// What to do with one call of a known tool, from its declarations and its approvals.
fn plan_call(driver: &Driver<'_>, state: &RunState, call: &PendingCall, tool: &BoundTool) -> Plan {
    let record = state.approval(&call.call_id);
    let safe = tool.declarations.side_effects == SideEffects::None || tool.declarations.idempotent;
    // Arguments corrected by the last grant, if any, are what the tool receives.
    let granted = record.filter(|r| r.status == ApprovalStatus::Granted);
    let arguments = granted
        .and_then(|r| r.granted_arguments.clone())
        .unwrap_or_else(|| call.effective_arguments().clone());
    match record.map(|r| (&r.status, r)) {
        Some((ApprovalStatus::Pending, _)) => Plan::Wait,
        Some((ApprovalStatus::Rejected, r)) => Plan::Refuse(rejection_message(
            &call.name,
            r.by.as_deref().unwrap_or("?"),
            r.decision_reason.as_deref(),
        )),
        Some((ApprovalStatus::Expired { .. }, r)) => {
            Plan::Refuse(expiry_message(&call.name, r.expire_at))
        }
        // A grant covers one launch.
        Some((ApprovalStatus::Granted, r)) if !r.launched => {
            if call.started {
                Plan::Launch {
                    tool: tool.clone(),
                    resumed: true,
                    arguments,
                }
            } else {
                match check_arguments(driver, tool, &arguments) {
                    Ok(()) => Plan::Launch {
                        tool: tool.clone(),
                        resumed: false,
                        arguments,
                    },
                    Err(message) => Plan::Refuse(message),
                }
            }
        }
        _ if call.started => {
            // Launched before a crash: run again only when that cannot do harm.
            if safe {
                Plan::Launch {
                    tool: tool.clone(),
                    resumed: true,
                    arguments,
                }
            } else if tool.declarations.on_unknown == OnUnknown::Pause {
                Plan::Ask {
                    reason: UNKNOWN_REASON.to_owned(),
                    arguments,
                    policy: None,
                }
            } else {
                Plan::Refuse(UNKNOWN_STATE.to_owned())
            }
        }
        _ => match check_arguments(driver, tool, &arguments) {
            Err(message) => Plan::Refuse(message),
            Ok(()) if tool.declarations.approval == Approval::Always => {
                if let Some(refused) = state.approvals.iter().find(|a| {
                    a.status == ApprovalStatus::Rejected
                        && a.tool_name == call.name
                        && a.arguments == arguments
                }) {
                    // The same call was already refused in this run: not asked again.
                    return Plan::Refuse(format!(
                        "Call to {} not run: the same call, with the same arguments, was already \
                         refused at approval (by {}). It is not asked again.",
                        call.name,
                        refused.by.as_deref().unwrap_or("?")
                    ));
                }
                Plan::Ask {
                    reason: format!(
                        "tool declared as requiring approval (side effects: {})",
                        side_effects_name(tool.declarations.side_effects)
                    ),
                    arguments,
                    policy: None,
                }
            }
            Ok(()) => Plan::Launch {
                tool: tool.clone(),
                resumed: false,
                arguments,
            },
        },
    }
}

fn side_effects_name(side_effects: SideEffects) -> &'static str {
    match side_effects {
        SideEffects::None => "none",
        SideEffects::Reversible => "reversible",
        SideEffects::Irreversible => "irreversible",
    }
}

/// The `approval.requested` of a call, expiring after the agent's `expires_in`.
fn request(
    driver: &Driver<'_>,
    call: &PendingCall,
    tool: &BoundTool,
    reason: String,
    arguments: Value,
    policy: Option<String>,
) -> Payload {
    let expire_at = driver
        .agent
        .approval
        .expires_in
        .and_then(|d| chrono::Duration::from_std(d).ok())
        .and_then(|d| driver.engine.now().checked_add_signed(d));
    Payload::ApprovalRequested(ApprovalRequested {
        call_id: call.call_id.clone(),
        tool_name: tool.name().to_owned(),
        arguments,
        reason,
        policy,
        scope: "approve".into(),
        expire_at,
    })
}

/// What an inline approver is shown of a request.
fn pending_of(driver: &Driver<'_>, event: &loom_core::Event) -> PendingApproval {
    let Payload::ApprovalRequested(requested) = &event.payload else {
        unreachable!("pending_of is given an approval.requested");
    };
    PendingApproval {
        call_id: requested.call_id.clone(),
        tool_name: requested.tool_name.clone(),
        arguments: requested.arguments.clone(),
        reason: requested.reason.clone(),
        expire_at: requested.expire_at,
        run_id: driver.run.run_id.clone(),
        session_id: driver.run.session_id.clone(),
        tenant_id: driver.run.tenant_id.clone(),
    }
}

/// The journal event of a decision on `call`.
pub(crate) fn decision_payload(call: &PendingCall, decision: &Decision) -> Payload {
    match decision {
        Decision::Approved {
            by,
            reason,
            arguments,
        } => Payload::ApprovalGranted(ApprovalGranted {
            call_id: call.call_id.clone(),
            tool_name: call.name.clone(),
            by: by.clone(),
            reason: reason.clone(),
            arguments: arguments.clone(),
        }),
        Decision::Rejected { by, reason } => Payload::ApprovalRejected(ApprovalRejected {
            call_id: call.call_id.clone(),
            tool_name: call.name.clone(),
            by: by.clone(),
            reason: reason.clone(),
        }),
    }
}

/// The size above which this tool's results are offloaded (never for built-in tools nor
/// terminal roles, whose result may be the final answer).
fn offload_limit(driver: &Driver<'_>, tool: &BoundTool) -> Option<u64> {
    if tool.tool.spec().kind == ToolKind::Builtin || crate::roles::is_terminal(driver, tool.name())
    {
        return None;
    }
    tool.declarations.offload_over.or(driver.agent.offload_over)
}

/// The `tool.completed` of `call`.
pub(crate) fn completed_payload(
    call: &PendingCall,
    output: ToolOutput,
    latency_ms: f64,
) -> Payload {
    let size = serde_json::to_string(&output).map_or(0, |s| s.len() as u64);
    Payload::ToolCompleted(ToolCompleted {
        call_id: call.call_id.clone(),
        tool_name: call.name.clone(),
        output,
        latency_ms,
        size,
        usage: None,
        cost_usd: 0.0,
    })
}

fn unknown_tool(offered: &[BoundTool], name: &str) -> String {
    let names: Vec<&str> = offered.iter().map(BoundTool::name).collect();
    let available = if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    };
    format!("Unknown tool: '{name}'. Available tools: {available}.")
}

/// Refuses unreadable arguments and arguments that break the tool's schema.
fn check_arguments(driver: &Driver<'_>, tool: &BoundTool, arguments: &Value) -> Result<(), String> {
    if let Some(raw) = arguments.get("_loom_invalid_json") {
        let raw = raw.as_str().unwrap_or_default();
        return Err(format!(
            "Unreadable arguments: not a valid JSON object.\nReceived: {raw}"
        ));
    }
    if !arguments.is_object() {
        return Err(format!(
            "Unreadable arguments: not a JSON object.\nReceived: {arguments}"
        ));
    }
    if !driver.agent.validate_arguments {
        return Ok(());
    }
    let lines = tool.schema_problems(arguments);
    if lines.is_empty() {
        return Ok(());
    }
    Err(format!(
        "Arguments do not match the tool's schema:\n{}",
        lines.join("\n")
    ))
}

/// The technical idempotency key of a call: `sha256("<run_id>:<call_id>")`, hex.
pub fn idempotency_key(run_id: &str, call_id: &str) -> String {
    hex::encode(Sha256::digest(format!("{run_id}:{call_id}").as_bytes()))
}

fn panic_message(panic: &Box<dyn Any + Send>) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "panic".to_owned()
    }
}
