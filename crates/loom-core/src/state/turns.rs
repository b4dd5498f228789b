//! The projection of the conversation's turns: user messages (steering, repairs), model answers
//! and the tool calls they open, tool results, and the final output of `run.completed`.

use crate::{
    approval::ApprovalStatus,
    content::{Block, BlockKind, Message, Role},
    event::Event,
    tool::ToolOutput,
};

use super::{PendingCall, ProjectionError, REPAIR, RunState, STEER, projection::error};

impl RunState {
    /// `message.user`: a turn of the conversation. A steering message that arrives while
    /// tool calls are open waits for their results, so a call and its result are never split
    /// by a user turn; a repair starts the answer's checks afresh.
    pub(super) fn apply_user(&mut self, user: &crate::event::MessageUser) {
        if user.kind == STEER && !self.pending_calls.is_empty() {
            self.steering.push(user.message.clone());
            return;
        }
        if user.kind == REPAIR {
            self.pending_repair = None;
            self.repair_without_tools = !user.tools;
            self.replaced_output = None;
            // The repaired answer is checked afresh.
            self.unverified = false;
            self.fallback = false;
        }
        self.messages.push(user.message.clone());
    }

    /// `model.responded`: every answer is counted in the run's consumption; the orchestrator's
    /// (not a role's nor a judge's) is an iteration, joins the conversation and opens its calls.
    pub(super) fn apply_response(&mut self, response: &crate::event::ModelResponded) {
        self.usage.add(&response.usage);
        self.cost_usd += response.cost_usd;
        self.model_calls += 1;
        if let Some(call_id) = &response.call_id {
            self.priced_calls.insert(call_id.clone());
        }
        if response.call_id.is_some() || response.judge.is_some() {
            return;
        }
        self.iterations += 1;
        self.repair_without_tools = false;
        self.pending_calls = response
            .message
            .tool_calls()
            .map(|(call_id, name, arguments)| PendingCall {
                call_id: call_id.to_owned(),
                name: name.to_owned(),
                arguments: arguments.clone(),
                started: false,
                replaced_arguments: None,
                child_run_id: None,
            })
            .collect();
        self.messages.push(response.message.clone());
    }

    /// `tool.called`: the call started (with its child run, for a sub-agent), which uses up
    /// the grant it ran under.
    pub(super) fn apply_called(
        &mut self,
        event: &Event,
        called: &crate::event::ToolCalled,
    ) -> Result<(), ProjectionError> {
        let Some(call) = self
            .pending_calls
            .iter_mut()
            .find(|c| c.call_id == called.call_id)
        else {
            return Err(error(
                event,
                &format!("tool.called for unknown call '{}'", called.call_id),
            ));
        };
        call.started = true;
        if called.child_run_id.is_some() {
            call.child_run_id = called.child_run_id.clone();
        }
        if let Some(approval) = self
            .approvals
            .iter_mut()
            .rev()
            .find(|a| a.call_id == called.call_id)
            && approval.status == ApprovalStatus::Granted
        {
            approval.launched = true;
        }
        Ok(())
    }

    /// `tool.completed`: the call's result joins the conversation (then the steering messages
    /// that waited, once no call is open), with what it consumed unless its model calls were
    /// counted already.
    pub(super) fn apply_completed(
        &mut self,
        event: &Event,
        completed: &crate::event::ToolCompleted,
    ) -> Result<(), ProjectionError> {
        let Some(index) = self
            .pending_calls
            .iter()
            .position(|c| c.call_id == completed.call_id)
        else {
            return Err(error(
                event,
                &format!("tool.completed for unknown call '{}'", completed.call_id),
            ));
        };
        let answered = self.pending_calls.remove(index);
        self.tools_called.push(answered.name);
        // A call whose model calls are journaled in this run (a role) was already
        // counted by its `model.responded`: its `tool.completed` only restates it.
        if !self.priced_calls.contains(&completed.call_id) {
            if let Some(usage) = &completed.usage {
                self.usage.add(usage);
            }
            self.cost_usd += completed.cost_usd;
        }
        self.messages
            .push(tool_message(&completed.call_id, completed.output.clone()));
        if self.pending_calls.is_empty() {
            self.messages.append(&mut self.steering);
        }
        Ok(())
    }

    /// `run.completed`: the final output. A terminal role's result is the answer (`output`
    /// null, `output_event_id` on its `tool.completed`, the last result of the run).
    pub(super) fn apply_completion(&mut self, completed: &crate::event::RunCompleted) {
        self.output = completed.output.clone();
        self.output_data = completed.data.clone();
        if self.output.is_none()
            && completed.output_event_id.is_some()
            && let Some(result) = last_result(&self.messages)
        {
            self.output = Some(Message::assistant(result.visible_text()));
            if self.output_data.is_none() {
                self.output_data = result.data.clone();
            }
        }
        self.finished = true;
    }
}

/// The last tool result of `messages`.
fn last_result(messages: &[Message]) -> Option<&ToolOutput> {
    messages.iter().rev().find_map(|m| {
        m.blocks.iter().rev().find_map(|b| match &b.kind {
            BlockKind::ToolResult { output, .. } => Some(output),
            _ => None,
        })
    })
}

/// The conversation's message of a result, its session-state writes stripped (they are the
/// session's, read through [`crate::state::SessionState`]; the reference strips them too).
fn tool_message(call_id: &str, mut output: ToolOutput) -> Message {
    output.state = serde_json::Map::new();
    Message {
        role: Role::Tool,
        blocks: vec![Block::new(BlockKind::ToolResult {
            call_id: call_id.to_owned(),
            output,
        })],
    }
}
