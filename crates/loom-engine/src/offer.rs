//! What a run offers its model as tools ([`Offer`]): the agent's tools, its sub-agents (below
//! `max_depth`), the tools of its sources (MCP servers, opened when the pilot starts and
//! released when it ends), its roles (a role that reads images only when the run has one, a
//! role that reads tool results only once one of them exists in the run, or in the session for
//! `scope: session`), and `artifact_read` once a result was offloaded.

use std::{borrow::Cow, collections::BTreeSet, sync::Arc};

use loom_core::{
    Event, RunState,
    event::{CircuitOpened, OfferedTool, Payload, ToolSourceOpened, ToolSourceUnavailable},
    ports::{ArtifactStore, SourceContext, ToolSource},
};

use crate::{
    agent::AgentRuntime,
    binding::{BoundSource, BoundTool},
    context,
    error::EngineError,
    events::RunRef,
    io::Io,
    offload,
    roles::{self, RoleRuntime},
    subagents,
};

/// The tools of one pilot (see the module documentation).
pub(crate) struct Offer {
    /// The agent's tools, its sub-agents', then those of the sources that opened.
    tools: Vec<BoundTool>,
    /// The tool faces of the agent's roles.
    role_faces: Vec<BoundTool>,
    /// The tools with a successful result in the session's earlier runs, gathered only when a
    /// role reads them (`tool_results` with `scope: session`).
    earlier_results: BTreeSet<String>,
    /// Sources opened by this pilot, released when it ends.
    opened: Vec<Arc<dyn ToolSource>>,
}

impl Offer {
    /// What `agent` offers the run `run_id` at `depth`, before its sources open; `journal` is
    /// its session's, read when the pilot started.
    pub(crate) fn new(
        agent: &AgentRuntime,
        depth: u32,
        journal: &[Arc<Event>],
        run_id: &str,
    ) -> Result<Offer, EngineError> {
        let mut tools = agent.tools.clone();
        tools.extend(subagents::offered(agent, depth));
        let earlier_results = if roles::read_earlier_results(&agent.roles) {
            context::session_of(journal, run_id)?
                .earlier
                .iter()
                .flat_map(|run| context::succeeded(run.messages.iter()))
                .collect()
        } else {
            BTreeSet::new()
        };
        Ok(Offer {
            tools,
            role_faces: roles::bind_all(&agent.roles)?,
            earlier_results,
            opened: Vec::new(),
        })
    }

