//! The conversation a model is sent: a run's messages with each turn's results grouped in call
//! order and amendment notes, the final text, and [`session_history`], the earlier runs of a
//! session with their tool calls and results kept in pairs.

use crate::{
    content::{Block, BlockKind, Message, Role},
    event::{Event, Payload},
};

use super::{
    Amendment, FoldError, RunState,
    compaction::{self, TurnGroup},
};

impl RunState {
    /// The conversation to send to the model: the run's messages, with each turn's tool results
    /// grouped in one `tool` message and sorted into the order the model wrote the calls.
    ///
    /// After the results of calls whose arguments were corrected, a system note says so.
    pub fn conversation(&self) -> Vec<Message> {
        let ordered = order_results(&self.messages);
        if self.amendments.is_empty() {
            return ordered;
        }
        let mut out = Vec::with_capacity(ordered.len() + self.amendments.len());
        for message in ordered {
            let notes: Vec<String> = if message.role == Role::Tool {
                message
                    .blocks
                    .iter()
                    .filter_map(|b| match &b.kind {
                        BlockKind::ToolResult { call_id, .. } => self
                            .amendments
                            .iter()
                            .rev()
                            .find(|a| &a.call_id == call_id)
                            .map(Amendment::note),
                        _ => None,
                    })
                    .collect()
            } else {
                Vec::new()
            };
            out.push(message);
            if !notes.is_empty() {
                out.push(Message::user(notes.join("\n")));
            }
        }
        out
    }

    /// The final text, if any.
    pub fn output_text(&self) -> Option<String> {
        self.output.as_ref().map(Message::text)
    }
}

/// Groups consecutive tool messages into one and sorts their results into call order.
fn order_results(messages: &[Message]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len());
    let mut call_order: Vec<String> = Vec::new();
    for message in messages {
        match message.role {
            Role::Tool => {
                if let Some(last) = out.last_mut().filter(|m| m.role == Role::Tool) {
                    last.blocks.extend(message.blocks.iter().cloned());
                } else {
                    out.push(message.clone());
                }
                if let Some(last) = out.last_mut() {
                    let rank = |b: &Block| match &b.kind {
                        BlockKind::ToolResult { call_id, .. } => call_order
                            .iter()
                            .position(|c| c == call_id)
                            .unwrap_or(usize::MAX),
                        _ => usize::MAX,
                    };
                    last.blocks.sort_by_key(rank);
                }
            }
            Role::Assistant => {
                call_order = message
                    .tool_calls()
                    .map(|(id, _, _)| id.to_owned())
                    .collect();
                out.push(message.clone());
            }
            Role::User => out.push(message.clone()),
        }
    }
    out
}

/// The conversation of a session's earlier root runs, for a new run of the same session.
///
/// Tool calls and results stay in pairs: a call without result (a run that failed mid-batch)
/// and a result without call are dropped, so the history is always acceptable to a provider.
/// The latest `session.compacted` replaces the turns it summarized by its summary.
pub fn session_history(events: &[Event]) -> Result<Vec<Message>, FoldError> {
    Ok(compaction::flatten(session_groups(events)?))
}

/// [`session_history`] as one group per earlier root run (the latest compaction applied), for
/// the history caps and the compaction plan ([`compaction`]).
pub fn session_groups(events: &[Event]) -> Result<Vec<TurnGroup>, FoldError> {
    let mut run_ids: Vec<(&str, u64)> = Vec::new();
    for event in events {
        if matches!(&event.payload, Payload::RunStarted(p) if p.parent_run_id.is_none() && p.kind == "normal")
            && !run_ids.iter().any(|(id, _)| *id == event.run_id)
        {
            run_ids.push((&event.run_id, event.seq));
        }
    }
    let mut groups = Vec::with_capacity(run_ids.len());
    for (run_id, start_seq) in run_ids {
        let state = RunState::fold(run_id, events)?;
        let last_seq = events
            .iter()
            .rev()
            .find(|e| e.run_id == run_id)
            .map_or(start_seq, |e| e.seq);
        groups.push(TurnGroup {
            run_id: run_id.to_owned(),
            start_seq,
            last_seq,
            // Paired per run: call ids are only unique within a run.
            messages: pair_calls(state.conversation()),
            summary: false,
            finished: state.finished,
            succeeded: state.finished && state.status == super::RunStatus::Completed,
        });
    }
    Ok(match compaction::latest_compaction(events) {
        Some(compacted) => compaction::apply_compaction(groups, compacted),
        None => groups,
    })
}

fn pair_calls(messages: Vec<Message>) -> Vec<Message> {
    let mut calls = std::collections::HashSet::new();
    let mut results = std::collections::HashSet::new();
    for message in &messages {
        for block in &message.blocks {
            match &block.kind {
                BlockKind::ToolCall { call_id, .. } => {
                    calls.insert(call_id.clone());
                }
                BlockKind::ToolResult { call_id, .. } => {
                    results.insert(call_id.clone());
                }
                _ => {}
            }
        }
    }
    messages
        .into_iter()
        .filter_map(|mut message| {
            message.blocks.retain(|b| match &b.kind {
                BlockKind::ToolCall { call_id, .. } => results.contains(call_id),
                BlockKind::ToolResult { call_id, .. } => calls.contains(call_id),
                _ => true,
            });
            (!message.blocks.is_empty()).then_some(message)
        })
        .collect()
}
