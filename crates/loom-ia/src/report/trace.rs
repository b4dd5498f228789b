//! The trace of a run, the reference's `Trace`: the run's figures and its spans, the run, its
//! steps, model calls, tool calls, judges, approvals and sub-runs, nested by the span ids the
//! journal records. A sub-agent's run is part of its parent's trace: its spans sit under the
//! parent's tool call. Built by a pure fold over journal events ([`super::spans`]).
//!
//! Span attributes use the OpenTelemetry GenAI names where one exists (`gen_ai.agent.name`,
//! `gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.usage.input_tokens` (cache
//! included), `gen_ai.usage.output_tokens`, `gen_ai.usage.cache_read.input_tokens`,
//! `gen_ai.usage.cache_write.input_tokens`, `gen_ai.tool.name`, `gen_ai.tool.call.id`, and for
//! content `gen_ai.input.messages`, `gen_ai.output.messages`, `gen_ai.tool.call.arguments`,
//! `gen_ai.tool.call.result`), and `loom.*` names for the rest. Content (texts, arguments,
//! results, reasons, errors) is only in the attributes listed in [`CONTENT_ATTRIBUTES`] and in
//! `output`; [`Trace::without_content`] removes it and sets `content` to false.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use loom_core::{Event, RunStatus, Usage, state::FoldError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Span and span-event attributes that hold content: removed for a reader without
/// `read_content`, as `output` is.
pub const CONTENT_ATTRIBUTES: &[&str] = &[
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
    "loom.arguments",
    "loom.error",
    "loom.message",
    "loom.name",
    "loom.output",
    "loom.reason",
    "loom.reasons",
];

/// A run as its spans, with its figures: what `loom inspect --json`, REST
/// `GET /v1/traces/{run_id}` and the MCP resource `loom://traces/{run_id}` give.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Trace {
    /// Run.
    pub run_id: String,
    /// Session.
    pub session_id: String,
    /// Tenant.
    pub tenant_id: String,
    /// The root run of the run's tree: every span of the tree belongs to this trace.
    pub trace_id: String,
    /// Agent.
    pub agent: String,
    /// State.
    pub status: RunStatus,
    /// Whether the closing event was written.
    pub finished: bool,
    /// Orchestrator model calls.
    pub iterations: u32,
    /// Tokens of every model call of the run, its sub-runs' included.
    pub usage: Usage,
    /// Cost in dollars, its sub-runs' included.
    pub cost_usd: f64,
    /// Sum of the run's step durations (piloting time).
    pub active_ms: f64,
    /// Final answer (content).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Failure classification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    /// Whether content (texts, arguments, results, reasons) is included.
    pub content: bool,
    /// The spans, each after its parent, in the order they started in the journal.
    pub spans: Vec<Span>,
}

/// What a span stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SpanKind {
    /// A run (the trace's run, or a sub-agent's run under its parent's tool call).
    Run,
    /// One step of a run (one model call, one tool batch, a forced answer, a wait).
    Step,
    /// A model call of the orchestrator.
    Chat,
    /// A tool call (a role's or a sub-agent's call included).
    Tool,
    /// A judge's model call and its verdict.
    Judge,
    /// A role's model call, under the role's tool call.
    Model,
    /// Anything else (an approval asked for a call).
    Other,
}

impl SpanKind {
    /// The JSON string.
    pub fn as_str(self) -> &'static str {
        match self {
            SpanKind::Run => "run",
            SpanKind::Step => "step",
            SpanKind::Chat => "chat",
            SpanKind::Tool => "tool",
            SpanKind::Judge => "judge",
            SpanKind::Model => "model",
            SpanKind::Other => "other",
        }
    }
}

/// How a span ended, as OpenTelemetry's status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SpanStatus {
    /// Not ended yet.
    Unset,
    /// Ended normally.
    Ok,
    /// Ended in error (a failed run, a step that failed or was cancelled, a tool error).
    Error,
}

/// One span of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Span {
    /// The span id the journal records (an orchestrator model call, journaled inside its
    /// step's span, is identified by its `model.responded` event id).
    pub span_id: String,
    /// The enclosing span (absent for the trace's root; for a sub-run inspected alone, its
    /// parent's tool call, which is not in the trace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_span_id: Option<String>,
    /// What it stands for.
    pub kind: SpanKind,
    /// Its name, OpenTelemetry-style (`invoke_agent devis`, `step 2`, `chat FAKE`,
    /// `execute_tool prix_ttc`, `judge ton`, `approval envoyer`).
    pub name: String,
    /// The run it belongs to.
    pub run_id: String,
    /// When it started.
    pub start_time: DateTime<Utc>,
    /// When it ended (absent while open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<DateTime<Utc>>,
    /// How long it lasted (absent while open): a step's journaled duration, a call's latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    /// How it ended.
    pub status: SpanStatus,
    /// What it did: OpenTelemetry GenAI names, and `loom.*`.
    pub attributes: BTreeMap<String, Value>,
    /// What happened inside it (policy decisions, checks, retries, approvals, transitions…).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<SpanEvent>,
}

