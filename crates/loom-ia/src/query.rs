//! Reading a tenant's journal across its sessions: its runs, most recent first
//! ([`Loom::runs`]), and the event search ([`Loom::query`]).
//!
//! Both read the tenant's sessions through the `EventStore` port (`sessions`, then `read`), as
//! the reference does for its file journals: a session last written before `since` is not
//! read, and the run listing reads each session from its end only as far back as the runs it
//! lists (`read(after_seq)`, in stretches that grow fourfold), so listing the recent runs of a
//! long session does not read its history. Both first ask the store: a store with indexes
//! (PostgreSQL, SQLite) answers the event search (`EventStore::search`, in its write order: the
//! order of its appends) and names the most recent sessions (`EventStore::recent_sessions`)
//! from its indexes; the scan runs only when the store cannot (memory, JSONL) or declines (a
//! row that does not read back). The scan's write order interleaves sessions by the timestamp
//! of their next event, which is the order of the appends when timestamps follow the writes. A
//! search of one run (`run_id`, without `after`) on the other stores reads only that run's
//! session, from the run's start (the run index: `find_run`, `run_start`), and falls back to
//! the scan when the index does not know it. A session whose
//! journal is corrupted is left out with a `tracing` warning naming its file and line (never
//! silently, and never failing the whole query); a run that cannot be folded is left out of
//! the run list the same way. A search restricted to one session (`session_id`) reports that
//! session's corruption as an error.

use std::{cmp::Reverse, collections::BinaryHeap};

use chrono::{DateTime, Utc};
use loom_core::{
    Category, Event, EventStatus, RunStatus, Usage,
    ids::is_safe_id,
    ports::{EventStore, StoreError},
    search::{EventFilter, Searched},
};
use serde::{Deserialize, Serialize};

use crate::{DEFAULT_TENANT, Loom, LoomError};

/// Most runs [`Loom::runs`] returns.
pub const MAX_RUNS: usize = 200;
/// Runs returned when the query does not say.
pub const DEFAULT_RUNS: usize = 50;
/// Most sessions [`Loom::runs`] reads.
pub const MAX_SESSIONS: usize = 200;
/// Sessions read when the query does not say.
pub const DEFAULT_SESSIONS: usize = 50;
/// Most events [`Loom::query`] returns.
pub const MAX_EVENTS: usize = 10_000;
/// Events returned when the query does not say.
pub const DEFAULT_EVENTS: usize = 100;

/// Every event type of the reference catalogue (31 types) and Loom's own `session.repaired`,
/// the values `EventQuery::types` accepts; the types this build does not write yet simply
/// match nothing.
pub const EVENT_TYPES: &[&str] = &[
    "run.started",
    "step.started",
    "step.completed",
    "run.transitioned",
    "run.completed",
    "run.failed",
    "run.cancelled",
    "run.claimed",
    "message.user",
    "model.responded",
    "model.retried",
    "model.exchanged",
    "model.fell_back",
    "circuit.opened",
    "tool.called",
    "tool.completed",
    "tool.source_unavailable",
    "tool.source_opened",
    "policy.decided",
    "guard.checked",
    "judge.evaluated",
    "budget.exceeded",
    "approval.requested",
    "approval.granted",
    "approval.rejected",
    "approval.expired",
    "idempotency.recorded",
    "idempotency.reused",
    "artifact.stored",
    "session.snapshot",
    "session.compacted",
    "session.trimmed",
    "session.repaired",
];

/// Which runs [`Loom::runs`] lists.
#[derive(Debug, Clone, PartialEq)]
pub struct RunQuery {
    /// Tenant (default `default`).
    pub tenant_id: Option<String>,
    /// Only the runs of this agent.
    pub agent: Option<String>,
    /// Only the runs of one of these agents (an API key limited to some agents); `None`: any.
    pub agents: Option<Vec<String>>,
    /// Only runs in one of these states; empty: any.
    pub statuses: Vec<RunStatus>,
    /// Only runs started at or after this instant.
    pub since: Option<DateTime<Utc>>,
    /// Only runs started before this instant.
    pub until: Option<DateTime<Utc>>,
    /// Most runs returned, 1 to [`MAX_RUNS`].
    pub limit: usize,
    /// Most recent sessions read, 1 to [`MAX_SESSIONS`].
    pub sessions: usize,
}

