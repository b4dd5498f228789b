//! Usage reports: the tokens and cost of a run (its sub-runs included), of a session, or of a
//! tenant over a UTC day or month, as one shape ([`UsageReport`]: `total`, `runs`, `roles`,
//! `models`, plus `agents`). Pure folds over journal events.
//!
//! Every breakdown partitions the total: each model call of the report counts once in
//! `total`, once in the run that made it (`runs`, its own calls), once under its slot
//! (`roles`), its agent (`agents`) and its model (`models`). A sub-run's roll-up (its calls and
//! its own sub-runs', all the way down) is `runs[id].with_sub_runs`.

use std::{
    borrow::Borrow,
    collections::{BTreeMap, HashMap},
};

use chrono::{DateTime, Utc};
use loom_core::{Event, RunStatus, Usage, event::Payload};
use serde::{Deserialize, Serialize};

use crate::budget::Period;

/// Calls, tokens and cost of a group of model calls.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UsageLine {
    /// Model calls (a billed failed attempt adds its tokens and cost, not a call).
    pub calls: u32,
    /// Tokens.
    pub usage: Usage,
    /// Cost in dollars.
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

/// A run in a usage report: where it sits in its tree, its own model calls (`calls`, `usage`,
/// `cost_usd`, as in every line of the report), and those of its sub-runs rolled up with them
/// (`with_sub_runs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunUsage {
    /// Run.
    pub run_id: String,
    /// Session.
    pub session_id: String,
    /// Agent.
    pub agent: Option<String>,
    /// State (as of the report).
    pub status: RunStatus,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// The run that opened it (a sub-agent's run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
    /// The parent's call that opened it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// Depth in its run tree (0 for a root run).
    pub depth: u32,
    /// The run's own model calls.
    #[serde(flatten)]
    pub own: UsageLine,
    /// Its own model calls and those of its sub-runs, all the way down.
    pub with_sub_runs: UsageLine,
}

/// Tokens and cost, the reference's report shape (`total`, `runs`, `roles`, `models`) for a
/// run, a session or a tenant's period:
///
/// - a run's report (`run_id` set) covers the run and its sub-runs, all the way down;
/// - a session's (`session_id` set, no `run_id`) covers every run of the session, sub-runs
///   included;
/// - a tenant's (`period`, `from`, `to` set) covers the root runs started in the window, with
///   their sub-runs.
///
/// `runs` holds each run covered, keyed by run id; `total` is the sum of `runs`, of `roles`,
/// of `agents` and of `models` alike.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UsageReport {
    /// Tenant.
    pub tenant_id: String,
    /// The run reported on (a run's report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The session reported on, or the run's session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Day or month (a tenant's report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<Period>,
    /// First instant of the window (UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<DateTime<Utc>>,
    /// First instant after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<DateTime<Utc>>,
    /// Every model call covered.
    pub total: UsageLine,
    /// Each run covered with its own calls, keyed by run id.
    pub runs: BTreeMap<String, RunUsage>,
    /// Calls by slot: `main`, a role's name, `judge:<name>` (sub-runs' calls included).
    pub roles: BTreeMap<String, UsageLine>,
    /// Calls by the agent whose run made them.
    pub agents: BTreeMap<String, UsageLine>,
    /// Calls by model, keyed `"<config id> (<provider model>)"`.
    pub models: BTreeMap<String, UsageLine>,
}

impl UsageReport {
    /// The report of `run_id` (its sub-runs included) from the events of its session; a run's
    /// own events give the same report without its sub-runs. An unknown run reports nothing.
    pub fn from_events<E: Borrow<Event>>(run_id: &str, events: &[E]) -> UsageReport {
        let ledger = Ledger::new(events);
        let Some(at) = ledger.find(run_id) else {
            return UsageReport {
                tenant_id: events
                    .first()
                    .map(|e| e.borrow().tenant_id.clone())
                    .unwrap_or_default(),
                run_id: Some(run_id.to_owned()),
                ..UsageReport::default()
            };
        };
        let node = &ledger.nodes[at];
        let mut report = UsageReport {
            tenant_id: node.tenant_id.clone(),
            run_id: Some(run_id.to_owned()),
            session_id: Some(node.session_id.clone()),
            ..UsageReport::default()
        };
        report.add_tree(&ledger, at);
        report
    }

