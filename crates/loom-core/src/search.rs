//! The reads of a tenant's journal that a store may answer from its indexes: the event search
//! ([`EventFilter`], with [`EventFilter::matches`], the one definition of which events pass it,
//! answered through [`EventStore::search`](crate::ports::EventStore::search)) and the most
//! recently written sessions ([`RecentSessions`], through
//! [`EventStore::recent_sessions`](crate::ports::EventStore::recent_sessions)). A store that
//! cannot answers `None`, and the caller scans the sessions with the same rules.

use chrono::{DateTime, Utc};

use crate::{
    event::{Category, Event, EventStatus},
    ports::SessionSummary,
};

/// Which events of one tenant's journal a search returns: every filter that is set must match,
/// a list matches when the event has one of its values.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventFilter {
    /// The tenant.
    pub tenant_id: String,
    /// Only this session.
    pub session_id: Option<String>,
    /// Only the events of this run (not of its sub-runs).
    pub run_id: Option<String>,
    /// Event types; empty: any.
    pub types: Vec<String>,
    /// Categories; empty: any.
    pub categories: Vec<Category>,
    /// Statuses; empty: any.
    pub statuses: Vec<EventStatus>,
    /// The envelope's agent.
    pub agent: Option<String>,
    /// Only the events of one of these agents; `None`: any.
    pub agents: Option<Vec<String>>,
    /// The envelope's role.
    pub role: Option<String>,
    /// Facets that must hold these string values (`tool_name`, `model_id`, `model`).
    pub facets: Vec<(String, String)>,
    /// Only events written at or after this instant.
    pub since: Option<DateTime<Utc>>,
    /// Only events written before this instant.
    pub until: Option<DateTime<Utc>>,
    /// Only events after this one (an `event_id`), in the order of the result.
    pub after: Option<String>,
    /// Most events returned.
    pub limit: usize,
}

impl EventFilter {
    /// Whether `event` passes every filter but `after` and `limit`.
    pub fn matches(&self, event: &Event) -> bool {
        self.session_id
            .as_ref()
            .is_none_or(|s| event.session_id == *s)
            && self.run_id.as_ref().is_none_or(|r| event.run_id == *r)
            && (self.types.is_empty() || self.types.contains(&event.event_type))
            && (self.categories.is_empty() || self.categories.contains(&event.category))
            && (self.statuses.is_empty() || self.statuses.contains(&event.status))
            && self
                .agent
                .as_ref()
                .is_none_or(|a| event.agent.as_deref() == Some(a))
            && self.agents.as_ref().is_none_or(|allowed| {
                event
                    .agent
                    .as_ref()
                    .is_some_and(|agent| allowed.contains(agent))
            })
            && self
                .role
                .as_ref()
                .is_none_or(|r| event.role.as_deref() == Some(r))
            && self.facets.iter().all(|(name, wanted)| {
                event.facets.get(name).and_then(|v| v.as_str()) == Some(wanted.as_str())
            })
            && self.since.is_none_or(|since| event.ts >= since)
            && self.until.is_none_or(|until| event.ts < until)
    }
}

/// What a store found for an [`EventFilter`]: the events in write order (at most `limit`), or
/// that `after` names no event of the journal searched.
#[derive(Debug, Clone, PartialEq)]
pub enum Searched {
    /// The events, in the store's write order.
    Found(Vec<Event>),
    /// `after` names no event of the tenant's journal (of `session_id` when given).
    UnknownAfter,
}

/// The most recently written sessions of a tenant, as
/// [`EventStore::recent_sessions`](crate::ports::EventStore::recent_sessions) answers.
#[derive(Debug, Clone, PartialEq)]
pub struct RecentSessions {
    /// The sessions, most recent first (as [`EventStore::sessions`] orders them), at most the
    /// limit asked.
    ///
    /// [`EventStore::sessions`]: crate::ports::EventStore::sessions
    pub sessions: Vec<SessionSummary>,
    /// Whether more sessions passed the filter beyond the limit.
    pub more: bool,
}
