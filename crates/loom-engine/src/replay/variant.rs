//! Variant replay: a closed run's conversation re-driven with other models for named steps and
//! doubles for named tools, in a scratch journal, so that a new model can be tried on real
//! conversations without any side effect.
//!
//! [`varying`] turns an agent into its variant double:
//!
//! - **Models.** A step named in [`VariantPlan::models`] (`main`, a role's name, or
//!   `judge:<name>` for a judge of the agent or of one of its roles) runs on the model given,
//!   alone (no fallbacks), and every one of its calls is made for real to that model. The model
//!   clients of the other steps answer a request the journal recorded (same request hash) with
//!   the recorded answer, once, and make any other request for real to the configured model
//!   (the conversation changed before them). Sub-agents keep their configured models, served
//!   the same way.
//! - **Tools.** A plain tool call (not a role nor a sub-agent, which the engine re-drives) is
//!   answered, in this order: by the result the journal recorded for a call of the same tool
//!   with the same arguments (once); by the tool's double ([`VariantPlan::doubles`], at every
//!   depth); by the tool itself only when it declares `side_effects: none`. Any other call is
//!   refused: the run reads an error result, the call is reported as a [`Miss`], and the tool's
//!   code never runs.
//!
//! - **Tool sources** (MCP servers) are opened live: the variant is offered the tools the
//!   server lists today, each answered as above (the server runs only a call of a tool it
//!   declares read-only, that the journal and the doubles do not answer). A double may name a
//!   source's tool the journal recorded (`tool.source_opened`).
//! - **Approvals.** A request the journal recorded a decision or an expiry for gets it again; any
//!   other ends the replay paused, unless [`VariantPlan::approvals`] names who decides it at
//!   once (an evaluation): granted when nothing runs for real, refused otherwise.
//!
//! **Invariant:** a variant replay never runs the code of a tool whose declared side effects
//! are not `none`; it writes only into the scratch journal it is handed.

use std::{collections::BTreeMap, sync::Arc};

use loom_core::{
    BoxFuture, BoxStream, Event,
    approval::Decision,
    event::ApprovalRequested,
    model::{ModelChunk, ModelClient, ModelError, ModelRequest},
    tool::{SideEffects, Tool, ToolContext, ToolError, ToolOutput, ToolSpec},
};

use super::{Miss, Recording, ReplayError, chunks, prepare};
use crate::{AgentRuntime, JudgeRuntime, ModelBinding, SubAgentRuntime, request::request_hash};

/// What a variant changes: the models of named steps and the doubles of named tools.
#[derive(Default, Clone)]
pub struct VariantPlan {
    /// The model of each named step: `main`, a role's name, or `judge:<name>`.
    pub models: BTreeMap<String, ModelBinding>,
    /// The double answering each named tool's calls the journal has no result for.
    pub doubles: BTreeMap<String, Arc<dyn Tool>>,
    /// Who decides, at once, an approval request the journal holds no decision nor expiry for
    /// (an evaluation's `loom eval`): granted when the call will not run for real (the journal
    /// has its result, a double answers it, or the tool declares side effects and is refused),
    /// refused when the tool would really run (it declares no side effect, or it is a role or a
    /// sub-agent). None: such a request ends the replay paused.
    pub approvals: Option<String>,
}

impl std::fmt::Debug for VariantPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VariantPlan")
            .field("models", &self.models.keys().collect::<Vec<_>>())
            .field("doubles", &self.doubles.keys().collect::<Vec<_>>())
            .field("approvals", &self.approvals)
            .finish()
    }
}

/// How a variant's calls were answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct VariantCounts {
    /// Model calls answered from the journal (the same request was recorded).
    pub models_served: usize,
    /// Model calls made for real.
    pub models_called: usize,
    /// Tool calls answered from the journal (same tool, same arguments).
    pub tools_served: usize,
    /// Tool calls answered by a double.
    pub tools_doubled: usize,
    /// Tool calls run for real (tools declaring `side_effects: none` only).
    pub tools_run: usize,
    /// Tool calls refused: no recorded result, no double, and side effects declared.
    pub tools_refused: usize,
}

/// What a variant replay gave.
#[derive(Debug)]
pub struct VariantReplayed {
    /// How the recorded run ended (`completed`, `failed`, …).
    pub recorded_status: String,
    /// How the variant ended.
    pub variant_status: String,
    /// How its calls were answered.
    pub counts: VariantCounts,
    /// Calls that were refused (never made).
    pub misses: Vec<Miss>,
    /// The recorded events of the run and its sub-runs.
    pub recorded: Vec<Event>,
    /// The variant's events of the run and its sub-runs.
    pub replayed: Vec<Event>,
}

/// The steps of `agent` a variant may name: `main`, its roles, `judge:<name>` of its judges and
/// its roles' judges.
pub fn steps(agent: &AgentRuntime) -> Vec<String> {
    let mut steps = vec!["main".to_owned()];
    steps.extend(agent.roles.iter().map(|r| r.name.clone()));
    let judges = agent
        .judges
        .iter()
        .chain(agent.roles.iter().flat_map(|r| r.judges.iter()));
    for judge in judges {
        let step = format!("judge:{}", judge.name);
        if !steps.contains(&step) {
            steps.push(step);
        }
    }
    steps
}

