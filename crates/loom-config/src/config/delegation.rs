//! Stage 2 rules of delegation and guards: roles, sub-agents, policies, judges, output
//! contracts, budgets and tenants.
//!
//! Every refusal is located at the offending value. Loading also fills in what the file leaves
//! implicit, so that the facade reads resolved values: `schema_file` contents into `schema`, the
//! default names of judges, policies and sub-agents, and sub-agent descriptions.

use std::path::Path;

use loom_core::ids::{is_safe_id, is_valid_name};
use serde_json::Value;

use super::{
    Config, Doc, NOT_POSITIVE, RolePrompt, display_path, make_error, positive_seconds,
    read_system_prompt,
};
use crate::error::{ConfigError, ConfigErrorKind};
use crate::files::FileProblem;
use crate::guards::{
    Budgets, ContextItem, ContextName, HookPoint, JudgeSpec, OnFailure, OutputContract,
    REQUIRE_TOOL_POLICY, RoleSpec,
};
use crate::model::{AgentSpec, JsonObject, LlmSettings, Profile, ToolRef};
use crate::prompt;
use crate::yaml::{self, KeyPath, Loc};

fn invalid(doc: &Doc, path: &KeyPath, message: impl Into<String>) -> ConfigError {
    doc.error(path, ConfigErrorKind::Invalid, message)
}

fn reference(doc: &Doc, path: &KeyPath, message: impl Into<String>) -> ConfigError {
    doc.error(path, ConfigErrorKind::Reference, message)
}

fn template(doc: &Doc, path: &KeyPath, message: impl Into<String>) -> ConfigError {
    doc.error(path, ConfigErrorKind::Template, message)
}

