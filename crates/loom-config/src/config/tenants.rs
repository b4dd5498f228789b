//! Stage 2 rules of what a tenant overrides (`tenants[]`): secrets something names, prompt
//! variables each of its agents' prompts finds, a model mapping between declared models, tools
//! its agents have, a capture, a journal and a retention that can be used.
//!
//! Checked once every agent is read (their tools and prompts are known then); every refusal is
//! located at the offending value.

use std::collections::BTreeSet;

use super::{Config, Doc};
use crate::error::{ConfigError, ConfigErrorKind};
use crate::model::{AgentSpec, EventsBackend, McpScope, Profile};
use crate::prompt;
use crate::tenant::{SecretSource, TenantSpec};
use crate::yaml::KeyPath;

fn invalid(doc: &Doc, path: &KeyPath, message: impl Into<String>) -> ConfigError {
    doc.error(path, ConfigErrorKind::Invalid, message)
}

fn reference(doc: &Doc, path: &KeyPath, message: impl Into<String>) -> ConfigError {
    doc.error(path, ConfigErrorKind::Reference, message)
}

/// `a, b, c`, or `none`.
fn listing<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    let items: Vec<String> = items.into_iter().map(|s| s.as_ref().to_owned()).collect();
    if items.is_empty() {
        "none".to_owned()
    } else {
        items.join(", ")
    }
}

/// The variables some tenant defines (`tenants[].variables`): a system prompt may use them.
pub(super) fn defined_variables(config: &Config) -> Vec<String> {
    let names: BTreeSet<&String> = config
        .raw
        .tenants
        .iter()
        .flat_map(|t| t.variables.keys())
        .collect();
    names.into_iter().cloned().collect()
}

/// What a tenant may name in `tools_deny` and `approvals`, for the agents it may run.
#[derive(Default)]
struct Visible {
    /// Tools (registered, built-in), by the name the model sees.
    tools: BTreeSet<String>,
    /// Sub-agents' and roles' tool names (deniable, without an approval).
    delegates: BTreeSet<String>,
    /// `<server or alias>__`: the MCP tools, listed only when a run connects.
    mcp_prefixes: BTreeSet<String>,
    /// `<server or alias>__<tool>` of MCP references with an `include` list.
    mcp_tools: BTreeSet<String>,
}

/// The agents a tenant's runs may use (by index in `config.agents`): those it may run, and
/// their sub-agents, which run for the same tenant.
fn reachable(config: &Config, tenant: &TenantSpec) -> Vec<usize> {
    let mut seen: Vec<usize> = (0..config.agents.len())
        .filter(|&i| tenant.allows_agent(&config.agents[i].name))
        .collect();
    let mut next = 0;
    while next < seen.len() {
        for sub in &config.agents[seen[next]].subagents {
            if let Some(i) = config.agents.iter().position(|a| a.name == sub.agent)
                && !seen.contains(&i)
            {
                seen.push(i);
            }
        }
        next += 1;
    }
    seen.sort_unstable();
    seen
}

impl Visible {
    fn of(config: &Config, tenant: &TenantSpec) -> Visible {
        let mut visible = Visible::default();
        for i in reachable(config, tenant) {
            visible.add(&config.agents[i]);
        }
        visible
    }

    fn add(&mut self, agent: &AgentSpec) {
        for reference in &agent.tools {
            if let Some(tool) = &reference.tool {
                self.tools
                    .insert(tool.strip_prefix("loom.").unwrap_or(tool).to_owned());
            } else if let Some(server) = &reference.mcp {
                let prefix = reference.alias.as_deref().unwrap_or(server);
                match &reference.include {
                    Some(names) => self
                        .mcp_tools
                        .extend(names.iter().map(|n| format!("{prefix}__{n}"))),
                    None => {
                        self.mcp_prefixes.insert(format!("{prefix}__"));
                    }
                }
            }
        }
        for sub in &agent.subagents {
            self.delegates.insert(sub.tool_name().to_owned());
        }
        for role in &agent.roles {
            self.delegates.insert(role.name.clone());
        }
    }

    /// Whether `name` is a tool (not a sub-agent nor a role) of these agents.
    fn is_tool(&self, name: &str) -> bool {
        self.tools.contains(name)
            || self.mcp_tools.contains(name)
            || self.mcp_prefixes.iter().any(|p| {
                name.strip_prefix(p.as_str())
                    .is_some_and(|rest| !rest.is_empty())
            })
    }