    /// The tools offered now: the pilot's, then the roles (a role that reads images only when
    /// the run has one, a role that reads tool results only once one exists), plus
    /// `artifact_read` once a result was offloaded.
    pub(crate) fn now(
        &self,
        roles: &[RoleRuntime],
        artifacts: Option<&Arc<dyn ArtifactStore>>,
        state: &RunState,
    ) -> Cow<'_, [BoundTool]> {
        let reader = match (artifacts, state.offloaded.is_empty()) {
            (Some(store), false) => offload::artifact_read(store.clone(), state.offloaded.clone()),
            _ => None,
        };
        let roles = roles::offered(&self.role_faces, roles, state, &self.earlier_results);
        let mut roles = roles.peekable();
        if reader.is_none() && roles.peek().is_none() {
            return Cow::Borrowed(&self.tools);
        }
        let mut tools = self.tools.clone();
        tools.extend(roles.cloned());
        tools.extend(reader);
        Cow::Owned(tools)
    }

    /// Opens every source. A source that opens has the tools it offers journaled
    /// (`tool.source_opened`: what a replay offers again without asking the server); a source
    /// that fails has its tools withdrawn from the run (`tool.source_unavailable`, after
    /// `circuit.opened` when its breaker opened); a required one fails the run.
    pub(crate) async fn open(
        &mut self,
        io: &mut Io<'_>,
        sources: &[BoundSource],
        state: &mut RunState,
    ) -> Result<(), EngineError> {
        let context = source_context(io.events().run());
        let mut batch = Vec::new();
        let mut failed_required: Option<String> = None;
        let span = state.run_span_id.clone();
        for bound in sources {
            match bound.source.open(&context).await {
                Ok(tools) => {
                    self.opened.push(bound.source.clone());
                    let mut offered = Vec::with_capacity(tools.len());
                    for tool in tools {
                        if self.tools.iter().any(|t| t.name() == tool.spec().name) {
                            tracing::warn!(tool = %tool.spec().name, source = %bound.source.name(), "tool name already offered; ignored");
                            continue;
                        }
                        let declarations = tool.spec().declarations.clone();
                        let description = tool.spec().description.clone();
                        let contract = bound.contracts.get(&tool.spec().name).cloned();
                        match BoundTool::new(tool, declarations, description) {
                            Ok(bound_tool) => {
                                let bound_tool = match contract {
                                    Some(contract) => bound_tool.with_contract(contract),
                                    None => bound_tool,
                                };
                                offered.push(offered_tool(&bound_tool));
                                self.tools.push(bound_tool);
                            }
                            Err(error) => {
                                tracing::warn!(source = %bound.source.name(), %error, "tool ignored")
                            }
                        }
                    }
                    batch.push(io.event(
                        &span,
                        None,
                        None,
                        Payload::ToolSourceOpened(ToolSourceOpened {
                            source: bound.source.name().to_owned(),
                            tools: offered,
                        }),
                    ));
                }
                Err(error) => {
                    if let Some(circuit) = &error.circuit {
                        batch.push(io.event(
                            &span,
                            None,
                            None,
                            Payload::CircuitOpened(CircuitOpened {
                                target_kind: "mcp".into(),
                                target: circuit.target.clone(),
                                failures: circuit.failures,
                                cooldown_s: circuit.cooldown_s,
                                error: Some(circuit.error.clone()),
                                call_id: None,
                                judge: None,
                            }),
                        ));
                    }
                    batch.push(io.event(
                        &span,
                        None,
                        None,
                        Payload::ToolSourceUnavailable(ToolSourceUnavailable {
                            source: bound.source.name().to_owned(),
                            error: error.message.clone(),
                            required: bound.required,
                        }),
                    ));
                    if bound.required && failed_required.is_none() {
                        failed_required = Some(format!(
                            "required tool source '{}' is unavailable: {}",
                            bound.source.name(),
                            error.message
                        ));
                    }
                }
            }
        }
        if let Some(message) = failed_required {
            batch.extend(io.events().failure(
                state,
                "tool.source_unavailable",
                "tool.source_unavailable",
                &message,
            ));
        }
        if !batch.is_empty() {
            io.write(state, batch).await?;
        }
        Ok(())
    }

    /// Releases the sources this pilot opened (run-scoped ones close), whatever happened.
    pub(crate) async fn release(&self, run: &RunRef) {
        let context = source_context(run);
        for source in &self.opened {
            source.release(&context).await;
        }
    }
}

/// What the run was offered of a source's tool, as `tool.source_opened` records it.
fn offered_tool(bound: &BoundTool) -> OfferedTool {
    let spec = bound.tool.spec();
    let declarations = &bound.declarations;
    OfferedTool {
        name: spec.name.clone(),
        description: bound.description.clone(),
        input_schema: spec.input_schema.clone(),
        kind: spec.kind,
        side_effects: declarations.side_effects,
        approval: declarations.approval,
        idempotent: declarations.idempotent,
        on_unknown: declarations.on_unknown,
        timeout_s: declarations.timeout.map(|t| t.as_secs_f64()),
        offload_over: declarations.offload_over,
    }
}

fn source_context(run: &RunRef) -> SourceContext {
    SourceContext {
        tenant_id: run.tenant_id.clone(),
        session_id: run.session_id.clone(),
        run_id: run.run_id.clone(),
    }
}
