//! The run-state projection: a pure fold over a run's events.
//!
//! [`RunState`] is never stored. It is recomputed from the journal by [`RunState::fold`], one
//! [`RunState::apply`] per event, and the engine decides the next effect from it alone. A
//! journal that breaks the state machine (an event after the run closed, a transition from the
//! wrong state) is refused with a [`ProjectionError`] naming the event.
//!
//! Split by what each part decides: `run` what a run's state is (the types and errors),
//! `projection` the fold and the life cycle of a run (start, order, transitions, closing
//! events), `turns` the conversation's turns (user messages, model answers, tool calls and
//! results, the final output), `approvals` approval requests and policy decisions, `history`
//! the conversation a model is sent and a session's history, `session_state` the session-state
//! projection ([`SessionState`], folded over a whole session rather than one run),
//! `compaction` the compaction summary and history caps over a session's turns.

mod approvals;
pub mod compaction;
mod history;
mod projection;
mod run;
mod session_state;
#[cfg(test)]
mod tests;
mod turns;

pub use history::{session_groups, session_groups_raw, session_history};
pub use run::{
    Amendment, Claim, FoldError, PendingCall, ProjectionError, REPAIR, Repair, RunState, RunStatus,
    STEER,
};
pub use session_state::SessionState;
