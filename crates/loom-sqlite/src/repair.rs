//! Recovering a SQLite journal that holds an unreadable row: reading what can be read
//! (`salvage`), and setting unreadable rows aside (`set_aside`): in one `BEGIN IMMEDIATE`
//! transaction, each row's text is copied to the table `set_aside` and the row is rewritten with
//! its replacement event (same seq, envelope columns from the replacement).

use chrono::{SecondsFormat, Utc};
use loom_core::{
    journal::{check_set_aside, row_event, salvage_row},
    ports::{Salvage, SetAside, StoreError},
};
use sqlx::Row;
use tracing::warn;

use crate::store::{Columns, SqliteStore, to_sql};

/// What `set_aside.moved_to` says of this store.
const ASIDE: &str = "the SQLite table set_aside";

impl SqliteStore {
    pub(crate) async fn salvage_now(
        &self,
        tenant_id: &str,
        session_id: &str,
    ) -> Result<Salvage, StoreError> {
        loom_core::journal::safe_id("tenant", tenant_id)?;
        loom_core::journal::safe_id("session", session_id)?;
        let rows = sqlx::query(
            "SELECT seq, event, run_id FROM events \
             WHERE tenant_id = ?1 AND session_id = ?2 ORDER BY seq",
        )
        .bind(tenant_id)
        .bind(session_id)
        .fetch_all(self.pool())
        .await
        .map_err(|err| self.db_error(err))?;
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
        loom_core::journal::safe_id("tenant", tenant_id)?;
        loom_core::journal::safe_id("session", session_id)?;
        check_set_aside(tenant_id, session_id, &lines)?;
        if lines.is_empty() {
            return Ok(());
        }
        let name = self.journal_name(tenant_id, session_id);
        let mut tx = self
            .pool()
            .begin_with(crate::store::BEGIN_FULL)
            .await
            .map_err(|err| self.db_error(err))?;
        let now = Utc::now().to_rfc3339_opts(SecondsFormat::Micros, true);
        let written = async {
            for aside in &lines {
                let row = sqlx::query(
                    "SELECT event FROM events \
                     WHERE tenant_id = ?1 AND session_id = ?2 AND seq = ?3",
                )
                .bind(tenant_id)
                .bind(session_id)
                .bind(to_sql(aside.line))
                .fetch_optional(&mut *tx)
                .await
                .map_err(|err| self.db_error(err))?;
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
                    "INSERT INTO set_aside (tenant_id, session_id, seq, event, set_aside_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .bind(tenant_id)
                .bind(session_id)
                .bind(to_sql(aside.line))
                .bind(&text)
                .bind(&now)
                .execute(&mut *tx)
                .await
                .map_err(|err| self.db_error(err))?;
                let event = &aside.replacement;
                let columns = Columns::of(event)?;
                sqlx::query(
                    "UPDATE events SET event_id = ?1, ts = ?2, run_id = ?3, root_run_id = ?4, \
                     type = ?5, category = ?6, status = ?7, agent = ?8, role = ?9, \
                     facets = ?10, event = ?11 \
                     WHERE tenant_id = ?12 AND session_id = ?13 AND seq = ?14",
                )
                .bind(&event.event_id)
                .bind(columns.ts)
                .bind(&event.run_id)
                .bind(&event.root_run_id)
                .bind(&event.event_type)
                .bind(columns.category)
                .bind(columns.status)
                .bind(&event.agent)
                .bind(&event.role)
                .bind(columns.facets)
                .bind(event.to_json())
                .bind(tenant_id)
                .bind(session_id)
                .bind(to_sql(aside.line))
                .execute(&mut *tx)
                .await
                .map_err(|err| self.db_error(err))?;
            }
            Ok(())
        }
        .await;
        match written {
            Ok(()) => {
                tx.commit().await.map_err(|err| self.db_error(err))?;
                warn!(
                    journal = %name,
                    rows = ?lines.iter().map(|a| a.line).collect::<Vec<_>>(),
                    "unreadable journal rows set aside and replaced by session.repaired events"
                );
                Ok(())
            }
            Err(err) => {
                if let Err(undo) = tx.rollback().await {
                    warn!(journal = %name, error = %undo, "rollback failed");
                }
                Err(err)
            }
        }
    }
}
