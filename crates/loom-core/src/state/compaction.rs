//! Compaction and history caps over a session's history, as pure functions over per-run message
//! groups ([`TurnGroup`]): which turns a compaction summarizes ([`plan`]), how a
//! `session.compacted` replaces them ([`apply_compaction`]), and how `sessions.history` cuts
//! the oldest turns ([`cap`]) without ever separating a tool call from its result.
//!
//! Every function here takes groups and returns groups, so that the history can be read from
//! the whole journal or from a `session.snapshot` and what follows it, and be cut the same way.

use crate::{
    content::Message,
    event::{Event, Payload, SessionCompacted},
};

/// The line a compaction summary opens with in the history, before the summary itself.
pub const SUMMARY_PREFIX: &str = "[Summary of the earlier exchanges of this conversation.]";

/// The history of one earlier root run (one turn), or the summary that replaced earlier turns.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnGroup {
    /// The run (empty for a summary).
    pub run_id: String,
    /// The seq of its `run.started` (for a summary: the `up_to_seq` it accounts for).
    pub start_seq: u64,
    /// The seq of its last event read (for a summary: its `up_to_seq`).
    pub last_seq: u64,
    /// Its messages, tool calls and results in pairs.
    pub messages: Vec<Message>,
    /// The summary of a compaction, not a run.
    pub summary: bool,
    /// The run has closed.
    pub finished: bool,
    /// The run completed (a successful turn).
    pub succeeded: bool,
}

impl TurnGroup {
    /// The group holding a compaction summary, as the history shows it.
    pub fn summary(compacted: &SessionCompacted) -> TurnGroup {
        TurnGroup {
            run_id: String::new(),
            start_seq: compacted.up_to_seq,
            last_seq: compacted.up_to_seq,
            messages: vec![summary_message(&compacted.summary)],
            summary: true,
            finished: true,
            succeeded: true,
        }
    }

    /// Estimated tokens of its messages.
    pub fn tokens(&self) -> u64 {
        estimate_tokens(&self.messages)
    }
}

/// The user message a compaction summary becomes in the history.
pub fn summary_message(summary: &str) -> Message {
    Message::user(format!("{SUMMARY_PREFIX}\n{summary}"))
}

/// Estimated tokens of `messages`, as the reference counts them: the length of each message's
/// JSON, summed, divided by 4.
pub fn estimate_tokens(messages: &[Message]) -> u64 {
    let chars: usize = messages
        .iter()
        .map(|m| serde_json::to_string(m).map_or(0, |json| json.len()))
        .sum();
    u64::try_from(chars / 4).unwrap_or(u64::MAX)
}

/// Estimated tokens of the whole history.
pub fn groups_tokens(groups: &[TurnGroup]) -> u64 {
    groups.iter().map(TurnGroup::tokens).sum()
}

/// The messages of `groups`, in order.
pub fn flatten(groups: Vec<TurnGroup>) -> Vec<Message> {
    groups.into_iter().flat_map(|g| g.messages).collect()
}

/// The latest `session.compacted` among `events` (the one the history applies: each summary
/// covers the one before it).
pub fn latest_compaction<E: std::borrow::Borrow<Event>>(events: &[E]) -> Option<&SessionCompacted> {
    events.iter().rev().find_map(|e| match &e.borrow().payload {
        Payload::SessionCompacted(c) => Some(c),
        _ => None,
    })
}

/// The history once `compacted` applies: the groups of runs started at or before its
/// `up_to_seq` (and any earlier summary) are replaced by one group holding its summary.
pub fn apply_compaction(groups: Vec<TurnGroup>, compacted: &SessionCompacted) -> Vec<TurnGroup> {
    let mut out = vec![TurnGroup::summary(compacted)];
    out.extend(
        groups
            .into_iter()
            .filter(|g| !g.summary && g.start_seq > compacted.up_to_seq),
    );
    out
}

/// What a compaction summarizes: the turns before the last `keep_last` successful ones.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The groups summarized (an earlier summary first, when there is one).
    pub segment: Vec<TurnGroup>,
    /// Successful turns kept verbatim after the summary.
    pub kept: u64,
    /// The last seq the summary accounts for.
    pub up_to_seq: u64,
    /// Estimated tokens of the whole history before.
    pub tokens_before: u64,
    /// Estimated tokens of what is kept (the summary comes on top).
    pub tokens_kept: u64,
}

