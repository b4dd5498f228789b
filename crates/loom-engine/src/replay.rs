//! Exact replay: a run re-driven from its journal, with nothing external called.
//!
//! [`Recording`] is the book of what the journal recorded for a run and its sub-runs: every
//! `model.responded` (its message, usage, stop reason and request hash) in journal order, and
//! every `tool.completed` of a plain tool (Rust, MCP or built-in: not a role nor a sub-agent, which
//! the engine re-drives itself) by call id, and every opening of a tool source (an MCP server:
//! `tool.source_opened` with the tools it offered, or `tool.source_unavailable`).
//! [`replaying`] turns an agent into its replay double: every model client of every slot (main
//! chain, roles, judges, sub-agents at any depth) becomes a [`Recording`]-backed client, every
//! plain tool a [`Recording`]-backed tool and every tool source a recorded one (its tools as the
//! journal recorded them), so the engine that drives it reaches no provider, no MCP server and
//! runs no tool code. A run recorded before Loom journaled the tools a source offers is refused
//! ([`ReplayError::ToolSources`]). A call the journal has no answer
//! for is an error the run sees (a model error that is not retried, an error result), recorded as
//! a [`Miss`], never a real call.
//!
//! The same doubles answer an evaluation's side-effect tools ([`doubled`]): there the book holds
//! the suite's declared results by tool name instead of the journal's by call id, only the
//! tools whose `side_effects` is not `none` are replaced (read-only tools and models run), and a
//! side-effect tool without a declared result is refused the same way, never run.
//!
//! The book also holds each failed attempt of a model call (`model.retried`, and the
//! `model.fell_back` that left a model, with their error kind and message): the model's double
//! fails again with it before the answer recorded after it, so the engine retries and falls back
//! as it did (the retry's wait is not waited).
//!
//! What came from outside the run is re-applied at its recorded place, by position among the
//! tree's events (`outside`): steering messages, a requested cancellation, the deadline of an
//! approval request that expired; recorded approval decisions are settled again, the root's and
//! its sub-runs'; attached files are read from the original artifact store and attached again
//! (`prepare`).
//!
//! [`compare`] then finds the first divergence between the recorded events and the replay's
//! (see its documentation for what is compared).
//!
//! [`replay_variant`] re-drives the same conversation with other models for named steps and
//! doubles for named tools (see [`mod@variant`]): model calls the journal recorded are served,
//! the others are made for real; tool calls are served from the journal, by a double, or run
//! only when the tool declares no side effect, and refused otherwise.

mod compare;
mod outside;
mod prepare;
mod sources;
pub mod variant;

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
};

use loom_core::{
    BoxFuture, BoxStream, Event, Payload,
    content::BlockKind,
    event::ModelResponded,
    model::{ModelChunk, ModelClient, ModelError, ModelErrorKind, ModelRequest},
    ports::ArtifactStore,
    tool::{Tool, ToolContext, ToolError, ToolKind, ToolOutput, ToolSpec},
};

use crate::{AgentRuntime, JudgeRuntime, ModelBinding, SubAgentRuntime, request::request_hash};

pub use compare::{Divergence, VOLATILE_FIELDS, compare};
use prepare::prepare;
pub use variant::{VariantCounts, VariantPlan, VariantReplayed, replay_variant, varying};

