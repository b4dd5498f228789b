//! The rules every `EventStore` applies before writing: safe ids, batch shape, well-formed
//! events, and how seqs are assigned. Pure functions, so the memory, JSONL and SQLite journals
//! (separate adapter crates) share one definition of the contract.

use crate::{
    event::{Event, EventReadError},
    ids::is_safe_id,
    ports::{Salvage, StoreError, UnreadableLine},
};

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
/// that every event shares it, that its ids are safe, that every event is well-formed and that
/// its line reads back ([`readable`]): an event that could not be read back must never reach a
/// journal, since its whole session would then be unreadable.
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
        readable(event)?;
    }
    Ok(Some((first.tenant_id.clone(), first.session_id.clone())))
}

/// Refuses an event whose journal line would not read back with the reader's limits (the JSON
/// reader's recursion limit, numbers JSON cannot hold): the line is serialized and read again
/// exactly as a store reads it.
pub fn readable(event: &Event) -> Result<(), StoreError> {
    let line = event.to_json();
    match serde_json::from_str::<Event>(&line) {
        Ok(_) => Ok(()),
        Err(err) => Err(StoreError::Invalid(format!(
            "event {} ({}) would not read back, so it is not written: {err}",
            event.event_id, event.event_type
        ))),
    }
}

/// Checks a set-aside request against its journal (the replacement belongs to the journal, is
/// well-formed and carries the line's seq), for the stores implementing
/// [`EventStore::set_aside`](crate::ports::EventStore::set_aside).
pub fn check_set_aside(
    tenant_id: &str,
    session_id: &str,
    lines: &[crate::ports::SetAside],
) -> Result<(), StoreError> {
    for aside in lines {
        let event = &aside.replacement;
        if event.tenant_id != tenant_id || event.session_id != session_id {
            return Err(StoreError::Invalid(format!(
                "the replacement of line {} belongs to {}/{}, not {tenant_id}/{session_id}",
                aside.line, event.tenant_id, event.session_id
            )));
        }
        if event.seq != aside.line {
            return Err(StoreError::Invalid(format!(
                "the replacement of line {} carries seq {}",
                aside.line, event.seq
            )));
        }
        event
            .check()
            .map_err(|err| StoreError::Invalid(err.to_string()))?;
        readable(event)?;
    }
    Ok(())
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

/// The event a database row of journal `tenant_id/session_id` at `seq` holds (its JSON text
/// `text`), or why it does not read back: it does not parse, or it names another journal or
/// another seq (a row copied or moved by hand).
pub fn row_event(
    tenant_id: &str,
    session_id: &str,
    seq: u64,
    text: &str,
) -> Result<Event, EventReadError> {
    let event = Event::from_json(text)?;
    let invalid = |reason: String| EventReadError::Invalid {
        event_id: event.event_id.clone(),
        seq: event.seq,
        reason,
    };
    if event.tenant_id != tenant_id || event.session_id != session_id {
        return Err(invalid(format!(
            "belongs to journal {}/{}",
            event.tenant_id, event.session_id
        )));
    }
    if event.seq != seq {
        return Err(invalid(format!("stored in the row of seq {seq}")));
    }
    Ok(event)
}

/// Adds the row at `seq` of journal `tenant_id/session_id` to `salvage` (what a database
/// journal's `EventStore::salvage` reads): its event when its text reads back
/// ([`row_event`]), else an unreadable line with the row's bytes, why, and the run its `run_id`
/// column names when that is a safe id. `text` is `None` when the row's event is not text.
pub fn salvage_row(
    salvage: &mut Salvage,
    tenant_id: &str,
    session_id: &str,
    seq: u64,
    text: Option<String>,
    run_id: Option<String>,
) {
    let read = match &text {
        Some(text) => row_event(tenant_id, session_id, seq, text),
        None => Err(EventReadError::Json("the row's event is not text".into())),
    };
    match read {
        Ok(event) => salvage.events.push(event),
        Err(error) => salvage.unreadable.push(UnreadableLine {
            line: seq,
            bytes: text.unwrap_or_default().into_bytes(),
            error,
            run_id: run_id.filter(|run| is_safe_id(run)),
        }),
    }
}

#[cfg(test)]
mod tests {
    use chrono::DateTime;
    use serde_json::{Map, Value, json};

    use super::*;
    use crate::event::{Envelope, Payload, RunContext, RunStarted};

    fn started(metadata: Map<String, Value>) -> Event {
        Event::new(
            Envelope {
                event_id: "e1".into(),
                ts: DateTime::from_timestamp_micros(0).unwrap_or_default(),
                tenant_id: "t".into(),
                session_id: "s".into(),
                run_id: "r".into(),
                root_run_id: "r".into(),
                span_id: "sp".into(),
                parent_span_id: None,
                agent: Some("a".into()),
                role: None,
            },
            Payload::RunStarted(RunStarted {
                kind: "normal".into(),
                context: RunContext {
                    tenant_id: "t".into(),
                    user_id: None,
                    metadata,
                },
                parent_run_id: None,
                parent_call_id: None,
                depth: 0,
                triggered_by: None,
                trigger: None,
                judges: "auto".into(),
                budget: None,
                state: Map::new(),
            }),
        )
    }

    fn nested(levels: usize) -> Map<String, Value> {
        let value = (1..levels).fold(json!(1), |inner, _| json!({ "a": inner }));
        let mut map = Map::new();
        map.insert("a".into(), value);
        map
    }

    /// The outside probe: metadata nested 125 levels deep passes every other check, and its
    /// line would be past the reader's recursion limit.
    #[test]
    fn an_event_that_would_not_read_back_is_refused_before_any_write() {
        let shallow = started(nested(64));
        assert_eq!(
            batch_journal(std::slice::from_ref(&shallow)).ok().flatten(),
            Some(("t".to_owned(), "s".to_owned()))
        );
        let deep = started(nested(125));
        assert!(deep.check().is_ok());
        assert!(Event::from_json(&deep.to_json()).is_err());
        let refused = batch_journal(&[deep]).unwrap_err();
        assert!(matches!(refused, StoreError::Invalid(_)), "{refused}");
        assert!(
            refused
                .to_string()
                .contains("event e1 (run.started) would not read back"),
            "{refused}"
        );
    }
}
