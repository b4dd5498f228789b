//! Recovering a session whose journal holds an unreadable line (bit rot, a hand edit, a line
//! written before the journal refused what would not read back): exporting the events that
//! read back ([`Loom::export_valid`], `loom sessions export --valid-only`), and setting the
//! unreadable lines aside ([`Loom::repair_session`], `loom sessions repair`): each line's bytes
//! are kept (in `<session>.jsonl.corrupt`, or the SQLite table `set_aside`) and a
//! `session.repaired` event takes its place at its seq, so the journal reads again and records
//! what was set aside, when, why and by whom.

use chrono::Utc;
use loom_core::{
    Event,
    event::{Envelope, Payload, SessionRepaired},
    ids::is_safe_id,
    ports::{SetAside, UnreadableLine},
};
use serde::{Deserialize, Serialize};

use crate::{DEFAULT_TENANT, Loom, LoomError};

/// An unreadable line of a journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BadLine {
    /// Its line number from 1 (the row's seq in SQLite), which is also its seq.
    pub line: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// Why it cannot be read.
    pub error: String,
    /// The run its envelope names, when that can be made out.
    pub run_id: Option<String>,
}

impl From<&UnreadableLine> for BadLine {
    fn from(line: &UnreadableLine) -> BadLine {
        BadLine {
            line: line.line,
            bytes: line.bytes.len() as u64,
            error: line.error.to_string(),
            run_id: line.run_id.clone(),
        }
    }
}

/// The events of a session that read back ([`Loom::export_valid`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ValidExport {
    /// The journal (its file).
    pub journal: String,
    /// The events that read back, one compact JSON line each, in seq order.
    pub jsonl: String,
    /// How many events that is.
    pub events: usize,
    /// The lines left out.
    pub skipped: Vec<BadLine>,
}

/// What [`Loom::repair_session`] set aside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SessionRepair {
    /// The session.
    pub session_id: String,
    /// The journal (its file).
    pub journal: String,
    /// The lines set aside, each replaced by a `session.repaired` event at its seq (empty: the
    /// journal read back whole, nothing was written).
    pub set_aside: Vec<BadLine>,
    /// Where their bytes are kept.
    pub moved_to: String,
}

impl Loom {
    /// The events of a session that read back, as JSONL, and the lines that do not (what
    /// `loom sessions export --valid-only` writes): a corrupted session's valid part.
    /// [`LoomError::UnknownSession`] when the journal holds nothing.
    pub async fn export_valid(
        &self,
        session: &str,
        tenant: Option<&str>,
    ) -> Result<ValidExport, LoomError> {
        let tenant = tenant.unwrap_or(DEFAULT_TENANT);
        if !is_safe_id(session) {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        let salvage = self.event_store().salvage(tenant, session).await?;
        if salvage.events.is_empty() && salvage.unreadable.is_empty() {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        let mut jsonl = String::new();
        for event in &salvage.events {
            jsonl.push_str(&event.to_json());
            jsonl.push('\n');
        }
        Ok(ValidExport {
            journal: salvage.path,
            jsonl,
            events: salvage.events.len(),
            skipped: salvage.unreadable.iter().map(BadLine::from).collect(),
        })
    }

    /// Sets a session's unreadable lines aside (what `loom sessions repair` does): each line's
    /// bytes are kept where the journal says ([`SessionRepair::moved_to`]), and a
    /// `session.repaired` event (naming the size, the reason and `by`) is written at its seq,
    /// all or nothing. The journal then reads back; a run whose `run.started` was set aside is
    /// gone (its other events remain, and are listed under no run). A session without
    /// unreadable line is left as it is. [`LoomError::UnknownSession`] when the journal holds
    /// nothing; [`LoomError::Invalid`] when `by` is over its bound.
    pub async fn repair_session(
        &self,
        session: &str,
        tenant: Option<&str>,
        by: Option<&str>,
    ) -> Result<SessionRepair, LoomError> {
        crate::limits::check_by(by)?;
        let tenant = tenant.unwrap_or(DEFAULT_TENANT);
        if !is_safe_id(session) {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        let store = self.event_store();
        let salvage = store.salvage(tenant, session).await?;
        if salvage.events.is_empty() && salvage.unreadable.is_empty() {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        let lines: Vec<SetAside> = salvage
            .unreadable
            .iter()
            .map(|line| SetAside {
                line: line.line,
                bytes: line.bytes.clone(),
                replacement: repaired(tenant, session, line, &salvage.aside, by),
            })
            .collect();
        store.set_aside(tenant, session, lines).await?;
        Ok(SessionRepair {
            session_id: session.to_owned(),
            journal: salvage.path,
            set_aside: salvage.unreadable.iter().map(BadLine::from).collect(),
            moved_to: salvage.aside,
        })
    }
}

/// The `session.repaired` event taking `line`'s place: in the run the line names (so that run's
/// events show what happened to it), else in the session's name.
fn repaired(
    tenant: &str,
    session: &str,
    line: &UnreadableLine,
    moved_to: &str,
    by: Option<&str>,
) -> Event {
    let run = line.run_id.clone().unwrap_or_else(|| session.to_owned());
    let mut event = Event::new(
        Envelope {
            event_id: uuid::Uuid::now_v7().to_string(),
            ts: Utc::now(),
            tenant_id: tenant.to_owned(),
            session_id: session.to_owned(),
            run_id: run.clone(),
            root_run_id: run,
            span_id: uuid::Uuid::now_v7().to_string(),
            parent_span_id: None,
            agent: None,
            role: None,
        },
        Payload::SessionRepaired(SessionRepaired {
            bytes: line.bytes.len() as u64,
            error: line.error.to_string(),
            moved_to: moved_to.to_owned(),
            by: by.map(str::to_owned),
        }),
    );
    event.seq = line.line;
    event
}
