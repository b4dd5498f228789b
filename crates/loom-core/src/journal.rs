//! The rules every `EventStore` applies before writing: safe ids, batch shape, well-formed
//! events, and how seqs are assigned. Pure functions, so the memory, JSONL and SQLite journals
//! (separate adapter crates) share one definition of the contract.

use std::{borrow::Borrow, sync::Arc};

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

mod decoded;
mod line;

pub use decoded::Decoded;
pub use line::{Line, READ_DEPTH};

/// The journal `(tenant, session)` a batch targets (`None` for an empty batch), after checking
/// that every event shares it, that its ids are safe, that every event is well-formed and that
/// its line reads back ([`readable`]): an event that could not be read back must never reach a
/// journal, since its whole session would then be unreadable.
///
/// A store writing the batch uses [`Batch::check`] instead, which keeps the lines.
pub fn batch_journal(batch: &[Event]) -> Result<Option<(String, String)>, StoreError> {
    let Some((tenant_id, session_id)) = shared_journal(batch)? else {
        return Ok(None);
    };
    for event in batch {
        readable(event)?;
    }
    Ok(Some((tenant_id, session_id)))
}

/// The journal every event of `batch` targets, after checking ids and well-formedness.
fn shared_journal<E: Borrow<Event>>(batch: &[E]) -> Result<Option<(String, String)>, StoreError> {
    let Some(first) = batch.first().map(Borrow::borrow) else {
        return Ok(None);
    };
    safe_id("tenant", &first.tenant_id)?;
    safe_id("session", &first.session_id)?;
    for event in batch.iter().map(Borrow::borrow) {
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

/// Refuses an event whose journal line would not read back with the reader's limits (the JSON
/// reader's recursion limit, numbers JSON cannot hold, timestamps RFC 3339 cannot write): the
/// line is serialized with those checks ([`Line::encode`]).
pub fn readable(event: &Event) -> Result<(), StoreError> {
    Line::encode(event).map(drop)
}

/// A batch checked for one journal, each event with its line, serialized once: what a store
/// writes (JSONL), inserts (SQLite, PostgreSQL) or keeps (memory) is the line checked here.
/// Its events are owned (`Event`) or shared (`Arc<Event>`, as a writer lends them to the
/// memory journal, which keeps them).
#[derive(Debug, Clone)]
pub struct Batch<E = Event> {
    /// The tenant of every event.
    pub tenant_id: String,
    /// The session of every event.
    pub session_id: String,
    events: Vec<E>,
    lines: Vec<Line>,
}

impl<E: Borrow<Event>> Batch<E> {
    /// Checks `batch` as [`batch_journal`] does and keeps each event's line; `Ok(Err(batch))`
    /// gives an empty batch back (nothing to write).
    pub fn check(batch: Vec<E>) -> Result<Result<Batch<E>, Vec<E>>, StoreError> {
        let Some((tenant_id, session_id)) = shared_journal(&batch)? else {
            return Ok(Err(batch));
        };
        let lines = batch
            .iter()
            .map(|event| Line::encode(event.borrow()))
            .collect::<Result<_, _>>()?;
        Ok(Ok(Batch {
            tenant_id,
            session_id,
            events: batch,
            lines,
        }))
    }

    /// The events.
    pub fn events(&self) -> &[E] {
        &self.events
    }

    /// Their lines, in the same order.
    pub fn lines(&self) -> &[Line] {
        &self.lines
    }

    /// How many events.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether it holds no event (never, for a batch [`Batch::check`] built).
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The events and their lines.
    pub fn into_parts(self) -> (Vec<E>, Vec<Line>) {
        (self.events, self.lines)
    }
}

impl Batch {
    /// Gives the events the seqs following `last`, in them and in their lines.
    pub fn assign_seq(&mut self, last: u64) {
        for ((seq, event), line) in (last + 1..).zip(&mut self.events).zip(&mut self.lines) {
            event.seq = seq;
            line.set_seq(seq);
        }
    }
}

impl Batch<Arc<Event>> {
    /// Gives the events the seqs following `last`, in them and in their lines. An event that
    /// already carries its seq (a writer numbers its batch after the last seq it knows) is
    /// kept as it is; one that does not is copied if it is shared.
    pub fn assign_seq(&mut self, last: u64) {
        for ((seq, event), line) in (last + 1..).zip(&mut self.events).zip(&mut self.lines) {
            if event.seq != seq {
                Arc::make_mut(event).seq = seq;
            }
            line.set_seq(seq);
        }
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
    use crate::event::{
        Envelope, Outcome, Payload, RunBudget, RunContext, RunStarted, StepCompleted,
    };

    /// A `run.started` of journal `t/s` (also for `decoded`'s tests).
    pub(super) fn started(metadata: Map<String, Value>) -> Event {
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

    /// Whether the line of `event` reads back, by a real parse (what the check must agree with).
    fn parses(event: &Event) -> bool {
        serde_json::from_str::<Event>(&event.to_json()).is_ok()
    }

    /// The check agrees with a parse on both sides of the reader's recursion limit, in a
    /// payload's `Value` (metadata) and in a tool call's arguments.
    #[test]
    fn the_depth_check_refuses_exactly_what_the_reader_refuses() {
        let mut accepted = 0;
        for levels in 100..140 {
            let event = started(nested(levels));
            let encoded = Line::encode(&event);
            assert_eq!(encoded.is_ok(), parses(&event), "{levels} levels");
            accepted += usize::from(encoded.is_ok());
            if let Err(err) = encoded {
                assert!(matches!(err, StoreError::Invalid(_)), "{err}");
                assert!(err.to_string().contains("recursion limit"), "{err}");
            }
        }
        // Both sides of the limit were seen.
        assert!((1..40).contains(&accepted), "{accepted}");
    }

    fn step_completed(duration_ms: f64) -> Event {
        let mut event = started(Map::new());
        event.payload = Payload::StepCompleted(StepCompleted {
            step_no: 1,
            duration_ms,
            events_emitted: 0,
            outcome: Outcome::Ok,
        });
        Event::new(envelope_of(&event), event.payload)
    }

    fn envelope_of(event: &Event) -> Envelope {
        Envelope {
            event_id: event.event_id.clone(),
            ts: event.ts,
            tenant_id: event.tenant_id.clone(),
            session_id: event.session_id.clone(),
            run_id: event.run_id.clone(),
            root_run_id: event.root_run_id.clone(),
            span_id: event.span_id.clone(),
            parent_span_id: event.parent_span_id.clone(),
            agent: event.agent.clone(),
            role: event.role.clone(),
        }
    }

    /// A float JSON cannot hold is refused, as a parse refuses it in an `f64` field; in an
    /// `Option` (where a parse would read `None`, another value) too.
    #[test]
    fn non_finite_numbers_are_refused() {
        for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let event = step_completed(value);
            assert!(!parses(&event));
            let refused = batch_journal(std::slice::from_ref(&event)).unwrap_err();
            assert!(matches!(refused, StoreError::Invalid(_)), "{refused}");
            assert!(
                refused.to_string().contains("would not read back"),
                "{refused}"
            );
        }
        assert!(Line::encode(&step_completed(12.5)).is_ok());
        let mut budgeted = started(Map::new());
        if let Payload::RunStarted(run) = &mut budgeted.payload {
            run.budget = Some(RunBudget {
                max_cost: Some(f64::NAN),
                max_tokens: None,
                max_calls: None,
            });
        }
        let budgeted = Event::new(envelope_of(&budgeted), budgeted.payload);
        assert!(Line::encode(&budgeted).is_err());
    }

    /// A timestamp is accepted exactly when its RFC 3339 text reads back.
    #[test]
    fn timestamps_are_refused_exactly_when_they_would_not_read_back() {
        use chrono::{NaiveDate, TimeZone, Utc};
        for year in [-1, 0, 1, 1970, 9999, 10000, 262_000] {
            let mut event = started(Map::new());
            let Some(date) = NaiveDate::from_ymd_opt(year, 6, 1) else {
                panic!("year {year}");
            };
            event.ts = Utc.from_utc_datetime(&date.and_hms_opt(0, 0, 0).unwrap_or_default());
            assert_eq!(Line::encode(&event).is_ok(), parses(&event), "year {year}");
        }
    }

    /// The line a batch keeps is the event's line, its seq the one assigned.
    #[test]
    fn a_batch_keeps_each_line_with_its_assigned_seq() {
        let mut event = started(nested(3));
        event.seq = 7;
        let mut batch = Batch::check(vec![event.clone(), event.clone()])
            .unwrap()
            .unwrap();
        batch.assign_seq(99);
        for (event, line) in batch.events().iter().zip(batch.lines()) {
            assert_eq!(line.as_str(), event.to_json());
            assert_eq!(Event::from_json(line.as_str()).unwrap(), *event);
        }
        assert_eq!(batch.events()[1].seq, 101);
        assert!(matches!(Batch::check(Vec::<Event>::new()), Ok(Err(empty)) if empty.is_empty()));
    }

    /// Every event of the reference journals (written by the Python reference) is encoded to
    /// its serialized line, which reads back to the same event.
    #[test]
    fn every_event_of_the_reference_journals_reads_back_as_encoded() {
        for name in [
            "approval-granted",
            "approval-rejected",
            "plain-run",
            "policies-terminal-role",
            "session-two-runs",
        ] {
            let path = format!("reference/journals/{name}.jsonl");
            let Some(text) = loom_testkit::shared::text(&path) else {
                return;
            };
            for (n, line) in text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
            {
                let event = Event::from_json(line).unwrap_or_else(|e| panic!("{path}:{n}: {e}"));
                let encoded = Line::encode(&event).unwrap_or_else(|e| panic!("{path}:{n}: {e}"));
                assert_eq!(encoded.as_str(), event.to_json(), "{path}:{}", n + 1);
                let back = Event::from_json(encoded.as_str());
                assert_eq!(back.ok().as_ref(), Some(&event), "{path}:{}", n + 1);
            }
        }
    }
}