    fn known(&self, with_delegates: bool) -> String {
        let mut names: Vec<String> = self.tools.iter().cloned().collect();
        names.extend(self.mcp_tools.iter().cloned());
        names.extend(self.mcp_prefixes.iter().map(|p| format!("{p}<tool>")));
        if with_delegates {
            names.extend(self.delegates.iter().cloned());
        }
        listing(names)
    }
}

/// Every rule of what tenants override; called once the agents are checked.
pub(super) fn check_overrides(config: &Config) -> Result<(), ConfigError> {
    for (t, tenant) in config.raw.tenants.iter().enumerate() {
        let tp = KeyPath::root().key("tenants").index(t);
        check_secrets(config, &tp, tenant)?;
        check_models(config, &tp, tenant)?;
        check_tools(config, &tp, tenant)?;
        check_variables(config, &tp, tenant)?;
        check_storage(config, &tp, tenant)?;
    }
    check_unreachable_prompts(config)?;
    check_mcp_scopes(config)
}

/// With a `tenants` list, an agent no tenant may run has no tenant variables: its prompts may
/// use only `agent` and `tenant`.
fn check_unreachable_prompts(config: &Config) -> Result<(), ConfigError> {
    let tenants = &config.raw.tenants;
    if tenants.is_empty() {
        return Ok(());
    }
    let used: Vec<usize> = tenants.iter().flat_map(|t| reachable(config, t)).collect();
    for (i, agent) in config.agents.iter().enumerate() {
        if used.contains(&i) {
            continue;
        }
        let meta = &config.meta[i];
        let mut prompts = vec![(
            KeyPath::root().key("main"),
            meta.system.as_str(),
            meta.system_file.as_deref(),
        )];
        for (r, role) in meta.roles.iter().enumerate() {
            prompts.push((
                KeyPath::root().key("roles").index(r),
                role.system.as_str(),
                role.system_file.as_deref(),
            ));
        }
        for (role, text, file) in prompts {
            if let Ok(used) = prompt::tenant_variables(text)
                && let Some((var, place)) = used.into_iter().next()
            {
                let issue = prompt::TemplateIssue {
                    message: format!(
                        "template variable '{var}' is defined by no tenant that may run agent \
                         '{}' (no tenant lists it in its agents, nor an agent delegating to it)",
                        agent.name
                    ),
                    line: place.map(|(l, _)| l),
                    column: place.map(|(_, c)| c),
                };
                return Err(config.template_error_at(i, &role, file, issue));
            }
        }
    }
    Ok(())
}

