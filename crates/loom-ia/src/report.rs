//! Projections for people: the trace of a run (steps, model calls, tool calls), and usage
//! reports of a run, a session and a tenant over a period, by role, by sub-run or sub-agent and
//! by model. All are pure folds over journal events.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use loom_core::{
    Event, RunState, RunStatus, Usage,
    event::{Effect, Outcome, Payload},
    state::FoldError,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::budget::Period;

/// A run as a tree: steps, and in each the model calls and tool calls it made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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

    /// A failed attempt that was billed: its tokens and cost, not a call.
    fn add_attempt(&mut self, usage: &Usage, cost: f64) {
        self.usage.add(usage);
        self.cost_usd += cost;
    }

    fn merge(&mut self, other: &UsageLine) {
        self.calls += other.calls;
        self.usage.add(&other.usage);
        self.cost_usd += other.cost_usd;
    }
}

fn merge_into(into: &mut BTreeMap<String, UsageLine>, from: &BTreeMap<String, UsageLine>) {
    for (key, line) in from {
        into.entry(key.clone()).or_default().merge(line);
    }
}

/// Tokens and cost of a run, in total, by role, by sub-run and by model. A sub-agent's run
/// rolls up into its parent: `total` is the run's own calls (`roles`) plus its sub-runs
/// (`sub_runs`), and `models` counts every call of both.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UsageReport {
    /// Run.
    pub run_id: String,
    /// Everything, sub-runs included.
    pub total: UsageLine,
    /// The run's own calls, by slot (`main`, role names, `judge:<n>`).
    pub roles: BTreeMap<String, UsageLine>,
    /// Every call, sub-runs included, by model, keyed `"<config id> (<provider model>)"`.
    pub models: BTreeMap<String, UsageLine>,
    /// The sub-agent runs the run opened, in the order they started, each with its own
    /// sub-runs rolled up.
    #[serde(default)]
    pub sub_runs: Vec<SubRunUsage>,
}

/// A sub-agent run in a usage report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SubRunUsage {
    /// The child run.
    pub run_id: String,
    /// Its agent.
    pub agent: Option<String>,
    /// The parent's call that opened it.
    pub call_id: Option<String>,
    /// Its usage, its own sub-runs included.
    pub usage: UsageLine,
}

impl UsageReport {
    /// The report of `run_id` from the events of its session (a run's own events give the
    /// same report without its sub-runs).
    pub fn from_events(run_id: &str, events: &[Event]) -> UsageReport {
        let ledger = Ledger::new(events);
        let Some(at) = ledger.find(run_id) else {
            return UsageReport {
                run_id: run_id.to_owned(),
                ..UsageReport::default()
            };
        };
        let node = &ledger.nodes[at];
        let mut models = BTreeMap::new();
        ledger.models_into(at, &mut models, 0);
        UsageReport {
            run_id: run_id.to_owned(),
            total: ledger.rolled(at, 0),
            roles: node.own.roles.clone(),
            models,
            sub_runs: ledger
                .children(at)
                .map(|child| {
                    let sub = &ledger.nodes[child];
                    SubRunUsage {
                        run_id: sub.run_id.clone(),
                        agent: sub.agent.clone(),
                        call_id: sub.parent_call_id.clone(),
                        usage: ledger.rolled(child, 0),
                    }
                })
                .collect(),
        }
    }
}

/// A root run in a session or tenant report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunUsage {
    /// Run.
    pub run_id: String,
    /// Session.
    pub session_id: String,
    /// Agent.
    pub agent: Option<String>,
    /// State.
    pub status: RunStatus,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its usage, sub-runs included.
    pub usage: UsageLine,
}

/// Tokens and cost of a session: each root run (its sub-runs rolled up), and every call by
/// role, by sub-agent and by model. `total` is the sum of `runs`, of `roles` and `sub_agents`
/// together, and of `models`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SessionReport {
    /// Tenant.
    pub tenant_id: String,
    /// Session.
    pub session_id: String,
    /// Everything.
    pub total: UsageLine,
    /// The root runs, in the order they started.
    pub runs: Vec<RunUsage>,
    /// Calls of the root runs themselves, by slot (`main`, role names, `judge:<n>`).
    pub roles: BTreeMap<String, UsageLine>,
    /// Sub-agent runs, by agent (their own sub-runs rolled up).
    pub sub_agents: BTreeMap<String, UsageLine>,
    /// Every call, by model.
    pub models: BTreeMap<String, UsageLine>,
}

