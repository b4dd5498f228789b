//! What the engine runs: an agent ([`AgentRuntime`]) resolved from configuration and code,
//! with the agents it offers as tools ([`SubAgentRuntime`]).

use std::{sync::Arc, time::Duration};

use loom_core::approval::OnExpiry;

use crate::{
    binding::{BoundPolicy, BoundSource, BoundTool, ModelBinding},
    budget::BudgetLimits,
    contract,
    judges::JudgeRuntime,
    roles::RoleRuntime,
    session_state::StateSpec,
};

/// The default per-call tool timeout (`execution.tools.timeout`).
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// Roles, offered to the orchestrator as tools after `tools` (see [`crate::roles`]).
    pub roles: Vec<RoleRuntime>,
    /// Session state: the declared keys, their limits, what the orchestrator is shown.
    pub state: StateSpec,
    /// The markers the final output must keep (the `_compaction` agent's fidelity check, see
    /// [`crate::fidelity`]); `None` for every other agent.
    pub fidelity: Option<crate::fidelity::Fidelity>,
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
            state: StateSpec::default(),
            fidelity: None,
        }
    }

    /// The model chain of the `main` slot: `main`, then `fallbacks`.
    pub fn chain(&self) -> impl Iterator<Item = &ModelBinding> {
        std::iter::once(&self.main).chain(self.fallbacks.iter())
    }

    /// The agent named `name` in this agent's tree of sub-agents (this agent included).
    pub(crate) fn find(&self, name: &str) -> Option<&AgentRuntime> {
        if self.name == name {
            return Some(self);
        }
        self.subagents.iter().find_map(|sub| sub.agent.find(name))
    }
}

/// An agent offered to another as a tool (`subagents:` of the calling agent).
#[derive(Debug, Clone)]
pub struct SubAgentRuntime {
    /// The tool name the model calls (the agent's name unless renamed).
    pub name: String,
    /// What the tool does, offered to the model (followed by [`crate::AGENT_HINT`]).
    pub description: String,
    /// The agent that runs each call, as a child run.
    pub agent: Arc<AgentRuntime>,
    /// The part, in `(0, 1]`, of what remains of the caller's run budget that the child run
    /// receives (`None`: the child run has no budget of its own).
    pub budget_share: Option<f64>,
}

impl SubAgentRuntime {
    /// Offers `agent` under `name`, without a budget share.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        agent: Arc<AgentRuntime>,
    ) -> SubAgentRuntime {
        SubAgentRuntime {
            name: name.into(),
            description: description.into(),
            agent,
            budget_share: None,
        }
    }
}
