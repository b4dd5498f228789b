//! The fold that builds a [`Trace`]: one pass over the events of a run and its sub-runs, each
//! event placed in the span its envelope names.
//!
//! A span is opened by the first event that names it; its kind comes from that event
//! (`run.started`: a run, `step.started`: a step, a tool event or a tool-point decision: a tool
//! call, a judge's model event: a judge, a role's model event: a role's model call, an approval:
//! other). An orchestrator's `model.responded`, journaled inside its step's span, opens a span
//! of its own (kind chat, identified by the event id). Events that change a span's figures set
//! its attributes (`step.completed`, `tool.completed`, `model.responded`, a run's closing
//! event); the others (decisions, checks, retries, approvals, transitions, files) become span
//! events. `run.claimed`, `model.exchanged` and `session.repaired` are left out.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::TimeDelta;
use loom_core::{
    Event, RunState, Usage,
    event::{JudgeEvaluated, ModelResponded, Outcome, Payload, ToolCalled, ToolCompleted},
    state::FoldError,
};
use serde_json::{Value, json};

use super::{
    attributes::{messages_json, span_event, tool_names, usage_attributes},
    trace::{Span, SpanKind, SpanStatus, Trace},
};

/// The trace of `run_id` from the events of its session (see [`Trace::from_events`]).
pub(super) fn fold(run_id: &str, events: &[Event]) -> Result<Trace, FoldError> {
    let tree = tree(run_id, events);
    let mut states: HashMap<&str, RunState> = HashMap::new();
    let mut builder = Builder::default();
    for event in events.iter().filter(|e| tree.contains(e.run_id.as_str())) {
        match states.get_mut(event.run_id.as_str()) {
            Some(state) => state.apply(event)?,
            None => {
                states.insert(&event.run_id, RunState::start(event)?);
            }
        }
        builder.add(event);
    }
    let Some(root) = states.get(run_id) else {
        return Err(FoldError::Unknown(run_id.to_owned()));
    };
    for (id, state) in &states {
        builder.close_run(id, state);
    }
    Ok(Trace {
        run_id: root.run_id.clone(),
        session_id: root.session_id.clone(),
        tenant_id: root.tenant_id.clone(),
        trace_id: root.root_run_id.clone(),
        agent: root.agent.clone().unwrap_or_default(),
        status: root.status,
        finished: root.finished,
        iterations: root.iterations,
        usage: root.usage,
        cost_usd: root.cost_usd,
        active_ms: root.active_ms,
        output: root.output_text(),
        error_type: root.error_type.clone(),
        content: true,
        spans: builder.spans,
    })
}

/// `run_id` and the runs it opened, all the way down (a child starts after its parent, so one
/// pass finds them).
fn tree<'a>(run_id: &'a str, events: &'a [Event]) -> HashSet<&'a str> {
    let mut tree = HashSet::from([run_id]);
    for event in events {
        if let Payload::RunStarted(started) = &event.payload
            && started
                .parent_run_id
                .as_deref()
                .is_some_and(|parent| tree.contains(parent))
        {
            tree.insert(event.run_id.as_str());
        }
    }
    tree
}

/// What the fold keeps beside the spans.
#[derive(Default)]
struct Builder {
    spans: Vec<Span>,
    /// Span id → index in `spans`.
    index: HashMap<String, usize>,
    /// Run id → index of its run span.
    runs: HashMap<String, usize>,
    /// Spans whose `tool.called` was seen (a result without it was refused before launch).
    launched: HashSet<usize>,
    /// The model calls a span sums (role and judge spans may hold several).
    calls: HashMap<usize, Calls>,
    /// `(run, call)` → the arguments the model wrote, for calls refused before launch.
    arguments: HashMap<(String, String), Value>,
}

/// The model calls of one span.
#[derive(Default)]
struct Calls {
    usage: Usage,
    cost_usd: f64,
    latency_ms: f64,
    attempts: u32,
    outputs: Vec<Value>,
}