/// `a, b, c`, or `none`.
fn listing<S: AsRef<str>>(items: &[S]) -> String {
    if items.is_empty() {
        "none".to_owned()
    } else {
        items
            .iter()
            .map(AsRef::as_ref)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Amounts in dollars must be finite and not negative (token and call limits are unsigned).
pub(super) fn check_budgets(
    doc: &Doc,
    path: &KeyPath,
    budgets: &Budgets,
) -> Result<(), ConfigError> {
    let amounts = [
        (path.key("run").key("max_cost"), budgets.run.max_cost),
        (
            path.key("session").key("max_cost"),
            budgets.session.max_cost,
        ),
        (
            path.key("tenant").key("max_cost_per_day"),
            budgets.tenant.max_cost_per_day,
        ),
        (
            path.key("tenant").key("max_cost_per_month"),
            budgets.tenant.max_cost_per_month,
        ),
    ];
    for (at, amount) in amounts {
        if amount.is_some_and(|v| !(v.is_finite() && v >= 0.0)) {
            return Err(invalid(doc, &at, "must be an amount in dollars, 0 or more"));
        }
    }
    Ok(())
}

/// The `tenants` list of the config file: safe unique ids, declared agents, budgets.
pub(super) fn check_tenants(config: &Config) -> Result<(), ConfigError> {
    let doc = &config.docs[0];
    let tenants = &config.raw.tenants;
    for (t, tenant) in tenants.iter().enumerate() {
        let tp = KeyPath::root().key("tenants").index(t);
        if !is_safe_id(&tenant.id) {
            return Err(invalid(
                doc,
                &tp.key("id"),
                format!(
                    "invalid tenant id '{}' (expected ^[A-Za-z0-9][A-Za-z0-9._-]{{0,127}}$)",
                    tenant.id
                ),
            ));
        }
        if let Some(j) = tenants[..t].iter().position(|x| x.id == tenant.id) {
            return Err(invalid(
                doc,
                &tp.key("id"),
                format!(
                    "duplicate tenant id '{}' (already declared at tenants[{j}])",
                    tenant.id
                ),
            ));
        }
        for (a, agent) in tenant.agents.iter().enumerate() {
            let ap = tp.key("agents").index(a);
            if config.agent(agent).is_none() {
                return Err(reference(
                    doc,
                    &ap,
                    format!(
                        "unknown agent '{agent}' (declared agents: {})",
                        declared_agents(config)
                    ),
                ));
            }
            if tenant.agents[..a].contains(agent) {
                return Err(invalid(doc, &ap, format!("agent '{agent}' listed twice")));
            }
        }
        if let Some(budgets) = &tenant.budgets {
            check_budgets(doc, &tp.key("budgets"), budgets)?;
        }
        if tenant.quotas.and_then(|q| q.runs_per_minute) == Some(0) {
            return Err(invalid(
                doc,
                &tp.key("quotas").key("runs_per_minute"),
                "must be greater than 0",
            ));
        }
    }
    Ok(())
}

fn declared_agents(config: &Config) -> String {
    let names: Vec<&str> = config.agents.iter().map(|a| a.name.as_str()).collect();
    listing(&names)
}

fn declared_models(config: &Config) -> String {
    let ids: Vec<&str> = config.raw.models.iter().map(|m| m.id.as_str()).collect();
    listing(&ids)
}

/// An output contract at `path`: `schema` xor `schema_file` (read here, relative to `base`,
/// into `schema`), a valid JSON Schema, regexes that compile, positive `max_chars`, and a
/// `fallback_message` exactly when `on_failure` is `fallback`.
pub(super) fn check_output(
    doc: &Doc,
    path: &KeyPath,
    base: &Path,
    contract: &mut OutputContract,
) -> Result<(), ConfigError> {
    let mut schema_at = path.key("schema");
    if let Some(file) = &contract.schema_file {
        let at = path.key("schema_file");
        if contract.schema.is_some() {
            return Err(invalid(
                doc,
                &at,
                "'schema' and 'schema_file' are mutually exclusive",
            ));
        }
        contract.schema = Some(read_schema_file(doc, &at, base, file)?);
        schema_at = at;
    }
    if let Some(schema) = &contract.schema {
        check_json_schema(doc, &schema_at, schema)?;
    }
    for (key, pattern) in [
        ("must_match", &contract.must_match),
        ("must_not_match", &contract.must_not_match),
    ] {
        if let Some(pattern) = pattern {
            check_regex(doc, &path.key(key), pattern)?;
        }
    }
    if contract.max_chars == Some(0) {
        return Err(invalid(doc, &path.key("max_chars"), NOT_POSITIVE));
    }
    check_fallback(
        doc,
        path,
        contract.on_failure,
        contract.fallback_message.as_deref(),
    )
}

fn check_fallback(
    doc: &Doc,
    path: &KeyPath,
    on_failure: OnFailure,
    message: Option<&str>,
) -> Result<(), ConfigError> {
    match (on_failure, message) {
        (OnFailure::Fallback, None) => Err(invalid(
            doc,
            &path.key("on_failure"),
            "on_failure: fallback needs a 'fallback_message'",
        )),
        (OnFailure::Fallback, Some(text)) if text.trim().is_empty() => Err(invalid(
            doc,
            &path.key("fallback_message"),
            "must not be empty",
        )),
        (OnFailure::Fail | OnFailure::Unverified, Some(_)) => Err(invalid(
            doc,
            &path.key("fallback_message"),
            "'fallback_message' is only used with on_failure: fallback",
        )),
        _ => Ok(()),
    }
}

/// Reads a JSON (`.json`) or YAML (`.yaml`, `.yml`) schema file; syntax errors point into it.
fn read_schema_file(
    doc: &Doc,
    at: &KeyPath,
    base: &Path,
    file: &Path,
) -> Result<JsonObject, ConfigError> {
    let full = base.join(file);
    let shown = display_path(base, &full);
    let text = match crate::files::read_regular(&full) {
        Ok(text) => text,
        Err(FileProblem::NotFound) => {
            return Err(doc.error(
                at,
                ConfigErrorKind::MissingFile,
                format!("schema file not found: {}", shown.display()),
            ));
        }
        Err(FileProblem::Io(err)) => {
            return Err(doc.error(
                at,
                ConfigErrorKind::Io,
                format!("cannot read schema file {}: {err}", shown.display()),
            ));
        }
        Err(problem) => {
            return Err(doc.error(
                at,
                ConfigErrorKind::Invalid,
                format!("schema file {}: {problem}", shown.display()),
            ));
        }
    };
    let extension = full
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let value = match extension.as_deref() {
        Some("json") => serde_json::from_str::<Value>(&text).map_err(|err| {
            let full_message = err.to_string();
            let message = full_message
                .rfind(" at line ")
                .map_or(full_message.as_str(), |i| &full_message[..i]);
            let loc = (err.line() > 0).then(|| Loc {
                line: err.line(),
                column: err.column().max(1),
            });
            make_error(
                &shown,
                loc,
                at,
                ConfigErrorKind::Syntax,
                format!("invalid JSON: {message}"),
            )
        })?,
        Some("yaml" | "yml") => match yaml::parse(&text) {
            Ok(node) => node.to_json(),
            Err(yaml::ParseError::Syntax { message, loc }) => {
                return Err(make_error(
                    &shown,
                    loc,
                    at,
                    ConfigErrorKind::Syntax,
                    message,
                ));
            }
            Err(yaml::ParseError::Duplicate { key, second, .. }) => {
                return Err(make_error(
                    &shown,
                    second,
                    at,
                    ConfigErrorKind::DuplicateKey,
                    format!("key '{key}' given twice in the same mapping"),
                ));
            }
        },
        _ => {
            return Err(invalid(
                doc,
                at,
                format!(
                    "schema file {} must be a .json, .yaml or .yml file",
                    shown.display()
                ),
            ));
        }
    };
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(invalid(
            doc,
            at,
            format!(
                "schema file {} does not hold a JSON Schema object",
                shown.display()
            ),
        )),
    }
}

fn check_json_schema(doc: &Doc, at: &KeyPath, schema: &JsonObject) -> Result<(), ConfigError> {
    loom_schema::compile(&Value::Object(schema.clone()))
        .map(|_| ())
        .map_err(|err| {
            let inside = err.instance_path().as_str();
            let inside = if inside.is_empty() {
                String::new()
            } else {
                format!(" at {inside}")
            };
            invalid(doc, at, format!("invalid JSON Schema{inside}: {err}"))
        })
}

fn check_regex(doc: &Doc, at: &KeyPath, pattern: &str) -> Result<(), ConfigError> {
    if pattern.is_empty() {
        return Err(invalid(doc, at, "must not be empty"));
    }
    regex::Regex::new(pattern).map(|_| ()).map_err(|err| {
        let detail = match &err {
            regex::Error::Syntax(text) => text
                .lines()
                .find_map(|l| l.strip_prefix("error: "))
                .unwrap_or(text.trim())
                .to_owned(),
            regex::Error::CompiledTooBig(limit) => {
                format!("too big once compiled (limit {limit} bytes)")
            }
            other => other.to_string(),
        };
        invalid(doc, at, format!("invalid regular expression: {detail}"))
    })
}

/// The names an agent's tools have for the model (checked by `tool_results` and name clashes).
pub(super) struct ToolNames {
    /// Tools, built-ins (without `loom.`), roles and sub-agents.
    names: Vec<String>,
    /// MCP references: prefix, `include`, `exclude`.
    mcp: Vec<(String, Option<Vec<String>>, Vec<String>)>,
}

impl ToolNames {
    fn of_tools(tools: &[ToolRef]) -> ToolNames {
        let mut names = Vec::new();
        let mut mcp = Vec::new();
        for tool in tools {
            if let Some(name) = &tool.tool {
                names.push(name.strip_prefix("loom.").unwrap_or(name).to_owned());
            } else if let Some(server) = &tool.mcp {
                let prefix = tool.alias.clone().unwrap_or_else(|| server.clone());
                mcp.push((
                    prefix,
                    tool.include.clone(),
                    tool.exclude.clone().unwrap_or_default(),
                ));
            }
        }
        ToolNames { names, mcp }
    }

    pub(super) fn has(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
            || self.mcp.iter().any(|(prefix, include, exclude)| {
                name.strip_prefix(prefix.as_str())
                    .and_then(|rest| rest.strip_prefix("__"))
                    .is_some_and(|tool| match include {
                        Some(include) => include.iter().any(|t| t == tool),
                        None => !exclude.iter().any(|t| t == tool),
                    })
            })
    }

    /// The MCP prefix a name would fall under, if any.
    fn mcp_prefix_of(&self, name: &str) -> Option<&str> {
        self.mcp
            .iter()
            .map(|(prefix, _, _)| prefix.as_str())
            .find(|prefix| {
                name.strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with("__"))
            })
    }

    pub(super) fn describe(&self) -> String {
        let mut all: Vec<String> = self.names.clone();
        for (prefix, include, _) in &self.mcp {
            match include {
                Some(include) => all.extend(include.iter().map(|t| format!("{prefix}__{t}"))),
                None => all.push(format!("{prefix}__*")),
            }
        }
        listing(&all)
    }
}

