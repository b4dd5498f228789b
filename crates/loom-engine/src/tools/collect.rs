//! The results of a batch's plain tools and child runs, journaled as each comes (a child run
//! that waits for a human leaves its call open), then the end of the step.

use loom_core::{
    Event, RunState, RunStatus, Usage,
    event::{IdempotencyRecorded, IdempotencyReused, Outcome, Payload},
    tool::ToolOutput,
};

use super::{
    Batch, BatchEnd, Frame,
    finish::{self, Consumption, Finished},
    launch::{Business, Launched, Running},
};
use crate::{
    error::EngineError,
    events::completed_payload,
    io::{Io, StepEnd},
    media,
    subagents::{self, ChildDone, ChildEnd, Next},
};

/// One result that came, with the consumption of a child run to roll up.
struct Came {
    index: usize,
    output: ToolOutput,
    latency: f64,
    rolled: Option<(Usage, f64)>,
}

/// Journals each result as it comes, until every call has one (or waits), then the end of the
/// step with the approval requests of the calls that wait for a human. The last result and the
/// end of the step are one append; earlier results are each made durable as soon as they come.
pub(super) async fn results(
    io: &mut Io<'_>,
    batch: &Batch<'_>,
    state: &mut RunState,
    mut frame: Frame,
    mut running: Running<'_>,
    mut requests: Vec<Event>,
    deadline: Option<tokio::time::Instant>,
) -> Result<BatchEnd, EngineError> {
    while !running.tasks.is_empty() || !running.children.is_empty() {
        let next = io
            .wait(
                state,
                subagents::next(&mut running.tasks, &mut running.children),
                deadline,
            )
            .await?;
        let came = match next {
            // Panics are caught inside the task, so a join error can only be an abort.
            StepEnd::Done(Next::Tool(joined)) => match joined {
                Ok((index, output, latency)) => Came {
                    index,
                    output,
                    latency,
                    rolled: None,
                },
                Err(_) => continue,
            },
            StepEnd::Done(Next::Child(done)) => {
                match child(io, state, &mut frame, &mut running, *done).await? {
                    Some(Some(came)) => came,
                    Some(None) => continue,
                    None => return Ok(BatchEnd::Written),
                }
            }
            StepEnd::Done(Next::Empty) => break,
            end @ (StepEnd::Cancelled | StepEnd::TimedOut) => {
                let results = running.stop(io, &frame).await;
                frame.write(io, state, results).await?;
                let timed_out = matches!(end, StepEnd::TimedOut);
                frame.interrupted(io, state, timed_out).await?;
                return Ok(BatchEnd::Written);
            }
        };
        let launched = &running.launched[came.index];
        // The files of the result go to the artifact store first: nothing after this point
        // (the business-key record, the policies, the journal) sees their bytes.
        let (files, output) = {
            let run = io.events().run();
            let to = media::Destination {
                store: batch.artifacts,
                tenant_id: &run.tenant_id,
                session_id: &run.session_id,
                call_id: &launched.call.call_id,
            };
            media::store_files(&to, came.output).await?
        };
        let mut events: Vec<Event> = files
            .into_iter()
            .map(|stored| {
                io.event(
                    &launched.span,
                    Some(&frame.step.span),
                    None,
                    Payload::ArtifactStored(stored),
                )
            })
            .collect();
        events.extend(business(io, &frame, launched, &output).await?);
        // The tool's output contract, the `after_tool` policies, the offload.
        let consumption = match came.rolled {
            Some((usage, cost)) => Consumption::Child(usage, cost),
            None => Consumption::None,
        };
        let call = finish::Call {
            span: &launched.span,
            call: &launched.call,
            tool: &launched.tool,
            checked: false,
        };
        let finished = call
            .finish(io, batch, state, &frame, output, came.latency, consumption)
            .await?;
        match finished {
            Finished::Completed(completed) => events.extend(completed),
            Finished::Failed {
                events: decided,
                error_type,
                reason,
            } => {
                events.extend(running.stop(io, &frame).await);
                events.extend(decided);
                frame.fail(io, state, events, &error_type, &reason).await?;
                return Ok(BatchEnd::Written);
            }
        }
        if running.tasks.is_empty() && running.children.is_empty() {
            // The last result and the end of the step go to the journal in one append.
            // Approval requests come after the results of the calls that ran.
            events.append(&mut requests);
            return end(io, state, frame, events, running.children_wait).await;
        }
        frame.write(io, state, events).await?;
    }
    end(io, state, frame, requests, running.children_wait).await
}