impl SessionReport {
    /// The report of a session from its events.
    pub fn from_events(tenant_id: &str, session_id: &str, events: &[Event]) -> SessionReport {
        let ledger = Ledger::new(events);
        let mut report = SessionReport {
            tenant_id: tenant_id.to_owned(),
            session_id: session_id.to_owned(),
            ..SessionReport::default()
        };
        let mut sum = Breakdown::default();
        for at in ledger.roots() {
            sum.add_root(&ledger, at);
            report.runs.push(ledger.run_usage(at, session_id));
        }
        (report.total, report.roles, report.sub_agents, report.models) =
            (sum.total, sum.roles, sum.sub_agents, sum.models);
        report
    }
}

/// Tokens and cost of a tenant over a UTC day or month: the root runs that started in it, by
/// agent, by role, by sub-agent and by model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TenantReport {
    /// Tenant.
    pub tenant_id: String,
    /// Day or month.
    pub period: Period,
    /// First instant of the window (UTC).
    pub from: DateTime<Utc>,
    /// First instant after it.
    pub to: DateTime<Utc>,
    /// Root runs started in the window.
    pub runs: u32,
    /// Sessions those runs belong to.
    pub sessions: u32,
    /// Everything.
    pub total: UsageLine,
    /// Root runs by agent (their sub-runs rolled up).
    pub agents: BTreeMap<String, UsageLine>,
    /// Calls of the root runs themselves, by slot.
    pub roles: BTreeMap<String, UsageLine>,
    /// Sub-agent runs, by agent.
    pub sub_agents: BTreeMap<String, UsageLine>,
    /// Every call, by model.
    pub models: BTreeMap<String, UsageLine>,
}

impl TenantReport {
    /// The report of `tenant_id` over the `period` holding `at`, from the events of its
    /// sessions (`(session id, events)`; sessions without a run in the window add nothing).
    pub fn from_sessions(
        tenant_id: &str,
        period: Period,
        at: DateTime<Utc>,
        sessions: &[(String, Vec<Event>)],
    ) -> TenantReport {
        let (from, to) = period.window(at);
        let mut sum = Breakdown::default();
        let mut agents: BTreeMap<String, UsageLine> = BTreeMap::new();
        let (mut runs, mut touched) = (0u32, 0u32);
        for (_, events) in sessions {
            let ledger = Ledger::new(events);
            let mut any = false;
            for at in ledger.roots() {
                let node = &ledger.nodes[at];
                if node.started_at < from || node.started_at >= to {
                    continue;
                }
                any = true;
                runs += 1;
                sum.add_root(&ledger, at);
                agents
                    .entry(node.agent.clone().unwrap_or_default())
                    .or_default()
                    .merge(&ledger.rolled(at, 0));
            }
            touched += u32::from(any);
        }
        TenantReport {
            tenant_id: tenant_id.to_owned(),
            period,
            from,
            to,
            runs,
            sessions: touched,
            total: sum.total,
            agents,
            roles: sum.roles,
            sub_agents: sum.sub_agents,
            models: sum.models,
        }
    }
}

/// Sums of root runs: total, their own calls by role, their sub-runs by agent, every call by
/// model.
#[derive(Default)]
struct Breakdown {
    total: UsageLine,
    roles: BTreeMap<String, UsageLine>,
    sub_agents: BTreeMap<String, UsageLine>,
    models: BTreeMap<String, UsageLine>,
}

impl Breakdown {
    fn add_root(&mut self, ledger: &Ledger, at: usize) {
        self.total.merge(&ledger.rolled(at, 0));
        merge_into(&mut self.roles, &ledger.nodes[at].own.roles);
        for child in ledger.children(at) {
            self.sub_agents
                .entry(ledger.nodes[child].agent.clone().unwrap_or_default())
                .or_default()
                .merge(&ledger.rolled(child, 0));
        }
        ledger.models_into(at, &mut self.models, 0);
    }
}

/// How deep sub-runs are followed (a journal whose parent links loop stops here).
const MAX_DEPTH: usize = 64;

