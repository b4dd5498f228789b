//! Evaluations: a YAML suite of cases run against an agent, each case under each variant, scored
//! per expectation (`loom eval`, [`crate::Loom::eval`]).
//!
//! This module holds what does no IO beyond reading the suite file: the suite format
//! ([`SuiteSpec`]), its loading with located errors ([`Suite::load`], [`Suite::from_yaml`]), the
//! compiled expectations and their scoring over a run's events ([`Suite::score`]), and the report
//! ([`EvalReport`]). Running the cases is `loom/eval.rs`.
//!
//! The format follows the reference's (`version`, `name`, `agent`, `tenant`, `max_cost_usd`,
//! `doubles`, `judge`, `variants`, `cases` with `input`, `state`, `expect` and `criteria`), with
//! `expect.schema` (a JSON Schema of the output) and `expect.max_cost_usd` added, `attachments`
//! per case, and a variant's `model`, `system` and `params` applied to the agent's main slot.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use loom_config::{ConfigError, ConfigErrorKind, YamlDocument};
use loom_core::{Event, Payload, tool::ToolKind};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::LoomError;

/// The name of the judge an evaluation adds to the agent to score a case's `criteria`
/// (`judge.evaluated` with `judge: eval`, model slot `judge:eval`).
pub const EVAL_JUDGE: &str = "eval";

/// Default lowest passing score of a criterion.
pub const DEFAULT_MIN_SCORE: f64 = 0.8;

/// A suite file, as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteSpec {
    /// Format version: `1`.
    pub version: u32,
    /// The suite's name, shown in reports.
    pub name: String,
    /// The agent every case runs.
    pub agent: String,
    /// The tenant the runs belong to (default `default`).
    #[serde(default)]
    pub tenant: Option<String>,
    /// Cost ceiling of every run, in dollars, unless a case sets its own
    /// (`expect.max_cost_usd`); the eval judge's cost is not counted.
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
    /// Results of side-effect tools, by tool name: a string is a text result, any other value a
    /// structured one. A side-effect tool called without one gets an error result, never runs.
    #[serde(default)]
    pub doubles: BTreeMap<String, Value>,
    /// The judge that scores the cases' `criteria`.
    #[serde(default)]
    pub judge: Option<JudgeSpec>,
    /// The variants each case runs under (none: the agent as configured, named `base`).
    #[serde(default)]
    pub variants: Vec<VariantSpec>,
    /// The cases (at least one).
    pub cases: Vec<CaseSpec>,
}

/// `judge:` of a suite.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeSpec {
    /// A model id of the configuration.
    pub model: String,
    /// Lowest passing score of a criterion that sets none (default 0.8).
    #[serde(default)]
    pub min_score: Option<f64>,
}

/// A variant: what changes in the agent for the runs of this variant.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantSpec {
    /// Name (`^[A-Za-z0-9_.-]{1,64}$`).
    pub name: String,
    /// A model id of the configuration, in place of the agent's main model.
    #[serde(default)]
    pub model: Option<String>,
    /// A system prompt in place of the agent's.
    #[serde(default)]
    pub system: Option<String>,
    /// Parameters merged over the main model's.
    #[serde(default)]
    pub params: Map<String, Value>,
}

/// A case: the run's input and what its outcome must show.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseSpec {
    /// Name (`^[A-Za-z0-9_.-]{1,64}$`).
    pub name: String,
    /// The user's message.
    pub input: String,
    /// Files attached to the message, relative to the suite file.
    #[serde(default)]
    pub attachments: Vec<PathBuf>,
    /// The session state the run opens with.
    #[serde(default)]
    pub state: Map<String, Value>,
    /// The expectations.
    #[serde(default)]
    pub expect: ExpectSpec,
    /// Criteria the suite's judge scores the answer on.
    #[serde(default)]
    pub criteria: Vec<CriterionSpec>,
}

