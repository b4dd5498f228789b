//! What an agent is bound to: its models ([`ModelBinding`]), tools ([`BoundTool`]), policies
//! ([`BoundPolicy`]) and tool sources ([`BoundSource`]), each with what the engine needs to use
//! it (a compiled argument schema, retry and breaker settings, the points a policy is hooked on).

use std::{fmt, sync::Arc, time::Duration};

use loom_core::{
    model::ModelClient,
    policy::{Point, Policy},
    ports::ToolSource,
    tool::{Tool, ToolDeclarations},
    usage::Pricing,
};
use serde_json::{Map, Value};

use crate::{
    contract,
    error::EngineError,
    resilience::{CircuitSettings, ModelTimeouts, RetryPolicy},
};

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
    /// Provider parameters, shared with every request to the model.
    pub params: Arc<Map<String, Value>>,
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
    /// Whether the model accepts a forced tool call (`capabilities.forced_tool_choice`): a
    /// judge on a model that does not is asked for its verdict with `tool_choice: auto`.
    pub forced_tool_choice: bool,
}

impl ModelBinding {
    /// A binding with default settings: no pricing, no token cap, no parameters, the default
    /// [`RetryPolicy`], [`ModelTimeouts`] and [`CircuitSettings`], no declared context window,
    /// no vision, forced tool calls accepted.
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
            params: Arc::default(),
            retry: RetryPolicy::default(),
            timeouts: ModelTimeouts::default(),
            circuit: Some(CircuitSettings::default()),
            context_window: None,
            vision: false,
            forced_tool_choice: true,
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
    validator: Arc<loom_schema::Validator>,
    /// The argument schema as offered to models, shared by every request.
    input_schema: Arc<Value>,
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
        let validator = loom_schema::compile(&tool.spec().input_schema).map_err(|e| {
            EngineError::Invalid(format!(
                "tool '{}': its argument schema is not a valid JSON Schema: {e}",
                tool.spec().name
            ))
        })?;
        let input_schema = Arc::new(tool.spec().input_schema.clone());
        Ok(BoundTool {
            tool,
            declarations,
            description,
            contract: None,
            validator: Arc::new(validator),
            input_schema,
        })
    }

    /// The argument schema as offered to models.
    pub fn input_schema(&self) -> &Arc<Value> {
        &self.input_schema
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
    /// The contracts the results of some of its tools must meet, by the name the model sees
    /// (an MCP tool's `output`, declared in the configuration).
    pub contracts: std::collections::BTreeMap<String, contract::Contract>,
}
