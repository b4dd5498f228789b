//! The reads of a tenant's journal answered from the file's own indexes, as the PostgreSQL
//! journal answers them: the event search ([`EventStore::search`]) and the most recently
//! written sessions ([`EventStore::recent_sessions`]).
//!
//! **The search** is one SQL query on `events`, in write order — `ingested`, the counter each
//! append gives its batch, then `session_id` and `seq` (a batch is one session's, so this keeps
//! each session's journal order) — with `LIMIT`, in one read transaction. Every filter of
//! [`EventFilter`] is pushed down as a column test on bound values (no caller text is ever part
//! of the SQL): `session_id`, `run_id`, `type IN (…)`, `category IN (…)`, `status IN (…)`,
//! `agent`, `agent IN (…)`, `role`; a facet must be a JSON string of that value under that key
//! of the `facets` column (`json_each`, the key bound, never a JSON path built from it); `since`
//! and `until` compare the `ts` column, RFC 3339 UTC with microseconds as every append writes
//! it (so it sorts as text), with the bound written the same way, rounded up to the next
//! microsecond when it is finer (an event's `ts` holds microseconds, so the test is then exactly
//! [`EventFilter::matches`]'s). `after` is the position (`ingested, session_id, seq`) of the
//! first row carrying that event id (in `session_id` when given; the event id index), and
//! [`Searched::UnknownAfter`] when there is none. The query names its index (the file keeps no
//! statistics for SQLite's planner to choose): with a session, `events_session_type`; else with
//! a run, `events_run`; else with types, `events_tenant_type` (`tenant_id, type, ingested,
//! session_id, seq`: one type is walked in write order from the cursor, several are sorted);
//! else `events_tenant_ingested` (`tenant_id, ingested, session_id, seq`: the tenant's events
//! walked in write order from the cursor until the limit is reached).
//!
//! A matching row that does not read back (its event does not parse, names another journal or
//! seq) or whose event does not pass [`EventFilter::matches`] (its columns disagree with it)
//! makes the store decline (`None`): the caller's scan then applies its rules for corrupted
//! sessions.
//!
//! **The recent sessions** are the list and the order of [`EventStore::sessions`] (the same
//! query answers both: each session's last row, most recently appended first, then the newest
//! last event, then the session id), filtered on the `ts` of each session's last event and cut
//! at `limit`, one row more telling whether there are more. The file keeps no table of its
//! sessions (PostgreSQL's `loom_sessions`): each session's last seq comes from one pass over
//! the tenant's entries of an index (`tenant_id, session_id, …, seq`), no event read; then only
//! the last events returned are read. A last event that does not read back makes the store
//! decline.
//!
//! [`EventStore::search`]: loom_core::ports::EventStore::search
//! [`EventStore::recent_sessions`]: loom_core::ports::EventStore::recent_sessions
//! [`EventStore::sessions`]: loom_core::ports::EventStore::sessions

use chrono::{DateTime, Datelike, SecondsFormat, TimeDelta, Utc};
use loom_core::{
    event::Event,
    journal::safe_id,
    ports::{SessionSummary, StoreError},
    search::{EventFilter, RecentSessions, Searched},
};
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection, sqlite::SqliteRow};
use tracing::{debug, warn};

use crate::store::{SqliteStore, text, to_sql};

/// Each session's last row (its highest seq), most recently appended first, then newest, then
/// by session id: the order of [`SqliteStore::sessions`](loom_core::ports::EventStore::sessions).
/// `?1` the tenant, `?2` the `ts` a last event must reach (`NULL`: any), `?3` the most rows
/// (`-1`: all).
const RECENT: &str = "SELECT e.session_id, e.seq, e.event FROM \
     (SELECT session_id, MAX(seq) AS seq FROM events WHERE tenant_id = ?1 GROUP BY session_id) \
     AS last \
     JOIN events AS e ON e.tenant_id = ?1 AND e.session_id = last.session_id AND e.seq = last.seq \
     WHERE ?2 IS NULL OR e.ts >= ?2 \
     ORDER BY e.ingested DESC, e.ts DESC, e.session_id LIMIT ?3";

/// Where an instant falls against the `ts` column, which holds years 0 to 9999 only (an event
/// whose `ts` is outside cannot be written: its RFC 3339 text would not read back).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Bound {
    /// Before every `ts` the column can hold.
    BeforeAll,
    /// This text, in the column's format: an instant within the column's years.
    At(String),
    /// After every `ts` the column can hold.
    AfterAll,
}

