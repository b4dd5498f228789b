//! The payloads of what is kept beside a session's journal: `artifact.stored` (a file stored
//! beside it) and `session.repaired` (an unreadable line set aside).

use serde::{Deserialize, Serialize};

/// `artifact.stored`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArtifactStored {
    /// `artifact://<tenant>/<session>/<sha256>.<ext>`.
    pub uri: String,
    /// MIME type.
    pub media_type: String,
    /// Bytes.
    pub size: u64,
    /// Display name.
    #[serde(default)]
    pub name: Option<String>,
    /// "attachment", "tool_output" or "offload".
    pub origin: String,
    /// The call that produced it.
    #[serde(default)]
    pub call_id: Option<String>,
}

/// `session.repaired`: a line of the session's journal that could not be read was set aside
/// (its bytes kept in `moved_to`), and this event was written in its place, at its seq, so that
/// the journal reads again. Not in the reference catalogue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRepaired {
    /// Bytes of the line set aside.
    pub bytes: u64,
    /// Why it could not be read.
    pub error: String,
    /// Where its bytes are kept: the side file beside the journal (`<session>.jsonl.corrupt`),
    /// or the SQLite table `set_aside`.
    pub moved_to: String,
    /// Who asked for the repair.
    #[serde(default)]
    pub by: Option<String>,
}

/// `session.snapshot`: the conversation of the session's earlier root runs as the next run
/// would be sent it, up to and including `up_to_seq`, so that a run in a long session reads
/// this event and what follows it, not the whole journal. A projection written into the
/// journal: never the truth, always derivable from the events before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionSnapshot {
    /// The last seq the snapshot accounts for.
    pub up_to_seq: u64,
    /// The session history at `up_to_seq` (compaction summary first, when there is one).
    pub messages: Vec<crate::content::Message>,
    /// Estimated tokens of `messages` (`Σ len(message JSON) / 4`, as the reference counts).
    pub tokens: u64,
    /// What the session's root runs spent up to `up_to_seq`, for session budgets. Not in the
    /// reference catalogue (its snapshots leave budgets to a full read).
    #[serde(default)]
    pub spent: SessionSpent,
    /// Provider model names seen answering up to `up_to_seq`, each with the model configs that
    /// produced it, so that reasoning blocks of the history are told apart by model (not in the
    /// reference catalogue).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub models: std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
    /// The session state up to `up_to_seq` (without the agent's defaults; none while nothing
    /// was written), so that a run folds only the events after it (not in the reference
    /// catalogue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<crate::state::SessionState>,
    /// Which messages belong to which turn, in order (not in the reference catalogue), so that
    /// history caps and compaction can cut the snapshot's history by turns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turns: Vec<SnapshotTurn>,
}

/// One turn of a [`SessionSnapshot`]'s history: an earlier root run, or a compaction summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotTurn {
    /// The run (empty for a summary).
    #[serde(default)]
    pub run_id: String,
    /// The seq of its `run.started` (a summary: the `up_to_seq` it accounts for).
    pub start_seq: u64,
    /// The seq of its last event.
    pub last_seq: u64,
    /// How many of the snapshot's messages, after the previous turns', are its.
    pub messages: u32,
    /// A compaction summary, not a run.
    #[serde(default)]
    pub summary: bool,
    /// The run completed.
    #[serde(default)]
    pub succeeded: bool,
}

impl SessionSnapshot {
    /// The snapshot's history as turns. A snapshot without turns (the reference's) is one
    /// turn holding all its messages.
    pub fn groups(&self) -> Vec<crate::state::compaction::TurnGroup> {
        if self.turns.is_empty() {
            if self.messages.is_empty() {
                return Vec::new();
            }
            return vec![crate::state::compaction::TurnGroup {
                run_id: String::new(),
                start_seq: self.up_to_seq,
                last_seq: self.up_to_seq,
                messages: self.messages.clone(),
                summary: false,
                finished: true,
                succeeded: true,
            }];
        }
        let mut rest = self.messages.iter();
        self.turns
            .iter()
            .map(|turn| crate::state::compaction::TurnGroup {
                run_id: turn.run_id.clone(),
                start_seq: turn.start_seq,
                last_seq: turn.last_seq,
                messages: rest
                    .by_ref()
                    .take(turn.messages as usize)
                    .cloned()
                    .collect(),
                summary: turn.summary,
                // A snapshot holds closed runs only.
                finished: true,
                succeeded: turn.succeeded,
            })
            .collect()
    }

    /// The messages and turns of a snapshot holding `groups`.
    pub fn describe(
        groups: &[crate::state::compaction::TurnGroup],
    ) -> (Vec<crate::content::Message>, Vec<SnapshotTurn>) {
        let messages = groups
            .iter()
            .flat_map(|g| g.messages.iter().cloned())
            .collect();
        let turns = groups
            .iter()
            .map(|g| SnapshotTurn {
                run_id: g.run_id.clone(),
                start_seq: g.start_seq,
                last_seq: g.last_seq,
                messages: u32::try_from(g.messages.len()).unwrap_or(u32::MAX),
                summary: g.summary,
                succeeded: g.succeeded,
            })
            .collect();
        (messages, turns)
    }

    /// The snapshot a window of a session's events (in seq order) starts from: the snapshot
    /// among them that accounts for everything before the first (none when the events start
    /// at the session's beginning).
    pub fn base_of<E: std::borrow::Borrow<crate::event::Event>>(
        events: &[E],
    ) -> Option<&SessionSnapshot> {
        let first = events.first()?.borrow().seq;
        events.iter().find_map(|e| match &e.borrow().payload {
            crate::event::Payload::SessionSnapshot(s) if s.up_to_seq + 1 == first => Some(s),
            _ => None,
        })
    }
}

/// Spending of a session's runs, as a snapshot carries it forward.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionSpent {
    /// Cost in USD.
    #[serde(default)]
    pub cost_usd: f64,
    /// Tokens (`Usage::total_tokens`).
    #[serde(default)]
    pub tokens: u64,
    /// Model calls.
    #[serde(default)]
    pub calls: u64,
}

/// `session.compacted`: the turns up to `up_to_seq` are replaced in the session history by
/// `summary`, written by a `kind: compaction` run; the last `kept` turns stay as they were.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionCompacted {
    /// The last seq the summary accounts for.
    pub up_to_seq: u64,
    /// The summary (never empty).
    pub summary: String,
    /// Turns kept verbatim after the summary.
    pub kept: u64,
    /// Estimated history tokens before.
    pub tokens_before: u64,
    /// Estimated history tokens after.
    pub tokens_after: u64,
    /// What the compaction run cost.
    #[serde(default)]
    pub cost_usd: f64,
    /// "ok", "warning" (markers missing after the retry; the summary is used anyway in the
    /// reference, see the engine's docs for Loom's choice) or "skipped".
    pub fidelity: String,
    /// The compaction run (not in the reference catalogue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Markers of the originals missing from the summary (not in the reference catalogue).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
}

/// `session.trimmed`: the history sent to a run was cut to its cap; `dropped` messages up to
/// `up_to_seq` were left out (tool calls and their results always together).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionTrimmed {
    /// The last seq of what was left out.
    pub up_to_seq: u64,
    /// Messages left out.
    pub dropped: u64,
    /// Why ("max_turns", "max_tokens", "hard_tokens").
    pub reason: String,
}