/// The model calls of one run, as the reports count them.
#[derive(Default)]
struct Tally {
    total: UsageLine,
    roles: BTreeMap<String, UsageLine>,
    models: BTreeMap<String, UsageLine>,
}

/// A run of a session, as the reports see it.
struct Node {
    run_id: String,
    agent: Option<String>,
    parent_run_id: Option<String>,
    parent_call_id: Option<String>,
    started_at: DateTime<Utc>,
    status: RunStatus,
    own: Tally,
}

/// Every run of a session with its own model calls, in the order the runs started: one pass
/// over the events. Billed failed attempts (`model.retried` with usage) count their tokens and
/// cost, not a call.
struct Ledger {
    nodes: Vec<Node>,
}

impl Ledger {
    fn new(events: &[Event]) -> Ledger {
        let mut nodes: Vec<Node> = Vec::new();
        let mut index: std::collections::HashMap<&str, usize> = Default::default();
        for event in events {
            if let Payload::RunStarted(started) = &event.payload {
                if !index.contains_key(event.run_id.as_str()) {
                    index.insert(&event.run_id, nodes.len());
                    nodes.push(Node {
                        run_id: event.run_id.clone(),
                        agent: event.agent.clone(),
                        parent_run_id: started.parent_run_id.clone(),
                        parent_call_id: started.parent_call_id.clone(),
                        started_at: event.ts,
                        status: RunStatus::ReadyForModel,
                        own: Tally::default(),
                    });
                }
                continue;
            }
            let Some(&at) = index.get(event.run_id.as_str()) else {
                continue;
            };
            let node = &mut nodes[at];
            let role = event.role.clone().unwrap_or_else(|| "main".to_owned());
            match &event.payload {
                Payload::ModelResponded(response) => {
                    let model = model_key(response.model.as_deref(), &response.model_id);
                    let (usage, cost) = (&response.usage, response.cost_usd);
                    node.own.total.add(usage, cost);
                    node.own.roles.entry(role).or_default().add(usage, cost);
                    node.own.models.entry(model).or_default().add(usage, cost);
                }
                Payload::ModelRetried(retried)
                    if retried.usage.is_some() || retried.cost_usd > 0.0 =>
                {
                    let model = model_key(retried.model.as_deref(), &retried.model_id);
                    let usage = retried.usage.unwrap_or_default();
                    let cost = retried.cost_usd;
                    node.own.total.add_attempt(&usage, cost);
                    node.own
                        .roles
                        .entry(role)
                        .or_default()
                        .add_attempt(&usage, cost);
                    node.own
                        .models
                        .entry(model)
                        .or_default()
                        .add_attempt(&usage, cost);
                }
                Payload::RunTransitioned(transition) => node.status = transition.to_state,
                _ => {}
            }
        }
        Ledger { nodes }
    }

    fn find(&self, run_id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.run_id == run_id)
    }

    /// Runs opened by no other run of the session, in the order they started.
    fn roots(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&at| self.nodes[at].parent_run_id.is_none())
    }

    /// The sub-runs `at` opened, in the order they started.
    fn children(&self, at: usize) -> impl Iterator<Item = usize> + '_ {
        let parent = self.nodes[at].run_id.as_str();
        (0..self.nodes.len())
            .filter(move |&i| self.nodes[i].parent_run_id.as_deref() == Some(parent))
    }

    /// A run's calls and those of its sub-runs, all the way down.
    fn rolled(&self, at: usize, depth: usize) -> UsageLine {
        let mut line = self.nodes[at].own.total.clone();
        if depth < MAX_DEPTH {
            for child in self.children(at) {
                line.merge(&self.rolled(child, depth + 1));
            }
        }
        line
    }

    /// Adds the calls of `at` and its sub-runs, by model, to `into`.
    fn models_into(&self, at: usize, into: &mut BTreeMap<String, UsageLine>, depth: usize) {
        merge_into(into, &self.nodes[at].own.models);
        if depth < MAX_DEPTH {
            for child in self.children(at) {
                self.models_into(child, into, depth + 1);
            }
        }
    }

    fn run_usage(&self, at: usize, session_id: &str) -> RunUsage {
        let node = &self.nodes[at];
        RunUsage {
            run_id: node.run_id.clone(),
            session_id: session_id.to_owned(),
            agent: node.agent.clone(),
            status: node.status,
            started_at: node.started_at,
            usage: self.rolled(at, 0),
        }
    }
}