/// `at` as the `ts` column compares it: RFC 3339 UTC with microseconds, rounded up to the next
/// microsecond when `at` is finer, so that for a `ts` holding microseconds, `ts >= at` and
/// `ts < at` read the same on the text as on the instants.
fn bound(at: &DateTime<Utc>) -> Bound {
    let finer = at.timestamp_subsec_nanos() % 1_000;
    let up = if finer == 0 {
        Some(*at)
    } else {
        at.checked_add_signed(TimeDelta::nanoseconds(i64::from(1_000 - finer)))
    };
    match up {
        None => Bound::AfterAll,
        Some(up) if up.year() > 9999 => Bound::AfterAll,
        Some(up) if up.year() < 0 => Bound::BeforeAll,
        Some(up) => Bound::At(up.to_rfc3339_opts(SecondsFormat::Micros, true)),
    }
}

/// ` AND <column> IN (?, …)` with `values` bound; no value matches nothing.
fn push_in(query: &mut QueryBuilder<Sqlite>, column: &str, values: Vec<String>) {
    if values.is_empty() {
        query.push(" AND 0");
        return;
    }
    query.push(" AND ").push(column).push(" IN (");
    let mut list = query.separated(", ");
    for value in values {
        list.push_bind(value);
    }
    list.push_unseparated(")");
}

/// The `WHERE` clause of `filter` (without `after`), after `SELECT … FROM events`.
fn push_filters(query: &mut QueryBuilder<Sqlite>, filter: &EventFilter) {
    query
        .push(" WHERE tenant_id = ")
        .push_bind(filter.tenant_id.clone());
    if let Some(session) = &filter.session_id {
        query.push(" AND session_id = ").push_bind(session.clone());
    }
    if let Some(run) = &filter.run_id {
        query.push(" AND run_id = ").push_bind(run.clone());
    }
    if !filter.types.is_empty() {
        push_in(query, "type", filter.types.clone());
    }
    if !filter.categories.is_empty() {
        push_in(
            query,
            "category",
            filter
                .categories
                .iter()
                .filter_map(|category| serde_json::to_value(category).ok().map(text))
                .collect(),
        );
    }
    if !filter.statuses.is_empty() {
        push_in(
            query,
            "status",
            filter
                .statuses
                .iter()
                .filter_map(|status| serde_json::to_value(status).ok().map(text))
                .collect(),
        );
    }
    if let Some(agent) = &filter.agent {
        query.push(" AND agent = ").push_bind(agent.clone());
    }
    if let Some(agents) = &filter.agents {
        push_in(query, "agent", agents.clone());
    }
    if let Some(role) = &filter.role {
        query.push(" AND role = ").push_bind(role.clone());
    }
    for (name, value) in &filter.facets {
        // The key is compared as a value: a name is never read as a JSON path. A `facets`
        // column that is not JSON (written by hand) matches no facet rather than failing.
        query
            .push(
                " AND CASE WHEN json_valid(events.facets) THEN EXISTS (SELECT 1 FROM \
                 json_each(events.facets) AS facet WHERE facet.key = ",
            )
            .push_bind(name.clone())
            .push(" AND facet.type = 'text' AND facet.value = ")
            .push_bind(value.clone())
            .push(") ELSE 0 END");
    }
    if let Some(since) = &filter.since {
        match bound(since) {
            Bound::BeforeAll => {}
            Bound::At(at) => {
                query.push(" AND ts >= ").push_bind(at);
            }
            Bound::AfterAll => {
                query.push(" AND 0");
            }
        }
    }
    if let Some(until) = &filter.until {
        match bound(until) {
            Bound::BeforeAll => {
                query.push(" AND 0");
            }
            Bound::At(at) => {
                query.push(" AND ts < ").push_bind(at);
            }
            Bound::AfterAll => {}
        }
    }
}

/// The index a search reads, by its most selective filter, so that its work is bounded by what
/// that filter selects (the file keeps no statistics for the planner to weigh them): a
/// session's events (`events_session_type`, its types when given), else a run's
/// (`events_run`), else those of the types asked for in write order from the cursor
/// (`events_tenant_type`), else the tenant's in write order from the cursor, up to the limit
/// (`events_tenant_ingested`).
fn index(filter: &EventFilter) -> &'static str {
    if filter.session_id.is_some() {
        "events_session_type"
    } else if filter.run_id.is_some() {
        "events_run"
    } else if !filter.types.is_empty() {
        "events_tenant_type"
    } else {
        "events_tenant_ingested"
    }
}