/// Roles, sub-agents, policies, the agent's output contract and judge, its budget and depth.
/// Fills `spec` in place and returns the roles' system prompts.
pub(super) fn check_guards(
    config: &Config,
    i: usize,
    spec: &mut AgentSpec,
    warnings: &mut Vec<String>,
) -> Result<Vec<RolePrompt>, ConfigError> {
    let meta = &config.meta[i];
    let doc = &config.docs[meta.doc];
    let p = &meta.prefix;

    if spec.max_depth == 0 {
        return Err(invalid(doc, &p.key("max_depth"), NOT_POSITIVE));
    }
    if let Some(budget) = &spec.budget {
        check_budgets(doc, &p.key("budget"), budget)?;
    }
    if (!spec.roles.is_empty() || !spec.subagents.is_empty())
        && config
            .model(&spec.main.model)
            .is_some_and(|m| !m.capabilities.tools)
    {
        return Err(invalid(
            doc,
            &p.key("main").key("model"),
            format!(
                "model '{}' cannot call tools (capabilities.tools: false) but the agent has roles \
                 or sub-agents, which it calls as tools",
                spec.main.model
            ),
        ));
    }
    check_policies(config, doc, p, spec)?;

    // Names first: roles and sub-agents are tools of the orchestrator.
    let mut names = ToolNames::of_tools(&spec.tools);
    let mut owners: Vec<(String, String)> = names
        .names
        .iter()
        .map(|n| (n.clone(), format!("tool '{n}'")))
        .collect();
    for (r, role) in spec.roles.iter().enumerate() {
        let at = p.key("roles").index(r).key("name");
        if !is_valid_name(&role.name) {
            return Err(invalid(
                doc,
                &at,
                format!(
                    "invalid role name '{}' (expected ^[A-Za-z0-9_-]{{1,64}}$)",
                    role.name
                ),
            ));
        }
        if role.name == "main" {
            return Err(invalid(
                doc,
                &at,
                "'main' is reserved for the orchestrating role",
            ));
        }
        claim_name(
            doc,
            &at,
            &names,
            &mut owners,
            &role.name,
            format!("role '{}'", role.name),
        )?;
    }
    for (k, sub) in spec.subagents.iter().enumerate() {
        let sp = p.key("subagents").index(k);
        let at = if sub.name.is_some() {
            sp.key("name")
        } else {
            sp.key("agent")
        };
        let name = sub.tool_name();
        if !is_valid_name(name) {
            return Err(invalid(
                doc,
                &at,
                format!("invalid tool name '{name}' (expected ^[A-Za-z0-9_-]{{1,64}}$)"),
            ));
        }
        claim_name(
            doc,
            &at,
            &names,
            &mut owners,
            name,
            format!("sub-agent '{name}'"),
        )?;
    }
    names.names = owners.into_iter().map(|(n, _)| n).collect();
    super::state::check_keys(doc, p, spec, &names, &config.raw.sessions.state)?;
    super::state::check_main_context(doc, p, spec)?;
    let declared: Vec<String> = spec.state.keys().cloned().collect();
    let agent_state = (spec.name.clone(), declared);

    let mut judges: Vec<(String, KeyPath)> = Vec::new();
    let mut prompts = Vec::new();
    for (r, role) in spec.roles.iter_mut().enumerate() {
        let rp = p.key("roles").index(r);
        let state = (agent_state.0.as_str(), &agent_state.1[..]);
        prompts.push(check_role(config, doc, &rp, role, &names, state)?);
        if let Some(judge) = &mut role.judge {
            let default = role.name.clone();
            let judged = role.model.clone();
            check_judge(
                config,
                doc,
                &rp.key("judge"),
                judge,
                (&default, &judged),
                &names,
                &mut judges,
                warnings,
            )?;
        }
    }

    let own_run_budget = config
        .raw
        .budgets
        .overlay(spec.budget.as_ref().unwrap_or(&Budgets::default()));
    for (k, sub) in spec.subagents.iter_mut().enumerate() {
        let sp = p.key("subagents").index(k);
        let Some(target) = config.agent(&sub.agent) else {
            return Err(reference(
                doc,
                &sp.key("agent"),
                format!(
                    "unknown agent '{}' (declared agents: {})",
                    sub.agent,
                    declared_agents(config)
                ),
            ));
        };
        if sub.agent == spec.name {
            return Err(invalid(
                doc,
                &sp.key("agent"),
                "an agent cannot be its own sub-agent",
            ));
        }
        let description = match &sub.description {
            Some(text) if !text.trim().is_empty() => text.clone(),
            _ if !target.description.trim().is_empty() => target.description.clone(),
            _ => {
                return Err(invalid(
                    doc,
                    &sp,
                    format!(
                        "sub-agent '{}' needs a description: agent '{}' has none, give one here",
                        sub.tool_name(),
                        sub.agent
                    ),
                ));
            }
        };
        if let Some(share) = sub.budget_share {
            let at = sp.key("budget_share");
            if !(share.is_finite() && share > 0.0 && share <= 1.0) {
                return Err(invalid(doc, &at, "must be greater than 0 and at most 1"));
            }
            if !own_run_budget.run.has_limit() {
                return Err(invalid(
                    doc,
                    &at,
                    format!(
                        "budget_share needs a run budget: neither the root budgets.run nor the \
                         budget.run of agent '{}' sets a limit to share",
                        spec.name
                    ),
                ));
            }
        }
        sub.name = Some(sub.tool_name().to_owned());
        sub.description = Some(description);
    }

    if let Some(output) = &mut spec.output {
        check_output(doc, &p.key("output"), &config.base_dir, output)?;
    }
    if let Some(judge) = &mut spec.judge {
        let judged = spec.main.model.clone();
        check_judge(
            config,
            doc,
            &p.key("judge"),
            judge,
            ("output", &judged),
            &names,
            &mut judges,
            warnings,
        )?;
    }
    Ok(prompts)
}

