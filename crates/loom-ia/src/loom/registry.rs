//! What a [`Loom`] knows and checks before running: registered tools, policies and judge
//! conditions, agents resolved for a tenant, and [`Loom::validate`].

use super::{DEFAULT_TENANT, Loom, ValidatedAgent, ValidatedSource, Validation};
use crate::LoomError;
use loom_config::{Config, EventsBackend};
use loom_core::ids::is_valid_name;
use loom_core::policy::Policy;
use loom_core::ports::SourceContext;
use loom_core::tool::Tool;
use loom_engine::{AgentRuntime, JudgeCondition};
use std::collections::BTreeMap;
use std::sync::Arc;

impl Loom {
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

    /// Plugs `client` in place of the declared model `id` (a `models[].id` of the
    /// configuration), for every agent slot that uses it and every tenant: a test runs its YAML
    /// agents on a scripted model built in Rust ([`crate::testing::Script`]), with no network.
    /// The model keeps its declaration (pricing, retries, timeouts, capabilities); only its
    /// client changes. Plugging again replaces the previous client. Refused
    /// ([`LoomError::Registration`]) when the configuration declares no model `id`.
    pub fn register_model(
        &self,
        id: &str,
        client: impl loom_core::model::ModelClient + 'static,
    ) -> Result<(), LoomError> {
        let declared: Vec<&str> = self
            .inner
            .config
            .raw()
            .models
            .iter()
            .map(|m| m.id.as_str())
            .collect();
        if !declared.contains(&id) {
            return Err(LoomError::Registration(format!(
                "no model '{id}' is declared (declared models: {})",
                declared.join(", ")
            )));
        }
        self.inner.models.plug(id, Arc::new(client));
        if let Ok(mut agents) = self.inner.agents.write() {
            agents.clear();
        }
        Ok(())
    }