impl Builder {
    fn add(&mut self, event: &Event) {
        match &event.payload {
            Payload::RunStarted(_) => self.run_started(event),
            Payload::StepStarted(step) => {
                let at = self.open(event, SpanKind::Step);
                let span = &mut self.spans[at];
                span.name = format!("step {}", step.step_no);
                span.attributes
                    .insert("loom.step_no".into(), json!(step.step_no));
                span.attributes
                    .insert("loom.effect".into(), json!(step.effect));
                span.attributes
                    .insert("loom.state".into(), json!(step.state));
            }
            Payload::StepCompleted(done) => {
                let at = self.open(event, SpanKind::Step);
                let span = &mut self.spans[at];
                span.end_time = Some(event.ts);
                span.duration_ms = Some(done.duration_ms);
                span.status = match done.outcome {
                    Outcome::Ok => SpanStatus::Ok,
                    Outcome::Error | Outcome::Cancelled => SpanStatus::Error,
                };
                span.attributes
                    .insert("loom.outcome".into(), json!(done.outcome));
            }
            Payload::MessageUser(message)
                if message.kind == "request" && self.asks_first(event) =>
            {
                let at = self.open(event, SpanKind::Run);
                self.spans[at].attributes.insert(
                    "gen_ai.input.messages".into(),
                    json!([messages_json(&message.message, None)]),
                );
            }
            Payload::ModelResponded(response) => self.model_responded(event, response),
            Payload::ToolCalled(called) => self.tool_called(event, called),
            Payload::ToolCompleted(completed) => self.tool_completed(event, completed),
            Payload::JudgeEvaluated(verdict) => self.judge_evaluated(event, verdict),
            Payload::RunCompleted(_) | Payload::RunFailed(_) | Payload::RunCancelled(_) => {
                self.run_closed(event);
            }
            Payload::RunClaimed(_)
            | Payload::ModelExchanged(_)
            | Payload::SessionRepaired(_)
            | Payload::SessionSnapshot(_) => {}
            _ => {
                let at = self.open(event, kind_of(event));
                self.note_approval(at, event);
                self.spans[at].events.push(span_event(event));
            }
        }
    }

    /// Whether `event` is the request that opened its run (in the run's span, before any
    /// other request): the run's input. Later messages (steering, repairs) are span events.
    fn asks_first(&self, event: &Event) -> bool {
        self.runs.get(&event.run_id).is_some_and(|&at| {
            let span = &self.spans[at];
            span.span_id == event.span_id && !span.attributes.contains_key("gen_ai.input.messages")
        })
    }

    /// The span `event` names, opened with `kind` when it is new.
    fn open(&mut self, event: &Event, kind: SpanKind) -> usize {
        if let Some(&at) = self.index.get(&event.span_id) {
            return at;
        }
        self.push(Span {
            span_id: event.span_id.clone(),
            parent_span_id: event.parent_span_id.clone(),
            kind,
            name: kind.as_str().to_owned(),
            run_id: event.run_id.clone(),
            start_time: event.ts,
            end_time: None,
            duration_ms: None,
            status: SpanStatus::Unset,
            attributes: BTreeMap::new(),
            events: Vec::new(),
        })
    }

    fn push(&mut self, span: Span) -> usize {
        let at = self.spans.len();
        self.index.insert(span.span_id.clone(), at);
        self.spans.push(span);
        at
    }

    fn run_started(&mut self, event: &Event) {
        let Payload::RunStarted(started) = &event.payload else {
            return;
        };
        let at = self.open(event, SpanKind::Run);
        self.runs.insert(event.run_id.clone(), at);
        let agent = event.agent.clone().unwrap_or_default();
        let span = &mut self.spans[at];
        span.kind = SpanKind::Run;
        span.parent_span_id = event.parent_span_id.clone();
        span.name = format!("invoke_agent {agent}");
        let attributes = &mut span.attributes;
        attributes.insert("gen_ai.operation.name".into(), json!("invoke_agent"));
        attributes.insert("gen_ai.agent.name".into(), json!(agent));
        attributes.insert("gen_ai.conversation.id".into(), json!(event.session_id));
        attributes.insert("loom.run_id".into(), json!(event.run_id));
        attributes.insert("loom.tenant_id".into(), json!(event.tenant_id));
        attributes.insert("loom.depth".into(), json!(started.depth));
        attributes.insert("loom.kind".into(), json!(started.kind));
        let optional = [
            ("loom.parent_run_id", started.parent_run_id.as_ref()),
            ("loom.parent_call_id", started.parent_call_id.as_ref()),
            ("loom.trigger", started.trigger.as_ref()),
            ("loom.triggered_by", started.triggered_by.as_ref()),
        ];
        for (key, value) in optional {
            if let Some(value) = value {
                attributes.insert(key.into(), json!(value));
            }
        }
        if started.judges != "auto" {
            attributes.insert("loom.judges".into(), json!(started.judges));
        }
    }

