//! What surrounds an agent's loop: its policies, roles, judge and output contracts.

use std::sync::Arc;

use loom_core::policy::{DecisionKind, Point, Policy, REQUIRE_TOOL, RequireTool};
use loom_engine::{
    BoundPolicy, ContextScope, Criterion, JudgeRuntime, PolicyOnError,
    contract::{Contract, ContractSpec, OnFailure, RepairSettings, RepairTools},
    roles::{RoleContext, RoleRuntime},
};

use super::{Resolver, Stage, durable, seconds};
use crate::LoomError;

impl Resolver<'_> {
    /// The agent's policies, in declared order: built-in hooks, or policies registered in code.
    pub(super) fn policies(
        &self,
        spec: &loom_config::AgentSpec,
    ) -> Result<Vec<BoundPolicy>, LoomError> {
        let (config, registry) = (self.config, self.registry);
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
                    if self.stage == Stage::Open {
                        // Registered in code after the configuration is opened.
                        continue;
                    }
                    let registered: Vec<&str> =
                        registry.policies.keys().map(String::as_str).collect();
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
                         storage.events.backend: jsonl, sqlite or postgres (or the dev profile)",
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
    pub(super) fn roles(
        &self,
        spec: &loom_config::AgentSpec,
    ) -> Result<Vec<RoleRuntime>, LoomError> {
        let (config, name, tenant) = (self.config, spec.name.as_str(), self.tenant);
        let denied = |role: &str| config.tenant(tenant).is_some_and(|t| t.denies(role));
        spec.roles
            .iter()
            .enumerate()
            // The tenant's `tools_deny` removes a role's tool like any other.
            .filter(|(_, role)| !denied(&role.name))
            .map(|(r, role)| {
                let at = |key: &str, message: String| {
                    LoomError::from(config.error_at_agent(
                        name,
                        &format!("roles[{r}].{key}"),
                        message,
                    ))
                };
                let model_of = |key: &str, id: &str| {
                    self.model(id)
                        .ok_or_else(|| at(key, format!("unknown model '{id}'")))
                        .and_then(|m| self.binding(m, &role.llm))
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
                runtime.context = role.context.iter().map(context_item).collect();
                runtime.terminal = role.terminal;
                runtime.timeout = match role.timeout {
                    Some(secs) => Some(seconds(secs).ok_or_else(|| {
                        at("timeout", format!("{secs} s is not a usable duration"))
                    })?),
                    None => None,
                };
                if let Some(output) = &role.output {
                    runtime.output =
                        Some(contract(output).map_err(|message| at("output", message))?);
                }
                if let Some(judge) = &role.judge {
                    runtime.judges =
                        vec![self.judge(name, &format!("roles[{r}].judge"), judge, &role.name)?];
                }
                runtime
                    .bind()
                    .map_err(|e| at("input_schema", e.to_string()))?;
                Ok(runtime)
            })
            .collect()
    }

    /// The agent's judge (`judge:`), with its model chain, its condition and the active profile.
    pub(super) fn judges(
        &self,
        spec: &loom_config::AgentSpec,
    ) -> Result<Vec<JudgeRuntime>, LoomError> {
        match &spec.judge {
            Some(judge) => Ok(vec![self.judge(&spec.name, "judge", judge, "output")?]),
            None => Ok(Vec::new()),
        }
    }

    /// A judge of agent `agent` declared at `path` (`judge`, `roles[0].judge`), named
    /// `default_name` unless it names itself.
    fn judge(
        &self,
        agent: &str,
        path: &str,
        judge: &loom_config::JudgeSpec,
        default_name: &str,
    ) -> Result<JudgeRuntime, LoomError> {
        let (config, registry) = (self.config, self.registry);
        let at = |key: &str, message: String| {
            LoomError::from(config.error_at_agent(agent, &format!("{path}.{key}"), message))
        };
        let model_of = |key: &str, id: &str| {
            self.model(id)
                .ok_or_else(|| at(key, format!("unknown model '{id}'")))
                .and_then(|m| self.binding(m, &judge.llm))
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
        let judge_name = judge
            .name
            .clone()
            .unwrap_or_else(|| default_name.to_owned());
        let mut runtime = JudgeRuntime::new(judge_name, main, criteria)
            .map_err(|e| at("criteria", e.to_string()))?;
        for (f, id) in judge.fallbacks.iter().enumerate() {
            runtime
                .fallbacks
                .push(model_of(&format!("fallbacks[{f}]"), id)?);
        }
        runtime.context = judge.context.iter().map(context_item).collect();
        runtime.when.sample = judge.when.sample;
        runtime.when.tenants = judge.when.tenants.clone();
        runtime.when.profiles = judge
            .when
            .profiles
            .as_ref()
            .map(|profiles| profiles.iter().map(|p| p.as_str().to_owned()).collect());
        if let Some(condition) = &judge.when.condition {
            match registry.conditions.get(condition) {
                Some(registered) => runtime.when.condition = Some(registered.clone()),
                // Registered in code after the configuration is opened.
                None if self.stage == Stage::Open => {}
                None => {
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
                }
            }
        }
        runtime.profile = config.profile().map(|p| p.as_str().to_owned());
        runtime.repair = RepairSettings {
            max_attempts: judge.repair.max_attempts,
            tools: repair_tools(judge.repair.tools),
        };
        runtime.on_failure = engine_on_failure(judge.on_failure);
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
        Ok(runtime)
    }
}

/// A context item of a role or a judge, as the engine reads it.
fn context_item(item: &loom_config::ContextItem) -> RoleContext {
    match item {
        loom_config::ContextItem::Name(loom_config::ContextName::UserInput) => {
            RoleContext::UserInput
        }
        loom_config::ContextItem::Name(loom_config::ContextName::CallerContext) => {
            RoleContext::CallerContext
        }
        loom_config::ContextItem::Name(loom_config::ContextName::Attachments) => {
            RoleContext::Attachments
        }
        loom_config::ContextItem::Name(loom_config::ContextName::SessionSummary) => {
            RoleContext::SessionSummary
        }
        loom_config::ContextItem::ToolResults(results) => RoleContext::ToolResults {
            tools: results.tool_results.clone(),
            scope: match results.scope {
                loom_config::ContextScope::Run => ContextScope::Run,
                loom_config::ContextScope::Session => ContextScope::Session,
            },
        },
        loom_config::ContextItem::LastTurns(turns) => RoleContext::LastTurns(turns.last_turns),
        loom_config::ContextItem::Name(loom_config::ContextName::SessionState) => {
            RoleContext::SessionState(None)
        }
        loom_config::ContextItem::SessionStateKeys(keys) => {
            RoleContext::SessionState(Some(keys.session_state.clone()))
        }
    }
}

fn repair_tools(tools: loom_config::RepairTools) -> RepairTools {
    match tools {
        loom_config::RepairTools::Auto => RepairTools::Auto,
        loom_config::RepairTools::None => RepairTools::None,
        loom_config::RepairTools::Allowed => RepairTools::Allowed,
    }
}

pub(super) fn engine_on_failure(on_failure: loom_config::OnFailure) -> OnFailure {
    match on_failure {
        loom_config::OnFailure::Fail => OnFailure::Fail,
        loom_config::OnFailure::Unverified => OnFailure::Unverified,
        loom_config::OnFailure::Fallback => OnFailure::Fallback,
    }
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
        on_failure: engine_on_failure(spec.on_failure),
        fallback_message: spec.fallback_message.clone(),
    })
    .map_err(|e| e.to_string())
}
