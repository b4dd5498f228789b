//! # loom-engine
//!
//! The run loop, as a state machine over journal events.
//!
//! A run is advanced by [`Engine::drive`]: the state is recomputed from the journal
//! ([`loom_core::RunState::fold`]), the next effect is chosen from the state alone, and every
//! event is appended to the journal *before* it is applied. One step performs one effect: a
//! model call, or one batch of tool calls. Decisions (transitions, the closing event) are
//! written outside steps, in the run's root span. Because nothing lives only in memory, a run
//! can be driven again from its journal at any point.
//!
//! **Model calls are resilient.** A model step tries the slot's chain ([`AgentRuntime::main`]
//! then [`AgentRuntime::fallbacks`], starting from the model the run last switched to): each
//! call is streamed under the model's [`ModelTimeouts`], retryable errors are tried again per
//! its [`RetryPolicy`] (`model.retried`, written before the delay), exhausted retries, quota
//! and context overflow move on to the next model (`model.fell_back`), and the engine's
//! [`Breakers`] skip a model that keeps failing (`circuit.opened`, then `model.fell_back`
//! with reason `circuit_open`). Only the answer of the attempt that succeeded is journaled,
//! priced with the model that gave it.
//!
//! **Architecture invariant:** the engine depends on `loom-core` only. It reaches storage,
//! models, tools and the wall clock through the ports it is given (`Arc<dyn EventStore>`,
//! `Arc<dyn ModelClient>`, `Arc<dyn Tool>`, `Arc<dyn Clock>`); it reads no environment
//! variable and no configuration file.

pub mod attachments;
pub mod budget;
mod cancel;
pub mod contract;
mod driver;
mod hooks;
mod ids;
mod judges;
mod offload;
mod ownership;
mod request;
mod resilience;
mod review;
pub mod roles;
mod stop;
mod subagents;
mod tools;
mod writer;

use std::{fmt, sync::Arc, time::Duration};

use loom_core::{
    Message,
    approval::OnExpiry,
    model::ModelClient,
    policy::{Point, Policy},
    ports::{ArtifactStore, Clock, EventStore, IdempotencyStore, StoreError, ToolSource},
    state::{FoldError, ProjectionError},
    tool::{Tool, ToolDeclarations},
    usage::Pricing,
};
use serde_json::{Map, Value};

pub use attachments::{
    Attachment, AttachmentLimits, IMAGE_TYPES, media_type_of_name, sniff_media_type,
};
pub use budget::{BudgetLimits, OnExceed, RunLimits, SessionLimits};
pub use cancel::Cancel;
pub use driver::Observer;
pub use ids::Ids;
pub use judges::{
    ContextScope, Criterion, JUDGE_SYSTEM, JudgeCondition, JudgeContext, JudgeInput, JudgeMode,
    JudgeRuntime, JudgeWhen, VERDICT_TOOL, parse_verdict, sample_point, sampled,
};
pub use offload::artifact_read as artifact_reader;
pub use request::request_hash;
pub use resilience::{Breakers, CircuitSettings, ModelTimeouts, RetryPolicy};
pub use roles::{REFS_HINT, RoleContext, RoleRuntime};
pub use stop::StopSignal;
pub use subagents::{AGENT_HINT, SubAgentRuntime, descendant_approvals, open_descendants};
pub use tools::{UNKNOWN_REASON, UNKNOWN_STATE, idempotency_key};

/// The lease a driver takes on a run (`execution.lease`).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// The default per-call tool timeout (`execution.tools.timeout`).
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(30);

/// A model bound to a slot of an agent: the client and what the engine needs to call it.
#[derive(Debug, Clone)]
pub struct ModelBinding {
    /// Config id (`models[].id`), journaled as `model`.
    pub config_id: String,
    /// Provider model name (`models[].model`), journaled as `model_id`.
    pub model_id: String,
    /// The client.
    pub client: Arc<dyn ModelClient>,
    /// Prices.
    pub pricing: Pricing,
    /// Output token cap.
    pub max_tokens: Option<u32>,
    /// Provider parameters.
    pub params: Map<String, Value>,
    /// How failed calls are tried again.
    pub retry: RetryPolicy,
    /// Bounds on each streamed call.
    pub timeouts: ModelTimeouts,
    /// The model's circuit breaker (`None`: never skipped).
    pub circuit: Option<CircuitSettings>,
    /// Declared context window in tokens: after a `context_overflow`, the chain moves on to
    /// the first following model whose window is larger.
    pub context_window: Option<u64>,
    /// Whether the model reads images (`capabilities.vision`): the images of its requests are
    /// then sent inline (base64 from the artifact store) instead of as references.
    pub vision: bool,
}

