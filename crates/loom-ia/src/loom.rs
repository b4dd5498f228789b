//! The [`Loom`] handle: configuration, journal, models and registered tools, and the
//! operations every access path (library, CLI, later REST and MCP) shares.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, RwLock},
};

use loom_config::{Config, EventsBackend, Profile};
use loom_core::{
    Event,
    approval::Approver,
    policy::Policy,
    ports::{ArtifactStore, EventStore, ToolSource},
    tool::{Tool, ToolDeclarations},
};
use loom_engine::{
    AgentRuntime, Attachment, AttachmentLimits, Engine, JudgeCondition, JudgeMode, RunRef,
};

use loom_journal::{JsonlStore, LocalArtifacts, MemoryArtifacts, MemoryStore};
use serde_json::{Map, Value};

use crate::{LoomError, RunResult, SystemClock, budget::TenantBudget};

mod attachments;
mod compact;
mod control;
mod eval;
mod lifecycle;
mod listen;
mod live;
mod reads;
mod ready;
mod registry;
mod replay;
mod reports;
mod run;
mod tenant;
mod work;

pub use eval::{EVAL_APPROVER, EvalOptions};
pub use lifecycle::Residents;
pub use live::{LIVE_BUFFER, LiveDelta};
pub use ready::{Readiness, ReadinessCheck};
pub use replay::{ReplayReport, RunSide, VariantOptions, VariantReport};
pub use work::WorkOptions;

/// Opens the `sqlite` journal the configuration names (creating the file and its schema).
#[cfg(feature = "sqlite")]
fn sqlite_store(config: &Config) -> Result<Arc<dyn EventStore>, LoomError> {
    match config.events_path() {
        Some(path) => Ok(Arc::new(loom_sqlite::SqliteStore::open(path)?)),
        None => Err(config
            .error_at_root("storage.events.path", "the sqlite journal needs a path")
            .into()),
    }
}

/// [`sqlite_store`] inside a tokio runtime: the file is set up without blocking a worker thread.
#[cfg(feature = "sqlite")]
async fn sqlite_store_async(config: &Config) -> Result<Arc<dyn EventStore>, LoomError> {
    match config.events_path() {
        Some(path) => Ok(Arc::new(loom_sqlite::SqliteStore::connect(path).await?)),
        None => sqlite_store(config),
    }
}

/// Without the `sqlite` feature, the `sqlite` journal is a configuration error.
#[cfg(not(feature = "sqlite"))]
async fn sqlite_store_async(config: &Config) -> Result<Arc<dyn EventStore>, LoomError> {
    sqlite_store(config)
}

/// Without the `sqlite` feature, the `sqlite` journal is a configuration error.
#[cfg(not(feature = "sqlite"))]
fn sqlite_store(config: &Config) -> Result<Arc<dyn EventStore>, LoomError> {
    Err(config
        .error_at_root(
            "storage.events.backend",
            "backend 'sqlite' needs the `sqlite` feature of loom-ia, which this build lacks \
             (loom-cli enables it by default)",
        )
        .into())
}

/// Opens the idempotency store the configuration names (`storage.idempotency`), if any.
#[cfg(feature = "sqlite")]
fn idempotency_store(
    config: &Config,
) -> Result<Option<Arc<dyn loom_core::ports::IdempotencyStore>>, LoomError> {
    if config.raw().storage.idempotency.is_none() {
        return Ok(None);
    }
    match config.idempotency_path() {
        Some(path) => Ok(Some(Arc::new(loom_sqlite::SqliteIdempotency::open(path)?))),
        None => Err(config
            .error_at_root(
                "storage.idempotency.path",
                "the sqlite idempotency store needs a path (or a sqlite journal to share)",
            )
            .into()),
    }
}

/// [`idempotency_store`] inside a tokio runtime: the file is set up without blocking a worker
/// thread.
#[cfg(feature = "sqlite")]
async fn idempotency_store_async(
    config: &Config,
) -> Result<Option<Arc<dyn loom_core::ports::IdempotencyStore>>, LoomError> {
    match config.idempotency_path() {
        Some(path) if config.raw().storage.idempotency.is_some() => Ok(Some(Arc::new(
            loom_sqlite::SqliteIdempotency::connect(path).await?,
        ))),
        _ => idempotency_store(config),
    }
}

