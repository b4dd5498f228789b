//! The event bus port: news of journal writes, and control signals, between the processes of one
//! service (`storage.bus`).
//!
//! The bus carries no event: a [`Signal::Appended`] says which seqs of which session were
//! written, and a follower reads them from the journal, from where it stands. A lost or late
//! signal therefore loses nothing (followers still read the journal on a slow period); a signal
//! only makes them read sooner. [`Signal::Cancel`] asks the process that drives a run to cancel
//! it now.

use std::{fmt, sync::Arc};

use serde::{Deserialize, Serialize};

use crate::{BoxFuture, BoxStream};

/// News that events were appended to a session's journal.
///
/// Its names are shared (`Arc<str>`): a notice is cloned by every hand it passes (the
/// in-process bus keeps one copy and gives each subscriber another), once per append.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Notice {
    /// The tenant.
    pub tenant_id: Arc<str>,
    /// The session.
    pub session_id: Arc<str>,
    /// The seq of the first event of the append.
    pub first_seq: u64,
    /// The seq of the last event of the append.
    pub last_seq: u64,
}

/// What travels on the bus.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "signal", rename_all = "snake_case")]
pub enum Signal {
    /// Events were appended.
    Appended(Notice),
    /// Cancel a run: the process that drives it cancels it at once (the others ignore it).
    Cancel {
        /// The tenant.
        tenant_id: String,
        /// The session.
        session_id: String,
        /// The run.
        run_id: String,
        /// Who asked, journaled as `run.cancelled.by`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
}

impl Signal {
    /// The tenant the signal is about.
    pub fn tenant_id(&self) -> &str {
        match self {
            Signal::Appended(notice) => &notice.tenant_id,
            Signal::Cancel { tenant_id, .. } => tenant_id,
        }
    }

    /// The session the signal is about.
    pub fn session_id(&self) -> &str {
        match self {
            Signal::Appended(notice) => &notice.session_id,
            Signal::Cancel { session_id, .. } => session_id,
        }
    }
}

/// Why a bus operation failed, classified by kind.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// The bus cannot be reached, or its connection was lost: retry later.
    #[error("event bus unavailable: {0}")]
    Unavailable(String),
    /// A signal too large for the bus, or refused by it.
    #[error("event bus refused: {0}")]
    Refused(String),
}

/// The signals a subscriber receives, as [`EventBus::subscribe`] streams them.
pub type Signals = BoxStream<'static, Result<Signal, BusError>>;

/// The event bus port: every subscriber of every process receives what any publisher publishes
/// after the subscription was made (at most once; nothing is kept for a subscriber that was not
/// there).
pub trait EventBus: Send + Sync + fmt::Debug {
    /// Publishes a signal to every subscriber.
    fn publish<'a>(&'a self, signal: &'a Signal) -> BoxFuture<'a, Result<(), BusError>>;

    /// Subscribes: the stream yields every signal published from now on, and ends (after an
    /// error item) when the connection is lost; subscribe again, then read the journal to catch
    /// up what was missed meanwhile. A signal that cannot be read is skipped with a warning.
    fn subscribe(&self) -> BoxFuture<'_, Result<Signals, BusError>>;

    /// Whether the bus answers (the readiness check).
    fn ping(&self) -> BoxFuture<'_, Result<(), BusError>>;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn signals_read_back() {
        let appended = Signal::Appended(Notice {
            tenant_id: "acme".into(),
            session_id: "s1".into(),
            first_seq: 3,
            last_seq: 5,
        });
        let text = serde_json::to_string(&appended).unwrap();
        assert_eq!(
            text,
            r#"{"signal":"appended","tenant_id":"acme","session_id":"s1","first_seq":3,"last_seq":5}"#
        );
        assert_eq!(serde_json::from_str::<Signal>(&text).unwrap(), appended);
        let cancel = Signal::Cancel {
            tenant_id: "acme".into(),
            session_id: "s1".into(),
            run_id: "r1".into(),
            by: Some("ops".into()),
        };
        let text = serde_json::to_string(&cancel).unwrap();
        assert_eq!(serde_json::from_str::<Signal>(&text).unwrap(), cancel);
        assert_eq!(cancel.session_id(), "s1");
    }
}