/// `expect:` of a case.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectSpec {
    /// How the run must end (default `completed`).
    #[serde(default)]
    pub status: Option<String>,
    /// Texts the answer must contain.
    #[serde(default)]
    pub contains: Vec<String>,
    /// Texts the answer must not contain.
    #[serde(default)]
    pub not_contains: Vec<String>,
    /// Regular expressions (the `regex` crate's syntax) the answer must match.
    #[serde(default)]
    pub matches: Vec<String>,
    /// A JSON Schema the output must satisfy: its structured data, else its text read as JSON.
    #[serde(default)]
    pub schema: Option<Value>,
    /// Tools that must be called, by name or with arguments (a subset match).
    #[serde(default)]
    pub called: Vec<CalledSpec>,
    /// Tools that must not be called.
    #[serde(default)]
    pub not_called: Vec<String>,
    /// Cost ceiling of the run, in dollars (else the suite's).
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
}

/// A tool the run must call.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum CalledSpec {
    /// By name.
    Name(String),
    /// By name, with arguments that must be a subset of a call's.
    With {
        /// The tool.
        name: String,
        /// The arguments every key of which a call must have, with the same value
        /// (recursively for objects).
        arguments: Value,
    },
}

impl CalledSpec {
    fn name(&self) -> &str {
        match self {
            CalledSpec::Name(name) | CalledSpec::With { name, .. } => name,
        }
    }
}

/// A criterion of a case: a rule in words, or a named rule with its threshold.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum CriterionSpec {
    /// A rule; its name is `c<index>`.
    Rule(String),
    /// A named rule.
    Named {
        /// Name.
        name: String,
        /// The rule.
        rule: String,
        /// Lowest passing score (else the judge's `min_score`).
        #[serde(default)]
        min_score: Option<f64>,
    },
}

/// A loaded suite: its spec, where it was read from, and its compiled expectations.
#[derive(Debug, Clone)]
pub struct Suite {
    /// What the file says.
    pub spec: SuiteSpec,
    /// The directory attachments are relative to.
    pub dir: PathBuf,
    doc: YamlDocument,
    compiled: Vec<Compiled>,
}

/// A case's expectations, compiled once.
#[derive(Debug, Clone)]
struct Compiled {
    matches: Vec<regex::Regex>,
    schema: Option<std::sync::Arc<loom_schema::Validator>>,
}

/// Whether `name` is a valid case or variant name.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