/// Why a run cannot be replayed exactly.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The events hold no `run.started` of this run.
    #[error("run {0} is not in the journal")]
    UnknownRun(String),
    /// The run is a sub-run: its root re-drives it.
    #[error("run {run_id} is a sub-run of {root_run_id}: replay its root run {root_run_id}")]
    SubRun {
        /// The run asked for.
        run_id: String,
        /// Its root.
        root_run_id: String,
    },
    /// The run has not closed.
    #[error("run {0} has not closed: only a closed run can be replayed")]
    Open(String),
    /// Something the run depended on came from outside it, or is not recorded.
    #[error("run {run_id} cannot be replayed exactly: {reason}")]
    Unsupported {
        /// The run.
        run_id: String,
        /// Why.
        reason: String,
    },
    /// The replay's journal already holds events of the session: a replay writes into a fresh
    /// scratch journal only.
    #[error("the replay journal must be empty (it holds {0} events of the session)")]
    NotScratch(u64),
    /// The engine failed while replaying.
    #[error(transparent)]
    Engine(#[from] crate::EngineError),
    /// A variant names a step (`main`, a role, `judge:<name>`) the agent does not have.
    #[error("agent '{agent}' has no step '{step}' (its steps: {known})")]
    UnknownStep {
        /// The agent.
        agent: String,
        /// The step named.
        step: String,
        /// The steps it has.
        known: String,
    },
    /// A variant gives a double for a tool the agent (and its sub-agents) is not offered.
    #[error("agent '{agent}' offers no tool '{tool}' to double (its tools: {known})")]
    UnknownDouble {
        /// The agent.
        agent: String,
        /// The tool named.
        tool: String,
        /// The tools it offers.
        known: String,
    },
    /// The agent reads tools from a source (an MCP server) whose tools the journal did not
    /// record (a run journaled before `tool.source_opened` existed).
    #[error(
        "agent '{agent}' reads tools from source '{source_name}', and the run's journal does not \
         record what it offered (no tool.source_opened nor tool.source_unavailable: the run was \
         recorded by a Loom that did not journal source tools), so it cannot be replayed \
         without asking the live server"
    )]
    ToolSources {
        /// The agent.
        agent: String,
        /// The source.
        source_name: String,
    },
}

/// A call the replay asked for and the journal had no answer to.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Miss {
    /// `model`, `tool` or `source` (a tool source's opening).
    pub kind: &'static str,
    /// What was asked (the request hash's first 12 hex, or the call id and tool).
    pub detail: String,
}

/// How many answers the journal held and how many the replay used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct ReplayCounts {
    /// `model.responded` events recorded.
    pub models_recorded: usize,
    /// Of them, served to the replay.
    pub models_served: usize,
    /// Plain-tool results recorded.
    pub tools_recorded: usize,
    /// Of them, served to the replay.
    pub tools_served: usize,
}

/// One recorded model answer.
#[derive(Debug)]
struct Answer {
    /// Its place in the journal (among the run tree's events).
    index: usize,
    request_hash: Option<String>,
    response: ModelResponded,
    served: bool,
}

/// One recorded failed attempt of a model call (`model.retried`, or the `model.fell_back` that
/// left the model), served again before the answer recorded after it.
#[derive(Debug)]
struct Failure {
    /// Its place in the journal.
    index: usize,
    /// The model that failed (its configured id).
    model: String,
    kind: ModelErrorKind,
    message: String,
    http_status: Option<u16>,
    served: bool,
}

/// One recorded plain-tool call and its result, served to a variant by tool and arguments.
#[derive(Debug)]
struct RecordedCall {
    tool: String,
    arguments: serde_json::Value,
    output: ToolOutput,
    served: bool,
}

/// What the replay's doubles read and record.
#[derive(Debug, Default)]
struct Book {
    answers: Vec<Answer>,
    failures: Vec<Failure>,
    results: HashMap<String, VecDeque<(String, ToolOutput)>>,
    calls: Vec<RecordedCall>,
    counts: ReplayCounts,
    variant: VariantCounts,
    misses: Vec<Miss>,
    /// Results declared by tool name (an evaluation's doubles), served to every call of the
    /// tool that the journal has no result for.
    doubles: HashMap<String, ToolOutput>,
    /// Set when the recording ends in a requested cancellation: a call it never answered was
    /// cut short by it, and waits for it in the replay.
    cut: Option<Arc<outside::Outside>>,
    /// What each tool source gave at each opening.
    openings: sources::Openings,
}

/// The recorded answers of a run and its sub-runs, served to the replay's doubles.
#[derive(Debug, Default)]
pub struct Recording {
    book: Mutex<Book>,
}