/// Which turns a compaction summarizes: everything before the last `keep_last` successful
/// turns, up to the first run that is still open (its turn is not written yet). `None` when
/// there is nothing new to summarize (too few turns, or only an earlier summary).
pub fn plan(groups: &[TurnGroup], keep_last: u32) -> Option<Plan> {
    let keep = usize::try_from(keep_last).unwrap_or(usize::MAX);
    // The first kept group: the keep_last-th successful turn from the end.
    let mut cut = groups.len();
    let mut seen = 0;
    if keep > 0 {
        for (i, group) in groups.iter().enumerate().rev() {
            if !group.summary && group.succeeded {
                seen += 1;
                if seen == keep {
                    cut = i;
                    break;
                }
            }
        }
        if seen < keep {
            return None;
        }
    }
    let open = groups
        .iter()
        .position(|g| !g.finished)
        .unwrap_or(groups.len());
    let end = cut.min(open);
    let segment = &groups[..end];
    if !segment.iter().any(|g| !g.summary) {
        return None;
    }
    let last = segment.last()?;
    let up_to_seq = match groups.get(end) {
        Some(next) => last.last_seq.min(next.start_seq.saturating_sub(1)),
        None => last.last_seq,
    };
    let kept = groups[end..]
        .iter()
        .filter(|g| !g.summary && g.succeeded)
        .count();
    Some(Plan {
        segment: segment.to_vec(),
        kept: u64::try_from(kept).unwrap_or(u64::MAX),
        up_to_seq,
        tokens_before: groups_tokens(groups),
        tokens_kept: groups_tokens(&groups[end..]),
    })
}

/// Caps on the history sent to a run (`sessions.history`, and `hard_tokens` as a last resort).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    /// Earlier turns kept at most (a summary is not a turn).
    pub max_turns: Option<u32>,
    /// Estimated tokens kept at most.
    pub max_tokens: Option<u64>,
    /// The reason journaled when `max_tokens` cuts (`max_tokens`, or `hard_tokens` when the
    /// cap is the safety net of a compacting session).
    pub tokens_reason: &'static str,
}

/// What a cap left out, as `session.trimmed` journals it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trim {
    /// The last seq of what was left out.
    pub up_to_seq: u64,
    /// Messages left out.
    pub dropped: u64,
    /// Which cap cut last (`max_turns`, `max_tokens`, `hard_tokens`).
    pub reason: String,
}