    fn run_closed(&mut self, event: &Event) {
        let at = match self.runs.get(&event.run_id) {
            Some(&at) => at,
            None => self.open(event, SpanKind::Run),
        };
        let span = &mut self.spans[at];
        span.end_time = Some(event.ts);
        span.duration_ms = Some(millis(event.ts - span.start_time));
        span.status = match &event.payload {
            Payload::RunFailed(_) => SpanStatus::Error,
            _ => SpanStatus::Ok,
        };
        match &event.payload {
            Payload::RunFailed(failed) => {
                span.attributes
                    .insert("error.type".into(), json!(failed.error_type));
                span.attributes
                    .insert("loom.error".into(), json!(failed.error));
            }
            Payload::RunCancelled(cancelled) => {
                span.attributes
                    .insert("loom.cancelled.reason".into(), json!(cancelled.reason));
                if let Some(by) = &cancelled.by {
                    span.attributes
                        .insert("loom.cancelled.by".into(), json!(by));
                }
            }
            Payload::RunCompleted(completed) => {
                for (key, on) in [
                    ("loom.unverified", completed.unverified),
                    ("loom.fallback", completed.fallback),
                ] {
                    if on {
                        span.attributes.insert(key.into(), json!(true));
                    }
                }
            }
            _ => {}
        }
    }

    /// The run's figures, from its folded state.
    fn close_run(&mut self, run_id: &str, state: &RunState) {
        let Some(&at) = self.runs.get(run_id) else {
            return;
        };
        let attributes = &mut self.spans[at].attributes;
        attributes.insert("loom.status".into(), json!(state.status));
        attributes.insert("loom.finished".into(), json!(state.finished));
        attributes.insert("loom.iterations".into(), json!(state.iterations));
        attributes.insert("loom.active_ms".into(), json!(state.active_ms));
        usage_attributes(attributes, &state.usage, state.cost_usd);
    }

    fn model_responded(&mut self, event: &Event, response: &ModelResponded) {
        let start = event.ts - delta(response.latency_ms);
        let at = if response.call_id.is_none() && response.judge.is_none() {
            // The orchestrator's call, journaled in its step's span: a span of its own.
            for (call_id, _, arguments) in response.message.tool_calls() {
                self.arguments.insert(
                    (event.run_id.clone(), call_id.to_owned()),
                    arguments.clone(),
                );
            }
            self.push(Span {
                span_id: event.event_id.clone(),
                parent_span_id: Some(event.span_id.clone()),
                kind: SpanKind::Chat,
                name: String::new(),
                run_id: event.run_id.clone(),
                start_time: start,
                end_time: None,
                duration_ms: None,
                status: SpanStatus::Unset,
                attributes: BTreeMap::new(),
                events: Vec::new(),
            })
        } else {
            let at = self.open(event, kind_of(event));
            if self.spans[at].events.is_empty() && !self.calls.contains_key(&at) {
                self.spans[at].start_time = start;
            }
            at
        };
        let calls = self.calls.entry(at).or_default();
        calls.usage.add(&response.usage);
        calls.cost_usd += response.cost_usd;
        calls.latency_ms += response.latency_ms;
        calls.attempts += response.attempts;
        calls.outputs.push(messages_json(
            &response.message,
            Some(response.stop_reason.as_str()),
        ));
        let calls = &self.calls[&at];
        let span = &mut self.spans[at];
        span.name = match &response.judge {
            Some(judge) => format!("judge {judge}"),
            None => format!("chat {}", response.model_id),
        };
        span.end_time = Some(event.ts);
        span.duration_ms = Some(if span.kind == SpanKind::Chat {
            response.latency_ms
        } else {
            millis(event.ts - span.start_time)
        });
        span.status = SpanStatus::Ok;
        let attributes = &mut span.attributes;
        attributes.insert("gen_ai.operation.name".into(), json!("chat"));
        attributes.insert("gen_ai.provider.name".into(), json!(response.provider));
        attributes.insert("gen_ai.request.model".into(), json!(response.model_id));
        attributes.insert(
            "gen_ai.response.finish_reasons".into(),
            json!([response.stop_reason.as_str()]),
        );
        if let Some(model) = &response.model {
            attributes.insert("loom.model".into(), json!(model));
        }
        let role = event.role.clone().unwrap_or_else(|| "main".to_owned());
        attributes.insert("loom.role".into(), json!(role));
        for (key, value) in [
            ("loom.call_id", &response.call_id),
            ("loom.judge", &response.judge),
        ] {
            if let Some(value) = value {
                attributes.insert(key.into(), json!(value));
            }
        }
        usage_attributes(attributes, &calls.usage, calls.cost_usd);
        attributes.insert("loom.latency_ms".into(), json!(calls.latency_ms));
        attributes.insert("loom.attempts".into(), json!(calls.attempts));
        attributes.insert("loom.calls".into(), json!(calls.outputs.len()));
        attributes.insert("gen_ai.output.messages".into(), json!(calls.outputs));
    }

