//! Roles: models the orchestrator calls like tools, and `$ref` between tool results.
//!
//! A [`RoleRuntime`] is offered to the orchestrator as a tool (its name, description and
//! argument schema; `tool_kind: role`). A call goes through the batch like any other (unknown
//! name, `$ref`, schema, `before_tool` policies, approvals), then makes **one model call with
//! no history and no tools**: the role's system prompt and one user message built from its
//! `input_template` (minijinja over `args` and `context`) or, without a template, from tagged
//! context blocks (`<user_input>…</user_input>`, …) followed by `<arguments>{json}</arguments>`.
//! The role receives only what its [`RoleContext`] declares:
//!
//! | item | what the role receives |
//! |---|---|
//! | `user_input` | the text of the run's first user message |
//! | `caller_context` | what the application said about the run when opening it (`run.started.context`: tenant, user and metadata), as JSON |
//! | `attachments` | the images of the run's user messages (artifact blocks of type `image/*`), added to the role's message; a role that declares them is offered only when the run carries an image, and its models must read images (checked when the configuration is loaded) |
//! | `tool_results` | the successful results (text) of the named tools, in this run (`scope: run`) or in the whole session (`scope: session`), one `tool: text` line each; a role that declares them is offered only once one of the named tools has a successful result there |
//! | `last_turns: N` | the last N turns of the session before this run (one turn = one run: `user: <request>`, `assistant: <final answer>`) |
//!
//! These items mean the same for a role as for a judge (`judges.rs`), and are read the same way.
//!
//! **Journal.** The call's `tool.called` (kind `role`), then the role's `model.responded`
//! (envelope `role` = the role's name, `call_id` = the call) in a new span under the call's
//! span, then `tool.completed` with the role's text. Retries, fallbacks and breakers of the
//! role's model chain are journaled like the orchestrator's, with the call id. An empty answer
//! or a model that fails for good becomes an error result the orchestrator reads.
//!
//! **Cost.** `tool.completed.cost_usd` restates the cost of the role's model calls; the run
//! counts it once, from the `model.responded` events (see `RunState::priced_calls`).
//!
//! **Order.** Within a batch, plain tools are launched first and keep running concurrently;
//! roles then run one after another (each one's events are written as it ends), and the plain
//! tools' results are journaled after them. A role call started but not completed before a crash
//! is simply run again on resume: it has no side effect.
//!
//! **Output contract and judge.** A role's `output` contract, then its `judge`, check its answer
//! (`role_guards.rs`): a refusal is repaired by the role's own model (the first exchange plus a
//! repair request with the diagnostic) up to `repair.max_attempts` (`guard.checked` with target
//! `role:<name>` and `policy.decided` retry, both with the call id; a judge's `judge.evaluated`
//! and its model call, in a span under the call's, first), then `on_failure` applies: `fail`
//! gives an error result, `unverified` keeps the answer flagged `unverified`, `fallback`
//! replaces it with the fallback message.
//!
//! **Policies.** The agent's `after_tool` policies then read the answer (in the same place: the
//! call's span, with the call id). A `retry` is repaired by the role's model like a guard's
//! refusal (a plain tool's result would become the error "Result refused (`<policy>`): …"),
//! counted per policy and call; a `retry` beyond the policy's `max_attempts` fails the run
//! ("N repair(s) asked without success; last diagnostic: …"), as a `fail` does, once the call's
//! result is journaled.
//!
//! **Terminal roles.** A terminal role called alone in its turn, whose result is not an
//! error, ends the run: its result is the final output (`run.completed.output` null,
//! `output_event_id` on its `tool.completed`), after the agent's output guards. Called with
//! other tools in the same turn, it is an ordinary call: `policy.decided` (`loom.terminal`,
//! `after_tool`, `continue`) says so and the loop goes on.
//!
//! **`$ref`.** When a role (or a sub-agent) is offered, each successful tool result shown to
//! the orchestrator is prefixed `[result:N]` (N: the 1-based index of the call in the run, in
//! request order) and the system prompt gets [`REFS_HINT`]. An argument equal to
//! `{"$ref": "result:N"}` (or that JSON as a string) is replaced, when the call runs, by the
//! referenced result's structured data, else its full text (read back from the artifact store
//! when the result was offloaded). `tool.called.arguments` keep the model's `$ref`;
//! `tool.called.refs` lists what was resolved. Only results obtained before the current turn
//! can be referenced; any other reference refuses the call before it starts.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use loom_core::{
    Block, BlockKind, Message, Role, RunState,
    event::Payload,
    model::{ModelRequest, ToolChoice},
    policy::{DecisionKind, Point},
    ports::{ArtifactStore, EventStore},
    state::{PendingCall, SessionState},
    tool::{Tool, ToolContext, ToolDeclarations, ToolError, ToolKind, ToolOutput, ToolSpec},
};
use serde_json::{Value, json};

