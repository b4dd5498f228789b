//! The projection of approvals and policy decisions: `approval.requested` and how it is settled
//! (granted, rejected, expired), `policy.decided` (retries asking for a repair, replaced
//! arguments or output), and the requests still waiting.

use serde_json::Value;

use crate::{
    approval::{ApprovalRecord, ApprovalStatus, PendingApproval},
    content::{BlockKind, Message},
    event::{Event, Payload},
};

use super::{Amendment, ProjectionError, Repair, RunState, projection::error};

impl RunState {
    /// `approval.requested`: a request for an open call, unless one already waits.
    pub(super) fn apply_request(
        &mut self,
        event: &Event,
        requested: &crate::event::ApprovalRequested,
    ) -> Result<(), ProjectionError> {
        if !self
            .pending_calls
            .iter()
            .any(|c| c.call_id == requested.call_id)
        {
            return Err(error(
                event,
                &format!(
                    "approval.requested for unknown call '{}'",
                    requested.call_id
                ),
            ));
        }
        if self
            .approval(&requested.call_id)
            .is_some_and(ApprovalRecord::is_pending)
        {
            return Err(error(
                event,
                &format!(
                    "a request for call '{}' is already waiting",
                    requested.call_id
                ),
            ));
        }
        self.approvals.push(ApprovalRecord {
            call_id: requested.call_id.clone(),
            tool_name: requested.tool_name.clone(),
            arguments: requested.arguments.clone(),
            reason: requested.reason.clone(),
            policy: requested.policy.clone(),
            scope: requested.scope.clone(),
            expire_at: requested.expire_at,
            status: ApprovalStatus::Pending,
            by: None,
            decision_reason: None,
            granted_arguments: None,
            launched: false,
            span_id: event.span_id.clone(),
            parent_span_id: event.parent_span_id.clone(),
        });
        Ok(())
    }

    /// `approval.granted`, `approval.rejected`, `approval.expired`: settles the waiting
    /// request. Arguments corrected at the grant are what the call runs with, and what the
    /// conversation shows (the journal's `tool.called` keeps what the model wrote).
    pub(super) fn apply_approval_decision(&mut self, event: &Event) -> Result<(), ProjectionError> {
        match &event.payload {
            Payload::ApprovalGranted(granted) => {
                let record = self.settle(event, &granted.call_id, ApprovalStatus::Granted)?;
                record.by = Some(granted.by.clone());
                record.decision_reason = granted.reason.clone();
                record.granted_arguments = granted.arguments.clone();
                if let Some(arguments) = &granted.arguments {
                    rewrite_call(&mut self.messages, &granted.call_id, arguments);
                    self.amendments.push(Amendment {
                        call_id: granted.call_id.clone(),
                        tool_name: granted.tool_name.clone(),
                        by: granted.by.clone(),
                        arguments: arguments.clone(),
                    });
                }
            }
            Payload::ApprovalRejected(rejected) => {
                let record = self.settle(event, &rejected.call_id, ApprovalStatus::Rejected)?;
                record.by = Some(rejected.by.clone());
                record.decision_reason = rejected.reason.clone();
            }
            Payload::ApprovalExpired(expired) => {
                self.settle(
                    event,
                    &expired.call_id,
                    ApprovalStatus::Expired {
                        action: expired.action.clone(),
                    },
                )?;
            }
            _ => {}
        }
        Ok(())
    }

