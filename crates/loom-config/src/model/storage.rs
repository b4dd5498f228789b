//! `storage`: the event journal, the artifact store, the idempotency store, the PostgreSQL
//! settings (pool, role, `migrate`), and where encryption and retention sit.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Storage settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// The event journal.
    pub events: EventsStorage,
    /// Where files are kept (offloaded results); by default beside the journal.
    pub artifacts: ArtifactsStorage,
    /// The idempotency store shared by every run, needed by tools with a business key
    /// (default: none).
    pub idempotency: Option<IdempotencyStorage>,
    /// Sealing at rest of event payloads and files with each tenant's key (default: none;
    /// needs the `crypto` feature of `loom-ia`).
    pub encryption: Option<crate::at_rest::EncryptionStorage>,
    /// How long a dormant session is kept (default: forever).
    pub retention: crate::at_rest::RetentionStorage,
    /// Whether Loom applies the missing PostgreSQL migrations when it starts (`auto`) or only
    /// checks that they are applied (`check`, the default: a DBA applies `loom storage sql`).
    /// A Loom extension of the reference format.
    pub migrate: MigrateMode,
    /// Where background work waits: in this process (`asyncio`, the default), or on RabbitMQ
    /// for `loom worker` processes (`rabbitmq`; needs the `rabbitmq` feature of `loom-ia`).
    pub queue: QueueStorage,
    /// How the processes of a service hear of each other's writes and cancellations: `memory`
    /// (one process, the default), `redis` (pub/sub) or `postgres` (`LISTEN/NOTIFY`).
    pub bus: BusStorage,
    /// Where API-key rate limits, tenant quotas and tenant budget windows are counted: in
    /// each process (`memory`, the default) or once for every process (`redis`). A Loom
    /// extension of the reference format.
    pub limits: LimitsStorage,
}

/// The job queue (`storage.queue`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct QueueStorage {
    /// Backend.
    pub backend: QueueBackend,
    /// The environment variable holding the AMQP URL (`rabbitmq`, required), e.g.
    /// `amqp://loom:secret@mq.internal:5672/%2f`.
    pub url_env: Option<String>,
    /// How many background runs one process drives at once (`asyncio`), and the default of
    /// `loom worker --jobs`.
    pub max_running: u32,
    /// How many deliveries a job gets before it goes to the dead-letter queue `loom.jobs.dead`
    /// (`rabbitmq`). A Loom extension of the reference format.
    pub max_attempts: u32,
    /// The prefix of the queues' names (`rabbitmq`): `<name>.jobs`, `<name>.jobs.dead`, the
    /// delayed queues `<name>.jobs.delayed.<n>s`; `loom` by default. Two services sharing a
    /// broker keep apart with two names. A Loom extension of the reference format.
    pub name: String,
}

impl Default for QueueStorage {
    fn default() -> QueueStorage {
        QueueStorage {
            backend: QueueBackend::default(),
            url_env: None,
            max_running: 16,
            max_attempts: 5,
            name: "loom".to_owned(),
        }
    }
}

/// Job queue backends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum QueueBackend {
    /// In the process that accepts the work (the library mode): the journal makes it durable.
    #[default]
    Asyncio,
    /// RabbitMQ: the process that accepts work only publishes it, `loom worker` does it.
    Rabbitmq,
}

/// The event bus (`storage.bus`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BusStorage {
    /// Backend.
    pub backend: BusBackend,
    /// The environment variable holding the DSN (`postgres`); by default the `postgres`
    /// journal's.
    pub dsn_env: Option<String>,
    /// The environment variable holding the Redis URL (`redis`, required), e.g.
    /// `redis://cache.internal:6379/0`.
    pub url_env: Option<String>,
}

/// Event bus backends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BusBackend {
    /// Within one process.
    #[default]
    Memory,
    /// Redis pub/sub (channel `loom:events`); needs the `redis` feature of `loom-ia`.
    Redis,
    /// PostgreSQL `LISTEN/NOTIFY` (channel `loom_events`); needs the `postgres` feature.
    Postgres,
}

/// Where limits are counted (`storage.limits`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsStorage {
    /// Backend.
    pub backend: LimitsBackend,
    /// The environment variable holding the Redis URL (`redis`, required).
    pub url_env: Option<String>,
}

/// Backends of the shared counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LimitsBackend {
    /// In each process: N processes allow N times the limit.
    #[default]
    Memory,
    /// In Redis, atomic and expiring: N processes enforce one limit; needs the `redis` feature.
    Redis,
}

