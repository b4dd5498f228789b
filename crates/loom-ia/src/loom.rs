//! The [`Loom`] handle: configuration, journal, models and registered tools, and the
//! operations every access path (library, CLI, later REST and MCP) shares.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, RwLock},
};

use crate::SessionListed;
use loom_config::{Config, EventsBackend, Profile};
use loom_core::{
    BoxStream, Event, Message, RunState,
    approval::{Approver, Decision},
    ids::is_valid_name,
    policy::Policy,
    ports::{ArtifactStore, EventStore, SourceContext, ToolSource},
    tool::{Tool, ToolDeclarations},
};
use loom_engine::{
    AgentRuntime, Attachment, AttachmentLimits, BeginRun, Engine, JudgeCondition, JudgeMode,
    Observer, RunRef,
};
use loom_journal::{JsonlStore, LocalArtifacts, MemoryArtifacts, MemoryStore};
use serde_json::{Map, Value};

use crate::{
    LoomError, RunResult, SystemClock,
    budget::{Period, TenantBudget},
    report,
};

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
}

/// An agent as `validate` resolved it.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedAgent {
    /// Name.
    pub name: String,
    /// Orchestrating model id.
    pub model: String,
    /// Iteration cap.
    pub max_iterations: u32,
    /// Tools with their effective declarations.
    pub tools: Vec<(String, ToolDeclarations)>,
    /// Tool sources (MCP servers) with the tools they gave.
    pub sources: Vec<ValidatedSource>,
    /// What surrounds the loop, one line each: roles, sub-agents, policies (with their
    /// points), the output contract, judges, budgets.
    pub guards: Vec<String>,
}