/// Without the `sqlite` feature, `storage.idempotency` is a configuration error.
#[cfg(not(feature = "sqlite"))]
async fn idempotency_store_async(
    config: &Config,
) -> Result<Option<Arc<dyn loom_core::ports::IdempotencyStore>>, LoomError> {
    idempotency_store(config)
}

/// Without the `sqlite` feature, `storage.idempotency` is a configuration error.
#[cfg(not(feature = "sqlite"))]
fn idempotency_store(
    config: &Config,
) -> Result<Option<Arc<dyn loom_core::ports::IdempotencyStore>>, LoomError> {
    if config.raw().storage.idempotency.is_none() {
        return Ok(None);
    }
    Err(config
        .error_at_root(
            "storage.idempotency.backend",
            "backend 'sqlite' needs the `sqlite` feature of loom-ia, which this build lacks \
             (loom-cli enables it by default)",
        )
        .into())
}

/// The memory or JSONL journal the configuration declares (nothing to set up).
fn plain_store(config: &Config) -> Result<Arc<dyn EventStore>, LoomError> {
    match config.raw().storage.events.backend {
        EventsBackend::Jsonl => match config.events_path() {
            Some(path) => Ok(Arc::new(JsonlStore::new(path))),
            None => Err(config
                .error_at_root("storage.events.path", "the jsonl journal needs a path")
                .into()),
        },
        EventsBackend::Sqlite => sqlite_store(config),
        EventsBackend::Memory => Ok(Arc::new(MemoryStore::new())),
        // Opened by `crate::postgres` before this is asked; a configuration error otherwise.
        EventsBackend::Postgres => Err(config
            .error_at_root(
                "storage.events.backend",
                "the postgres journal is opened with its database (Loom::new, Loom::open)",
            )
            .into()),
    }
}

/// The tenant used when none is given.
pub const DEFAULT_TENANT: &str = "default";

/// Options of one run.
#[derive(Clone, Default)]
pub struct RunOptions {
    /// Continue this session: the run re-reads its conversation and appends to its journal.
    pub session_id: Option<String>,
    /// Choose the run id (refused if it exists in the session).
    pub run_id: Option<String>,
    /// Tenant (default `default`).
    pub tenant_id: Option<String>,
    /// End user, journaled in `run.started.context`.
    pub user_id: Option<String>,
    /// Caller metadata, journaled in `run.started.context`: at most 64 levels deep and 64 KiB
    /// as JSON ([`loom_core::limits`]), like every caller value (the message at most 1 MiB, the
    /// user id and attachment names 1 KiB); a value over a bound is refused
    /// ([`LoomError::Invalid`]) and nothing is written.
    pub metadata: Map<String, Value>,
    /// Decides approval requests inside the run (it then never pauses; requests and
    /// decisions are still journaled). Without one, a call that needs approval pauses the run.
    pub approver: Option<Arc<dyn Approver>>,
    /// Whether the agent's judges run as configured (`auto`), always (`force`) or never
    /// (`skip`, refused under the `prod` profile; a skipped judge still leaves a trace).
    pub judges: JudgeMode,
    /// Limits of this run (journaled in `run.started.budget`): they tighten the agent's run
    /// budget key by key.
    pub budget: Option<loom_core::event::RunBudget>,
    /// Files attached to the request (`execution.attachments` limits them; see
    /// [`Loom::read_attachment`]): stored beside the journal and referenced in the user's
    /// message, they reach the models that read images, and make the roles that declare
    /// `attachments` available.
    pub attachments: Vec<Attachment>,
    /// The trigger (webhook) opening the run, journaled in `run.started.trigger` (set by
    /// [`Loom::trigger`]).
    pub trigger: Option<String>,
    /// Session-state values set by the caller, journaled in `run.started.state`: each key must
    /// be one the agent declares (`state:`), its value follow the key's schema and the limits
    /// of `sessions.state`, and the agent's required keys have a value once it is applied;
    /// otherwise the run is refused ([`LoomError::Invalid`]) and nothing is written.
    pub state: Map<String, Value>,
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("session_id", &self.session_id)
            .field("run_id", &self.run_id)
            .field("tenant_id", &self.tenant_id)
            .field("user_id", &self.user_id)
            .field("metadata", &self.metadata)
            .field("approver", &self.approver.as_ref().map(|_| "inline"))
            .field("judges", &self.judges)
            .field("budget", &self.budget)
            .field("attachments", &self.attachments)
            .field("trigger", &self.trigger)
            .field("state", &self.state)
            .finish()
    }
}