impl ModelBinding {
    /// A binding with default settings: no pricing, no token cap, no parameters, the default
    /// [`RetryPolicy`], [`ModelTimeouts`] and [`CircuitSettings`], no declared context window,
    /// no vision.
    pub fn new(
        config_id: impl Into<String>,
        model_id: impl Into<String>,
        client: Arc<dyn ModelClient>,
    ) -> ModelBinding {
        ModelBinding {
            config_id: config_id.into(),
            model_id: model_id.into(),
            client,
            pricing: Pricing::default(),
            max_tokens: None,
            params: Map::new(),
            retry: RetryPolicy::default(),
            timeouts: ModelTimeouts::default(),
            circuit: Some(CircuitSettings::default()),
            context_window: None,
            vision: false,
        }
    }
}

/// A tool as an agent offers it: the tool, its effective declarations and its validator.
#[derive(Clone)]
pub struct BoundTool {
    /// The tool.
    pub tool: Arc<dyn Tool>,
    /// Declarations after the agent's overrides.
    pub declarations: ToolDeclarations,
    /// Description offered to the model (the agent may override it).
    pub description: String,
    /// The contract its results must meet (`output:` on the tool reference): a result that
    /// breaks it reaches the model as an error with the diagnostic.
    pub contract: Option<Arc<contract::Contract>>,
    validator: Arc<jsonschema::Validator>,
}

impl fmt::Debug for BoundTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundTool")
            .field("name", &self.tool.spec().name)
            .field("declarations", &self.declarations)
            .finish_non_exhaustive()
    }
}

impl BoundTool {
    /// Binds a tool, compiling its argument schema once.
    pub fn new(
        tool: Arc<dyn Tool>,
        declarations: ToolDeclarations,
        description: String,
    ) -> Result<BoundTool, EngineError> {
        let validator = jsonschema::validator_for(&tool.spec().input_schema).map_err(|e| {
            EngineError::Invalid(format!(
                "tool '{}': its argument schema is not a valid JSON Schema: {e}",
                tool.spec().name
            ))
        })?;
        Ok(BoundTool {
            tool,
            declarations,
            description,
            contract: None,
            validator: Arc::new(validator),
        })
    }

    /// Binds a tool as it declares itself: the declarations and description of its spec.
    pub fn declared(tool: Arc<dyn Tool>) -> Result<BoundTool, EngineError> {
        let spec = tool.spec();
        let (declarations, description) = (spec.declarations.clone(), spec.description.clone());
        BoundTool::new(tool, declarations, description)
    }

    /// Sets the contract its results must meet.
    pub fn with_contract(mut self, contract: contract::Contract) -> BoundTool {
        self.contract = Some(Arc::new(contract));
        self
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.tool.spec().name
    }

    /// Checks arguments against the tool's schema: the problems, one line each, sorted.
    pub fn schema_problems(&self, arguments: &Value) -> Vec<String> {
        let mut problems: Vec<(String, String)> = self
            .validator
            .iter_errors(arguments)
            .map(|e| {
                let path = e.instance_path().to_string();
                let path = if path.is_empty() {
                    "(root)".to_owned()
                } else {
                    path
                };
                (path, e.to_string())
            })
            .collect();
        problems.sort();
        problems.dedup();
        problems
            .into_iter()
            .map(|(path, message)| format!("- {path}: {message}"))
            .collect()
    }
}

/// What happens when a policy errs (raises, times out, answers a decision it may not give).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PolicyOnError {
    /// The run fails (`policy.decided` fail, marked as an error).
    #[default]
    Block,
    /// The chain goes on (`policy.decided` continue, marked as an error).
    Allow,
}

/// The default time a policy has to decide.
pub const DEFAULT_POLICY_TIMEOUT: Duration = Duration::from_secs(5);

/// A policy as an agent hooks it.
#[derive(Debug, Clone)]
pub struct BoundPolicy {
    /// Its name in the agent (journaled as `policy.decided.policy`).
    pub name: String,
    /// The policy.
    pub policy: Arc<dyn Policy>,
    /// The points it is hooked on (a subset of those it declares).
    pub points: Vec<Point>,
    /// Its parameters.
    pub params: Map<String, Value>,
    /// Time it has to decide (`None`: no limit).
    pub timeout: Option<Duration>,
    /// What its errors do.
    pub on_error: PolicyOnError,
    /// Repairs it may ask for the final output in a run (or for one call).
    pub max_attempts: u32,
}

