//! From configuration and registered code to what the engine runs.
//!
//! Models are built once, when the configuration is loaded. Agents are resolved against the
//! registered tools when first used (or by [`crate::Loom::validate`]), so tools can be
//! registered after loading; every refusal names the file, line and key of the reference.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use crate::budget::TenantBudget;
use loom_builtins::{Folder, Right, Rights};
use loom_config::{Config, ConfigError, FolderRight, ModelSpec, Sdk};
use loom_core::policy::{DecisionKind, Point, Policy, REQUIRE_TOOL, RequireTool};
use loom_core::{
    model::ModelClient,
    ports::ToolSource,
    tool::{Approval, OnUnknown, Tool, ToolDeclarations},
};
use loom_engine::{
    AgentRuntime, BoundPolicy, BoundSource, BoundTool, BudgetLimits, ContextScope as JudgeScope,
    Criterion, JudgeCondition, JudgeContext, JudgeRuntime, ModelBinding,
    OnExceed as EngineOnExceed, PolicyOnError, RunLimits, SessionLimits, SubAgentRuntime,
    contract::{Contract, ContractSpec, OnFailure, RepairSettings, RepairTools},
    roles::{RoleContext, RoleRuntime},
};

use crate::sources::AgentSource;
use loom_models::FakeModel;

use crate::LoomError;

/// The clients of the declared models; a provider that cannot be set up (a missing API key
/// variable) is only an error for the agents that use it.
pub(crate) type Models = BTreeMap<String, Result<Arc<dyn ModelClient>, ConfigError>>;

/// Builds the client of every declared model.
pub(crate) fn models(config: &Config) -> Result<Models, LoomError> {
    let mut clients: Models = BTreeMap::new();
    for (index, spec) in config.raw().models.iter().enumerate() {
        let client: Result<Arc<dyn ModelClient>, ConfigError> = match spec.sdk {
            Sdk::Fake => {
                let model =
                    FakeModel::from_params(spec.model.clone(), &spec.params).map_err(|e| {
                        config.error_at_root(
                            &format!("models[{index}].params.script{}", e.path),
                            e.message,
                        )
                    })?;
                Ok(Arc::new(model))
            }
            Sdk::Anthropic | Sdk::Openai => match provider(config, index, spec) {
                Ok(client) => Ok(client),
                Err(LoomError::Config(error)) => Err(*error),
                Err(other) => return Err(other),
            },
        };
        clients.insert(spec.id.clone(), client);
    }
    Ok(clients)
}

/// What code registered: tools and policies, by name.
pub(crate) struct Registry {
    /// Tools.
    pub(crate) tools: BTreeMap<String, Arc<dyn Tool>>,
    /// Policies (`hook` names).
    pub(crate) policies: BTreeMap<String, Arc<dyn Policy>>,
    /// Judge conditions (`when.condition` names).
    pub(crate) conditions: BTreeMap<String, Arc<dyn JudgeCondition>>,
}

/// Resolves an agent for a tenant: rendered prompt, model binding, bound tools, policies and
/// contracts.
pub(crate) fn agent(
    config: &Config,
    models: &Models,
    registry: &Registry,
    sources: &BTreeMap<String, Arc<dyn ToolSource>>,
    name: &str,
    tenant: &str,
) -> Result<AgentRuntime, LoomError> {
    agent_at(config, models, registry, sources, name, tenant, 0)
}