/// A human decision on the approvals of a paused run, and what followed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    /// The calls decided.
    pub calls: Vec<String>,
    /// The run after the decision: driven on until it closes or pauses again, or, with
    /// `no_wait`, as the decision left it (still `paused`).
    pub result: RunResult,
}

/// What [`Loom::stream`] yields: journal events interleaved with the model's text deltas,
/// then the result.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem {
    /// An event, once durable in the journal.
    Event(Box<Event>),
    /// Text streamed by the model, before its answer is journaled.
    TextDelta {
        /// The run.
        run_id: String,
        /// The text.
        text: String,
    },
    /// The run closed (or stopped advancing); always the last item.
    Finished(Box<RunResult>),
}

/// What `validate` understood of the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Validation {
    /// The config file.
    pub file: PathBuf,
    /// Active profile.
    pub profile: Option<Profile>,
    /// The env file read with the configuration, and how many variables it sets.
    pub env_file: Option<(PathBuf, usize)>,
    /// `(id, sdk, provider model)` of each model.
    pub models: Vec<(String, String, String)>,
    /// Declared MCP servers.
    pub mcp_servers: Vec<String>,
    /// Each agent, resolved.
    pub agents: Vec<ValidatedAgent>,
    /// Registered tools.
    pub tools: Vec<String>,
    /// Where the journal lives.
    pub journal: String,
    /// The shared services declared beyond the journal, `(name, what)`: the job queue, the
    /// event bus, the shared limits (empty when everything is in process).
    pub services: Vec<(String, String)>,
    /// What each declared tenant gets (empty without a `tenants` list).
    pub tenants: Vec<ValidatedTenant>,
}

/// What one tenant gets, as `validate` shows it: never a secret's value.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedTenant {
    /// Its id.
    pub id: String,
    /// The agents it may run.
    pub agents: Vec<String>,
    /// The tools its runs are never offered (`tools_deny`).
    pub tools_deny: Vec<String>,
    /// Its model mapping, `(from, to)`.
    pub models: Vec<(String, String)>,
    /// Its approvals, `(tool, never|always|policy)`.
    pub approvals: Vec<(String, String)>,
    /// The secrets it reads from its own source: `(name, where, whether a value is there)`.
    pub secrets: Vec<(String, String, bool)>,
    /// The names of its prompt variables.
    pub variables: Vec<String>,
    /// Where its journal lives (`None`: the root journal).
    pub journal: Option<String>,
    /// Its `retention.events_days`, when it sets one.
    pub retention_days: Option<u32>,
    /// Its capture, when it overrides `telemetry.capture`: `(raw_exchanges, raw_max_bytes)`.
    pub capture: Option<(bool, u64)>,
}

/// An agent as `validate` resolved it.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedAgent {
    /// Name.
    pub name: String,
    /// The tenant it is shown for, with a `tenants` list: the first that may run it (its
    /// model mapping, tools and approvals apply); `None` without one.
    pub tenant: Option<String>,
    /// Orchestrating model id.
    pub model: String,
    /// Iteration cap.
    pub max_iterations: u32,
    /// Tools with their effective declarations.
    pub tools: Vec<(String, ToolDeclarations)>,
    /// Tool sources (MCP servers and `tool_sources`) with the tools they gave.
    pub sources: Vec<ValidatedSource>,
    /// What surrounds the loop, one line each: roles, sub-agents, policies (with their
    /// points), the output contract, judges, budgets.
    pub guards: Vec<String>,
}

