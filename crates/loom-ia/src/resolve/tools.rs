//! An agent's tools: registered Rust tools, built-in tools (`loom.<name>`) and MCP servers,
//! with the agent's overrides of their declarations and their output contracts.

use std::sync::Arc;

use loom_builtins::{Folder, Right, Rights};
use loom_config::{Config, FolderRight, ToolRef};
use loom_core::policy::{DecisionKind, Point};
use loom_core::tool::{Approval, OnUnknown, Tool, ToolDeclarations};
use loom_engine::{BoundPolicy, BoundSource, BoundTool, contract::Contract};

use super::{Resolver, Stage, durable, seconds};
use crate::{LoomError, sources::AgentSource};

/// An agent's tools: those bound now, and its tool sources (opened by each run).
pub(super) struct AgentTools {
    pub(super) tools: Vec<BoundTool>,
    pub(super) sources: Vec<BoundSource>,
}

impl Resolver<'_> {
    /// Binds the agent's `tools:`, in order; `policies` are the agent's (for `approval:
    /// policy`).
    pub(super) fn tools(
        &self,
        spec: &loom_config::AgentSpec,
        policies: &[BoundPolicy],
    ) -> Result<AgentTools, LoomError> {
        let mut bound = AgentTools {
            tools: Vec::with_capacity(spec.tools.len()),
            sources: Vec::new(),
        };
        for (index, reference) in spec.tools.iter().enumerate() {
            if let Some(server) = &reference.mcp {
                let source = self.mcp_reference(spec, index, server, reference, policies)?;
                bound.sources.push(source);
            } else if let Some(name) = &reference.source {
                if let Some(source) =
                    self.source_reference(spec, index, name, reference, policies)?
                {
                    bound.sources.push(source);
                }
            } else if let Some(tool) = self.tool_reference(spec, index, reference, policies)? {
                if bound.tools.iter().any(|b| b.name() == tool.name()) {
                    return Err(self.at_tool(
                        spec,
                        index,
                        "tool",
                        format!(
                            "tool '{}' is listed twice",
                            reference.tool.as_deref().unwrap_or_default()
                        ),
                    ));
                }
                bound.tools.push(tool);
            }
        }
        for tool in self.sandbox_tools(spec)? {
            if bound.tools.iter().any(|b| b.name() == tool.name()) {
                return Err(LoomError::from(self.config.error_at_agent(
                    &spec.name,
                    "sandbox",
                    format!(
                        "the tool '{}' of the agent's sandbox or skills is also listed in tools",
                        tool.name()
                    ),
                )));
            }
            bound.tools.push(tool);
        }
        // The tenant's `tools_deny`: never offered, so a model asking for one gets the
        // unknown-tool error.
        if let Some(tenant) = self.config.tenant(self.tenant) {
            bound.tools.retain(|tool| !tenant.denies(tool.name()));
        }
        Ok(bound)
    }

    /// `tenants[i].approvals.<tool>` of the tenant, when it sets the approval of `tool`.
    fn tenant_approval(&self, tool: &str) -> Option<(Approval, String)> {
        let (index, tenant) = self
            .config
            .raw()
            .tenants
            .iter()
            .enumerate()
            .find(|(_, t)| t.id == self.tenant)?;
        let approval = *tenant.approvals.get(tool)?;
        Some((approval, format!("tenants[{index}].approvals.{tool}")))
    }

    /// Refuses the tenant's `approval: policy` of `tool` when no policy of the agent can ask a
    /// human (located at the tenant's key).
    fn check_tenant_approval(
        &self,
        spec: &loom_config::AgentSpec,
        tool: &str,
        policies: &[BoundPolicy],
    ) -> Result<Option<Approval>, LoomError> {
        let Some((approval, key)) = self.tenant_approval(tool) else {
            return Ok(None);
        };
        if approval == Approval::Policy && !self.may_pause(spec, policies) {
            return Err(self
                .config
                .error_at_root(
                    &key,
                    format!(
                        "tenant '{}', tool '{tool}' of agent '{}': {}",
                        self.tenant,
                        spec.name,
                        loom_config::APPROVAL_POLICY
                    ),
                )
                .into());
        }
        Ok(Some(approval))
    }

    /// A located error at `tools[index].key` of the agent.
    fn at_tool(
        &self,
        spec: &loom_config::AgentSpec,
        index: usize,
        key: &str,
        message: String,
    ) -> LoomError {
        LoomError::from(self.config.error_at_agent(
            &spec.name,
            &format!("tools[{index}].{key}"),
            message,
        ))
    }

    /// An MCP server of the agent (`- mcp: <server>`): its tools are listed when a run opens
    /// it; what the configuration says of them is checked here.
    fn mcp_reference(
        &self,
        spec: &loom_config::AgentSpec,
        index: usize,
        server: &str,
        reference: &ToolRef,
        policies: &[BoundPolicy],
    ) -> Result<BoundSource, LoomError> {
        let Some(source) = self.sources.get(server) else {
            return Err(self.at_tool(spec, index, "mcp", format!("unknown MCP server '{server}'")));
        };
        let (origin, origin_key) = match self
            .config
            .raw()
            .mcp_servers
            .iter()
            .position(|m| m.name == server)
        {
            Some(i) => (
                &self.config.raw().mcp_servers[i].tools,
                format!("mcp_servers[{i}]"),
            ),
            None => {
                return Err(self.at_tool(
                    spec,
                    index,
                    "mcp",
                    format!("unknown MCP server '{server}'"),
                ));
            }
        };
        self.many_reference(
            spec,
            index,
            (server, origin, &origin_key),
            source.clone(),
            reference,
            policies,
        )
    }

    /// A tool source of the agent (`- source: <name>`): built for the tenant by its factory
    /// (`None` while the configuration is opened and its kind is not registered yet); its tools
    /// are listed when a run opens it.
    fn source_reference(
        &self,
        spec: &loom_config::AgentSpec,
        index: usize,
        name: &str,
        reference: &ToolRef,
        policies: &[BoundPolicy],
    ) -> Result<Option<BoundSource>, LoomError> {
        let Some((i, declared)) = self.config.tool_source(name) else {
            return Err(self.at_tool(
                spec,
                index,
                "source",
                format!("unknown tool source '{name}'"),
            ));
        };
        let source =
            self.registry
                .tool_sources
                .source(self.config, name, self.tenant, self.stage)?;
        let bound = self.many_reference(
            spec,
            index,
            (name, &declared.tools, &format!("tool_sources[{i}]")),
            match &source {
                Some(source) => source.clone(),
                None => Arc::new(Unbuilt(name.to_owned())),
            },
            reference,
            policies,
        )?;
        Ok(source.map(|_| bound))
    }

    /// The many tools of an MCP server or a tool source (`origin`: its name, the declarations
    /// of its tools in its own section, and that section's key) as the agent uses them: the
    /// approvals of both levels checked, the agent's declarations over the origin's.
    fn many_reference(
        &self,
        spec: &loom_config::AgentSpec,
        index: usize,
        origin: (
            &str,
            &std::collections::BTreeMap<String, loom_config::ToolOverrides>,
            &str,
        ),
        source: Arc<dyn loom_core::ports::ToolSource>,
        reference: &ToolRef,
        policies: &[BoundPolicy],
    ) -> Result<BoundSource, LoomError> {
        let (server, origin_tools, origin_key) = origin;
        let at = |key: &str, message: String| self.at_tool(spec, index, key, message);
        for (tool, overrides) in origin_tools {
            let key = format!("{origin_key}.tools.{tool}.approval");
            match overrides.approval {
                Some(Approval::Policy) if !self.may_pause(spec, policies) => {
                    return Err(self
                        .config
                        .error_at_root(
                            &key,
                            format!(
                                "agent '{}', tool '{server}__{tool}': {}",
                                spec.name,
                                loom_config::APPROVAL_POLICY
                            ),
                        )
                        .into());
                }
                Some(Approval::Always) if !durable(self.config) => {
                    return Err(self
                        .config
                        .error_at_root(&key, not_durable(&format!("{server}__{tool}")))
                        .into());
                }
                _ => {}
            }
        }
        // Output contracts, by the name the model sees: the origin's, then the agent's over
        // them; applied when a run opens the source and binds its tools.
        let prefix = reference.alias.as_deref().unwrap_or(server);
        let mut contracts = std::collections::BTreeMap::new();
        for (tool, declared) in origin_tools {
            let name = format!("{prefix}__{tool}");
            if let Some(contract) =
                tool_contract(&name, declared.output.as_ref()).map_err(|(key, message)| {
                    LoomError::from(
                        self.config
                            .error_at_root(&format!("{origin_key}.tools.{tool}.{key}"), message),
                    )
                })?
            {
                contracts.insert(name, contract);
            }
        }
        for (tool, overrides) in &reference.tools {
            let name = format!("{prefix}__{tool}");
            if let Some(contract) = tool_contract(&name, overrides.output.as_ref())
                .map_err(|(key, message)| at(&format!("tools.{tool}.{key}"), message))?
            {
                contracts.insert(name, contract);
            }
            match overrides.approval {
                Some(Approval::Policy) if !self.may_pause(spec, policies) => {
                    return Err(at(
                        &format!("tools.{tool}.approval"),
                        loom_config::APPROVAL_POLICY.to_owned(),
                    ));
                }
                Some(Approval::Always) if !durable(self.config) => {
                    return Err(at(
                        &format!("tools.{tool}.approval"),
                        not_durable(&format!("{server}__{tool}")),
                    ));
                }
                _ => {}
            }
        }
        // The origin's approvals, under the agent's own declarations.
        let mut overrides = reference.tools.clone();
        for (tool, declared) in origin_tools {
            if let Some(approval) = declared.approval {
                let entry = overrides.entry(tool.clone()).or_default();
                entry.approval.get_or_insert(approval);
            }
        }
        let mut agent_source = AgentSource::new(
            source,
            server,
            reference.alias.as_deref(),
            reference.include.clone(),
            reference.exclude.clone(),
            overrides,
        );
        if let Some(tenant) = self.config.tenant(self.tenant) {
            let prefix = format!("{}__", reference.alias.as_deref().unwrap_or(server));
            let mut approvals = std::collections::BTreeMap::new();
            for name in tenant.approvals.keys().filter(|n| n.starts_with(&prefix)) {
                if let Some(approval) = self.check_tenant_approval(spec, name, policies)? {
                    approvals.insert(name.clone(), approval);
                }
            }
            agent_source = agent_source.for_tenant(tenant.tools_deny.clone(), approvals);
        }
        Ok(BoundSource {
            source: Arc::new(agent_source),
            required: reference.required,
            contracts,
        })
    }

    /// A registered or built-in tool with the agent's overrides and contract; `None` when the
    /// configuration is opened and the tool is not registered yet (what the reference alone
    /// says is checked then, the rest when the agent is resolved to run).
    fn tool_reference(
        &self,
        spec: &loom_config::AgentSpec,
        index: usize,
        reference: &ToolRef,
        policies: &[BoundPolicy],
    ) -> Result<Option<BoundTool>, LoomError> {
        let at = |key: &str, message: String| self.at_tool(spec, index, key, message);
        let tool_name = reference.tool.clone().unwrap_or_default();
        let contract =
            tool_contract(&tool_name, reference.output.as_ref()).map_err(|(key, m)| at(key, m))?;
        let timeout = match reference.timeout {
            Some(secs) => Some(
                seconds(secs)
                    .ok_or_else(|| at("timeout", format!("{secs} s is not a usable duration")))?,
            ),
            None => None,
        };
        let tool: Arc<dyn Tool> = if tool_name.starts_with("loom.") {
            builtin(self.config, &tool_name, reference).map_err(|message| at("tool", message))?
        } else if let Some(tool) = self.registry.tools.get(&tool_name) {
            tool.clone()
        } else if self.stage == Stage::Open {
            // Registered in code after the configuration is opened: check what the reference
            // says alone.
            self.check_declarations(
                spec,
                index,
                reference,
                &tool_name,
                &yaml_only(reference),
                policies,
            )?;
            self.check_tenant_approval(spec, &tool_name, policies)?;
            return Ok(None);
        } else {
            let registered: Vec<&str> = self.registry.tools.keys().map(String::as_str).collect();
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
        let mut declarations: ToolDeclarations = tool.spec().declarations.clone();
        overlay(&mut declarations, reference);
        if let Some(timeout) = timeout {
            declarations.timeout = Some(timeout);
        }
        if let Some(approval) = self.check_tenant_approval(spec, &tool.spec().name, policies)? {
            declarations.approval = approval;
        }
        self.check_declarations(spec, index, reference, &tool_name, &declarations, policies)?;
        let description = reference
            .description
            .clone()
            .unwrap_or_else(|| tool.spec().description.clone());
        let mut bound_tool = BoundTool::new(tool, declarations, description)
            .map_err(|e| at("tool", e.to_string()))?;
        if let Some(contract) = contract {
            bound_tool = bound_tool.with_contract(contract);
        }
        Ok(Some(bound_tool))
    }

    /// What the effective declarations of a tool need: a policy that can pause for
    /// `approval: policy`, a durable journal for a call that can pause, an idempotency store
    /// for a business key. Located at the reference's key when the YAML set it.
    fn check_declarations(
        &self,
        spec: &loom_config::AgentSpec,
        index: usize,
        reference: &ToolRef,
        tool_name: &str,
        declarations: &ToolDeclarations,
        policies: &[BoundPolicy],
    ) -> Result<(), LoomError> {
        let at = |key: &str, message: String| self.at_tool(spec, index, key, message);
        let from_yaml = |yaml: bool, key: &'static str| if yaml { key } else { "tool" };
        if declarations.approval == Approval::Policy && !self.may_pause(spec, policies) {
            return Err(at(
                from_yaml(reference.approval.is_some(), "approval"),
                format!("tool '{tool_name}': {}", loom_config::APPROVAL_POLICY),
            ));
        }
        let can_pause = declarations.approval == Approval::Always
            || declarations.on_unknown == OnUnknown::Pause;
        if can_pause && !durable(self.config) {
            let key = from_yaml(reference.approval == Some(Approval::Always), "approval");
            return Err(at(key, not_durable(tool_name)));
        }
        if declarations.business_key.is_some() && self.config.raw().storage.idempotency.is_none() {
            return Err(at(
                "tool",
                format!(
                    "tool '{tool_name}' declares a business key, which needs a shared durable \
                     idempotency store so that two runs never perform the same action twice; \
                     declare storage.idempotency: {{backend: sqlite, path: ...}} or {{backend: postgres}}"
                ),
            ));
        }
        Ok(())
    }

    /// Whether a policy of the agent can ask a human before a tool call (`approval:
    /// policy`); when the configuration is opened, a policy not registered yet may.
    fn may_pause(&self, spec: &loom_config::AgentSpec, policies: &[BoundPolicy]) -> bool {
        can_pause(policies)
            || (self.stage == Stage::Open
                && spec.policies.iter().any(|p| {
                    p.hook != loom_core::policy::REQUIRE_TOOL
                        && !self.registry.policies.contains_key(&p.hook)
                }))
    }
}

