//! The tool batch: every call of one model turn, validated, launched concurrently, journaled.
//!
//! Journal order: first the calls refused before launch (unknown tool, unreadable or invalid
//! arguments; a `tool.completed` error each, no `tool.called`), in call order; then every
//! `tool.called` of the batch in one write; then each `tool.completed` as its tool finishes.
//! The next model request re-sorts results into call order, so requests stay deterministic.

use std::{any::Any, panic::AssertUnwindSafe, time::Instant};

use futures_util::FutureExt;

use loom_core::{
    RunState,
    event::{Effect, Outcome, Payload, ToolCalled, ToolCompleted},
    state::PendingCall,
    tool::{SideEffects, ToolContext, ToolOutput},
};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::task::JoinSet;

use crate::{
    BoundTool, EngineError,
    driver::{Driver, StepEnd, StepSpan, fmt_secs},
    writer::SessionWriter,
};

/// Result given to the model for a call interrupted mid-flight whose effect may have happened.
pub const UNKNOWN_STATE: &str = "Unknown state: this tool's execution was interrupted and it may have \
produced its effect. It was not run again automatically; check before calling it again.";

/// A call accepted for launch.
struct Launch {
    call: PendingCall,
    tool: BoundTool,
    span: String,
    resumed: bool,
}

pub(crate) async fn batch(
    driver: &mut Driver<'_>,
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
    for call in state.pending_calls.clone() {
        let span = driver.engine.ids().uuid();
        let tool = offered.iter().find(|t| t.name() == call.name);
        let verdict = match tool {
            None => Err(unknown_tool(&offered, &call.name)),
            Some(tool) if call.started => {
                // Launched before a crash: run again only when that cannot do harm.
                if tool.declarations.side_effects == SideEffects::None
                    || tool.declarations.idempotent
                {
                    Ok((tool.clone(), true))
                } else {
                    Err(UNKNOWN_STATE.to_owned())
                }
            }
            Some(tool) => {
                check_arguments(driver, tool, &call.arguments).map(|()| (tool.clone(), false))
            }
        };
        match verdict {
            Ok((tool, resumed)) => launches.push(Launch {
                call,
                tool,
                span,
                resumed,
            }),
            Err(message) => refusals.push(driver.event(
                &span,
                Some(&step.span),
                None,
                completed(&call, ToolOutput::error(message), 0.0),
            )),
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
                    refs: Vec::new(),
                    resumed: l.resumed,
                    child_run_id: None,
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

    let mut running = JoinSet::new();
    let mut spans = Vec::with_capacity(launches.len());
    for (index, launch) in launches.into_iter().enumerate() {
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
        let arguments = launch.call.arguments.clone();
        let name = launch.call.name.clone();
        spans.push((launch.span, launch.call, launch.tool));
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
    while !running.is_empty() {
        let next = driver
            .wait(state, writer, running.join_next(), deadline)
            .await?;
        let joined = match next {
            StepEnd::Done(Some(joined)) => joined,
            StepEnd::Done(None) => break,
            StepEnd::Cancelled => {
                running.abort_all();
                return driver
                    .interrupted(state, writer, &step, emitted, false)
                    .await;
            }
            StepEnd::TimedOut => {
                running.abort_all();
                return driver
                    .interrupted(state, writer, &step, emitted, true)
                    .await;
            }
        };
        // Panics are caught inside the task, so a join error can only be an abort.
        let Ok((index, output, latency)) = joined else {
            continue;
        };
        let (span, call, tool) = &spans[index];
        let mut batch = Vec::with_capacity(3);
        let output = match offload_limit(driver, tool) {
            Some(limit) => match driver.engine.artifacts() {
                Some(store) => {
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
                            emitted += 1;
                            batch.push(driver.event(
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
                None => output,
            },
            None => output,
        };
        let event = driver.event(
            span,
            Some(&step.span),
            None,
            completed(call, output, latency),
        );
        batch.push(event);
        emitted += 1;
        if running.is_empty() {
            // The last result and the end of the step go to the journal in one append;
            // earlier results were each made durable as soon as they came.
            batch.push(step.completed(driver, state, emitted, Outcome::Ok));
            return driver.write(state, writer, batch).await.map(drop);
        }
        driver.write(state, writer, batch).await?;
    }
    let done = step.completed(driver, state, emitted, Outcome::Ok);
    driver.write(state, writer, vec![done]).await.map(drop)
}

/// The size above which this tool's results are offloaded (never for built-in tools).
fn offload_limit(driver: &Driver<'_>, tool: &BoundTool) -> Option<u64> {
    if tool.tool.spec().kind == loom_core::tool::ToolKind::Builtin {
        return None;
    }
    tool.declarations.offload_over.or(driver.agent.offload_over)
}

fn completed(call: &PendingCall, output: ToolOutput, latency_ms: f64) -> Payload {
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
    let mut problems: Vec<(String, String)> = tool
        .validator
        .iter_errors(arguments)
        .map(|e| {
            let path = e.instance_path().to_string();
            let path = if path.is_empty() {
                "(root)".to_owned()
            } else {
                path
            };
            (path, e.to_string())
        })
        .collect();
    if problems.is_empty() {
        return Ok(());
    }
    problems.sort();
    problems.dedup();
    let lines: Vec<String> = problems
        .into_iter()
        .map(|(path, message)| format!("- {path}: {message}"))
        .collect();
    Err(format!(
        "Arguments do not match the tool's schema:\n{}",
        lines.join("\n")
    ))
}

/// The technical idempotency key of a call: `sha256("<run_id>:<call_id>")`, hex.
pub fn idempotency_key(run_id: &str, call_id: &str) -> String {
    Sha256::digest(format!("{run_id}:{call_id}").as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
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