impl Default for RunQuery {
    fn default() -> RunQuery {
        RunQuery {
            tenant_id: None,
            agent: None,
            agents: None,
            statuses: Vec::new(),
            since: None,
            until: None,
            limit: DEFAULT_RUNS,
            sessions: DEFAULT_SESSIONS,
        }
    }
}

/// One run of a [`RunPage`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunListed {
    /// Run.
    pub run_id: String,
    /// Its session.
    pub session_id: String,
    /// Its agent.
    pub agent: String,
    /// Its current state.
    pub status: RunStatus,
    /// The run that opened it (sub-agent runs).
    pub parent_run_id: Option<String>,
    /// The root of its run tree.
    pub root_run_id: String,
    /// Depth in the run tree (0 for a root run).
    pub depth: u32,
    /// When `run.started` was written.
    #[serde(with = "crate::query::rfc3339")]
    #[schemars(with = "DateTime<Utc>")]
    pub started_at: DateTime<Utc>,
    /// When its last event was written.
    #[serde(with = "crate::query::rfc3339")]
    #[schemars(with = "DateTime<Utc>")]
    pub updated_at: DateTime<Utc>,
    /// Orchestrator model calls.
    pub iterations: u32,
    /// Tokens of every model call of the run.
    pub usage: Usage,
    /// Cost in dollars.
    pub cost_usd: f64,
}

/// What [`Loom::runs`] found: `runs` most recent first (by start), how many sessions were
/// read, and whether there was more to see (more matching runs than `limit`, or sessions left
/// unread beyond `sessions`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunPage {
    /// The runs, most recent first.
    pub runs: Vec<RunListed>,
    /// Sessions read.
    pub scanned: usize,
    /// Whether runs were left out (`limit` reached, or sessions not read).
    pub truncated: bool,
}

/// Which events [`Loom::query`] returns. Every filter that is set must match; a list matches
/// when the event has one of its values.
#[derive(Debug, Clone, PartialEq)]
pub struct EventQuery {
    /// Tenant (default `default`).
    pub tenant_id: Option<String>,
    /// Only this session (otherwise every session of the tenant).
    pub session_id: Option<String>,
    /// Only the events of this run (not of its sub-runs).
    pub run_id: Option<String>,
    /// Event types (`tool.called`, …, see [`EVENT_TYPES`]); empty: any.
    pub types: Vec<String>,
    /// Categories; empty: any.
    pub categories: Vec<Category>,
    /// Statuses; empty: any.
    pub statuses: Vec<EventStatus>,
    /// The envelope's agent.
    pub agent: Option<String>,
    /// Only the events of one of these agents (an API key limited to some agents); `None`: any.
    pub agents: Option<Vec<String>>,
    /// The envelope's role (`main`, a role name, `judge:<name>`).
    pub role: Option<String>,
    /// The `tool_name` facet (tool, approval and idempotency events).
    pub tool_name: Option<String>,
    /// The `model_id` facet: the provider's model name.
    pub model_id: Option<String>,
    /// The `model` facet: the configuration's model id.
    pub model: Option<String>,
    /// Only events written at or after this instant.
    pub since: Option<DateTime<Utc>>,
    /// Only events written before this instant.
    pub until: Option<DateTime<Utc>>,
    /// Only events after this one (an `event_id`), in the order of the result.
    pub after: Option<String>,
    /// Most events returned, 1 to [`MAX_EVENTS`].
    pub limit: usize,
}

impl Default for EventQuery {
    fn default() -> EventQuery {
        EventQuery {
            tenant_id: None,
            session_id: None,
            run_id: None,
            types: Vec::new(),
            categories: Vec::new(),
            statuses: Vec::new(),
            agent: None,
            agents: None,
            role: None,
            tool_name: None,
            model_id: None,
            model: None,
            since: None,
            until: None,
            after: None,
            limit: DEFAULT_EVENTS,
        }
    }
}

impl EventQuery {
    /// Refuses values out of range or unknown, naming the field.
    fn check(&self) -> Result<(), LoomError> {
        check_limit("limit", self.limit, MAX_EVENTS)?;
        if let Some(session) = &self.session_id
            && !is_safe_id(session)
        {
            return Err(invalid(
                "session_id",
                format!("'{session}' is not a usable session id"),
            ));
        }
        if let Some(unknown) = self
            .types
            .iter()
            .find(|t| !EVENT_TYPES.contains(&t.as_str()))
        {
            return Err(invalid(
                "type",
                format!(
                    "unknown event type '{unknown}' (types: {})",
                    EVENT_TYPES.join(", ")
                ),
            ));
        }
        check_window(self.since, self.until)
    }