/// `select` (the columns) of the rows passing `filter` after `after`, in write order, at most
/// the filter's limit.
fn page(select: &str, filter: &EventFilter, after: Option<Position>) -> QueryBuilder<Sqlite> {
    let mut query = QueryBuilder::<Sqlite>::new(select);
    query.push(" FROM events INDEXED BY ").push(index(filter));
    push_filters(&mut query, filter);
    if let Some(after) = after {
        // The first test bounds the index range; the row value orders the rows of one batch.
        query
            .push(" AND ingested >= ")
            .push_bind(after.ingested)
            .push(" AND (ingested, session_id, seq) > (")
            .push_bind(after.ingested)
            .push(", ")
            .push_bind(after.session_id)
            .push(", ")
            .push_bind(after.seq)
            .push(")");
    }
    query
        .push(" ORDER BY ingested, session_id, seq LIMIT ")
        .push_bind(to_sql(filter.limit as u64));
    query
}

/// `select` (the columns) of the first row, in write order, carrying `event_id` (in the
/// filter's session when given), by the event id index.
fn cursor(select: &str, filter: &EventFilter, event_id: &str) -> QueryBuilder<Sqlite> {
    let mut query = QueryBuilder::<Sqlite>::new(select);
    query
        .push(" FROM events INDEXED BY events_event_id WHERE tenant_id = ")
        .push_bind(filter.tenant_id.clone())
        .push(" AND event_id = ")
        .push_bind(event_id.to_owned());
    if let Some(session) = &filter.session_id {
        query.push(" AND session_id = ").push_bind(session.clone());
    }
    query.push(" ORDER BY ingested, session_id, seq LIMIT 1");
    query
}

/// The position of a row in write order.
#[derive(Debug)]
struct Position {
    ingested: i64,
    session_id: String,
    seq: i64,
}

impl SqliteStore {
    /// [`EventStore::search`](loom_core::ports::EventStore::search): the cursor, then the page,
    /// in one read transaction (one snapshot of the file).
    pub(crate) async fn search_now(
        &self,
        filter: &EventFilter,
    ) -> Result<Option<Searched>, StoreError> {
        safe_id("tenant", &filter.tenant_id)?;
        let mut tx = self.pool().begin().await.map_err(|e| self.db_error(e))?;
        let found = self.search_in(&mut tx, filter).await;
        match found {
            Ok(found) => {
                tx.commit().await.map_err(|e| self.db_error(e))?;
                Ok(found)
            }
            Err(err) => {
                if let Err(undo) = tx.rollback().await {
                    warn!(path = %self.path().display(), error = %undo, "rollback failed");
                }
                Err(err)
            }
        }
    }