/// `"<config id> (<provider model>)"`, or the provider model alone.
fn model_key(config_id: Option<&str>, model_id: &str) -> String {
    match config_id {
        Some(id) => format!("{id} ({model_id})"),
        None => model_id.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use loom_core::{
        Message,
        event::{Envelope, ModelResponded, ModelRetried, RunContext, RunStarted},
        model::StopReason,
    };
    use serde_json::Map;

    use super::*;

    fn at(hour: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 29, hour, 0, 0).unwrap()
    }

    /// An event of `run` (agent `agent`, envelope role `role`) at `hour`.
    fn event(run: &str, agent: &str, role: Option<&str>, hour: u32, payload: Payload) -> Event {
        Event::new(
            Envelope {
                event_id: format!("{run}-{hour}-{}", payload.type_name()),
                ts: at(hour),
                tenant_id: "default".into(),
                session_id: "s1".into(),
                run_id: run.into(),
                root_run_id: run.into(),
                span_id: "span".into(),
                parent_span_id: None,
                agent: Some(agent.into()),
                role: role.map(str::to_owned),
            },
            payload,
        )
    }

    fn started(run: &str, agent: &str, parent: Option<(&str, &str)>, hour: u32) -> Event {
        event(
            run,
            agent,
            None,
            hour,
            Payload::RunStarted(RunStarted {
                kind: "normal".into(),
                context: RunContext {
                    tenant_id: "default".into(),
                    user_id: None,
                    metadata: Map::new(),
                },
                parent_run_id: parent.map(|p| p.0.to_owned()),
                parent_call_id: parent.map(|p| p.1.to_owned()),
                depth: u32::from(parent.is_some()),
                triggered_by: None,
                trigger: None,
                judges: "auto".into(),
                budget: None,
                state: Map::new(),
            }),
        )
    }

    /// A model call of `tokens` input and `tokens / 10` output tokens costing `cost`.
    fn call(run: &str, agent: &str, role: &str, model: &str, tokens: u64, cost: f64) -> Event {
        event(
            run,
            agent,
            Some(role),
            12,
            Payload::ModelResponded(ModelResponded {
                model_id: model.to_uppercase(),
                model: Some(model.into()),
                provider: "fake".into(),
                message: Message::assistant("ok"),
                usage: Usage {
                    input_tokens: tokens,
                    output_tokens: tokens / 10,
                    ..Usage::default()
                },
                cost_usd: cost,
                stop_reason: StopReason::End,
                latency_ms: 1.0,
                attempts: 1,
                request_hash: None,
                request_parts: Map::new(),
                call_id: (role != "main").then(|| "c0".to_owned()),
                judge: role.strip_prefix("judge:").map(str::to_owned),
            }),
        )
    }

    fn billed_failure(run: &str, agent: &str, tokens: u64, cost: f64) -> Event {
        event(
            run,
            agent,
            Some("main"),
            12,
            Payload::ModelRetried(ModelRetried {
                model_id: "FAST".into(),
                model: Some("fast".into()),
                provider: "fake".into(),
                attempt: 1,
                error_kind: "transient".into(),
                error: "cut".into(),
                http_status: None,
                delay_s: 0.5,
                call_id: None,
                judge: None,
                usage: Some(Usage {
                    input_tokens: tokens,
                    ..Usage::default()
                }),
                cost_usd: cost,
                r#final: false,
            }),
        )
    }

    /// Root `r1` (main, a role, a judge, a billed failure) opens `c1`, which opens `g1`; root
    /// `r2` starts later.
    fn session() -> Vec<Event> {
        vec![
            started("r1", "chef", None, 8),
            call("r1", "chef", "main", "fast", 100, 0.01),
            started("c1", "recherche", Some(("r1", "call-1")), 9),
            call("c1", "recherche", "main", "slow", 200, 0.02),
            started("g1", "source", Some(("c1", "call-7")), 10),
            call("g1", "source", "main", "fast", 300, 0.03),
            call("c1", "recherche", "main", "slow", 400, 0.04),
            call("r1", "chef", "redacteur", "slow", 500, 0.05),
            call("r1", "chef", "judge:ton", "fast", 600, 0.06),
            billed_failure("r1", "chef", 50, 0.005),
            call("r1", "chef", "main", "fast", 700, 0.07),
            started("r2", "chef", None, 14),
            call("r2", "chef", "main", "fast", 1000, 0.1),
        ]
    }

    fn line(calls: u32, input: u64, output: u64, cost: f64) -> UsageLine {
        UsageLine {
            calls,
            usage: Usage {
                input_tokens: input,
                output_tokens: output,
                ..Usage::default()
            },
            cost_usd: cost,
        }
    }

    fn close(a: &UsageLine, b: &UsageLine) {
        assert_eq!((a.calls, a.usage), (b.calls, b.usage));
        assert!((a.cost_usd - b.cost_usd).abs() < 1e-12, "{a:?} vs {b:?}");
    }

    #[test]
    fn a_run_report_rolls_its_sub_runs_up() {
        let report = UsageReport::from_events("r1", &session());
        close(&report.total, &line(7, 2850, 280, 0.285));
        assert_eq!(
            report.roles.keys().collect::<Vec<_>>(),
            ["judge:ton", "main", "redacteur"]
        );
        // The billed failure counts tokens and cost, not a call.
        close(&report.roles["main"], &line(2, 850, 80, 0.085));
        assert_eq!(report.sub_runs.len(), 1);
        let sub = &report.sub_runs[0];
        assert_eq!(
            (
                sub.run_id.as_str(),
                sub.agent.as_deref(),
                sub.call_id.as_deref()
            ),
            ("c1", Some("recherche"), Some("call-1"))
        );
        close(&sub.usage, &line(3, 900, 90, 0.09));
        // Own calls plus sub-runs make the total; so do the models.
        let mut sum = UsageLine::default();
        report.roles.values().for_each(|l| sum.merge(l));
        report.sub_runs.iter().for_each(|s| sum.merge(&s.usage));
        close(&sum, &report.total);
        let mut by_model = UsageLine::default();
        report.models.values().for_each(|l| by_model.merge(l));
        close(&by_model, &report.total);
        close(&report.models["slow (SLOW)"], &line(3, 1100, 110, 0.11));

        // A sub-run's own report starts from it.
        let child = UsageReport::from_events("c1", &session());
        close(&child.total, &line(3, 900, 90, 0.09));
        assert_eq!(child.sub_runs[0].run_id, "g1");
        // An unknown run reports nothing.
        assert_eq!(UsageReport::from_events("nope", &session()).total.calls, 0);
    }

    #[test]
    fn a_session_report_lists_root_runs_and_groups_sub_runs_by_agent() {
        let report = SessionReport::from_events("default", "s1", &session());
        let runs: Vec<(&str, u32)> = report
            .runs
            .iter()
            .map(|r| (r.run_id.as_str(), r.usage.calls))
            .collect();
        assert_eq!(runs, [("r1", 7), ("r2", 1)]);
        close(&report.total, &line(8, 3850, 380, 0.385));
        close(&report.roles["main"], &line(3, 1850, 180, 0.185));
        assert_eq!(report.sub_agents.keys().collect::<Vec<_>>(), ["recherche"]);
        close(&report.sub_agents["recherche"], &line(3, 900, 90, 0.09));
        let mut sum = UsageLine::default();
        report.roles.values().for_each(|l| sum.merge(l));
        report.sub_agents.values().for_each(|l| sum.merge(l));
        close(&sum, &report.total);
    }

    #[test]
    fn a_tenant_report_keeps_the_runs_started_in_its_window() {
        let sessions = vec![("s1".to_owned(), session())];
        let day = TenantReport::from_sessions("default", Period::Day, at(20), &sessions);
        assert_eq!((day.runs, day.sessions), (2, 1));
        close(&day.total, &line(8, 3850, 380, 0.385));
        assert_eq!(day.agents.keys().collect::<Vec<_>>(), ["chef"]);
        assert_eq!((day.from, day.to), Period::Day.window(at(0)));
        let next_day = TenantReport::from_sessions(
            "default",
            Period::Day,
            at(0) + chrono::TimeDelta::days(1),
            &sessions,
        );
        assert_eq!(
            (next_day.runs, next_day.sessions, next_day.total.calls),
            (0, 0, 0)
        );
        let month = TenantReport::from_sessions("default", Period::Month, at(0), &sessions);
        assert_eq!(month.runs, 2);
    }
}