/// A tool source as `validate` found it.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedSource {
    /// Name (server or source name, or the agent's alias for it).
    pub name: String,
    /// What it is: `mcp` for an MCP server, else the `kind` of its `tool_sources` entry
    /// (`openapi`, `forge`, or a kind registered with `Loom::register_source`).
    pub kind: String,
    /// Whether the agent requires it.
    pub required: bool,
    /// Its tools, named as the model sees them, with their effective declarations.
    pub tools: Vec<(String, ToolDeclarations)>,
    /// Why it could not be reached.
    pub error: Option<String>,
}

/// A Loom instance: a cheap, cloneable handle.
#[derive(Clone)]
pub struct Loom {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    engine: Engine,
    models: crate::resolve::Models,
    sources: BTreeMap<String, Arc<dyn ToolSource>>,
    /// `tool_sources`: their factories and the sources built per tenant.
    tool_sources: Arc<crate::tool_sources::ToolSources>,
    tools: RwLock<BTreeMap<String, Arc<dyn Tool>>>,
    policies: RwLock<BTreeMap<String, Arc<dyn Policy>>>,
    conditions: RwLock<BTreeMap<String, Arc<dyn JudgeCondition>>>,
    agents: RwLock<HashMap<(String, String), Arc<AgentRuntime>>>,
    active: Mutex<HashMap<RunRef, loom_engine::Cancel>>,
    /// Woken each time a run leaves `active` ([`Loom::stop`] waits on it).
    idle: tokio::sync::Notify,
    tenant_budgets: RwLock<BTreeMap<String, TenantBudget>>,
    /// The counters of `storage.limits`: tenant quotas, key rate limits, tenant budget sums.
    counters: Arc<dyn loom_core::counters::Counters>,
    /// The signing secrets of the triggers with a `secret_env`, read when the instance is
    /// built.
    trigger_secrets: crate::trigger::Secrets,
    /// The job queue, once connected (`storage.queue: rabbitmq`) or given
    /// ([`Loom::with_queue`]); empty with `asyncio`.
    queue: tokio::sync::OnceCell<Arc<dyn loom_core::queue::JobQueue>>,
    /// The event bus (`storage.bus`).
    bus: Arc<dyn loom_core::bus::EventBus>,
    /// Whether the bus reaches other processes.
    bus_shared: bool,
    /// The local fan-out of journal notices to followers.
    notices: Arc<crate::notify::Notices>,
    /// Whether the subscription task runs ([`Loom::listen`]).
    listening: std::sync::atomic::AtomicBool,
    /// Ends the subscription task when the instance goes.
    stop_listening: tokio_util::sync::CancellationToken,
    /// The compactions this process runs in the background ([`Loom::compactions_idle`]).
    compactions: compact::Tasks,
    /// Where root runs' traces are exported (`telemetry.exporters`, feature `otel`).
    telemetry: Option<Arc<crate::telemetry::Telemetry>>,
    /// The text deltas of the runs this process drives, for live listeners.
    live: live::Live,
}

/// The stores [`Loom::open`] opened, before the instance is assembled around them.
struct Stores {
    store: Arc<dyn EventStore>,
    idempotency: Option<Arc<dyn loom_core::ports::IdempotencyStore>>,
    tenants: crate::routing::TenantStores,
    artifacts: Option<Arc<dyn ArtifactStore>>,
}

impl Stores {
    /// The stores of `config`, and the PostgreSQL bus when it declares one.
    async fn open(
        config: &Config,
    ) -> Result<(Stores, Option<Arc<dyn loom_core::bus::EventBus>>), LoomError> {
        let mut postgres = crate::postgres::open(config).await?;
        let store: Arc<dyn EventStore> =
            match (postgres.journal.take(), config.raw().storage.events.backend) {
                (Some(store), _) => store,
                (None, EventsBackend::Sqlite) => sqlite_store_async(config).await?,
                (None, _) => plain_store(config)?,
            };
        let idempotency = match postgres.idempotency.take() {
            Some(idempotency) => Some(idempotency),
            None => match crate::counters::idempotency(config)? {
                Some(idempotency) => Some(idempotency),
                None => idempotency_store_async(config).await?,
            },
        };
        let tenants = crate::routing::tenant_stores_async(config).await?;
        let stores = Stores {
            store,
            idempotency,
            tenants,
            artifacts: postgres.artifacts,
        };
        Ok((stores, postgres.bus))
    }