    /// The query as the store's search takes it (`loom_core::search::EventFilter`), for
    /// `tenant`: the one definition of which events match, shared by the scan below and a
    /// store answering from its indexes.
    fn filter(&self, tenant: &str) -> EventFilter {
        let facets = [
            ("tool_name", &self.tool_name),
            ("model_id", &self.model_id),
            ("model", &self.model),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.clone().map(|value| (name.to_owned(), value)))
        .collect();
        EventFilter {
            tenant_id: tenant.to_owned(),
            session_id: self.session_id.clone(),
            run_id: self.run_id.clone(),
            types: self.types.clone(),
            categories: self.categories.clone(),
            statuses: self.statuses.clone(),
            agent: self.agent.clone(),
            agents: self.agents.clone(),
            role: self.role.clone(),
            facets,
            since: self.since,
            until: self.until,
            after: self.after.clone(),
            limit: self.limit,
        }
    }
}

/// A refused query value: [`LoomError::InvalidQuery`] naming `parameter`.
pub(crate) fn invalid(parameter: &str, reason: impl Into<String>) -> LoomError {
    LoomError::InvalidQuery {
        parameter: parameter.to_owned(),
        reason: reason.into(),
    }
}

fn check_limit(parameter: &'static str, value: usize, max: usize) -> Result<(), LoomError> {
    if value == 0 || value > max {
        return Err(invalid(
            parameter,
            format!("must be between 1 and {max} (got {value})"),
        ));
    }
    Ok(())
}

fn check_window(
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
) -> Result<(), LoomError> {
    if let (Some(since), Some(until)) = (since, until)
        && until < since
    {
        return Err(invalid("until", "is before since"));
    }
    Ok(())
}

/// Every run state, as [`RunQuery::statuses`] values are written (`completed`, …).
pub const RUN_STATUSES: [RunStatus; 8] = [
    RunStatus::ReadyForModel,
    RunStatus::AwaitingTools,
    RunStatus::WaitingChild,
    RunStatus::Paused,
    RunStatus::Finalizing,
    RunStatus::Completed,
    RunStatus::Failed,
    RunStatus::Cancelled,
];

/// A run state written as text (`completed`), for the read queries of access paths (MCP
/// resource URIs); refused naming `parameter` and the states.
pub fn parse_run_status(parameter: &str, text: &str) -> Result<RunStatus, LoomError> {
    RUN_STATUSES
        .into_iter()
        .find(|status| status.as_str() == text)
        .ok_or_else(|| {
            let names: Vec<&str> = RUN_STATUSES.iter().map(|s| s.as_str()).collect();
            invalid(
                parameter,
                format!("unknown value '{text}' (expected: {})", names.join(", ")),
            )
        })
}

/// An instant written as text: RFC 3339 (`2026-05-01T12:00:00Z`) or a date (`2026-05-01`: its
/// first instant, UTC), as the read routes take `since` and `until`; refused naming
/// `parameter`.
pub fn parse_instant(parameter: &str, text: &str) -> Result<DateTime<Utc>, LoomError> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .map(|date| date.and_time(chrono::NaiveTime::MIN).and_utc())
        .map_err(|_| {
            invalid(
                parameter,
                format!("'{text}' is neither an RFC 3339 instant nor a YYYY-MM-DD date"),
            )
        })
}

/// The runs of one session's journal, as listed (a run that cannot be folded is left out with
/// a warning).
fn listed(session: &str, events: &[Event]) -> Vec<RunListed> {
    crate::journals::listed_states(session, events)
        .into_iter()
        .map(|state| RunListed {
            run_id: state.run_id,
            session_id: state.session_id,
            agent: state.agent.unwrap_or_default(),
            status: state.status,
            parent_run_id: state.parent_run_id,
            root_run_id: state.root_run_id,
            depth: state.depth,
            started_at: state.started_at,
            updated_at: state.updated_at,
            iterations: state.iterations,
            usage: state.usage,
            cost_usd: state.cost_usd,
        })
        .collect()
}

