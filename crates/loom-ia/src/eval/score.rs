//! What a run showed ([`Outcome`], read from its events) and its scoring against a case's
//! expectations, one [`Check`] each.

use loom_core::{Event, Payload, tool::ToolKind};
use serde::Serialize;
use serde_json::{Map, Value};

use super::{CalledSpec, CaseSpec, Compiled, CriterionSpec, EVAL_JUDGE, Matcher};

/// A tool call of a run (or of one of its sub-runs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallSeen {
    /// The tool.
    pub name: String,
    /// Its arguments.
    pub arguments: Value,
}

/// What a run showed, read from its events.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Outcome {
    /// How the run ended (`completed`, `failed`, `paused`, …).
    pub status: String,
    /// The answer's text.
    pub text: String,
    /// The answer's structured data, when there is one.
    pub data: Option<Value>,
    /// Tool calls of the run and its sub-runs (roles and sub-agents excluded), in order.
    pub calls: Vec<CallSeen>,
    /// Cost of the run's model calls, sub-runs included, the eval judge's left out.
    pub cost_usd: f64,
    /// Cost of the eval judge's calls.
    pub judge_cost_usd: f64,
    /// The eval judge's scores: (criterion, score, lowest passing score, reason).
    pub verdict: Vec<(String, f64, f64, Option<String>)>,
    /// Calls of side-effect tools without a double, each named with its tool (refused, never
    /// run).
    pub refused: Vec<String>,
    /// Input tokens of the run's model calls, sub-runs included, the eval judge's left out.
    pub input_tokens: u64,
    /// Output tokens of the same calls.
    pub output_tokens: u64,
    /// From the run's first event to its last, in milliseconds (its sub-runs within).
    pub latency_ms: i64,
    /// The session state once the run ended.
    pub state: Map<String, Value>,
}

impl Outcome {
    /// The outcome of the run tree of `events` (the root run's status, text and data given by
    /// its fold), with `refused` the side-effect calls refused for want of a double (the
    /// evaluation doubles' misses) and `state` the session state after the run. Events of
    /// other runs (a replayed conversation's history) are not counted.
    pub fn from_events(
        result: &crate::RunResult,
        events: &[Event],
        refused: Vec<String>,
        state: Map<String, Value>,
    ) -> Outcome {
        let mut outcome = Outcome {
            status: result.status.as_str().to_owned(),
            text: result.text.clone(),
            data: result.data.clone(),
            refused,
            state,
            ..Outcome::default()
        };
        let tree = || events.iter().filter(|e| e.root_run_id == result.run_id);
        if let (Some(first), Some(last)) = (tree().next(), tree().next_back()) {
            outcome.latency_ms = (last.ts - first.ts).num_milliseconds();
        }
        for event in tree() {
            let judged = event.role.as_deref() == Some("judge:eval");
            match &event.payload {
                Payload::ToolCalled(call)
                    if !matches!(call.tool_kind, ToolKind::Role | ToolKind::Agent) =>
                {
                    outcome.calls.push(CallSeen {
                        name: call.tool_name.clone(),
                        arguments: call.arguments.clone(),
                    });
                }
                Payload::ModelResponded(answer) if judged => {
                    outcome.judge_cost_usd += answer.cost_usd;
                }
                Payload::ModelResponded(answer) => {
                    outcome.cost_usd += answer.cost_usd;
                    outcome.input_tokens += answer.usage.input_tokens;
                    outcome.output_tokens += answer.usage.output_tokens;
                }
                Payload::ModelRetried(retry) if judged => {
                    outcome.judge_cost_usd += retry.cost_usd;
                }
                Payload::ModelRetried(retry) => outcome.cost_usd += retry.cost_usd,
                Payload::JudgeEvaluated(judged) if judged.judge == EVAL_JUDGE => {
                    // The last verdict counts (a run judged again after a repair).
                    outcome.verdict = judged
                        .criteria
                        .iter()
                        .map(|c| (c.name.clone(), c.score, c.min_score, c.reason.clone()))
                        .collect();
                }
                _ => {}
            }
        }
        outcome
    }
}

/// One expectation, scored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// The expectation, as written (`contains "87"`, `called prix_ttc {…}`).
    pub expectation: String,
    /// Whether it holds.
    pub passed: bool,
    /// What was found instead, when it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Check {
    fn new(expectation: String, passed: bool, detail: impl FnOnce() -> String) -> Check {
        Check {
            expectation,
            detail: (!passed).then(detail),
            passed,
        }
    }
}

/// Whether every key of `want` is in `got` with the same value (objects recursively; arrays
/// and scalars compared whole).
pub fn subset(want: &Value, got: &Value) -> bool {
    match (want, got) {
        (Value::Object(want), Value::Object(got)) => want
            .iter()
            .all(|(key, value)| got.get(key).is_some_and(|g| subset(value, g))),
        _ => want == got,
    }
}