impl BoundPolicy {
    /// Hooks `policy` under `name` on every point it declares, with the defaults: no
    /// parameters, 5 s to decide, errors block, one repair.
    pub fn new(
        name: impl Into<String>,
        policy: Arc<dyn Policy>,
    ) -> Result<BoundPolicy, EngineError> {
        let points = policy.points().to_vec();
        BoundPolicy::on(name, policy, points)
    }

    /// Hooks `policy` on `points`, which must be among those it declares, and whose every
    /// declared decision must be allowed there.
    pub fn on(
        name: impl Into<String>,
        policy: Arc<dyn Policy>,
        points: Vec<Point>,
    ) -> Result<BoundPolicy, EngineError> {
        let name = name.into();
        if let Some(point) = points.iter().find(|p| !policy.points().contains(p)) {
            let declared: Vec<&str> = policy.points().iter().map(|p| p.as_str()).collect();
            return Err(EngineError::Invalid(format!(
                "policy '{name}' does not apply to {point} (declared points: {})",
                declared.join(", ")
            )));
        }
        if let Some((point, kind)) =
            loom_core::policy::refused_decision(&points, policy.decisions())
        {
            return Err(EngineError::Invalid(format!(
                "policy '{name}' may decide '{kind}', which is not allowed at {point}"
            )));
        }
        Ok(BoundPolicy {
            name,
            policy,
            points,
            params: Map::new(),
            timeout: Some(DEFAULT_POLICY_TIMEOUT),
            on_error: PolicyOnError::Block,
            max_attempts: 1,
        })
    }
}

/// A tool source as an agent uses it.
#[derive(Debug, Clone)]
pub struct BoundSource {
    /// The source, whose tools already carry the agent's names and declarations.
    pub source: Arc<dyn ToolSource>,
    /// Whether the run fails when the source is unavailable.
    pub required: bool,
}

/// Everything the engine needs to run an agent, resolved from configuration and code.
#[derive(Debug, Clone)]
pub struct AgentRuntime {
    /// Agent name.
    pub name: String,
    /// Rendered system prompt.
    pub system: String,
    /// The orchestrating model.
    pub main: ModelBinding,
    /// The models tried after `main`, in order, when it fails or its breaker is open (the
    /// chain is `main` then `fallbacks`; a run that switched stays on the model it switched
    /// to).
    pub fallbacks: Vec<ModelBinding>,
    /// Offered tools, in declared order.
    pub tools: Vec<BoundTool>,
    /// Tool sources (MCP servers) opened when a run starts.
    pub sources: Vec<BoundSource>,
    /// Result size (characters) above which a result is moved out of the context, when the
    /// tool declares none (`execution.tools.offload_over`; `None`: never).
    pub offload_over: Option<u64>,
    /// Orchestrator model calls before the run is made to finish.
    pub max_iterations: u32,
    /// Bound on cumulated piloting time.
    pub timeout: Option<Duration>,
    /// Tool timeout when a tool declares none (`None`: no limit).
    pub tool_timeout: Option<Duration>,
    /// Whether arguments are checked against the tool's schema before the call.
    pub validate_arguments: bool,
    /// How long approval requests wait, and what their expiry does.
    pub approval: ApprovalSettings,
    /// Policies, in declared order (each point runs those hooked on it, in this order).
    pub policies: Vec<BoundPolicy>,
    /// The contract of the final output (`output:`), checked before the run completes.
    pub output: Option<contract::Contract>,
    /// Judges of the final output (`judge:`), run in order after its contract and before the
    /// `on_output` policies.
    pub judges: Vec<JudgeRuntime>,
    /// Run and session budgets, checked before each orchestrator model call by the built-in
    /// policy `loom.budget`, ahead of `policies` (`None`: only a budget the run was opened
    /// with applies).
    pub budget: Option<BudgetLimits>,
    /// Agents offered as tools (`subagents:`): each call opens a child run in the session.
    pub subagents: Vec<SubAgentRuntime>,
    /// Sub-agents are offered only to runs whose depth is below this (`max_depth`, default 1:
    /// a root run may call sub-agents, their runs may not).
    pub max_depth: u32,
    /// Roles, offered to the orchestrator as tools after `tools` (see [`roles`]).
    pub roles: Vec<RoleRuntime>,
}