    /// Registers the factory of the tool sources of kind `kind` (`tool_sources: [{name, kind,
    /// params}]`): it is called once per source of that kind and tenant, with the source's
    /// name, its `params`, the tenant's secrets and the configuration's directory, and returns
    /// the source. Refused when the kind is already registered (`openapi` is built in with
    /// the feature `openapi`).
    pub fn register_source(
        &self,
        kind: &str,
        factory: Arc<dyn crate::SourceFactory>,
    ) -> Result<(), LoomError> {
        self.inner.tool_sources.register(kind, factory)?;
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

    /// Registers in `other` every tool, policy and condition registered here that it does not
    /// have under the same name (an evaluation's variant opened from another configuration
    /// runs the same code).
    pub(crate) fn share_registrations(&self, other: &Loom) -> Result<(), LoomError> {
        let poisoned = || LoomError::Registration("registry lock poisoned".into());
        let tools = self.inner.tools.read().map_err(|_| poisoned())?.clone();
        let mut theirs = other.inner.tools.write().map_err(|_| poisoned())?;
        for (name, tool) in tools {
            theirs.entry(name).or_insert(tool);
        }
        drop(theirs);
        let mut theirs = other.inner.policies.write().map_err(|_| poisoned())?;
        for (name, policy) in self.policies() {
            theirs.entry(name).or_insert(policy);
        }
        drop(theirs);
        let conditions = self
            .inner
            .conditions
            .read()
            .map_err(|_| poisoned())?
            .clone();
        let mut theirs = other.inner.conditions.write().map_err(|_| poisoned())?;
        for (name, condition) in conditions {
            theirs.entry(name).or_insert(condition);
        }
        drop(theirs);
        self.inner
            .tool_sources
            .share_into(&other.inner.tool_sources);
        if let Ok(mut agents) = other.inner.agents.write() {
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
        let config = &self.inner.config;
        for spec in config.agents() {
            self.agent(&spec.name, base_tenant(config, &spec.name))?;
            // As each tenant may run it (its models, tools, approvals and variables).
            for tenant in config
                .raw()
                .tenants
                .iter()
                .filter(|t| t.allows_agent(&spec.name))
            {
                self.agent(&spec.name, &tenant.id)?;
            }
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
            let tenant = base_tenant(config, &spec.name);
            let runtime = self.agent(&spec.name, tenant)?;
            let mut sources = Vec::new();
            let context = SourceContext {
                tenant_id: tenant.to_owned(),
                session_id: "validate".to_owned(),
                run_id: "validate".to_owned(),
            };
            for bound in &runtime.sources {
                let listed = bound.source.open(&context).await;
                bound.source.release(&context).await;
                sources.push(ValidatedSource {
                    name: bound.source.name().to_owned(),
                    kind: source_kind(config, spec, bound.source.name()),
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
                tenant: (!config.raw().tenants.is_empty()).then(|| tenant.to_owned()),
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
            EventsBackend::Postgres => {
                let events = &config.raw().storage.events;
                format!(
                    "postgres at ${} as role {}",
                    events.dsn_env.as_deref().unwrap_or_default(),
                    events.role
                )
            }
            backend => describe_journal(backend, config.events_path()),
        };
        let storage = &config.raw().storage;
        let sealed = storage.encryption.as_ref().map_or(String::new(), |e| {
            format!(", sealed with {} (the first seals)", e.keys.join(", "))
        });
        let kept = storage
            .retention
            .events_days
            .map_or(String::new(), |days| format!(", retention {days} days"));
        let journal = format!("{journal}{sealed}{kept}");
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
            services: services(config),
            tenants: self.validated_tenants(),
        })
    }

    pub(super) fn tool_names(&self) -> Vec<String> {
        self.inner
            .tools
            .read()
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default()
    }

    pub(super) fn agent(&self, name: &str, tenant: &str) -> Result<Arc<AgentRuntime>, LoomError> {
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
            tool_sources: self.inner.tool_sources.clone(),
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

    /// The agent `name` resolved for `tenant`.
    pub(crate) fn agent_runtime(
        &self,
        name: &str,
        tenant: &str,
    ) -> Result<Arc<AgentRuntime>, LoomError> {
        self.agent(name, tenant)
    }
}

/// Where a journal lives, as `validate` says it.
pub(super) fn describe_journal(backend: EventsBackend, path: Option<std::path::PathBuf>) -> String {
    let path = path.map(|p| p.display().to_string()).unwrap_or_default();
    match backend {
        EventsBackend::Memory => "memory (lost at exit)".to_owned(),
        EventsBackend::Jsonl => format!("jsonl in {path}"),
        EventsBackend::Sqlite => format!("sqlite in {path}"),
        EventsBackend::Postgres => "postgres".to_owned(),
    }
}

/// The tenant an agent is shown for by `validate`: `default` without a `tenants` list, else the
/// first tenant that may run it (`default` when none may: it then uses no tenant variable).
fn base_tenant<'a>(config: &'a loom_config::Config, agent: &str) -> &'a str {
    config
        .raw()
        .tenants
        .iter()
        .find(|t| t.allows_agent(agent))
        .map_or(DEFAULT_TENANT, |t| t.id.as_str())
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

/// The shared services `storage` declares beyond the journal (queue, bus, limits), as
/// `validate` shows them: where each is reached (the variable, never its value).
fn services(config: &loom_config::Config) -> Vec<(String, String)> {
    use loom_config::{BusBackend, LimitsBackend, QueueBackend};
    let storage = &config.raw().storage;
    let var = |name: &Option<String>| name.as_deref().unwrap_or("?").to_owned();
    let mut services = Vec::new();
    if storage.queue.backend == QueueBackend::Rabbitmq {
        services.push((
            "Queue".to_owned(),
            format!(
                "rabbitmq ({}), queues {}.jobs*, a job dead after {} attempt(s); `loom queue` shows them",
                var(&storage.queue.url_env),
                storage.queue.name,
                storage.queue.max_attempts
            ),
        ));
    }
    match storage.bus.backend {
        BusBackend::Memory => {}
        BusBackend::Redis => services.push((
            "Bus".to_owned(),
            format!("redis pub/sub ({})", var(&storage.bus.url_env)),
        )),
        BusBackend::Postgres => services.push((
            "Bus".to_owned(),
            format!(
                "postgres LISTEN/NOTIFY ({})",
                storage
                    .bus
                    .dsn_env
                    .clone()
                    .or_else(|| storage.events.dsn_env.clone())
                    .unwrap_or_else(|| "?".to_owned())
            ),
        )),
    }
    if storage.limits.backend == LimitsBackend::Redis {
        services.push((
            "Limits".to_owned(),
            format!(
                "redis ({}): rate limits, quotas and tenant budgets counted once for every process",
                var(&storage.limits.url_env)
            ),
        ));
    }
    services
}

/// What the source the agent `spec` names `name` (its alias, or the server's or source's
/// name) is: `mcp`, or the `kind` of its `tool_sources` entry.
fn source_kind(config: &Config, spec: &loom_config::AgentSpec, name: &str) -> String {
    spec.tools
        .iter()
        .find_map(|reference| {
            let origin = reference.mcp.as_deref().or(reference.source.as_deref())?;
            if reference.alias.as_deref().unwrap_or(origin) != name {
                return None;
            }
            match &reference.source {
                Some(source) => config
                    .tool_source(source)
                    .map(|(_, declared)| declared.kind.clone()),
                None => Some("mcp".to_owned()),
            }
        })
        .unwrap_or_else(|| "mcp".to_owned())
}
