//! Evaluations: a YAML suite of cases run against an agent, each case under each variant, scored
//! per expectation (`loom eval`, [`crate::Loom::eval`]).
//!
//! This module holds what does no IO beyond reading the suite file: the suite format
//! ([`SuiteSpec`]), its loading with located errors ([`Suite::load`], [`Suite::from_yaml`]), the
//! compiled expectations and their scoring over a run's events ([`Suite::score`], in
//! `eval/score.rs`), and the report ([`EvalReport`], its per-case aggregates [`CaseSummary`], in
//! `eval/report.rs`). Running the cases is `loom/eval.rs`.
//!
//! The format follows the reference's (`version`, `name`, `config`, `agent`, `tenant`, `repeat`,
//! `max_cost_usd`, `doubles`, `judge`, `variants` with `name`, `config` and `models`, `cases`
//! with `input` or `replay`, `tenant`, `repeat`, `state`, `expect` and `criteria`; `expect` with
//! `status`, `contains`, `not_contains`, `matches`, `fields`, `called`, `not_called` and
//! `state`), with `expect.schema` (a JSON Schema of the output) and `expect.max_cost_usd` added,
//! `attachments` per case, and a variant's `model`, `system` and `params` applied to the agent's
//! main slot. `config` paths and `replay` files are relative to the suite file; a case's
//! `tenant` wins over the suite's ([`Suite::tenant`]).
//!
//! - `repeat: N` (the suite's, or a case's own) runs each case N times under each variant: every
//!   run is scored on its own, and the report aggregates them per case (pass rate, mean cost,
//!   tokens and latency); a case passes when all its runs pass.
//! - `replay: FILE-OR-RUN` takes a case's conversation from a recorded journal instead of an
//!   `input` message: an exported JSONL file (relative to the suite; its last closed root run),
//!   a glob of such files (`eval/glob.rs`; each file a trial of the case, in path order), or the
//!   id of a run of the configuration's journal. It is re-driven as a variant replay
//!   (`loom_engine::replay::variant`): the variant's model (every call made for real when the
//!   variant names one), tools answered from the journal, else by the suite's doubles.
//! - `expect.fields` maps JSON pointers (RFC 6901) of the structured output (its data, else its
//!   text read as JSON) to what they must hold; `expect.state` maps session-state keys to what
//!   they must hold once the run ended. Either is a value (equal), or `{matches: REGEX}` (the
//!   value's text — a string's own, else its compact JSON — matches), or `{equals: VALUE}` to
//!   compare with a value that would read as one of these forms.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use loom_config::{ConfigError, ConfigErrorKind, YamlDocument};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::LoomError;

pub(crate) mod glob;
mod report;
mod score;

pub use report::{CaseSummary, EvalReport, EvalRun};
pub use score::{CallSeen, Check, Outcome, subset};

