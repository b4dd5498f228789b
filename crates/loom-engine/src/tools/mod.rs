//! The tool batch: every call of one model turn, validated, launched concurrently, journaled.
//!
//! Journal order: first the calls refused before launch (unknown tool, unreadable or invalid
//! arguments; a `tool.completed` error each, no `tool.called`), in call order; then every
//! `tool.called` of the batch in one write; then each `tool.completed` as its tool finishes.
//! The next model request re-sorts results into call order, so requests stay deterministic.
//! Sub-agent calls run alongside as child runs ([`crate::subagents`]); a child that waits for a
//! human ends the batch with the run in `waiting_child`.
//!
//! The batch is a step in four parts, one submodule each: [`plan`] decides what each call
//! does (`$ref`s, `before_tool` policies, declarations and approvals, an inline approver),
//! [`launch`] starts the plain tools and child runs and runs the roles one after another,
//! [`collect`] journals each result as it comes, and [`finish`] is what every result goes
//! through (the `after_tool` point, the offload of a large result, `tool.completed`).

mod collect;
mod finish;
mod launch;
mod plan;

use std::sync::Arc;

use loom_core::{
    RunState,
    approval::Approver,
    event::{Effect, Outcome, Payload, ToolCalled},
    ports::{ArtifactStore, IdempotencyStore},
};
use sha2::{Digest, Sha256};

use crate::{
    agent::AgentRuntime,
    binding::BoundTool,
    error::EngineError,
    io::{Io, StepSpan},
    roles::Roles,
    subagents::Spawn,
};

/// Result given to the model for a call interrupted mid-flight whose effect may have happened.
pub const UNKNOWN_STATE: &str = "Unknown state: this tool's execution was interrupted and it may have \
produced its effect. It was not run again automatically; check before calling it again.";

/// Why a call that was interrupted mid-flight waits for a human (`on_unknown: pause`).
pub const UNKNOWN_REASON: &str = "the call was interrupted mid-flight and may have produced its \
effect; it runs again only if approved";

/// What the tool batch reads besides the run's [`Io`].
pub(crate) struct Batch<'a> {
    /// The agent: its tool settings (timeout, argument checks, offload), approval settings,
    /// policies, roles and sub-agents.
    pub(crate) agent: &'a AgentRuntime,
    /// The tools the model was offered for this turn.
    pub(crate) offered: &'a [BoundTool],
    /// Where business keys are reserved and results recorded.
    pub(crate) idempotency: Option<&'a Arc<dyn IdempotencyStore>>,
    /// Where large results are offloaded and `$ref`s to them read back.
    pub(crate) artifacts: Option<&'a Arc<dyn ArtifactStore>>,
    /// Decides approvals inline (the run then never pauses).
    pub(crate) approver: Option<&'a Arc<dyn Approver>>,
    /// What role calls need.
    pub(crate) roles: Roles<'a>,
    /// What child runs need.
    pub(crate) spawn: Spawn<'a>,
}

/// How a batch ended for its pilot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchEnd {
    /// Its events are written: the loop goes on.
    Written,
    /// Child runs stopped to wait for a human: the run waits for them (`waiting_child`) and
    /// cannot move until one of them can.
    ChildrenWait,
}

/// The step being written and the events written inside it so far.
pub(crate) struct Frame {
    pub(crate) step: StepSpan,
    pub(crate) emitted: u32,
}

impl Frame {
    /// Writes `events` inside the step, counting them.
    async fn write(
        &mut self,
        io: &mut Io<'_>,
        state: &mut RunState,
        events: Vec<loom_core::Event>,
    ) -> Result<(), EngineError> {
        if events.is_empty() {
            return Ok(());
        }
        self.emitted += u32::try_from(events.len()).unwrap_or(u32::MAX);
        io.write(state, events).await.map(drop)
    }