/// Each secret a tenant redirects is one the configuration names, read from a usable variable
/// name or file path.
fn check_secrets(config: &Config, tp: &KeyPath, tenant: &TenantSpec) -> Result<(), ConfigError> {
    let doc = &config.docs[0];
    let names = config.secret_names();
    for (name, source) in &tenant.secrets {
        let at = tp.key("secrets").key(name);
        if !names.iter().any(|(n, _)| n == name) {
            let known: BTreeSet<&str> = names.iter().map(|(n, _)| n.as_str()).collect();
            return Err(doc.key_error(
                &at,
                ConfigErrorKind::Reference,
                format!(
                    "no part of the configuration reads the secret '{name}' (the secrets it \
                     reads — api_key_env, headers_env, env_from: {})",
                    listing(known)
                ),
            ));
        }
        match source {
            SecretSource::Env(variable) if !is_variable_name(variable) => {
                return Err(invalid(
                    doc,
                    &at,
                    format!(
                        "'{variable}' is not an environment variable name (letters, digits and \
                         '_', not starting with a digit); write {{file: path}} for a file"
                    ),
                ));
            }
            SecretSource::File { file } if file.as_os_str().is_empty() => {
                return Err(invalid(doc, &at.key("file"), "the file path is empty"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether `name` can name an environment variable: `^[A-Za-z_][A-Za-z0-9_]*$`.
fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// An MCP server reading a secret some tenant redirects must not share its connections between
/// tenants: its scope is `tenant` or `run`.
fn check_mcp_scopes(config: &Config) -> Result<(), ConfigError> {
    let doc = &config.docs[0];
    for (index, server) in config.raw.mcp_servers.iter().enumerate() {
        if server.scope != McpScope::Shared {
            continue;
        }
        let reads = server.headers_env.values().chain(server.env_from.values());
        for secret in reads {
            let redirected = config
                .raw
                .tenants
                .iter()
                .enumerate()
                .find(|(_, tenant)| tenant.secrets.contains_key(secret));
            if let Some((t, tenant)) = redirected {
                return Err(invalid(
                    doc,
                    &KeyPath::root().key("mcp_servers").index(index).key("scope"),
                    format!(
                        "server '{}' reads the secret {secret}, which tenant '{}' redirects \
                         (tenants[{t}].secrets.{secret}): one shared connection would carry one \
                         tenant's credentials for all; set scope: tenant (or scope: run)",
                        server.name, tenant.id
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The model mapping goes from a declared model to another declared model.
fn check_models(config: &Config, tp: &KeyPath, tenant: &TenantSpec) -> Result<(), ConfigError> {
    let doc = &config.docs[0];
    let declared = || listing(config.raw.models.iter().map(|m| m.id.as_str()));
    for (from, to) in &tenant.models {
        let at = tp.key("models").key(from);
        if config.model(from).is_none() {
            return Err(doc.key_error(
                &at,
                ConfigErrorKind::Reference,
                format!(
                    "tenant '{}' maps the model '{from}', which is not declared (declared \
                     models: {})",
                    tenant.id,
                    declared()
                ),
            ));
        }
        if config.model(to).is_none() {
            return Err(reference(
                doc,
                &at,
                format!(
                    "tenant '{}' maps '{from}' to the model '{to}', which is not declared \
                     (declared models: {})",
                    tenant.id,
                    declared()
                ),
            ));
        }
        if from == to {
            return Err(invalid(
                doc,
                &at,
                format!("tenant '{}' maps the model '{from}' to itself", tenant.id),
            ));
        }
        if let (Some(a), Some(b)) = (config.model(from), config.model(to)) {
            let (a, b) = (&a.capabilities, &b.capabilities);
            let lacks: Vec<&str> = [
                ("tools", a.tools && !b.tools),
                ("vision", a.vision && !b.vision),
                (
                    "forced_tool_choice",
                    a.forced_tool_choice && !b.forced_tool_choice,
                ),
            ]
            .into_iter()
            .filter_map(|(name, lost)| lost.then_some(name))
            .collect();
            if !lacks.is_empty() {
                return Err(invalid(
                    doc,
                    &at,
                    format!(
                        "tenant '{}' maps '{from}' to '{to}', which lacks what '{from}' can do \
                         (capabilities: {}): the agents using '{from}' may rely on it",
                        tenant.id,
                        lacks.join(", ")
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `tools_deny` and `approvals` name tools of the agents the tenant may run; `approval:
/// always` needs a durable journal (outside `dev`), as for an agent.
fn check_tools(config: &Config, tp: &KeyPath, tenant: &TenantSpec) -> Result<(), ConfigError> {
    let doc = &config.docs[0];
    let visible = Visible::of(config, tenant);
    for (d, name) in tenant.tools_deny.iter().enumerate() {
        let at = tp.key("tools_deny").index(d);
        if !visible.is_tool(name) && !visible.delegates.contains(name) {
            return Err(reference(
                doc,
                &at,
                format!(
                    "no agent tenant '{}' may run has the tool '{name}' (its tools, as models see \
                     them: {})",
                    tenant.id,
                    visible.known(true)
                ),
            ));
        }
        if tenant.tools_deny[..d].contains(name) {
            return Err(invalid(doc, &at, format!("tool '{name}' listed twice")));
        }
    }
    let durable = config.raw.storage.events.backend != EventsBackend::Memory
        || config.raw.profile == Some(Profile::Dev);
    for (name, approval) in &tenant.approvals {
        let at = tp.key("approvals").key(name);
        if !visible.is_tool(name) {
            let why = if visible.delegates.contains(name) {
                "is a sub-agent or a role, which has no approval".to_owned()
            } else {
                format!("is not a tool of the agents tenant '{}' may run", tenant.id)
            };
            return Err(doc.key_error(
                &at,
                ConfigErrorKind::Reference,
                format!(
                    "'{name}' {why} (its tools, as models see them: {})",
                    visible.known(false)
                ),
            ));
        }
        if *approval == loom_core::tool::Approval::Always && !durable {
            return Err(invalid(
                doc,
                &at,
                format!(
                    "tool '{name}' would pause tenant '{}''s runs for a human decision \
                     (approval: always), which needs a durable journal: with the memory journal \
                     a paused run is lost at exit; use storage.events.backend: jsonl (or the dev \
                     profile)",
                    tenant.id
                ),
            ));
        }
    }
    if let Some(bytes) = tenant.telemetry.capture.raw_max_bytes
        && bytes == 0
    {
        return Err(invalid(
            doc,
            &tp.key("telemetry").key("capture").key("raw_max_bytes"),
            super::NOT_POSITIVE,
        ));
    }
    Ok(())
}

/// Variable names are identifiers other than `agent` and `tenant`, and every variable a
/// system prompt of an agent the tenant may run uses is one it defines.
fn check_variables(config: &Config, tp: &KeyPath, tenant: &TenantSpec) -> Result<(), ConfigError> {
    let doc = &config.docs[0];
    for name in tenant.variables.keys() {
        let at = tp.key("variables").key(name);
        if prompt::KNOWN_VARIABLES.contains(&name.as_str()) {
            return Err(doc.key_error(
                &at,
                ConfigErrorKind::Invalid,
                format!("'{name}' is given by Loom to every prompt; name the variable otherwise"),
            ));
        }
        if !is_variable_name(name) {
            return Err(doc.key_error(
                &at,
                ConfigErrorKind::Invalid,
                format!(
                    "'{name}' cannot be a template variable (letters, digits and '_', not \
                     starting with a digit)"
                ),
            ));
        }
    }
    for i in reachable(config, tenant) {
        let agent = &config.agents[i];
        let meta = &config.meta[i];
        let mut prompts = vec![(
            KeyPath::root().key("main"),
            meta.system.as_str(),
            meta.system_file.as_deref(),
        )];
        for (r, role) in meta.roles.iter().enumerate() {
            prompts.push((
                KeyPath::root().key("roles").index(r),
                role.system.as_str(),
                role.system_file.as_deref(),
            ));
        }
        for (role, text, file) in prompts {
            // The syntax was checked with the agent.
            let Ok(used) = prompt::tenant_variables(text) else {
                continue;
            };
            let Some((var, place)) = used
                .into_iter()
                .find(|(v, _)| !tenant.variables.contains_key(v))
            else {
                continue;
            };
            let issue = prompt::TemplateIssue {
                message: format!(
                    "template variable '{var}' is not defined for tenant '{}', whose runs may use \
                     agent '{}' ({tp}.variables: {})",
                    tenant.id,
                    agent.name,
                    listing(tenant.variables.keys())
                ),
                line: place.map(|(l, _)| l),
                column: place.map(|(_, c)| c),
            };
            return Err(config.template_error_at(i, &role, file, issue));
        }
    }
    Ok(())
}

/// A tenant's journal is usable (a path for `jsonl` and `sqlite`), and so is its retention.
fn check_storage(config: &Config, tp: &KeyPath, tenant: &TenantSpec) -> Result<(), ConfigError> {
    let doc = &config.docs[0];
    if let Some(storage) = &tenant.storage {
        let events = &storage.events;
        let ep = tp.key("storage").key("events");
        if events.backend == EventsBackend::Postgres {
            return Err(invalid(
                doc,
                &ep.key("backend"),
                format!(
                    "tenant '{}': a tenant's own journal cannot be postgres: tenants share the \
                     deployment's postgres journal (storage.events), kept apart by row-level \
                     security",
                    tenant.id
                ),
            ));
        }
        let postgres_keys = [
            ("dsn_env", events.dsn_env.is_some()),
            ("role", events.role != crate::model::DEFAULT_POSTGRES_ROLE),
            ("pool", events.pool != crate::model::PostgresPool::default()),
        ];
        if let Some((key, _)) = postgres_keys.iter().find(|(_, set)| *set) {
            return Err(invalid(
                doc,
                &ep.key(key),
                format!("'{key}' is only for the postgres backend"),
            ));
        }
        if storage.artifacts.backend == Some(crate::model::ArtifactsBackend::Postgres) {
            return Err(invalid(
                doc,
                &tp.key("storage").key("artifacts").key("backend"),
                format!(
                    "tenant '{}': artifacts in postgres follow the deployment's postgres journal \
                     (storage.artifacts), not a tenant's own",
                    tenant.id
                ),
            ));
        }
        if matches!(events.backend, EventsBackend::Jsonl | EventsBackend::Sqlite)
            && events.path.is_none()
        {
            return Err(invalid(
                doc,
                &tp.key("storage").key("events").key("path"),
                format!(
                    "tenant '{}': a {} journal needs a path",
                    tenant.id,
                    match events.backend {
                        EventsBackend::Sqlite => "sqlite",
                        _ => "jsonl",
                    }
                ),
            ));
        }
    }
    if tenant.retention.as_ref().and_then(|r| r.events_days) == Some(0) {
        return Err(invalid(
            doc,
            &tp.key("retention").key("events_days"),
            "must be at least 1 day",
        ));
    }
    Ok(())
}

impl Config {
    /// The secret names the configuration reads, with where: each model's `api_key_env`, each
    /// MCP server's `headers_env` and `env_from` values (as `(name, key path)`, in that order).
    /// A tenant redirects some of them (`tenants[].secrets`).
    pub fn secret_names(&self) -> Vec<(String, String)> {
        let mut names = Vec::new();
        for (m, model) in self.raw.models.iter().enumerate() {
            if let Some(variable) = &model.api_key_env {
                names.push((variable.clone(), format!("models[{m}].api_key_env")));
            }
        }
        for (s, server) in self.raw.mcp_servers.iter().enumerate() {
            for (header, variable) in &server.headers_env {
                names.push((
                    variable.clone(),
                    format!("mcp_servers[{s}].headers_env.{header}"),
                ));
            }
            for (name, variable) in &server.env_from {
                names.push((
                    variable.clone(),
                    format!("mcp_servers[{s}].env_from.{name}"),
                ));
            }
        }
        for (s, source) in self.raw.tool_sources.iter().enumerate() {
            // The convention of the built-in kinds: the secret a source sends is named at
            // `params.auth.secret`.
            if let Some(serde_json::Value::String(name)) = source
                .params
                .get("auth")
                .and_then(|auth| auth.get("secret"))
            {
                names.push((
                    name.clone(),
                    format!("tool_sources[{s}].params.auth.secret"),
                ));
            }
        }
        if let Some(encryption) = &self.raw.storage.encryption {
            for (k, name) in encryption.keys.iter().enumerate() {
                names.push((name.clone(), format!("storage.encryption.keys[{k}]")));
            }
        }
        names
    }

    /// Where tenant `tenant` reads the secret `name`: its own source when it redirects it,
    /// else `None` (the variable of that name).
    pub fn tenant_secret(&self, tenant: &str, name: &str) -> Option<&SecretSource> {
        self.tenant(tenant).and_then(|t| t.secrets.get(name))
    }

    /// The values of tenant `tenant`'s prompt variables (empty for an undeclared tenant).
    pub fn variables(
        &self,
        tenant: &str,
    ) -> &std::collections::BTreeMap<String, serde_json::Value> {
        static NONE: std::sync::OnceLock<std::collections::BTreeMap<String, serde_json::Value>> =
            std::sync::OnceLock::new();
        match self.tenant(tenant) {
            Some(spec) => &spec.variables,
            None => NONE.get_or_init(std::collections::BTreeMap::new),
        }
    }

    /// The model tenant `tenant`'s runs use where the configuration says `model`.
    pub fn tenant_model<'a>(&'a self, tenant: &str, model: &'a str) -> &'a str {
        match self.tenant(tenant) {
            Some(spec) => spec.model(model),
            None => model,
        }
    }

    /// `telemetry.capture` for tenant `tenant`'s runs: the root's with its override.
    pub fn capture_for(&self, tenant: &str) -> crate::model::CaptureConfig {
        let root = &self.raw.telemetry.capture;
        match self.tenant(tenant) {
            Some(spec) => spec.telemetry.capture.over(root),
            None => root.clone(),
        }
    }

    /// The journal location of tenant `tenant` when it declares its own storage: the
    /// directory of a `jsonl` journal or the file of a `sqlite` one, resolved against
    /// [`Config::base_dir`] (`None` for a tenant without its own journal, or a `memory` one).
    pub fn tenant_events_path(&self, tenant: &str) -> Option<std::path::PathBuf> {
        let events = &self.tenant(tenant)?.storage.as_ref()?.events;
        match events.backend {
            EventsBackend::Jsonl | EventsBackend::Sqlite => {
                events.path.as_ref().map(|p| self.base_dir.join(p))
            }
            EventsBackend::Memory | EventsBackend::Postgres => None,
        }
    }

    /// The artifact directory of tenant `tenant` when it declares its own storage: its
    /// `artifacts.path` for `local`, else beside its journal as for the root journal (`None`:
    /// no storage of its own, or artifacts in memory).
    pub fn tenant_artifacts_path(&self, tenant: &str) -> Option<std::path::PathBuf> {
        let storage = self.tenant(tenant)?.storage.as_ref()?;
        match (storage.artifacts.backend, &storage.artifacts.path) {
            (Some(crate::model::ArtifactsBackend::Memory), _) => None,
            (_, Some(path)) => Some(self.base_dir.join(path)),
            (_, None) => {
                let events = self.tenant_events_path(tenant)?;
                match storage.events.backend {
                    EventsBackend::Sqlite => events.parent().map(|dir| dir.join(".artifacts")),
                    _ => Some(events.join(".artifacts")),
                }
            }
        }
    }
}