    fn assemble(self, config: Config, bus: crate::bus::Bus) -> Result<Loom, LoomError> {
        Loom::assemble(
            config,
            self.store,
            self.idempotency,
            self.tenants,
            self.artifacts,
            bus,
        )
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop_listening.cancel();
    }
}

impl std::fmt::Debug for Loom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loom")
            .field("config", &self.inner.config.file())
            .field("worker_id", &self.inner.engine.worker_id())
            .finish_non_exhaustive()
    }
}

impl Loom {
    /// Loads `loom.yaml` (profile from `LOOM_PROFILE`, else the file) and opens its journal.
    pub fn from_config(path: impl AsRef<Path>) -> Result<Loom, LoomError> {
        Loom::from_config_with(path, None)
    }

    /// Loads with an explicit profile, which wins over `LOOM_PROFILE` and the file.
    pub fn from_config_with(
        path: impl AsRef<Path>,
        profile: Option<Profile>,
    ) -> Result<Loom, LoomError> {
        let env = |name: &str| std::env::var(name).ok();
        let config = loom_config::load(path.as_ref(), profile, &env)?;
        Loom::new(config)
    }

    /// A Loom over a validated configuration (built from a file or in Rust), with the journal
    /// the configuration declares. Opening a SQLite file blocks the calling thread until it is
    /// set up: inside a tokio runtime, use [`Loom::open`].
    pub fn new(config: Config) -> Result<Loom, LoomError> {
        let mut postgres = crate::postgres::open_blocking(&config)?;
        let store: Arc<dyn EventStore> =
            match (postgres.journal.take(), config.raw().storage.events.backend) {
                (Some(store), _) => store,
                (None, EventsBackend::Sqlite) => sqlite_store(&config)?,
                (None, _) => plain_store(&config)?,
            };
        let idempotency = match postgres.idempotency.take() {
            Some(idempotency) => Some(idempotency),
            None => match crate::counters::idempotency(&config)? {
                Some(idempotency) => Some(idempotency),
                None => idempotency_store(&config)?,
            },
        };
        let tenants = crate::routing::tenant_stores(&config)?;
        let bus = crate::bus::event_bus(&config, postgres.bus)?;
        Loom::assemble(config, store, idempotency, tenants, postgres.artifacts, bus)
    }

    /// [`Loom::new`] for a caller inside a tokio runtime (a server, the CLI): SQLite files (the
    /// journal, the idempotency store) are set up without blocking a worker thread.
    pub async fn open(config: Config) -> Result<Loom, LoomError> {
        let (stores, postgres_bus) = Stores::open(&config).await?;
        let bus = crate::bus::event_bus(&config, postgres_bus)?;
        stores.assemble(config, bus)
    }

    /// [`Loom::open`] with the event bus of the caller's choice instead of the one
    /// `storage.bus` declares (a bus on a channel of its own, say).
    pub async fn open_with_bus(
        config: Config,
        bus: Arc<dyn loom_core::bus::EventBus>,
    ) -> Result<Loom, LoomError> {
        let (stores, _) = Stores::open(&config).await?;
        stores.assemble(config, crate::bus::Bus { bus, shared: true })
    }

    /// [`Loom::from_config_with`] for a caller inside a tokio runtime (see [`Loom::open`]).
    pub async fn open_config(
        path: impl AsRef<Path>,
        profile: Option<Profile>,
    ) -> Result<Loom, LoomError> {
        let options = loom_config::LoadOptions {
            profile,
            ..loom_config::LoadOptions::default()
        };
        Loom::open_config_with(path, &options).await
    }

    /// [`Loom::open_config`] with the env file chosen (`--env-file F`, `--no-env-file`; see
    /// [`loom_config::EnvFile`]): its variables fill in what the process environment lacks,
    /// for `LOOM_PROFILE` and every variable the configuration names.
    pub async fn open_config_with(
        path: impl AsRef<Path>,
        options: &loom_config::LoadOptions,
    ) -> Result<Loom, LoomError> {
        let env = |name: &str| std::env::var(name).ok();
        let config = loom_config::load_with(path.as_ref(), options, &env)?;
        Loom::open(config).await
    }