impl RunQuery {
    /// Whether `run` passes the filters.
    fn keeps(&self, run: &RunListed) -> bool {
        self.agent.as_ref().is_none_or(|a| run.agent == *a)
            && self
                .agents
                .as_ref()
                .is_none_or(|allowed| allowed.contains(&run.agent))
            && (self.statuses.is_empty() || self.statuses.contains(&run.status))
            && self.since.is_none_or(|since| run.started_at >= since)
            && self.until.is_none_or(|until| run.started_at < until)
    }
}

/// Events read back from a session's end at first, for each run the listing wants.
const EVENTS_PER_RUN: u64 = 64;

/// What [`recent_runs`] found in one session.
struct RecentRuns {
    /// The matching runs of the stretch read.
    runs: Vec<RunListed>,
    /// Whether runs started before that stretch were left unread.
    earlier: bool,
}

/// The runs of `session` that pass `query`'s filters, read from the session's end in stretches
/// that grow fourfold until they hold `query.limit` matching runs, reach a run started before
/// `query.since`, or reach the session's start: a listing of a long session reads the end it
/// lists (each backend seeks to `after_seq`: JSONL through its offset index, the databases by
/// seq), not the whole history. A run is listed when its `run.started` is in the stretch, so
/// every run listed is folded from all its events. `None` when the session cannot be read (see
/// [`crate::journals::read_listed`]).
async fn recent_runs(
    store: &dyn EventStore,
    tenant: &str,
    session: &str,
    query: &RunQuery,
) -> Result<Option<RecentRuns>, LoomError> {
    let last = store.last_seq(tenant, session).await?;
    let mut span = (query.limit as u64).saturating_mul(EVENTS_PER_RUN);
    loop {
        let after = last.saturating_sub(span);
        let Some(events) =
            crate::journals::read_listed_after(store, tenant, session, after).await?
        else {
            return Ok(None);
        };
        let runs: Vec<RunListed> = listed(session, &events)
            .into_iter()
            .filter(|run| query.keeps(run))
            .collect();
        // Runs start in time order: one started before `since` means none earlier can match.
        let past_since = query.since.is_some_and(|since| {
            events
                .iter()
                .find(|e| e.event_type == "run.started")
                .is_some_and(|first| first.ts < since)
        });
        if after == 0 || past_since || runs.len() >= query.limit {
            let earlier = after > 0
                && !past_since
                && match store
                    .last_of_type(tenant, session, "run.started", after + 1)
                    .await
                {
                    Ok(found) => found.is_some(),
                    // The unread start cannot be read: what it holds is left out all the same.
                    Err(StoreError::Corrupted { .. } | StoreError::MissingKey { .. }) => true,
                    Err(other) => return Err(other.into()),
                };
            return Ok(Some(RecentRuns { runs, earlier }));
        }
        span = span.saturating_mul(4);
    }
}

impl Loom {
    /// The runs of a tenant, most recent first: the runs (sub-runs included) of its
    /// `query.sessions` most recently written sessions that pass the filters, at most
    /// `query.limit`. Refused ([`LoomError::InvalidQuery`]) when `limit` or `sessions` is out
    /// of range or `until` is before `since`.
    pub async fn runs(&self, query: &RunQuery) -> Result<RunPage, LoomError> {
        check_limit("limit", query.limit, MAX_RUNS)?;
        check_limit("sessions", query.sessions, MAX_SESSIONS)?;
        check_window(query.since, query.until)?;
        let tenant = query.tenant_id.as_deref().unwrap_or(DEFAULT_TENANT);
        let store = self.event_store();
        // A session last written before `since` holds no run started after it. A store with an
        // index of its sessions (PostgreSQL, SQLite) gives the most recent ones itself.
        let (sessions, unread) = match store
            .recent_sessions(tenant, query.since, query.sessions)
            .await?
        {
            Some(recent) => (recent.sessions, recent.more),
            None => {
                let mut sessions = store.sessions(tenant).await?;
                if let Some(since) = query.since {
                    sessions.retain(|s| s.updated_at.is_none_or(|at| at >= since));
                }
                let unread = sessions.len() > query.sessions;
                sessions.truncate(query.sessions);
                (sessions, unread)
            }
        };
        let mut runs = Vec::new();
        let mut earlier = false;
        for session in &sessions {
            let Some(recent) =
                recent_runs(store.as_ref(), tenant, &session.session_id, query).await?
            else {
                continue;
            };
            runs.extend(recent.runs);
            earlier |= recent.earlier;
        }
        runs.sort_by(|a, b| {
            b.started_at
                .cmp(&a.started_at)
                .then_with(|| b.run_id.cmp(&a.run_id))
        });
        let truncated = unread || earlier || runs.len() > query.limit;
        runs.truncate(query.limit);
        Ok(RunPage {
            runs,
            scanned: sessions.len(),
            truncated,
        })
    }

