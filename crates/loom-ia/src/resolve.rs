//! From configuration and registered code to what the engine runs.
//!
//! Models are built once, when the configuration is opened. Agents are resolved twice:
//!
//! - when the configuration is opened ([`check_at_open`], [`Stage::Open`]), every agent, so that
//!   what the configuration alone decides is refused at load (a tool's `on_failure`, an MCP
//!   tool's contract, `local_files` rights that need an approval…).
//!   Tools, policies and conditions may still be registered in code, and a model's client
//!   may lack its API key variable: what depends on them is left to the second time;
//! - against the registered code, before an agent runs, by [`crate::Loom::validate`] and by
//!   `loom serve` before it listens ([`Stage::Run`]): everything, registered names and model
//!   clients included. Only what an MCP server lists (its tools, their schemas) waits for a
//!   run to connect.
//!
//! Every refusal names the file, line and key of the reference.
//!
//! The decisions are split by subject: [`tools`] (registered, built-in and MCP tools, their
//! overrides and contracts), [`guards`] (policies, roles, judges, contracts), [`models`]
//! (clients and slot bindings); this module assembles an agent from them.

mod guards;
mod models;
mod sandbox;
mod state;
mod tools;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use loom_config::{Config, ModelSpec};
use loom_core::{policy::Policy, ports::ToolSource, tool::Tool};
use loom_engine::{
    AgentRuntime, BudgetLimits, JudgeCondition, OnExceed as EngineOnExceed, RunLimits,
    SessionLimits, SubAgentRuntime,
};

use crate::LoomError;
use crate::budget::TenantBudget;

pub(crate) use guards::contract;
pub(crate) use models::{Models, models};
pub(crate) use sandbox::{limits as sandbox_limits, remote as remote_sandbox};

/// What code registered: tools and policies, by name.
#[derive(Default)]
pub(crate) struct Registry {
    /// Tools.
    pub(crate) tools: BTreeMap<String, Arc<dyn Tool>>,
    /// Policies (`hook` names).
    pub(crate) policies: BTreeMap<String, Arc<dyn Policy>>,
    /// Judge conditions (`when.condition` names).
    pub(crate) conditions: BTreeMap<String, Arc<dyn JudgeCondition>>,
    /// Tool source factories, and the sources built (`tool_sources`).
    pub(crate) tool_sources: Arc<crate::tool_sources::ToolSources>,
}

/// When an agent is resolved, hence what may be missing yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// The configuration is being opened: names registered in code later (tools, policies,
    /// conditions) and model clients that could not be set up are not refused yet.
    Open,
    /// An agent about to run, or every agent checked by `validate` or `loom serve`.
    Run,
}

/// Resolves agents of one configuration, for one tenant, at one [`Stage`].
pub(crate) struct Resolver<'a> {
    config: &'a Config,
    models: &'a Models,
    registry: &'a Registry,
    sources: &'a BTreeMap<String, Arc<dyn ToolSource>>,
    tenant: &'a str,
    stage: Stage,
}

/// Resolves an agent for a tenant against the registered code: rendered prompt, model
/// binding, bound tools, policies and contracts.
pub(crate) fn agent(
    config: &Config,
    models: &Models,
    registry: &Registry,
    sources: &BTreeMap<String, Arc<dyn ToolSource>>,
    name: &str,
    tenant: &str,
) -> Result<AgentRuntime, LoomError> {
    Resolver {
        config,
        models,
        registry,
        sources,
        tenant,
        stage: Stage::Run,
    }
    .agent(name, 0)
}

/// The summarizer's model of `sessions.compaction` (`id`) for `tenant`: its model mapping
/// applied, with the model's own settings.
pub(crate) fn compaction_model(
    config: &Config,
    models: &Models,
    sources: &BTreeMap<String, Arc<dyn ToolSource>>,
    tenant: &str,
    id: &str,
) -> Result<loom_engine::ModelBinding, LoomError> {
    model_binding(config, models, sources, tenant, id)
        .map_err(|unknown| {
            config
                .error_at_root("sessions.compaction.model", unknown)
                .into()
        })
        .and_then(|binding| binding)
}