pub use crate::context::RoleContext;
use crate::{
    binding::{BoundPolicy, BoundTool, ModelBinding},
    chain::{self, AttemptState, Caller, ChainEnd, Models},
    context::{ContextScope, gather, images, succeeded},
    contract::Contract,
    error::EngineError,
    events::RunRef,
    hooks,
    io::{Io, LastIds, StepSpan},
    judges::JudgeRuntime,
    judging::Judging,
    output::Final,
    role_guards::{Guarded, Guards, RoleCall},
    units::fmt_secs,
};

/// What a role call needs besides the run's [`Io`]: the agent's roles, the model calls, and the
/// journal (for the context items that read earlier runs).
pub(crate) struct Roles<'a> {
    /// The agent's roles.
    pub(crate) roles: &'a [RoleRuntime],
    /// What their model calls need.
    pub(crate) models: Models<'a>,
    /// The journal.
    pub(crate) store: &'a dyn EventStore,
    /// The agent's policies: those hooked on `after_tool` read a role's answer after its
    /// guards, and their `retry` is repaired by the role's model.
    pub(crate) policies: &'a [BoundPolicy],
}

/// What the orchestrator is told when results can be referenced (appended to its system
/// prompt).
pub const REFS_HINT: &str = "Tool results are numbered [result:N]. To pass a whole earlier \
result as an argument, write {\"$ref\": \"result:N\"} as that argument's value instead of \
copying it: its complete content (structured data, or full text) is substituted when the call \
runs. Only results shown before your current answer can be referenced.";

/// Name of the built-in decision that a terminal role called with other tools did not end the
/// run.
pub const TERMINAL: &str = "loom.terminal";

/// A role as the engine runs it: a model called like a tool (reference `RoleSpec`).
#[derive(Debug, Clone)]
pub struct RoleRuntime {
    /// Tool name offered to the orchestrator (also the envelope `role` of its model calls).
    pub name: String,
    /// Description offered to the orchestrator.
    pub description: String,
    /// The role's rendered system prompt.
    pub system: String,
    /// The role's model.
    pub main: ModelBinding,
    /// The models tried after `main`, in order.
    pub fallbacks: Vec<ModelBinding>,
    /// JSON Schema of the arguments (`type: object`).
    pub input_schema: Value,
    /// The role's user message: a minijinja template over `args` (the arguments) and
    /// `context` (the declared items, by [`RoleContext::key`]; `context.tool_results.<tool>` is
    /// the text of that tool's results). `None`: tagged context blocks, then the arguments.
    pub input_template: Option<String>,
    /// What the role receives besides its arguments.
    pub context: Vec<RoleContext>,
    /// Whether the role's answer ends the run when it is called alone in its turn.
    pub terminal: bool,
    /// Time limit of one call (its model calls and repairs; its judge's calls are bounded by
    /// the judge's own `timeout` and the run's); `None`: no limit of its own.
    pub timeout: Option<Duration>,
    /// The contract its answers must meet.
    pub output: Option<Contract>,
    /// The judges of its answers (the reference's `roles[].judge`), after its contract.
    pub judges: Vec<JudgeRuntime>,
}