/// Resolves an agent whose runs have `depth` (0 for a root run): its sub-agents are resolved
/// only while `depth` is below its `max_depth`, since deeper runs are never offered them.
fn agent_at(
    config: &Config,
    models: &Models,
    registry: &Registry,
    sources: &BTreeMap<String, Arc<dyn ToolSource>>,
    name: &str,
    tenant: &str,
    depth: u32,
) -> Result<AgentRuntime, LoomError> {
    let tools = &registry.tools;
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
    let model_spec: &ModelSpec = config.model(&spec.main.model).ok_or_else(|| {
        config.error_at_agent(
            name,
            "main.model",
            format!("unknown model '{}'", spec.main.model),
        )
    })?;
    if !spec.tools.is_empty() && !model_spec.capabilities.tools {
        return Err(config
            .error_at_agent(
                name,
                "main.model",
                format!("model '{}' cannot call tools (capabilities.tools: false) but the agent has tools", model_spec.id),
            )
            .into());
    }
    let policies = agent_policies(config, registry, spec)?;
    let execution = &config.raw().execution.tools;
    let mut bound: Vec<BoundTool> = Vec::with_capacity(spec.tools.len());
    let mut bound_sources: Vec<BoundSource> = Vec::new();
    for (index, reference) in spec.tools.iter().enumerate() {
        let at = |key: &str, message: String| {
            LoomError::from(config.error_at_agent(name, &format!("tools[{index}].{key}"), message))
        };
        if let Some(server) = &reference.mcp {
            let Some(source) = sources.get(server) else {
                return Err(at("mcp", format!("unknown MCP server '{server}'")));
            };
            for (tool, overrides) in &reference.tools {
                if overrides.output.is_some() {
                    // Tools of a source are bound when a run opens it, without contracts.
                    return Err(at(
                        &format!("tools.{tool}.output"),
                        format!(
                            "an output contract on the MCP tool '{server}__{tool}' is not \
                             supported in this version; give contracts to registered tools"
                        ),
                    ));
                }
                match overrides.approval {
                    Some(Approval::Policy) if !can_pause(&policies) => {
                        return Err(at(
                            &format!("tools.{tool}.approval"),
                            loom_config::APPROVAL_POLICY.to_owned(),
                        ));
                    }
                    Some(Approval::Always) if !durable(config) => {
                        return Err(at(
                            &format!("tools.{tool}.approval"),
                            not_durable(&format!("{server}__{tool}")),
                        ));
                    }
                    _ => {}
                }
            }
            let agent_source = AgentSource::new(
                source.clone(),
                server,
                reference.alias.as_deref(),
                reference.include.clone(),
                reference.exclude.clone(),
                reference.tools.clone(),
            );
            bound_sources.push(BoundSource {
                source: Arc::new(agent_source),
                required: reference.required,
            });
            continue;
        }
        let tool_name = reference.tool.clone().unwrap_or_default();
        let tool: Arc<dyn Tool> = if tool_name.starts_with("loom.") {
            builtins(config, &tool_name, reference).map_err(|message| at("tool", message))?
        } else {
            let Some(tool) = tools.get(&tool_name) else {
                let registered: Vec<&str> = tools.keys().map(String::as_str).collect();
                let registered = if registered.is_empty() {
                    "none".to_owned()
                } else {
                    registered.join(", ")
                };
                return Err(at(
                    "tool",
                    format!("unknown tool '{tool_name}' (registered tools: {registered})"),
                ));
            };
            tool.clone()
        };
        let tool = &tool;
        if bound.iter().any(|b| b.name() == tool.spec().name) {
            return Err(at("tool", format!("tool '{tool_name}' is listed twice")));
        }
        let mut declarations: ToolDeclarations = tool.spec().declarations.clone();
        if let Some(side_effects) = reference.side_effects {
            declarations.side_effects = side_effects;
        }
        if let Some(approval) = reference.approval {
            declarations.approval = approval;
        }
        if let Some(idempotent) = reference.idempotent {
            declarations.idempotent = idempotent;
        }
        if let Some(timeout) = reference.timeout {
            let timeout = seconds(timeout)
                .ok_or_else(|| at("timeout", format!("{timeout} s is not a usable duration")))?;
            declarations.timeout = Some(timeout);
        }
        if let Some(offload_over) = reference.offload_over {
            declarations.offload_over = Some(offload_over);
        }
        let from_yaml = |yaml: bool, key: &'static str| if yaml { key } else { "tool" };
        if declarations.approval == Approval::Policy && !can_pause(&policies) {
            return Err(at(
                from_yaml(reference.approval.is_some(), "approval"),
                format!("tool '{tool_name}': {}", loom_config::APPROVAL_POLICY),
            ));
        }
        let can_pause = declarations.approval == Approval::Always
            || declarations.on_unknown == OnUnknown::Pause;
        if can_pause && !durable(config) {
            let key = from_yaml(reference.approval == Some(Approval::Always), "approval");
            return Err(at(key, not_durable(&tool_name)));
        }
        if declarations.business_key.is_some() && config.raw().storage.idempotency.is_none() {
            return Err(at(
                "tool",
                format!(
                    "tool '{tool_name}' declares a business key, which needs a shared durable \
                     idempotency store so that two runs never perform the same action twice; \
                     declare storage.idempotency: {{backend: sqlite, path: ...}}"
                ),
            ));
        }
        let description = reference
            .description
            .clone()
            .unwrap_or_else(|| tool.spec().description.clone());
        let mut bound_tool = BoundTool::new(tool.clone(), declarations, description)
            .map_err(|e| at("tool", e.to_string()))?;
        if let Some(output) = &reference.output {
            if output.on_failure != loom_config::OnFailure::Fail {
                // The engine turns a tool result that breaks its contract into an error result;
                // keeping it flagged or replacing it is not implemented for tools.
                return Err(at(
                    "output.on_failure",
                    format!(
                        "tool '{tool_name}': on_failure '{}' is not supported for a tool's \
                         output contract in this version (a result that breaks it becomes an \
                         error result the model reads); use on_failure: fail",
                        on_failure(output.on_failure).as_str()
                    ),
                ));
            }
            if output.repair != loom_config::RepairSettings::default() {
                // A tool is never repaired: a result that breaks its contract is an error.
                return Err(at(
                    "output.repair",
                    format!(
                        "tool '{tool_name}': a tool is never repaired (a result that breaks its \
                         contract becomes an error result the model reads); remove output.repair"
                    ),
                ));
            }
            bound_tool = bound_tool
                .with_contract(contract(output).map_err(|message| at("output", message))?);
        }
        bound.push(bound_tool);
    }
    Ok(AgentRuntime {
        name: spec.name.clone(),
        system: config.render_system(name, tenant)?,
        main: binding(config, models, model_spec, &spec.main.llm)?,
        fallbacks: spec
            .main
            .fallbacks
            .iter()
            .enumerate()
            .map(|(f, id)| {
                let fallback = config.model(id).ok_or_else(|| {
                    LoomError::from(config.error_at_agent(name, &format!("main.fallbacks[{f}]"), format!("unknown model '{id}'")))
                })?;
                if !spec.tools.is_empty() && !fallback.capabilities.tools {
                    return Err(config
                        .error_at_agent(
                            name,
                            &format!("main.fallbacks[{f}]"),
                            format!("fallback model '{id}' cannot call tools (capabilities.tools: false) but the agent has tools"),
                        )
                        .into());
                }
                binding(config, models, fallback, &spec.main.llm)
            })
            .collect::<Result<Vec<_>, LoomError>>()?,
        tools: bound,
        sources: bound_sources,
        offload_over: execution.offload_over,
        max_iterations: spec.max_iterations,
        timeout: match spec.timeout {
            Some(secs) => Some(seconds(secs).ok_or_else(|| {
                config.error_at_agent(
                    name,
                    "timeout",
                    format!("{secs} s is not a usable duration"),
                )
            })?),
            None => None,
        },
        tool_timeout: match execution.timeout {
            Some(secs) => Some(seconds(secs).ok_or_else(|| {
                config.error_at_root("execution.tools.timeout", "not a usable duration")
            })?),
            None => None,
        },
        validate_arguments: execution.validate_arguments,
        approval: loom_engine::ApprovalSettings {
            expires_in: match spec.approval.expires_in {
                Some(secs) => Some(seconds(secs).ok_or_else(|| {
                    config.error_at_agent(
                        name,
                        "approval.expires_in",
                        format!("{secs} s is not a usable duration"),
                    )
                })?),
                None => None,
            },
            on_expiry: spec.approval.on_expiry,
        },
        policies,
        output: match &spec.output {
            Some(output) => Some(contract(output).map_err(|message| {
                LoomError::from(config.error_at_agent(name, "output", message))
            })?),
            None => None,
        },
        judges: agent_judges(config, models, registry, spec, name, tenant)?,
        budget: agent_budget(config, spec, tenant),
        subagents: if depth < spec.max_depth {
            spec.subagents
                .iter()
                .map(|sub| {
                    let child = agent_at(config, models, registry, sources, &sub.agent, tenant, depth + 1)?;
                    // Filled from the agent's own description when loading the configuration.
                    let description = sub.description.clone().unwrap_or_default();
                    let mut runtime = SubAgentRuntime::new(
                        sub.tool_name().to_owned(),
                        description,
                        Arc::new(child),
                    );
                    runtime.budget_share = sub.budget_share;
                    Ok(runtime)
                })
                .collect::<Result<Vec<_>, LoomError>>()?
        } else {
            Vec::new()
        },
        max_depth: spec.max_depth,
        roles: agent_roles(config, models, spec, name, tenant)?,
    })
}

