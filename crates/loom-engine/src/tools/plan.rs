//! What the batch does with each call of the turn, in call order: its `$ref`s resolved, the
//! `before_tool` policies, then its declarations and approvals (a call that needs a human is
//! asked for, or decided at once by an inline approver). Calls refused here get an error result
//! and are never launched.

use std::sync::Arc;

use loom_core::{
    Event, RunState,
    approval::{ApprovalStatus, Approver, PendingApproval, expiry_message, rejection_message},
    event::{ApprovalRequested, Payload},
    policy::Subject,
    state::PendingCall,
    tool::{Approval, OnUnknown, SideEffects, ToolOutput},
};
use serde_json::Value;

use super::{Batch, Frame, UNKNOWN_REASON, UNKNOWN_STATE};
use crate::{
    binding::BoundTool,
    error::EngineError,
    events::{completed_payload, decision_payload},
    hooks::{self, End},
    io::{Io, StepEnd},
    roles, subagents,
};

/// A call accepted for launch.
pub(super) struct Launch {
    pub(super) call: PendingCall,
    pub(super) tool: BoundTool,
    pub(super) span: String,
    pub(super) resumed: bool,
    /// What the tool receives: the model's arguments, or those corrected at approval.
    pub(super) arguments: Value,
    /// The child run of a sub-agent call.
    pub(super) child: Option<String>,
    /// The `$ref`s resolved in its arguments (`tool.called.refs`).
    pub(super) refs: Vec<Value>,
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

/// The calls of the turn, planned.
#[derive(Default)]
pub(super) struct Planned {
    /// `tool.completed` errors of the calls refused before launch, in call order.
    pub(super) refusals: Vec<Event>,
    /// The calls to launch, in call order.
    pub(super) launches: Vec<Launch>,
    /// `approval.requested` of the calls that wait for a human, written at the end of the step.
    pub(super) requests: Vec<Event>,
}

/// Plans every pending call. `None` when the batch ended while planning (a `before_tool` policy
/// failed the run, or the run was cancelled while an inline approver decided): its events are
/// written.
pub(super) async fn all(
    io: &mut Io<'_>,
    batch: &Batch<'_>,
    state: &mut RunState,
    frame: &mut Frame,
) -> Result<Option<Planned>, EngineError> {
    let mut planned = Planned::default();
    let refs_on = roles::refs_enabled(batch.offered);
    for call in state.pending_calls.clone() {
        if !one(io, batch, state, frame, call, refs_on, &mut planned).await? {
            return Ok(None);
        }
    }
    Ok(Some(planned))
}

/// The `tool.completed` error of a call refused before launch.
fn refusal(io: &Io<'_>, frame: &Frame, span: &str, call: &PendingCall, message: String) -> Event {
    io.event(
        span,
        Some(&frame.step.span),
        None,
        completed_payload(call, ToolOutput::error(message), 0.0),
    )
}

/// Plans one call into `planned`; `false` when the batch ended (see [`all`]).
async fn one(
    io: &mut Io<'_>,
    batch: &Batch<'_>,
    state: &mut RunState,
    frame: &mut Frame,
    call: PendingCall,
    refs_on: bool,
    planned: &mut Planned,
) -> Result<bool, EngineError> {
    let span = io.events().uuid();
    let tool = batch.offered.iter().find(|t| t.name() == call.name);
    // `$ref`s are resolved first: the schema check, the policies and the tool see the
    // results they name; `tool.called` keeps what the model wrote.
    let mut call = call;
    let mut resolved = None;
    if refs_on && tool.is_some() {
        match roles::resolve_refs(batch.artifacts, state, call.effective_arguments()).await {
            Ok(None) => {}
            Ok(Some((arguments, refs))) => {
                call.replaced_arguments = Some(arguments.clone());
                resolved = Some((arguments, refs));
            }
            Err(message) => {
                planned
                    .refusals
                    .push(refusal(io, frame, &span, &call, message));
                return Ok(true);
            }
        }
    }
    // A fresh call passes the `before_tool` policies first; their decisions are journaled
    // before anything else happens to the call.
    let policy_plan = match tool {
        Some(tool) => match before_tool(io, batch, state, frame, &span, &call, tool).await? {
            Some(plan) => plan,
            None => return Ok(false),
        },
        None => None,
    };
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
        (None, None) => Plan::Refuse(unknown_tool(batch.offered, &call.name)),
        (Some(tool), None) => plan_call(batch, state, &call, tool),
    };
    let plan = match (plan, tool) {
        (Plan::Ask { .. }, None) => return Ok(true),
        (
            Plan::Ask {
                reason,
                arguments,
                policy,
            },
            Some(tool),
        ) => {
            let requested = request(io, batch, &call, tool, reason, arguments, policy);
            let request_event = io.event(&span, Some(&frame.step.span), None, requested);
            let Some(approver) = batch.approver else {
                planned.requests.push(request_event);
                return Ok(true);
            };
            let inline = Inline {
                span: &span,
                call: &call,
                tool,
                approver,
            };
            match inline
                .decide(io, batch, state, frame, request_event)
                .await?
            {
                Some(plan) => plan,
                None => return Ok(false),
            }
        }
        (other, _) => other,
    };
    match plan {
        Plan::Launch {
            tool,
            resumed,
            arguments,
        } => planned.launches.push(Launch {
            child: subagents::child_id(&batch.spawn, io.events(), &tool, &call),
            call,
            tool,
            span,
            resumed,
            arguments,
            refs: resolved.map(|(_, refs)| refs).unwrap_or_default(),
        }),
        Plan::Refuse(message) => planned
            .refusals
            .push(refusal(io, frame, &span, &call, message)),
        Plan::Ask { .. } | Plan::Wait => {}
    }
    Ok(true)
}