impl RoleRuntime {
    /// A role on `main` without fallbacks, arguments (`{type: object, properties: {}}`),
    /// template, context, contract, judge nor time limit; not terminal.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        system: impl Into<String>,
        main: ModelBinding,
    ) -> RoleRuntime {
        RoleRuntime {
            name: name.into(),
            description: description.into(),
            system: system.into(),
            main,
            fallbacks: Vec::new(),
            input_schema: json!({"type": "object", "properties": {}}),
            input_template: None,
            context: Vec::new(),
            terminal: false,
            timeout: None,
            output: None,
            judges: Vec::new(),
        }
    }

    /// The role's model chain: `main`, then `fallbacks`.
    pub fn chain(&self) -> impl Iterator<Item = &ModelBinding> {
        std::iter::once(&self.main).chain(self.fallbacks.iter())
    }

    /// Whether the role reads the run's images (it declares `attachments`): it is offered only
    /// when the run carries one.
    pub fn sees_attachments(&self) -> bool {
        self.context.contains(&RoleContext::Attachments)
    }

    /// The `tool_results` items of its context (tools and scope): the role is offered only once
    /// each has a successful result of one of its tools to give it.
    pub fn reads_results(&self) -> impl Iterator<Item = (&[String], ContextScope)> {
        self.context.iter().filter_map(|item| match item {
            RoleContext::ToolResults { tools, scope } => Some((tools.as_slice(), *scope)),
            _ => None,
        })
    }

    /// The tool face offered to the orchestrator, its argument schema compiled. Refused when
    /// the name is not a tool name, the schema is not a valid JSON Schema of an object, or the
    /// template does not parse.
    pub fn bind(&self) -> Result<BoundTool, EngineError> {
        let invalid = |why: String| EngineError::Invalid(format!("role '{}': {why}", self.name));
        if !loom_core::ids::is_valid_name(&self.name) {
            return Err(invalid("not a usable tool name".into()));
        }
        if self.input_schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(invalid("its input_schema must be of type object".into()));
        }
        if let Some(template) = &self.input_template {
            minijinja::Environment::new()
                .template_from_str(template)
                .map_err(|e| invalid(format!("its input_template does not parse: {e}")))?;
        }
        let spec = ToolSpec {
            name: self.name.clone(),
            description: self.description.clone(),
            input_schema: self.input_schema.clone(),
            kind: ToolKind::Role,
            declarations: ToolDeclarations::default(),
        };
        BoundTool::new(
            Arc::new(RoleTool { spec }),
            ToolDeclarations::default(),
            self.description.clone(),
        )
    }
}

/// The tool face of a role. The batch runs role calls itself ([`call`]), with the run's state
/// and journal, so this face is never called by the engine; called directly, it refuses.
#[derive(Debug)]
struct RoleTool {
    spec: ToolSpec,
}

impl Tool for RoleTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(
        &self,
        _ctx: ToolContext,
        _arguments: Value,
    ) -> loom_core::BoxFuture<'_, Result<ToolOutput, ToolError>> {
        let name = self.spec.name.clone();
        Box::pin(async move {
            Err(ToolError::new(format!(
                "{name} is a role: it is run by the engine's tool batch, not called directly"
            )))
        })
    }
}

/// The tool faces of an agent's roles, in declared order.
pub(crate) fn bind_all(roles: &[RoleRuntime]) -> Result<Vec<BoundTool>, EngineError> {
    roles.iter().map(RoleRuntime::bind).collect()
}

/// The role faces offered now: a role that reads images is hidden from a run without one, and
/// a role that reads tool results from a run (or session, per its `scope`) without one of them
/// yet. `earlier` names the tools with a successful result in the session's earlier runs.
pub(crate) fn offered<'t>(
    faces: &'t [BoundTool],
    roles: &[RoleRuntime],
    state: &RunState,
    earlier: &BTreeSet<String>,
) -> impl Iterator<Item = &'t BoundTool> {
    let images = !images(state).is_empty();
    let needs_results = roles.iter().any(|r| r.reads_results().next().is_some());
    let in_run = if needs_results {
        succeeded(state.messages.iter())
    } else {
        BTreeSet::new()
    };
    let ready: BTreeSet<&str> = roles
        .iter()
        .filter(|r| images || !r.sees_attachments())
        .filter(|r| {
            r.reads_results().all(|(tools, scope)| {
                tools.iter().any(|tool| {
                    in_run.contains(tool)
                        || (scope == ContextScope::Session && earlier.contains(tool))
                })
            })
        })
        .map(|r| r.name.as_str())
        .collect();
    faces.iter().filter(move |face| ready.contains(face.name()))
}