/// The agent's policies, in declared order: built-in hooks, or policies registered in code.
fn agent_policies(
    config: &Config,
    registry: &Registry,
    spec: &loom_config::AgentSpec,
) -> Result<Vec<BoundPolicy>, LoomError> {
    let mut bound = Vec::with_capacity(spec.policies.len());
    for (index, reference) in spec.policies.iter().enumerate() {
        let at = |key: &str, message: String| {
            LoomError::from(config.error_at_agent(
                &spec.name,
                &format!("policies[{index}].{key}"),
                message,
            ))
        };
        let policy: Arc<dyn Policy> = if reference.hook == REQUIRE_TOOL {
            Arc::new(RequireTool)
        } else {
            let Some(policy) = registry.policies.get(&reference.hook) else {
                let registered: Vec<&str> = registry.policies.keys().map(String::as_str).collect();
                return Err(at(
                    "hook",
                    format!(
                        "unknown policy '{}' (registered policies: {}; built in: {REQUIRE_TOOL}); \
                         register it in code (Loom::register_policy, loom_cli::App::policy)",
                        reference.hook,
                        if registered.is_empty() {
                            "none".to_owned()
                        } else {
                            registered.join(", ")
                        }
                    ),
                ));
            };
            policy.clone()
        };
        let points: Vec<Point> = match &reference.points {
            Some(points) => points
                .iter()
                .filter_map(|p| Point::parse(p.as_str()))
                .collect(),
            None => policy.points().to_vec(),
        };
        let name = reference.policy_name().to_owned();
        // A point the hook does not declare, or one that refuses a decision it declares:
        // located at that point when `points` is written, else at the hook (all its points).
        let undeclared = points.iter().position(|p| !policy.points().contains(p));
        let refusing = points
            .iter()
            .position(|&point| policy.decisions().iter().any(|&kind| !point.allows(kind)));
        let hooked_at = match undeclared.or(refusing) {
            Some(i) if reference.points.is_some() => format!("points[{i}]"),
            _ => "hook".to_owned(),
        };
        let mut hooked = BoundPolicy::on(name, policy.clone(), points)
            .map_err(|e| at(&hooked_at, e.to_string()))?;
        if policy.decisions().contains(&DecisionKind::Pause)
            && hooked.points.contains(&Point::BeforeTool)
            && !durable(config)
        {
            return Err(at(
                "hook",
                format!(
                    "policy '{}' can pause the run for a human decision, which needs a durable \
                     journal: with the memory journal a paused run is lost at exit; use \
                     storage.events.backend: jsonl or sqlite (or the dev profile)",
                    hooked.name
                ),
            ));
        }
        hooked.params = reference.params.clone();
        hooked.timeout = Some(seconds(reference.timeout).ok_or_else(|| {
            at(
                "timeout",
                format!("{} s is not a usable duration", reference.timeout),
            )
        })?);
        hooked.on_error = match reference.on_error {
            loom_config::OnError::Block => PolicyOnError::Block,
            loom_config::OnError::Allow => PolicyOnError::Allow,
        };
        hooked.max_attempts = reference.max_attempts;
        bound.push(hooked);
    }
    Ok(bound)
}

