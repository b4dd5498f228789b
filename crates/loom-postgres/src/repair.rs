//! Recovering a PostgreSQL journal that holds an unreadable row: reading what can be read
//! (`salvage`), and setting unreadable rows aside (`set_aside`): in one transaction under the
//! session's lock, each row's text is copied to `loom_set_aside`, then the row is deleted and
//! its replacement event inserted at the same seq (the application role has no `UPDATE` on the
//! journal).

use loom_core::{
    journal::{check_set_aside, safe_id},
    ports::{Salvage, SetAside, StoreError},
};
use sqlx::Row;
use tracing::warn;

use crate::store::{Columns, PgStore, insert, to_sql};
use loom_core::journal::{row_event, salvage_row};

/// What `set_aside.moved_to` says of this store.
const ASIDE: &str = "the PostgreSQL table loom_set_aside";

impl PgStore {
    pub(crate) async fn salvage_now(
        &self,
        tenant_id: &str,
        session_id: &str,
    ) -> Result<Salvage, StoreError> {
        safe_id("tenant", tenant_id)?;
        safe_id("session", session_id)?;
        let mut tx = self.database().begin(tenant_id).await?;
        let rows = sqlx::query(
            "SELECT seq, event, run_id FROM loom_events \
             WHERE tenant_id = $1 AND session_id = $2 ORDER BY seq",
        )
        .bind(tenant_id)
        .bind(session_id)
        .fetch_all(&mut *tx)
        .await
        .map_err(|err| self.database().error(err));
        let rows = self.finish(tx, rows).await?;
        let mut salvage = Salvage {
            path: self.journal_name(tenant_id, session_id),
            aside: ASIDE.to_owned(),
            ..Salvage::default()
        };
        for row in &rows {
            let seq = row
                .try_get::<i64, _>("seq")
                .ok()
                .and_then(|seq| u64::try_from(seq).ok())
                .unwrap_or(0);
            salvage_row(
                &mut salvage,
                tenant_id,
                session_id,
                seq,
                row.try_get("event").ok(),
                row.try_get("run_id").ok(),
            );
        }
        Ok(salvage)
    }

    pub(crate) async fn set_aside_now(
        &self,
        tenant_id: &str,
        session_id: &str,
        lines: Vec<SetAside>,
    ) -> Result<(), StoreError> {
        safe_id("tenant", tenant_id)?;
        safe_id("session", session_id)?;
        check_set_aside(tenant_id, session_id, &lines)?;
        if lines.is_empty() {
            return Ok(());
        }
        let name = self.journal_name(tenant_id, session_id);
        let db = self.database();
        let mut tx = db.begin(tenant_id).await?;
        let written = async {
            sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
                .bind(format!("{tenant_id}/{session_id}"))
                .execute(&mut *tx)
                .await
                .map_err(|err| db.error(err))?;
            for aside in &lines {
                let row = sqlx::query(
                    "SELECT event FROM loom_events \
                     WHERE tenant_id = $1 AND session_id = $2 AND seq = $3",
                )
                .bind(tenant_id)
                .bind(session_id)
                .bind(to_sql(aside.line))
                .fetch_optional(&mut *tx)
                .await
                .map_err(|err| db.error(err))?;
                let Some(row) = row else {
                    return Err(StoreError::Invalid(format!(
                        "{name} has no row of seq {}",
                        aside.line
                    )));
                };
                let text: String = row.try_get("event").unwrap_or_default();
                if text.as_bytes() != aside.bytes.as_slice() {
                    return Err(StoreError::Invalid(format!(
                        "the row of seq {} of {name} changed since it was read: read the \
                         journal again",
                        aside.line
                    )));
                }
                if row_event(tenant_id, session_id, aside.line, &text).is_ok() {
                    return Err(StoreError::Invalid(format!(
                        "the row of seq {} of {name} reads back: only an unreadable row is set \
                         aside",
                        aside.line
                    )));
                }
                sqlx::query(
                    "INSERT INTO loom_set_aside (tenant_id, session_id, seq, event) \
                     VALUES ($1, $2, $3, $4)",
                )
                .bind(tenant_id)
                .bind(session_id)
                .bind(to_sql(aside.line))
                .bind(&text)
                .execute(&mut *tx)
                .await
                .map_err(|err| db.error(err))?;
                sqlx::query(
                    "DELETE FROM loom_events WHERE tenant_id = $1 AND session_id = $2 AND seq = $3",
                )
                .bind(tenant_id)
                .bind(session_id)
                .bind(to_sql(aside.line))
                .execute(&mut *tx)
                .await
                .map_err(|err| db.error(err))?;
                let columns = Columns::of(&aside.replacement)?;
                insert(
                    &mut tx,
                    &aside.replacement,
                    columns,
                    aside.replacement.to_json(),
                )
                .await
                .map_err(|err| db.error(err))?;
            }
            // The index of sessions follows the rows written again.
            sqlx::query(
                "UPDATE loom_sessions s SET updated_at = e.ts, last_ingested = \
                 (SELECT max(ingested) FROM loom_events \
                  WHERE tenant_id = $1 AND session_id = $2) \
                 FROM loom_events e WHERE s.tenant_id = $1 AND s.session_id = $2 \
                 AND e.tenant_id = $1 AND e.session_id = $2 AND e.seq = s.last_seq",
            )
            .bind(tenant_id)
            .bind(session_id)
            .execute(&mut *tx)
            .await
            .map_err(|err| db.error(err))?;
            Ok(())
        }
        .await;
        self.finish(tx, written).await?;
        warn!(
            journal = %name,
            rows = ?lines.iter().map(|a| a.line).collect::<Vec<_>>(),
            "unreadable journal rows set aside and replaced by session.repaired events"
        );
        Ok(())
    }
}