/// The agent's overrides of a tool's declarations (`side_effects`, `approval`, `idempotent`,
/// `offload_over`).
fn overlay(declarations: &mut ToolDeclarations, reference: &ToolRef) {
    if let Some(side_effects) = reference.side_effects {
        declarations.side_effects = side_effects;
    }
    if let Some(approval) = reference.approval {
        declarations.approval = approval;
    }
    if let Some(idempotent) = reference.idempotent {
        declarations.idempotent = idempotent;
    }
    if let Some(offload_over) = reference.offload_over {
        declarations.offload_over = Some(offload_over);
    }
}

/// The declarations the reference alone sets, over the defaults (a tool not registered yet).
fn yaml_only(reference: &ToolRef) -> ToolDeclarations {
    let mut declarations = ToolDeclarations::default();
    overlay(&mut declarations, reference);
    declarations
}

/// The tool's output contract (`output:` on its reference), refused with the key at fault.
fn tool_contract(
    tool_name: &str,
    output: Option<&loom_config::OutputContract>,
) -> Result<Option<Contract>, (&'static str, String)> {
    let Some(output) = output else {
        return Ok(None);
    };
    if output.on_failure != loom_config::OnFailure::Fail {
        // The engine turns a tool result that breaks its contract into an error result;
        // keeping it flagged or replacing it is not implemented for tools.
        return Err((
            "output.on_failure",
            format!(
                "tool '{tool_name}': on_failure '{}' is not supported for a tool's output \
                 contract in this version (a result that breaks it becomes an error result the \
                 model reads); use on_failure: fail",
                super::guards::engine_on_failure(output.on_failure).as_str()
            ),
        ));
    }
    if output.repair != loom_config::RepairSettings::default() {
        // A tool is never repaired: a result that breaks its contract is an error.
        return Err((
            "output.repair",
            format!(
                "tool '{tool_name}': a tool is never repaired (a result that breaks its contract \
                 becomes an error result the model reads); remove output.repair"
            ),
        ));
    }
    super::contract(output)
        .map(Some)
        .map_err(|message| ("output", message))
}