/// The agent's roles (`roles:`): their models, rendered system prompts, declared context,
/// contract and timeout.
fn agent_roles(
    config: &Config,
    models: &Models,
    spec: &loom_config::AgentSpec,
    name: &str,
    tenant: &str,
) -> Result<Vec<RoleRuntime>, LoomError> {
    spec.roles
        .iter()
        .enumerate()
        .map(|(r, role)| {
            let at = |key: &str, message: String| {
                LoomError::from(config.error_at_agent(name, &format!("roles[{r}].{key}"), message))
            };
            if role.judge.is_some() {
                return Err(at(
                    "judge",
                    "a judge on a role is not implemented in this version yet (judge the agent's \
                     final output with the agent's judge:)"
                        .to_owned(),
                ));
            }
            let model_of = |key: &str, id: &str| {
                config
                    .model(id)
                    .ok_or_else(|| at(key, format!("unknown model '{id}'")))
                    .and_then(|m| binding(config, models, m, &role.llm))
            };
            let mut runtime = RoleRuntime::new(
                role.name.clone(),
                role.description.clone(),
                config.render_role_system(name, &role.name, tenant)?,
                model_of("model", &role.model)?,
            );
            for (f, id) in role.fallbacks.iter().enumerate() {
                runtime
                    .fallbacks
                    .push(model_of(&format!("fallbacks[{f}]"), id)?);
            }
            runtime.input_schema = serde_json::Value::Object(role.input_schema.clone());
            runtime.input_template = role.input_template.clone();
            runtime.context = role
                .context
                .iter()
                .map(|item| match item {
                    loom_config::ContextItem::Name(loom_config::ContextName::UserInput) => {
                        RoleContext::UserInput
                    }
                    loom_config::ContextItem::Name(loom_config::ContextName::CallerContext) => {
                        RoleContext::CallerContext
                    }
                    loom_config::ContextItem::Name(loom_config::ContextName::Attachments) => {
                        RoleContext::Attachments
                    }
                    loom_config::ContextItem::ToolResults(results) => RoleContext::ToolResults {
                        tools: results.tool_results.clone(),
                        scope: match results.scope {
                            loom_config::ContextScope::Run => JudgeScope::Run,
                            loom_config::ContextScope::Session => JudgeScope::Session,
                        },
                    },
                    loom_config::ContextItem::LastTurns(turns) => {
                        RoleContext::LastTurns(turns.last_turns)
                    }
                })
                .collect();
            runtime.terminal = role.terminal;
            runtime.timeout =
                match role.timeout {
                    Some(secs) => Some(seconds(secs).ok_or_else(|| {
                        at("timeout", format!("{secs} s is not a usable duration"))
                    })?),
                    None => None,
                };
            if let Some(output) = &role.output {
                runtime.output = Some(contract(output).map_err(|message| at("output", message))?);
            }
            runtime
                .bind()
                .map_err(|e| at("input_schema", e.to_string()))?;
            Ok(runtime)
        })
        .collect()
}