/// Refuses a role or sub-agent tool name already taken in the agent.
fn claim_name(
    doc: &Doc,
    at: &KeyPath,
    names: &ToolNames,
    owners: &mut Vec<(String, String)>,
    name: &str,
    what: String,
) -> Result<(), ConfigError> {
    if let Some((_, owner)) = owners.iter().find(|(n, _)| n == name) {
        return Err(invalid(
            doc,
            at,
            format!(
                "the name '{name}' is already taken by {owner} (roles, sub-agents and tools share \
                 the orchestrator's tool names)"
            ),
        ));
    }
    if let Some(prefix) = names.mcp_prefix_of(name) {
        return Err(invalid(
            doc,
            at,
            format!("the name '{name}' would collide with the MCP tools '{prefix}__*'"),
        ));
    }
    owners.push((name.to_owned(), what));
    Ok(())
}

/// The agent's `policies`: hooks, names (filled), points, timeouts, `loom.require_tool`.
fn check_policies(
    config: &Config,
    doc: &Doc,
    p: &KeyPath,
    spec: &mut AgentSpec,
) -> Result<(), ConfigError> {
    let mut seen: Vec<String> = Vec::new();
    for (k, policy) in spec.policies.iter_mut().enumerate() {
        let pp = p.key("policies").index(k);
        if policy.hook.trim().is_empty() {
            return Err(invalid(doc, &pp.key("hook"), "must not be empty"));
        }
        let builtin = policy.hook.starts_with("loom.");
        if builtin && policy.hook != REQUIRE_TOOL_POLICY {
            return Err(reference(
                doc,
                &pp.key("hook"),
                format!(
                    "unknown built-in policy '{}' (built-in policies: {REQUIRE_TOOL_POLICY})",
                    policy.hook
                ),
            ));
        }
        let name = policy.policy_name().to_owned();
        let name_at = if policy.name.is_some() {
            pp.key("name")
        } else {
            pp.key("hook")
        };
        if !valid_policy_name(&name) {
            let hint = if policy.name.is_none() {
                ": give the policy a 'name'"
            } else {
                ""
            };
            return Err(invalid(
                doc,
                &name_at,
                format!(
                    "invalid policy name '{name}' (expected ^[A-Za-z0-9_][A-Za-z0-9_.-]{{0,63}}$){hint}"
                ),
            ));
        }
        if name.starts_with("loom.") && !(builtin && name == policy.hook) {
            return Err(invalid(
                doc,
                &name_at,
                format!(
                    "policy name '{name}' is reserved: names starting with 'loom.' belong to built-in policies"
                ),
            ));
        }
        if let Some(j) = seen.iter().position(|n| *n == name) {
            return Err(invalid(
                doc,
                &name_at,
                format!("duplicate policy name '{name}' (already used by policies[{j}])"),
            ));
        }
        seen.push(name.clone());
        if let Some(points) = &policy.points {
            if points.is_empty() {
                return Err(invalid(
                    doc,
                    &pp.key("points"),
                    "at least one point is needed (leave 'points' out for all the hook's points)",
                ));
            }
            for (n, point) in points.iter().enumerate() {
                if points[..n].contains(point) {
                    return Err(invalid(
                        doc,
                        &pp.key("points").index(n),
                        format!("point '{point}' listed twice"),
                    ));
                }
                if builtin && *point != HookPoint::BeforeModel {
                    return Err(invalid(
                        doc,
                        &pp.key("points").index(n),
                        format!(
                            "policy '{name}' does not apply to {point} (declared points: before_model)"
                        ),
                    ));
                }
            }
        }
        if !(policy.timeout.is_finite() && policy.timeout > 0.0) {
            return Err(invalid(doc, &pp.key("timeout"), NOT_POSITIVE));
        }
        if policy.max_attempts == 0 {
            return Err(invalid(doc, &pp.key("max_attempts"), NOT_POSITIVE));
        }
        if builtin {
            if !policy.params.is_empty() {
                return Err(invalid(
                    doc,
                    &pp.key("params"),
                    format!("policy '{REQUIRE_TOOL_POLICY}' takes no params"),
                ));
            }
            let chain = std::iter::once(&spec.main.model).chain(spec.main.fallbacks.iter());
            for id in chain {
                if config
                    .model(id)
                    .is_some_and(|m| !m.capabilities.forced_tool_choice)
                {
                    return Err(invalid(
                        doc,
                        &pp.key("hook"),
                        format!(
                            "policy '{REQUIRE_TOOL_POLICY}' forces a tool call, but model '{id}' \
                             cannot be forced (capabilities.forced_tool_choice: false)"
                        ),
                    ));
                }
            }
        }
        policy.name = Some(name);
    }
    Ok(())
}