impl Recording {
    /// The book of `events` (a run and its sub-runs, in journal order).
    pub fn from_events(events: &[Event]) -> Recording {
        let mut book = Book::default();
        // Plain tool calls, by (run, call id), with their arguments: only their results are
        // served by the book.
        let mut plain: BTreeMap<(&str, &str), &serde_json::Value> = BTreeMap::new();
        for (index, event) in events.iter().enumerate() {
            match &event.payload {
                Payload::ModelResponded(answer) => book.answers.push(Answer {
                    index,
                    request_hash: answer.request_hash.clone(),
                    response: answer.clone(),
                    served: false,
                }),
                Payload::ModelRetried(retried) => {
                    if let Some(kind) = error_kind(&retried.error_kind) {
                        book.failures.push(Failure {
                            index,
                            model: retried.model.clone().unwrap_or_default(),
                            kind,
                            message: retried.error.clone(),
                            http_status: retried.http_status,
                            served: false,
                        });
                    }
                }
                Payload::ModelFellBack(fell) => {
                    // A model skipped by its open breaker was not called.
                    if let Some(kind) = error_kind(&fell.reason) {
                        book.failures.push(Failure {
                            index,
                            model: fell.from_model.clone(),
                            kind,
                            message: fell.error.clone().unwrap_or_default(),
                            http_status: None,
                            served: false,
                        });
                    }
                }
                Payload::ToolSourceOpened(opened) => {
                    book.openings.opened(&opened.source, &opened.tools);
                }
                Payload::CircuitOpened(circuit) => book.openings.circuit(circuit),
                Payload::ToolSourceUnavailable(unavailable) => {
                    book.openings
                        .unavailable(&unavailable.source, &unavailable.error);
                }
                Payload::ToolCalled(call)
                    if !matches!(call.tool_kind, ToolKind::Role | ToolKind::Agent) =>
                {
                    plain.insert(
                        (event.run_id.as_str(), call.call_id.as_str()),
                        &call.arguments,
                    );
                }
                Payload::ToolCompleted(done) => {
                    let key = (event.run_id.as_str(), done.call_id.as_str());
                    let Some(arguments) = plain.get(&key) else {
                        continue;
                    };
                    book.calls.push(RecordedCall {
                        tool: done.tool_name.clone(),
                        arguments: (*arguments).clone(),
                        output: done.output.clone(),
                        served: false,
                    });
                    book.results
                        .entry(done.call_id.clone())
                        .or_default()
                        .push_back((done.tool_name.clone(), done.output.clone()));
                    book.counts.tools_recorded += 1;
                }
                _ => {}
            }
        }
        book.counts.models_recorded = book.answers.len();
        Recording {
            book: Mutex::new(book),
        }
    }