/// Most runs of one case under one variant (`repeat`).
pub const MAX_REPEAT: u32 = 100;

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
    /// The configuration (`loom.yaml`) the suite runs against, relative to the suite file; none:
    /// the configuration `loom eval` was given (or [`crate::Loom::eval`]'s instance).
    #[serde(default)]
    pub config: Option<PathBuf>,
    /// The agent every case runs.
    pub agent: String,
    /// The tenant the runs belong to, unless a case names its own (default `default`).
    #[serde(default)]
    pub tenant: Option<String>,
    /// Runs of each case under each variant, unless a case sets its own (default 1, at most
    /// [`MAX_REPEAT`]).
    #[serde(default)]
    pub repeat: Option<u32>,
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
    /// Another configuration (`loom.yaml`) the variant's runs use, relative to the suite file:
    /// the suite's agent, its models and prompts as that file declares them.
    #[serde(default)]
    pub config: Option<PathBuf>,
    /// A model id of the configuration, in place of the agent's main model (`models: {main:
    /// ID}` says the same).
    #[serde(default)]
    pub model: Option<String>,
    /// A model id of the configuration for each named step: `main`, a role's name, or
    /// `judge:<name>` (the step's fallbacks are dropped).
    #[serde(default)]
    pub models: BTreeMap<String, String>,
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
    /// The user's message (exactly one of `input` and `replay`).
    #[serde(default)]
    pub input: Option<String>,
    /// The conversation to replay instead of a message: an exported JSONL journal, relative to
    /// the suite file (its last closed root run), a glob of such files (`*`, `?`, `[...]`; each
    /// matching file, in path order, is a trial of the case), or the id of a run of the
    /// configuration's journal.
    #[serde(default)]
    pub replay: Option<String>,
    /// The tenant this case's runs belong to (else the suite's `tenant`).
    #[serde(default)]
    pub tenant: Option<String>,
    /// Runs of this case under each variant (else the suite's `repeat`).
    #[serde(default)]
    pub repeat: Option<u32>,
    /// Files attached to the message, relative to the suite file (not with `replay`).
    #[serde(default)]
    pub attachments: Vec<PathBuf>,
    /// The session state the run opens with (not with `replay`: the recorded run's is used).
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
    /// What the output (its structured data, else its text read as JSON) holds at each JSON
    /// pointer.
    #[serde(default)]
    pub fields: BTreeMap<String, ValueExpect>,
    /// Tools that must be called, by name or with arguments (a subset match).
    #[serde(default)]
    pub called: Vec<CalledSpec>,
    /// Tools that must not be called.
    #[serde(default)]
    pub not_called: Vec<String>,
    /// What the session state holds at each key once the run ended.
    #[serde(default)]
    pub state: BTreeMap<String, ValueExpect>,
    /// Cost ceiling of the run, in dollars (else the suite's).
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
}

/// What a field of the output or a key of the session state must hold.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(from = "Value")]
pub enum ValueExpect {
    /// This value (`{equals: VALUE}`, or any value that is not one of the other forms).
    Equals(Value),
    /// A value whose text (a string's own, any other value's compact JSON) matches this regular
    /// expression (`{matches: REGEX}`).
    Matches(String),
}

impl From<Value> for ValueExpect {
    fn from(value: Value) -> ValueExpect {
        if let Value::Object(map) = &value
            && map.len() == 1
        {
            match map.iter().next() {
                Some((key, Value::String(regex))) if key == "matches" => {
                    return ValueExpect::Matches(regex.clone());
                }
                Some((key, inner)) if key == "equals" => return ValueExpect::Equals(inner.clone()),
                _ => {}
            }
        }
        ValueExpect::Equals(value)
    }
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
    /// `expect.fields`, by JSON pointer.
    fields: Vec<(String, Matcher)>,
    /// `expect.state`, by key.
    state: Vec<(String, Matcher)>,
}

/// A [`ValueExpect`], its regular expression compiled.
#[derive(Debug, Clone)]
enum Matcher {
    Equals(Value),
    Matches(regex::Regex),
}