    /// `policy.decided`: a retry asks for a repair (counted per policy, or per policy and
    /// call); a `before_tool` replacement changes what the call runs with and how the
    /// conversation shows it; an `on_output` replacement changes the final answer.
    pub(super) fn apply_decision(
        &mut self,
        event: &Event,
        decided: &crate::event::PolicyDecided,
    ) -> Result<(), ProjectionError> {
        match (decided.decision.as_str(), decided.point.as_str()) {
            ("retry", _) => {
                let key = match &decided.call_id {
                    Some(call_id) => format!("{}#{call_id}", decided.policy),
                    None => decided.policy.clone(),
                };
                *self.retries.entry(key).or_insert(0) += 1;
                if decided.call_id.is_none() {
                    self.pending_repair = Some(Repair {
                        policy: decided.policy.clone(),
                        feedback: decided.reason.clone().unwrap_or_default(),
                        tools: decided.tools.unwrap_or(true),
                    });
                }
            }
            ("replace", "before_tool") => {
                let (Some(call_id), Some(arguments)) = (&decided.call_id, &decided.arguments)
                else {
                    return Err(error(
                        event,
                        "a before_tool replacement names no call or no arguments",
                    ));
                };
                let Some(call) = self
                    .pending_calls
                    .iter_mut()
                    .find(|c| &c.call_id == call_id)
                else {
                    return Err(error(
                        event,
                        &format!("policy.decided for unknown call '{call_id}'"),
                    ));
                };
                call.replaced_arguments = Some(arguments.clone());
                let tool_name = call.name.clone();
                rewrite_call(&mut self.messages, call_id, arguments);
                self.amendments.push(Amendment {
                    call_id: call_id.clone(),
                    tool_name,
                    by: format!("policy {}", decided.policy),
                    arguments: arguments.clone(),
                });
            }
            ("replace", "on_output") => {
                if let Some(output) = &decided.output {
                    let message: Message = serde_json::from_value(output.clone()).map_err(|e| {
                        error(
                            event,
                            &format!("the replacement output is not a message: {e}"),
                        )
                    })?;
                    self.replaced_output = Some(message);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Settles the last request of `call_id`, which must be waiting.
    pub(super) fn settle(
        &mut self,
        event: &Event,
        call_id: &str,
        status: ApprovalStatus,
    ) -> Result<&mut ApprovalRecord, ProjectionError> {
        let record = self
            .approvals
            .iter_mut()
            .rev()
            .find(|a| a.call_id == call_id);
        match record {
            Some(record) if record.is_pending() => {
                record.status = status;
                Ok(record)
            }
            Some(_) => Err(error(
                event,
                &format!("the request for call '{call_id}' was already decided"),
            )),
            None => Err(error(
                event,
                &format!("decision without a request for call '{call_id}'"),
            )),
        }
    }

    /// The last approval request of a call.
    pub fn approval(&self, call_id: &str) -> Option<&ApprovalRecord> {
        self.approvals.iter().rev().find(|a| a.call_id == call_id)
    }

    /// The requests waiting for a decision, in request order (none once the run closed: a
    /// cancel withdraws them).
    pub fn waiting_approvals(&self) -> Vec<&ApprovalRecord> {
        if self.status.is_terminal() {
            return Vec::new();
        }
        self.approvals.iter().filter(|a| a.is_pending()).collect()
    }

    /// The requests waiting for a decision, as callers see them.
    pub fn pending_approvals(&self) -> Vec<PendingApproval> {
        self.waiting_approvals()
            .into_iter()
            .map(|a| PendingApproval {
                call_id: a.call_id.clone(),
                tool_name: a.tool_name.clone(),
                arguments: a.arguments.clone(),
                reason: a.reason.clone(),
                policy: a.policy.clone(),
                scope: a.scope.clone(),
                expire_at: a.expire_at,
                run_id: self.run_id.clone(),
                session_id: self.session_id.clone(),
                tenant_id: self.tenant_id.clone(),
            })
            .collect()
    }
}

/// Rewrites the arguments of the tool call `call_id` in the last assistant message that has it.
fn rewrite_call(messages: &mut [Message], call_id: &str, new: &Value) {
    for message in messages.iter_mut().rev() {
        for block in &mut message.blocks {
            if let BlockKind::ToolCall {
                call_id: id,
                arguments,
                ..
            } = &mut block.kind
                && id == call_id
            {
                *arguments = new.clone();
                return;
            }
        }
    }
}
