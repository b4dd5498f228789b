//! `loom eval SUITE`: the cases of an evaluation suite run against the configured agent under
//! each variant (each `repeat` times), in scratch journals, side-effect tools answered by the
//! suite's doubles; a table (or `--json`) with each repeated case's pass rate and means,
//! `--export DIR` for the runs' journals; exit code 0 when every run passes, 1 when one fails, 2
//! when the suite or a run cannot be played. The suite's `config` (when it names one) is the
//! configuration `dispatch` opens; variants' `config`, cases' `tenant`, `replay` globs and the
//! approvals decided during the runs are `loom_ia`'s (`Loom::eval`).

use std::{
    io::IsTerminal,
    path::{Path, PathBuf},
    sync::atomic::{AtomicUsize, Ordering},
};

use loom_ia::{
    EvalOptions, Loom, LoomError,
    eval::{CaseSummary, EvalReport, EvalRun, Suite},
};

use crate::{FAILED, OK, REFUSED, output::out};

use super::exit::{error_line, print_json};

/// What `loom eval` was asked.
pub(super) struct EvalArgs {
    pub(super) suite: PathBuf,
    pub(super) cases: Vec<String>,
    pub(super) variants: Vec<String>,
    pub(super) export: Option<PathBuf>,
    pub(super) json: bool,
    pub(super) concurrency: usize,
}

/// Runs the suite; every error (the suite, a run that cannot be played) is exit code 2.
pub(super) async fn eval(loom: &Loom, args: EvalArgs) -> Result<u8, LoomError> {
    match play(loom, &args).await {
        Ok(code) => Ok(code),
        Err(error) => {
            eprintln!("{}", error_line(&error));
            Ok(REFUSED)
        }
    }
}

async fn play(loom: &Loom, args: &EvalArgs) -> Result<u8, LoomError> {
    let suite = Suite::load(&args.suite)?;
    let options = EvalOptions {
        cases: args.cases.clone(),
        variants: args.variants.clone(),
        concurrency: args.concurrency,
    };
    // A progress line on a terminal only: redirected output stays clean.
    let terminal = std::io::stderr().is_terminal();
    let done = AtomicUsize::new(0);
    let progress = |run: &EvalRun| {
        let n = done.fetch_add(1, Ordering::Relaxed) + 1;
        if terminal {
            let mark = if run.passed { "ok" } else { "FAILED" };
            eprint!("\r\x1b[2K[{n}] {} / {} {mark}", run.variant, run.case);
        }
    };
    let report = loom.eval(&suite, &options, &progress).await?;
    if terminal && done.load(Ordering::Relaxed) > 0 {
        eprintln!();
    }
    if let Some(dir) = &args.export {
        export(dir, &report)?;
    }
    let code = if report.errors > 0 {
        REFUSED
    } else if report.failed > 0 {
        FAILED
    } else {
        OK
    };
    if args.json {
        let printed = print_json(&report);
        return Ok(if printed == OK { code } else { printed });
    }
    out!("{}", render(&report));
    Ok(code)
}

/// Writes each run's scratch journal as `<variant>--<case>.jsonl` in `dir`, or
/// `<variant>--<case>--<attempt>.jsonl` for a case run several times.
fn export(dir: &Path, report: &EvalReport) -> Result<(), LoomError> {
    let io =
        |path: &Path, e: std::io::Error| LoomError::Invalid(format!("{}: {e}", path.display()));
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    for run in &report.runs {
        let repeated = report
            .summary_of(&run.variant, &run.case)
            .is_some_and(|s| s.runs > 1);
        let name = if repeated {
            format!("{}--{}--{}.jsonl", run.variant, run.case, run.attempt)
        } else {
            format!("{}--{}.jsonl", run.variant, run.case)
        };
        let path = dir.join(name);
        let mut text = String::new();
        for event in &run.events {
            text.push_str(&event.to_json());
            text.push('\n');
        }
        std::fs::write(&path, text).map_err(|e| io(&path, e))?;
    }
    eprintln!("Exported {} run(s) to {}", report.runs.len(), dir.display());
    Ok(())
}