    /// A book of declared results, by tool name: what an evaluation's doubles answer
    /// ([`doubled`]).
    pub fn from_doubles(doubles: impl IntoIterator<Item = (String, ToolOutput)>) -> Recording {
        Recording {
            book: Mutex::new(Book {
                doubles: doubles.into_iter().collect(),
                ..Book::default()
            }),
        }
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // A poisoned book is still the book: the doubles only push and pop.
        self.book
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many answers were recorded and served so far.
    pub fn counts(&self) -> ReplayCounts {
        self.book().counts
    }

    /// The calls the journal had no answer for, in the order they were asked.
    pub fn misses(&self) -> Vec<Miss> {
        self.book().misses.clone()
    }

    /// The answer to a request hashed `hash`: the first unserved answer recorded for the same
    /// hash, else the first unserved answer (a request that changed gets the answer recorded at
    /// its place, so the replay goes on and the comparison names what changed).
    fn answer(&self, hash: &str) -> Option<ModelResponded> {
        let mut book = self.book();
        let index = book
            .answers
            .iter()
            .position(|a| !a.served && a.request_hash.as_deref() == Some(hash))
            .or_else(|| book.answers.iter().position(|a| !a.served))?;
        let answer = book.answers.get_mut(index)?;
        answer.served = true;
        let response = answer.response.clone();
        book.counts.models_served += 1;
        Some(response)
    }

    /// The failure recorded for an attempt of `model` before the answer a request hashed
    /// `hash` would be served, once: the failed attempts are served again in their order, so
    /// the engine retries and falls back as it did.
    fn failure(&self, hash: &str, model: &str) -> Option<ModelError> {
        let mut book = self.book();
        let next_answer = book
            .answers
            .iter()
            .find(|a| !a.served && a.request_hash.as_deref() == Some(hash))
            .or_else(|| book.answers.iter().find(|a| !a.served))
            .map(|a| a.index);
        let failure = book.failures.iter_mut().find(|f| {
            !f.served && f.model == model && next_answer.is_none_or(|index| f.index < index)
        })?;
        failure.served = true;
        let mut error = ModelError::new(failure.kind, failure.message.clone());
        error.http_status = failure.http_status;
        Some(error)
    }

    /// The recorded result of call `call_id` of `tool`, once; else the result declared for
    /// `tool`, at every call.
    fn result(&self, call_id: &str, tool: &str) -> Option<ToolOutput> {
        let mut book = self.book();
        let recorded = book.results.get_mut(call_id).and_then(|queue| {
            let index = queue.iter().position(|(name, _)| name == tool)?;
            queue.remove(index).map(|(_, output)| output)
        });
        let output = recorded.or_else(|| book.doubles.get(tool).cloned())?;
        book.counts.tools_served += 1;
        Some(output)
    }

    /// The answer recorded for a request hashed `hash` exactly, once (a variant: a request the
    /// journal did not record is made for real, never answered with another request's answer).
    fn known_answer(&self, hash: &str) -> Option<ModelResponded> {
        let mut book = self.book();
        let answer = book
            .answers
            .iter_mut()
            .find(|a| !a.served && a.request_hash.as_deref() == Some(hash))?;
        answer.served = true;
        let response = answer.response.clone();
        book.variant.models_served += 1;
        Some(response)
    }

    /// The recorded result of a call of `tool` with these `arguments`, once (a variant: its
    /// model may number its calls otherwise).
    fn result_for(&self, tool: &str, arguments: &serde_json::Value) -> Option<ToolOutput> {
        let mut book = self.book();
        let call = book
            .calls
            .iter_mut()
            .find(|c| !c.served && c.tool == tool && &c.arguments == arguments)?;
        call.served = true;
        let output = call.output.clone();
        book.variant.tools_served += 1;
        Some(output)
    }

    /// Whether the journal holds a result not served yet for a call of `tool` with these
    /// `arguments` (what [`variant`]'s tools answer from).
    fn has_result(&self, tool: &str, arguments: &serde_json::Value) -> bool {
        self.book()
            .calls
            .iter()
            .any(|c| !c.served && c.tool == tool && &c.arguments == arguments)
    }

    /// What a variant's doubles counted so far.
    pub fn variant_counts(&self) -> VariantCounts {
        self.book().variant
    }

    /// The cancellation that cut short the calls the recording never answered, if any.
    fn cut(&self) -> Option<Arc<outside::Outside>> {
        self.book().cut.clone()
    }

    fn miss(&self, kind: &'static str, detail: String) {
        self.book().misses.push(Miss { kind, detail });
    }
}

/// The replay double of `agent`: the same agent (prompt, tools offered, policies, contracts,
/// judges, roles, sub-agents, limits) whose model clients and plain tools are served by `book`.
pub fn replaying(agent: &AgentRuntime, book: &Arc<Recording>) -> Result<AgentRuntime, ReplayError> {
    if let Some(bound) = agent
        .sources
        .iter()
        .find(|s| !book.book().openings.knows(s.source.name()))
    {
        return Err(ReplayError::ToolSources {
            agent: agent.name.clone(),
            source_name: bound.source.name().to_owned(),
        });
    }
    replaying_tree(agent, book)
}

/// [`replaying`] below the root: a sub-agent's source the journal never saw open (the
/// sub-agent was not delegated to) is replayed as recorded nonetheless; opening it is a miss.
fn replaying_tree(
    agent: &AgentRuntime,
    book: &Arc<Recording>,
) -> Result<AgentRuntime, ReplayError> {
    let mut double = agent.clone();
    for bound in &mut double.sources {
        bound.source = Arc::new(sources::RecordedSource {
            name: bound.source.name().to_owned(),
            book: book.clone(),
        });
    }
    double.main = binding(&agent.main, book);
    double.fallbacks = agent.fallbacks.iter().map(|b| binding(b, book)).collect();
    for bound in &mut double.tools {
        bound.tool = Arc::new(RecordedTool {
            spec: bound.tool.spec().clone(),
            book: book.clone(),
            serves: Serves::Journal,
        });
    }
    double.judges = agent.judges.iter().map(|j| judge(j, book)).collect();
    for role in &mut double.roles {
        role.main = binding(&role.main, book);
        role.fallbacks = role.fallbacks.iter().map(|b| binding(b, book)).collect();
        role.judges = role.judges.iter().map(|j| judge(j, book)).collect();
    }
    double.subagents = agent
        .subagents
        .iter()
        .map(|sub| {
            Ok(SubAgentRuntime {
                agent: Arc::new(replaying_tree(&sub.agent, book)?),
                ..sub.clone()
            })
        })
        .collect::<Result<_, ReplayError>>()?;
    Ok(double)
}

/// The evaluation double of `agent`: the same agent whose tools that change the world (their
/// `side_effects`, after the agent's overrides, is not `none`), its sub-agents' included, are
/// answered by `book`'s declared results ([`Recording::from_doubles`]) and never run; a call of
/// such a tool without a declared result gets an error result naming the tool (and is recorded
/// as a [`Miss`]). Models, roles, judges and read-only tools are left as they are. The tools
/// of a source (an MCP server) are held back the same way as the source opens: the server is
/// asked for its tools, its read-only tools run, the others are answered by the doubles.
pub fn doubled(agent: &AgentRuntime, book: &Arc<Recording>) -> Result<AgentRuntime, ReplayError> {
    let mut double = agent.clone();
    for bound in &mut double.tools {
        if bound.declarations.side_effects != loom_core::tool::SideEffects::None {
            bound.tool = Arc::new(RecordedTool {
                spec: bound.tool.spec().clone(),
                book: book.clone(),
                serves: Serves::Doubles,
            });
        }
    }
    for bound in &mut double.sources {
        let book = book.clone();
        bound.source = Arc::new(sources::MappedSource {
            inner: bound.source.clone(),
            map: Box::new(move |tool: Arc<dyn Tool>| {
                // A source's tool carries its declarations in its spec (see `Offer::open`).
                if tool.spec().declarations.side_effects == loom_core::tool::SideEffects::None {
                    tool
                } else {
                    Arc::new(RecordedTool {
                        spec: tool.spec().clone(),
                        book: book.clone(),
                        serves: Serves::Doubles,
                    })
                }
            }),
        });
    }
    double.subagents = agent
        .subagents
        .iter()
        .map(|sub| {
            Ok(SubAgentRuntime {
                agent: Arc::new(doubled(&sub.agent, book)?),
                ..sub.clone()
            })
        })
        .collect::<Result<_, ReplayError>>()?;
    Ok(double)
}

/// The model error kind named `name` in an event (`transient`, …); `None` for a name that is
/// not one (`circuit_open`: a model skipped, not called).
fn error_kind(name: &str) -> Option<ModelErrorKind> {
    serde_json::from_value(serde_json::Value::String(name.to_owned())).ok()
}

fn binding(model: &ModelBinding, book: &Arc<Recording>) -> ModelBinding {
    ModelBinding {
        client: Arc::new(RecordedModel {
            provider: model.client.provider().to_owned(),
            config_id: model.config_id.clone(),
            book: book.clone(),
        }),
        // A retry is decided as it was; the replay does not wait for it (`delay_s` is not
        // compared).
        retry: crate::RetryPolicy {
            initial_delay: std::time::Duration::ZERO,
            ..model.retry
        },
        ..model.clone()
    }
}

fn judge(judge: &JudgeRuntime, book: &Arc<Recording>) -> JudgeRuntime {
    JudgeRuntime {
        main: binding(&judge.main, book),
        fallbacks: judge.fallbacks.iter().map(|b| binding(b, book)).collect(),
        ..judge.clone()
    }
}

/// A model client answering from the journal.
#[derive(Debug)]
struct RecordedModel {
    provider: String,
    /// The configured id of the model it stands for (whose recorded failures it serves).
    config_id: String,
    book: Arc<Recording>,
}

impl ModelClient for RecordedModel {
    fn provider(&self) -> &str {
        &self.provider
    }

