//! Starting the calls of a batch: plain tools in background tasks (under their timeout, a panic
//! caught as an error result, a business key reserved first), sub-agents as child runs driven
//! alongside, then the roles one after another.

use std::{any::Any, panic::AssertUnwindSafe, time::Instant};

use futures_util::FutureExt;
use loom_core::{
    Event, RunState,
    ports::{DEFAULT_IDEMPOTENCY_TTL, IdempotencyScope, IdempotencyStore, Reservation},
    state::PendingCall,
    tool::{ToolContext, ToolKind, ToolOutput},
};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{Batch, Frame, finish, idempotency_key, plan::Launch};
use crate::{
    binding::BoundTool,
    error::EngineError,
    io::Io,
    roles::{self, RoleEnd},
    subagents,
    units::fmt_secs,
};

/// What the business key of a call did to its launch.
pub(super) enum Business {
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

/// A plain tool or sub-agent call launched in the background.
pub(super) struct Launched {
    pub(super) span: String,
    pub(super) call: PendingCall,
    pub(super) tool: BoundTool,
    pub(super) business: Business,
}

/// The calls of a batch once launched.
pub(super) struct Running<'a> {
    /// Plain tool tasks, each giving its index in `launched`, its output and its latency.
    pub(super) tasks: JoinSet<(usize, ToolOutput, f64)>,
    /// Child runs of sub-agent calls: driven here, stopped with the batch.
    pub(super) children: subagents::Children<'a>,
    /// Stops the child runs (a child token of the run's cancellation).
    stop_children: CancellationToken,
    /// The plain tool and sub-agent calls, by index.
    pub(super) launched: Vec<Launched>,
    /// Role calls, run one after another once the others are launched.
    roles: Vec<Launch>,
    /// A child run stopped to wait for a human.
    pub(super) children_wait: bool,
}

impl Running<'_> {
    /// Stops everything still running: tool tasks are aborted, child runs close themselves
    /// (reason `parent`, before their parent does). Returns the results of the calls whose
    /// child run closed.
    pub(super) async fn stop(&mut self, io: &Io<'_>, frame: &Frame) -> Vec<Event> {
        self.tasks.abort_all();
        let stopped = subagents::stop(&self.stop_children, &mut self.children).await;
        finish::stopped_children(io, frame, &self.launched, stopped)
    }
}

/// Launches the plain tools (in tasks) and the sub-agents (as child runs); roles wait for
/// [`roles()`].
pub(super) async fn start<'a>(
    io: &Io<'_>,
    batch: &Batch<'a>,
    state: &RunState,
    launches: Vec<Launch>,
) -> Result<Running<'a>, EngineError> {
    // Plain tools and sub-agents run concurrently in the background; roles then run one after
    // another.
    let (roles, launches): (Vec<Launch>, Vec<Launch>) = launches
        .into_iter()
        .partition(|l| l.tool.tool.spec().kind == ToolKind::Role);
    let mut running = Running {
        tasks: JoinSet::new(),
        children: subagents::Children::new(),
        stop_children: io.cancel().child_token(),
        launched: Vec::with_capacity(launches.len()),
        roles,
        children_wait: false,
    };
    for (index, launch) in launches.into_iter().enumerate() {
        if let Some(child) = &launch.child {
            running.children.push(subagents::launch(
                &batch.spawn,
                io.events().run(),
                state,
                &launch.call,
                &launch.span,
                child,
                &launch.arguments,
                index,
                running.stop_children.clone(),
            ));
            running.launched.push(Launched {
                span: launch.span,
                call: launch.call,
                tool: launch.tool,
                business: Business::None,
            });
            continue;
        }
        spawn(io, batch, &mut running, index, launch).await?;
    }
    Ok(running)
}