/// A tool source as `validate` found it.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedSource {
    /// Name (server name or alias).
    pub name: String,
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
    tools: RwLock<BTreeMap<String, Arc<dyn Tool>>>,
    policies: RwLock<BTreeMap<String, Arc<dyn Policy>>>,
    conditions: RwLock<BTreeMap<String, Arc<dyn JudgeCondition>>>,
    agents: RwLock<HashMap<(String, String), Arc<AgentRuntime>>>,
    active: Mutex<HashMap<RunRef, loom_engine::Cancel>>,
    /// Woken each time a run leaves `active` ([`Loom::stop`] waits on it).
    idle: tokio::sync::Notify,
    tenant_budgets: RwLock<BTreeMap<String, TenantBudget>>,
    quotas: crate::quota::SlidingMinute,
    /// The signing secrets of the triggers with a `secret_env`, read when the instance is
    /// built.
    trigger_secrets: crate::trigger::Secrets,
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
        let store: Arc<dyn EventStore> = match config.raw().storage.events.backend {
            EventsBackend::Sqlite => sqlite_store(&config)?,
            _ => plain_store(&config)?,
        };
        Loom::with_store(config, store)
    }

    /// [`Loom::new`] for a caller inside a tokio runtime (a server, the CLI): SQLite files (the
    /// journal, the idempotency store) are set up without blocking a worker thread.
    pub async fn open(config: Config) -> Result<Loom, LoomError> {
        let store: Arc<dyn EventStore> = match config.raw().storage.events.backend {
            EventsBackend::Sqlite => sqlite_store_async(&config).await?,
            _ => plain_store(&config)?,
        };
        let idempotency = idempotency_store_async(&config).await?;
        Loom::assemble(config, store, idempotency)
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

    /// A Loom over a configuration and a journal of the caller's choice.
    ///
    /// Every agent is resolved here, so that what the configuration alone decides (a judge on
    /// a role, a tool's `on_failure`, an MCP tool's contract, `local_files` rights…) is
    /// refused now rather than at the first run; what depends on code registered later is
    /// checked by [`Loom::check_agents`], [`Loom::validate`] and each run.
    pub fn with_store(config: Config, store: Arc<dyn EventStore>) -> Result<Loom, LoomError> {
        let idempotency = idempotency_store(&config)?;
        Loom::assemble(config, store, idempotency)
    }

    fn assemble(
        config: Config,
        store: Arc<dyn EventStore>,
        idempotency: Option<Arc<dyn loom_core::ports::IdempotencyStore>>,
    ) -> Result<Loom, LoomError> {
        let models = crate::resolve::models(&config)?;
        let sources = mcp_servers(&config)?;
        crate::resolve::check_at_open(&config, &models, &sources)?;
        let trigger_secrets = crate::trigger::secrets(&config)?;
        let artifacts: Arc<dyn ArtifactStore> = match config.artifacts_path() {
            Some(path) => Arc::new(LocalArtifacts::new(path)),
            None => Arc::new(MemoryArtifacts::new()),
        };
        let lease =
            std::time::Duration::try_from_secs_f64(config.raw().execution.lease).map_err(|_| {
                LoomError::from(config.error_at_root("execution.lease", "not a usable duration"))
            })?;
        let attachments = &config.raw().execution.attachments;
        let mut engine = Engine::new(store, Arc::new(SystemClock))
            .with_artifacts(artifacts)
            .with_lease(lease)
            .with_attachment_limits(AttachmentLimits {
                max_bytes: attachments.max_bytes,
                types: attachments.types.clone(),
                max_files: usize::try_from(attachments.max_files).unwrap_or(usize::MAX),
            });
        if let Some(idempotency) = idempotency {
            engine = engine.with_idempotency(idempotency);
        }
        let tenant_budgets = crate::resolve::tenant_budgets(&config);
        Ok(Loom {
            inner: Arc::new(Inner {
                config,
                engine,
                models,
                sources,
                tools: RwLock::new(BTreeMap::new()),
                policies: RwLock::new(BTreeMap::new()),
                conditions: RwLock::new(BTreeMap::new()),
                agents: RwLock::new(HashMap::new()),
                active: Mutex::new(HashMap::new()),
                idle: tokio::sync::Notify::new(),
                tenant_budgets: RwLock::new(tenant_budgets),
                quotas: crate::quota::SlidingMinute::default(),
                trigger_secrets,
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

    /// This instance's worker id.
    pub fn worker_id(&self) -> &str {
        self.inner.engine.worker_id()
    }

    /// Sets `tenant`'s period ceilings (replacing any it had): a run of the tenant is refused
    /// ([`LoomError::BudgetExhausted`], nothing written) once the root runs it started in the
    /// current UTC day or month spent as much. Applies to every clone of this instance.
    pub fn with_tenant_budget(self, tenant: impl Into<String>, budget: TenantBudget) -> Loom {
        if let Ok(mut budgets) = self.inner.tenant_budgets.write() {
            budgets.insert(tenant.into(), budget);
        }
        self
    }

    /// The period ceilings of `tenant`, if any.
    pub fn tenant_budget(&self, tenant: &str) -> Option<TenantBudget> {
        self.inner
            .tenant_budgets
            .read()
            .ok()
            .and_then(|b| b.get(tenant).copied())
    }

    /// Opens a run once the tenant's budgets and quota allow it (a refused run writes nothing,
    /// and a run that could not be opened gives its quota slot back).
    async fn open_run(
        &self,
        runtime: &AgentRuntime,
        begin: BeginRun,
        observer: &dyn Observer,
    ) -> Result<RunRef, LoomError> {
        let tenant = begin.tenant_id.clone();
        self.check_tenant_budget(&tenant).await?;
        let slot = self.take_quota(&tenant)?;
        match self.inner.engine.begin(runtime, begin, observer).await {
            Ok(run) => Ok(run),
            Err(error) => {
                if let Some(at) = slot {
                    self.inner.quotas.give_back(&tenant, at);
                }
                Err(error.into())
            }
        }
    }

    /// Takes a slot of `tenant`'s `quotas.runs_per_minute` (`None`: the tenant has no quota),
    /// or refuses with [`LoomError::QuotaExceeded`].
    fn take_quota(&self, tenant: &str) -> Result<Option<std::time::Instant>, LoomError> {
        let Some(limit) = self
            .inner
            .config
            .tenant(tenant)
            .and_then(|t| t.quotas)
            .and_then(|q| q.runs_per_minute)
        else {
            return Ok(None);
        };
        match self
            .inner
            .quotas
            .take(tenant, limit, std::time::Instant::now())
        {
            Ok(at) => Ok(Some(at)),
            Err(retry_after) => {
                tracing::info!(tenant, limit, "run refused: tenant quota reached");
                Err(LoomError::QuotaExceeded {
                    tenant: tenant.to_owned(),
                    limit,
                    retry_after,
                })
            }
        }
    }

    /// Refuses a run of `tenant` when it reached one of its period ceilings.
    async fn check_tenant_budget(&self, tenant: &str) -> Result<(), LoomError> {
        let Some(budget) = self.tenant_budget(tenant).filter(|b| !b.is_empty()) else {
            return Ok(());
        };
        let now = chrono::Utc::now();
        let from = crate::budget::scan_from(&budget, now);
        let mut runs = Vec::new();
        for (session, events) in self.tenant_sessions(tenant, from).await? {
            match loom_engine::budget::root_runs_spent(&events) {
                Ok(spent) => runs.extend(spent.into_iter().filter(|r| r.started_at >= from)),
                // One broken session does not stop the tenant: its spending is not counted.
                Err(error) => {
                    tracing::warn!(tenant, session, %error, "session left out of the tenant budget: it cannot be folded");
                }
            }
        }
        match crate::budget::exhausted(&budget, &runs, now) {
            None => Ok(()),
            Some(hit) => {
                tracing::info!(tenant, period = %hit.period, "run refused: tenant budget reached");
                Err(LoomError::BudgetExhausted {
                    tenant: tenant.to_owned(),
                    period: hit.period,
                    spent: hit.spent,
                    limit: hit.limit,
                    retry_in: hit.retry_in,
                })
            }
        }
    }

    /// The journals of `tenant`'s sessions written to since `since` (a session last written
    /// before cannot hold a run started after), as `(session id, events)`; a corrupted journal
    /// is left out with a warning naming its file and line.
    async fn tenant_sessions(
        &self,
        tenant: &str,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<(String, Vec<Event>)>, LoomError> {
        let store = self.inner.engine.store();
        let mut sessions = Vec::new();
        for session in store.sessions(tenant).await? {
            if session.updated_at.is_some_and(|at| at < since) {
                continue;
            }
            if let Some(events) =
                crate::journals::read_listed(store.as_ref(), tenant, &session.session_id).await?
            {
                sessions.push((session.session_id, events));
            }
        }
        Ok(sessions)
    }

    /// Registers a tool under `name` (the name agents reference and the model sees).
    pub fn register(&self, name: &str, tool: impl Tool + 'static) -> Result<(), LoomError> {
        self.register_arc(name, Arc::new(tool))
    }

    /// Registers a shared tool under `name`.
    pub fn register_arc(&self, name: &str, tool: Arc<dyn Tool>) -> Result<(), LoomError> {
        if !is_valid_name(name) {
            return Err(LoomError::Registration(format!(
                "'{name}' is not a valid tool name (^[A-Za-z0-9_-]{{1,64}}$)"
            )));
        }
        if tool.spec().name != name {
            return Err(LoomError::Registration(format!(
                "the tool '{}' cannot be registered as '{name}': register it under its own name \
                 (or build it with #[tool(name = \"{name}\")])",
                tool.spec().name
            )));
        }
        let mut tools = self
            .inner
            .tools
            .write()
            .map_err(|_| LoomError::Registration("registry lock poisoned".into()))?;
        if tools.contains_key(name) {
            return Err(LoomError::Registration(format!(
                "a tool named '{name}' is already registered"
            )));
        }
        tools.insert(name.to_owned(), tool);
        drop(tools);
        if let Ok(mut agents) = self.inner.agents.write() {
            agents.clear();
        }
        Ok(())
    }

    /// Registers a policy under `name`, the `hook` agents reference in their `policies:`
    /// (names starting with `loom.` are reserved for the built-in ones).
    pub fn register_policy(&self, name: &str, policy: Arc<dyn Policy>) -> Result<(), LoomError> {
        if name.starts_with("loom.") || !is_valid_policy_name(name) {
            return Err(LoomError::Registration(format!(
                "'{name}' is not a valid policy name (^[A-Za-z0-9_][A-Za-z0-9_.-]{{0,63}}$, \
                 not starting with 'loom.')"
            )));
        }
        let mut policies = self
            .inner
            .policies
            .write()
            .map_err(|_| LoomError::Registration("registry lock poisoned".into()))?;
        if policies.contains_key(name) {
            return Err(LoomError::Registration(format!(
                "a policy named '{name}' is already registered"
            )));
        }
        policies.insert(name.to_owned(), policy);
        drop(policies);
        if let Ok(mut agents) = self.inner.agents.write() {
            agents.clear();
        }
        Ok(())
    }

    /// Registers a judge condition under `name`, the `when.condition` of judges: the judge
    /// runs only when it holds.
    pub fn register_condition(
        &self,
        name: &str,
        condition: Arc<dyn JudgeCondition>,
    ) -> Result<(), LoomError> {
        let mut conditions = self
            .inner
            .conditions
            .write()
            .map_err(|_| LoomError::Registration("registry lock poisoned".into()))?;
        if conditions.contains_key(name) {
            return Err(LoomError::Registration(format!(
                "a condition named '{name}' is already registered"
            )));
        }
        conditions.insert(name.to_owned(), condition);
        drop(conditions);
        if let Ok(mut agents) = self.inner.agents.write() {
            agents.clear();
        }
        Ok(())
    }

    /// The registered policies, by name.
    pub(crate) fn policies(&self) -> BTreeMap<String, Arc<dyn Policy>> {
        self.inner
            .policies
            .read()
            .map(|p| p.clone())
            .unwrap_or_default()
    }

    /// Resolves every agent against the registered tools, policies and conditions, as a run
    /// would (without connecting to MCP servers): the first problem is returned. `loom serve`
    /// and `loom mcp` call it before they serve, so that a configuration a run would refuse
    /// never starts a server.
    pub fn check_agents(&self) -> Result<(), LoomError> {
        for spec in self.inner.config.agents() {
            self.agent(&spec.name, DEFAULT_TENANT)?;
        }
        Ok(())
    }

    /// Resolves every agent against the registered tools, as a run would, connects to the MCP
    /// servers its agents use, and reports what was understood. The first configuration problem
    /// is returned as an error; an unreachable server is reported, not an error.
    pub async fn validate(&self) -> Result<Validation, LoomError> {
        let config = &self.inner.config;
        let mut agents = Vec::new();
        for spec in config.agents() {
            let runtime = self.agent(&spec.name, DEFAULT_TENANT)?;
            let mut sources = Vec::new();
            let context = SourceContext {
                tenant_id: DEFAULT_TENANT.to_owned(),
                session_id: "validate".to_owned(),
                run_id: "validate".to_owned(),
            };
            for bound in &runtime.sources {
                let listed = bound.source.open(&context).await;
                bound.source.release(&context).await;
                sources.push(ValidatedSource {
                    name: bound.source.name().to_owned(),
                    required: bound.required,
                    tools: match &listed {
                        Ok(tools) => tools
                            .iter()
                            .map(|t| (t.spec().name.clone(), t.spec().declarations.clone()))
                            .collect(),
                        Err(_) => Vec::new(),
                    },
                    error: listed.err().map(|e| e.message),
                });
            }
            agents.push(ValidatedAgent {
                name: runtime.name.clone(),
                model: runtime.main.config_id.clone(),
                max_iterations: runtime.max_iterations,
                tools: runtime
                    .tools
                    .iter()
                    .map(|t| (t.name().to_owned(), t.declarations.clone()))
                    .collect(),
                sources,
                guards: guards_of(&runtime),
            });
        }
        let journal = match config.raw().storage.events.backend {
            EventsBackend::Memory => "memory (lost at exit)".to_owned(),
            EventsBackend::Jsonl => format!(
                "jsonl in {}",
                config
                    .events_path()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            ),
            EventsBackend::Sqlite => format!(
                "sqlite in {}",
                config
                    .events_path()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            ),
        };
        Ok(Validation {
            file: config.file().to_path_buf(),
            profile: config.profile(),
            env_file: config
                .env_file()
                .path()
                .map(|path| (path.to_path_buf(), config.env_file().names().count())),
            models: config
                .raw()
                .models
                .iter()
                .map(|m| (m.id.clone(), m.sdk.as_str().to_owned(), m.model.clone()))
                .collect(),
            mcp_servers: config
                .raw()
                .mcp_servers
                .iter()
                .map(|m| m.name.clone())
                .collect(),
            agents,
            tools: self.tool_names(),
            journal,
        })
    }

    fn tool_names(&self) -> Vec<String> {
        self.inner
            .tools
            .read()
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// What opens a run: the tenant (declared, allowed to use the agent), the caller's
    /// judge mode (`skip` refused in `prod`), the resolved agent and the engine's request.
    fn opening(
        &self,
        agent: &str,
        message: String,
        options: RunOptions,
    ) -> Result<(Arc<AgentRuntime>, BeginRun), LoomError> {
        crate::limits::check_run(&message, &options)?;
        let tenant = options
            .tenant_id
            .clone()
            .unwrap_or_else(|| DEFAULT_TENANT.to_owned());
        let config = &self.inner.config;
        config
            .check_tenant(&tenant)
            .map_err(|e| LoomError::Refused(e.to_string()))?;
        if let Some(spec) = config.tenant(&tenant)
            && !spec.allows_agent(agent)
        {
            return Err(LoomError::AgentNotAllowed {
                tenant,
                agent: agent.to_owned(),
            });
        }
        options
            .judges
            .check(config.profile().map(|p| p.as_str()))
            .map_err(|e| LoomError::Refused(e.to_string()))?;
        let runtime = self.agent(agent, &tenant)?;
        let begin = BeginRun {
            tenant_id: tenant,
            session_id: options.session_id,
            run_id: options.run_id,
            user_id: options.user_id,
            metadata: options.metadata,
            message: Message::user(message),
            judges: options.judges,
            budget: options.budget,
            attachments: options.attachments,
            trigger: options.trigger,
        };
        Ok((runtime, begin))
    }

    /// Reads the file at `path` as an attachment for [`RunOptions::attachments`]: named after
    /// the file, its media type read from its first bytes, else from its extension. Refused
    /// ([`LoomError::Invalid`], nothing read beyond the limit) when the file cannot be read, is
    /// larger than `execution.attachments.max_bytes`, or is of a type that is not recognised or
    /// not in `execution.attachments.types`; each refusal names the file and the limit.
    pub fn read_attachment(&self, path: &Path) -> Result<Attachment, LoomError> {
        use std::io::Read;
        let shown = path.display();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| shown.to_string());
        let unreadable = |e: std::io::Error| {
            LoomError::Invalid(format!("attachment '{shown}' cannot be read: {e}"))
        };
        let limits = self.attachment_limits();
        let file = std::fs::File::open(path).map_err(unreadable)?;
        let size = file.metadata().map_err(unreadable)?.len();
        if size > limits.max_bytes {
            return Err(LoomError::Invalid(too_large(&name, size, limits.max_bytes)));
        }
        let mut bytes = Vec::new();
        file.take(limits.max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(unreadable)?;
        self.attachment(name, bytes, None)
    }

    /// An attachment for [`RunOptions::attachments`] from bytes received elsewhere (an upload):
    /// its media type is read from its first bytes, else from the name's extension, else taken
    /// from `declared` (what the sender said, `application/octet-stream` ignored). Checked like
    /// [`Loom::read_attachment`] (size, accepted types, an image's bytes matching its type),
    /// with the same refusals ([`LoomError::Invalid`]) naming the file and the limit.
    pub fn attachment(
        &self,
        name: impl Into<String>,
        bytes: Vec<u8>,
        declared: Option<&str>,
    ) -> Result<Attachment, LoomError> {
        let name = name.into();
        let limits = self.attachment_limits();
        let size = bytes.len() as u64;
        if size > limits.max_bytes {
            return Err(LoomError::Invalid(too_large(&name, size, limits.max_bytes)));
        }
        let declared = declared
            .map(|t| {
                t.split(';')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_ascii_lowercase()
            })
            .filter(|t| !t.is_empty() && t != "application/octet-stream");
        let detected = loom_engine::attachments::sniff_media_type(&bytes)
            .or_else(|| loom_engine::attachments::media_type_of_name(&name))
            .map(str::to_owned);
        let Some(media_type) = detected.or(declared) else {
            return Err(LoomError::Invalid(format!(
                "attachment '{name}': unsupported type (recognised neither from its content nor \
                 from its extension; execution.attachments.types: {})",
                limits.types.join(", ")
            )));
        };
        let attachment = Attachment {
            name,
            media_type,
            bytes,
        };
        limits
            .check(std::slice::from_ref(&attachment))
            .map_err(LoomError::Invalid)?;
        Ok(attachment)
    }

    /// The limits attachments are checked against (`execution.attachments`).
    pub fn attachment_limits(&self) -> &AttachmentLimits {
        self.inner.engine.attachment_limits()
    }

    fn agent(&self, name: &str, tenant: &str) -> Result<Arc<AgentRuntime>, LoomError> {
        let key = (name.to_owned(), tenant.to_owned());
        if let Some(agent) = self
            .inner
            .agents
            .read()
            .ok()
            .and_then(|a| a.get(&key).cloned())
        {
            return Ok(agent);
        }
        let tools = self
            .inner
            .tools
            .read()
            .map_err(|_| LoomError::Registration("registry lock poisoned".into()))?
            .clone();
        let registry = crate::resolve::Registry {
            tools,
            policies: self.policies(),
            conditions: self
                .inner
                .conditions
                .read()
                .map(|c| c.clone())
                .unwrap_or_default(),
        };
        let agent = Arc::new(crate::resolve::agent(
            &self.inner.config,
            &self.inner.models,
            &registry,
            &self.inner.sources,
            name,
            tenant,
        )?);
        if let Ok(mut agents) = self.inner.agents.write() {
            agents.insert(key, agent.clone());
        }
        Ok(agent)
    }

    /// Runs `agent` on `message` until the run closes, and returns its result. A run that
    /// fails is a result with status `failed`, not an error.
    pub async fn run(
        &self,
        agent: &str,
        message: impl Into<String>,
        options: RunOptions,
    ) -> Result<RunResult, LoomError> {
        self.run_observed(agent, message, options, &()).await
    }

    /// Like [`Loom::run`], telling `observer` about each event and text delta as they happen.
    pub async fn run_observed(
        &self,
        agent: &str,
        message: impl Into<String>,
        options: RunOptions,
        observer: &dyn Observer,
    ) -> Result<RunResult, LoomError> {
        let approver = options.approver.clone();
        let (runtime, begin) = self.opening(agent, message.into(), options)?;
        let run = self.open_run(&runtime, begin, observer).await?;
        self.drive_approved(&run, &runtime, observer, approver)
            .await
    }

    /// Drives a run again from its journal (after a crash, or a stop): it continues exactly
    /// where the journal ends. A closed run is returned as it is.
    pub async fn resume(&self, run: &RunRef) -> Result<RunResult, LoomError> {
        self.resume_observed(run, &()).await
    }

    /// Like [`Loom::resume`], telling `observer` about each event and text delta as they happen.
    pub async fn resume_observed(
        &self,
        run: &RunRef,
        observer: &dyn Observer,
    ) -> Result<RunResult, LoomError> {
        let state = self.state(run).await?;
        if let Some(parent) = &state.parent_run_id {
            return Err(LoomError::Refused(format!(
                "run {} is a sub-run of {parent}: resume its root run {}, which drives it",
                run.run_id, state.root_run_id
            )));
        }
        let agent = state
            .agent
            .clone()
            .ok_or_else(|| LoomError::UnknownRun(run.run_id.clone()))?;
        let runtime = self.agent(&agent, &run.tenant_id)?;
        self.drive(run, &runtime, observer).await
    }

    /// The bytes of the artifact `uri` (`artifact://<tenant>/<session>/<file>`) of `tenant`:
    /// `None` when the URI names another tenant, is not an artifact URI, or nothing is stored
    /// under it.
    pub async fn artifact(&self, tenant: &str, uri: &str) -> Result<Option<Vec<u8>>, LoomError> {
        let mine = uri
            .strip_prefix("artifact://")
            .and_then(|rest| rest.strip_prefix(tenant))
            .is_some_and(|rest| rest.starts_with('/'));
        if !mine {
            return Ok(None);
        }
        match self.inner.engine.artifacts() {
            Some(artifacts) => Ok(artifacts.get(uri).await?),
            None => Ok(None),
        }
    }

    async fn drive(
        &self,
        run: &RunRef,
        runtime: &AgentRuntime,
        observer: &dyn Observer,
    ) -> Result<RunResult, LoomError> {
        self.drive_approved(run, runtime, observer, None).await
    }

    async fn drive_approved(
        &self,
        run: &RunRef,
        runtime: &AgentRuntime,
        observer: &dyn Observer,
        approver: Option<Arc<dyn Approver>>,
    ) -> Result<RunResult, LoomError> {
        let token = loom_engine::Cancel::new();
        {
            let mut active =
                self.inner.active.lock().map_err(|_| {
                    LoomError::Conflict("the table of active runs is unusable".into())
                })?;
            if active.contains_key(run) {
                return Err(LoomError::Conflict(format!(
                    "run {} is already being driven by this process",
                    run.run_id
                )));
            }
            active.insert(run.clone(), token.clone());
        }
        // Also when this future is dropped mid-drive (a caller that gave up): the run is then
        // driven nowhere, and the lease sweep or a resume can take it.
        let driving = Driving { loom: self, run };
        let outcome = self
            .inner
            .engine
            .drive_with(run, runtime, observer, &token, approver)
            .await;
        drop(driving);
        let state = outcome?;
        let waits = matches!(
            state.status,
            loom_core::RunStatus::Paused | loom_core::RunStatus::WaitingChild
        );
        if self.is_stopping() && !state.finished && !waits {
            return Err(LoomError::Interrupted(run.clone()));
        }
        self.result(run).await
    }

    /// Runs `agent` in the background and streams what happens: events once durable, text
    /// deltas as the model writes, then [`StreamItem::Finished`].
    pub fn stream(
        &self,
        agent: &str,
        message: impl Into<String>,
        options: RunOptions,
    ) -> BoxStream<'static, Result<StreamItem, LoomError>> {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let loom = self.clone();
        let agent = agent.to_owned();
        let message = message.into();
        tokio::spawn(async move {
            let observer = ChannelObserver(sender.clone());
            let outcome = loom.run_observed(&agent, message, options, &observer).await;
            let _ = sender.send(outcome.map(|result| StreamItem::Finished(Box::new(result))));
        });
        Box::pin(futures_util::stream::unfold(
            receiver,
            |mut receiver| async move { receiver.recv().await.map(|item| (item, receiver)) },
        ))
    }

    /// A run as a client addresses it by id (REST's `GET /runs/{run_id}`, MCP's `run_status`,
    /// `run_report` and run resources): in `session` when given, else in the session named after
    /// it (a run opened without a session). As in the reference, a run of a named session asked
    /// without its session is unknown ([`LoomError::UnknownRun`]), so a run id alone does not
    /// reach into another conversation; [`Loom::locate`] is the lookup that searches the
    /// tenant's sessions.
    pub async fn address(
        &self,
        run_id: &str,
        session: Option<&str>,
        tenant: Option<&str>,
    ) -> Result<RunRef, LoomError> {
        if session.is_none() && !loom_core::ids::is_safe_id(run_id) {
            // No session can be named after it: no run of a session of its own.
            return Err(LoomError::UnknownRun(run_id.to_owned()));
        }
        self.locate(run_id, Some(session.unwrap_or(run_id)), tenant)
            .await
    }

    /// Finds a run: in `session` when given, else through the journal's run index
    /// ([`EventStore::find_run`]: an unknown run costs no read of the tenant's sessions). The
    /// session found is read: when its journal is corrupted, the error says where
    /// ([`LoomError::Journal`], "corrupted at `<file>:<line>`"), not that the run is unknown.
    pub async fn locate(
        &self,
        run_id: &str,
        session: Option<&str>,
        tenant: Option<&str>,
    ) -> Result<RunRef, LoomError> {
        let tenant = tenant.unwrap_or(DEFAULT_TENANT).to_owned();
        let store = self.inner.engine.store();
        let session_id = match session {
            Some(session) if !loom_core::ids::is_safe_id(session) => {
                return Err(LoomError::Invalid(format!(
                    "session id '{session}' is not usable"
                )));
            }
            Some(session) => session.to_owned(),
            None if !loom_core::ids::is_safe_id(run_id) => {
                return Err(LoomError::UnknownRun(run_id.to_owned()));
            }
            None => match store.find_run(&tenant, run_id).await? {
                Some(session) => session,
                None => return Err(LoomError::UnknownRun(run_id.to_owned())),
            },
        };
        let events = store.read(&tenant, &session_id, 0).await?;
        if events.iter().any(|e| e.run_id == run_id) {
            return Ok(RunRef {
                tenant_id: tenant,
                session_id,
                run_id: run_id.to_owned(),
            });
        }
        Err(LoomError::UnknownRun(run_id.to_owned()))
    }

    /// The events of one run, in journal order.
    pub async fn events(&self, run: &RunRef) -> Result<Vec<Event>, LoomError> {
        let mut events = self
            .inner
            .engine
            .store()
            .read(&run.tenant_id, &run.session_id, 0)
            .await?;
        events.retain(|e| e.run_id == run.run_id);
        if events.is_empty() {
            return Err(LoomError::UnknownRun(run.run_id.clone()));
        }
        Ok(events)
    }

    /// The run's state, folded from its journal.
    pub async fn state(&self, run: &RunRef) -> Result<RunState, LoomError> {
        let events = self.events(run).await?;
        RunState::fold(&run.run_id, &events)
            .map_err(|e| LoomError::from(loom_engine::EngineError::Fold(e)))
    }

    /// Grants the approval requests of a paused run, or of the sub-runs a run waits for (a
    /// root run answers for its tree): the request of `call_id`, or every waiting one. `by` and `reason` are journaled; corrected `arguments` (with `call_id`
    /// only; checked against the tool's schema) are what the tool receives, while the
    /// journal's `tool.called` keeps the model's. Works from any process. Unless `no_wait`,
    /// the run is then driven on (until it closes or pauses again).
    ///
    /// Refused ([`LoomError::Refused`]) when nothing waits for a decision, the call has no
    /// waiting request, its request expired, or the arguments are unusable; and
    /// ([`LoomError::Invalid`], nothing written) when `by`, `reason` or `arguments` pass their
    /// bounds ([`loom_core::limits`]: 64 levels, sizes).
    pub async fn approve(
        &self,
        run: &RunRef,
        call_id: Option<&str>,
        by: &str,
        reason: Option<&str>,
        arguments: Option<Value>,
        no_wait: bool,
    ) -> Result<Decided, LoomError> {
        crate::limits::check_decision(by, reason, arguments.as_ref())?;
        let decision = Decision::Approved {
            by: by.to_owned(),
            reason: reason.map(str::to_owned),
            arguments,
        };
        self.decide(run, call_id, decision, no_wait).await
    }

    /// Rejects the approval requests of a paused run (the request of `call_id`, or every
    /// waiting one): the model receives each call's error result with `reason`. Unless
    /// `no_wait`, the run is then driven on. Refused like [`Loom::approve`].
    pub async fn reject(
        &self,
        run: &RunRef,
        call_id: Option<&str>,
        by: &str,
        reason: Option<&str>,
        no_wait: bool,
    ) -> Result<Decided, LoomError> {
        crate::limits::check_decision(by, reason, None)?;
        let decision = Decision::Rejected {
            by: by.to_owned(),
            reason: reason.map(str::to_owned),
        };
        self.decide(run, call_id, decision, no_wait).await
    }

    async fn decide(
        &self,
        run: &RunRef,
        call_id: Option<&str>,
        decision: Decision,
        no_wait: bool,
    ) -> Result<Decided, LoomError> {
        let state = self.state(run).await?;
        let agent = state
            .agent
            .clone()
            .ok_or_else(|| LoomError::UnknownRun(run.run_id.clone()))?;
        let runtime = self.agent(&agent, &run.tenant_id)?;
        let calls = self
            .inner
            .engine
            .settle(run, &runtime, call_id, &decision)
            .await?;
        // A sub-run is driven by its root, which re-plays the call that resumes it.
        let root = RunRef {
            run_id: state.root_run_id.clone(),
            ..run.clone()
        };
        let result = if no_wait {
            self.result(run).await?
        } else if root.run_id == run.run_id {
            self.drive(run, &runtime, &()).await?
        } else {
            let root_agent = self
                .state(&root)
                .await?
                .agent
                .ok_or_else(|| LoomError::UnknownRun(root.run_id.clone()))?;
            let root_runtime = self.agent(&root_agent, &root.tenant_id)?;
            self.drive(&root, &root_runtime, &()).await?
        };
        Ok(Decided { calls, result })
    }

    /// The run's result, read from its session's journal (also for a run still going on):
    /// what every door returns ([`RunResult::from_events`]). A run waiting for its sub-runs
    /// lists their pending approvals.
    pub async fn result(&self, run: &RunRef) -> Result<RunResult, LoomError> {
        let events = self
            .inner
            .engine
            .store()
            .read(&run.tenant_id, &run.session_id, 0)
            .await?;
        RunResult::from_events(&run.run_id, &events)
            .map_err(|e| LoomError::from(loom_engine::EngineError::Fold(e)))
    }

    /// Cancels a run: a run driven by this instance stops at once (between or during steps);
    /// another open run is closed as cancelled in its journal. Either way its `run.cancelled`
    /// records `by`, and is journaled when this returns `true` (for a run driven here, unless
    /// its step in progress ignores the cancellation for longer than
    /// `execution.shutdown_timeout`: then it is journaled when that step ends). `false` if the
    /// run had closed, or closed otherwise while the cancellation reached it.
    ///
    /// A caller that drives the run in the same task (awaiting [`Loom::run`], say) must keep
    /// polling that drive while it awaits `cancel` (`tokio::join!`), since `cancel` waits for
    /// the drive to journal the cancellation.
    pub async fn cancel(&self, run: &RunRef, by: Option<String>) -> Result<bool, LoomError> {
        crate::limits::check_by(by.as_deref())?;
        let token = self
            .inner
            .active
            .lock()
            .ok()
            .and_then(|a| a.get(run).cloned());
        if let Some(token) = token {
            token.cancel(by.clone());
            // Answer from the journal: wait until the drive has let the run go.
            if tokio::time::timeout(self.shutdown_timeout(), self.not_driven(run, &token))
                .await
                .is_err()
            {
                return Ok(true);
            }
            let state = self.state(run).await?;
            if state.finished {
                return Ok(state.status == loom_core::RunStatus::Cancelled);
            }
            // The drive let the run go without closing it (a stop at the same moment): it is
            // driven nowhere now, so it is closed here.
        }
        let state = self.state(run).await?;
        let agent = state.agent.unwrap_or_default();
        Ok(self.inner.engine.cancel_idle(run, &agent, by).await?)
    }

    /// Resolves once the drive that `token` cancels has let `run` go (a later drive of the
    /// same run is another one).
    async fn not_driven(&self, run: &RunRef, token: &loom_engine::Cancel) {
        self.until_active(|active| active.get(run).is_none_or(|t| !t.is_same(token)))
            .await;
    }

    /// Resolves once the table of the runs this instance drives satisfies `done` (checked
    /// each time a run leaves it).
    async fn until_active(&self, done: impl Fn(&HashMap<RunRef, loom_engine::Cancel>) -> bool) {
        loop {
            let notified = self.inner.idle.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.inner.active.lock().map(|a| done(&a)).unwrap_or(true) {
                return;
            }
            notified.await;
        }
    }

    /// Stops what the instance started: MCP server connections and their child processes.
    /// Call it before the process exits.
    pub async fn shutdown(&self) {
        for source in self.inner.sources.values() {
            source.shutdown().await;
        }
    }

    /// Starts a run in the background and returns as soon as it is journaled: the run can be
    /// followed (`events`, `result`), steered and cancelled while it goes on.
    pub async fn submit(
        &self,
        agent: &str,
        message: impl Into<String>,
        options: RunOptions,
    ) -> Result<RunRef, LoomError> {
        let (runtime, begin) = self.opening(agent, message.into(), options)?;
        let run = self.open_run(&runtime, begin, &()).await?;
        self.spawn_drive(run.clone(), runtime);
        Ok(run)
    }

    pub(crate) fn spawn_drive(&self, run: RunRef, runtime: Arc<AgentRuntime>) {
        let loom = self.clone();
        tokio::spawn(async move {
            match loom.drive(&run, &runtime, &()).await {
                Ok(_) => {}
                Err(LoomError::Interrupted(_)) => {
                    tracing::info!(run_id = %run.run_id, "background run interrupted: it resumes at the next start");
                }
                Err(LoomError::Conflict(reason)) => {
                    // Another driver holds it (it took it first): not this process's to drive.
                    tracing::info!(run_id = %run.run_id, %reason, "background run left to its driver");
                }
                Err(error) => {
                    tracing::warn!(run_id = %run.run_id, %error, "background run stopped");
                }
            }
        });
    }

    /// Sends a message to a run that has not closed: it joins the conversation just before the
    /// run's next model call (never in the middle of one), as a user turn.
    pub async fn steer(&self, run: &RunRef, message: impl Into<String>) -> Result<(), LoomError> {
        let message = message.into();
        crate::limits::check_steer(&message)?;
        let state = self.state(run).await?;
        let agent = state.agent.unwrap_or_default();
        Ok(self
            .inner
            .engine
            .steer(run, &agent, Message::user(message))
            .await?)
    }

    /// Re-drives, in the background, every run of the tenant left unfinished (a crash, a
    /// `kill -9`) whose lease has expired (a run never claimed: whose last event is older than
    /// one lease), skipping runs this instance drives, runs paused for a human and runs whose
    /// agent is no longer declared. Returns the runs re-queued. Reads every session of the
    /// tenant; [`Loom::lease_watch`] remembers what it read and reads only what changed.
    pub async fn recover(&self, tenant: Option<&str>) -> Result<Vec<RunRef>, LoomError> {
        let tenant = tenant.unwrap_or(DEFAULT_TENANT).to_owned();
        crate::recovery::LeaseWatch::new(self.clone(), vec![tenant])
            .sweep()
            .await
    }

    /// A sweep of every tenant the configuration knows (`default`, and each of `tenants`) for
    /// runs another process abandoned (see [`Loom::recover`]); each [`LeaseWatch::sweep`]
    /// after the first reads only the sessions that changed or hold a lease that ran out.
    ///
    /// [`LeaseWatch::sweep`]: crate::LeaseWatch::sweep
    pub fn lease_watch(&self) -> crate::LeaseWatch {
        crate::recovery::LeaseWatch::new(self.clone(), self.known_tenants())
    }

    /// Sweeps the journal for abandoned runs every [`LeaseWatch::period`] (half of
    /// `execution.lease`, between 1 and 30 s) and resumes them, until `stop` resolves or
    /// [`Loom::stop`] is called. What `loom serve` runs beside the API, so that a run left by
    /// a crashed process sharing the journal goes on once its lease expires. Several
    /// processes may watch one journal: a run's lease is taken by one driver only (its
    /// `run.claimed` is appended under the journal's optimistic concurrency).
    ///
    /// [`LeaseWatch::period`]: crate::LeaseWatch::period
    pub async fn watch_leases(&self, stop: impl std::future::Future<Output = ()>) {
        let mut watch = self.lease_watch();
        let period = watch.period();
        let mut stop = std::pin::pin!(stop);
        let signal = self.inner.engine.stop_signal().clone();
        loop {
            tokio::select! {
                () = &mut stop => return,
                () = signal.requested() => return,
                () = tokio::time::sleep(period) => {}
            }
            match watch.sweep().await {
                Ok(runs) => {
                    for run in runs {
                        tracing::warn!(
                            run_id = %run.run_id,
                            session_id = %run.session_id,
                            tenant = %run.tenant_id,
                            "resuming a run whose lease expired (its driver stopped without handing it back)"
                        );
                    }
                }
                Err(error) => tracing::warn!(%error, "the sweep for abandoned runs failed"),
            }
        }
    }

    /// Whether this instance drives `run` now.
    pub(crate) fn is_driving(&self, run: &RunRef) -> bool {
        self.inner
            .active
            .lock()
            .map(|a| a.contains_key(run))
            .unwrap_or(true)
    }

    /// The agent `name` resolved for `tenant`.
    pub(crate) fn agent_runtime(
        &self,
        name: &str,
        tenant: &str,
    ) -> Result<Arc<AgentRuntime>, LoomError> {
        self.agent(name, tenant)
    }

    /// The journal.
    pub(crate) fn store(&self) -> &Arc<dyn EventStore> {
        self.inner.engine.store()
    }

    /// `execution.lease`.
    pub(crate) fn lease(&self) -> std::time::Duration {
        self.inner.engine.lease()
    }

    /// `default` and each tenant of the configuration.
    fn known_tenants(&self) -> Vec<String> {
        let mut tenants = vec![DEFAULT_TENANT.to_owned()];
        for tenant in &self.config().raw().tenants {
            if !tenants.contains(&tenant.id) {
                tenants.push(tenant.id.clone());
            }
        }
        tenants
    }

    /// The sessions of a tenant, most recent first.
    pub async fn sessions(&self, tenant: Option<&str>) -> Result<Vec<SessionListed>, LoomError> {
        let sessions = self
            .inner
            .engine
            .store()
            .sessions(tenant.unwrap_or(DEFAULT_TENANT))
            .await?;
        Ok(sessions.into_iter().map(SessionListed::from).collect())
    }

    /// The runs of a session, in the order they started, folded from its journal.
    pub async fn session_runs(
        &self,
        session: &str,
        tenant: Option<&str>,
    ) -> Result<Vec<RunState>, LoomError> {
        let tenant = tenant.unwrap_or(DEFAULT_TENANT);
        let events = self.inner.engine.store().read(tenant, session, 0).await?;
        if events.is_empty() {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        crate::sessions::folded(&events)
    }

    /// A session's journal as JSONL, one event per line, exactly as stored.
    pub async fn export_session(
        &self,
        session: &str,
        tenant: Option<&str>,
    ) -> Result<String, LoomError> {
        let events = self
            .inner
            .engine
            .store()
            .read(tenant.unwrap_or(DEFAULT_TENANT), session, 0)
            .await?;
        if events.is_empty() {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        let mut out = String::new();
        for event in events {
            out.push_str(&event.to_json());
            out.push('\n');
        }
        Ok(out)
    }

    /// Erases a session (GDPR): its journal, its files and its idempotency keys, and says how
    /// many of each went. [`LoomError::UnknownSession`] when its journal held nothing.
    pub async fn delete_session(
        &self,
        session: &str,
        tenant: Option<&str>,
    ) -> Result<crate::SessionDeletion, LoomError> {
        let tenant = tenant.unwrap_or(DEFAULT_TENANT);
        if !loom_core::ids::is_safe_id(session) {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        let events_deleted = self.inner.engine.store().delete(tenant, session).await?;
        if events_deleted == 0 {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        let mut deletion = crate::SessionDeletion {
            session_id: session.to_owned(),
            events_deleted,
            files_deleted: 0,
            idempotency_keys_deleted: 0,
        };
        if let Some(artifacts) = self.inner.engine.artifacts() {
            deletion.files_deleted = artifacts.delete_session(tenant, session).await?;
        }
        if let Some(keys) = self.inner.engine.idempotency() {
            deletion.idempotency_keys_deleted = keys.delete_session(tenant, session).await?;
        }
        Ok(deletion)
    }

    /// `execution.shutdown_timeout`: how long a stop lets a step finish ([`Loom::stop`]), and
    /// how long [`Loom::cancel`] waits for a drive to journal a cancellation.
    pub fn shutdown_timeout(&self) -> std::time::Duration {
        std::time::Duration::try_from_secs_f64(self.config().raw().execution.shutdown_timeout)
            .unwrap_or(std::time::Duration::from_secs(30))
    }

    /// Stops driving, for a process that shuts down without closing its runs: every run this
    /// instance drives stops at its next safe point (after the step in progress has written
    /// its events) and hands its lease back, open in its journal; a run asked for afterwards
    /// stops before its first step. Waits until no run is driven; runs still in a step after
    /// `grace` have that step abandoned as a crash would leave it (and their lease handed
    /// back); it waits at most `grace` again for them. A caller driving a stopped run gets
    /// [`LoomError::Interrupted`]; the runs resume with [`Loom::resume`] or [`Loom::recover`]
    /// (what the next `loom serve` does).
    pub async fn stop(&self, grace: std::time::Duration) {
        let signal = self.inner.engine.stop_signal();
        signal.request();
        if tokio::time::timeout(grace, self.idle()).await.is_err() {
            let left = self.inner.active.lock().map(|a| a.len()).unwrap_or(0);
            tracing::warn!(
                runs = left,
                grace_s = grace.as_secs_f64(),
                "runs still in a step after the shutdown timeout: their steps are abandoned"
            );
            signal.interrupt();
            // An abandoned step lets go at once; only a pilot stuck outside its steps (opening
            // a tool source) can keep it: such a run resumes once its lease expires.
            let bound = grace.max(std::time::Duration::from_secs(1));
            if tokio::time::timeout(bound, self.idle()).await.is_err() {
                tracing::warn!("runs did not let go: they resume once their lease expires");
            }
        }
    }

    /// Whether [`Loom::stop`] was called: runs are no longer driven by this instance.
    pub fn is_stopping(&self) -> bool {
        self.inner.engine.stop_signal().is_requested()
    }

    /// Resolves when this instance drives no run.
    async fn idle(&self) {
        self.until_active(HashMap::is_empty).await;
    }

    /// [`Loom::recover`] for every tenant the configuration knows (`default`, and each of
    /// `tenants`): what a server does when it starts, so the runs a previous process left
    /// open (a shutdown, a crash) go on.
    pub async fn recover_all(&self) -> Result<Vec<RunRef>, LoomError> {
        self.lease_watch().sweep().await
    }

    /// Cancels every run this instance is driving (what Ctrl-C does in the CLI).
    pub fn cancel_all(&self) {
        if let Ok(active) = self.inner.active.lock() {
            for token in active.values() {
                token.cancel(None);
            }
        }
    }

    /// The journal this instance writes to.
    pub(crate) fn event_store(&self) -> Arc<dyn EventStore> {
        self.inner.engine.store().clone()
    }

    /// Where this instance stores files, if anywhere.
    pub(crate) fn artifact_store(&self) -> Option<Arc<dyn ArtifactStore>> {
        self.inner.engine.artifacts().cloned()
    }

    /// The run's trace: its spans (steps, model calls, tool calls, judges, approvals) and its
    /// sub-runs' under the tool calls that opened them, with content (what `loom inspect`
    /// shows; [`report::Trace::without_content`] removes the content).
    pub async fn trace(&self, run: &RunRef) -> Result<report::Trace, LoomError> {
        let events = self.session_events_of(run).await?;
        report::Trace::from_events(&run.run_id, &events)
            .map_err(|e| LoomError::from(loom_engine::EngineError::Fold(e)))
    }

    /// Tokens and cost of a run and its sub-runs: in total, run by run, by role, by agent and
    /// by model (what `loom report <run>` shows).
    pub async fn report(&self, run: &RunRef) -> Result<report::UsageReport, LoomError> {
        let events = self.session_events_of(run).await?;
        Ok(report::UsageReport::from_events(&run.run_id, &events))
    }

    /// The events of `run`'s session, refused ([`LoomError::UnknownRun`]) when the run has none.
    async fn session_events_of(&self, run: &RunRef) -> Result<Vec<Event>, LoomError> {
        let events = self
            .inner
            .engine
            .store()
            .read(&run.tenant_id, &run.session_id, 0)
            .await?;
        if !events.iter().any(|e| e.run_id == run.run_id) {
            return Err(LoomError::UnknownRun(run.run_id.clone()));
        }
        Ok(events)
    }

    /// Tokens and cost of a session: every run, sub-runs included, and every call by role, by
    /// agent and by model (what `loom report --session` shows).
    pub async fn session_report(
        &self,
        session: &str,
        tenant: Option<&str>,
    ) -> Result<report::UsageReport, LoomError> {
        let tenant = tenant.unwrap_or(DEFAULT_TENANT);
        if !loom_core::ids::is_safe_id(session) {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        let events = self.inner.engine.store().read(tenant, session, 0).await?;
        if events.is_empty() {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        Ok(report::UsageReport::for_session(tenant, session, &events))
    }

    /// Tokens and cost of a tenant over the UTC day or month holding `at`: the root runs it
    /// started then with their sub-runs, by run, role, agent and model (what
    /// `loom report --tenant` shows).
    pub async fn tenant_report(
        &self,
        tenant: &str,
        period: Period,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<report::UsageReport, LoomError> {
        let (from, _) = period.window(at);
        let sessions = self.tenant_sessions(tenant, from).await?;
        Ok(report::UsageReport::for_tenant(
            tenant, period, at, &sessions,
        ))
    }
}

struct ChannelObserver(tokio::sync::mpsc::UnboundedSender<Result<StreamItem, LoomError>>);

impl Observer for ChannelObserver {
    fn event(&self, event: &Event) {
        let _ = self.0.send(Ok(StreamItem::Event(Box::new(event.clone()))));
    }

    fn text_delta(&self, run_id: &str, text: &str) {
        let _ = self.0.send(Ok(StreamItem::TextDelta {
            run_id: run_id.to_owned(),
            text: text.to_owned(),
        }));
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

/// Why an attachment of `size` bytes is refused.
fn too_large(name: &str, size: u64, max_bytes: u64) -> String {
    format!(
        "attachment '{name}' is {size} bytes, more than the limit of {max_bytes} bytes \
         (execution.attachments.max_bytes)"
    )
}

/// Whether `name` can name a policy.
fn is_valid_policy_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 64
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// The lines `validate` prints about what surrounds an agent's loop.
fn guards_of(agent: &AgentRuntime) -> Vec<String> {
    let mut lines = Vec::new();
    for role in &agent.roles {
        let mut traits = vec![format!("model {}", role.main.config_id)];
        if role.terminal {
            traits.push("terminal".into());
        }
        if !role.context.is_empty() {
            let keys: Vec<&str> = role.context.iter().map(|c| c.key()).collect();
            traits.push(format!("context {}", keys.join(", ")));
        }
        if role.output.is_some() {
            traits.push("output contract".into());
        }
        for judge in &role.judges {
            traits.push(format!(
                "judge {} (model {})",
                judge.name, judge.main.config_id
            ));
        }
        lines.push(format!("role {}: {}", role.name, traits.join(", ")));
    }
    for sub in &agent.subagents {
        let share = sub
            .budget_share
            .map(|s| format!(", budget share {s}"))
            .unwrap_or_default();
        lines.push(format!(
            "sub-agent {}: agent {}{share} (max_depth {})",
            sub.name, sub.agent.name, agent.max_depth
        ));
    }
    for policy in &agent.policies {
        let points: Vec<&str> = policy.points.iter().map(|p| p.as_str()).collect();
        lines.push(format!("policy {}: {}", policy.name, points.join(", ")));
    }
    if let Some(contract) = &agent.output {
        lines.push(format!(
            "output contract: on_failure {}, {} repair(s)",
            contract.spec().on_failure.as_str(),
            contract.spec().repair.max_attempts
        ));
    }
    for judge in &agent.judges {
        lines.push(format!(
            "judge {}: model {}, {} criterion(s), sample {}",
            judge.name,
            judge.main.config_id,
            judge.criteria.len(),
            judge.when.sample
        ));
    }
    if let Some(budget) = &agent.budget {
        let mut limits = Vec::new();
        if let Some(v) = budget.run.max_calls {
            limits.push(format!("run max_calls {v}"));
        }
        if let Some(v) = budget.run.max_tokens {
            limits.push(format!("run max_tokens {v}"));
        }
        if let Some(v) = budget.run.max_cost {
            limits.push(format!("run max_cost {v} $"));
        }
        if let Some(v) = budget.session.max_tokens {
            limits.push(format!("session max_tokens {v}"));
        }
        if let Some(v) = budget.session.max_cost {
            limits.push(format!("session max_cost {v} $"));
        }
        lines.push(format!(
            "budget: {} (on_exceed {})",
            limits.join(", "),
            budget.on_exceed.as_str()
        ));
    }
    lines
}

/// A run this instance drives: leaves the table of active runs when dropped, however the
/// drive ends (returned, failed, or its future dropped), and wakes who waits on that table.
struct Driving<'a> {
    loom: &'a Loom,
    run: &'a RunRef,
}

impl Drop for Driving<'_> {
    fn drop(&mut self) {
        if let Ok(mut active) = self.loom.inner.active.lock() {
            active.remove(self.run);
        }
        self.loom.inner.idle.notify_waiters();
    }
}