    fn tool_called(&mut self, event: &Event, called: &ToolCalled) {
        let at = self.open(event, SpanKind::Tool);
        self.launched.insert(at);
        let span = &mut self.spans[at];
        span.kind = SpanKind::Tool;
        tool_names(span, &called.tool_name, &called.call_id);
        let attributes = &mut span.attributes;
        attributes.insert("loom.tool_kind".into(), json!(called.tool_kind));
        attributes.insert(
            "gen_ai.tool.call.arguments".into(),
            called.arguments.clone(),
        );
        if called.resumed {
            attributes.insert("loom.resumed".into(), json!(true));
        }
        if let Some(child) = &called.child_run_id {
            attributes.insert("loom.child_run_id".into(), json!(child));
        }
    }

    fn tool_completed(&mut self, event: &Event, completed: &ToolCompleted) {
        let at = self.open(event, SpanKind::Tool);
        let launched = self.launched.contains(&at);
        let arguments = self
            .arguments
            .get(&(event.run_id.clone(), completed.call_id.clone()))
            .cloned();
        let span = &mut self.spans[at];
        span.kind = SpanKind::Tool;
        tool_names(span, &completed.tool_name, &completed.call_id);
        span.end_time = Some(event.ts);
        span.duration_ms = Some(if launched {
            completed.latency_ms
        } else {
            millis(event.ts - span.start_time)
        });
        let output = &completed.output;
        span.status = if output.is_error {
            SpanStatus::Error
        } else {
            SpanStatus::Ok
        };
        let attributes = &mut span.attributes;
        if !launched {
            attributes.insert("loom.refused".into(), json!(true));
            if let Some(arguments) = arguments {
                attributes
                    .entry("gen_ai.tool.call.arguments".into())
                    .or_insert(arguments);
            }
        }
        attributes.insert("loom.latency_ms".into(), json!(completed.latency_ms));
        attributes.insert("loom.size".into(), json!(completed.size));
        attributes.insert("loom.is_error".into(), json!(output.is_error));
        if let Some(uri) = &output.offloaded {
            attributes.insert("loom.offloaded".into(), json!(uri));
        }
        for (key, on) in [
            ("loom.unverified", output.unverified),
            ("loom.fallback", output.fallback),
        ] {
            if on {
                attributes.insert(key.into(), json!(true));
            }
        }
        // A sub-agent's consumption (its tokens and cost), or a role's cost.
        match &completed.usage {
            Some(usage) => usage_attributes(attributes, usage, completed.cost_usd),
            None if completed.cost_usd > 0.0 => {
                attributes.insert("loom.cost_usd".into(), json!(completed.cost_usd));
            }
            None => {}
        }
        attributes.insert(
            "gen_ai.tool.call.result".into(),
            json!(output.visible_text()),
        );
    }

