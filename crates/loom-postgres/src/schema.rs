//! The PostgreSQL schema: versioned migrations per component, recorded in
//! `loom_schema(component, version, applied_at)`, printable whole for a DBA ([`sql`]) or applied
//! by Loom itself ([`migrate`]), and checked before use ([`check`]).
//!
//! Every table holding tenant data has row-level security enabled **and forced** (so it holds
//! for the table owner too), with one policy restricting every command to the rows whose
//! `tenant_id` is the transaction's `loom.tenant_id` setting. The application role (default
//! `loom_app`, `NOLOGIN`, granted to whoever applies the schema) receives only the privileges
//! it needs: `SELECT, INSERT, DELETE` on the journal (no `UPDATE`: the journal is immutable; a
//! row set aside is deleted and written again), `SELECT, INSERT, UPDATE, DELETE` on the index
//! of sessions (`loom_sessions`, kept with each append) and on the idempotency keys,
//! `SELECT, INSERT, DELETE` on the artifacts. `loom_schema` holds no tenant
//! data: it has no policy, and the role may only read it.

use sqlx::{Connection, PgConnection, Row};

use crate::PgError;

/// The application role when the configuration names none.
pub const DEFAULT_ROLE: &str = "loom_app";

/// The key of the advisory lock serialising every [`migrate`] on a database ("loom" in ASCII).
const MIGRATION_LOCK: i64 = 0x6c6f_6f6d;

/// One step of the schema of one component.
#[derive(Debug)]
pub struct Migration {
    /// The component (`events`, `idempotency`, `artifacts`).
    pub component: &'static str,
    /// Its version after this step (from 1, contiguous per component).
    pub version: i32,
    /// What the step does, in one line (printed as a comment).
    pub summary: &'static str,
    /// The statements; `{role}` stands for the quoted application role.
    statements: &'static [&'static str],
}

/// Row-level security on `table`: enabled, forced, and one policy for every command. The
/// setting is read through `NULLIF(…, '')`: once a transaction of a connection has set it, it
/// reads `''` (not NULL) after that transaction ends, and an empty tenant must match nothing.
macro_rules! tenant_policy {
    ($table:literal) => {
        concat!(
            "ALTER TABLE ",
            $table,
            " ENABLE ROW LEVEL SECURITY;\nALTER TABLE ",
            $table,
            " FORCE ROW LEVEL SECURITY;\nDROP POLICY IF EXISTS ",
            $table,
            "_tenant ON ",
            $table,
            ";\nCREATE POLICY ",
            $table,
            "_tenant ON ",
            $table,
            "\n    USING (tenant_id = NULLIF(current_setting('loom.tenant_id', true), ''))\n    \
             WITH CHECK (tenant_id = NULLIF(current_setting('loom.tenant_id', true), ''))"
        )
    };
}