    fn stream(&self, request: &ModelRequest) -> BoxStream<'static, Result<ModelChunk, ModelError>> {
        let (hash, _) = request_hash(request);
        if let Some(error) = self.book.failure(&hash, &self.config_id) {
            return Box::pin(futures_util::stream::iter([Err(error)]));
        }
        let chunks = match self.book.answer(&hash) {
            Some(answer) => chunks(&answer),
            None if let Some(cut) = self.book.cut() => {
                // The run was cancelled while this call ran: it waits for the cancellation.
                return Box::pin(futures_util::stream::once(async move {
                    cut.cut_short().await;
                    Err(ModelError::new(
                        ModelErrorKind::InvalidRequest,
                        "replay: the run was cancelled while this model call ran",
                    ))
                }));
            }
            None => {
                let short = hash.get(..12).unwrap_or(&hash).to_owned();
                self.book.miss("model", format!("request {short}"));
                vec![Err(ModelError::new(
                    ModelErrorKind::InvalidRequest,
                    format!(
                        "replay: the journal has no answer left for this model call (request {short})"
                    ),
                ))]
            }
        };
        Box::pin(futures_util::stream::iter(chunks))
    }
}

/// The chunks that accumulate into the recorded answer.
fn chunks(answer: &ModelResponded) -> Vec<Result<ModelChunk, ModelError>> {
    let mut chunks = Vec::with_capacity(answer.message.blocks.len() + 2);
    let mut index = 0;
    for block in &answer.message.blocks {
        match &block.kind {
            BlockKind::Text { text } => chunks.push(Ok(ModelChunk::TextDelta(text.clone()))),
            BlockKind::Reasoning { text, .. } => chunks.push(Ok(ModelChunk::ReasoningDelta {
                text: text.clone(),
                start: true,
                provider_meta: block.provider_meta.clone(),
            })),
            BlockKind::ToolCall {
                call_id,
                name,
                arguments,
            } => {
                chunks.push(Ok(ModelChunk::ToolCallStarted {
                    index,
                    call_id: call_id.clone(),
                    name: name.clone(),
                }));
                chunks.push(Ok(ModelChunk::ToolArgsDelta {
                    index,
                    json_fragment: arguments.to_string(),
                }));
                chunks.push(Ok(ModelChunk::ToolCallEnded { index }));
                index += 1;
            }
            // A model's answer holds only the blocks above; anything else cannot be streamed
            // again and is left out (the comparison then shows the message that differs).
            _ => {}
        }
    }
    chunks.push(Ok(ModelChunk::Usage(answer.usage)));
    chunks.push(Ok(ModelChunk::Stopped {
        reason: answer.stop_reason,
        model_id: answer.model_id.clone(),
    }));
    chunks
}

