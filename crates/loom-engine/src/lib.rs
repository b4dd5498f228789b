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
//! **Architecture invariant:** the engine depends on `loom-core` only. It reaches storage,
//! models, tools and the wall clock through the ports it is given (`Arc<dyn EventStore>`,
//! `Arc<dyn ModelClient>`, `Arc<dyn Tool>`, `Arc<dyn Clock>`); it reads no environment
//! variable and no configuration file.

mod driver;
mod ids;
mod offload;
mod request;
mod tools;
mod writer;

use std::{fmt, sync::Arc, time::Duration};

use loom_core::{
    Message,
    model::ModelClient,
    ports::{ArtifactStore, Clock, EventStore, StoreError, ToolSource},
    state::{FoldError, ProjectionError},
    tool::{Tool, ToolDeclarations},
    usage::Pricing,
};
use serde_json::{Map, Value};

pub use driver::Observer;
pub use ids::Ids;
pub use offload::artifact_read as artifact_reader;
pub use request::request_hash;
pub use tools::{UNKNOWN_STATE, idempotency_key};

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
            validator: Arc::new(validator),
        })
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.tool.spec().name
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
}

/// Where a run lives.
#[derive(Debug, Clone, PartialEq, Eq)]
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
        }
    }

    /// Sets the lease duration.
    pub fn with_lease(mut self, lease: Duration) -> Engine {
        self.lease = lease;
        self
    }

    /// Sets the artifact store where large results are moved out of the context.
    pub fn with_artifacts(mut self, artifacts: Arc<dyn ArtifactStore>) -> Engine {
        self.artifacts = Some(artifacts);
        self
    }

    /// The artifact store, if any.
    pub fn artifacts(&self) -> Option<&Arc<dyn ArtifactStore>> {
        self.artifacts.as_ref()
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