/// Every migration, in the order they apply.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        component: "events",
        version: 1,
        summary: "the journal (loom_events) and the rows set aside from it (loom_set_aside)",
        statements: &[
            "CREATE TABLE IF NOT EXISTS loom_events (
    tenant_id   text        NOT NULL,
    session_id  text        NOT NULL,
    seq         bigint      NOT NULL CHECK (seq > 0),
    event_id    text        NOT NULL,
    ts          timestamptz NOT NULL,
    run_id      text        NOT NULL,
    root_run_id text        NOT NULL,
    type        text        NOT NULL,
    category    text        NOT NULL,
    status      text        NOT NULL,
    agent       text,
    role        text,
    facets      jsonb       NOT NULL,
    event       text        NOT NULL,
    ingested    bigint      GENERATED ALWAYS AS IDENTITY,
    CONSTRAINT loom_events_pkey PRIMARY KEY (tenant_id, session_id, seq),
    CONSTRAINT loom_events_event_id UNIQUE (tenant_id, event_id)
)",
            "CREATE INDEX IF NOT EXISTS loom_events_run ON loom_events (tenant_id, run_id, seq)",
            "CREATE INDEX IF NOT EXISTS loom_events_type ON loom_events (tenant_id, type, ingested)",
            "CREATE INDEX IF NOT EXISTS loom_events_ingested ON loom_events (tenant_id, ingested)",
            "CREATE INDEX IF NOT EXISTS loom_events_facets ON loom_events USING GIN (facets)",
            tenant_policy!("loom_events"),
            "GRANT SELECT, INSERT, DELETE ON loom_events TO {role}",
            "CREATE TABLE IF NOT EXISTS loom_set_aside (
    tenant_id    text        NOT NULL,
    session_id   text        NOT NULL,
    seq          bigint      NOT NULL,
    event        text        NOT NULL,
    set_aside_at timestamptz NOT NULL DEFAULT now()
)",
            "CREATE INDEX IF NOT EXISTS loom_set_aside_session \
             ON loom_set_aside (tenant_id, session_id, seq)",
            tenant_policy!("loom_set_aside"),
            "GRANT SELECT, INSERT, DELETE ON loom_set_aside TO {role}",
        ],
    },
    Migration {
        component: "idempotency",
        version: 1,
        summary: "the idempotency keys of business actions (loom_idempotency)",
        statements: &[
            "CREATE TABLE IF NOT EXISTS loom_idempotency (
    tenant_id  text        NOT NULL,
    key        text        NOT NULL,
    session_id text,
    status     text        NOT NULL CHECK (status IN ('in_progress', 'completed')),
    result     text,
    expires_at timestamptz NOT NULL,
    holder     text        NOT NULL,
    CONSTRAINT loom_idempotency_pkey PRIMARY KEY (tenant_id, key)
)",
            "CREATE INDEX IF NOT EXISTS loom_idempotency_session \
             ON loom_idempotency (tenant_id, session_id)",
            tenant_policy!("loom_idempotency"),
            "GRANT SELECT, INSERT, UPDATE, DELETE ON loom_idempotency TO {role}",
        ],
    },
    Migration {
        component: "artifacts",
        version: 1,
        summary: "the files of sessions (loom_artifacts)",
        statements: &[
            "CREATE TABLE IF NOT EXISTS loom_artifacts (
    tenant_id  text        NOT NULL,
    session_id text        NOT NULL,
    uri        text        NOT NULL,
    bytes      bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT loom_artifacts_pkey PRIMARY KEY (tenant_id, uri)
)",
            "CREATE INDEX IF NOT EXISTS loom_artifacts_session \
             ON loom_artifacts (tenant_id, session_id)",
            tenant_policy!("loom_artifacts"),
            "GRANT SELECT, INSERT, DELETE ON loom_artifacts TO {role}",
        ],
    },
    Migration {
        component: "events",
        version: 2,
        summary: "the index of sessions by last write (loom_sessions), filled from the journal",
        statements: &[
            "CREATE TABLE IF NOT EXISTS loom_sessions (
    tenant_id     text        NOT NULL,
    session_id    text        NOT NULL,
    last_seq      bigint      NOT NULL,
    updated_at    timestamptz NOT NULL,
    last_ingested bigint      NOT NULL,
    CONSTRAINT loom_sessions_pkey PRIMARY KEY (tenant_id, session_id)
)",
            "CREATE INDEX IF NOT EXISTS loom_sessions_recent \
             ON loom_sessions (tenant_id, last_ingested DESC)",
            // The owner reads every tenant's rows to fill the index and writes them: both
            // policies are lifted for the owner within this transaction only, and forced again
            // right after (applying the script twice finds them in place).
            "ALTER TABLE loom_events NO FORCE ROW LEVEL SECURITY",
            "ALTER TABLE loom_sessions NO FORCE ROW LEVEL SECURITY",
            "INSERT INTO loom_sessions (tenant_id, session_id, last_seq, updated_at, last_ingested)
    SELECT DISTINCT ON (tenant_id, session_id) tenant_id, session_id, seq, ts,
           max(ingested) OVER (PARTITION BY tenant_id, session_id)
    FROM loom_events ORDER BY tenant_id, session_id, seq DESC
    ON CONFLICT DO NOTHING",
            "ALTER TABLE loom_events FORCE ROW LEVEL SECURITY",
            tenant_policy!("loom_sessions"),
            "GRANT SELECT, INSERT, UPDATE, DELETE ON loom_sessions TO {role}",
        ],
    },
    Migration {
        component: "events",
        version: 3,
        summary: "a session's events by type (loom_events_session_type), behind last_of_type",
        statements: &["CREATE INDEX IF NOT EXISTS loom_events_session_type \
             ON loom_events (tenant_id, session_id, type, seq)"],
    },
];