impl Suite {
    /// Reads and checks the suite file `path`.
    pub fn load(path: &Path) -> Result<Suite, LoomError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| LoomError::Invalid(format!("{}: {e}", path.display())))?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Suite::from_yaml(&text, path, dir)
    }

    /// Checks the suite `text`; `display` names it in errors, `dir` is where its attachments
    /// are read from.
    pub fn from_yaml(
        text: &str,
        display: impl Into<PathBuf>,
        dir: impl Into<PathBuf>,
    ) -> Result<Suite, LoomError> {
        let doc = YamlDocument::parse(text, display).map_err(boxed)?;
        let spec: SuiteSpec = doc.typed().map_err(boxed)?;
        let invalid = |path: &str, message: String| {
            boxed(doc.error_at(path, ConfigErrorKind::Invalid, message))
        };
        if spec.version != 1 {
            return Err(invalid(
                "version",
                format!("unsupported version {} (expected 1)", spec.version),
            ));
        }
        if spec.cases.is_empty() {
            return Err(invalid("cases", "a suite needs at least one case".into()));
        }
        let cost = |key: &str, value: Option<f64>| match value {
            Some(value) if !(value >= 0.0 && value.is_finite()) => {
                Err(invalid(key, format!("{value} is not a cost in dollars")))
            }
            _ => Ok(()),
        };
        cost("max_cost_usd", spec.max_cost_usd)?;
        let mut seen = BTreeSet::new();
        for (index, variant) in spec.variants.iter().enumerate() {
            check_name(&variant.name, &mut seen, "variant")
                .map_err(|m| invalid(&format!("variants[{index}].name"), m))?;
        }
        let mut seen = BTreeSet::new();
        let mut compiled = Vec::with_capacity(spec.cases.len());
        for (index, case) in spec.cases.iter().enumerate() {
            let at = format!("cases[{index}]");
            check_name(&case.name, &mut seen, "case")
                .map_err(|m| invalid(&format!("{at}.name"), m))?;
            cost(
                &format!("{at}.expect.max_cost_usd"),
                case.expect.max_cost_usd,
            )?;
            if !case.criteria.is_empty() && spec.judge.is_none() {
                return Err(invalid(
                    &format!("{at}.criteria"),
                    "criteria are scored by the suite's judge: declare judge.model".into(),
                ));
            }
            for (c, criterion) in case.criteria.iter().enumerate() {
                if let CriterionSpec::Named {
                    min_score: Some(score),
                    ..
                } = criterion
                    && !(0.0..=1.0).contains(score)
                {
                    return Err(invalid(
                        &format!("{at}.criteria[{c}].min_score"),
                        format!("{score} is not between 0 and 1"),
                    ));
                }
            }
            let matches = case
                .expect
                .matches
                .iter()
                .enumerate()
                .map(|(m, pattern)| {
                    regex::RegexBuilder::new(pattern)
                        .size_limit(1 << 20)
                        .build()
                        .map_err(|e| {
                            invalid(
                                &format!("{at}.expect.matches[{m}]"),
                                format!("not a regular expression: {e}"),
                            )
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let schema = match &case.expect.schema {
                Some(schema) => Some(std::sync::Arc::new(loom_schema::compile(schema).map_err(
                    |e| {
                        invalid(
                            &format!("{at}.expect.schema"),
                            format!("not a JSON Schema: {e}"),
                        )
                    },
                )?)),
                None => None,
            };
            compiled.push(Compiled { matches, schema });
        }
        Ok(Suite {
            spec,
            dir: dir.into(),
            doc,
            compiled,
        })
    }

    /// An error located at `key_path` of the suite file.
    pub fn error_at(&self, key_path: &str, message: impl Into<String>) -> LoomError {
        boxed(
            self.doc
                .error_at(key_path, ConfigErrorKind::Reference, message),
        )
    }

    /// The variants the runs use: those declared, or one named `base` that changes nothing.
    pub fn variants(&self) -> Vec<VariantSpec> {
        if self.spec.variants.is_empty() {
            vec![VariantSpec {
                name: "base".into(),
                model: None,
                system: None,
                params: Map::new(),
            }]
        } else {
            self.spec.variants.clone()
        }
    }

    /// The criteria of case `index` as the engine's judge criteria (blocking none: the eval
    /// judge scores, it never refuses the answer).
    pub fn criteria(&self, index: usize) -> Vec<loom_engine::Criterion> {
        let fallback = self
            .spec
            .judge
            .as_ref()
            .and_then(|j| j.min_score)
            .unwrap_or(DEFAULT_MIN_SCORE);
        self.spec
            .cases
            .get(index)
            .map(|case| {
                case.criteria
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        let (name, rule, min) = match c {
                            CriterionSpec::Rule(rule) => (format!("c{}", i + 1), rule, None),
                            CriterionSpec::Named {
                                name,
                                rule,
                                min_score,
                            } => (name.clone(), rule, *min_score),
                        };
                        loom_engine::Criterion {
                            name,
                            rule: rule.clone(),
                            min_score: min.unwrap_or(fallback),
                            blocking: false,
                        }
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Scores case `index` against what its run showed: one [`Check`] per expectation.
    pub fn score(&self, index: usize, outcome: &Outcome) -> Vec<Check> {
        match (self.spec.cases.get(index), self.compiled.get(index)) {
            (Some(case), Some(compiled)) => score(case, compiled, self.spec.max_cost_usd, outcome),
            _ => Vec::new(),
        }
    }
}

fn check_name(name: &str, seen: &mut BTreeSet<String>, what: &str) -> Result<(), String> {
    if !valid_name(name) {
        return Err(format!(
            "'{name}' is not a valid {what} name (1 to 64 of A-Z a-z 0-9 _ . -)"
        ));
    }
    if !seen.insert(name.to_owned()) {
        return Err(format!("{what} '{name}' is declared twice"));
    }
    Ok(())
}

fn boxed(error: ConfigError) -> LoomError {
    LoomError::Config(Box::new(error))
}

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
}

impl Outcome {
    /// The outcome of the run tree of `events` (the root run's status, text and data given by
    /// its fold), with `refused` the side-effect calls refused for want of a double (the
    /// evaluation doubles' misses).
    pub fn from_events(
        result: &crate::RunResult,
        events: &[Event],
        refused: Vec<String>,
    ) -> Outcome {
        let mut outcome = Outcome {
            status: result.status.as_str().to_owned(),
            text: result.text.clone(),
            data: result.data.clone(),
            refused,
            ..Outcome::default()
        };
        for event in events {
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
                Payload::ModelResponded(answer) => outcome.cost_usd += answer.cost_usd,
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

/// Scores `case` on `outcome`: one [`Check`] per expectation, in the order of the format
/// (status, contains, not_contains, matches, schema, called, not_called, cost, criteria), and
/// first one failed check per side-effect call refused for want of a double.
fn score(
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
        let value = outcome
            .data
            .clone()
            .map(Ok)
            .unwrap_or_else(|| serde_json::from_str::<Value>(outcome.text.trim()));
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

/// One case run under one variant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalRun {
    /// The case.
    pub case: String,
    /// The variant.
    pub variant: String,
    /// Whether every check passed.
    pub passed: bool,
    /// The run (in the scratch journal), when it opened.
    pub run_id: Option<String>,
    /// Its session.
    pub session_id: Option<String>,
    /// How it ended.
    pub status: String,
    /// The answer's text.
    pub text: String,
    /// Cost of the run's model calls, the eval judge's left out.
    pub cost_usd: f64,
    /// Cost of the eval judge's calls.
    pub judge_cost_usd: f64,
    /// The expectations, scored.
    pub checks: Vec<Check>,
    /// Why the run could not be played, when it could not (the run then counts as not
    /// passed, and the suite as unplayable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The run's session journal (the scratch journal's events), for `--export`.
    #[serde(skip)]
    pub events: Vec<Event>,
}

/// What a suite's runs gave.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalReport {
    /// The suite's name.
    pub suite: String,
    /// Its agent.
    pub agent: String,
    /// Cases run.
    pub cases: usize,
    /// Variants run, in order.
    pub variants: Vec<String>,
    /// Runs that passed every check.
    pub passed: usize,
    /// Runs that did not (errors included).
    pub failed: usize,
    /// Runs that could not be played.
    pub errors: usize,
    /// Cost of the runs, the eval judge's left out.
    pub cost_usd: f64,
    /// Cost of the eval judge.
    pub judge_cost_usd: f64,
    /// Every run, case by case within each variant.
    pub runs: Vec<EvalRun>,
}

impl EvalReport {
    /// The report of `runs`.
    pub fn new(suite: &Suite, variants: Vec<String>, cases: usize, runs: Vec<EvalRun>) -> Self {
        EvalReport {
            suite: suite.spec.name.clone(),
            agent: suite.spec.agent.clone(),
            cases,
            variants,
            passed: runs.iter().filter(|r| r.passed).count(),
            failed: runs.iter().filter(|r| !r.passed).count(),
            errors: runs.iter().filter(|r| r.error.is_some()).count(),
            cost_usd: runs.iter().map(|r| r.cost_usd).sum(),
            judge_cost_usd: runs.iter().map(|r| r.judge_cost_usd).sum(),
            runs,
        }
    }
}

#[cfg(test)]
mod tests;
