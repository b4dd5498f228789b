//! The built-in policy `loom.budget`: run and session limits, checked before each orchestrator
//! model call (never while finalizing), ahead of the agent's own `before_model` policies.
//!
//! A run's limits are the agent's ([`BudgetLimits::run`]) tightened, key by key, by the run's
//! own budget (`run.started.budget`: the share a sub-agent received from its parent, or a
//! budget its caller gave). What a run spent is its folded usage: tokens and dollars of every
//! model call (roles, judges and retried attempts included) plus what its sub-agents report, and
//! its model calls. A root run also answers to the session limits: what the session's earlier
//! runs spent plus this run.
//!
//! Each limit reached for the first time in a run writes `budget.exceeded`; with
//! [`OnExceed::Stop`] the run then stops (`policy.decided` stop) and finishes with one last
//! answer without tools, so the overrun is bounded by that one generation; with
//! [`OnExceed::Warn`] the call goes on.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use loom_core::{
    Event, RunState,
    event::{BudgetExceeded, Payload, RunBudget},
    policy::{DecisionKind, Point},
    state::FoldError,
};

/// The name budget decisions are journaled under (`budget.exceeded.policy`,
/// `policy.decided.policy`).
pub const POLICY: &str = "loom.budget";

/// Limits of one run; `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RunLimits {
    /// Dollars.
    pub max_cost: Option<f64>,
    /// Tokens (input, cache and output).
    pub max_tokens: Option<u64>,
    /// Model calls (orchestrator, roles and judges).
    pub max_calls: Option<u64>,
}

impl RunLimits {
    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        self.max_cost.is_none() && self.max_tokens.is_none() && self.max_calls.is_none()
    }

    /// The tighter of `self` and `other`, key by key (a limit set on one side only is kept).
    pub fn tightened(&self, other: &RunLimits) -> RunLimits {
        RunLimits {
            max_cost: tighter(self.max_cost, other.max_cost, f64::min),
            max_tokens: tighter(self.max_tokens, other.max_tokens, u64::min),
            max_calls: tighter(self.max_calls, other.max_calls, u64::min),
        }
    }

    /// The journaled form (`run.started.budget`), `None` when no limit is set.
    pub fn to_run_budget(&self) -> Option<RunBudget> {
        (!self.is_empty()).then_some(RunBudget {
            max_cost: self.max_cost,
            max_tokens: self.max_tokens,
            max_calls: self.max_calls,
        })
    }
}

impl From<&RunBudget> for RunLimits {
    fn from(budget: &RunBudget) -> RunLimits {
        RunLimits {
            max_cost: budget.max_cost,
            max_tokens: budget.max_tokens,
            max_calls: budget.max_calls,
        }
    }
}

fn tighter<T: Copy>(a: Option<T>, b: Option<T>, min: fn(T, T) -> T) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(min(a, b)),
        (a, b) => a.or(b),
    }
}

/// Limits of one session: its earlier runs plus the current one; `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SessionLimits {
    /// Dollars.
    pub max_cost: Option<f64>,
    /// Tokens (input, cache and output).
    pub max_tokens: Option<u64>,
}

impl SessionLimits {
    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        self.max_cost.is_none() && self.max_tokens.is_none()
    }
}

/// What reaching a run or session limit does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnExceed {
    /// The run stops: it finishes with one last answer, without tools.
    #[default]
    Stop,
    /// Journaled only (`budget.exceeded`); the call goes on.
    Warn,
}

impl OnExceed {
    /// The journal string (`budget.exceeded.action`).
    pub fn as_str(self) -> &'static str {
        match self {
            OnExceed::Stop => "stop",
            OnExceed::Warn => "warn",
        }
    }
}

/// An agent's budgets (`budgets` merged with the agent's `budget`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BudgetLimits {
    /// Limits of each run of the agent.
    pub run: RunLimits,
    /// Limits of the session, for the agent's root runs.
    pub session: SessionLimits,
    /// What reaching a limit does.
    pub on_exceed: OnExceed,
}

