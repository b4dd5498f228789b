//! The event search pushed down as SQL ([`EventStore::search`]): one indexed query on
//! `loom_events`, in write order (`ingested`, which keeps each session's journal order), with
//! `LIMIT`, so the work follows what is returned. Every filter of
//! [`EventFilter`](loom_core::search::EventFilter) is a column test (`type = ANY(…)` on the
//! type index, `run_id` on the run index, the facets by `@>` on the GIN index), and `after` is
//! the `ingested` of the event it names (the unique event id index).
//!
//! A matching row that does not read back makes the store decline (`None`): the caller's scan
//! then applies its rules for corrupted sessions.
//!
//! [`EventStore::search`]: loom_core::ports::EventStore::search

use loom_core::{
    event::Event,
    ports::StoreError,
    search::{EventFilter, Searched},
};
use sqlx::{Postgres, QueryBuilder, Row};
use tracing::debug;

use crate::store::{PgStore, to_sql};
use loom_core::journal::row_event;

/// A serialized enum (`Category`, `EventStatus`) as the text column holds it.
fn text<T: serde::Serialize>(value: &T) -> Option<String> {
    match serde_json::to_value(value).ok()? {
        serde_json::Value::String(text) => Some(text),
        _ => None,
    }
}

/// The `WHERE` clause of `filter` (without `after`), after `SELECT … FROM loom_events`.
fn push_filters(query: &mut QueryBuilder<Postgres>, filter: &EventFilter) {
    query.push(" WHERE tenant_id = ");
    query.push_bind(filter.tenant_id.clone());
    if let Some(session) = &filter.session_id {
        query.push(" AND session_id = ").push_bind(session.clone());
    }
    if let Some(run) = &filter.run_id {
        query.push(" AND run_id = ").push_bind(run.clone());
    }
    if !filter.types.is_empty() {
        query
            .push(" AND type = ANY(")
            .push_bind(filter.types.clone())
            .push(")");
    }
    if !filter.categories.is_empty() {
        let names: Vec<String> = filter.categories.iter().filter_map(text).collect();
        query
            .push(" AND category = ANY(")
            .push_bind(names)
            .push(")");
    }
    if !filter.statuses.is_empty() {
        let names: Vec<String> = filter.statuses.iter().filter_map(text).collect();
        query.push(" AND status = ANY(").push_bind(names).push(")");
    }
    if let Some(agent) = &filter.agent {
        query.push(" AND agent = ").push_bind(agent.clone());
    }
    if let Some(agents) = &filter.agents {
        query
            .push(" AND agent = ANY(")
            .push_bind(agents.clone())
            .push(")");
    }
    if let Some(role) = &filter.role {
        query.push(" AND role = ").push_bind(role.clone());
    }
    if !filter.facets.is_empty() {
        let facets: serde_json::Map<String, serde_json::Value> = filter
            .facets
            .iter()
            .map(|(name, value)| (name.clone(), serde_json::Value::String(value.clone())))
            .collect();
        query
            .push(" AND facets @> ")
            .push_bind(serde_json::Value::Object(facets).to_string())
            .push("::jsonb");
    }
    let instant = |at: &chrono::DateTime<chrono::Utc>| {
        at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    };
    if let Some(since) = &filter.since {
        query
            .push(" AND ts >= ")
            .push_bind(instant(since))
            .push("::timestamptz");
    }
    if let Some(until) = &filter.until {
        query
            .push(" AND ts < ")
            .push_bind(instant(until))
            .push("::timestamptz");
    }
}

impl PgStore {
    pub(crate) async fn search_now(
        &self,
        filter: &EventFilter,
    ) -> Result<Option<Searched>, StoreError> {
        loom_core::journal::safe_id("tenant", &filter.tenant_id)?;
        let db = self.database();
        let mut tx = db.begin(&filter.tenant_id).await?;
        let found = async {
            let after = match &filter.after {
                None => None,
                Some(event_id) => {
                    let mut query = QueryBuilder::<Postgres>::new(
                        "SELECT ingested FROM loom_events WHERE tenant_id = ",
                    );
                    query
                        .push_bind(filter.tenant_id.clone())
                        .push(" AND event_id = ")
                        .push_bind(event_id.clone());
                    if let Some(session) = &filter.session_id {
                        query.push(" AND session_id = ").push_bind(session.clone());
                    }
                    let row = query
                        .build()
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(|err| db.error(err))?;
                    match row {
                        None => return Ok(Some(Searched::UnknownAfter)),
                        Some(row) => Some(row.try_get::<i64, _>(0).map_err(|e| db.error(e))?),
                    }
                }
            };
            let mut query =
                QueryBuilder::<Postgres>::new("SELECT session_id, seq, event FROM loom_events");
            push_filters(&mut query, filter);
            if let Some(after) = after {
                query.push(" AND ingested > ").push_bind(after);
            }
            query
                .push(" ORDER BY ingested LIMIT ")
                .push_bind(to_sql(filter.limit as u64));
            let rows = query
                .build()
                .fetch_all(&mut *tx)
                .await
                .map_err(|err| db.error(err))?;
            let mut events: Vec<Event> = Vec::with_capacity(rows.len());
            for row in &rows {
                let session: String = row.try_get("session_id").map_err(|e| db.error(e))?;
                let seq = u64::try_from(row.try_get::<i64, _>("seq").map_err(|e| db.error(e))?)
                    .unwrap_or(0);
                let text: String = row.try_get("event").map_err(|e| db.error(e))?;
                match row_event(&filter.tenant_id, &session, seq, &text) {
                    Ok(event) => events.push(event),
                    Err(error) => {
                        debug!(
                            session = %session, seq, error = %error,
                            "a matching row does not read back: the search falls back to the scan"
                        );
                        return Ok(None);
                    }
                }
            }
            Ok(Some(Searched::Found(events)))
        }
        .await;
        db.finish(tx, found).await
    }
}