/// The human-readable report: a line per case and variant (with its pass rate and means when
/// it ran several times), the failed checks of each failed run under it.
pub(crate) fn render(report: &EvalReport) -> String {
    let mut text = format!(
        "Suite      : {} — agent {}, {} case(s), {} variant(s)\n",
        report.suite,
        report.agent,
        report.cases,
        report.variants.len()
    );
    for variant in &report.variants {
        let cases: Vec<&CaseSummary> = report
            .summary
            .iter()
            .filter(|s| &s.variant == variant)
            .collect();
        let runs = || report.runs.iter().filter(|r| &r.variant == variant);
        let passed = cases.iter().filter(|s| s.all_passed()).count();
        let cost: f64 = runs().map(|r| r.cost_usd).sum();
        let judge: f64 = runs().map(|r| r.judge_cost_usd).sum();
        text.push_str(&format!(
            "\nVariant {variant} — {passed}/{} case(s) passed, {cost:.6} $ of runs, {judge:.6} $ of judge\n",
            cases.len()
        ));
        for summary in cases {
            let runs: Vec<&EvalRun> = runs().filter(|r| r.case == summary.case).collect();
            let mark = if runs.iter().any(|r| r.error.is_some()) {
                "ERROR "
            } else if summary.all_passed() {
                "ok    "
            } else {
                "FAILED"
            };
            match runs.as_slice() {
                [run] => {
                    let checks_passed = run.checks.iter().filter(|c| c.passed).count();
                    text.push_str(&format!(
                        "  {mark}   {:<24} {checks_passed}/{} check(s)\n",
                        run.case,
                        run.checks.len()
                    ));
                    failure(&mut text, run, "");
                }
                runs => {
                    text.push_str(&format!(
                        "  {mark}   {:<24} {}/{} run(s) passed ({:.0} %), mean {:.6} $, {:.0} in / \
                         {:.0} out token(s), {:.0} ms\n",
                        summary.case,
                        summary.passed,
                        summary.runs,
                        summary.pass_rate * 100.0,
                        summary.mean_cost_usd,
                        summary.mean_input_tokens,
                        summary.mean_output_tokens,
                        summary.mean_latency_ms
                    ));
                    for run in runs {
                        let attempt = match &run.journal {
                            Some(file) => format!("attempt {} ({file}): ", run.attempt),
                            None => format!("attempt {}: ", run.attempt),
                        };
                        failure(&mut text, run, &attempt);
                    }
                }
            }
        }
    }
    let verdict = if report.errors > 0 {
        "some runs could not be played"
    } else if report.failed > 0 {
        "some expectations fail"
    } else {
        "every expectation holds"
    };
    text.push_str(&format!(
        "\nResult     : {}/{} run(s) passed, {:.6} $ spent ({:.6} $ of judge)\nVerdict    : {verdict}\n",
        report.passed,
        report.runs.len(),
        report.cost_usd + report.judge_cost_usd,
        report.judge_cost_usd
    ));
    text
}

/// What went wrong with `run`, when it did not pass: its error, or its failed checks and its
/// answer; `attempt` heads its first line (`attempt 2: ` for a repeated case).
fn failure(text: &mut String, run: &EvalRun, attempt: &str) {
    if let Some(error) = &run.error {
        text.push_str(&format!("      {attempt}error: {error}\n"));
        return;
    }
    if run.passed {
        return;
    }
    text.push_str(&format!(
        "      {attempt}run {}, {}\n",
        run.run_id.as_deref().unwrap_or("-"),
        run.status
    ));
    for check in run.checks.iter().filter(|c| !c.passed) {
        match &check.detail {
            Some(detail) => text.push_str(&format!("        ✗ {} — {detail}\n", check.expectation)),
            None => text.push_str(&format!("        ✗ {}\n", check.expectation)),
        }
    }
    text.push_str("      text:\n");
    for line in run.text.lines() {
        text.push_str(&format!("        {line}\n"));
    }
}