/// Tokens, dollars and model calls spent.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spent {
    /// Tokens (input, cache and output).
    pub tokens: u64,
    /// Dollars.
    pub cost_usd: f64,
    /// Model calls.
    pub calls: u64,
}

impl Spent {
    /// What a folded run spent: its usage and cost (sub-agents included) and its model calls.
    pub fn of(state: &RunState) -> Spent {
        Spent {
            tokens: state.usage.total_tokens(),
            cost_usd: state.cost_usd,
            calls: u64::from(state.model_calls),
        }
    }

    /// `self` and `other` together.
    pub fn plus(self, other: Spent) -> Spent {
        Spent {
            tokens: self.tokens + other.tokens,
            cost_usd: self.cost_usd + other.cost_usd,
            calls: self.calls + other.calls,
        }
    }
}

/// The limits a run answers to: the agent's run limits tightened by the run's own budget
/// (`run.started.budget`).
pub fn run_limits(agent: Option<&BudgetLimits>, state: &RunState) -> RunLimits {
    let own = agent.map(|b| b.run).unwrap_or_default();
    match &state.budget {
        Some(budget) => own.tightened(&RunLimits::from(budget)),
        None => own,
    }
}

/// What one root run spent.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpent {
    /// Run.
    pub run_id: String,
    /// When it started (`run.started.ts`).
    pub started_at: DateTime<Utc>,
    /// What it spent, its sub-agents included.
    pub spent: Spent,
}

/// What each root run of a session spent, in the order the runs started, folded from the
/// session's events. Sub-agent runs are not listed: their spend counts in their root's, through
/// their calls' results (`tool.completed`) or, for a sub-run whose result never reached its
/// parent (still waiting for a human, or closed by a cancellation written from outside its
/// driver), directly.
pub fn root_runs_spent<E: std::borrow::Borrow<Event>>(
    events: &[E],
) -> Result<Vec<RunSpent>, FoldError> {
    let mut order: Vec<&str> = Vec::new();
    let mut runs: HashMap<&str, RunState> = HashMap::new();
    // Sub-runs by parent, with the call that opened each.
    let mut children: HashMap<&str, Vec<(&str, &str)>> = HashMap::new();
    // Calls that have their result: (run, call id).
    let mut answered: HashSet<(&str, &str)> = HashSet::new();
    for event in events {
        let event = event.borrow();
        if let Payload::ToolCompleted(done) = &event.payload {
            answered.insert((&event.run_id, &done.call_id));
        }
        match runs.get_mut(event.run_id.as_str()) {
            Some(state) => state.apply(event)?,
            None => {
                if let Payload::RunStarted(started) = &event.payload {
                    match &started.parent_run_id {
                        None => order.push(&event.run_id),
                        Some(parent) => children.entry(parent).or_default().push((
                            &event.run_id,
                            started.parent_call_id.as_deref().unwrap_or_default(),
                        )),
                    }
                    runs.insert(&event.run_id, RunState::start(event)?);
                }
            }
        }
    }
    Ok(order
        .into_iter()
        .filter_map(|run_id| runs.get(run_id))
        .map(|state| RunSpent {
            spent: Spent::of(state).plus(unreported(&state.run_id, &runs, &children, &answered)),
            started_at: state.started_at,
            run_id: state.run_id.clone(),
        })
        .collect())
}

/// Tokens and dollars of the descendants of `run_id` whose result never reached their parent,
/// which the parents' folds therefore lack (their model calls are not counted: a run's calls
/// are its own).
fn unreported(
    run_id: &str,
    runs: &HashMap<&str, RunState>,
    children: &HashMap<&str, Vec<(&str, &str)>>,
    answered: &HashSet<(&str, &str)>,
) -> Spent {
    let mut sum = Spent::default();
    for &(child, call) in children.get(run_id).map(Vec::as_slice).unwrap_or_default() {
        if !answered.contains(&(run_id, call))
            && let Some(state) = runs.get(child)
        {
            sum = sum.plus(Spent {
                calls: 0,
                ..Spent::of(state)
            });
        }
        sum = sum.plus(unreported(child, runs, children, answered));
    }
    sum
}

