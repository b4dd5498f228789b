//! What callers see of a compaction ([`CompactionNote`]): what [`crate::Loom::compact`]
//! answers, and what a run's result says of the compaction it triggered or that preceded it,
//! read from the journal ([`CompactionNote::of_run`]).

use std::borrow::Borrow;

use loom_core::{Event, RunState, RunStatus, event::Payload};
use loom_engine::Compaction;
use serde::{Deserialize, Serialize};

/// A compaction, as a run's result and `loom compact` show it. Carries no content (neither the
/// summary nor the markers it missed: those are in the journal).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CompactionNote {
    /// `applied` (the summary replaces the turns), `kept` (the summary missed markers of the
    /// originals: they are kept), `failed` (the summarizer's run did not complete), `running`
    /// (not finished yet), `queued` (handed to a worker), `nothing` (nothing to summarize).
    pub outcome: String,
    /// In a run's result: `after` (this run triggered it) or `before` (it ran at this run's
    /// opening, or between the previous turn and this one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// The compaction run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The last seq the summary accounts for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to_seq: Option<u64>,
    /// Turns kept verbatim after the summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<u64>,
    /// Estimated history tokens before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_before: Option<u64>,
    /// Estimated history tokens after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_after: Option<u64>,
    /// What the compaction run cost.
    #[serde(default)]
    pub cost_usd: f64,
}

impl CompactionNote {
    /// A note of `outcome` and nothing else.
    pub(crate) fn bare(outcome: &str) -> CompactionNote {
        CompactionNote {
            outcome: outcome.into(),
            when: None,
            run_id: None,
            up_to_seq: None,
            kept: None,
            tokens_before: None,
            tokens_after: None,
            cost_usd: 0.0,
        }
    }

    /// What the engine's compaction did.
    pub(crate) fn of(compaction: &Compaction) -> CompactionNote {
        match compaction {
            Compaction::Nothing => CompactionNote::bare("nothing"),
            Compaction::Applied(c) => CompactionNote {
                run_id: c.run_id.clone(),
                up_to_seq: Some(c.up_to_seq),
                kept: Some(c.kept),
                tokens_before: Some(c.tokens_before),
                tokens_after: Some(c.tokens_after),
                cost_usd: c.cost_usd,
                ..CompactionNote::bare("applied")
            },
            Compaction::Kept { run_id, .. } => CompactionNote {
                run_id: Some(run_id.clone()),
                ..CompactionNote::bare("kept")
            },
            Compaction::Failed { run_id, .. } => CompactionNote {
                run_id: Some(run_id.clone()),
                ..CompactionNote::bare("failed")
            },
        }
    }

    /// The compaction `run_id` triggered (`after`), else the last one that ran between the
    /// session's previous turn and `run_id`'s opening (`before`), read from the session's
    /// events.
    pub fn of_run<E: Borrow<Event>>(events: &[E], run_id: &str) -> Option<CompactionNote> {
        let events: Vec<&Event> = events.iter().map(Borrow::borrow).collect();
        let events = events.as_slice();
        let compactions: Vec<(&Event, Option<&str>)> = events
            .iter()
            .copied()
            .filter_map(|e| match &e.payload {
                Payload::RunStarted(p) if p.kind == "compaction" => {
                    Some((e, p.triggered_by.as_deref()))
                }
                _ => None,
            })
            .collect();
        if let Some((started, _)) = compactions.iter().rev().find(|(_, by)| *by == Some(run_id)) {
            return Some(CompactionNote {
                when: Some("after".into()),
                ..note(events, &started.run_id)
            });
        }
        let start = events.iter().position(|e| e.run_id == run_id)?;
        let previous_turn = events[..start]
            .iter()
            .rev()
            .find(|e| {
                matches!(&e.payload, Payload::RunStarted(p)
                    if p.kind == "normal" && p.parent_run_id.is_none())
            })
            .map_or(0, |e| e.seq);
        let (started, _) = compactions
            .iter()
            .rev()
            .find(|(e, _)| e.seq > previous_turn && e.seq < events[start].seq)?;
        Some(CompactionNote {
            when: Some("before".into()),
            ..note(events, &started.run_id)
        })
    }
}

/// The note of the compaction run `run_id`, from the session's events.
fn note(events: &[&Event], run_id: &str) -> CompactionNote {
    let compacted = events.iter().find_map(|e| match &e.payload {
        Payload::SessionCompacted(c) if e.run_id == run_id => Some(c),
        _ => None,
    });
    if let Some(c) = compacted {
        return CompactionNote {
            run_id: Some(run_id.to_owned()),
            up_to_seq: Some(c.up_to_seq),
            kept: Some(c.kept),
            tokens_before: Some(c.tokens_before),
            tokens_after: Some(c.tokens_after),
            cost_usd: c.cost_usd,
            ..CompactionNote::bare("applied")
        };
    }
    let outcome = match RunState::fold(run_id, events) {
        // Completed but `session.compacted` not written yet: still being applied.
        Ok(state) if !state.finished || state.status == RunStatus::Completed => "running",
        Ok(state)
            if state.status == RunStatus::Failed
                && state.error_type.as_deref() == Some("guard.fidelity") =>
        {
            "kept"
        }
        _ => "failed",
    };
    let cost_usd = RunState::fold(run_id, events).map_or(0.0, |s| s.cost_usd);
    CompactionNote {
        run_id: Some(run_id.to_owned()),
        cost_usd,
        ..CompactionNote::bare(outcome)
    }
}