    /// Ends the step with the run's failure, after `events` (counted in the step), in one
    /// append.
    async fn fail(
        &mut self,
        io: &mut Io<'_>,
        state: &mut RunState,
        mut events: Vec<loom_core::Event>,
        error_type: &str,
        reason: &str,
    ) -> Result<(), EngineError> {
        self.emitted += u32::try_from(events.len()).unwrap_or(u32::MAX);
        events.push(self.step.completed(io, state, self.emitted, Outcome::Error));
        events.extend(
            io.events()
                .failure(state, "policy.decided", error_type, reason),
        );
        io.write(state, events).await.map(drop)
    }

    /// Ends a step whose effect was interrupted (cancelled, or out of time).
    async fn interrupted(
        &self,
        io: &mut Io<'_>,
        state: &mut RunState,
        timed_out: bool,
    ) -> Result<(), EngineError> {
        io.interrupted(state, &self.step, self.emitted, timed_out)
            .await
    }
}

/// Runs the batch of the run's pending calls (see the module documentation).
pub(crate) async fn run(
    io: &mut Io<'_>,
    batch: &Batch<'_>,
    state: &mut RunState,
) -> Result<BatchEnd, EngineError> {
    let step = StepSpan::open(io, state);
    let started = step.started(io, state, Effect::ToolBatch);
    io.write(state, vec![started]).await?;
    let mut frame = Frame { step, emitted: 0 };
    let planned = match plan::all(io, batch, state, &mut frame).await? {
        Some(planned) => planned,
        None => return Ok(BatchEnd::Written),
    };
    frame.write(io, state, planned.refusals).await?;
    let calls: Vec<_> = planned
        .launches
        .iter()
        .map(|l| {
            io.event(
                &l.span,
                Some(&frame.step.span),
                None,
                Payload::ToolCalled(ToolCalled {
                    call_id: l.call.call_id.clone(),
                    tool_name: l.call.name.clone(),
                    tool_kind: l.tool.tool.spec().kind,
                    arguments: l.call.arguments.clone(),
                    refs: l.refs.clone(),
                    resumed: l.resumed,
                    child_run_id: l.child.clone(),
                    side_effects: Some(l.tool.declarations.side_effects),
                }),
            )
        })
        .collect();
    // A cancel that arrived meanwhile stops the batch before any tool is launched.
    if io.cancel().is_cancelled() {
        frame.interrupted(io, state, false).await?;
        return Ok(BatchEnd::Written);
    }
    frame.write(io, state, calls).await?;
    let mut running = launch::start(io, batch, state, planned.launches).await?;
    // The run's timeout counts from the start of the batch, not from each result.
    let deadline = io.deadline(state);
    if !launch::roles(io, batch, state, &mut frame, &mut running, deadline).await? {
        return Ok(BatchEnd::Written);
    }
    collect::results(io, batch, state, frame, running, planned.requests, deadline).await
}

/// The technical idempotency key of a call: `sha256("<run_id>:<call_id>")`, hex.
pub fn idempotency_key(run_id: &str, call_id: &str) -> String {
    hex::encode(Sha256::digest(format!("{run_id}:{call_id}").as_bytes()))
}

/// The W3C `traceparent` of the journal span `span_id` of a run in the tree rooted at
/// `root_run_id` of `tenant`: `00-<trace>-<span>-01`, the ids the `otel` feature exports the
/// span with (the trace id the first 16 bytes of SHA-256 over `loom/trace`, the tenant and the
/// root run; the span id the first 8 bytes of SHA-256 over `loom/span` and the journal's span
/// id, each part followed by a NUL; an all-zero id ends in 1). `loom-otel` derives the same.
pub fn traceparent(tenant: &str, root_run_id: &str, span_id: &str) -> String {
    fn digest<const N: usize>(parts: &[&str]) -> [u8; N] {
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update(part.as_bytes());
            hasher.update([0u8]);
        }
        let full = hasher.finalize();
        let mut id = [0u8; N];
        id.copy_from_slice(&full[..N]);
        if id.iter().all(|byte| *byte == 0) {
            id[N - 1] = 1;
        }
        id
    }
    let trace: [u8; 16] = digest(&["loom/trace", tenant, root_run_id]);
    let span: [u8; 8] = digest(&["loom/span", span_id]);
    format!("00-{}-{}-01", hex::encode(trace), hex::encode(span))
}