/// A child run driven to where it stops. `Some(Some(result))`: its call's result;
/// `Some(None)`: it waits for a human, or stopped with the engine (its call stays open);
/// `None`: it was cancelled, which cancels its parent (written).
async fn child(
    io: &mut Io<'_>,
    state: &mut RunState,
    frame: &mut Frame,
    running: &mut Running<'_>,
    done: ChildDone,
) -> Result<Option<Option<Came>>, EngineError> {
    let ChildDone {
        index,
        end,
        latency_ms,
    } = done;
    let end = match end {
        Ok(end) => end,
        Err(error) => {
            running.stop(io, frame).await;
            return Err(error);
        }
    };
    let cancelled = matches!(end, ChildEnd::Cancelled { .. });
    let waits = matches!(end, ChildEnd::Waiting);
    let Some((output, usage, cost)) = end.result(&running.launched[index].call.name) else {
        running.children_wait |= waits;
        return Ok(Some(None));
    };
    if !cancelled {
        return Ok(Some(Some(Came {
            index,
            output,
            latency: latency_ms,
            rolled: Some((usage, cost)),
        })));
    }
    // A cancelled child cancels its parent.
    let Launched { span, call, .. } = &running.launched[index];
    let mut events = vec![io.event(
        span,
        Some(&frame.step.span),
        None,
        subagents::rolled_up(completed_payload(call, output, latency_ms), usage, cost),
    )];
    events.extend(running.stop(io, frame).await);
    frame.write(io, state, events).await?;
    frame.interrupted(io, state, false).await?;
    Ok(None)
}

/// What the business key of a call records of its result: the reuse of a recorded result, or
/// the result recorded under the key it held (a failed action releases the key instead, so the
/// next run may try it).
async fn business(
    io: &Io<'_>,
    frame: &Frame,
    launched: &Launched,
    output: &ToolOutput,
) -> Result<Vec<Event>, EngineError> {
    let Launched {
        span,
        call,
        business,
        ..
    } = launched;
    let payload = match business {
        Business::None => return Ok(Vec::new()),
        Business::Reused(key) => Payload::IdempotencyReused(IdempotencyReused {
            key: key.clone(),
            call_id: call.call_id.clone(),
            tool_name: call.name.clone(),
        }),
        Business::Held { store, key, holder } => {
            if output.is_error {
                store.release(key, holder).await?;
                return Ok(Vec::new());
            }
            store.complete(key, holder, output).await?;
            Payload::IdempotencyRecorded(IdempotencyRecorded {
                key: key.clone(),
                call_id: call.call_id.clone(),
                tool_name: call.name.clone(),
                result: output.clone(),
            })
        }
    };
    Ok(vec![io.event(span, Some(&frame.step.span), None, payload)])
}

/// The end of the step, after `events` (counted in it), in one append. After a batch in which
/// child runs stopped to wait for a human, the run waits for them (`awaiting_tools` →
/// `waiting_child`) and its pilot hands the lease back.
async fn end(
    io: &mut Io<'_>,
    state: &mut RunState,
    mut frame: Frame,
    mut events: Vec<Event>,
    children_wait: bool,
) -> Result<BatchEnd, EngineError> {
    frame.emitted += u32::try_from(events.len()).unwrap_or(u32::MAX);
    events.push(frame.step.completed(io, state, frame.emitted, Outcome::Ok));
    if children_wait {
        events.push(io.events().transition(
            state,
            RunStatus::WaitingChild,
            "model.responded",
            io.last_ids.model.clone(),
        ));
    }
    io.write(state, events).await?;
    Ok(if children_wait {
        BatchEnd::ChildrenWait
    } else {
        BatchEnd::Written
    })
}
