//! The final output as the output guards see it ([`Final`]), what a guard made of it
//! ([`Guarded`]), and the `guard.checked` of an output contract, shared by the final output, the
//! roles and the tools.

use loom_core::{
    Message, RunState,
    event::{GuardChecked, Payload},
};
use serde_json::Value;

/// Name of the built-in contract policy.
pub(crate) const CONTRACT: &str = "loom.contract";

/// The final output as the guards leave it.
pub(crate) struct Final {
    /// The output message (`None`: the output is a terminal tool's result, kept as is).
    pub(crate) message: Option<Message>,
    /// The `tool.completed` whose result is the output (terminal roles).
    pub(crate) output_event_id: Option<String>,
    /// Structured output (validated against the contract's schema).
    pub(crate) data: Option<Value>,
}

/// What a guard made of the output.
pub(crate) enum Guarded {
    /// The output goes on.
    Pass,
    /// The events are written and the run is repaired or failed: nothing more to do.
    Done,
}

/// The `guard.checked` of an output contract (`loom.contract`) on `target` (`output`,
/// `role:<name>`, `tool:<name>`).
pub(crate) fn contract_checked(
    target: &str,
    attempt: u32,
    call_id: Option<&str>,
    outcome: &str,
    reason: Option<String>,
    normalized: bool,
    resolution: Option<&str>,
) -> Payload {
    Payload::GuardChecked(GuardChecked {
        guard: "contract".into(),
        target: target.into(),
        outcome: outcome.into(),
        reason,
        attempt: Some(attempt),
        normalized,
        resolution: resolution.map(str::to_owned),
        policy: Some(CONTRACT.into()),
        call_id: call_id.map(str::to_owned),
    })
}

/// The output of a terminal tool call as an assistant message: the last tool result's blocks.
pub(crate) fn terminal_message(state: &RunState) -> Message {
    state
        .messages
        .iter()
        .rev()
        .find_map(|m| {
            m.blocks.iter().find_map(|b| match &b.kind {
                loom_core::BlockKind::ToolResult { output, .. } => {
                    Some(Message::assistant(output.visible_text()))
                }
                _ => None,
            })
        })
        .unwrap_or_else(|| Message::assistant(""))
}