/// What the session's root runs started before `run_id` spent (all of them when `run_id` is
/// not among them).
pub fn session_spent<E: std::borrow::Borrow<Event>>(
    events: &[E],
    run_id: &str,
) -> Result<Spent, FoldError> {
    Ok(root_runs_spent(events)?
        .into_iter()
        .take_while(|run| run.run_id != run_id)
        .fold(Spent::default(), |sum, run| sum.plus(run.spent)))
}

/// The budget a sub-agent run receives from its parent: `part` (in `(0, 1]`) of what remains of
/// each of the parent's limits (`limits`, see [`run_limits`]) after what it `spent` (see
/// [`Spent::of`]), counts floored and at least 1. `None` when the parent has no limit.
pub fn share(limits: &RunLimits, spent: Spent, part: f64) -> Option<RunBudget> {
    let part = part.clamp(0.0, 1.0);
    let count = |limit: u64, used: u64| -> u64 {
        let remaining = limit.saturating_sub(used) as f64;
        ((remaining * part).floor() as u64).max(1)
    };
    RunLimits {
        max_cost: limits
            .max_cost
            .map(|limit| ((limit - spent.cost_usd).max(0.0)) * part),
        max_tokens: limits.max_tokens.map(|limit| count(limit, spent.tokens)),
        max_calls: limits.max_calls.map(|limit| count(limit, spent.calls)),
    }
    .to_run_budget()
}

/// What the budget decided before a model call.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    /// `budget.exceeded` for each limit newly reached, then `policy.decided` stop if the run
    /// stops.
    pub(crate) payloads: Vec<Payload>,
    /// Why the run stops, if it does.
    pub(crate) stop: Option<String>,
}

/// Checks a run's limits, and its session's for a root run (`session_before`: what the
/// session's earlier runs spent, `None` when session limits do not apply).
pub(crate) fn check(
    agent: Option<&BudgetLimits>,
    state: &RunState,
    session_before: Option<Spent>,
) -> Verdict {
    let run = run_limits(agent, state);
    let action = agent.map(|b| b.on_exceed).unwrap_or_default();
    let spent = Spent::of(state);
    let mut reached: Vec<Reached> = Vec::new();
    let mut consider = |scope: &'static str, limit: &'static str, amount: Amount, used: Amount| {
        if used.value() >= amount.value() {
            reached.push(Reached {
                scope,
                limit,
                amount,
                used,
            });
        }
    };
    if let Some(limit) = run.max_cost {
        consider(
            "run",
            "max_cost",
            Amount::Cost(limit),
            Amount::Cost(spent.cost_usd),
        );
    }
    if let Some(limit) = run.max_tokens {
        consider(
            "run",
            "max_tokens",
            Amount::Tokens(limit),
            Amount::Tokens(spent.tokens),
        );
    }
    if let Some(limit) = run.max_calls {
        consider(
            "run",
            "max_calls",
            Amount::Calls(limit),
            Amount::Calls(spent.calls),
        );
    }
    if let (Some(before), Some(limits), None) = (
        session_before,
        agent.map(|b| b.session),
        &state.parent_run_id,
    ) {
        let session = before.plus(spent);
        if let Some(limit) = limits.max_cost {
            let used = Amount::Cost(session.cost_usd);
            consider("session", "max_cost", Amount::Cost(limit), used);
        }
        if let Some(limit) = limits.max_tokens {
            let used = Amount::Tokens(session.tokens);
            consider("session", "max_tokens", Amount::Tokens(limit), used);
        }
    }
    let mut verdict = Verdict::default();
    for hit in &reached {
        if state
            .exceeded
            .contains(&format!("{}.{}", hit.scope, hit.limit))
        {
            continue;
        }
        tracing::info!(run_id = %state.run_id, scope = hit.scope, limit = hit.limit, action = action.as_str(), "budget reached");
        verdict
            .payloads
            .push(Payload::BudgetExceeded(BudgetExceeded {
                scope: hit.scope.to_owned(),
                limit: hit.limit.to_owned(),
                value: hit.amount.value(),
                spent: hit.used.value(),
                action: action.as_str().to_owned(),
                policy: Some(POLICY.to_owned()),
            }));
    }
    // A limit signalled earlier in the run still stops it (a resumed step, a run sent back to
    // its model after finalizing); it is not journaled twice.
    if action == OnExceed::Stop
        && let Some(first) = reached.first()
    {
        let reason = first.reason();
        verdict.payloads.push(crate::hooks::decided(
            POLICY,
            Point::BeforeModel,
            DecisionKind::Stop,
            Some(reason.clone()),
            None,
            false,
        ));
        verdict.stop = Some(reason);
    }
    verdict
}