/// The model `id` for `tenant` (its model mapping applied), with the model's own settings;
/// `Err(message)` when no model `id` is declared.
pub(crate) fn model_binding(
    config: &Config,
    models: &Models,
    sources: &BTreeMap<String, Arc<dyn ToolSource>>,
    tenant: &str,
    id: &str,
) -> Result<Result<loom_engine::ModelBinding, LoomError>, String> {
    let registry = Registry::default();
    let resolver = Resolver {
        config,
        models,
        registry: &registry,
        sources,
        tenant,
        stage: Stage::Run,
    };
    let model = resolver
        .model(id)
        .ok_or_else(|| format!("unknown model '{id}'"))?;
    Ok(resolver.binding(model, &loom_config::LlmSettings::default()))
}

/// The declared model `id` for `tenant` (its model mapping applied) in a slot of its own, with
/// the model's own settings: what an evaluation's variant or judge names. `None` when no model
/// has that id.
pub(crate) fn declared_model(
    config: &Config,
    models: &Models,
    sources: &BTreeMap<String, Arc<dyn ToolSource>>,
    tenant: &str,
    id: &str,
) -> Result<Option<loom_engine::ModelBinding>, LoomError> {
    let registry = Registry::default();
    let resolver = Resolver {
        config,
        models,
        registry: &registry,
        sources,
        tenant,
        stage: Stage::Run,
    };
    match resolver.model(id) {
        Some(model) => resolver
            .binding(model, &loom_config::LlmSettings::default())
            .map(Some),
        None => Ok(None),
    }
}

/// The caps on the history a run is sent: `sessions.history`, and with compaction its
/// `hard_tokens` as the last resort (a history still past it once compaction was tried is cut
/// to it, `session.trimmed` with reason `hard_tokens`).
pub(crate) fn history_caps(config: &Config) -> loom_core::state::compaction::Caps {
    let sessions = &config.raw().sessions;
    let mut caps = loom_core::state::compaction::Caps {
        max_turns: sessions.history.max_turns,
        max_tokens: sessions.history.max_tokens,
        tokens_reason: "max_tokens",
    };
    if let Some(compaction) = &sessions.compaction
        && caps
            .max_tokens
            .is_none_or(|max| max > compaction.hard_tokens)
    {
        caps.max_tokens = Some(compaction.hard_tokens);
        caps.tokens_reason = "hard_tokens";
    }
    caps
}

/// Resolves every agent of the configuration as it is opened ([`Stage::Open`]), as every
/// declared tenant may run it (its model mapping, tools and approvals): the first refusal the
/// configuration alone decides is returned.
pub(crate) fn check_at_open(
    config: &Config,
    models: &Models,
    sources: &BTreeMap<String, Arc<dyn ToolSource>>,
    tool_sources: &Arc<crate::tool_sources::ToolSources>,
) -> Result<(), LoomError> {
    let registry = Registry {
        tool_sources: tool_sources.clone(),
        ..Registry::default()
    };
    let declared = &config.raw().tenants;
    for spec in config.agents() {
        // As each declared tenant that may run it sees it; an agent no tenant may run (or
        // without a `tenants` list) as `default` sees it.
        let mut tenants: Vec<&str> = declared
            .iter()
            .filter(|t| t.allows_agent(&spec.name))
            .map(|t| t.id.as_str())
            .collect();
        if tenants.is_empty() {
            tenants.push(loom_config::DEFAULT_TENANT);
        }
        for tenant in tenants {
            Resolver {
                config,
                models,
                registry: &registry,
                sources,
                tenant,
                stage: Stage::Open,
            }
            .agent(&spec.name, 0)?;
        }
    }
    Ok(())
}