/// Whether a role of `roles` reads tool results of the session's earlier runs (a
/// `tool_results` item with `scope: session`): the pilot then gathers them when it starts.
pub(crate) fn read_earlier_results(roles: &[RoleRuntime]) -> bool {
    roles.iter().any(|r| {
        r.reads_results()
            .any(|(_, scope)| scope == ContextScope::Session)
    })
}

/// Whether results can be referenced: a role or a sub-agent is offered.
pub(crate) fn refs_enabled(offered: &[BoundTool]) -> bool {
    offered
        .iter()
        .any(|t| matches!(t.tool.spec().kind, ToolKind::Role | ToolKind::Agent))
}

/// The system prompt with [`REFS_HINT`].
pub(crate) fn with_refs_hint(system: &str) -> String {
    if system.trim().is_empty() {
        REFS_HINT.to_owned()
    } else {
        format!("{system}\n\n{REFS_HINT}")
    }
}

/// Prefixes each successful tool result of the run's conversation with `[result:N]`.
pub(crate) fn number_results(conversation: &mut [Message]) {
    let mut n = 0usize;
    for message in conversation.iter_mut().filter(|m| m.role == Role::Tool) {
        for block in &mut message.blocks {
            if let BlockKind::ToolResult { output, .. } = &mut block.kind {
                n += 1;
                if output.is_error {
                    continue;
                }
                if output.blocks.is_empty()
                    && let Some(data) = &output.data
                {
                    // The data alone was the content: keep it visible behind the prefix.
                    output.blocks.push(Block::json(data.clone()));
                }
                output
                    .blocks
                    .insert(0, Block::text(format!("[result:{n}]")));
            }
        }
    }
}

/// The results the current turn may reference, numbered from 1 as the orchestrator saw them:
/// every tool result of the run's conversation before its last answer.
fn addressable(state: &RunState) -> Vec<(String, ToolOutput)> {
    let conversation = state.conversation();
    let end = conversation
        .iter()
        .rposition(|m| m.role == Role::Assistant)
        .unwrap_or(0);
    conversation[..end]
        .iter()
        .filter(|m| m.role == Role::Tool)
        .flat_map(|m| m.blocks.iter())
        .filter_map(|b| match &b.kind {
            BlockKind::ToolResult { call_id, output } => Some((call_id.clone(), output.clone())),
            _ => None,
        })
        .collect()
}

/// The reference an argument value stands for: `{"$ref": "…"}`, or that JSON as a string.
fn reference(value: &Value) -> Option<String> {
    match value {
        Value::Object(map) if map.len() == 1 => map.get("$ref")?.as_str().map(str::to_owned),
        Value::String(text) if text.trim_start().starts_with('{') && text.contains("$ref") => {
            serde_json::from_str::<Value>(text)
                .ok()
                .and_then(|parsed| match parsed {
                    Value::Object(_) => reference(&parsed),
                    _ => None,
                })
        }
        _ => None,
    }
}