fn valid_policy_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    match bytes.first() {
        Some(b) if b.is_ascii_alphanumeric() || *b == b'_' => {}
        _ => return false,
    }
    bytes.len() <= 64
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A model reference and its fallback chain: declared, no repeats.
fn check_model_chain(
    config: &Config,
    doc: &Doc,
    path: &KeyPath,
    model: &str,
    fallbacks: &[String],
) -> Result<(), ConfigError> {
    if config.model(model).is_none() {
        return Err(reference(
            doc,
            &path.key("model"),
            format!(
                "unknown model '{model}' (declared models: {})",
                declared_models(config)
            ),
        ));
    }
    for (f, fallback) in fallbacks.iter().enumerate() {
        let fp = path.key("fallbacks").index(f);
        if config.model(fallback).is_none() {
            return Err(reference(
                doc,
                &fp,
                format!("unknown model '{fallback}' in the fallback chain"),
            ));
        }
        if fallback == model || fallbacks[..f].contains(fallback) {
            return Err(invalid(
                doc,
                &fp,
                format!("model '{fallback}' appears twice in the chain"),
            ));
        }
    }
    Ok(())
}

fn check_llm(doc: &Doc, path: &KeyPath, llm: &LlmSettings) -> Result<(), ConfigError> {
    if llm.max_tokens == Some(0) {
        return Err(invalid(doc, &path.key("max_tokens"), NOT_POSITIVE));
    }
    Ok(())
}

/// One role: everything but its judge. Returns its system prompt.
fn check_role(
    config: &Config,
    doc: &Doc,
    rp: &KeyPath,
    role: &mut RoleSpec,
    names: &ToolNames,
    state: (&str, &[String]),
) -> Result<RolePrompt, ConfigError> {
    if role.description.trim().is_empty() {
        return Err(invalid(
            doc,
            &rp.key("description"),
            format!(
                "role '{}' needs a description: the orchestrator chooses its tools by them",
                role.name
            ),
        ));
    }
    check_model_chain(config, doc, rp, &role.model, &role.fallbacks)?;
    check_llm(doc, &rp.key("llm"), &role.llm)?;
    if !positive_seconds(role.timeout) {
        return Err(invalid(doc, &rp.key("timeout"), NOT_POSITIVE));
    }
    let (system, system_file) =
        read_system_prompt(config, doc, rp, &role.system, role.system_file.as_ref())?;

    let sp = rp.key("input_schema");
    if role.input_schema.get("type") != Some(&Value::String("object".to_owned())) {
        return Err(invalid(
            doc,
            &sp,
            "a role's input_schema must have type: object (its arguments are named)",
        ));
    }
    if role
        .input_schema
        .get("properties")
        .is_some_and(|props| !props.is_object())
    {
        return Err(invalid(
            doc,
            &sp.key("properties"),
            "must be a mapping of argument names to schemas",
        ));
    }
    check_json_schema(doc, &sp, &role.input_schema)?;

    let models: Vec<&str> = std::iter::once(role.model.as_str())
        .chain(role.fallbacks.iter().map(String::as_str))
        .collect();
    let owner = format!("role '{}'", role.name);
    check_context(
        config,
        doc,
        &rp.key("context"),
        &role.context,
        names,
        &models,
        (&owner, Some(state)),
    )?;
    if role.argument_names().is_empty() && role.context.is_empty() {
        return Err(invalid(
            doc,
            rp,
            format!(
                "role '{}' has neither arguments nor context: it would receive nothing (declare \
                 input_schema properties or context items)",
                role.name
            ),
        ));
    }
    check_input_template(doc, rp, role, state.1)?;
    if let Some(output) = &mut role.output {
        check_output(doc, &rp.key("output"), &config.base_dir, output)?;
    }
    Ok(RolePrompt {
        system,
        system_file,
    })
}