/// The agent's `approval:` settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ApprovalSettings {
    /// How long a request waits for a decision (`None`: forever).
    pub expires_in: Option<Duration>,
    /// What an expired request does.
    pub on_expiry: OnExpiry,
}

impl Default for ApprovalSettings {
    /// 24 hours, then the call is denied.
    fn default() -> Self {
        ApprovalSettings {
            expires_in: Some(DEFAULT_APPROVAL_EXPIRY),
            on_expiry: OnExpiry::Deny,
        }
    }
}

/// How long an approval request waits by default (`approval.expires_in`).
pub const DEFAULT_APPROVAL_EXPIRY: Duration = Duration::from_secs(86_400);

impl AgentRuntime {
    /// An agent without tools nor fallbacks: 10 iterations, no run timeout, the default tool
    /// timeout, arguments validated, no sub-agents (`max_depth` 1).
    pub fn new(name: impl Into<String>, system: impl Into<String>, main: ModelBinding) -> Self {
        AgentRuntime {
            name: name.into(),
            system: system.into(),
            main,
            fallbacks: Vec::new(),
            tools: Vec::new(),
            sources: Vec::new(),
            offload_over: None,
            max_iterations: 10,
            timeout: None,
            tool_timeout: Some(DEFAULT_TOOL_TIMEOUT),
            validate_arguments: true,
            approval: ApprovalSettings::default(),
            policies: Vec::new(),
            output: None,
            judges: Vec::new(),
            budget: None,
            subagents: Vec::new(),
            max_depth: 1,
            roles: Vec::new(),
        }
    }

    /// The model chain of the `main` slot: `main`, then `fallbacks`.
    pub fn chain(&self) -> impl Iterator<Item = &ModelBinding> {
        std::iter::once(&self.main).chain(self.fallbacks.iter())
    }
}

/// A request to open a run.
#[derive(Debug, Clone)]
pub struct BeginRun {
    /// Tenant.
    pub tenant_id: String,
    /// Session to continue (its conversation is re-read); `None` = the run is its own session.
    pub session_id: Option<String>,
    /// Chosen run id; `None` = a new UUIDv7.
    pub run_id: Option<String>,
    /// End user.
    pub user_id: Option<String>,
    /// Caller metadata.
    pub metadata: Map<String, Value>,
    /// The user's message.
    pub message: Message,
    /// How the agent's judges run (`run.started.judges`).
    pub judges: JudgeMode,
    /// Limits of this run, journaled in `run.started.budget`; they tighten the agent's run
    /// limits key by key.
    pub budget: Option<loom_core::event::RunBudget>,
    /// Files attached to the request (checked against [`Engine::attachment_limits`], stored in
    /// the artifact store, referenced by `artifact` blocks after the message's own blocks).
    pub attachments: Vec<Attachment>,
    /// The trigger (webhook) that opened the run, journaled in `run.started.trigger`.
    pub trigger: Option<String>,
}

/// Where a run lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunRef {
    /// Tenant.
    pub tenant_id: String,
    /// Session.
    pub session_id: String,
    /// Run.
    pub run_id: String,
}

/// Why the engine could not proceed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The journal failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The journal cannot be folded.
    #[error(transparent)]
    Fold(#[from] FoldError),
    /// The journal breaks the state machine.
    #[error(transparent)]
    Projection(#[from] ProjectionError),
    /// A chosen run id already exists.
    #[error("run {run_id} already exists in session {session_id}")]
    RunExists {
        /// Run.
        run_id: String,
        /// Session.
        session_id: String,
    },
    /// Another worker drives the run.
    #[error("run {run_id}: driven by {worker_id}, lease valid until {lease_until}")]
    ClaimConflict {
        /// Run.
        run_id: String,
        /// The other worker.
        worker_id: String,
        /// End of its lease.
        lease_until: String,
    },
    /// The run was closed by someone else (a cancel from another process) while driven.
    #[error("run {0} was closed elsewhere")]
    RunMoved(String),
    /// Invalid input (ids, messages, tool schemas).
    #[error("{0}")]
    Invalid(String),
    /// The request itself is unusable as given (unusable ids, an ill-formed message, refused
    /// attachments, corrected arguments that do not fit): refused before anything is written,
    /// and sending it again unchanged cannot succeed.
    #[error("{0}")]
    Unusable(String),
    /// A run was asked in a session another agent opened: a session is continued by the agent
    /// that opened it (its sub-agents run in it as child runs). Nothing was written.
    #[error(
        "session {session_id} belongs to the agent '{owner}': the agent '{agent}' cannot add a \
         run to it (a session is continued by the agent that opened it)"
    )]
    SessionOfAnotherAgent {
        /// The session.
        session_id: String,
        /// The agent that opened it.
        owner: String,
        /// The agent asked for.
        agent: String,
    },
    /// The journal kept moving under the writer.
    #[error("session {0}: too many write conflicts, giving up")]
    Contention(String),
    /// A step produced no event (a bug: the engine never spins).
    #[error("run {0}: a step made no progress")]
    NoProgress(String),
}