/// The history within `caps`: the oldest groups are left out first, whole, so a tool call
/// never loses its result (both are in one run's group, in pairs). A summary older than a
/// dropped turn goes with it. `None` when nothing was cut.
pub fn cap(groups: Vec<TurnGroup>, caps: Caps) -> (Vec<TurnGroup>, Option<Trim>) {
    let mut drop = 0;
    let mut reason = "";
    if let Some(max) = caps.max_turns {
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        let turns = groups.iter().filter(|g| !g.summary).count();
        if turns > max {
            // Keep from the max-th turn from the end.
            let mut seen = 0;
            let mut first_kept = groups.len();
            for (i, group) in groups.iter().enumerate().rev() {
                if seen == max {
                    break;
                }
                if !group.summary {
                    seen += 1;
                    first_kept = i;
                }
            }
            drop = first_kept;
            reason = "max_turns";
        }
    }
    if let Some(max) = caps.max_tokens {
        let mut total: u64 = groups_tokens(&groups[drop..]);
        while drop < groups.len() && total > max {
            total -= groups[drop].tokens();
            drop += 1;
            reason = if caps.tokens_reason.is_empty() {
                "max_tokens"
            } else {
                caps.tokens_reason
            };
        }
    }
    if drop == 0 {
        return (groups, None);
    }
    let mut groups = groups;
    let kept = groups.split_off(drop);
    let trim = Trim {
        up_to_seq: groups.iter().map(|g| g.last_seq).max().unwrap_or(0),
        dropped: u64::try_from(groups.iter().map(|g| g.messages.len()).sum::<usize>())
            .unwrap_or(u64::MAX),
        reason: reason.to_owned(),
    };
    (kept, Some(trim))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::{Block, BlockKind};
    use crate::tool::ToolOutput;

    fn turn(run_id: &str, start_seq: u64, text: &str, succeeded: bool) -> TurnGroup {
        TurnGroup {
            run_id: run_id.into(),
            start_seq,
            last_seq: start_seq + 9,
            messages: vec![
                Message::user(text),
                Message::assistant(format!("re: {text}")),
            ],
            summary: false,
            finished: true,
            succeeded,
        }
    }

    /// A turn whose answer called a tool: user, assistant call, tool result, assistant.
    fn tool_turn(run_id: &str, start_seq: u64, call_id: &str) -> TurnGroup {
        let mut group = turn(run_id, start_seq, "with a tool", true);
        let mut asks = Message::assistant("calling");
        asks.blocks.push(Block::tool_call(
            call_id,
            "lookup",
            serde_json::json!({"q": "x"}),
        ));
        let result = Message {
            role: crate::content::Role::Tool,
            blocks: vec![Block::new(BlockKind::ToolResult {
                call_id: call_id.into(),
                output: ToolOutput::text("found"),
            })],
        };
        group.messages.insert(1, asks);
        group.messages.insert(2, result);
        group
    }

    fn compacted(up_to_seq: u64, summary: &str) -> SessionCompacted {
        SessionCompacted {
            up_to_seq,
            summary: summary.into(),
            kept: 1,
            tokens_before: 100,
            tokens_after: 10,
            cost_usd: 0.0,
            fidelity: "ok".into(),
            run_id: None,
            missing: Vec::new(),
        }
    }

    fn ids(groups: &[TurnGroup]) -> Vec<&str> {
        groups.iter().map(|g| g.run_id.as_str()).collect()
    }

    #[test]
    fn a_plan_summarizes_what_precedes_the_last_successful_turns() {
        let groups = vec![
            turn("r1", 1, "one", true),
            turn("r2", 11, "two", false),
            turn("r3", 21, "three", true),
            turn("r4", 31, "four", true),
        ];
        let planned = plan(&groups, 2).unwrap();
        assert_eq!(ids(&planned.segment), ["r1", "r2"]);
        assert_eq!(planned.kept, 2);
        assert_eq!(
            planned.up_to_seq, 20,
            "the last seq before the first kept turn"
        );
        assert_eq!(planned.tokens_before, groups_tokens(&groups));
        assert_eq!(planned.tokens_kept, groups_tokens(&groups[2..]));
        assert!(plan(&groups, 4).is_none(), "only three successful turns");
        assert_eq!(ids(&plan(&groups, 0).unwrap().segment).len(), 4);
    }

    #[test]
    fn a_plan_stops_at_an_open_run_and_needs_a_turn_beyond_a_summary() {
        let mut groups = vec![
            turn("r1", 1, "one", true),
            turn("r2", 11, "two", false),
            turn("r3", 21, "three", true),
        ];
        groups[1].finished = false;
        let planned = plan(&groups, 1).unwrap();
        assert_eq!(
            ids(&planned.segment),
            ["r1"],
            "the open run r2 is not summarized"
        );
        assert_eq!(planned.up_to_seq, 10);

        let only_summary = apply_compaction(vec![turn("r1", 1, "one", true)], &compacted(10, "s"));
        let mut with_kept = only_summary.clone();
        with_kept.push(turn("r2", 11, "two", true));
        assert!(
            plan(&with_kept, 1).is_none(),
            "nothing new before the kept turn"
        );
    }

    #[test]
    fn a_compaction_replaces_the_runs_it_covers_with_its_summary() {
        let groups = vec![
            turn("r1", 1, "one", true),
            turn("r2", 11, "two", true),
            turn("r3", 21, "three", true),
        ];
        let out = apply_compaction(groups, &compacted(20, "one and two"));
        assert_eq!(ids(&out), ["", "r3"]);
        assert!(out[0].summary);
        assert_eq!(
            out[0].messages[0].text(),
            format!("{SUMMARY_PREFIX}\none and two")
        );
        // A later compaction replaces the earlier summary too.
        let again = apply_compaction(out, &compacted(30, "all three"));
        assert_eq!(ids(&again), [""]);
        assert_eq!(flatten(again).len(), 1);
    }

    #[test]
    fn caps_drop_the_oldest_turns_whole_never_a_call_without_its_result() {
        let groups = vec![
            tool_turn("r1", 1, "c1"),
            tool_turn("r2", 11, "c2"),
            turn("r3", 21, "three", true),
        ];
        let caps = Caps {
            max_turns: Some(2),
            ..Caps::default()
        };
        let (kept, trim) = cap(groups.clone(), caps);
        assert_eq!(ids(&kept), ["r2", "r3"]);
        assert_eq!(
            trim,
            Some(Trim {
                up_to_seq: 10,
                dropped: 4,
                reason: "max_turns".into()
            })
        );
        // Every call kept has its result.
        let messages = flatten(kept);
        let calls: Vec<&str> = messages
            .iter()
            .flat_map(|m| m.tool_calls().map(|(id, _, _)| id))
            .collect();
        assert_eq!(calls, ["c2"]);
        assert!(messages.iter().any(|m| {
            m.blocks.iter().any(
                |b| matches!(&b.kind, BlockKind::ToolResult { call_id, .. } if call_id == "c2"),
            )
        }));

        // A token cap just under the last two turns keeps only the last one.
        let budget = groups_tokens(&groups[1..]) - 1;
        let (kept, trim) = cap(
            groups.clone(),
            Caps {
                max_tokens: Some(budget),
                ..Caps::default()
            },
        );
        assert_eq!(ids(&kept), ["r3"]);
        let trim = trim.unwrap();
        assert_eq!((trim.up_to_seq, trim.dropped), (20, 8));
        assert_eq!(trim.reason, "max_tokens");

        let (all, none) = cap(groups.clone(), Caps::default());
        assert_eq!(all, groups);
        assert!(none.is_none());
    }

    #[test]
    fn a_turn_cap_drops_a_summary_older_than_the_turns_it_drops() {
        let groups = apply_compaction(
            vec![
                turn("r1", 1, "one", true),
                turn("r2", 11, "two", true),
                turn("r3", 21, "three", true),
            ],
            &compacted(10, "one"),
        );
        let (kept, _) = cap(
            groups.clone(),
            Caps {
                max_turns: Some(2),
                ..Caps::default()
            },
        );
        assert_eq!(ids(&kept), ["", "r2", "r3"], "two turns: the summary stays");
        let (kept, trim) = cap(
            groups,
            Caps {
                max_turns: Some(1),
                max_tokens: None,
                tokens_reason: "hard_tokens",
            },
        );
        assert_eq!(ids(&kept), ["r3"]);
        assert_eq!(trim.unwrap().dropped, 3);
    }
}