/// The agent's judge (`judge:`), with its model chain, its condition and the active profile.
fn agent_judges(
    config: &Config,
    models: &Models,
    registry: &Registry,
    spec: &loom_config::AgentSpec,
    name: &str,
    _tenant: &str,
) -> Result<Vec<JudgeRuntime>, LoomError> {
    let Some(judge) = &spec.judge else {
        return Ok(Vec::new());
    };
    let at = |key: &str, message: String| {
        LoomError::from(config.error_at_agent(name, &format!("judge.{key}"), message))
    };
    let model_of = |key: &str, id: &str| {
        config
            .model(id)
            .ok_or_else(|| at(key, format!("unknown model '{id}'")))
            .and_then(|m| binding(config, models, m, &judge.llm))
    };
    let main = model_of("model", &judge.model)?;
    let criteria = judge
        .criteria
        .iter()
        .map(|c| Criterion {
            name: c.name.clone(),
            rule: c.rule.clone(),
            min_score: c.min_score,
            blocking: c.blocking,
        })
        .collect();
    let judge_name = judge.name.clone().unwrap_or_else(|| "output".to_owned());
    let mut runtime =
        JudgeRuntime::new(judge_name, main, criteria).map_err(|e| at("criteria", e.to_string()))?;
    for (f, id) in judge.fallbacks.iter().enumerate() {
        runtime
            .fallbacks
            .push(model_of(&format!("fallbacks[{f}]"), id)?);
    }
    for item in &judge.context {
        runtime.context.push(match item {
            loom_config::ContextItem::Name(loom_config::ContextName::UserInput) => {
                JudgeContext::UserInput
            }
            loom_config::ContextItem::Name(loom_config::ContextName::CallerContext) => {
                JudgeContext::CallerContext
            }
            loom_config::ContextItem::Name(other) => {
                return Err(at(
                    "context",
                    format!(
                        "context '{}' is not available to judges in this version",
                        other.as_str()
                    ),
                ));
            }
            loom_config::ContextItem::ToolResults(results) => JudgeContext::ToolResults {
                tools: results.tool_results.clone(),
                scope: match results.scope {
                    loom_config::ContextScope::Run => JudgeScope::Run,
                    loom_config::ContextScope::Session => JudgeScope::Session,
                },
            },
            loom_config::ContextItem::LastTurns(turns) => JudgeContext::LastTurns(turns.last_turns),
        });
    }
    runtime.when.sample = judge.when.sample;
    runtime.when.tenants = judge.when.tenants.clone();
    runtime.when.profiles = judge
        .when
        .profiles
        .as_ref()
        .map(|profiles| profiles.iter().map(|p| p.as_str().to_owned()).collect());
    if let Some(condition) = &judge.when.condition {
        let Some(registered) = registry.conditions.get(condition) else {
            let known: Vec<&str> = registry.conditions.keys().map(String::as_str).collect();
            return Err(at(
                "when.condition",
                format!(
                    "unknown condition '{condition}' (registered conditions: {}); register it in \
                     code (Loom::register_condition)",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        };
        runtime.when.condition = Some(registered.clone());
    }
    runtime.profile = config.profile().map(|p| p.as_str().to_owned());
    runtime.repair = RepairSettings {
        max_attempts: judge.repair.max_attempts,
        tools: repair_tools(judge.repair.tools),
    };
    runtime.on_failure = on_failure(judge.on_failure);
    runtime.fallback_message = judge.fallback_message.clone();
    runtime.max_tokens = judge.llm.max_tokens;
    runtime.timeout = match judge.timeout {
        Some(secs) => Some(
            seconds(secs)
                .ok_or_else(|| at("timeout", format!("{secs} s is not a usable duration")))?,
        ),
        None => None,
    };
    runtime.on_error = match judge.on_error {
        loom_config::OnError::Block => PolicyOnError::Block,
        loom_config::OnError::Allow => PolicyOnError::Allow,
    };
    Ok(vec![runtime])
}

fn repair_tools(tools: loom_config::RepairTools) -> RepairTools {
    match tools {
        loom_config::RepairTools::Auto => RepairTools::Auto,
        loom_config::RepairTools::None => RepairTools::None,
        loom_config::RepairTools::Allowed => RepairTools::Allowed,
    }
}

fn on_failure(on_failure: loom_config::OnFailure) -> OnFailure {
    match on_failure {
        loom_config::OnFailure::Fail => OnFailure::Fail,
        loom_config::OnFailure::Unverified => OnFailure::Unverified,
        loom_config::OnFailure::Fallback => OnFailure::Fallback,
    }
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

/// Whether one of `policies` can ask a human before a tool call (`approval: policy`).
fn can_pause(policies: &[BoundPolicy]) -> bool {
    policies.iter().any(|p| {
        p.points.contains(&Point::BeforeTool) && p.policy.decisions().contains(&DecisionKind::Pause)
    })
}

/// The engine's contract for a configured `output:` block (its `schema_file` already loaded
/// into `schema` by the configuration).
pub(crate) fn contract(spec: &loom_config::OutputContract) -> Result<Contract, String> {
    Contract::new(ContractSpec {
        schema: spec.schema.clone().map(serde_json::Value::Object),
        must_match: spec.must_match.clone(),
        must_not_match: spec.must_not_match.clone(),
        max_chars: spec
            .max_chars
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        normalize: spec.normalize,
        repair: RepairSettings {
            max_attempts: spec.repair.max_attempts,
            tools: repair_tools(spec.repair.tools),
        },
        on_failure: on_failure(spec.on_failure),
        fallback_message: spec.fallback_message.clone(),
    })
    .map_err(|e| e.to_string())
}

/// Whether paused runs survive the process: any journal but `memory`, or the `dev` profile
/// (where losing them at exit is accepted).
fn durable(config: &Config) -> bool {
    config.raw().storage.events.backend != loom_config::EventsBackend::Memory
        || config.profile() == Some(loom_config::Profile::Dev)
}

/// Why a tool that can pause the run is refused on the memory journal.
fn not_durable(tool: &str) -> String {
    format!(
        "tool '{tool}' can pause the run for a human decision (approval: always or on_unknown: pause), \
         which needs a durable journal: with the memory journal a paused run is lost at exit; \
         use storage.events.backend: jsonl (or the dev profile)"
    )
}

/// A built-in tool (`tool: loom.<name>`) with its parameters.
fn builtins(
    config: &Config,
    name: &str,
    reference: &loom_config::ToolRef,
) -> Result<Arc<dyn Tool>, String> {
    match name {
        "loom.current_datetime" => Ok(Arc::new(loom_builtins::current_datetime(Arc::new(
            crate::SystemClock,
        )))),
        "loom.local_files" => {
            let mut folders = Vec::new();
            for folder in reference.folders.iter().flatten() {
                let rights = Rights::list(folder.rights.iter().map(|right| match right {
                    FolderRight::Read => Right::Read,
                    FolderRight::Write => Right::Write,
                    FolderRight::Overwrite => Right::Overwrite,
                    FolderRight::Delete => Right::Delete,
                }));
                let needing: Vec<&str> = rights
                    .needing_approval()
                    .into_iter()
                    .map(Right::as_str)
                    .collect();
                if !needing.is_empty() {
                    return Err(format!(
                        "folder '{}': the rights {} need human approval by default, which this version \
                         cannot provide yet; grant read and write only",
                        folder.name,
                        needing.join(", ")
                    ));
                }
                folders.push(Folder::new(
                    folder.name.clone(),
                    config.base_dir().join(&folder.path),
                    rights,
                ));
            }
            loom_builtins::local_files(folders)
                .map(|t| Arc::new(t) as Arc<dyn Tool>)
                .map_err(|e| e.to_string())
        }
        "loom.fetch_page" => fetch_page(reference),
        other => Err(format!("unknown built-in tool '{other}'")),
    }
}

/// `loom.fetch_page` with its parameters.
#[cfg(feature = "fetch")]
fn fetch_page(reference: &loom_config::ToolRef) -> Result<Arc<dyn Tool>, String> {
    use loom_builtins::FetchOptions;
    let defaults = FetchOptions::default();
    Ok(Arc::new(loom_builtins::fetch_page(FetchOptions {
        allow_private: reference.allow_private.unwrap_or(false),
        max_bytes: reference.max_bytes.unwrap_or(defaults.max_bytes),
        ..defaults
    })))
}

/// `loom.fetch_page` is refused by a build without it.
#[cfg(not(feature = "fetch"))]
fn fetch_page(_reference: &loom_config::ToolRef) -> Result<Arc<dyn Tool>, String> {
    Err(
        "loom.fetch_page needs the Cargo feature 'fetch' of loom-ia, which this build does \
         not have"
            .to_owned(),
    )
}

/// A positive number of seconds as a duration, `None` when it cannot be one (too large).
fn seconds(secs: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
}

/// The engine's view of a declared model in a slot: client, pricing, slot settings over the
/// model's, retry policy, timeouts and breaker.
fn binding(
    config: &Config,
    models: &Models,
    model: &ModelSpec,
    llm: &loom_config::LlmSettings,
) -> Result<ModelBinding, LoomError> {
    let client = match models.get(&model.id) {
        Some(Ok(client)) => client.clone(),
        Some(Err(error)) => return Err(error.clone().into()),
        None => {
            return Err(config
                .error_at_root("models", format!("model '{}' has no client", model.id))
                .into());
        }
    };
    let index = config
        .raw()
        .models
        .iter()
        .position(|m| m.id == model.id)
        .unwrap_or(0);
    let duration = |key: &str, secs: f64| {
        Duration::try_from_secs_f64(secs).map_err(|_| {
            LoomError::from(
                config.error_at_root(&format!("models[{index}].{key}"), "not a usable duration"),
            )
        })
    };
    let optional = |key: &str, secs: Option<f64>| secs.map(|s| duration(key, s)).transpose();
    let mut params = model.params.clone();
    for (key, value) in &llm.params {
        params.insert(key.clone(), value.clone());
    }
    let mut binding = ModelBinding::new(model.id.clone(), model.model.clone(), client);
    binding.pricing = model.pricing.clone();
    binding.max_tokens = llm.max_tokens.or(model.max_tokens);
    binding.params = params;
    binding.retry = loom_engine::RetryPolicy {
        max_attempts: model.retry.max_attempts,
        initial_delay: duration("retry.initial_delay", model.retry.initial_delay)?,
        multiplier: model.retry.multiplier,
        max_delay: duration("retry.max_delay", model.retry.max_delay)?,
    };
    binding.timeouts = loom_engine::ModelTimeouts {
        first_token: optional("timeouts.first_token", model.timeouts.first_token)?,
        idle: optional("timeouts.idle", model.timeouts.idle)?,
        total: optional("timeouts.total", model.timeouts.total)?,
    };
    binding.circuit = match &model.circuit_breaker {
        Some(breaker) => Some(loom_engine::CircuitSettings {
            failures: breaker.failures,
            cooldown: duration("circuit_breaker.cooldown", breaker.cooldown)?,
        }),
        None => None,
    };
    binding.context_window = model.capabilities.context_window;
    binding.vision = model.capabilities.vision;
    Ok(binding)
}

/// The client of a real provider, when its feature is built in.
fn provider(
    config: &Config,
    index: usize,
    spec: &ModelSpec,
) -> Result<Arc<dyn ModelClient>, LoomError> {
    let sdk = spec.sdk.as_str();
    let compiled = match spec.sdk {
        Sdk::Anthropic => cfg!(feature = "anthropic"),
        _ => cfg!(feature = "openai"),
    };
    if !compiled {
        return Err(config
            .error_at_root(
                &format!("models[{index}].sdk"),
                format!(
                    "model '{}': sdk '{sdk}' needs the Cargo feature '{sdk}' of loom-ia, which this build does not have",
                    spec.id
                ),
            )
            .into());
    }
    build_provider(config, index, spec)
}

#[cfg(any(feature = "anthropic", feature = "openai"))]
fn build_provider(
    config: &Config,
    index: usize,
    spec: &ModelSpec,
) -> Result<Arc<dyn ModelClient>, LoomError> {
    use loom_providers::ProviderOptions;

    let api_key = match &spec.api_key_env {
        Some(variable) => {
            match std::env::var(variable) {
                Ok(value) if !value.is_empty() => Some(value),
                _ => {
                    return Err(config
                    .error_at_root(
                        &format!("models[{index}].api_key_env"),
                        format!("model '{}': the environment variable {variable} is absent or empty", spec.id),
                    )
                    .into());
                }
            }
        }
        None => None,
    };
    let official = match spec.sdk {
        Sdk::Anthropic => "https://api.anthropic.com",
        _ => "https://api.openai.com/v1",
    };
    let options = ProviderOptions {
        base_url: spec.base_url.clone().unwrap_or_else(|| official.to_owned()),
        api_key,
        api_key_env: spec.api_key_env.clone(),
        model: spec.model.clone(),
        max_tokens: spec.max_tokens,
        headers: spec.headers.clone(),
        connect_timeout: Duration::from_secs(10),
        capture: capture(config),
    };
    let refused = |e: loom_providers::ProviderError| {
        LoomError::from(config.error_at_root(
            &format!("models[{index}]"),
            format!("model '{}': {e}", spec.id),
        ))
    };
    let capabilities = &spec.capabilities;
    match (spec.sdk, spec.effective_api()) {
        #[cfg(feature = "anthropic")]
        (Sdk::Anthropic, _) => {
            use loom_providers::anthropic::{AnthropicModel, AnthropicSettings, CacheSettings};
            let cache = spec.cache.clone().unwrap_or_default();
            let settings = AnthropicSettings {
                cache: CacheSettings {
                    system: cache.system,
                    tools: cache.tools,
                    messages: cache.messages,
                    ttl: cache.ttl,
                },
                vision: capabilities.vision,
                native_json: capabilities.native_json,
            };
            Ok(Arc::new(
                AnthropicModel::new(options, settings).map_err(refused)?,
            ))
        }
        #[cfg(feature = "openai")]
        (Sdk::Openai, loom_config::ModelApi::Chat) => {
            use loom_providers::openai_chat::{ChatSettings, OpenAiChatModel};
            let settings = ChatSettings {
                vision: capabilities.vision,
                native_json: capabilities.native_json,
                thinking: capabilities.reasoning,
            };
            Ok(Arc::new(
                OpenAiChatModel::new(options, settings).map_err(refused)?,
            ))
        }
        #[cfg(feature = "openai")]
        (Sdk::Openai, loom_config::ModelApi::Responses) => {
            use loom_providers::openai_responses::{OpenAiResponsesModel, ResponsesSettings};
            let settings = ResponsesSettings {
                vision: capabilities.vision,
                native_json: capabilities.native_json,
                reasoning: capabilities.reasoning,
            };
            Ok(Arc::new(
                OpenAiResponsesModel::new(options, settings).map_err(refused)?,
            ))
        }
        _ => Err(config
            .error_at_root(
                &format!("models[{index}].sdk"),
                format!("model '{}': this adapter is not built in", spec.id),
            )
            .into()),
    }
}

/// The body limit of raw-exchange capture (`telemetry.capture`), when it is on.
#[cfg(any(feature = "anthropic", feature = "openai"))]
fn capture(config: &Config) -> Option<usize> {
    config.raw().telemetry.capture.raw_limit()
}

#[cfg(not(any(feature = "anthropic", feature = "openai")))]
fn build_provider(
    config: &Config,
    index: usize,
    spec: &ModelSpec,
) -> Result<Arc<dyn ModelClient>, LoomError> {
    Err(config
        .error_at_root(
            &format!("models[{index}].sdk"),
            format!("model '{}': no provider adapter is built in", spec.id),
        )
        .into())
}

#[cfg(all(test, not(feature = "fetch")))]
mod tests {
    #[test]
    fn fetch_page_is_refused_without_its_feature() {
        let reference: loom_config::ToolRef =
            serde_json::from_value(serde_json::json!({"tool": "loom.fetch_page"})).unwrap();
        let refusal = super::fetch_page(&reference).unwrap_err();
        assert!(refusal.contains("Cargo feature 'fetch'"), "{refusal}");
    }
}