    /// Searches a tenant's journal: the events that pass every filter of `query`, in write
    /// order, at most `query.limit`.
    ///
    /// Write order is each session's journal order (by seq); events of different sessions are
    /// interleaved by time (`ts`, then `event_id`), so a session's events never change order.
    /// `after` names an event of the tenant's journal (of `session_id` when given): only the
    /// events after it in that order are returned, which pages through a search with the last
    /// `event_id` of the previous page.
    ///
    /// Refused ([`LoomError::InvalidQuery`]) when `limit` is out of range, a type is not an
    /// event type, `session_id` is not a usable id, `until` is before `since`, or `after` names
    /// no event of the journal searched.
    pub async fn query(&self, query: &EventQuery) -> Result<Vec<Event>, LoomError> {
        query.check()?;
        let tenant = query.tenant_id.as_deref().unwrap_or(DEFAULT_TENANT);
        let store = self.event_store();
        let filter = query.filter(tenant);
        // A store that answers from its indexes (PostgreSQL, SQLite) is asked first.
        match store.search(&filter).await? {
            Some(Searched::Found(events)) => return Ok(events),
            Some(Searched::UnknownAfter) => return Err(unknown_after(query)),
            None => {}
        }
        // One run's events, with no cursor to find before it: its session only (the run index
        // names it), from the run's start.
        if let (Some(run), None) = (&query.run_id, &query.after)
            && let Some(journal) = self
                .run_journal(tenant, query.session_id.as_deref(), run)
                .await?
        {
            return Ok(journal
                .into_iter()
                .filter(|event| filter.matches(event))
                .take(query.limit)
                .collect());
        }
        let session_ids: Vec<String> = match &query.session_id {
            Some(session) => vec![session.clone()],
            None => {
                let mut sessions = store.sessions(tenant).await?;
                // Without a cursor, a session last written before `since` cannot match.
                if let (Some(since), None) = (query.since, &query.after) {
                    sessions.retain(|s| s.updated_at.is_none_or(|at| at >= since));
                }
                sessions.into_iter().map(|s| s.session_id).collect()
            }
        };
        let mut journals = Vec::with_capacity(session_ids.len());
        match &query.session_id {
            // The session asked for: a journal that cannot be read says where.
            Some(session) => journals.push(store.read(tenant, session, 0).await?),
            None => {
                for session in &session_ids {
                    if let Some(events) =
                        crate::journals::read_listed(store.as_ref(), tenant, session).await?
                    {
                        journals.push(events);
                    }
                }
            }
        }
        let mut found = Vec::new();
        let mut passed = query.after.is_none();
        for event in merged(journals) {
            if !passed {
                passed = query.after.as_deref() == Some(event.event_id.as_str());
                continue;
            }
            if filter.matches(&event) {
                found.push(event);
                if found.len() == query.limit {
                    break;
                }
            }
        }
        if !passed {
            return Err(unknown_after(query));
        }
        Ok(found)
    }
}

impl Loom {
    /// The journal of `run`'s session from the run's start, when the run index knows its
    /// session (`session` when given) and where it starts: `None` otherwise (the caller then
    /// scans). The session given must read (its corruption is an error, as before); one found
    /// through the index that does not is left out with a warning, as a scan would.
    async fn run_journal(
        &self,
        tenant: &str,
        session: Option<&str>,
        run: &str,
    ) -> Result<Option<Vec<Event>>, LoomError> {
        let store = self.event_store();
        let given = session.is_some();
        let session = match session {
            Some(session) => session.to_owned(),
            None => match store.find_run(tenant, run).await? {
                Some(session) => session,
                None => return Ok(None),
            },
        };
        let Some(start) = store.run_start(tenant, &session, run).await? else {
            return Ok(None);
        };
        let from = start.saturating_sub(1);
        match store.read(tenant, &session, from).await {
            Ok(events) => Ok(Some(events)),
            Err(error @ loom_core::ports::StoreError::Corrupted { .. }) if !given => {
                tracing::warn!(
                    tenant,
                    session,
                    %error,
                    "session skipped: its journal is corrupted (loom sessions repair)"
                );
                Ok(Some(Vec::new()))
            }
            Err(error) => Err(error.into()),
        }
    }
}