/// What a [`RecordedTool`] stands for, which words its refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Serves {
    /// A replay: the journal's results.
    Journal,
    /// An evaluation: the suite's declared results of a side-effect tool.
    Doubles,
}

/// A tool answering from the journal (or from declared results): its declaration is the real
/// tool's, its code never runs.
#[derive(Debug)]
struct RecordedTool {
    spec: ToolSpec,
    book: Arc<Recording>,
    serves: Serves,
}

impl Tool for RecordedTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(
        &self,
        ctx: ToolContext,
        _arguments: serde_json::Value,
    ) -> BoxFuture<'_, Result<ToolOutput, ToolError>> {
        let outcome = match self.book.result(&ctx.call_id, &self.spec.name) {
            Some(output) => Ok(output),
            None if self.serves == Serves::Journal
                && let Some(cut) = self.book.cut() =>
            {
                // The run was cancelled while this call ran: it waits for the cancellation.
                let name = self.spec.name.clone();
                return Box::pin(async move {
                    cut.cut_short().await;
                    Err(ToolError::new(format!(
                        "replay: the run was cancelled while this call of {name} ran"
                    )))
                });
            }
            None if self.serves == Serves::Doubles => {
                let name = &self.spec.name;
                self.book.miss(
                    "tool",
                    format!(
                        "tool {name} has side effects and no double (call {})",
                        ctx.call_id
                    ),
                );
                Err(ToolError::new(format!(
                    "evaluation: tool {name} has side effects and no double: it is never run \
                     during an evaluation"
                )))
            }
            None => {
                self.book.miss(
                    "tool",
                    format!("call {} of {}", ctx.call_id, self.spec.name),
                );
                Err(ToolError::new(format!(
                    "replay: the journal has no result for call {} of {}",
                    ctx.call_id, self.spec.name
                )))
            }
        };
        Box::pin(std::future::ready(outcome))
    }
}