/// Starts one plain tool call in a task: under its timeout (the tool's, else the agent's),
/// a panic caught as an error result. A call with a business key reserves it first, or reuses
/// what another run recorded under it.
async fn spawn(
    io: &Io<'_>,
    batch: &Batch<'_>,
    running: &mut Running<'_>,
    index: usize,
    launch: Launch,
) -> Result<(), EngineError> {
    let run = io.events().run();
    let ctx =
        ToolContext {
            tenant_id: run.tenant_id.clone(),
            session_id: run.session_id.clone(),
            run_id: run.run_id.clone(),
            call_id: launch.call.call_id.clone(),
            idempotency_key: idempotency_key(&run.run_id, &launch.call.call_id),
            traceparent: batch.spawn.engine.trace_context.then(|| {
                crate::traceparent(&run.tenant_id, io.events().root_run_id(), &launch.span)
            }),
        };
    let timeout = launch
        .tool
        .declarations
        .timeout
        .or(batch.agent.tool_timeout);
    let tool = launch.tool.tool.clone();
    let arguments = launch.arguments.clone();
    let name = launch.call.name.clone();
    let (business, ready) = reserve(batch, &launch, &ctx).await?;
    running.launched.push(Launched {
        span: launch.span,
        call: launch.call,
        tool: launch.tool,
        business,
    });
    if let Some(output) = ready {
        running.tasks.spawn(async move { (index, output, 0.0) });
        return Ok(());
    }
    running.tasks.spawn(async move {
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
    Ok(())
}

/// The business key of a call: reserved before it runs, or the result another run recorded
/// under it (the tool does not run), or an error result when another run holds it now.
async fn reserve(
    batch: &Batch<'_>,
    launch: &Launch,
    ctx: &ToolContext,
) -> Result<(Business, Option<ToolOutput>), EngineError> {
    let key = match (batch.idempotency, &launch.tool.declarations.business_key) {
        (Some(store), Some(business)) => business.key(&launch.arguments).map(|key| {
            (
                store.clone(),
                format!("{}:{}:{key}", ctx.tenant_id, launch.call.name),
            )
        }),
        _ => None,
    };
    let Some((store, key)) = key else {
        return Ok((Business::None, None));
    };
    let holder = ctx.idempotency_key.clone();
    let scope = IdempotencyScope {
        tenant_id: &ctx.tenant_id,
        session_id: &ctx.session_id,
    };
    Ok(
        match store
            .reserve(&key, &holder, scope, DEFAULT_IDEMPOTENCY_TTL)
            .await?
        {
            Reservation::Reserved => (Business::Held { store, key, holder }, None),
            Reservation::Completed(output) => (Business::Reused(key), Some(*output)),
            Reservation::Held => (
                Business::None,
                Some(ToolOutput::error(format!(
                    "the same action is in progress in another run (key {key}); \
                     it was not run again"
                ))),
            ),
        },
    )
}

/// Runs the role calls one after another, each result journaled as it ends. `false` when the
/// batch ended (the run was cancelled or ran out of time, or a policy failed it): its events
/// are written and everything else is stopped.
pub(super) async fn roles(
    io: &mut Io<'_>,
    batch: &Batch<'_>,
    state: &mut RunState,
    frame: &mut Frame,
    running: &mut Running<'_>,
    deadline: Option<tokio::time::Instant>,
) -> Result<bool, EngineError> {
    for launch in std::mem::take(&mut running.roles) {
        let started = Instant::now();
        let end = roles::call(
            io,
            &batch.roles,
            state,
            &frame.step,
            &launch.call,
            &launch.span,
            &launch.arguments,
            deadline,
        )
        .await?;
        // A role's judge that erred under `on_error: block`, or an `after_tool` policy that
        // failed the run, fails it once the call's result is journaled.
        let (output, cost_usd, checked, failed) = match end {
            RoleEnd::Done {
                output,
                checked,
                cost_usd,
                emitted: inside,
            } => {
                frame.emitted += inside;
                (*output, cost_usd, checked, None)
            }
            RoleEnd::Failed {
                output,
                error_type,
                cost_usd,
                emitted: inside,
                reason,
            } => {
                frame.emitted += inside;
                (*output, cost_usd, true, Some((error_type, reason)))
            }
            RoleEnd::Interrupted {
                timed_out,
                emitted: inside,
            } => {
                frame.emitted += inside;
                let results = running.stop(io, frame).await;
                frame.write(io, state, results).await?;
                frame.interrupted(io, state, timed_out).await?;
                return Ok(false);
            }
        };
        let latency = started.elapsed().as_secs_f64() * 1000.0;
        let call = finish::Call {
            span: &launch.span,
            call: &launch.call,
            tool: &launch.tool,
            checked,
        };
        let finished = call
            .finish(
                io,
                batch,
                state,
                frame,
                output,
                latency,
                finish::Consumption::Role(cost_usd),
            )
            .await?;
        let finished = match (finished, failed) {
            (finish::Finished::Completed(events), Some((error_type, reason))) => {
                finish::Finished::Failed {
                    events,
                    error_type,
                    reason,
                }
            }
            (finished, _) => finished,
        };
        match finished {
            finish::Finished::Completed(events) => frame.write(io, state, events).await?,
            finish::Finished::Failed {
                events,
                error_type,
                reason,
            } => {
                let mut batch_events = running.stop(io, frame).await;
                batch_events.extend(events);
                frame
                    .fail(io, state, batch_events, &error_type, &reason)
                    .await?;
                return Ok(false);
            }
        }
    }
    Ok(true)
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
