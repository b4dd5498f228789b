//! The session-state projection: what a session's runs wrote into its state, over the defaults
//! its agent declares, folded event by event ([`SessionState::apply`]).
//!
//! # The fold's contract
//!
//! - **Writes.** Two events write: `run.started` (its `state`, the caller's values, already
//!   checked before it was journaled) and a successful `tool.completed` (`output.state`, the
//!   values the engine accepted; an error result writes nothing, `state_refused` is never
//!   applied). Every other event only moves the fold's position, except the bookkeeping below.
//! - **Order.** Writes apply in journal order, except within one model turn of one run: the
//!   results of a batch are journaled as their tools finish, so of two calls of the same turn
//!   that write the same key, the one the model wrote last wins whatever the order they
//!   finished in (the reference orders state writes by turn, then by the call's rank in the
//!   model's answer). To know the rank, the fold keeps the call ids of each run's last
//!   orchestrator answer (`model.responded` without `call_id` nor `judge`) until that run
//!   closes.
//! - **Defaults** are not journaled facts: they come from the agent's declaration and are
//!   given by whoever folds ([`SessionState::new`], [`SessionState::with_defaults`]). They are
//!   never serialized: a saved value holds only what was written.
//! - **Resumable.** A `SessionState` is `Clone + Serialize + Deserialize`: saved after the
//!   event at [`SessionState::up_to_seq`] (for example inside a `session.snapshot`), then
//!   deserialized, given its defaults again and fed the events after that seq, it equals the
//!   fold of the whole journal. An event at or below `up_to_seq` is skipped, so feeding events
//!   twice is harmless; an event not yet journaled (seq 0) is always applied.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::event::{Event, Payload};

/// A session's state: see the module documentation for the fold's contract.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionState {
    /// The declared defaults, under the written values (never serialized).
    #[serde(skip)]
    defaults: BTreeMap<String, Value>,
    /// The values written, by key.
    #[serde(default)]
    written: BTreeMap<String, Value>,
    /// Per open run: the call ids of its last orchestrator answer, and which rank wrote each
    /// key in that turn.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    turns: BTreeMap<String, Turn>,
    /// The seq of the last journaled event applied (0: none).
    #[serde(default)]
    up_to_seq: u64,
}

/// One run's current model turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Turn {
    /// The answer's call ids, in the order the model wrote them.
    calls: Vec<String>,
    /// Key → rank of the call that wrote it last in this turn.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    writers: BTreeMap<String, usize>,
}

impl SessionState {
    /// An empty state over `defaults` (the agent's declared defaults).
    pub fn new(defaults: impl IntoIterator<Item = (String, Value)>) -> SessionState {
        SessionState {
            defaults: defaults.into_iter().collect(),
            ..SessionState::default()
        }
    }

    /// The same state over other `defaults` (a saved value is given its defaults again).
    #[must_use]
    pub fn with_defaults(mut self, defaults: impl IntoIterator<Item = (String, Value)>) -> Self {
        self.defaults = defaults.into_iter().collect();
        self
    }

    /// Folds `events` (a session's, in seq order) over `defaults`.
    pub fn fold<'e>(
        events: impl IntoIterator<Item = &'e Event>,
        defaults: impl IntoIterator<Item = (String, Value)>,
    ) -> SessionState {
        let mut state = SessionState::new(defaults);
        for event in events {
            state.apply(event);
        }
        state
    }

    /// Applies one event (see the module documentation).
    pub fn apply(&mut self, event: &Event) {
        if event.seq != 0 {
            if event.seq <= self.up_to_seq {
                return;
            }
            self.up_to_seq = event.seq;
        }
        let run = &event.run_id;
        match &event.payload {
            Payload::RunStarted(started) => {
                for (key, value) in &started.state {
                    self.written.insert(key.clone(), value.clone());
                }
            }
            Payload::ModelResponded(answer)
                if answer.call_id.is_none() && answer.judge.is_none() =>
            {
                let calls = answer
                    .message
                    .tool_calls()
                    .map(|(call_id, _, _)| call_id.to_owned())
                    .collect();
                self.turns.insert(
                    run.clone(),
                    Turn {
                        calls,
                        writers: BTreeMap::new(),
                    },
                );
            }
            Payload::ToolCompleted(completed)
                if !completed.output.is_error && !completed.output.state.is_empty() =>
            {
                let turn = self.turns.get_mut(run);
                let rank = turn
                    .as_ref()
                    .and_then(|t| t.calls.iter().position(|c| *c == completed.call_id));
                match (turn, rank) {
                    (Some(turn), Some(rank)) => {
                        for (key, value) in &completed.output.state {
                            // A later call of the same turn already wrote this key.
                            if turn.writers.get(key).is_some_and(|&other| other > rank) {
                                continue;
                            }
                            turn.writers.insert(key.clone(), rank);
                            self.written.insert(key.clone(), value.clone());
                        }
                    }
                    _ => {
                        for (key, value) in &completed.output.state {
                            self.written.insert(key.clone(), value.clone());
                        }
                    }
                }
            }
            payload if payload.is_closing() => {
                self.turns.remove(run);
            }
            _ => {}
        }
    }

    /// The state's values: the defaults, overlaid by what was written, sorted by key.
    pub fn values(&self) -> Map<String, Value> {
        let mut all = self.defaults.clone();
        all.extend(self.written.clone());
        all.into_iter().collect()
    }

    /// The value of `key` (written, else its default).
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.written.get(key).or_else(|| self.defaults.get(key))
    }

    /// Whether `key` has a value (written, or a default).
    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The seq of the last journaled event applied (0: none).
    pub fn up_to_seq(&self) -> u64 {
        self.up_to_seq
    }
}