    /// The report of a session from its events: every run, sub-runs included.
    pub fn for_session(tenant_id: &str, session_id: &str, events: &[Event]) -> UsageReport {
        let ledger = Ledger::new(events);
        let mut report = UsageReport {
            tenant_id: tenant_id.to_owned(),
            session_id: Some(session_id.to_owned()),
            ..UsageReport::default()
        };
        for at in ledger.roots() {
            report.add_tree(&ledger, at);
        }
        report
    }

    /// The report of `tenant_id` over the `period` holding `at`, from the events of its
    /// sessions (`(session id, events)`): the root runs started in the window, each with its
    /// sub-runs.
    pub fn for_tenant(
        tenant_id: &str,
        period: Period,
        at: DateTime<Utc>,
        sessions: &[(String, Vec<Event>)],
    ) -> UsageReport {
        let (from, to) = period.window(at);
        let mut report = UsageReport {
            tenant_id: tenant_id.to_owned(),
            period: Some(period),
            from: Some(from),
            to: Some(to),
            ..UsageReport::default()
        };
        for (_, events) in sessions {
            let ledger = Ledger::new(events);
            for root in ledger.roots() {
                let started = ledger.nodes[root].started_at;
                if started >= from && started < to {
                    report.add_tree(&ledger, root);
                }
            }
        }
        report
    }

    /// The root runs covered (those no other covered run opened), in the order they started.
    pub fn root_runs(&self) -> Vec<&RunUsage> {
        let mut roots: Vec<&RunUsage> = self
            .runs
            .values()
            .filter(|run| {
                run.parent_run_id
                    .as_ref()
                    .is_none_or(|parent| !self.runs.contains_key(parent))
            })
            .collect();
        roots.sort_by_key(|run| run.started_at);
        roots
    }