    /// A judge's verdict goes to the span of the judge's model call it follows (journaled in
    /// the run's span); without one, it is an event of its own span.
    fn judge_evaluated(&mut self, event: &Event, verdict: &JudgeEvaluated) {
        let judged = self.spans.iter().rposition(|span| {
            span.kind == SpanKind::Judge
                && span.run_id == event.run_id
                && span.text("loom.judge") == Some(verdict.judge.as_str())
                && !span.attributes.contains_key("loom.judge.passed")
        });
        let Some(at) = judged else {
            let at = self.open(event, kind_of(event));
            self.spans[at].events.push(span_event(event));
            return;
        };
        let span = &mut self.spans[at];
        let criteria: Vec<Value> = verdict
            .criteria
            .iter()
            .map(|c| {
                json!({"name": c.name, "score": c.score, "min_score": c.min_score,
                       "blocking": c.blocking})
            })
            .collect();
        let reasons: BTreeMap<&str, &str> = verdict
            .criteria
            .iter()
            .filter_map(|c| c.reason.as_deref().map(|r| (c.name.as_str(), r)))
            .collect();
        let attributes = &mut span.attributes;
        attributes.insert("loom.judge.target".into(), json!(verdict.target));
        attributes.insert("loom.judge.passed".into(), json!(verdict.passed));
        attributes.insert("loom.judge.blocked".into(), json!(verdict.blocked));
        attributes.insert("loom.judge.criteria".into(), json!(criteria));
        if let Some(attempt) = verdict.attempt {
            attributes.insert("loom.judge.attempt".into(), json!(attempt));
        }
        if !reasons.is_empty() {
            attributes.insert("loom.reasons".into(), json!(reasons));
        }
        span.end_time = Some(event.ts);
        span.duration_ms = Some(millis(event.ts - span.start_time));
    }

    /// An approval event: the span it opened (kind other) ends with the decision, and any span
    /// holding one says where the approval stands (`loom.approval`).
    fn note_approval(&mut self, at: usize, event: &Event) {
        let (state, tool) = match &event.payload {
            Payload::ApprovalRequested(p) => ("waiting", &p.tool_name),
            Payload::ApprovalGranted(p) => ("granted", &p.tool_name),
            Payload::ApprovalRejected(p) => ("rejected", &p.tool_name),
            Payload::ApprovalExpired(p) => ("expired", &p.tool_name),
            _ => return,
        };
        let span = &mut self.spans[at];
        span.attributes.insert("loom.approval".into(), json!(state));
        if span.kind != SpanKind::Other {
            return;
        }
        span.name = format!("approval {tool}");
        span.attributes
            .insert("gen_ai.tool.name".into(), json!(tool));
        if state != "waiting" {
            span.end_time = Some(event.ts);
            span.duration_ms = Some(millis(event.ts - span.start_time));
            span.status = SpanStatus::Ok;
        }
    }
}

/// The kind of span a new span id opened by `event` stands for.
fn kind_of(event: &Event) -> SpanKind {
    let (call_id, judge) = match &event.payload {
        Payload::RunStarted(_) | Payload::RunCompleted(_) | Payload::RunFailed(_) => {
            return SpanKind::Run;
        }
        Payload::RunCancelled(_) | Payload::RunTransitioned(_) | Payload::MessageUser(_) => {
            return SpanKind::Run;
        }
        Payload::StepStarted(_) | Payload::StepCompleted(_) => return SpanKind::Step,
        Payload::ToolCalled(_)
        | Payload::ToolCompleted(_)
        | Payload::IdempotencyRecorded(_)
        | Payload::IdempotencyReused(_) => return SpanKind::Tool,
        Payload::ApprovalRequested(_)
        | Payload::ApprovalGranted(_)
        | Payload::ApprovalRejected(_)
        | Payload::ApprovalExpired(_) => return SpanKind::Other,
        Payload::PolicyDecided(p) => (p.call_id.as_ref(), None),
        Payload::GuardChecked(p) => (p.call_id.as_ref(), None),
        Payload::ArtifactStored(p) => (p.call_id.as_ref(), None),
        Payload::ModelResponded(p) => (p.call_id.as_ref(), p.judge.as_ref()),
        Payload::ModelRetried(p) => (p.call_id.as_ref(), p.judge.as_ref()),
        Payload::ModelFellBack(p) => (p.call_id.as_ref(), p.judge.as_ref()),
        Payload::CircuitOpened(p) => (p.call_id.as_ref(), p.judge.as_ref()),
        _ => (None, None),
    };
    let model_event = matches!(
        event.payload,
        Payload::ModelResponded(_)
            | Payload::ModelRetried(_)
            | Payload::ModelFellBack(_)
            | Payload::CircuitOpened(_)
    );
    match (call_id, judge, model_event) {
        (_, Some(_), _) => SpanKind::Judge,
        (Some(_), None, true) => SpanKind::Model,
        (Some(_), None, false) => SpanKind::Tool,
        (None, None, _) => SpanKind::Other,
    }
}