    /// `name` as the configuration sees it: from the process environment, else from the env
    /// file read with it ([`Config::env_file`]).
    pub fn env_var(&self, name: &str) -> Option<String> {
        crate::env::var(self.config(), name)
    }

    /// A Loom over a configuration and a journal of the caller's choice (the tenants that
    /// declare their own storage, `tenants[].storage`, still use theirs).
    ///
    /// Every agent is resolved here, so that what the configuration alone decides (a judge on
    /// a role, a tool's `on_failure`, an MCP tool's contract, `local_files` rights…) is
    /// refused now rather than at the first run; what depends on code registered later is
    /// checked by [`Loom::check_agents`], [`Loom::validate`] and each run.
    pub fn with_store(config: Config, store: Arc<dyn EventStore>) -> Result<Loom, LoomError> {
        let postgres = crate::postgres::open_blocking(&config)?;
        let idempotency = match postgres.idempotency {
            Some(idempotency) => Some(idempotency),
            None => match crate::counters::idempotency(&config)? {
                Some(idempotency) => Some(idempotency),
                None => idempotency_store(&config)?,
            },
        };
        let tenants = crate::routing::tenant_stores(&config)?;
        let bus = crate::bus::event_bus(&config, postgres.bus)?;
        Loom::assemble(config, store, idempotency, tenants, postgres.artifacts, bus)
    }

