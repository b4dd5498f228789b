//! # loom-postgres
//!
//! Loom's production storage on PostgreSQL: [`PgStore`] (the journal, an
//! [`EventStore`](loom_core::ports::EventStore)), [`PgIdempotency`] (the idempotency keys of
//! business actions) and [`PgArtifacts`] (the files of sessions), all in one database reached
//! through one [`PgDatabase`], with the tenants kept apart by row-level security; and
//! [`PgBus`], the event bus on `LISTEN/NOTIFY` between the processes sharing the database.
//!
//! ## Schema
//!
//! [`schema`] holds the DDL as versioned migrations per component (`events`, `idempotency`,
//! `artifacts`), recorded in `loom_schema(component, version, applied_at)`. A DBA prints it
//! whole with `loom storage sql [--role NAME]` ([`schema::sql`]) and applies it as the user
//! that will own the tables; or Loom applies what is missing at start
//! ([`PgDatabase::migrate`], under an advisory lock, in one transaction: `storage.migrate:
//! auto`), else only checks it ([`PgDatabase::check`]: `storage.migrate: check`, the default),
//! refusing to start on a missing migration with [`PgError::SchemaMissing`].
//!
//! | table | holds | the application role may |
//! |---|---|---|
//! | `loom_events` | one row per event: `tenant_id, session_id, seq` (primary key), `event_id` (unique per tenant), the envelope columns, `facets jsonb`, the event line verbatim (`event text`), `ingested` (an identity: the order of writes); indexed by run, type, ingestion, facets and (events v3) by session and type, behind `last_of_type` | `SELECT, INSERT, DELETE` — no `UPDATE`: the journal is immutable |
//! | `loom_sessions` | the index of sessions: `tenant_id, session_id` (primary key), `last_seq, updated_at, last_ingested`, written with each append (events v2) | `SELECT, INSERT, UPDATE, DELETE` |
//! | `loom_set_aside` | rows set aside from the journal ([`EventStore::set_aside`](loom_core::ports::EventStore::set_aside)) | `SELECT, INSERT, DELETE` |
//! | `loom_idempotency` | `tenant_id, key` (primary key), `session_id, status, result, expires_at, holder` | `SELECT, INSERT, UPDATE, DELETE` |
//! | `loom_artifacts` | `tenant_id, uri` (primary key), `session_id, bytes bytea, created_at` | `SELECT, INSERT, DELETE` |
//!
//! ## Row-level security that holds
//!
//! Every table above has row-level security **enabled and forced** and one policy,
//! `USING/WITH CHECK (tenant_id = NULLIF(current_setting('loom.tenant_id', true), ''))` (a
//! setting once set on a connection reads `''` after its transaction: an empty tenant matches
//! nothing). Loom's pool runs
//! `SET ROLE <role>` (default `loom_app`, `NOLOGIN`, created by the schema and granted to the
//! user applying it) on every connection it opens, so Loom's statements run as a role that
//! neither owns the tables nor is a superuser, and the policy applies to them. Every
//! transaction's first statement is `SELECT set_config('loom.tenant_id', $1, true)`:
//! transaction-local (`SET` cannot take a bind parameter, and a session-wide setting would
//! follow a pooled connection to its next user). Without the setting no row is visible and
//! none can be written. A bug in Loom's own queries (a missing `WHERE tenant_id`) therefore
//! still cannot show one tenant's rows to another: the database filters them.
//!
//! ## Why the artifacts are in the database
//!
//! Several workers on several hosts share a database but no directory; keeping a session's
//! files in `loom_artifacts` lets any of them read what another stored, and puts a tenant's
//! files under the same row-level security, retention and erasure as its journal.
//!
//! ## Concurrency
//!
//! `append` takes a transaction-scoped advisory lock on the session
//! (`pg_advisory_xact_lock(hashtextextended('<tenant>/<session>', 0))`), reads the last seq,
//! and refuses with [`StoreError::Conflict`](loom_core::ports::StoreError::Conflict) when it is
//! not the one expected; any number of processes may write one session. The primary key stays
//! the last word: a row inserted at the same seq by a writer that bypassed the lock makes the
//! append fail with `Conflict` too, having written nothing.
//!
//! ## Reads pushed down
//!
//! The session list reads `loom_sessions` (one row per session, each joined to its last event,
//! which is read and checked), not every event. [`EventStore::search`] is one indexed query in
//! write order (`ingested`) with `LIMIT`, and [`EventStore::recent_sessions`] the `limit` most
//! recently written sessions from `loom_sessions_recent`: `Loom::query` and `Loom::runs` ask
//! them first, with work proportional to what they return.
//!
//! [`EventStore::search`]: loom_core::ports::EventStore::search
//! [`EventStore::recent_sessions`]: loom_core::ports::EventStore::recent_sessions
//!
//! ## Connections
//!
//! sqlx without TLS: the DSN reaches the server over a Unix socket or plain TCP (keep it on a
//! private network or a socket). No compile-time query macros are used.

mod artifacts;
mod bus;
mod database;
mod idempotency;
mod repair;
pub mod schema;
mod search;
mod store;

pub use artifacts::PgArtifacts;
pub use bus::{CHANNEL, MAX_PAYLOAD, PgBus};
pub use database::{PgDatabase, PgOptions, PoolSettings};
pub use idempotency::PgIdempotency;
pub use store::PgStore;

/// Why a PostgreSQL database cannot be used, classified by kind.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// The DSN does not parse (its text is not repeated: it may hold a password).
    #[error("the PostgreSQL DSN is not a usable connection string (postgres://user@host:port/db)")]
    Dsn,
    /// The role is not a plain lowercase identifier.
    #[error(
        "role {0:?} is not usable: expected a lowercase identifier [a-z_][a-z0-9_]* of at most 63 bytes"
    )]
    InvalidRole(String),
    /// Pool settings out of range.
    #[error("pool settings: {0}")]
    Pool(String),
    /// The server cannot be reached or refused the connection.
    #[error("cannot connect to {database}: {source}")]
    Connect {
        /// The database, without credentials.
        database: String,
        /// Cause.
        source: sqlx::Error,
    },
    /// The DSN's user cannot switch to the application role (the role is missing, or the user
    /// is not a member of it).
    #[error(
        "cannot SET ROLE {role}: {source} (apply `loom storage sql --role {role}`, which creates \
         the role and grants it to the user applying it, or GRANT {role} TO the DSN's user)"
    )]
    Role {
        /// The application role.
        role: String,
        /// Cause.
        source: sqlx::Error,
    },
    /// Applying or reading the schema failed.
    #[error("PostgreSQL schema: {0}")]
    Migrate(sqlx::Error),
    /// A migration of this build is not applied.
    #[error(
        "the PostgreSQL schema lacks {component} v{version}: apply the output of `loom storage \
         sql` (as the owner of the tables), or set storage.migrate: auto"
    )]
    SchemaMissing {
        /// The component (`events`, `idempotency`, `artifacts`).
        component: String,
        /// The version missing.
        version: i32,
    },
    /// The database holds a schema version this build does not know (a newer Loom wrote it).
    #[error(
        "the PostgreSQL schema holds {component} v{version}, which this build does not know \
         (a newer Loom migrated it)"
    )]
    NewerSchema {
        /// The component.
        component: String,
        /// The unknown version.
        version: i32,
    },
}

impl PgError {
    fn migrate(err: sqlx::Error) -> PgError {
        PgError::Migrate(err)
    }
}
