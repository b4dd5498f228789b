//! The rules every `EventStore` applies before writing: safe ids, batch shape, well-formed
//! events, and how seqs are assigned. Pure functions, so the memory, JSONL and SQLite journals
//! (separate adapter crates) share one definition of the contract.

use crate::{event::Event, ids::is_safe_id, ports::StoreError};

/// Refuses an id that cannot name a journal (`kind` is "tenant" or "session").
pub fn safe_id(kind: &str, id: &str) -> Result<(), StoreError> {
    if is_safe_id(id) {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "unsafe {kind} id {id:?} (expected [A-Za-z0-9][A-Za-z0-9._-]{{0,127}})"
        )))
    }
}

/// The journal `(tenant, session)` a batch targets (`None` for an empty batch), after checking
/// that every event shares it, that its ids are safe and that every event is well-formed (an
/// event that could not be read back must never reach a journal).
pub fn batch_journal(batch: &[Event]) -> Result<Option<(String, String)>, StoreError> {
    let Some(first) = batch.first() else {
        return Ok(None);
    };
    safe_id("tenant", &first.tenant_id)?;
    safe_id("session", &first.session_id)?;
    for event in batch {
        if event.tenant_id != first.tenant_id || event.session_id != first.session_id {
            return Err(StoreError::Invalid(format!(
                "a batch targets one journal: event {} belongs to {}/{}, not {}/{}",
                event.event_id,
                event.tenant_id,
                event.session_id,
                first.tenant_id,
                first.session_id
            )));
        }
        event
            .check()
            .map_err(|err| StoreError::Invalid(err.to_string()))?;
    }
    Ok(Some((first.tenant_id.clone(), first.session_id.clone())))
}

/// The conflict returned when the journal advanced past `expected`.
pub fn conflict(tenant_id: &str, session_id: &str, expected: u64, found: u64) -> StoreError {
    StoreError::Conflict {
        tenant_id: tenant_id.to_owned(),
        session_id: session_id.to_owned(),
        expected,
        found,
    }
}

/// Gives the batch the seqs following `last`.
pub fn assign_seq(batch: &mut [Event], last: u64) {
    for (seq, event) in (last + 1..).zip(batch.iter_mut()) {
        event.seq = seq;
    }
}