/// What Loom does with the PostgreSQL schema when it starts (`storage.migrate`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MigrateMode {
    /// Apply the migrations the database lacks (as the DSN's user, under an advisory lock).
    Auto,
    /// Refuse to start when a migration is missing, naming it.
    #[default]
    Check,
}

/// The connection pool of a PostgreSQL store (`pool`): sizes, and timeouts in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PostgresPool {
    /// Connections kept open (at least 1).
    pub min_size: u32,
    /// Connections at most (at least `min_size`).
    pub max_size: u32,
    /// The longest a statement may run.
    pub command_timeout: f64,
    /// The longest a statement waits for a lock.
    pub lock_timeout: f64,
    /// The longest a caller waits for a free connection.
    pub acquire_timeout: f64,
}

impl Default for PostgresPool {
    fn default() -> PostgresPool {
        PostgresPool {
            min_size: 1,
            max_size: 10,
            command_timeout: 60.0,
            lock_timeout: 10.0,
            acquire_timeout: 30.0,
        }
    }
}

/// The application role of a PostgreSQL store when none is named.
pub const DEFAULT_POSTGRES_ROLE: &str = "loom_app";

fn default_postgres_role() -> String {
    DEFAULT_POSTGRES_ROLE.to_owned()
}

/// The idempotency store (`storage.idempotency`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdempotencyStorage {
    /// Backend.
    pub backend: IdempotencyBackend,
    /// Database file (`sqlite`), relative to the config file; by default the `sqlite` journal's.
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// The environment variable holding the DSN (`postgres`); by default the `postgres`
    /// journal's.
    #[serde(default)]
    pub dsn_env: Option<String>,
    /// The environment variable holding the Redis URL (`redis`, required).
    #[serde(default)]
    pub url_env: Option<String>,
    /// The application role (`postgres`); by default the journal's.
    #[serde(default)]
    pub role: Option<String>,
    /// The connection pool (`postgres`); by default the journal's (and its pool, when the DSN
    /// and role are the journal's).
    #[serde(default)]
    pub pool: Option<PostgresPool>,
}

/// Idempotency store backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum IdempotencyBackend {
    /// A table of a SQLite file, shared by every process that opens it; needs the `sqlite`
    /// feature of `loom-ia`.
    Sqlite,
    /// The table `loom_idempotency` of a PostgreSQL database; needs the `postgres` feature of
    /// `loom-ia`.
    Postgres,
    /// Keys in Redis, expiring with their record; needs the `redis` feature of `loom-ia`.
    Redis,
}

/// Where artifacts are kept. Without `backend`, they follow the journal: `<events path>/.artifacts`
/// for `jsonl`, `<directory of the database>/.artifacts` for `sqlite`, the table
/// `loom_artifacts` of the database for `postgres`, in memory for `memory`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ArtifactsStorage {
    /// `local` (a directory), `memory`, or `postgres` (the journal's database).
    pub backend: Option<ArtifactsBackend>,
    /// Directory of the `local` backend, relative to the config file.
    pub path: Option<PathBuf>,
}

/// Artifact stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ArtifactsBackend {
    /// Files in a directory.
    Local,
    /// In process memory.
    Memory,
    /// The table `loom_artifacts` of the `postgres` journal's database: shared by every worker
    /// on every host, under the same row-level security, retention and erasure as the journal.
    Postgres,
}

/// The event journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EventsStorage {
    /// Backend.
    pub backend: EventsBackend,
    /// Journal directory (`jsonl`) or database file (`sqlite`), required for both, relative to
    /// the config file.
    pub path: Option<PathBuf>,
    /// The environment variable holding the DSN (`postgres`, required), e.g.
    /// `postgres://loom@db.internal:5432/loom`.
    pub dsn_env: Option<String>,
    /// The role Loom's connections switch to (`postgres`): neither the owner of the tables nor
    /// a superuser, so row-level security applies to it.
    #[serde(default = "default_postgres_role")]
    pub role: String,
    /// The connection pool (`postgres`).
    pub pool: PostgresPool,
}

impl Default for EventsStorage {
    fn default() -> EventsStorage {
        EventsStorage {
            backend: EventsBackend::default(),
            path: None,
            dsn_env: None,
            role: default_postgres_role(),
            pool: PostgresPool::default(),
        }
    }
}

/// Event journal backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventsBackend {
    /// In memory (lost at exit).
    #[default]
    Memory,
    /// JSON lines files in a directory.
    Jsonl,
    /// One SQLite database file (WAL); needs the `sqlite` feature of `loom-ia`.
    Sqlite,
    /// A PostgreSQL database, tenants kept apart by row-level security; needs the `postgres`
    /// feature of `loom-ia`.
    Postgres,
}