/// Context items of a role or judge: no repeats, known tools, `last_turns` ≥ 1, models that
/// can see images when `attachments` is declared, and `session_state` naming declared keys (a
/// role's: `state` is the agent's name and state keys; a judge's: `None`, refused).
fn check_context(
    config: &Config,
    doc: &Doc,
    path: &KeyPath,
    items: &[ContextItem],
    names: &ToolNames,
    models: &[&str],
    (owner, state): (&str, Option<(&str, &[String])>),
) -> Result<(), ConfigError> {
    let mut tools_seen: Vec<&str> = Vec::new();
    for (j, item) in items.iter().enumerate() {
        let ip = path.index(j);
        if let Some(keys) = item.state_keys() {
            let Some(state) = state else {
                return Err(invalid(
                    doc,
                    &ip,
                    format!(
                        "{owner} cannot read session_state: a judge scores the output against \
                         its criteria, the session's state is for the orchestrator and roles"
                    ),
                ));
            };
            if items[..j].iter().any(|x| x.state_keys().is_some()) {
                return Err(invalid(
                    doc,
                    &ip,
                    "context item 'session_state' listed twice",
                ));
            }
            super::state::check_state_item(doc, &ip, state, keys, owner)?;
            continue;
        }
        match item {
            ContextItem::Name(name) => {
                if items[..j].contains(item) {
                    return Err(invalid(
                        doc,
                        &ip,
                        format!("context item '{name}' listed twice"),
                    ));
                }
                if *name == ContextName::Attachments {
                    for id in models {
                        if config.model(id).is_some_and(|m| !m.capabilities.vision) {
                            return Err(invalid(
                                doc,
                                &ip,
                                format!(
                                    "{owner} receives attachments, but its model '{id}' cannot \
                                     see images (capabilities.vision: false)"
                                ),
                            ));
                        }
                    }
                }
            }
            ContextItem::LastTurns(turns) => {
                if items[..j]
                    .iter()
                    .any(|x| matches!(x, ContextItem::LastTurns(_)))
                {
                    return Err(invalid(doc, &ip, "context item 'last_turns' listed twice"));
                }
                if turns.last_turns == 0 {
                    return Err(invalid(doc, &ip.key("last_turns"), NOT_POSITIVE));
                }
            }
            // Checked above.
            ContextItem::SessionStateKeys(_) => {}
            ContextItem::ToolResults(results) => {
                if results.tool_results.is_empty() {
                    return Err(invalid(
                        doc,
                        &ip.key("tool_results"),
                        "at least one tool is needed",
                    ));
                }
                for (n, tool) in results.tool_results.iter().enumerate() {
                    let tp = ip.key("tool_results").index(n);
                    if !names.has(tool) {
                        return Err(reference(
                            doc,
                            &tp,
                            format!(
                                "tool_results names '{tool}', which is not a tool of this agent \
                                 (its tools: {})",
                                names.describe()
                            ),
                        ));
                    }
                    if tools_seen.contains(&tool.as_str()) {
                        return Err(invalid(
                            doc,
                            &tp,
                            format!("tool '{tool}' listed twice in tool_results"),
                        ));
                    }
                    tools_seen.push(tool);
                }
            }
        }
    }
    Ok(())
}

/// Context names a template can read under `context.`.
const CONTEXT_VARIABLES: &[&str] = &[
    "user_input",
    "caller_context",
    "attachments",
    "session_summary",
    "last_turns",
];

