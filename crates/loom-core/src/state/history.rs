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
pub fn session_history<E: std::borrow::Borrow<Event>>(
    events: &[E],
) -> Result<Vec<Message>, FoldError> {
    Ok(compaction::flatten(session_groups(events)?))
}

/// [`session_history`] as one group per earlier root run (the latest compaction applied), for
/// the history caps and the compaction plan ([`compaction`]).
pub fn session_groups<E: std::borrow::Borrow<Event>>(
    events: &[E],
) -> Result<Vec<TurnGroup>, FoldError> {
    let groups = session_groups_raw(events)?;
    Ok(match compaction::latest_compaction(events) {
        Some(compacted) => compaction::apply_compaction(groups, compacted),
        None => groups,
    })
}

/// One group per root run of `events` (a session's, in seq order) that begins among them, no
/// compaction applied: what a window of the session adds to the groups of the snapshot it
/// starts from. One pass over the events, whatever the number of runs.
pub fn session_groups_raw<E: std::borrow::Borrow<Event>>(
    events: &[E],
) -> Result<Vec<TurnGroup>, FoldError> {
    let mut runs: Vec<(RunState, u64, u64)> = Vec::new();
    let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for event in events {
        let event = event.borrow();
        if let Some(&at) = index.get(event.run_id.as_str()) {
            let (state, _, last_seq) = &mut runs[at];
            state.apply(event)?;
            *last_seq = event.seq;
            continue;
        }
        if matches!(&event.payload, Payload::RunStarted(p) if p.parent_run_id.is_none() && p.kind == "normal")
        {
            index.insert(&event.run_id, runs.len());
            runs.push((RunState::start(event)?, event.seq, event.seq));
        }
    }
    Ok(runs
        .into_iter()
        .map(|(state, start_seq, last_seq)| TurnGroup {
            start_seq,
            last_seq,
            // Paired per run: call ids are only unique within a run.
            messages: pair_calls(state.conversation()),
            summary: false,
            finished: state.finished,
            succeeded: state.finished && state.status == super::RunStatus::Completed,
            run_id: state.run_id,
        })
        .collect())
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