/// A limit reached.
struct Reached {
    scope: &'static str,
    limit: &'static str,
    amount: Amount,
    used: Amount,
}

impl Reached {
    /// "run budget reached: 2 calls (limit 2 calls)".
    fn reason(&self) -> String {
        format!(
            "{} budget reached: {} (limit {})",
            self.scope, self.used, self.amount
        )
    }
}

/// An amount of a budget, formatted as people read it.
#[derive(Debug, Clone, Copy)]
enum Amount {
    Cost(f64),
    Tokens(u64),
    Calls(u64),
}

impl Amount {
    fn value(self) -> f64 {
        match self {
            Amount::Cost(dollars) => dollars,
            Amount::Tokens(n) | Amount::Calls(n) => n as f64,
        }
    }
}

impl std::fmt::Display for Amount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Amount::Cost(dollars) => write!(f, "{dollars:.5} $"),
            Amount::Tokens(1) => f.write_str("1 token"),
            Amount::Tokens(n) => write!(f, "{n} tokens"),
            Amount::Calls(1) => f.write_str("1 call"),
            Amount::Calls(n) => write!(f, "{n} calls"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tightening_keeps_the_smaller_limit_of_each_key() {
        let agent = RunLimits {
            max_cost: Some(1.0),
            max_tokens: None,
            max_calls: Some(10),
        };
        let own = RunLimits {
            max_cost: Some(0.25),
            max_tokens: Some(500),
            max_calls: Some(20),
        };
        assert_eq!(
            agent.tightened(&own),
            RunLimits {
                max_cost: Some(0.25),
                max_tokens: Some(500),
                max_calls: Some(10),
            }
        );
        assert_eq!(RunLimits::default().to_run_budget(), None);
    }

    #[test]
    fn a_share_is_part_of_what_remains_counts_floored_and_at_least_one() {
        let limits = RunLimits {
            max_cost: Some(0.01),
            max_tokens: Some(1000),
            max_calls: Some(4),
        };
        let spent = Spent {
            tokens: 400,
            cost_usd: 0.004,
            calls: 3,
        };
        let share = share(&limits, spent, 0.5).unwrap();
        assert!((share.max_cost.unwrap() - 0.003).abs() < 1e-12);
        assert_eq!(share.max_tokens, Some(300));
        // Half of the one call left is floored to 0, then raised to 1.
        assert_eq!(share.max_calls, Some(1));
        // Overspent: nothing left for dollars, still one call and one token.
        let over = Spent {
            tokens: 2000,
            cost_usd: 0.02,
            calls: 9,
        };
        let share = super::share(&limits, over, 1.0).unwrap();
        assert_eq!(
            (share.max_cost, share.max_tokens, share.max_calls),
            (Some(0.0), Some(1), Some(1))
        );
        assert_eq!(super::share(&RunLimits::default(), spent, 0.5), None);
    }

    #[test]
    fn amounts_read_as_people_write_them() {
        assert_eq!(Amount::Cost(0.002_31).to_string(), "0.00231 $");
        assert_eq!(Amount::Tokens(577).to_string(), "577 tokens");
        assert_eq!(Amount::Calls(1).to_string(), "1 call");
        let reached = Reached {
            scope: "run",
            limit: "max_calls",
            amount: Amount::Calls(2),
            used: Amount::Calls(2),
        };
        assert_eq!(
            reached.reason(),
            "run budget reached: 2 calls (limit 2 calls)"
        );
    }
}