/// The plain tools `agent` and its sub-agents offer, by name.
fn tool_names(agent: &AgentRuntime, names: &mut Vec<String>) {
    for bound in &agent.tools {
        let name = &bound.tool.spec().name;
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    for sub in &agent.subagents {
        tool_names(&sub.agent, names);
    }
}

/// How [`VariantPlan::approvals`] decides a request, as `by`: granted when the call will not
/// run for real, refused when the tool would really run.
fn deciding(
    by: &str,
    agent: &AgentRuntime,
    plan: &VariantPlan,
    book: &Arc<Recording>,
) -> Box<dyn Fn(&ApprovalRequested) -> Decision + Send + Sync> {
    let mut effects = BTreeMap::new();
    side_effects(agent, &mut effects);
    let doubled: Vec<String> = plan.doubles.keys().cloned().collect();
    let (by, book) = (by.to_owned(), book.clone());
    Box::new(move |requested: &ApprovalRequested| {
        let name = &requested.tool_name;
        let real = match effects.get(name) {
            // A role or a sub-agent: re-driven for real.
            None => true,
            Some(SideEffects::None) => {
                !doubled.contains(name) && !book.has_result(name, &requested.arguments)
            }
            Some(_) => false,
        };
        if real {
            Decision::Rejected {
                by: by.clone(),
                reason: Some(format!(
                    "evaluation: '{name}' would really run (neither the journal nor a double \
                     answers it), so its approval is refused"
                )),
            }
        } else {
            Decision::Approved {
                by: by.clone(),
                reason: Some(
                    "evaluation: the call is answered from the journal or by a double, nothing \
                     runs for real"
                        .into(),
                ),
                arguments: None,
            }
        }
    })
}

/// The side effects of the plain tools of `agent` and its sub-agents, by name.
fn side_effects(agent: &AgentRuntime, effects: &mut BTreeMap<String, SideEffects>) {
    for bound in &agent.tools {
        effects
            .entry(bound.tool.spec().name.clone())
            .or_insert(bound.declarations.side_effects);
    }
    for sub in &agent.subagents {
        side_effects(&sub.agent, effects);
    }
}

/// The variant double of `agent` under `plan`, its calls answered as the module says.
pub fn varying(
    agent: &AgentRuntime,
    plan: &VariantPlan,
    book: &Arc<Recording>,
) -> Result<AgentRuntime, ReplayError> {
    let known = steps(agent);
    if let Some(step) = plan.models.keys().find(|s| !known.contains(s)) {
        return Err(ReplayError::UnknownStep {
            agent: agent.name.clone(),
            step: step.clone(),
            known: known.join(", "),
        });
    }
    let mut tools = Vec::new();
    tool_names(agent, &mut tools);
    for name in book.book().openings.tool_names() {
        if !tools.iter().any(|t| t == name) {
            tools.push(name.to_owned());
        }
    }
    if let Some(tool) = plan.doubles.keys().find(|t| !tools.contains(t)) {
        return Err(ReplayError::UnknownDouble {
            agent: agent.name.clone(),
            tool: tool.clone(),
            known: if tools.is_empty() {
                "none".to_owned()
            } else {
                tools.join(", ")
            },
        });
    }
    varied(agent, plan, book, true)
}

fn varied(
    agent: &AgentRuntime,
    plan: &VariantPlan,
    book: &Arc<Recording>,
    root: bool,
) -> Result<AgentRuntime, ReplayError> {
    let named = |step: &str| if root { plan.models.get(step) } else { None };
    let mut double = agent.clone();
    for bound in &mut double.sources {
        let (doubles, book) = (plan.doubles.clone(), book.clone());
        bound.source = Arc::new(super::sources::MappedSource {
            inner: bound.source.clone(),
            map: Box::new(move |tool: Arc<dyn Tool>| {
                let spec = tool.spec().clone();
                Arc::new(VariantTool {
                    double: doubles.get(&spec.name).cloned(),
                    side_effects: spec.declarations.side_effects,
                    spec,
                    real: tool,
                    book: book.clone(),
                })
            }),
        });
    }
    (double.main, double.fallbacks) = slot(named("main"), &agent.main, &agent.fallbacks, book);
    for bound in &mut double.tools {
        let spec = bound.tool.spec().clone();
        bound.tool = Arc::new(VariantTool {
            double: plan.doubles.get(&spec.name).cloned(),
            spec,
            side_effects: bound.declarations.side_effects,
            real: bound.tool.clone(),
            book: book.clone(),
        });
    }
    let judge = |j: &JudgeRuntime| {
        let (main, fallbacks) = slot(
            named(&format!("judge:{}", j.name)),
            &j.main,
            &j.fallbacks,
            book,
        );
        JudgeRuntime {
            main,
            fallbacks,
            ..j.clone()
        }
    };
    double.judges = agent.judges.iter().map(judge).collect();
    for role in &mut double.roles {
        (role.main, role.fallbacks) = slot(named(&role.name), &role.main, &role.fallbacks, book);
        role.judges = role.judges.iter().map(judge).collect();
    }
    double.subagents = agent
        .subagents
        .iter()
        .map(|sub| {
            Ok(SubAgentRuntime {
                agent: Arc::new(varied(&sub.agent, plan, book, false)?),
                ..sub.clone()
            })
        })
        .collect::<Result<_, ReplayError>>()?;
    Ok(double)
}

/// A step's model chain in the variant: the named model alone, or the configured chain, each
/// model served from the journal when the journal recorded the request.
fn slot(
    named: Option<&ModelBinding>,
    main: &ModelBinding,
    fallbacks: &[ModelBinding],
    book: &Arc<Recording>,
) -> (ModelBinding, Vec<ModelBinding>) {
    match named {
        Some(model) => (counted(model, book, false), Vec::new()),
        None => (
            counted(main, book, true),
            fallbacks.iter().map(|b| counted(b, book, true)).collect(),
        ),
    }
}

fn counted(model: &ModelBinding, book: &Arc<Recording>, serve: bool) -> ModelBinding {
    ModelBinding {
        client: Arc::new(VariantModel {
            live: model.client.clone(),
            book: book.clone(),
            serve,
        }),
        ..model.clone()
    }
}

/// A model client making its calls for real, counted; with `serve`, a request the journal
/// recorded is answered from the journal instead.
#[derive(Debug)]
struct VariantModel {
    live: Arc<dyn ModelClient>,
    book: Arc<Recording>,
    serve: bool,
}

impl ModelClient for VariantModel {
    fn provider(&self) -> &str {
        self.live.provider()
    }

    fn stream(&self, request: &ModelRequest) -> BoxStream<'static, Result<ModelChunk, ModelError>> {
        let known = if self.serve {
            self.book.known_answer(&request_hash(request).0)
        } else {
            None
        };
        match known {
            Some(answer) => Box::pin(futures_util::stream::iter(chunks(&answer))),
            None => {
                self.book.book().variant.models_called += 1;
                self.live.stream(request)
            }
        }
    }
}