/// Every reference in `arguments`, with its JSON pointer.
fn references(value: &Value, path: &str, out: &mut Vec<(String, String)>) {
    if let Some(target) = reference(value) {
        out.push((path.to_owned(), target));
        return;
    }
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                let key = key.replace('~', "~0").replace('/', "~1");
                references(item, &format!("{path}/{key}"), out);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                references(item, &format!("{path}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// Replaces the `$ref`s of a call's arguments by the results they name. `Ok(None)`: no
/// reference; `Err`: the call is refused with that message (no `tool.called`).
pub(crate) async fn resolve_refs(
    artifacts: Option<&Arc<dyn ArtifactStore>>,
    state: &RunState,
    arguments: &Value,
) -> Result<Option<(Value, Vec<Value>)>, String> {
    let mut found = Vec::new();
    references(arguments, "", &mut found);
    if found.is_empty() {
        return Ok(None);
    }
    let results = addressable(state);
    let known = match results.len() {
        0 => "no result can be referenced yet".to_owned(),
        1 => "results that can be referenced: result:1".to_owned(),
        n => format!("results that can be referenced: result:1 to result:{n}"),
    };
    let mut resolved = arguments.clone();
    let mut refs = Vec::with_capacity(found.len());
    for (path, target) in found {
        let index = target
            .strip_prefix("result:")
            .and_then(|n| n.trim().parse::<usize>().ok())
            .filter(|n| (1..=results.len()).contains(n));
        let Some(index) = index else {
            return Err(format!(
                "Unknown reference: '{target}' ({known}; only results obtained before this turn)."
            ));
        };
        let (call_id, output) = &results[index - 1];
        if output.is_error {
            return Err(format!(
                "Reference '{target}' names an error result, which cannot be passed on."
            ));
        }
        let value = content(artifacts, output)
            .await
            .map_err(|why| format!("Reference '{target}' cannot be read: {why}."))?;
        match resolved.pointer_mut(&path) {
            Some(slot) => *slot = value,
            None => resolved = value,
        }
        refs.push(json!({"ref": target, "call_id": call_id, "path": path}));
    }
    Ok(Some((resolved, refs)))
}

/// What a reference stands for: the result's data, else its full text; an offloaded result is
/// read back whole from the artifact store.
async fn content(
    artifacts: Option<&Arc<dyn ArtifactStore>>,
    output: &ToolOutput,
) -> Result<Value, String> {
    let Some(uri) = &output.offloaded else {
        return Ok(match &output.data {
            Some(data) => data.clone(),
            None => Value::String(output.visible_text()),
        });
    };
    let store = artifacts.ok_or("the engine has no artifact store")?;
    let bytes = store
        .get(uri)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{uri} is missing from the artifact store"))?;
    if uri.ends_with(".json")
        && let Ok(data) = serde_json::from_slice::<Value>(&bytes)
    {
        return Ok(data);
    }
    Ok(Value::String(String::from_utf8_lossy(&bytes).into_owned()))
}

/// A JSON value as a template value.
fn template_value(value: &Value) -> minijinja::Value {
    match value {
        Value::Null => minijinja::Value::from(()),
        Value::Bool(b) => minijinja::Value::from(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => minijinja::Value::from(i),
            (_, Some(u), _) => minijinja::Value::from(u),
            (_, _, f) => minijinja::Value::from(f.unwrap_or_default()),
        },
        Value::String(s) => minijinja::Value::from(s.as_str()),
        Value::Array(items) => items.iter().map(template_value).collect(),
        Value::Object(map) => minijinja::Value::from(
            map.iter()
                .map(|(k, v)| (minijinja::Value::from(k.as_str()), template_value(v)))
                .collect::<BTreeMap<_, _>>(),
        ),
    }
}

/// The role's user message: its template rendered, or the tagged blocks then the arguments;
/// the run's images after the text when the role reads them. `Ok(Err)`: the message cannot be
/// made (the orchestrator is told).
async fn input(
    store: &dyn EventStore,
    run: &RunRef,
    (state, session_state): (&RunState, &SessionState),
    role: &RoleRuntime,
    arguments: &Value,
) -> Result<Result<Message, String>, EngineError> {
    let gathered = gather(store, run, state, &role.context, Some(session_state)).await?;
    let text = match &role.input_template {
        Some(template) => {
            let context: serde_json::Map<String, Value> = gathered.values.into_iter().collect();
            let mut values = BTreeMap::new();
            values.insert(minijinja::Value::from("args"), template_value(arguments));
            values.insert(
                minijinja::Value::from("context"),
                template_value(&Value::Object(context)),
            );
            match minijinja::Environment::new().render_str(template, minijinja::Value::from(values))
            {
                Ok(text) => text,
                Err(e) => {
                    return Ok(Err(format!(
                        "its input template could not be rendered: {e}"
                    )));
                }
            }
        }
        None => {
            let mut parts = gathered.blocks;
            parts.push(format!("<arguments>\n{arguments}\n</arguments>"));
            parts.join("\n\n")
        }
    };
    let mut blocks = vec![Block::text(text)];
    blocks.extend(gathered.images);
    Ok(Ok(Message {
        role: Role::User,
        blocks,
    }))
}

/// How a role call ended.
pub(crate) enum RoleEnd {
    /// The role's result; its model calls and guard verdicts are journaled already.
    Done {
        /// The result for `tool.completed`.
        output: Box<ToolOutput>,
        /// Whether the agent's `after_tool` policies already decided on it (an answer that
        /// went through the role's guards); else (an error before any answer) the batch runs
        /// them as for a plain tool.
        checked: bool,
        /// Cost of the role's model calls.
        cost_usd: f64,
        /// Events written.
        emitted: u32,
    },
    /// The role's judge erred under `on_error: block`, or an `after_tool` policy failed the
    /// run: the call's result, then the run fails.
    Failed {
        /// The result for `tool.completed`.
        output: Box<ToolOutput>,
        /// The run's error type (`guard.judge`, `policy.<name>`).
        error_type: String,
        /// Cost of the role's model calls.
        cost_usd: f64,
        /// Events written.
        emitted: u32,
        /// Why the run fails.
        reason: String,
    },
    /// Cancelled, or the run's time ran out.
    Interrupted {
        /// Out of time (else cancelled).
        timed_out: bool,
        /// Events written.
        emitted: u32,
    },
}

/// Runs one role call: its model chain, then its output contract (repaired by the role's
/// model when allowed), within the run's `deadline` (the batch's) and the role's own limit.
/// Errors the orchestrator should read are results, not failures.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn call(
    io: &mut Io<'_>,
    roles: &Roles<'_>,
    state: &mut RunState,
    step: &StepSpan,
    call: &PendingCall,
    span: &str,
    arguments: &Value,
    run_deadline: Option<tokio::time::Instant>,
) -> Result<RoleEnd, EngineError> {
    let mut progress = AttemptState::default();
    let mut cost_usd = 0.0;
    let Some(role) = roles.roles.iter().find(|r| r.name == call.name) else {
        return Ok(RoleEnd::Done {
            checked: false,
            output: Box::new(ToolOutput::error(format!("Unknown role: '{}'.", call.name))),
            cost_usd,
            emitted: 0,
        });
    };
    let first = match input(
        roles.store,
        io.events().run(),
        (state, &io.session_state),
        role,
        arguments,
    )
    .await?
    {
        Ok(message) => message,
        Err(problem) => {
            return Ok(RoleEnd::Done {
                checked: false,
                output: Box::new(ToolOutput::error(format!(
                    "The role {} could not be called: {problem}",
                    role.name
                ))),
                cost_usd,
                emitted: 0,
            });
        }
    };
    let chain: Vec<&ModelBinding> = role.chain().collect();
    let own_deadline = role
        .timeout
        .map(|limit| tokio::time::Instant::now() + limit);
    let deadline = match (run_deadline, own_deadline) {
        (Some(run), Some(own)) => Some(run.min(own)),
        (run, own) => run.or(own),
    };
    let mut messages = vec![first];
    let model_span = io.events().uuid();
    let caller = Caller {
        slot: &role.name,
        call_id: Some(&call.call_id),
        judge: None,
        span: &model_span,
        parent: Some(span),
    };
    loop {
        // A run that fell back stays on the model it switched to, per slot.
        let start = state
            .models
            .get(&role.name)
            .and_then(|id| chain.iter().position(|m| m.config_id == *id))
            .unwrap_or(0);
        let sent: Vec<Arc<Message>> = messages.iter().cloned().map(Arc::new).collect();
        let build = |model: &ModelBinding| ModelRequest {
            model_id: model.model_id.clone(),
            system: role.system.clone(),
            messages: sent.clone(),
            tools: Vec::new(),
            tool_choice: ToolChoice::None,
            max_tokens: model.max_tokens,
            params: model.params.clone(),
            output_schema: None,
        };
        let end = chain::call(
            io,
            &roles.models,
            state,
            caller,
            &chain,
            start,
            &build,
            deadline,
            &mut progress,
        )
        .await?;
        let (model, answer) = match end {
            ChainEnd::Answered { model, answer } => (model, answer),
            ChainEnd::Interrupted { timed_out } => {
                let run_out = run_deadline.is_some_and(|d| tokio::time::Instant::now() >= d);
                if timed_out
                    && !run_out
                    && let Some(limit) = role.timeout
                {
                    // The role's own limit: the orchestrator reads it, the run goes on.
                    return Ok(RoleEnd::Done {
                        checked: false,
                        output: Box::new(ToolOutput::error(format!(
                            "Timed out: the role {} gave no answer in {} s.",
                            role.name,
                            fmt_secs(limit)
                        ))),
                        cost_usd,
                        emitted: progress.emitted,
                    });
                }
                return Ok(RoleEnd::Interrupted {
                    timed_out,
                    emitted: progress.emitted,
                });
            }
            ChainEnd::Failed(error) => {
                return Ok(RoleEnd::Done {
                    checked: false,
                    output: Box::new(ToolOutput::error(format!(
                        "The role {} failed: {}",
                        role.name, error.message
                    ))),
                    cost_usd,
                    emitted: progress.emitted,
                });
            }
        };
        let (responded, exchanged) = chain::responded(io, caller, model, answer);
        let text = match &responded.payload {
            Payload::ModelResponded(p) => {
                cost_usd += p.cost_usd;
                p.message.text()
            }
            _ => String::new(),
        };
        let mut batch = exchanged;
        batch.push(responded);
        chain::write_in_step(io, state, batch, &mut progress).await?;
        if text.trim().is_empty() {
            return Ok(RoleEnd::Done {
                checked: false,
                output: Box::new(ToolOutput::error(format!(
                    "The role {} gave an empty answer.",
                    role.name
                ))),
                cost_usd,
                emitted: progress.emitted,
            });
        }
        let this = RoleCall {
            name: &role.name,
            call,
            span,
            step,
            arguments,
            run_deadline,
        };
        let guards = Guards {
            contract: role.output.as_ref(),
            judging: Judging {
                judges: &role.judges,
                models: roles.models,
                store: roles.store,
            },
            policies: roles.policies,
        };
        match this
            .guard(io, &guards, state, &text, &mut progress, &mut cost_usd)
            .await?
        {
            Guarded::Output(output) => {
                return Ok(RoleEnd::Done {
                    checked: true,
                    output,
                    cost_usd,
                    emitted: progress.emitted,
                });
            }
            Guarded::Repair { policy, diagnostic } => {
                // The role's own model repairs: the first exchange, then the diagnostic.
                messages.push(Message::assistant(text));
                messages.push(Message::user(hooks::repair_text(&policy, &diagnostic)));
            }
            Guarded::Failed {
                output,
                error_type,
                reason,
            } => {
                return Ok(RoleEnd::Failed {
                    output,
                    error_type,
                    cost_usd,
                    emitted: progress.emitted,
                    reason,
                });
            }
            Guarded::Interrupted { timed_out } => {
                return Ok(RoleEnd::Interrupted {
                    timed_out,
                    emitted: progress.emitted,
                });
            }
        }
    }
}

/// Whether `name` is a terminal role of the agent.
pub(crate) fn is_terminal(roles: &[RoleRuntime], name: &str) -> bool {
    roles.iter().any(|r| r.terminal && r.name == name)
}

/// The calls of the run's last answer.
fn turn_calls(state: &RunState) -> Vec<(String, String)> {
    state
        .messages
        .iter()
        .rev()
        .find(|m| m.role == Role::Assistant)
        .map(|m| {
            m.tool_calls()
                .map(|(id, name, _)| (id.to_owned(), name.to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// The `loom.terminal` decision of a terminal role called with other tools in its turn: its
/// result goes back to the orchestrator like any other.
pub(crate) fn not_alone(
    roles: &[RoleRuntime],
    state: &RunState,
    call: &PendingCall,
) -> Option<Payload> {
    if !is_terminal(roles, &call.name) || turn_calls(state).len() < 2 {
        return None;
    }
    Some(hooks::decided(
        TERMINAL,
        Point::AfterTool,
        DecisionKind::Continue,
        Some(format!(
            "{} is terminal but was called with other tools in the same turn: its result goes \
             back to the orchestrator",
            call.name
        )),
        Some(&call.call_id),
        false,
    ))
}

/// The final output when the batch just completed was a terminal role called alone whose
/// result is not an error: that result, and the `tool.completed` that carries it.
pub(crate) fn terminal_output(
    roles: &[RoleRuntime],
    last_ids: &LastIds,
    state: &RunState,
) -> Option<(Final, String)> {
    if state.status != loom_core::RunStatus::AwaitingTools
        || !state.pending_calls.is_empty()
        || state.pending_repair.is_some()
        || state
            .approvals
            .iter()
            .any(loom_core::approval::ApprovalRecord::is_pending)
    {
        return None;
    }
    let calls = turn_calls(state);
    let [(call_id, name)] = calls.as_slice() else {
        return None;
    };
    if !is_terminal(roles, name) {
        return None;
    }
    let result = state.messages.iter().rev().find_map(|m| {
        m.blocks.iter().find_map(|b| match &b.kind {
            BlockKind::ToolResult {
                call_id: id,
                output,
            } if id == call_id => Some(output),
            _ => None,
        })
    })?;
    if result.is_error {
        return None;
    }
    let event_id = last_ids.tool.clone()?;
    Some((
        Final {
            message: None,
            output_event_id: Some(event_id.clone()),
            data: result.data.clone(),
        },
        event_id,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_found_as_objects_and_as_strings() {
        let mut found = Vec::new();
        references(
            &json!({
                "a": {"$ref": "result:1"},
                "b": ["x", "{\"$ref\": \"result:2\"}"],
                "c/d": {"$ref": "result:3", "other": 1},
                "e": "{not json $ref"
            }),
            "",
            &mut found,
        );
        assert_eq!(
            found,
            [
                ("/a".to_owned(), "result:1".to_owned()),
                ("/b/1".to_owned(), "result:2".to_owned()),
            ]
        );
    }

    #[test]
    fn results_are_numbered_in_request_order_and_errors_are_not_prefixed() {
        let result = |id: &str, output: ToolOutput| {
            Block::new(BlockKind::ToolResult {
                call_id: id.into(),
                output,
            })
        };
        let mut conversation = vec![
            Message::user("q"),
            Message {
                role: Role::Tool,
                blocks: vec![
                    result("a", ToolOutput::text("one")),
                    result("b", ToolOutput::error("bad")),
                ],
            },
            Message {
                role: Role::Tool,
                blocks: vec![result(
                    "c",
                    ToolOutput {
                        data: Some(json!({"n": 3})),
                        ..ToolOutput::default()
                    },
                )],
            },
        ];
        number_results(&mut conversation);
        let texts: Vec<String> = conversation[1..]
            .iter()
            .flat_map(|m| m.blocks.iter())
            .filter_map(|b| match &b.kind {
                BlockKind::ToolResult { output, .. } => Some(output.visible_text()),
                _ => None,
            })
            .collect();
        assert_eq!(texts, ["[result:1]\none", "bad", "[result:3]\n{\"n\":3}"]);
    }

    #[test]
    fn json_becomes_template_values() {
        let value = template_value(&json!({"a": [1, 2.5, "x", null, true], "b": {"c": "d"}}));
        let rendered = minijinja::Environment::new()
            .render_str(
                "{{ v.a[0] }} {{ v.a[1] }} {{ v.a[2] }} {{ v.b.c }} {{ v.a[4] }}",
                minijinja::context! { v => value },
            )
            .unwrap();
        assert_eq!(rendered, "1 2.5 x d True");
    }
}
