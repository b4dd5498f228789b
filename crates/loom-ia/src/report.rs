//! Projections for people: the trace of a run (steps, model calls, tool calls) and its usage
//! by role and by model. Both are pure folds over the run's events.

use std::collections::BTreeMap;

use loom_core::{
    Event, RunState, RunStatus, Usage,
    event::{Effect, Outcome, Payload},
    state::FoldError,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A run as a tree: steps, and in each the model calls and tool calls it made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    /// Run.
    pub run_id: String,
    /// Session.
    pub session_id: String,
    /// Tenant.
    pub tenant_id: String,
    /// Agent.
    pub agent: String,
    /// State.
    pub status: RunStatus,
    /// Whether the closing event was written.
    pub finished: bool,
    /// Orchestrator model calls.
    pub iterations: u32,
    /// Tokens.
    pub usage: Usage,
    /// Cost.
    pub cost_usd: f64,
    /// Sum of step durations.
    pub active_ms: f64,
    /// From `run.started` to the last event.
    pub duration_ms: f64,
    /// Final answer.
    pub output: Option<String>,
    /// Failure classification.
    pub error_type: Option<String>,
    /// Failure message.
    pub error: Option<String>,
    /// The steps, in order.
    pub steps: Vec<TraceStep>,
}

/// One step of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceStep {
    /// Step number.
    pub step_no: u32,
    /// What it did.
    pub effect: Effect,
    /// Duration (absent while running).
    pub duration_ms: Option<f64>,
    /// How it ended (absent while running).
    pub outcome: Option<Outcome>,
    /// Calls made inside the step.
    pub calls: Vec<TraceCall>,
}

/// A call inside a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TraceCall {
    /// A model call.
    Model {
        /// Provider model name.
        model_id: String,
        /// Config model id.
        model: Option<String>,
        /// Slot ("main", a role).
        role: Option<String>,
        /// Latency.
        latency_ms: f64,
        /// Tokens.
        usage: Usage,
        /// Cost.
        cost_usd: f64,
        /// Why it stopped.
        stop_reason: String,
        /// Text answered.
        text: String,
        /// Tool calls asked: `(name, arguments)`.
        tool_calls: Vec<(String, Value)>,
    },
    /// A tool call.
    Tool {
        /// Call id.
        call_id: String,
        /// Tool.
        name: String,
        /// Arguments as written by the model.
        arguments: Value,
        /// Result text (absent while running).
        result: Option<String>,
        /// Whether the result is an error.
        is_error: bool,
        /// Latency.
        latency_ms: Option<f64>,
        /// Refused before launch (no `tool.called`).
        refused: bool,
    },
    /// A human approval asked for a call.
    Approval {
        /// Call id.
        call_id: String,
        /// Tool.
        name: String,
        /// "waiting", "granted", "rejected" or "expired".
        status: String,
        /// Who decided.
        by: Option<String>,
        /// Why it was asked.
        reason: String,
        /// Why it was decided so.
        decision_reason: Option<String>,
        /// Corrected arguments of a grant.
        arguments: Option<Value>,
    },
}