/// What `value` shows of itself to a `matches` expectation: a string's text, any other value's
/// compact JSON.
fn shown(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The check of `label` (`field /total`, `state zone`) on `found` (absent: `missing` says why).
fn value_check(label: &str, matcher: &Matcher, found: Option<&Value>, missing: &str) -> Check {
    let (expectation, passed) = match matcher {
        Matcher::Equals(want) => (
            format!("{label} = {want}"),
            found.is_some_and(|v| v == want),
        ),
        Matcher::Matches(regex) => (
            format!("{label} matches /{}/", regex.as_str()),
            found.is_some_and(|v| regex.is_match(&shown(v))),
        ),
    };
    Check::new(expectation, passed, || match found {
        Some(value) => format!("found {value}"),
        None => missing.to_owned(),
    })
}

/// The output as JSON: its structured data, else its text read as JSON.
fn output_json(outcome: &Outcome) -> Result<Value, serde_json::Error> {
    outcome
        .data
        .clone()
        .map(Ok)
        .unwrap_or_else(|| serde_json::from_str::<Value>(outcome.text.trim()))
}

/// Scores `case` on `outcome`: one [`Check`] per expectation, in the order of the format
/// (status, contains, not_contains, matches, schema, fields, called, not_called, state, cost,
/// criteria), and first one failed check per side-effect call refused for want of a double.
pub(super) fn score(
    case: &CaseSpec,
    compiled: &Compiled,
    suite_ceiling: Option<f64>,
    outcome: &Outcome,
) -> Vec<Check> {
    let expect = &case.expect;
    let mut checks = Vec::new();
    for refused in &outcome.refused {
        checks.push(Check::new(
            "side-effect tools answered by doubles".into(),
            false,
            || format!("{refused}: refused, never run"),
        ));
    }
    let status = expect.status.as_deref().unwrap_or("completed");
    checks.push(Check::new(
        format!("status {status}"),
        outcome.status == status,
        || format!("the run ended {}", outcome.status),
    ));
    for text in &expect.contains {
        checks.push(Check::new(
            format!("contains {text:?}"),
            outcome.text.contains(text.as_str()),
            || "not in the answer".into(),
        ));
    }
    for text in &expect.not_contains {
        checks.push(Check::new(
            format!("not_contains {text:?}"),
            !outcome.text.contains(text.as_str()),
            || "in the answer".into(),
        ));
    }
    for regex in &compiled.matches {
        checks.push(Check::new(
            format!("matches /{}/", regex.as_str()),
            regex.is_match(&outcome.text),
            || "the answer does not match".into(),
        ));
    }
    if let Some(validator) = &compiled.schema {
        let value = output_json(outcome);
        let problem = match value {
            Ok(value) => validator
                .iter_errors(&value)
                .next()
                .map(|e| format!("at '{}': {e}", e.instance_path())),
            Err(e) => Some(format!("the output is not JSON ({e})")),
        };
        checks.push(Check {
            expectation: "schema".into(),
            passed: problem.is_none(),
            detail: problem,
        });
    }
    if !compiled.fields.is_empty() {
        let output = output_json(outcome);
        for (pointer, matcher) in &compiled.fields {
            let (found, missing) = match &output {
                Ok(value) => (value.pointer(pointer), "no value there".to_owned()),
                Err(e) => (None, format!("the output is not JSON ({e})")),
            };
            checks.push(value_check(
                &format!("field {pointer}"),
                matcher,
                found,
                &missing,
            ));
        }
    }
    for want in &expect.called {
        let name = want.name();
        let (label, found) = match want {
            CalledSpec::Name(_) => (
                format!("called {name}"),
                outcome.calls.iter().any(|c| c.name == name),
            ),
            CalledSpec::With { arguments, .. } => (
                format!("called {name} with {arguments}"),
                outcome
                    .calls
                    .iter()
                    .any(|c| c.name == name && subset(arguments, &c.arguments)),
            ),
        };
        checks.push(Check::new(label, found, || {
            let seen: Vec<String> = outcome
                .calls
                .iter()
                .filter(|c| c.name == name)
                .map(|c| c.arguments.to_string())
                .collect();
            if seen.is_empty() {
                format!("{name} was not called")
            } else {
                format!("{name} was called with {}", seen.join(", "))
            }
        }));
    }
    for name in &expect.not_called {
        let times = outcome.calls.iter().filter(|c| &c.name == name).count();
        checks.push(Check::new(format!("not_called {name}"), times == 0, || {
            format!("called {times} time(s)")
        }));
    }
    for (key, matcher) in &compiled.state {
        checks.push(value_check(
            &format!("state {key}"),
            matcher,
            outcome.state.get(key),
            "not in the session state",
        ));
    }
    if let Some(ceiling) = expect.max_cost_usd.or(suite_ceiling) {
        checks.push(Check::new(
            format!("cost at most {ceiling} $"),
            outcome.cost_usd <= ceiling,
            || format!("the run cost {:.6} $", outcome.cost_usd),
        ));
    }
    if !case.criteria.is_empty() {
        let names: Vec<String> = case
            .criteria
            .iter()
            .enumerate()
            .map(|(i, c)| match c {
                CriterionSpec::Rule(_) => format!("c{}", i + 1),
                CriterionSpec::Named { name, .. } => name.clone(),
            })
            .collect();
        for name in names {
            let scored = outcome.verdict.iter().find(|(n, ..)| *n == name);
            match scored {
                Some((_, score, min, reason)) => checks.push(Check::new(
                    format!("criterion {name} (at least {min:.2})"),
                    score >= min,
                    || {
                        format!(
                            "scored {score:.2}{}",
                            reason
                                .as_deref()
                                .map(|r| format!(": {r}"))
                                .unwrap_or_default()
                        )
                    },
                )),
                None => checks.push(Check::new(format!("criterion {name}"), false, || {
                    "the judge gave no score (the run ended before it was judged)".into()
                })),
            }
        }
    }
    checks
}