/// The migrations table, the role, and its right to read the table: run before any migration.
const PRELUDE: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS loom_schema (
    component  text        NOT NULL,
    version    integer     NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (component, version)
)",
    "DO $loom$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = {role_literal}) THEN
        CREATE ROLE {role} NOLOGIN;
    END IF;
END $loom$",
    "GRANT {role} TO CURRENT_USER",
    "GRANT SELECT ON loom_schema TO {role}",
];

/// Whether `role` can name the application role: a plain lowercase identifier (`[a-z_][a-z0-9_]*`,
/// at most 63 bytes), so that it reads the same quoted or not.
pub fn valid_role(role: &str) -> bool {
    let mut bytes = role.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
        && role.len() <= 63
}

/// Refuses a role name that [`valid_role`] refuses.
pub(crate) fn check_role(role: &str) -> Result<(), PgError> {
    if valid_role(role) {
        Ok(())
    } else {
        Err(PgError::InvalidRole(role.to_owned()))
    }
}

/// `statement` with the role filled in.
fn fill(statement: &str, role: &str) -> String {
    statement
        .replace("{role_literal}", &format!("'{role}'"))
        .replace("{role}", &quote(role))
}

/// `name` as a quoted SQL identifier.
pub(crate) fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The latest version of each component, as this build writes and reads it.
pub fn latest() -> Vec<(&'static str, i32)> {
    let mut latest: Vec<(&'static str, i32)> = Vec::new();
    for migration in MIGRATIONS {
        match latest.iter_mut().find(|(c, _)| *c == migration.component) {
            Some(entry) => entry.1 = entry.1.max(migration.version),
            None => latest.push((migration.component, migration.version)),
        }
    }
    latest
}

/// The whole schema for `role`, as one script a DBA applies with `psql -v ON_ERROR_STOP=1`
/// (in one transaction, as the user that will own the tables): the migrations table, the role,
/// then every migration, each recorded in `loom_schema`. Applying it twice changes nothing.
pub fn sql(role: &str) -> Result<String, PgError> {
    check_role(role)?;
    let mut out = String::new();
    out.push_str(
        "-- Loom PostgreSQL schema (generated by `loom storage sql`).\n\
         -- Apply as the user that will own the tables, e.g.\n\
         --   psql \"$DSN\" -v ON_ERROR_STOP=1 -f loom.sql\n\
         -- Row-level security is enabled and forced on every table holding tenant data; the\n",
    );
    out.push_str(&format!(
        "-- application connects and runs `SET ROLE {}`, which is neither owner nor superuser.\n\n",
        quote(role)
    ));
    out.push_str("BEGIN;\n\n");
    out.push_str(&format!(
        "SELECT pg_advisory_xact_lock({MIGRATION_LOCK});\n\n"
    ));
    for statement in PRELUDE {
        out.push_str(&fill(statement, role));
        out.push_str(";\n\n");
    }
    for migration in MIGRATIONS {
        out.push_str(&format!(
            "-- {} v{}: {}\n",
            migration.component, migration.version, migration.summary
        ));
        for statement in migration.statements {
            out.push_str(&fill(statement, role));
            out.push_str(";\n");
        }
        out.push_str(&format!(
            "INSERT INTO loom_schema (component, version) VALUES ('{}', {}) \
             ON CONFLICT DO NOTHING;\n\n",
            migration.component, migration.version
        ));
    }
    out.push_str("COMMIT;\n");
    Ok(out)
}

/// The versions recorded in `loom_schema`, or none when the table does not exist.
async fn applied(conn: &mut PgConnection) -> Result<Vec<(String, i32)>, sqlx::Error> {
    let exists: bool = sqlx::query("SELECT to_regclass('loom_schema') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)?;
    if !exists {
        return Ok(Vec::new());
    }
    sqlx::query("SELECT component, version FROM loom_schema")
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}

/// Applies the migrations `conn`'s database lacks, for `role`, in one transaction under an
/// advisory lock (several processes starting at once apply them once). Returns what it applied
/// (`component vN`); nothing when the schema is up to date. Refuses a database whose schema is
/// newer than this build's.
pub async fn migrate(conn: &mut PgConnection, role: &str) -> Result<Vec<String>, PgError> {
    check_role(role)?;
    let mut tx = conn.begin().await.map_err(PgError::migrate)?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await
        .map_err(PgError::migrate)?;
    let done = applied(&mut tx).await.map_err(PgError::migrate)?;
    refuse_newer(&done)?;
    for statement in PRELUDE {
        sqlx::raw_sql(sqlx::AssertSqlSafe(fill(statement, role)))
            .execute(&mut *tx)
            .await
            .map_err(PgError::migrate)?;
    }
    let mut now_applied = Vec::new();
    for migration in MIGRATIONS {
        let recorded = done
            .iter()
            .any(|(c, v)| c == migration.component && *v == migration.version);
        if recorded {
            continue;
        }
        for statement in migration.statements {
            sqlx::raw_sql(sqlx::AssertSqlSafe(fill(statement, role)))
                .execute(&mut *tx)
                .await
                .map_err(PgError::migrate)?;
        }
        sqlx::query("INSERT INTO loom_schema (component, version) VALUES ($1, $2)")
            .bind(migration.component)
            .bind(migration.version)
            .execute(&mut *tx)
            .await
            .map_err(PgError::migrate)?;
        now_applied.push(format!("{} v{}", migration.component, migration.version));
    }
    tx.commit().await.map_err(PgError::migrate)?;
    Ok(now_applied)
}

/// Refuses a schema recording a version this build does not know.
fn refuse_newer(done: &[(String, i32)]) -> Result<(), PgError> {
    for (component, version) in done {
        let known = MIGRATIONS
            .iter()
            .any(|m| m.component == component && m.version == *version);
        if !known {
            return Err(PgError::NewerSchema {
                component: component.clone(),
                version: *version,
            });
        }
    }
    Ok(())
}

/// Checks that `conn`'s database holds every migration of this build (and none newer), without
/// changing anything: [`PgError::SchemaMissing`] names the first one missing.
pub async fn check(conn: &mut PgConnection) -> Result<(), PgError> {
    let done = applied(conn).await.map_err(PgError::migrate)?;
    refuse_newer(&done)?;
    for migration in MIGRATIONS {
        let recorded = done
            .iter()
            .any(|(c, v)| c == migration.component && *v == migration.version);
        if !recorded {
            return Err(PgError::SchemaMissing {
                component: migration.component.to_owned(),
                version: migration.version,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_are_plain_identifiers() {
        for good in ["loom_app", "_x", "a1_b2"] {
            assert!(valid_role(good), "{good}");
        }
        for bad in ["", "Loom", "1a", "a-b", "a\"b", "a b", &"a".repeat(64)] {
            assert!(!valid_role(bad), "{bad}");
        }
        assert!(matches!(sql("x;drop"), Err(PgError::InvalidRole(_))));
    }

    #[test]
    fn components_have_contiguous_versions_from_one() {
        for (component, latest) in latest() {
            let versions: Vec<i32> = MIGRATIONS
                .iter()
                .filter(|m| m.component == component)
                .map(|m| m.version)
                .collect();
            assert_eq!(versions, (1..=latest).collect::<Vec<_>>(), "{component}");
        }
    }

    #[test]
    fn every_tenant_table_forces_its_policy_and_the_journal_has_no_update_grant() {
        let text = sql("loom_app").unwrap_or_default();
        for table in [
            "loom_events",
            "loom_sessions",
            "loom_set_aside",
            "loom_idempotency",
            "loom_artifacts",
        ] {
            assert!(
                text.contains(&format!("ALTER TABLE {table} FORCE ROW LEVEL SECURITY;")),
                "{table}"
            );
            assert!(
                text.contains(&format!("CREATE POLICY {table}_tenant ON {table}")),
                "{table}"
            );
        }
        assert!(text.contains("GRANT SELECT, INSERT, DELETE ON loom_events TO \"loom_app\""));
        assert!(!text.contains("UPDATE ON loom_events"));
        assert!(!text.contains("UPDATE, DELETE ON loom_events"));
    }
}