/// Milliseconds of a time span (0 when it runs backwards).
fn millis(delta: TimeDelta) -> f64 {
    delta.num_microseconds().unwrap_or(0).max(0) as f64 / 1000.0
}

/// A duration in milliseconds as a time span.
fn delta(ms: f64) -> TimeDelta {
    TimeDelta::microseconds((ms * 1000.0) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events of a reference journal, or `None` on a clone without `../shared`.
    fn reference(name: &str) -> Option<Vec<Event>> {
        let text = loom_testkit::shared::text(&format!("reference/journals/{name}"))?;
        Some(
            text.lines()
                .map(|line| Event::from_json(line).expect("a reference event"))
                .collect(),
        )
    }

    /// `(kind, name, parent's name)` of every span, in order.
    fn shape(trace: &Trace) -> Vec<(SpanKind, String, String)> {
        trace
            .spans
            .iter()
            .map(|span| {
                let parent = trace
                    .spans
                    .iter()
                    .find(|p| Some(&p.span_id) == span.parent_span_id.as_ref())
                    .map_or(String::new(), |p| p.name.clone());
                (span.kind, span.name.clone(), parent)
            })
            .collect()
    }

    #[test]
    fn a_plain_run_is_a_run_span_over_steps_over_calls() {
        let Some(events) = reference("plain-run.jsonl") else {
            return;
        };
        let trace = Trace::from_events("plain-run-1", &events).unwrap();
        assert_eq!(trace.trace_id, "plain-run-1");
        assert!(trace.content && trace.finished);
        let shape = shape(&trace);
        let names: Vec<(SpanKind, &str, &str)> = shape
            .iter()
            .map(|(k, n, p)| (*k, n.as_str(), p.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                (SpanKind::Run, "invoke_agent demo", ""),
                (SpanKind::Step, "step 1", "invoke_agent demo"),
                (SpanKind::Chat, "chat fake-1", "step 1"),
                (SpanKind::Step, "step 2", "invoke_agent demo"),
                (SpanKind::Tool, "execute_tool calculer", "step 2"),
                (SpanKind::Step, "step 3", "invoke_agent demo"),
                (SpanKind::Chat, "chat fake-1", "step 3"),
            ]
        );
        let run = &trace.spans[0];
        assert_eq!(run.span_id, events[0].span_id);
        assert_eq!(run.status, SpanStatus::Ok);
        assert_eq!(run.text("loom.status"), Some("completed"));
        assert_eq!(run.end_time, Some(events[16].ts));
        // The run's transitions are its events; the lease is left out.
        let kinds: Vec<&str> = run.events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(kinds, ["run.transitioned"; 3]);
        let chat = &trace.spans[2];
        assert_eq!(chat.span_id, events[4].event_id);
        assert_eq!(chat.text("gen_ai.operation.name"), Some("chat"));
        assert_eq!(chat.text("loom.role"), Some("main"));
        let first = match &events[4].payload {
            Payload::ModelResponded(r) => r,
            _ => unreachable!(),
        };
        assert_eq!(chat.usage(), first.usage);
        assert_eq!(
            chat.attributes["gen_ai.usage.input_tokens"],
            json!(first.usage.prompt_tokens())
        );
        let tool = &trace.spans[4];
        assert_eq!(tool.text("gen_ai.tool.name"), Some("calculer"));
        assert_eq!(
            tool.attributes["gen_ai.tool.call.arguments"],
            json!({"expr": "12*7+3"})
        );
        assert_eq!(tool.text("gen_ai.tool.call.result"), Some("87"));
        assert!(!tool.flag("loom.refused"));
        // Step durations are the journal's.
        let step = &trace.spans[1];
        assert_eq!(step.text("loom.effect"), Some("model_call"));
        assert!(step.duration_ms.is_some_and(|ms| ms > 0.0));
    }

    #[test]
    fn roles_policies_and_refusals_find_their_spans() {
        let Some(events) = reference("policies-terminal-role.jsonl") else {
            return;
        };
        let trace = Trace::from_events("j3-run", &events).unwrap();
        let of = |kind: SpanKind| -> Vec<&Span> {
            trace.spans.iter().filter(|s| s.kind == kind).collect()
        };
        assert_eq!(of(SpanKind::Step).len(), 8);
        assert_eq!(of(SpanKind::Chat).len(), 4);
        // The call denied before launch: its span holds the decision and the refusal.
        let tools = of(SpanKind::Tool);
        assert_eq!(tools.len(), 4);
        let refused = tools[0];
        assert!(refused.flag("loom.refused"));
        assert_eq!(refused.status, SpanStatus::Error);
        assert_eq!(
            refused.attributes["gen_ai.tool.call.arguments"],
            json!({"numero": "42"})
        );
        assert_eq!(refused.events[0].name, "policy.decided");
        assert_eq!(refused.events[0].text("loom.decision"), Some("deny"));
        // A role's model call sits under its tool call.
        let role_call = tools[2];
        assert_eq!(role_call.text("loom.tool_kind"), Some("role"));
        let models = of(SpanKind::Model);
        assert_eq!(models.len(), 2);
        assert_eq!(models[0].parent_span_id.as_ref(), Some(&role_call.span_id));
        assert_eq!(models[0].text("loom.role"), Some("rediger_relance"));
        // The on_output decision and its repair are the run's events.
        let run = &trace.spans[0];
        let names: Vec<&str> = run
            .events
            .iter()
            .filter(|e| e.name != "run.transitioned")
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(names, ["policy.decided", "message.user"]);
        assert!(run.attributes.contains_key("gen_ai.input.messages"));
    }

    #[test]
    fn an_approval_is_a_span_of_its_own_ended_by_the_decision() {
        let Some(events) = reference("approval-granted.jsonl") else {
            return;
        };
        let trace = Trace::from_events("appr-run-1", &events).unwrap();
        let approval = trace
            .spans
            .iter()
            .find(|s| s.kind == SpanKind::Other)
            .unwrap();
        assert_eq!(approval.name, "approval calculer");
        assert_eq!(approval.text("loom.approval"), Some("granted"));
        assert_eq!(approval.end_time, Some(events[12].ts));
        let names: Vec<&str> = approval.events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["approval.requested", "approval.granted"]);
        let step = trace
            .spans
            .iter()
            .find(|s| Some(&s.span_id) == approval.parent_span_id.as_ref())
            .unwrap();
        assert_eq!(step.name, "step 2");
    }

    #[test]
    fn without_content_keeps_the_figures_and_says_what_went() {
        let Some(events) = reference("plain-run.jsonl") else {
            return;
        };
        let trace = Trace::from_events("plain-run-1", &events).unwrap();
        let mut masked = trace.clone();
        let removed = masked.strip();
        assert!(!masked.content);
        assert_eq!(masked.output, None);
        assert!(removed.contains(&"output".to_owned()), "{removed:?}");
        assert!(
            removed.contains(&"spans[4].attributes[\"gen_ai.tool.call.result\"]".to_owned()),
            "{removed:?}"
        );
        let text = serde_json::to_string(&masked).unwrap();
        assert!(
            !text.contains("12*7+3") && !text.contains("\"87\""),
            "{text}"
        );
        assert_eq!(masked.spans.len(), trace.spans.len());
        assert_eq!(masked.spans[2].usage(), trace.spans[2].usage());
        assert_eq!(trace.without_content(), masked);
    }
}