    /// Adds the run `at` of `ledger` and its sub-runs, all the way down.
    fn add_tree(&mut self, ledger: &Ledger, at: usize) {
        let mut pending = vec![(at, 0usize)];
        while let Some((at, depth)) = pending.pop() {
            let node = &ledger.nodes[at];
            let own = &node.own;
            self.total.merge(&own.total);
            merge_into(&mut self.roles, &own.roles);
            merge_into(&mut self.models, &own.models);
            self.agents
                .entry(node.agent.clone().unwrap_or_default())
                .or_default()
                .merge(&own.total);
            let entry = self
                .runs
                .entry(node.run_id.clone())
                .or_insert_with(|| RunUsage {
                    run_id: node.run_id.clone(),
                    session_id: node.session_id.clone(),
                    agent: node.agent.clone(),
                    status: node.status,
                    started_at: node.started_at,
                    parent_run_id: node.parent_run_id.clone(),
                    call_id: node.parent_call_id.clone(),
                    depth: node.depth,
                    own: UsageLine::default(),
                    with_sub_runs: UsageLine::default(),
                });
            // Two runs of one id (a journal older than the uniqueness check) add up.
            entry.own.merge(&own.total);
            entry.with_sub_runs.merge(&ledger.rolled(at, 0));
            if depth < MAX_DEPTH {
                pending.extend(ledger.children(at).map(|child| (child, depth + 1)));
            }
        }
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
    session_id: String,
    tenant_id: String,
    agent: Option<String>,
    parent_run_id: Option<String>,
    parent_call_id: Option<String>,
    depth: u32,
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
    fn new<E: Borrow<Event>>(events: &[E]) -> Ledger {
        let mut nodes: Vec<Node> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for event in events {
            let event = event.borrow();
            if let Payload::RunStarted(started) = &event.payload {
                if !index.contains_key(event.run_id.as_str()) {
                    index.insert(&event.run_id, nodes.len());
                    nodes.push(Node {
                        run_id: event.run_id.clone(),
                        session_id: event.session_id.clone(),
                        tenant_id: event.tenant_id.clone(),
                        agent: event.agent.clone(),
                        parent_run_id: started.parent_run_id.clone(),
                        parent_call_id: started.parent_call_id.clone(),
                        depth: started.depth,
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
}

/// `"<model> (<model_id>)"` as the reference labels a model (here the config id, then the
/// provider's model name), or the provider's model name alone.
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
        let depth = match parent {
            Some((_, "call-7")) => 2,
            Some(_) => 1,
            None => 0,
        };
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
                depth,
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

    /// Every breakdown of `report` adds up to its total.
    fn partitions(report: &UsageReport) {
        let sum = |lines: Vec<&UsageLine>| {
            let mut sum = UsageLine::default();
            lines.into_iter().for_each(|l| sum.merge(l));
            sum
        };
        close(
            &sum(report.runs.values().map(|r| &r.own).collect()),
            &report.total,
        );
        close(&sum(report.roles.values().collect()), &report.total);
        close(&sum(report.agents.values().collect()), &report.total);
        close(&sum(report.models.values().collect()), &report.total);
    }

    #[test]
    fn a_run_report_covers_its_sub_runs_run_by_run() {
        let report = UsageReport::from_events("r1", &session());
        assert_eq!(
            (report.run_id.as_deref(), report.session_id.as_deref()),
            (Some("r1"), Some("s1"))
        );
        close(&report.total, &line(7, 2850, 280, 0.285));
        partitions(&report);
        assert_eq!(report.runs.keys().collect::<Vec<_>>(), ["c1", "g1", "r1"]);
        // Each run's own calls, and its roll-up.
        let r1 = &report.runs["r1"];
        close(&r1.own, &line(4, 1950, 190, 0.195));
        close(&r1.with_sub_runs, &report.total);
        let c1 = &report.runs["c1"];
        assert_eq!(
            (c1.parent_run_id.as_deref(), c1.call_id.as_deref(), c1.depth),
            (Some("r1"), Some("call-1"), 1)
        );
        close(&c1.own, &line(2, 600, 60, 0.06));
        close(&c1.with_sub_runs, &line(3, 900, 90, 0.09));
        // Slots gather every run's calls; the billed failure counts tokens and cost, not a call.
        assert_eq!(
            report.roles.keys().collect::<Vec<_>>(),
            ["judge:ton", "main", "redacteur"]
        );
        close(&report.roles["main"], &line(5, 1750, 170, 0.175));
        close(&report.models["slow (SLOW)"], &line(3, 1100, 110, 0.11));
        close(&report.agents["recherche"], &line(2, 600, 60, 0.06));
        assert_eq!(
            report
                .root_runs()
                .iter()
                .map(|r| r.run_id.as_str())
                .collect::<Vec<_>>(),
            ["r1"]
        );

        // A sub-run's own report starts from it.
        let child = UsageReport::from_events("c1", &session());
        close(&child.total, &line(3, 900, 90, 0.09));
        assert_eq!(child.runs.keys().collect::<Vec<_>>(), ["c1", "g1"]);
        assert_eq!(child.root_runs()[0].run_id, "c1");
        // An unknown run reports nothing.
        assert_eq!(UsageReport::from_events("nope", &session()).total.calls, 0);
    }

    #[test]
    fn a_session_report_covers_every_run() {
        let report = UsageReport::for_session("default", "s1", &session());
        assert_eq!(report.run_id, None);
        assert_eq!(report.runs.len(), 4);
        assert_eq!(
            report
                .root_runs()
                .iter()
                .map(|r| r.run_id.as_str())
                .collect::<Vec<_>>(),
            ["r1", "r2"]
        );
        close(&report.total, &line(8, 3850, 380, 0.385));
        close(&report.runs["r2"].with_sub_runs, &line(1, 1000, 100, 0.1));
        partitions(&report);
        assert_eq!(
            report.agents.keys().collect::<Vec<_>>(),
            ["chef", "recherche", "source"]
        );
    }

    #[test]
    fn a_tenant_report_keeps_the_runs_started_in_its_window() {
        let sessions = vec![("s1".to_owned(), session())];
        let day = UsageReport::for_tenant("default", Period::Day, at(20), &sessions);
        assert_eq!(day.runs.len(), 4);
        close(&day.total, &line(8, 3850, 380, 0.385));
        partitions(&day);
        let (from, to) = Period::Day.window(at(0));
        assert_eq!((day.from, day.to), (Some(from), Some(to)));
        assert_eq!(day.period, Some(Period::Day));
        let next_day = UsageReport::for_tenant(
            "default",
            Period::Day,
            at(0) + chrono::TimeDelta::days(1),
            &sessions,
        );
        assert_eq!((next_day.runs.len(), next_day.total.calls), (0, 0));
        let month = UsageReport::for_tenant("default", Period::Month, at(0), &sessions);
        assert_eq!(month.root_runs().len(), 2);
    }
}
