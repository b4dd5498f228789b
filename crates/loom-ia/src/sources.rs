//! Tool sources as an agent references them: `tools: [{mcp: <server>, alias, include, exclude,
//! tools: {<tool>: overrides}}]`.
//!
//! A server's source names its tools `<server>__<tool>` with the declarations of its
//! annotations and of `mcp_servers[].tools`. [`AgentSource`] filters them (`include` /
//! `exclude`), renames them (`<alias>__<tool>`) and applies the agent's overrides last, which
//! gives the reference's precedence: annotations < `mcp_servers[].tools` < the agent's `tools`.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use loom_config::ToolOverrides;
use loom_core::{
    BoxFuture,
    ports::{SourceContext, SourceError, ToolSource},
    tool::{Approval, Tool, ToolContext, ToolError, ToolOutput, ToolSpec},
};
use serde_json::Value;

/// A source seen through one agent's reference.
#[derive(Debug)]
pub(crate) struct AgentSource {
    inner: Arc<dyn ToolSource>,
    server: String,
    prefix: String,
    include: Option<Vec<String>>,
    exclude: Option<Vec<String>>,
    overrides: BTreeMap<String, ToolOverrides>,
    /// The tenant's `tools_deny`, by the name the model sees.
    deny: Vec<String>,
    /// The tenant's `approvals`, by the name the model sees.
    approvals: BTreeMap<String, Approval>,
}

impl AgentSource {
    pub(crate) fn new(
        inner: Arc<dyn ToolSource>,
        server: &str,
        alias: Option<&str>,
        include: Option<Vec<String>>,
        exclude: Option<Vec<String>>,
        overrides: BTreeMap<String, ToolOverrides>,
    ) -> AgentSource {
        AgentSource {
            inner,
            server: server.to_owned(),
            prefix: alias.unwrap_or(server).to_owned(),
            include,
            exclude,
            overrides,
            deny: Vec::new(),
            approvals: BTreeMap::new(),
        }
    }

    /// The source as one tenant's runs see it: without the tools it denies, with its
    /// approvals over the agent's (`tenants[].tools_deny`, `tenants[].approvals`).
    pub(crate) fn for_tenant(
        mut self,
        deny: Vec<String>,
        approvals: BTreeMap<String, Approval>,
    ) -> AgentSource {
        self.deny = deny;
        self.approvals = approvals;
        self
    }

    /// The tool as this agent sees it, or `None` when the agent does not use it.
    fn adapt(&self, tool: Arc<dyn Tool>) -> Option<Arc<dyn Tool>> {
        let bare = tool
            .spec()
            .name
            .strip_prefix(&format!("{}__", self.server))?
            .to_owned();
        if self
            .include
            .as_ref()
            .is_some_and(|names| !names.contains(&bare))
            || self
                .exclude
                .as_ref()
                .is_some_and(|names| names.contains(&bare))
        {
            return None;
        }
        let mut spec = tool.spec().clone();
        spec.name = format!("{}__{bare}", self.prefix);
        if self.deny.contains(&spec.name) {
            return None;
        }
        if let Some(overrides) = self.overrides.get(&bare) {
            apply_overrides(&mut spec, overrides);
        }
        if let Some(approval) = self.approvals.get(&spec.name) {
            spec.declarations.approval = *approval;
        }
        Some(Arc::new(Declared { inner: tool, spec }))
    }
}

/// Applies configured overrides to a tool's spec.
pub(crate) fn apply_overrides(spec: &mut ToolSpec, overrides: &ToolOverrides) {
    if let Some(description) = &overrides.description {
        spec.description = description.clone();
    }
    let declarations = &mut spec.declarations;
    if let Some(side_effects) = overrides.side_effects {
        declarations.side_effects = side_effects;
    }
    if let Some(approval) = overrides.approval {
        declarations.approval = approval;
    }
    if let Some(idempotent) = overrides.idempotent {
        declarations.idempotent = idempotent;
    }
    if let Some(timeout) = overrides
        .timeout
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
    {
        declarations.timeout = Some(timeout);
    }
    if let Some(offload_over) = overrides.offload_over {
        declarations.offload_over = Some(offload_over);
    }
}

impl ToolSource for AgentSource {
    fn name(&self) -> &str {
        &self.prefix
    }

    fn open<'a>(
        &'a self,
        ctx: &'a SourceContext,
    ) -> BoxFuture<'a, Result<Vec<Arc<dyn Tool>>, SourceError>> {
        Box::pin(async move {
            let tools = self.inner.open(ctx).await?;
            Ok(tools
                .into_iter()
                .filter_map(|tool| self.adapt(tool))
                .collect())
        })
    }

    fn release<'a>(&'a self, ctx: &'a SourceContext) -> BoxFuture<'a, ()> {
        self.inner.release(ctx)
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        self.inner.shutdown()
    }
}

/// A tool under another name or with other declarations; calls go to the original.
#[derive(Debug)]
pub(crate) struct Declared {
    inner: Arc<dyn Tool>,
    spec: ToolSpec,
}

impl Declared {
    /// `inner` offered under `spec` (its name and declarations).
    pub(crate) fn new(inner: Arc<dyn Tool>, spec: ToolSpec) -> Declared {
        Declared { inner, spec }
    }
}

impl Tool for Declared {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(
        &self,
        ctx: ToolContext,
        arguments: Value,
    ) -> BoxFuture<'_, Result<ToolOutput, ToolError>> {
        self.inner.call(ctx, arguments)
    }
}

#[cfg(test)]
mod tests {
    use loom_core::tool::{FnTool, SideEffects, ToolDeclarations, ToolKind};
    use loom_testkit::FakeSource;
    use serde_json::json;

    use super::*;

    fn mcp_tool(name: &str) -> FnTool {
        FnTool::new(
            ToolSpec {
                name: name.into(),
                description: "d".into(),
                input_schema: json!({"type": "object"}),
                kind: ToolKind::Mcp,
                declarations: ToolDeclarations {
                    side_effects: SideEffects::Irreversible,
                    ..Default::default()
                },
            },
            |_, _| Box::pin(async { Ok(ToolOutput::text("ok")) }),
        )
    }

    #[tokio::test]
    async fn filters_renames_and_overrides() {
        let inner = Arc::new(FakeSource::with_tools(
            "notes",
            vec![
                mcp_tool("notes__search"),
                mcp_tool("notes__delete"),
                mcp_tool("notes__add"),
            ],
        ));
        let mut overrides = BTreeMap::new();
        overrides.insert(
            "search".to_owned(),
            ToolOverrides {
                side_effects: Some(SideEffects::None),
                ..ToolOverrides::default()
            },
        );
        let source = AgentSource::new(
            inner,
            "notes",
            Some("kb"),
            None,
            Some(vec!["delete".into()]),
            overrides,
        );
        let ctx = SourceContext {
            tenant_id: "default".into(),
            session_id: "s".into(),
            run_id: "r".into(),
        };
        let tools = source.open(&ctx).await.unwrap();
        let names: Vec<&str> = tools.iter().map(|t| t.spec().name.as_str()).collect();
        assert_eq!(names, ["kb__search", "kb__add"]);
        assert_eq!(tools[0].spec().declarations.side_effects, SideEffects::None);
        assert_eq!(
            tools[1].spec().declarations.side_effects,
            SideEffects::Irreversible
        );
        assert_eq!(source.name(), "kb");
    }
}