/// The refusal of an `after` that names no event of the journal searched.
fn unknown_after(query: &EventQuery) -> LoomError {
    invalid(
        "after",
        format!(
            "no event '{}' in the journal searched",
            query.after.as_deref().unwrap_or_default()
        ),
    )
}

/// The events of several journals in write order: each journal's order kept, journals
/// interleaved by `(ts, event_id)` of their next event.
fn merged(journals: Vec<Vec<Event>>) -> impl Iterator<Item = Event> {
    let mut cursors: Vec<std::vec::IntoIter<Event>> =
        journals.into_iter().map(Vec::into_iter).collect();
    let mut heads: Vec<Option<Event>> = cursors.iter_mut().map(Iterator::next).collect();
    let mut heap: BinaryHeap<Reverse<(DateTime<Utc>, String, usize)>> = heads
        .iter()
        .enumerate()
        .filter_map(|(i, e)| e.as_ref().map(|e| Reverse((e.ts, e.event_id.clone(), i))))
        .collect();
    std::iter::from_fn(move || {
        let Reverse((_, _, index)) = heap.pop()?;
        let event = heads[index].take()?;
        heads[index] = cursors[index].next();
        if let Some(next) = &heads[index] {
            heap.push(Reverse((next.ts, next.event_id.clone(), index)));
        }
        Some(event)
    })
}

/// RFC 3339 instants with microseconds, as the journal writes `ts`.
pub(crate) mod rfc3339 {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `ts` as RFC 3339 UTC with microseconds.
    pub(crate) fn serialize<S: Serializer>(ts: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&ts.to_rfc3339_opts(SecondsFormat::Micros, true))
    }

    /// Reads an RFC 3339 instant.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text)
            .map(|t| t.with_timezone(&Utc))
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use loom_core::event::{Envelope, Payload, RunClaimed};

    use super::*;

    fn event(session: &str, seq: u64, ts_micros: i64, id: &str) -> Event {
        let ts = DateTime::from_timestamp_micros(ts_micros).unwrap();
        let mut event = Event::new(
            Envelope {
                event_id: id.into(),
                ts,
                tenant_id: "t".into(),
                session_id: session.into(),
                run_id: session.into(),
                root_run_id: session.into(),
                span_id: "s".into(),
                parent_span_id: None,
                agent: None,
                role: None,
            },
            Payload::RunClaimed(RunClaimed {
                worker_id: "w".into(),
                lease_until: ts,
            }),
        );
        event.seq = seq;
        event
    }

    #[test]
    fn texts_of_run_queries_are_read_or_refused_naming_the_parameter() {
        assert_eq!(
            parse_run_status("status", "waiting_child").unwrap(),
            RunStatus::WaitingChild
        );
        assert_eq!(
            parse_run_status("status", "done").unwrap_err().to_string(),
            "status: unknown value 'done' (expected: ready_for_model, awaiting_tools, \
             waiting_child, paused, finalizing, completed, failed, cancelled)"
        );
        assert_eq!(
            parse_instant("since", "2026-05-01").unwrap().to_rfc3339(),
            "2026-05-01T00:00:00+00:00"
        );
        assert_eq!(
            parse_instant("until", "2026-05-01T12:00:00+02:00")
                .unwrap()
                .to_rfc3339(),
            "2026-05-01T10:00:00+00:00"
        );
        assert_eq!(
            parse_instant("until", "yesterday").unwrap_err().to_string(),
            "until: 'yesterday' is neither an RFC 3339 instant nor a YYYY-MM-DD date"
        );
    }

    /// Sessions interleave by time, but a session whose events were written with clocks out of
    /// order (a retried batch) keeps its journal order.
    #[test]
    fn merged_journals_keep_each_journals_order() {
        let a = vec![event("a", 1, 10, "a1"), event("a", 2, 30, "a2")];
        // b2 was built before b1 (its batch was retried): it still comes after it.
        let b = vec![
            event("b", 1, 20, "b1"),
            event("b", 2, 15, "b2"),
            event("b", 3, 40, "b3"),
        ];
        let order: Vec<String> = merged(vec![a, b]).map(|e| e.event_id).collect();
        assert_eq!(order, vec!["a1", "b1", "b2", "a2", "b3"]);
    }
}
