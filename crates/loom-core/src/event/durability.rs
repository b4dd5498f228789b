//! Which batches a journal must have on disk before `append` returns ([`must_sync`]).
//!
//! Every append is written to the journal (the OS has it: a process crash or `kill -9` loses
//! nothing) before it returns. Only a batch that something outside the run may act on is also
//! synced to disk (`fdatasync`, SQLite `synchronous = FULL`, PostgreSQL `synchronous_commit`)
//! before `append` returns; a sync makes every earlier write of the file durable too. So after
//! a power loss or an OS crash a journal may lose the events after its last synced batch, and
//! never one that something outside depended on:
//!
//! - `run.started`, `message.user`: a caller was told its run or message was accepted;
//! - `tool.called`: a tool is about to act on the world; after a crash the engine must know the
//!   call may have happened (`on_unknown`), never run it again unknowingly. Not when every call
//!   of the batch is of a tool declared `side_effects: none` (the payload's `side_effects`),
//!   which is not a sub-agent: such a call only reads, the resume rule already runs it again
//!   (`safe_to_retry`), so losing its `tool.called` to a power cut costs a model call or a
//!   read, never a second effect. A sealed payload, or one that does not say, is synced;
//! - `approval.*`: a human was asked, or decided;
//! - `run.completed`, `run.failed`, `run.cancelled`: a caller is told how the run ended;
//! - `idempotency.*`, `artifact.stored`, `session.compacted`, `session.repaired`: they record
//!   facts kept outside the journal (a business key's result, a stored file) or replace history.
//!
//! The other events (a claim, steps, model answers, tool results, transitions, guards, judges,
//! snapshots) are re-derived by a resumed run if they are lost: a model answer lost to a power
//! cut means the model is asked again, a tool result lost means the call's outcome is unknown
//! (its `tool.called` was synced), never a second effect. The rule reads the envelope's `type`,
//! so it also holds for sealed (encrypted) payloads; only the exception for read-only calls
//! reads the payload, and a sealed one is synced.

use super::{Event, Payload};
use crate::tool::{SideEffects, ToolKind};

/// The event types whose batch is synced before `append` returns (see the module
/// documentation).
pub const SYNCED_TYPES: &[&str] = &[
    "run.started",
    "message.user",
    "tool.called",
    "approval.requested",
    "approval.granted",
    "approval.rejected",
    "approval.expired",
    "run.completed",
    "run.failed",
    "run.cancelled",
    "idempotency.recorded",
    "idempotency.reused",
    "artifact.stored",
    "session.compacted",
    "session.repaired",
];

/// Whether `batch` must be on disk before `append` returns: it holds an event of
/// [`SYNCED_TYPES`], other than the `tool.called` of a read-only call (see the module
/// documentation).
pub fn must_sync(batch: &[Event]) -> bool {
    batch
        .iter()
        .any(|event| SYNCED_TYPES.contains(&event.event_type.as_str()) && !read_only_call(event))
}

/// A `tool.called` whose (clear) payload says its tool only reads and is not a sub-agent.
fn read_only_call(event: &Event) -> bool {
    event.event_type == "tool.called"
        && matches!(
            &event.payload,
            Payload::ToolCalled(call)
                if call.side_effects == Some(SideEffects::None)
                    && call.tool_kind != ToolKind::Agent
                    && call.child_run_id.is_none()
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        RunStatus,
        event::{Effect, Envelope, Payload, StepStarted},
    };

    fn step() -> Event {
        Event::new(
            Envelope {
                event_id: "e".into(),
                ts: chrono::DateTime::UNIX_EPOCH,
                tenant_id: "t".into(),
                session_id: "s".into(),
                run_id: "r".into(),
                root_run_id: "r".into(),
                span_id: "span".into(),
                parent_span_id: None,
                agent: None,
                role: None,
            },
            Payload::StepStarted(StepStarted {
                step_no: 1,
                state: RunStatus::ReadyForModel,
                effect: Effect::ModelCall,
            }),
        )
    }

    #[test]
    fn only_a_batch_something_outside_depends_on_is_synced() {
        assert!(!must_sync(&[]));
        assert!(!must_sync(&[step(), step()]));
        let mut called = step();
        called.event_type = "tool.called".into();
        assert!(must_sync(&[step(), called]));
        for kind in SYNCED_TYPES {
            let mut one = step();
            one.event_type = (*kind).into();
            assert!(must_sync(&[one]), "{kind}");
        }
        let mut answered = step();
        answered.event_type = "model.responded".into();
        assert!(!must_sync(&[answered]));
    }

    fn call(side_effects: Option<SideEffects>, kind: ToolKind, child: Option<&str>) -> Event {
        let mut event = step();
        event.event_type = "tool.called".into();
        event.payload = Payload::ToolCalled(crate::event::ToolCalled {
            call_id: "c".into(),
            tool_name: "prix_ttc".into(),
            tool_kind: kind,
            arguments: serde_json::json!({}),
            refs: Vec::new(),
            resumed: false,
            child_run_id: child.map(Into::into),
            side_effects,
        });
        event
    }

    #[test]
    fn a_read_only_call_is_not_synced_and_every_other_call_is() {
        let read = || call(Some(SideEffects::None), ToolKind::Python, None);
        assert!(!must_sync(&[read()]));
        assert!(!must_sync(&[step(), read(), read()]));
        // One call that may act makes the batch synced.
        let sends = call(Some(SideEffects::Irreversible), ToolKind::Mcp, None);
        assert!(must_sync(&[read(), sends]));
        assert!(must_sync(&[call(
            Some(SideEffects::Reversible),
            ToolKind::Python,
            None
        )]));
        // A journal that does not say (the reference's, an older Loom's) is synced.
        assert!(must_sync(&[call(None, ToolKind::Python, None)]));
        // A sub-agent's call names a child run that must not be started twice.
        assert!(must_sync(&[call(
            Some(SideEffects::None),
            ToolKind::Agent,
            None
        )]));
        assert!(must_sync(&[call(
            Some(SideEffects::None),
            ToolKind::Python,
            Some("child")
        )]));
        // A sealed payload cannot be read: synced.
        let mut sealed = read();
        sealed.payload = Payload::Sealed(crate::event::SealedPayload {
            sealed: "c2VhbGVk".into(),
            key_id: "0123456789ab".into(),
        });
        assert!(must_sync(&[sealed]));
        // The other synced types stay synced beside a read-only call.
        let mut ended = step();
        ended.event_type = "run.completed".into();
        assert!(must_sync(&[read(), ended]));
    }
}