/// The `before_tool` point on a fresh call with usable arguments: the agent's policies, their
/// decisions journaled at once. `Some(None)`: nothing decided; `Some(Some(plan))`: a policy
/// refused the call or asked a human; `None`: a policy failed the run (written).
async fn before_tool(
    io: &mut Io<'_>,
    batch: &Batch<'_>,
    state: &mut RunState,
    frame: &mut Frame,
    span: &str,
    call: &PendingCall,
    tool: &BoundTool,
) -> Result<Option<Option<Plan>>, EngineError> {
    if call.started
        || state.approval(&call.call_id).is_some()
        || check_arguments(batch, tool, call.effective_arguments()).is_err()
    {
        return Ok(Some(None));
    }
    let subject = Subject::Call {
        tool: call.name.clone(),
        call_id: call.call_id.clone(),
        arguments: call.effective_arguments().clone(),
    };
    let events = io.events();
    let chain = hooks::run(
        &batch.agent.policies,
        &events,
        state,
        subject,
        Some(&call.call_id),
    )
    .await;
    let decided: Vec<_> = chain
        .decisions
        .into_iter()
        .map(|payload| io.event(span, Some(&frame.step.span), None, payload))
        .collect();
    frame.write(io, state, decided).await?;
    Ok(Some(match chain.end {
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
            frame
                .fail(io, state, Vec::new(), &error_type, &reason)
                .await?;
            return Ok(None);
        }
        // Not allowed before_tool: `hooks::run` refuses them.
        End::Retry { .. } | End::Stop { .. } => None,
    }))
}

/// A request an inline approver decides now.
struct Inline<'c> {
    span: &'c str,
    call: &'c PendingCall,
    tool: &'c BoundTool,
    approver: &'c Arc<dyn Approver>,
}

impl Inline<'_> {
    /// The request and its decision are journaled, and the call runs (or not) in this batch.
    /// `None` when the run was cancelled meanwhile (the step is closed).
    async fn decide(
        &self,
        io: &mut Io<'_>,
        batch: &Batch<'_>,
        state: &mut RunState,
        frame: &mut Frame,
        request_event: Event,
    ) -> Result<Option<Plan>, EngineError> {
        let pending = pending_of(io, &request_event);
        frame.write(io, state, vec![request_event]).await?;
        let decision = match io.wait(state, self.approver.decide(pending), None).await? {
            StepEnd::Done(decision) => decision,
            StepEnd::Cancelled | StepEnd::TimedOut => {
                frame.interrupted(io, state, false).await?;
                return Ok(None);
            }
        };
        let decided = io.event(
            self.span,
            Some(&frame.step.span),
            None,
            decision_payload(self.call, &decision),
        );
        frame.write(io, state, vec![decided]).await?;
        Ok(Some(plan_call(batch, state, self.call, self.tool)))
    }
}

/// What to do with one call of a known tool, from its declarations and its approvals.
fn plan_call(batch: &Batch<'_>, state: &RunState, call: &PendingCall, tool: &BoundTool) -> Plan {
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
                match check_arguments(batch, tool, &arguments) {
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
        _ => match check_arguments(batch, tool, &arguments) {
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
    io: &Io<'_>,
    batch: &Batch<'_>,
    call: &PendingCall,
    tool: &BoundTool,
    reason: String,
    arguments: Value,
    policy: Option<String>,
) -> Payload {
    let expire_at = batch
        .agent
        .approval
        .expires_in
        .and_then(|d| chrono::Duration::from_std(d).ok())
        .and_then(|d| io.events().now().checked_add_signed(d));
    Payload::ApprovalRequested(ApprovalRequested {
        call_id: call.call_id.clone(),
        tool_name: tool.name().to_owned(),
        arguments,
        reason,
        policy,
        scope: loom_core::approval::APPROVE_SCOPE.into(),
        expire_at,
    })
}

/// What an inline approver is shown of a request.
fn pending_of(io: &Io<'_>, event: &Event) -> PendingApproval {
    let Payload::ApprovalRequested(requested) = &event.payload else {
        unreachable!("pending_of is given an approval.requested");
    };
    let run = io.events().run();
    PendingApproval::requested(requested, &run.run_id, &run.session_id, &run.tenant_id)
}

/// The result of a call to a tool the model was not offered.
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
fn check_arguments(batch: &Batch<'_>, tool: &BoundTool, arguments: &Value) -> Result<(), String> {
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
    if !batch.agent.validate_arguments {
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