    fn assemble(
        config: Config,
        store: Arc<dyn EventStore>,
        idempotency: Option<Arc<dyn loom_core::ports::IdempotencyStore>>,
        tenants: crate::routing::TenantStores,
        artifacts: Option<Arc<dyn ArtifactStore>>,
        bus: crate::bus::Bus,
    ) -> Result<Loom, LoomError> {
        let models = crate::resolve::models(&config)?;
        let sources = mcp_servers(&config)?;
        let tool_sources = Arc::new(crate::tool_sources::ToolSources::default());
        crate::resolve::check_at_open(&config, &models, &sources, &tool_sources)?;
        let trigger_secrets = crate::trigger::secrets(&config)?;
        let telemetry = crate::telemetry::telemetry(&config)?;
        let mut artifacts: Arc<dyn ArtifactStore> = match (artifacts, config.artifacts_path()) {
            (Some(artifacts), _) => artifacts,
            (None, Some(path)) => Arc::new(LocalArtifacts::new(path)),
            (None, None) => Arc::new(MemoryArtifacts::new()),
        };
        let mut store = store;
        if !tenants.is_empty() {
            // Each tenant with its own storage is sent to it, the others to the root stores.
            let (events, files) = tenants
                .into_iter()
                .map(|(tenant, (events, files))| ((tenant.clone(), events), (tenant, files)))
                .unzip();
            store = Arc::new(crate::routing::RoutedEvents::new(store, events));
            artifacts = Arc::new(crate::routing::RoutedArtifacts::new(artifacts, files));
        }
        // Sealing wraps the routing: a tenant's own journal is sealed with its keys too.
        let (store, artifacts) = crate::sealing::seal(&config, store, artifacts)?;
        let counters = crate::counters::counters(&config)?;
        // Spending is added to the tenants' budget sums as it is journaled (outside the
        // sealing: the counting journal reads payloads in clear).
        let store = crate::counting::counting(&config, store, counters.clone());
        // Outermost, so that every append of every tenant is announced.
        let notices = Arc::new(crate::notify::Notices::new());
        let store: Arc<dyn EventStore> = Arc::new(crate::notify::NotifyingStore::wrap(
            store,
            bus.bus.clone(),
            notices.clone(),
        ));
        let lease =
            std::time::Duration::try_from_secs_f64(config.raw().execution.lease).map_err(|_| {
                LoomError::from(config.error_at_root("execution.lease", "not a usable duration"))
            })?;
        let attachments = &config.raw().execution.attachments;
        let mut engine = Engine::new(store, Arc::new(SystemClock))
            .with_artifacts(artifacts)
            .with_lease(lease)
            .with_snapshots(Some(config.raw().sessions.snapshot_every))
            .with_attachment_limits(AttachmentLimits {
                max_bytes: attachments.max_bytes,
                types: attachments.types.clone(),
                max_files: usize::try_from(attachments.max_files).unwrap_or(usize::MAX),
            });
        if let Some(idempotency) = idempotency {
            engine = engine.with_idempotency(idempotency);
        }
        engine = engine.with_history_caps(crate::resolve::history_caps(&config));
        // Tool calls carry their span's trace context only when the spans are exported.
        engine = engine.with_trace_context(telemetry.is_some());
        let tenant_budgets = crate::resolve::tenant_budgets(&config);
        Ok(Loom {
            inner: Arc::new(Inner {
                config,
                engine,
                models,
                sources,
                tool_sources,
                tools: RwLock::new(BTreeMap::new()),
                policies: RwLock::new(BTreeMap::new()),
                conditions: RwLock::new(BTreeMap::new()),
                agents: RwLock::new(HashMap::new()),
                active: Mutex::new(HashMap::new()),
                idle: tokio::sync::Notify::new(),
                tenant_budgets: RwLock::new(tenant_budgets),
                counters,
                trigger_secrets,
                queue: tokio::sync::OnceCell::new(),
                bus: bus.bus,
                bus_shared: bus.shared,
                notices,
                listening: std::sync::atomic::AtomicBool::new(false),
                stop_listening: tokio_util::sync::CancellationToken::new(),
                compactions: compact::Tasks::default(),
                telemetry,
                live: live::Live::default(),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The signing secret of the trigger `name` (the value of its `secret_env`, read when this
    /// instance was built), when it declares one: its deliveries must then be signed with it.
    pub fn trigger_secret(&self, name: &str) -> Option<&[u8]> {
        self.inner.trigger_secrets.get(name)
    }

    /// The counters of `storage.limits` (in this process, or shared through Redis): the access
    /// crates count their API keys' rate limits there.
    pub fn counters(&self) -> &Arc<dyn loom_core::counters::Counters> {
        &self.inner.counters
    }

    /// This instance's worker id.
    pub fn worker_id(&self) -> &str {
        self.inner.engine.worker_id()
    }

    /// Whether this instance drives `run` now.
    pub(crate) fn is_driving(&self, run: &RunRef) -> bool {
        self.inner
            .active
            .lock()
            .map(|a| a.contains_key(run))
            .unwrap_or(true)
    }

    /// The journal.
    pub(crate) fn store(&self) -> &Arc<dyn EventStore> {
        self.inner.engine.store()
    }

    /// `execution.lease`.
    pub(crate) fn lease(&self) -> std::time::Duration {
        self.inner.engine.lease()
    }

    /// The events `run` and its sub-runs fold from (see [`Engine::read_run`]).
    pub(crate) async fn read_run(&self, run: &RunRef) -> Result<Vec<loom_core::Event>, LoomError> {
        Ok(self.inner.engine.read_run(run).await?)
    }

    /// The events of a session from its last snapshot on (see [`Engine::read_latest`]).
    pub(crate) async fn read_latest(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<Vec<loom_core::Event>, LoomError> {
        Ok(self.inner.engine.read_latest(tenant, session).await?)
    }

    /// The journal this instance writes to.
    pub(crate) fn event_store(&self) -> Arc<dyn EventStore> {
        self.inner.engine.store().clone()
    }

    /// Where this instance stores files, if anywhere.
    pub(crate) fn artifact_store(&self) -> Option<Arc<dyn ArtifactStore>> {
        self.inner.engine.artifacts().cloned()
    }
}

#[cfg(feature = "mcp")]
fn mcp_servers(config: &Config) -> Result<BTreeMap<String, Arc<dyn ToolSource>>, LoomError> {
    crate::mcp::servers(config)
}

#[cfg(not(feature = "mcp"))]
fn mcp_servers(config: &Config) -> Result<BTreeMap<String, Arc<dyn ToolSource>>, LoomError> {
    match config.raw().mcp_servers.first() {
        Some(_) => Err(config
            .error_at_root(
                "mcp_servers[0]",
                "MCP servers need the Cargo feature 'mcp' of loom-ia, which this build does not have",
            )
            .into()),
        None => Ok(BTreeMap::new()),
    }
}