/// Whether one of `policies` can ask a human before a tool call (`approval: policy`).
fn can_pause(policies: &[BoundPolicy]) -> bool {
    policies.iter().any(|p| {
        p.points.contains(&Point::BeforeTool) && p.policy.decisions().contains(&DecisionKind::Pause)
    })
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
fn builtin(config: &Config, name: &str, reference: &ToolRef) -> Result<Arc<dyn Tool>, String> {
    match name {
        "loom.current_datetime" => Ok(Arc::new(loom_builtins::current_datetime(Arc::new(
            crate::SystemClock,
        )))),
        "loom.local_files" => loom_builtins::local_files(folders(config, reference)?)
            .map(|t| Arc::new(t) as Arc<dyn Tool>)
            .map_err(|e| e.to_string()),
        "loom.excel" => excel(config, reference),
        "loom.fetch_page" => fetch_page(reference),
        "loom.sql" => sql(config, reference),
        other => Err(format!("unknown built-in tool '{other}'")),
    }
}

/// The folders of `loom.local_files` or `loom.excel`, relative to the configuration; rights
/// needing approval (`overwrite`, `delete`) are refused until approvals reach built-in tools.
fn folders(config: &Config, reference: &ToolRef) -> Result<Vec<Folder>, String> {
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
    Ok(folders)
}

/// `loom.excel` over its folders.
#[cfg(feature = "excel")]
fn excel(config: &Config, reference: &ToolRef) -> Result<Arc<dyn Tool>, String> {
    loom_builtins::excel(folders(config, reference)?)
        .map(|tool| Arc::new(tool) as Arc<dyn Tool>)
        .map_err(|error| format!("loom.excel: {error}"))
}

/// `loom.excel` is refused by a build without it.
#[cfg(not(feature = "excel"))]
fn excel(_config: &Config, _reference: &ToolRef) -> Result<Arc<dyn Tool>, String> {
    Err(
        "loom.excel needs the Cargo feature 'excel' of loom-ia, which this build does not have"
            .to_owned(),
    )
}

/// `loom.fetch_page` with its parameters.
#[cfg(feature = "fetch")]
pub(super) fn fetch_page(reference: &ToolRef) -> Result<Arc<dyn Tool>, String> {
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
pub(super) fn fetch_page(_reference: &ToolRef) -> Result<Arc<dyn Tool>, String> {
    Err(
        "loom.fetch_page needs the Cargo feature 'fetch' of loom-ia, which this build does \
         not have"
            .to_owned(),
    )
}

/// `loom.sql` with its parameters (checked by the configuration; the DSN read here).
#[cfg(feature = "sql")]
fn sql(config: &Config, reference: &ToolRef) -> Result<Arc<dyn Tool>, String> {
    use loom_builtins::{SqlDatabase, SqlOptions, SqlTable};
    let Some(database) = &reference.database else {
        return Err("loom.sql needs 'database'".to_owned());
    };
    let database = match database.backend {
        loom_config::SqlBackend::Sqlite => {
            let path = database.path.clone().unwrap_or_default();
            SqlDatabase::Sqlite(config.base_dir().join(path))
        }
        loom_config::SqlBackend::Postgres => {
            let name = database.dsn_env.clone().unwrap_or_default();
            let dsn = crate::env::var(config, &name).filter(|dsn| !dsn.is_empty());
            let Some(dsn) = dsn else {
                return Err(format!(
                    "loom.sql: the variable '{name}' (database.dsn_env) is not set"
                ));
            };
            SqlDatabase::Postgres(dsn)
        }
    };
    let tables = reference
        .tables
        .iter()
        .flatten()
        .map(|table| SqlTable {
            name: table.name.clone(),
            columns: table.columns.clone(),
        })
        .collect();
    let mut options = SqlOptions::new(database, tables);
    if let Some(max_rows) = reference.max_rows {
        options.max_rows = usize::try_from(max_rows).unwrap_or(usize::MAX);
    }
    if let Some(timeout) = reference.timeout.and_then(super::seconds) {
        options.timeout = timeout;
    }
    loom_builtins::sql(options)
        .map(|tool| Arc::new(tool) as Arc<dyn Tool>)
        .map_err(|error| error.to_string())
}

/// `loom.sql` is refused by a build without it.
#[cfg(not(feature = "sql"))]
fn sql(_config: &Config, _reference: &ToolRef) -> Result<Arc<dyn Tool>, String> {
    Err(
        "loom.sql needs the Cargo feature 'sql' of loom-ia, which this build does not have"
            .to_owned(),
    )
}

/// The stand-in of a tool source whose kind is registered after the configuration is opened:
/// only its references are checked then, and it is never offered to a run.
#[derive(Debug)]
struct Unbuilt(String);

impl loom_core::ports::ToolSource for Unbuilt {
    fn name(&self) -> &str {
        &self.0
    }

    fn open<'a>(
        &'a self,
        _ctx: &'a loom_core::ports::SourceContext,
    ) -> loom_core::BoxFuture<'a, Result<Vec<Arc<dyn Tool>>, loom_core::ports::SourceError>> {
        Box::pin(async move {
            Err(loom_core::ports::SourceError {
                message: format!("tool source '{}' is not built yet", self.0),
                circuit: None,
            })
        })
    }

    fn release<'a>(
        &'a self,
        _ctx: &'a loom_core::ports::SourceContext,
    ) -> loom_core::BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}