/// The engine: drives runs against a journal.
#[derive(Debug, Clone)]
pub struct Engine {
    store: Arc<dyn EventStore>,
    clock: Arc<dyn Clock>,
    ids: Ids,
    worker_id: String,
    lease: Duration,
    artifacts: Option<Arc<dyn ArtifactStore>>,
    idempotency: Option<Arc<dyn IdempotencyStore>>,
    breakers: Arc<Breakers>,
    attachment_limits: Arc<AttachmentLimits>,
    stop: StopSignal,
}

impl Engine {
    /// An engine over `store`, reading time from `clock`.
    pub fn new(store: Arc<dyn EventStore>, clock: Arc<dyn Clock>) -> Engine {
        let ids = Ids::new(clock.clone());
        let id = ids.uuid();
        let worker_id = format!("worker-{}", &id[id.len() - 12..]);
        Engine {
            store,
            clock,
            ids,
            worker_id,
            lease: DEFAULT_LEASE,
            artifacts: None,
            idempotency: None,
            breakers: Arc::new(Breakers::new()),
            attachment_limits: Arc::new(AttachmentLimits::default()),
            stop: StopSignal::new(),
        }
    }

    /// The engine's stop signal, shared by its clones: once raised, every run it drives lets
    /// go without closing (see [`StopSignal`]), and [`Engine::drive`] returns the open state.
    pub fn stop_signal(&self) -> &StopSignal {
        &self.stop
    }

    /// Shares `breakers` with other engines (by default each engine, and its clones, has its
    /// own).
    pub fn with_breakers(mut self, breakers: Arc<Breakers>) -> Engine {
        self.breakers = breakers;
        self
    }

    /// The circuit breakers shared by every run of this engine.
    pub fn breakers(&self) -> &Arc<Breakers> {
        &self.breakers
    }

    /// Sets the lease duration.
    pub fn with_lease(mut self, lease: Duration) -> Engine {
        self.lease = lease;
        self
    }

    /// The lease a run's driver takes (`run.claimed` until now + lease), renewed every third
    /// of it while the run is driven.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Sets the artifact store: where large results are moved out of the context, and where
    /// the files attached to a run are kept.
    pub fn with_artifacts(mut self, artifacts: Arc<dyn ArtifactStore>) -> Engine {
        self.artifacts = Some(artifacts);
        self
    }

    /// Sets the limits on the files attached to a run (default [`AttachmentLimits::default`]).
    pub fn with_attachment_limits(mut self, limits: AttachmentLimits) -> Engine {
        self.attachment_limits = Arc::new(limits);
        self
    }

    /// The limits on the files attached to a run.
    pub fn attachment_limits(&self) -> &AttachmentLimits {
        &self.attachment_limits
    }

    /// The artifact store, if any.
    pub fn artifacts(&self) -> Option<&Arc<dyn ArtifactStore>> {
        self.artifacts.as_ref()
    }

    /// Sets the idempotency store that tools with a business key go through: a call whose key
    /// was already completed (by any run) is not run again and gets the recorded result.
    pub fn with_idempotency(mut self, store: Arc<dyn IdempotencyStore>) -> Engine {
        self.idempotency = Some(store);
        self
    }

    /// The idempotency store, if any.
    pub fn idempotency(&self) -> Option<&Arc<dyn IdempotencyStore>> {
        self.idempotency.as_ref()
    }

    /// This engine's worker id (`worker-<12 hex>`).
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// The journal.
    pub fn store(&self) -> &Arc<dyn EventStore> {
        &self.store
    }

    /// The id generator.
    pub fn ids(&self) -> &Ids {
        &self.ids
    }
}