/// A tool answered from the journal, by its double, or (declaring no side effect) by itself.
struct VariantTool {
    spec: ToolSpec,
    side_effects: SideEffects,
    double: Option<Arc<dyn Tool>>,
    real: Arc<dyn Tool>,
    book: Arc<Recording>,
}

impl std::fmt::Debug for VariantTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VariantTool")
            .field("name", &self.spec.name)
            .field("side_effects", &self.side_effects)
            .field("double", &self.double.is_some())
            .finish_non_exhaustive()
    }
}

impl Tool for VariantTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(
        &self,
        ctx: ToolContext,
        arguments: serde_json::Value,
    ) -> BoxFuture<'_, Result<ToolOutput, ToolError>> {
        if let Some(output) = self.book.result_for(&self.spec.name, &arguments) {
            return Box::pin(std::future::ready(Ok(output)));
        }
        if let Some(double) = &self.double {
            self.book.book().variant.tools_doubled += 1;
            return double.call(ctx, arguments);
        }
        if self.side_effects == SideEffects::None {
            self.book.book().variant.tools_run += 1;
            return self.real.call(ctx, arguments);
        }
        self.book.book().variant.tools_refused += 1;
        let effects = match self.side_effects {
            SideEffects::Reversible => "reversible",
            _ => "irreversible",
        };
        let reason = format!(
            "call {} of {} not executed: the tool declares {effects} side effects, the journal \
             has no result for these arguments and the variant gives it no double",
            ctx.call_id, self.spec.name
        );
        self.book.miss("tool", reason.clone());
        Box::pin(std::future::ready(Err(ToolError::new(format!(
            "variant replay: {reason}"
        )))))
    }
}

/// Re-drives `run_id` of `session` (see [`super::replay_run`] for what is read, re-applied and
/// refused; `originals` holds its attached files) with `agent` as configured today, varied by
/// `plan` ([`varying`]), on `engine`, whose journal must not hold the session yet.
pub async fn replay_variant(
    engine: &crate::Engine,
    agent: &AgentRuntime,
    plan: &VariantPlan,
    session: &[Event],
    run_id: &str,
    originals: Option<&dyn loom_core::ports::ArtifactStore>,
) -> Result<VariantReplayed, ReplayError> {
    let prepared = prepare(engine, session, run_id, originals).await?;
    let book = Arc::new(Recording::from_events(&prepared.recorded));
    let double = varying(agent, plan, &book)?;
    let decide = plan
        .approvals
        .as_ref()
        .map(|by| deciding(by, agent, plan, &book));
    let (variant_status, replayed) = prepared
        .drive(engine, &double, &book, decide.as_deref())
        .await?;
    Ok(VariantReplayed {
        recorded_status: prepared.recorded_status,
        variant_status,
        counts: book.variant_counts(),
        misses: book.misses(),
        recorded: prepared.recorded,
        replayed,
    })
}