impl Span {
    /// The attribute `key` as text.
    pub fn text(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).and_then(Value::as_str)
    }

    /// The attribute `key` as a number.
    pub fn number(&self, key: &str) -> Option<f64> {
        self.attributes.get(key).and_then(Value::as_f64)
    }

    /// The attribute `key` as a flag (false when absent).
    pub fn flag(&self, key: &str) -> bool {
        self.attributes
            .get(key)
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    /// The tokens of a model call (or of the calls a span sums), from its `gen_ai.usage.*`
    /// attributes.
    pub fn usage(&self) -> Usage {
        let count = |key: &str| {
            self.attributes
                .get(key)
                .and_then(Value::as_u64)
                .unwrap_or(0)
        };
        let (cache_read, cache_write) = (
            count("gen_ai.usage.cache_read.input_tokens"),
            count("gen_ai.usage.cache_write.input_tokens"),
        );
        Usage {
            input_tokens: count("gen_ai.usage.input_tokens")
                .saturating_sub(cache_read + cache_write),
            output_tokens: count("gen_ai.usage.output_tokens"),
            cache_read_tokens: cache_read,
            cache_write_tokens: cache_write,
            reasoning_tokens: count("loom.usage.reasoning_tokens"),
        }
    }
}

/// Something that happened inside a span: one journal event, named by its type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SpanEvent {
    /// The event type (`policy.decided`, `guard.checked`, `approval.granted`…).
    pub name: String,
    /// When it was journaled.
    pub time: DateTime<Utc>,
    /// What it says (`loom.*`).
    pub attributes: BTreeMap<String, Value>,
}

impl SpanEvent {
    /// The attribute `key` as text.
    pub fn text(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).and_then(Value::as_str)
    }
}

impl Trace {
    /// The trace of `run_id` from the events of its session: the run and its sub-runs, all the
    /// way down, with content. A run's own events give its trace without its sub-runs.
    pub fn from_events(run_id: &str, events: &[Event]) -> Result<Trace, FoldError> {
        super::spans::fold(run_id, events)
    }

    /// The same trace without content: `output` and the [`CONTENT_ATTRIBUTES`] of every span
    /// and span event removed, `content` false.
    pub fn without_content(mut self) -> Trace {
        self.strip();
        self
    }

    /// Removes the content, and says where it was: `output`,
    /// `spans[3].attributes["gen_ai.tool.call.result"]`,
    /// `spans[3].events[0].attributes["loom.reason"]` (only what held something).
    pub(crate) fn strip(&mut self) -> Vec<String> {
        let mut removed = Vec::new();
        if self.output.take().is_some_and(|text| !text.is_empty()) {
            removed.push("output".to_owned());
        }
        for (index, span) in self.spans.iter_mut().enumerate() {
            let at = format!("spans[{index}]");
            strip_attributes(&mut span.attributes, &format!("{at}."), &mut removed);
            for (number, event) in span.events.iter_mut().enumerate() {
                let at = format!("{at}.events[{number}].");
                strip_attributes(&mut event.attributes, &at, &mut removed);
            }
        }
        self.content = false;
        removed
    }

    /// The spans directly under `parent` (the trace's roots for `None`: spans whose parent is
    /// not in the trace), in order.
    pub fn children<'a>(&'a self, parent: Option<&'a str>) -> impl Iterator<Item = &'a Span> {
        self.spans.iter().filter(move |span| match parent {
            Some(id) => span.parent_span_id.as_deref() == Some(id),
            None => span
                .parent_span_id
                .as_deref()
                .is_none_or(|id| !self.spans.iter().any(|s| s.span_id == id)),
        })
    }
}

fn strip_attributes(attributes: &mut BTreeMap<String, Value>, at: &str, removed: &mut Vec<String>) {
    for key in CONTENT_ATTRIBUTES {
        if let Some(gone) = attributes.remove(*key)
            && !matches!(&gone, Value::Null)
            && gone != Value::String(String::new())
        {
            removed.push(format!("{at}attributes[\"{key}\"]"));
        }
    }
}