    async fn search_in(
        &self,
        conn: &mut SqliteConnection,
        filter: &EventFilter,
    ) -> Result<Option<Searched>, StoreError> {
        let after = match &filter.after {
            None => None,
            Some(event_id) => match self.position(conn, filter, event_id).await? {
                None => return Ok(Some(Searched::UnknownAfter)),
                Some(position) => Some(position),
            },
        };
        let mut query = page("SELECT session_id, seq, event", filter, after);
        let rows = query
            .build()
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| self.db_error(e))?;
        let mut events: Vec<Event> = Vec::with_capacity(rows.len());
        for row in &rows {
            let Some(event) = self.found(&filter.tenant_id, row) else {
                return Ok(None);
            };
            if !filter.matches(&event) {
                debug!(
                    session = %event.session_id, seq = event.seq,
                    "a row's columns disagree with its event: the search falls back to the scan"
                );
                return Ok(None);
            }
            events.push(event);
        }
        Ok(Some(Searched::Found(events)))
    }

    /// Where `event_id` stands in write order: its first row (in the filter's session when
    /// given), `None` when the journal searched holds no such event.
    async fn position(
        &self,
        conn: &mut SqliteConnection,
        filter: &EventFilter,
        event_id: &str,
    ) -> Result<Option<Position>, StoreError> {
        let mut query = cursor("SELECT ingested, session_id, seq", filter, event_id);
        let row = query
            .build()
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| self.db_error(e))?;
        row.map(|row| {
            Ok(Position {
                ingested: row.try_get("ingested")?,
                session_id: row.try_get("session_id")?,
                seq: row.try_get("seq")?,
            })
        })
        .transpose()
        .map_err(|e: sqlx::Error| self.db_error(e))
    }

    /// The event of a matching row (`session_id`, `seq`, `event`), `None` when it does not
    /// read back.
    fn found(&self, tenant_id: &str, row: &SqliteRow) -> Option<Event> {
        let Ok(session_id) = row.try_get::<String, _>("session_id") else {
            debug!("a matching row names no session: the search falls back to the scan");
            return None;
        };
        match self.decode(tenant_id, &session_id, row, None) {
            Ok(event) => Some(event),
            Err(error) => {
                debug!(
                    session = %session_id, error = %error,
                    "a matching row does not read back: the search falls back to the scan"
                );
                None
            }
        }
    }

    /// The rows of [`RECENT`]: each session's last row whose `ts` reaches `since` (any when
    /// `None`), in the order of the session list, at most `limit` (`-1`: all).
    pub(crate) async fn recent_rows(
        &self,
        tenant_id: &str,
        since: Option<String>,
        limit: i64,
    ) -> Result<Vec<SqliteRow>, StoreError> {
        sqlx::query(RECENT)
            .bind(tenant_id)
            .bind(since)
            .bind(limit)
            .fetch_all(self.pool())
            .await
            .map_err(|e| self.db_error(e))
    }

    /// [`EventStore::sessions`](loom_core::ports::EventStore::sessions): every session of
    /// `tenant_id`, a journal whose last event does not read back left out with a warning.
    pub(crate) async fn sessions_now(
        &self,
        tenant_id: &str,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        safe_id("tenant", tenant_id)?;
        let rows = self.recent_rows(tenant_id, None, -1).await?;
        let mut found = Vec::with_capacity(rows.len());
        for row in &rows {
            match self.summary(tenant_id, row) {
                Ok(summary) => found.push(summary),
                // One unreadable journal must not hide the others.
                Err(err) => {
                    warn!(error = %err, "skipping an unreadable journal in the session list")
                }
            }
        }
        Ok(found)
    }

    /// [`EventStore::recent_sessions`](loom_core::ports::EventStore::recent_sessions): one
    /// row more than `limit` tells whether there are more. A last event that does not read
    /// back makes the store decline, so that the caller's scan applies its rules.
    pub(crate) async fn recent_sessions_now(
        &self,
        tenant_id: &str,
        since: Option<DateTime<Utc>>,
        limit: usize,
    ) -> Result<Option<RecentSessions>, StoreError> {
        safe_id("tenant", tenant_id)?;
        let since = match since.as_ref().map(bound) {
            None | Some(Bound::BeforeAll) => None,
            Some(Bound::At(at)) => Some(at),
            Some(Bound::AfterAll) => {
                return Ok(Some(RecentSessions {
                    sessions: Vec::new(),
                    more: false,
                }));
            }
        };
        let rows = self
            .recent_rows(tenant_id, since, to_sql(limit as u64).saturating_add(1))
            .await?;
        let mut sessions = Vec::with_capacity(rows.len().min(limit));
        for row in rows.iter().take(limit) {
            match self.summary(tenant_id, row) {
                Ok(summary) => sessions.push(summary),
                Err(error) => {
                    debug!(
                        error = %error,
                        "a session's last event does not read back: the session list falls \
                         back to the scan"
                    );
                    return Ok(None);
                }
            }
        }
        Ok(Some(RecentSessions {
            sessions,
            more: rows.len() > limit,
        }))
    }

    /// The summary of a session from its last row (`session_id`, `seq`, `event`), read back.
    fn summary(&self, tenant_id: &str, row: &SqliteRow) -> Result<SessionSummary, StoreError> {
        let session_id: String = row.try_get("session_id").map_err(|e| self.db_error(e))?;
        let last = self.decode(tenant_id, &session_id, row, None)?;
        Ok(SessionSummary {
            session_id,
            last_seq: last.seq,
            updated_at: Some(last.ts),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    /// The steps of the plan of `query` (prefixed with `EXPLAIN QUERY PLAN`).
    async fn plan(store: &SqliteStore, mut query: QueryBuilder<Sqlite>) -> Vec<String> {
        query
            .build()
            .fetch_all(store.pool())
            .await
            .unwrap()
            .iter()
            .map(|row| row.try_get::<String, _>("detail").unwrap())
            .collect()
    }

    /// Each search reads the index its filters select, in write order where it can, so that
    /// it stops at its limit: never a scan of the table, and a sort only of what one session,
    /// one run or several types select.
    #[tokio::test]
    async fn each_search_reads_the_index_its_filters_select() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::connect(dir.path().join("journal.db"))
            .await
            .unwrap();
        let tenant = EventFilter {
            tenant_id: "t".into(),
            limit: 10,
            ..EventFilter::default()
        };
        let after = || {
            Some(Position {
                ingested: 5,
                session_id: "s".into(),
                seq: 2,
            })
        };
        let explain = "EXPLAIN QUERY PLAN SELECT session_id, seq, event";
        let one_type = EventFilter {
            types: vec!["tool.called".into()],
            ..tenant.clone()
        };
        let two_types = EventFilter {
            types: vec!["tool.called".into(), "run.failed".into()],
            ..tenant.clone()
        };
        let cases = [
            (
                tenant.clone(),
                None,
                "events_tenant_ingested (tenant_id=?)",
                false,
            ),
            (
                tenant.clone(),
                after(),
                "events_tenant_ingested (tenant_id=? AND ingested>?)",
                false,
            ),
            (
                EventFilter {
                    agents: Some(vec!["calc".into()]),
                    facets: vec![("tool_name".into(), "add".into())],
                    since: Some(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()),
                    ..tenant.clone()
                },
                after(),
                "events_tenant_ingested (tenant_id=? AND ingested>?)",
                false,
            ),
            (
                one_type.clone(),
                None,
                "events_tenant_type (tenant_id=? AND type=?)",
                false,
            ),
            (
                one_type,
                after(),
                "events_tenant_type (tenant_id=? AND type=? AND ingested>?)",
                false,
            ),
            (
                two_types,
                after(),
                "events_tenant_type (tenant_id=? AND type=? AND ingested>?)",
                true,
            ),
            (
                EventFilter {
                    session_id: Some("s".into()),
                    run_id: Some("r".into()),
                    ..tenant.clone()
                },
                None,
                "events_session_type (tenant_id=? AND session_id=?)",
                true,
            ),
            (
                EventFilter {
                    run_id: Some("r".into()),
                    types: vec!["tool.called".into()],
                    ..tenant.clone()
                },
                after(),
                "events_run (tenant_id=? AND run_id=?)",
                true,
            ),
        ];
        for (filter, after, index, sorts) in cases {
            let steps = plan(&store, page(explain, &filter, after)).await;
            assert!(
                steps.iter().any(|step| step.contains(index)),
                "{filter:?}: {steps:?}"
            );
            assert!(
                !steps.iter().any(|step| step.starts_with("SCAN events")),
                "{steps:?}"
            );
            if !sorts {
                assert!(
                    !steps.iter().any(|step| step.contains("TEMP B-TREE")),
                    "{steps:?}"
                );
            }
        }
        let steps = plan(
            &store,
            cursor("EXPLAIN QUERY PLAN SELECT ingested", &tenant, "ev-1"),
        )
        .await;
        assert!(
            steps
                .iter()
                .any(|step| step.contains("events_event_id (tenant_id=? AND event_id=?)")),
            "{steps:?}"
        );
    }

    #[test]
    fn a_bound_is_the_column_text_rounded_up_to_the_microsecond() {
        let at = Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap();
        assert_eq!(bound(&at), Bound::At("2026-11-29T12:00:00.000000Z".into()));
        let finer = at + TimeDelta::nanoseconds(1_500);
        assert_eq!(
            bound(&finer),
            Bound::At("2026-11-29T12:00:00.000002Z".into())
        );
        let whole = at + TimeDelta::microseconds(7);
        assert_eq!(
            bound(&whole),
            Bound::At("2026-11-29T12:00:00.000007Z".into())
        );
        let last = Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap()
            + TimeDelta::nanoseconds(999_999_500);
        assert_eq!(bound(&last), Bound::AfterAll);
        assert_eq!(bound(&DateTime::<Utc>::MAX_UTC), Bound::AfterAll);
        assert_eq!(bound(&DateTime::<Utc>::MIN_UTC), Bound::BeforeAll);
        let first = Utc.with_ymd_and_hms(0, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(
            bound(&first),
            Bound::At("0000-01-01T00:00:00.000000Z".into())
        );
    }
}