impl Trace {
    /// The trace of `run_id` from its events.
    pub fn from_events(run_id: &str, events: &[Event]) -> Result<Trace, FoldError> {
        let state = RunState::fold(run_id, events)?;
        let mine: Vec<&Event> = events.iter().filter(|e| e.run_id == run_id).collect();
        let mut steps: Vec<TraceStep> = Vec::new();
        let mut arguments: BTreeMap<String, Value> = BTreeMap::new();
        for event in &mine {
            match &event.payload {
                Payload::StepStarted(step) => steps.push(TraceStep {
                    step_no: step.step_no,
                    effect: step.effect,
                    duration_ms: None,
                    outcome: None,
                    calls: Vec::new(),
                }),
                Payload::StepCompleted(done) => {
                    if let Some(step) = steps.iter_mut().rev().find(|s| s.step_no == done.step_no) {
                        step.duration_ms = Some(done.duration_ms);
                        step.outcome = Some(done.outcome);
                    }
                }
                Payload::ModelResponded(response) => {
                    let tool_calls: Vec<(String, Value)> = response
                        .message
                        .tool_calls()
                        .map(|(id, name, args)| {
                            arguments.insert(id.to_owned(), args.clone());
                            (name.to_owned(), args.clone())
                        })
                        .collect();
                    if let Some(step) = steps.last_mut() {
                        step.calls.push(TraceCall::Model {
                            model_id: response.model_id.clone(),
                            model: response.model.clone(),
                            role: event.role.clone(),
                            latency_ms: response.latency_ms,
                            usage: response.usage,
                            cost_usd: response.cost_usd,
                            stop_reason: response.stop_reason.as_str().to_owned(),
                            text: response.message.text(),
                            tool_calls,
                        });
                    }
                }
                Payload::ToolCalled(called) => {
                    if let Some(step) = steps.last_mut() {
                        step.calls.push(TraceCall::Tool {
                            call_id: called.call_id.clone(),
                            name: called.tool_name.clone(),
                            arguments: called.arguments.clone(),
                            result: None,
                            is_error: false,
                            latency_ms: None,
                            refused: false,
                        });
                    }
                }
                Payload::ToolCompleted(completed) => {
                    let Some(step) = steps.last_mut() else {
                        continue;
                    };
                    let existing = step.calls.iter_mut().find(|c| {
                        matches!(c, TraceCall::Tool { call_id, result: None, .. } if *call_id == completed.call_id)
                    });
                    let text = completed.output.visible_text();
                    match existing {
                        Some(TraceCall::Tool {
                            result,
                            is_error,
                            latency_ms,
                            ..
                        }) => {
                            *result = Some(text);
                            *is_error = completed.output.is_error;
                            *latency_ms = Some(completed.latency_ms);
                        }
                        _ => step.calls.push(TraceCall::Tool {
                            call_id: completed.call_id.clone(),
                            name: completed.tool_name.clone(),
                            arguments: arguments
                                .get(&completed.call_id)
                                .cloned()
                                .unwrap_or(Value::Null),
                            result: Some(text),
                            is_error: completed.output.is_error,
                            latency_ms: Some(completed.latency_ms),
                            refused: true,
                        }),
                    }
                }
                Payload::ApprovalRequested(requested) => {
                    if let Some(step) = steps.last_mut() {
                        step.calls.push(TraceCall::Approval {
                            call_id: requested.call_id.clone(),
                            name: requested.tool_name.clone(),
                            status: "waiting".into(),
                            by: None,
                            reason: requested.reason.clone(),
                            decision_reason: None,
                            arguments: None,
                        });
                    }
                }
                Payload::ApprovalGranted(p) => settle_approval(
                    &mut steps,
                    &p.call_id,
                    "granted",
                    Some(&p.by),
                    p.reason.as_deref(),
                    p.arguments.as_ref(),
                ),
                Payload::ApprovalRejected(p) => settle_approval(
                    &mut steps,
                    &p.call_id,
                    "rejected",
                    Some(&p.by),
                    p.reason.as_deref(),
                    None,
                ),
                Payload::ApprovalExpired(p) => {
                    settle_approval(&mut steps, &p.call_id, "expired", None, None, None);
                }
                _ => {}
            }
        }
        let duration_ms = (state.updated_at - state.started_at)
            .num_microseconds()
            .unwrap_or(0) as f64
            / 1000.0;
        Ok(Trace {
            run_id: state.run_id.clone(),
            session_id: state.session_id.clone(),
            tenant_id: state.tenant_id.clone(),
            agent: state.agent.clone().unwrap_or_default(),
            status: state.status,
            finished: state.finished,
            iterations: state.iterations,
            usage: state.usage,
            cost_usd: state.cost_usd,
            active_ms: state.active_ms,
            duration_ms,
            output: state.output_text(),
            error_type: state.error_type.clone(),
            error: state.error.clone(),
            steps,
        })
    }
}

/// Records the decision on the last waiting request of `call_id` in the trace.
fn settle_approval(
    steps: &mut [TraceStep],
    id: &str,
    decided: &str,
    who: Option<&str>,
    why: Option<&str>,
    corrected: Option<&Value>,
) {
    let waiting = steps.iter_mut().rev().flat_map(|s| s.calls.iter_mut().rev()).find(|c| {
        matches!(c, TraceCall::Approval { call_id, status, .. } if call_id == id && status == "waiting")
    });
    if let Some(TraceCall::Approval {
        status,
        by,
        decision_reason,
        arguments,
        ..
    }) = waiting
    {
        *status = decided.to_owned();
        *by = who.map(str::to_owned);
        *decision_reason = why.map(str::to_owned);
        *arguments = corrected.cloned();
    }
}

/// Calls, tokens and cost of a group of model calls.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageLine {
    /// Model calls.
    pub calls: u32,
    /// Tokens.
    pub usage: Usage,
    /// Cost.
    pub cost_usd: f64,
}

impl UsageLine {
    fn add(&mut self, usage: &Usage, cost: f64) {
        self.calls += 1;
        self.usage.add(usage);
        self.cost_usd += cost;
    }
}

/// Tokens and cost of a run, in total, by role and by model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageReport {
    /// Run.
    pub run_id: String,
    /// Everything.
    pub total: UsageLine,
    /// By slot ("main", role names, "judge:<n>").
    pub roles: BTreeMap<String, UsageLine>,
    /// By model, keyed `"<config id> (<provider model>)"`.
    pub models: BTreeMap<String, UsageLine>,
}

impl UsageReport {
    /// The report of `run_id` from its events.
    pub fn from_events(run_id: &str, events: &[Event]) -> UsageReport {
        let mut report = UsageReport {
            run_id: run_id.to_owned(),
            ..UsageReport::default()
        };
        for event in events.iter().filter(|e| e.run_id == run_id) {
            if let Payload::ModelResponded(response) = &event.payload {
                let role = event.role.clone().unwrap_or_else(|| "main".to_owned());
                let model = match &response.model {
                    Some(id) => format!("{id} ({})", response.model_id),
                    None => response.model_id.clone(),
                };
                report.total.add(&response.usage, response.cost_usd);
                report
                    .roles
                    .entry(role)
                    .or_default()
                    .add(&response.usage, response.cost_usd);
                report
                    .models
                    .entry(model)
                    .or_default()
                    .add(&response.usage, response.cost_usd);
            }
        }
        report
    }
}