impl Resolver<'_> {
    /// The model the tenant's runs use where the configuration says `id` (its
    /// `tenants[].models` mapping), if declared.
    fn model(&self, id: &str) -> Option<&ModelSpec> {
        self.config.model(self.config.tenant_model(self.tenant, id))
    }

    /// Resolves agent `name` for runs of `depth` (0 for a root run): its sub-agents are
    /// resolved only while `depth` is below its `max_depth`, since deeper runs are never
    /// offered them.
    fn agent(&self, name: &str, depth: u32) -> Result<AgentRuntime, LoomError> {
        let config = self.config;
        let Some(spec) = config.agent(name) else {
            let known: Vec<&str> = config.agents().iter().map(|a| a.name.as_str()).collect();
            return Err(LoomError::UnknownAgent {
                name: name.to_owned(),
                known: if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                },
            });
        };
        let main = self.main_model(spec)?;
        let policies = self.policies(spec)?;
        let tools = self.tools(spec, &policies)?;
        let limits = self.limits(spec)?;
        Ok(AgentRuntime {
            name: spec.name.clone(),
            system: config.render_system(name, self.tenant)?,
            main: self.binding(main, &spec.main.llm)?,
            fallbacks: self.fallbacks(spec)?,
            tools: tools.tools,
            sources: tools.sources,
            offload_over: config.raw().execution.tools.offload_over,
            max_iterations: spec.max_iterations,
            timeout: limits.timeout,
            tool_timeout: limits.tool_timeout,
            validate_arguments: config.raw().execution.tools.validate_arguments,
            approval: limits.approval,
            policies,
            output: match &spec.output {
                Some(output) => Some(contract(output).map_err(|message| {
                    LoomError::from(config.error_at_agent(name, "output", message))
                })?),
                None => None,
            },
            judges: self.judges(spec)?,
            budget: agent_budget(config, spec, self.tenant),
            subagents: self.subagents(spec, depth)?,
            max_depth: spec.max_depth,
            roles: self.roles(spec)?,
            state: state::state_spec(config, spec)?,
            fidelity: None,
        })
    }

    /// The orchestrator's model, which must call tools when the agent has any.
    fn main_model(&self, spec: &loom_config::AgentSpec) -> Result<&ModelSpec, LoomError> {
        let model = self.model(&spec.main.model).ok_or_else(|| {
            self.config.error_at_agent(
                &spec.name,
                "main.model",
                format!("unknown model '{}'", spec.main.model),
            )
        })?;
        let has_tools = !spec.tools.is_empty() || spec.sandbox.is_some() || !spec.skills.is_empty();
        if has_tools && !model.capabilities.tools {
            return Err(self
                .config
                .error_at_agent(
                    &spec.name,
                    "main.model",
                    format!(
                        "model '{}' cannot call tools (capabilities.tools: false) but the agent \
                         has tools",
                        model.id
                    ),
                )
                .into());
        }
        Ok(model)
    }

    /// The orchestrator's fallback models, in order, each able to call tools when the agent
    /// has any.
    fn fallbacks(
        &self,
        spec: &loom_config::AgentSpec,
    ) -> Result<Vec<loom_engine::ModelBinding>, LoomError> {
        let config = self.config;
        spec.main
            .fallbacks
            .iter()
            .enumerate()
            .map(|(f, id)| {
                let key = format!("main.fallbacks[{f}]");
                let fallback = self.model(id).ok_or_else(|| {
                    LoomError::from(config.error_at_agent(
                        &spec.name,
                        &key,
                        format!("unknown model '{id}'"),
                    ))
                })?;
                if !spec.tools.is_empty() && !fallback.capabilities.tools {
                    return Err(config
                        .error_at_agent(
                            &spec.name,
                            &key,
                            format!(
                                "fallback model '{id}' cannot call tools (capabilities.tools: \
                                 false) but the agent has tools"
                            ),
                        )
                        .into());
                }
                self.binding(fallback, &spec.main.llm)
            })
            .collect()
    }

    /// The agent's timeout, the tools' default timeout and its approval settings.
    fn limits(&self, spec: &loom_config::AgentSpec) -> Result<Limits, LoomError> {
        let config = self.config;
        let duration = |key: &str, secs: Option<f64>| -> Result<Option<Duration>, LoomError> {
            match secs {
                Some(secs) => Ok(Some(seconds(secs).ok_or_else(|| {
                    config.error_at_agent(
                        &spec.name,
                        key,
                        format!("{secs} s is not a usable duration"),
                    )
                })?)),
                None => Ok(None),
            }
        };
        let tool_timeout = match config.raw().execution.tools.timeout {
            Some(secs) => Some(seconds(secs).ok_or_else(|| {
                config.error_at_root("execution.tools.timeout", "not a usable duration")
            })?),
            None => None,
        };
        Ok(Limits {
            timeout: duration("timeout", spec.timeout)?,
            tool_timeout,
            approval: loom_engine::ApprovalSettings {
                expires_in: duration("approval.expires_in", spec.approval.expires_in)?,
                on_expiry: spec.approval.on_expiry,
            },
        })
    }

    /// The agent's sub-agents as tools, while `depth` is below its `max_depth`.
    fn subagents(
        &self,
        spec: &loom_config::AgentSpec,
        depth: u32,
    ) -> Result<Vec<SubAgentRuntime>, LoomError> {
        if depth >= spec.max_depth {
            return Ok(Vec::new());
        }
        let tenant = self.config.tenant(self.tenant);
        spec.subagents
            .iter()
            .filter(|sub| !tenant.is_some_and(|t| t.denies(sub.tool_name())))
            .map(|sub| {
                let child = self.agent(&sub.agent, depth + 1)?;
                // Filled from the agent's own description when loading the configuration.
                let description = sub.description.clone().unwrap_or_default();
                let mut runtime =
                    SubAgentRuntime::new(sub.tool_name().to_owned(), description, Arc::new(child));
                runtime.budget_share = sub.budget_share;
                Ok(runtime)
            })
            .collect()
    }
}