/// Every variable of `input_template` is declared (an argument, a context item, a tool of
/// `tool_results`), and every declared context item is used.
fn check_input_template(
    doc: &Doc,
    rp: &KeyPath,
    role: &RoleSpec,
    state_keys: &[String],
) -> Result<(), ConfigError> {
    let Some(text) = &role.input_template else {
        return Ok(());
    };
    let at = rp.key("input_template");
    let used = prompt::input_variables(text).map_err(|issue| template(doc, &at, issue.message))?;
    let args = role.argument_names();
    let declared: Vec<&str> = role.context.iter().map(ContextItem::key).collect();
    let declared_tools: Vec<&str> = role
        .context
        .iter()
        .filter_map(|c| match c {
            ContextItem::ToolResults(t) => Some(t.tool_results.iter().map(String::as_str)),
            _ => None,
        })
        .flatten()
        .collect();
    let name = &role.name;
    for var in &used {
        let segs: Vec<&str> = var.split('.').collect();
        let refusal = match segs.as_slice() {
            ["args"] | ["context"] => None,
            ["args", arg, ..] if !args.contains(arg) => Some(if args.is_empty() {
                format!(
                    "input_template uses 'args.{arg}', but role '{name}' has no arguments \
                     (input_schema declares no properties)"
                )
            } else {
                format!(
                    "input_template uses 'args.{arg}', which is not an argument of role '{name}' \
                     (arguments: {})",
                    args.join(", ")
                )
            }),
            ["args", ..] => None,
            ["context", "session_state", rest @ ..] => {
                match super::state::template_keys(state_keys, &role.context) {
                    None => Some(format!(
                        "input_template uses 'context.session_state', but the context of role \
                         '{name}' does not declare session_state"
                    )),
                    Some(keys) => match rest.first() {
                        Some(key) if !keys.contains(key) => Some(format!(
                            "input_template uses 'context.session_state.{key}', but '{key}' is \
                             not among the state keys role '{name}' reads (declared: {})",
                            listing(&keys)
                        )),
                        _ => None,
                    },
                }
            }
            ["context", "tool_results"] if declared_tools.is_empty() => Some(format!(
                "input_template uses 'context.tool_results', but the context of role '{name}' \
                 declares no tool_results"
            )),
            ["context", "tool_results", tool, ..] if !declared_tools.contains(tool) => {
                Some(format!(
                    "input_template uses 'context.tool_results.{tool}', but '{tool}' is not in \
                     the tool_results of role '{name}' (declared: {})",
                    listing(&declared_tools)
                ))
            }
            ["context", "tool_results", ..] => None,
            ["context", item, ..] if CONTEXT_VARIABLES.contains(item) => (!declared.contains(item))
                .then(|| {
                    format!(
                        "input_template uses 'context.{item}', but the context of role '{name}' \
                         does not declare '{item}'"
                    )
                }),
            ["context", item, ..] => Some(format!(
                "unknown template variable 'context.{item}' (known: context.user_input, \
                 context.caller_context, context.attachments, context.session_summary, \
                 context.last_turns, context.tool_results.<tool>, context.session_state.<key>)"
            )),
            [head, ..] => Some(format!(
                "unknown template variable '{head}' (known variables: args, context)"
            )),
            [] => None,
        };
        if let Some(message) = refusal {
            return Err(template(doc, &at, message));
        }
    }
    if used.iter().any(|v| v == "context") {
        return Ok(());
    }
    let uses = |path: &str| {
        used.iter().any(|v| {
            v == path
                || v.strip_prefix(path)
                    .is_some_and(|rest| rest.starts_with('.'))
        })
    };
    let all_tools = used.iter().any(|v| v == "context.tool_results");
    for (j, item) in role.context.iter().enumerate() {
        let ip = rp.key("context").index(j);
        match item {
            ContextItem::ToolResults(results) => {
                for (n, tool) in results.tool_results.iter().enumerate() {
                    if !all_tools && !uses(&format!("context.tool_results.{tool}")) {
                        return Err(template(
                            doc,
                            &ip.key("tool_results").index(n),
                            format!(
                                "tool_results '{tool}' is declared but input_template never uses \
                                 it (context.tool_results.{tool})"
                            ),
                        ));
                    }
                }
            }
            other => {
                let key = other.key();
                if !uses(&format!("context.{key}")) {
                    return Err(template(
                        doc,
                        &ip,
                        format!(
                            "context item '{key}' is declared but input_template never uses it \
                             (context.{key})"
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Whether two declared models are the same model: the same id, or the same SDK and provider
/// model name.
fn same_model(config: &Config, a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    match (config.model(a), config.model(b)) {
        (Some(x), Some(y)) => x.sdk == y.sdk && x.model == y.model,
        _ => false,
    }
}

/// A judge: models, name (filled; unique in the agent), criteria, context, trigger, failure.
/// `names` is `(default name, id of the judged model)`.
#[allow(clippy::too_many_arguments)]
fn check_judge(
    config: &Config,
    doc: &Doc,
    jp: &KeyPath,
    judge: &mut JudgeSpec,
    (default_name, judged): (&str, &str),
    tools: &ToolNames,
    judges: &mut Vec<(String, KeyPath)>,
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
    check_model_chain(config, doc, jp, &judge.model, &judge.fallbacks)?;
    let chain: Vec<(String, KeyPath)> = std::iter::once((judge.model.clone(), jp.key("model")))
        .chain(
            judge
                .fallbacks
                .iter()
                .enumerate()
                .map(|(f, id)| (id.clone(), jp.key("fallbacks").index(f))),
        )
        .collect();
    for (id, at) in &chain {
        if config.model(id).is_some_and(|m| !m.capabilities.tools) {
            return Err(invalid(
                doc,
                at,
                format!(
                    "judge model '{id}' cannot call tools (capabilities.tools: false): a judge \
                     answers with a verdict tool call"
                ),
            ));
        }
    }
    let name = judge
        .name
        .clone()
        .unwrap_or_else(|| default_name.to_owned());
    let name_at = if judge.name.is_some() {
        jp.key("name")
    } else {
        jp.clone()
    };
    if !is_valid_name(&name) {
        return Err(invalid(
            doc,
            &name_at,
            format!("invalid judge name '{name}' (expected ^[A-Za-z0-9_-]{{1,64}}$)"),
        ));
    }
    if let Some((_, other)) = judges.iter().find(|(n, _)| *n == name) {
        return Err(invalid(
            doc,
            &name_at,
            format!(
                "duplicate judge name '{name}' (already the name of the judge at {other}): give \
                 one a 'name'"
            ),
        ));
    }
    judges.push((name.clone(), jp.clone()));

    let cp = jp.key("criteria");
    if judge.criteria.is_empty() {
        return Err(invalid(doc, &cp, "a judge needs at least one criterion"));
    }
    for (c, criterion) in judge.criteria.iter().enumerate() {
        let at = cp.index(c);
        if !is_valid_name(&criterion.name) {
            return Err(invalid(
                doc,
                &at.key("name"),
                format!(
                    "invalid criterion name '{}' (expected ^[A-Za-z0-9_-]{{1,64}}$)",
                    criterion.name
                ),
            ));
        }
        if judge.criteria[..c].iter().any(|x| x.name == criterion.name) {
            return Err(invalid(
                doc,
                &at.key("name"),
                format!("duplicate criterion name '{}'", criterion.name),
            ));
        }
        if criterion.rule.trim().is_empty() {
            return Err(invalid(doc, &at.key("rule"), "must not be empty"));
        }
        if !(criterion.min_score.is_finite() && (0.0..=1.0).contains(&criterion.min_score)) {
            return Err(invalid(
                doc,
                &at.key("min_score"),
                "must be between 0 and 1",
            ));
        }
    }
    let models: Vec<&str> = chain.iter().map(|(id, _)| id.as_str()).collect();
    check_context(
        config,
        doc,
        &jp.key("context"),
        &judge.context,
        tools,
        &models,
        (&format!("judge '{name}'"), None),
    )?;

    let wp = jp.key("when");
    let when = &judge.when;
    if !(when.sample.is_finite() && (0.0..=1.0).contains(&when.sample)) {
        return Err(invalid(doc, &wp.key("sample"), "must be between 0 and 1"));
    }
    if when
        .condition
        .as_deref()
        .is_some_and(|c| c.trim().is_empty())
    {
        return Err(invalid(doc, &wp.key("condition"), "must not be empty"));
    }
    if let Some(tenants) = &when.tenants {
        if tenants.is_empty() {
            return Err(invalid(
                doc,
                &wp.key("tenants"),
                "at least one tenant is needed (leave 'tenants' out for all of them)",
            ));
        }
        for (t, tenant) in tenants.iter().enumerate() {
            if let Err(unknown) = config.check_tenant(tenant) {
                return Err(reference(
                    doc,
                    &wp.key("tenants").index(t),
                    unknown.to_string(),
                ));
            }
        }
    }
    if when.profiles.as_ref().is_some_and(Vec::is_empty) {
        return Err(invalid(
            doc,
            &wp.key("profiles"),
            "at least one profile is needed (leave 'profiles' out for all of them)",
        ));
    }
    check_fallback(doc, jp, judge.on_failure, judge.fallback_message.as_deref())?;
    check_llm(doc, &jp.key("llm"), &judge.llm)?;
    if !positive_seconds(judge.timeout) {
        return Err(invalid(doc, &jp.key("timeout"), NOT_POSITIVE));
    }

    for (id, at) in &chain {
        if same_model(config, id, judged) {
            let same = if id == judged {
                format!("model '{id}', the model whose output it judges")
            } else {
                let provider = config
                    .model(id)
                    .map(|m| format!("{} {}", m.sdk.as_str(), m.model))
                    .unwrap_or_default();
                format!(
                    "model '{id}', the same model ({provider}) as '{judged}' whose output it judges"
                )
            };
            let message = format!(
                "judge '{name}' runs on {same}: a model grading itself is lenient, use another model"
            );
            if config.raw.profile == Some(Profile::Prod) {
                return Err(invalid(
                    doc,
                    at,
                    format!("{message} (refused under the prod profile)"),
                ));
            }
            warnings.push(
                invalid(
                    doc,
                    at,
                    format!("{message} (an error under the prod profile)"),
                )
                .to_string(),
            );
        }
    }
    judge.name = Some(name);
    Ok(())
}

/// `security.api_keys`: hash format, unique ids, declared tenants, declared agents, readable
/// expiry.
pub(super) fn check_security(config: &Config) -> Result<(), ConfigError> {
    let doc = &config.docs[0];
    let keys = &config.raw.security.api_keys;
    for (k, key) in keys.iter().enumerate() {
        let kp = KeyPath::root().key("security").key("api_keys").index(k);
        if key.id.trim().is_empty() {
            return Err(invalid(doc, &kp.key("id"), "a key id must not be empty"));
        }
        if let Some(j) = keys[..k].iter().position(|x| x.id == key.id) {
            return Err(invalid(
                doc,
                &kp.key("id"),
                format!(
                    "duplicate key id '{}' (already declared at security.api_keys[{j}])",
                    key.id
                ),
            ));
        }
        if !crate::security::is_key_hash(&key.hash) {
            return Err(invalid(
                doc,
                &kp.key("hash"),
                "expected 'sha256:' followed by 64 lowercase hex digits (the hash printed by \
                 'loom keys create'; never the key itself)",
            ));
        }
        if let Some(j) = keys[..k].iter().position(|x| x.hash == key.hash) {
            return Err(invalid(
                doc,
                &kp.key("hash"),
                format!("the same hash as security.api_keys[{j}]: each key must be distinct"),
            ));
        }
        if let Err(unknown) = config.check_tenant(&key.tenant) {
            return Err(reference(doc, &kp.key("tenant"), unknown.to_string()));
        }
        if let Some(expires) = &key.expires
            && crate::security::parse_expiry(expires).is_none()
        {
            return Err(invalid(
                doc,
                &kp.key("expires"),
                format!(
                    "unreadable expiry '{expires}' (expected a date such as 2027-01-01 or an \
                     RFC 3339 date-time)"
                ),
            ));
        }
        if key.scopes.is_empty() {
            return Err(invalid(
                doc,
                &kp.key("scopes"),
                "a key needs at least one scope (run, read, read_content, approve, admin)",
            ));
        }
        if key.rate_limit.is_some_and(|r| r.per_minute == 0) {
            return Err(invalid(
                doc,
                &kp.key("rate_limit").key("per_minute"),
                "must be greater than 0",
            ));
        }
        for (a, agent) in key.agents.iter().enumerate() {
            let ap = kp.key("agents").index(a);
            if config.agent(agent).is_none() {
                return Err(reference(
                    doc,
                    &ap,
                    format!(
                        "unknown agent '{agent}' (declared agents: {})",
                        declared_agents(config)
                    ),
                ));
            }
        }
    }
    Ok(())
}
