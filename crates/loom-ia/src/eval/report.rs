//! What a suite's runs gave: each run ([`EvalRun`]), the aggregates of each case under each
//! variant over its repeated runs ([`CaseSummary`]), and the whole ([`EvalReport`]).

use loom_core::Event;
use serde::Serialize;

use super::{Check, Suite};

/// One run of a case under one variant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalRun {
    /// The case.
    pub case: String,
    /// The variant.
    pub variant: String,
    /// Which of the case's runs under this variant (1 to its `repeat`, times the journal files
    /// its `replay` glob matched).
    pub attempt: u32,
    /// The tenant it ran under.
    pub tenant: String,
    /// The journal file whose conversation it replayed (relative to the suite), for a case
    /// that replays a file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal: Option<String>,
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
    /// Input tokens of the run's model calls, the eval judge's left out.
    pub input_tokens: u64,
    /// Output tokens of the same calls.
    pub output_tokens: u64,
    /// From the run's first event to its last, in milliseconds.
    pub latency_ms: i64,
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

/// A case under a variant, over its runs (`repeat`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaseSummary {
    /// The case.
    pub case: String,
    /// The variant.
    pub variant: String,
    /// Its runs.
    pub runs: usize,
    /// Those that passed every check.
    pub passed: usize,
    /// `passed / runs`.
    pub pass_rate: f64,
    /// Mean cost of a run, the eval judge's left out.
    pub mean_cost_usd: f64,
    /// Mean input tokens of a run.
    pub mean_input_tokens: f64,
    /// Mean output tokens of a run.
    pub mean_output_tokens: f64,
    /// Mean latency of a run, in milliseconds.
    pub mean_latency_ms: f64,
}

impl CaseSummary {
    /// Whether every run of the case passed (what counts the case as passed).
    pub fn all_passed(&self) -> bool {
        self.runs > 0 && self.passed == self.runs
    }

    /// The summary of `runs`, those of `case` under `variant`.
    fn of(variant: &str, case: &str, runs: &[&EvalRun]) -> CaseSummary {
        let count = runs.len();
        let mean = |total: f64| {
            if count == 0 {
                0.0
            } else {
                total / count as f64
            }
        };
        let passed = runs.iter().filter(|r| r.passed).count();
        CaseSummary {
            case: case.to_owned(),
            variant: variant.to_owned(),
            runs: count,
            passed,
            pass_rate: mean(passed as f64),
            mean_cost_usd: mean(runs.iter().map(|r| r.cost_usd).sum()),
            mean_input_tokens: mean(runs.iter().map(|r| r.input_tokens as f64).sum()),
            mean_output_tokens: mean(runs.iter().map(|r| r.output_tokens as f64).sum()),
            mean_latency_ms: mean(runs.iter().map(|r| r.latency_ms as f64).sum()),
        }
    }
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
    /// Each case under each variant over its runs, variant by variant, in the suite's order.
    pub summary: Vec<CaseSummary>,
    /// Every run, case by case (attempt by attempt) within each variant.
    pub runs: Vec<EvalRun>,
}

impl EvalReport {
    /// The report of `runs`.
    pub fn new(suite: &Suite, variants: Vec<String>, cases: usize, runs: Vec<EvalRun>) -> Self {
        let mut summary: Vec<CaseSummary> = Vec::new();
        for run in &runs {
            if summary
                .iter()
                .any(|s| s.variant == run.variant && s.case == run.case)
            {
                continue;
            }
            let same: Vec<&EvalRun> = runs
                .iter()
                .filter(|r| r.variant == run.variant && r.case == run.case)
                .collect();
            summary.push(CaseSummary::of(&run.variant, &run.case, &same));
        }
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
            summary,
            runs,
        }
    }

    /// The summary of `case` under `variant`.
    pub fn summary_of(&self, variant: &str, case: &str) -> Option<&CaseSummary> {
        self.summary
            .iter()
            .find(|s| s.variant == variant && s.case == case)
    }
}