/// An agent's time limits and approval settings.
struct Limits {
    timeout: Option<Duration>,
    tool_timeout: Option<Duration>,
    approval: loom_engine::ApprovalSettings,
}

/// The agent's run and session budgets for `tenant` (root `budgets`, then the tenant's, then
/// the agent's `budget`, key by key); `None` when no limit is set.
fn agent_budget(
    config: &Config,
    spec: &loom_config::AgentSpec,
    tenant: &str,
) -> Option<BudgetLimits> {
    let budgets = config.effective_budgets_for(&spec.name, tenant);
    let limits = BudgetLimits {
        run: RunLimits {
            max_cost: budgets.run.max_cost,
            max_tokens: budgets.run.max_tokens,
            max_calls: budgets.run.max_calls,
        },
        session: SessionLimits {
            max_cost: budgets.session.max_cost,
            max_tokens: budgets.session.max_tokens,
        },
        on_exceed: match budgets.exceed_action() {
            loom_config::OnExceed::Stop => EngineOnExceed::Stop,
            loom_config::OnExceed::Warn => EngineOnExceed::Warn,
        },
    };
    (!limits.run.is_empty() || !limits.session.is_empty()).then_some(limits)
}

/// The period ceilings of each tenant (root `budgets.tenant`, then the tenant's own), for
/// every declared tenant (`default` without a `tenants` list).
pub(crate) fn tenant_budgets(config: &Config) -> BTreeMap<String, TenantBudget> {
    let root = &config.raw().budgets;
    let tenants: Vec<(String, loom_config::Budgets)> = if config.raw().tenants.is_empty() {
        vec![(loom_config::DEFAULT_TENANT.to_owned(), root.clone())]
    } else {
        config
            .raw()
            .tenants
            .iter()
            .map(|t| {
                let budgets = match &t.budgets {
                    Some(own) => root.overlay(own),
                    None => root.clone(),
                };
                (t.id.clone(), budgets)
            })
            .collect()
    };
    tenants
        .into_iter()
        .filter_map(|(id, budgets)| {
            let ceilings = TenantBudget {
                max_cost_per_day: budgets.tenant.max_cost_per_day,
                max_tokens_per_day: budgets.tenant.max_tokens_per_day,
                max_cost_per_month: budgets.tenant.max_cost_per_month,
                max_tokens_per_month: budgets.tenant.max_tokens_per_month,
            };
            (!ceilings.is_empty()).then_some((id, ceilings))
        })
        .collect()
}

/// Whether paused runs survive the process: any journal but `memory`, or the `dev` profile
/// (where losing them at exit is accepted).
fn durable(config: &Config) -> bool {
    config.raw().storage.events.backend != loom_config::EventsBackend::Memory
        || config.profile() == Some(loom_config::Profile::Dev)
}

/// A positive number of seconds as a duration, `None` when it cannot be one (too large).
fn seconds(secs: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
}

#[cfg(all(test, not(feature = "fetch")))]
mod tests {
    #[test]
    fn fetch_page_is_refused_without_its_feature() {
        let reference: loom_config::ToolRef =
            serde_json::from_value(serde_json::json!({"tool": "loom.fetch_page"})).unwrap();
        let refusal = super::tools::fetch_page(&reference).unwrap_err();
        assert!(refusal.contains("Cargo feature 'fetch'"), "{refusal}");
    }
}