/// What a replay found.
#[derive(Debug)]
pub struct Replayed {
    /// The first divergence, `None` when the replay is identical.
    pub divergence: Option<Divergence>,
    /// How the recorded run ended (`completed`, `failed`, …).
    pub recorded_status: String,
    /// How the replay ended.
    pub replay_status: String,
    /// Answers recorded and served.
    pub counts: ReplayCounts,
    /// Calls the journal had no answer for.
    pub misses: Vec<Miss>,
    /// The recorded events of the run and its sub-runs.
    pub recorded: Vec<Event>,
    /// The replay's events of the run and its sub-runs.
    pub replayed: Vec<Event>,
}

/// Replays `run_id` from `session`, the events of its session in journal order (at least those
/// before its `run.started`, which give its history, and those of its tree; other events are
/// ignored), with `agent` as configured today, on `engine`, whose journal must not hold the
/// session yet (a scratch journal: the replay writes there, never where the events came from).
///
/// The session's events before the run are copied into the scratch journal, the run is opened
/// again with its recorded id, message, user, metadata, state, judge mode, budget and trigger,
/// then driven by [`replaying`]'s double of `agent`; its events are compared with the recorded
/// ones ([`compare`]).
///
/// What came from outside the run is applied again at its recorded place (by position among
/// the tree's events, never by the clock): its steering messages, a requested cancellation (a
/// call it cut short waits for it) and the approval requests that expired (their deadline
/// passes when the replay waits for them). A run paused for approvals, the root's or a
/// sub-run's, is re-driven with the decisions its journal recorded, each journaled again when
/// the replay pauses for it.
///
/// Files attached to the run are read from `originals` (the artifact store of the journal the
/// events come from) and attached again, so the replay's `artifact.stored` and message are the
/// recorded ones.
///
/// Refused ([`ReplayError`]): a sub-run (its root is replayed), an open run, a compaction run, a
/// run whose attached files are not in `originals`, and a run whose model was skipped because
/// its circuit breaker was already open when the run began (the breakers' state is not in the
/// journal). A model call that was retried or fell back is re-driven: each failed attempt is
/// served its recorded error (kind and message), then the recorded answer.
pub async fn replay_run(
    engine: &crate::Engine,
    agent: &AgentRuntime,
    session: &[Event],
    run_id: &str,
    originals: Option<&dyn ArtifactStore>,
) -> Result<Replayed, ReplayError> {
    let prepared = prepare(engine, session, run_id, originals).await?;
    let book = Arc::new(Recording::from_events(&prepared.recorded));
    let double = replaying(agent, &book)?;
    let (replay_status, replayed) = prepared.drive(engine, &double, &book, None).await?;
    Ok(Replayed {
        divergence: compare(&prepared.recorded, &replayed),
        recorded_status: prepared.recorded_status,
        replay_status,
        counts: book.counts(),
        misses: book.misses(),
        recorded: prepared.recorded,
        replayed,
    })
}

#[cfg(test)]
mod tests;