/// A regular expression of the suite, its size bounded.
fn regex(pattern: &str) -> Result<regex::Regex, regex::Error> {
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
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
        let repeat = |key: &str, value: Option<u32>| match value {
            Some(n) if !(1..=MAX_REPEAT).contains(&n) => Err(invalid(
                key,
                format!("repeat {n} is not between 1 and {MAX_REPEAT}"),
            )),
            _ => Ok(()),
        };
        repeat("repeat", spec.repeat)?;
        let mut seen = BTreeSet::new();
        for (index, variant) in spec.variants.iter().enumerate() {
            check_name(&variant.name, &mut seen, "variant")
                .map_err(|m| invalid(&format!("variants[{index}].name"), m))?;
            if variant.model.is_some() && variant.models.contains_key("main") {
                return Err(invalid(
                    &format!("variants[{index}].models.main"),
                    "the main step's model is given twice: by `model` and by `models.main`".into(),
                ));
            }
        }
        let mut seen = BTreeSet::new();
        let mut compiled = Vec::with_capacity(spec.cases.len());
        for (index, case) in spec.cases.iter().enumerate() {
            let at = format!("cases[{index}]");
            check_name(&case.name, &mut seen, "case")
                .map_err(|m| invalid(&format!("{at}.name"), m))?;
            repeat(&format!("{at}.repeat"), case.repeat)?;
            check_source(case).map_err(|(key, m)| invalid(&format!("{at}{key}"), m))?;
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
                    regex(pattern).map_err(|e| {
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
            let fields = matchers(&case.expect.fields, |pointer| {
                (pointer.is_empty() || pointer.starts_with('/'))
                    .then_some(())
                    .ok_or_else(|| {
                        format!("'{pointer}' is not a JSON pointer (empty, or starting with '/')")
                    })
            })
            .map_err(|(key, m)| invalid(&format!("{at}.expect.fields.{key}"), m))?;
            let state = matchers(&case.expect.state, |_| Ok(()))
                .map_err(|(key, m)| invalid(&format!("{at}.expect.state.{key}"), m))?;
            compiled.push(Compiled {
                matches,
                schema,
                fields,
                state,
            });
        }
        Ok(Suite {
            spec,
            dir: dir.into(),
            doc,
            compiled,
        })
    }

    /// The configuration file the suite names (`config`), resolved against the suite's
    /// directory.
    pub fn config_path(&self) -> Option<PathBuf> {
        self.spec.config.as_ref().map(|c| self.dir.join(c))
    }

    /// The tenant case `index` runs under: its own `tenant`, else the suite's, else
    /// `default`; with the key of the suite file that named it (`None`: nothing did).
    pub fn tenant(&self, index: usize) -> (&str, Option<String>) {
        let own = self.spec.cases.get(index).and_then(|c| c.tenant.as_deref());
        match (own, self.spec.tenant.as_deref()) {
            (Some(tenant), _) => (tenant, Some(format!("cases[{index}].tenant"))),
            (None, Some(tenant)) => (tenant, Some("tenant".to_owned())),
            (None, None) => (crate::loom::DEFAULT_TENANT, None),
        }
    }

    /// How many times case `index` runs under each variant.
    pub fn repeat(&self, index: usize) -> u32 {
        self.spec
            .cases
            .get(index)
            .and_then(|c| c.repeat)
            .or(self.spec.repeat)
            .unwrap_or(1)
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
                config: None,
                models: BTreeMap::new(),
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
            (Some(case), Some(compiled)) => {
                score::score(case, compiled, self.spec.max_cost_usd, outcome)
            }
            _ => Vec::new(),
        }
    }
}

/// Why a case's source is wrong (the key under the case, and the message): it needs exactly
/// one of `input` and `replay`, and a replayed conversation takes neither attachments nor state.
fn check_source(case: &CaseSpec) -> Result<(), (&'static str, String)> {
    match (&case.input, &case.replay) {
        (None, None) => Err((
            "",
            "a case needs an `input` message or a conversation to `replay`".into(),
        )),
        (Some(_), Some(_)) => Err((
            ".replay",
            "a case replays a recorded conversation or sends an `input`, not both".into(),
        )),
        (None, Some(replay)) if replay.trim().is_empty() => {
            Err((".replay", "names no journal file nor run".into()))
        }
        (None, Some(_)) if !case.attachments.is_empty() => Err((
            ".attachments",
            "a replayed conversation keeps the recorded message's attachments".into(),
        )),
        (None, Some(_)) if !case.state.is_empty() => Err((
            ".state",
            "a replayed conversation opens with the recorded run's state".into(),
        )),
        _ => Ok(()),
    }
}

/// The compiled matchers of `expected` (its keys checked by `key_ok`); an error names the key.
fn matchers(
    expected: &BTreeMap<String, ValueExpect>,
    key_ok: impl Fn(&str) -> Result<(), String>,
) -> Result<Vec<(String, Matcher)>, (String, String)> {
    expected
        .iter()
        .map(|(key, want)| {
            key_ok(key).map_err(|m| (key.clone(), m))?;
            let matcher = match want {
                ValueExpect::Equals(value) => Matcher::Equals(value.clone()),
                ValueExpect::Matches(pattern) => Matcher::Matches(regex(pattern).map_err(|e| {
                    (
                        format!("{key}.matches"),
                        format!("not a regular expression: {e}"),
                    )
                })?),
            };
            Ok((key.clone(), matcher))
        })
        .collect()
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

#[cfg(test)]
mod tests;
