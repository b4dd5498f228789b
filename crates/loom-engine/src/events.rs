//! Where a run lives ([`RunRef`]), and the events of a run ([`Events`]): envelopes stamped with
//! fresh ids and the engine's clock, and the decisions every point writes the same way (a
//! transition, a failure, a cancellation).

use chrono::{DateTime, Utc};
use loom_core::{
    Event, RunState, RunStatus,
    approval::Decision,
    event::{
        ApprovalGranted, ApprovalRejected, Envelope, Payload, RunCancelled, RunFailed,
        RunTransitioned, ToolCompleted,
    },
    ports::Clock,
    state::PendingCall,
    tool::ToolOutput,
};

use crate::ids::Ids;

/// Where a run lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunRef {
    /// Tenant.
    pub tenant_id: String,
    /// Session.
    pub session_id: String,
    /// Run.
    pub run_id: String,
}

/// Builds the events of one run: its place, its agent and the root of its tree in every
/// envelope, a fresh UUIDv7 and the engine's clock for each.
#[derive(Clone, Copy)]
pub(crate) struct Events<'a> {
    ids: &'a Ids,
    clock: &'a dyn Clock,
    run: &'a RunRef,
    agent: &'a str,
    root_run_id: &'a str,
}

impl<'a> Events<'a> {
    /// The events of `run`, of `agent`, in the tree rooted at `root_run_id`.
    pub(crate) fn new(
        ids: &'a Ids,
        clock: &'a dyn Clock,
        run: &'a RunRef,
        agent: &'a str,
        root_run_id: &'a str,
    ) -> Events<'a> {
        Events {
            ids,
            clock,
            run,
            agent,
            root_run_id,
        }
    }

    /// The events of another run (`run`, of `agent`, in the tree rooted at `root_run_id`),
    /// with the same ids and clock.
    pub(crate) fn of<'b>(&self, run: &'b RunRef, agent: &'b str, root_run_id: &'b str) -> Events<'b>
    where
        'a: 'b,
    {
        Events::new(self.ids, self.clock, run, agent, root_run_id)
    }

    /// The run.
    pub(crate) fn run(&self) -> &'a RunRef {
        self.run
    }

    /// The root run of the run's tree.
    pub(crate) fn root_run_id(&self) -> &'a str {
        self.root_run_id
    }

    /// The run's agent.
    pub(crate) fn agent(&self) -> &'a str {
        self.agent
    }

    /// The engine's clock, now.
    pub(crate) fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// A fresh UUIDv7 (span ids, child run ids, jitter).
    pub(crate) fn uuid(&self) -> String {
        self.ids.uuid()
    }

    /// An event of the run in `span` (under `parent`), with the envelope `role`.
    pub(crate) fn event(
        &self,
        span: &str,
        parent: Option<&str>,
        role: Option<&str>,
        payload: Payload,
    ) -> Event {
        Event::new(
            Envelope {
                event_id: self.ids.uuid(),
                ts: self.clock.now(),
                tenant_id: self.run.tenant_id.clone(),
                session_id: self.run.session_id.clone(),
                run_id: self.run.run_id.clone(),
                root_run_id: self.root_run_id.to_owned(),
                span_id: span.to_owned(),
                parent_span_id: parent.map(str::to_owned),
                agent: Some(self.agent.to_owned()),
                role: role.map(str::to_owned),
            },
            payload,
        )
    }

    /// An event of the run's root span.
    pub(crate) fn decision(&self, state: &RunState, payload: Payload) -> Event {
        self.event(&state.run_span_id, None, None, payload)
    }

    /// The transition of the run from its state to `to`, caused by `cause`.
    pub(crate) fn transition(
        &self,
        state: &RunState,
        to: RunStatus,
        cause: &str,
        cause_event_id: Option<String>,
    ) -> Event {
        self.decision(
            state,
            Payload::RunTransitioned(RunTransitioned {
                from_state: state.status,
                to_state: to,
                step_no: state.step,
                cause_type: cause.into(),
                cause_event_id,
            }),
        )
    }

    /// A transition to `failed` and the closing `run.failed`.
    pub(crate) fn failure(
        &self,
        state: &RunState,
        cause: &str,
        error_type: &str,
        error: &str,
    ) -> Vec<Event> {
        vec![
            self.transition(state, RunStatus::Failed, cause, None),
            self.decision(
                state,
                Payload::RunFailed(RunFailed {
                    error_type: error_type.into(),
                    error: error.into(),
                    iterations: state.iterations,
                    usage: state.usage,
                    cost_usd: state.cost_usd,
                }),
            ),
        ]
    }

    /// The transition to `cancelled` and the closing `run.cancelled` (`reason`: `requested`,
    /// or `parent` for a sub-run closed with its parent; `by`: who asked).
    pub(crate) fn cancellation(
        &self,
        state: &RunState,
        reason: &str,
        by: Option<String>,
    ) -> Vec<Event> {
        vec![
            self.transition(state, RunStatus::Cancelled, "cancel", None),
            self.cancelled(state, reason, by),
        ]
    }

    /// The closing `run.cancelled`; the requests still waiting are withdrawn with the run.
    pub(crate) fn cancelled(&self, state: &RunState, reason: &str, by: Option<String>) -> Event {
        self.decision(
            state,
            Payload::RunCancelled(RunCancelled {
                reason: reason.into(),
                by,
                iterations: state.iterations,
                usage: state.usage,
                cost_usd: state.cost_usd,
                withdrawn: state
                    .waiting_approvals()
                    .into_iter()
                    .map(|a| a.call_id.clone())
                    .collect(),
            }),
        )
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
