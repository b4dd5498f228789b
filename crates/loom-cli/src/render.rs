//! Text for people: run summaries, progress lines, traces, usage reports, validation.

use std::fmt::Write as _;

use loom_ia::{
    RunResult, SessionReport, TenantReport, Trace, UsageLine, UsageReport, Validation,
    report::TraceCall,
};
use serde_json::Value;

/// Longest line `inspect` prints without `--full`.
const MAX_LINE: usize = 110;

/// ` --tenant <tenant>` for a command that names a run of `tenant`, empty for the default one.
pub(crate) fn tenant_flag(tenant: &str) -> String {
    if tenant == loom_ia::DEFAULT_TENANT {
        String::new()
    } else {
        format!(" --tenant {tenant}")
    }
}

/// The lines `loom run` prints on stderr after the answer (`tenant`: the run's, named in the
/// commands it suggests).
pub(crate) fn run_summary(result: &RunResult, tenant: &str) -> String {
    let mut out = String::from("\n");
    let _ = writeln!(
        out,
        "Status     : {} · iterations: {} · tokens: {}/{} · cost: {:.4} $",
        result.status,
        result.iterations,
        result.usage.input_tokens,
        result.usage.output_tokens,
        result.cost_usd
    );
    let _ = writeln!(out, "Run        : {}", result.run_id);
    if result.session_id != result.run_id {
        let _ = writeln!(out, "Session    : {}", result.session_id);
    }
    for artifact in &result.artifacts {
        let _ = writeln!(
            out,
            "File       : {} ({}, {} bytes)",
            artifact.uri, artifact.media_type, artifact.size
        );
    }
    for verdict in &result.verdicts {
        let scores: Vec<String> = verdict
            .criteria
            .iter()
            .map(|c| format!("{} {:.2}", c.name, c.score))
            .collect();
        let attempt = verdict
            .attempt
            .map(|n| format!(", attempt {n}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "Judge      : {} ({}){attempt} — {}: {}",
            verdict.judge,
            judged(&verdict.target, verdict.call_id.as_deref()),
            if verdict.passed {
                "accepted"
            } else {
                "refused"
            },
            scores.join(", ")
        );
    }
    for skipped in &result.skipped_judges {
        let _ = writeln!(
            out,
            "Judge      : {} ({}) — not judged: {}",
            skipped.judge,
            judged(&skipped.target, skipped.call_id.as_deref()),
            skip_reason(skipped.reason.as_deref().unwrap_or_default())
        );
    }
    for pending in &result.pending_approvals {
        let session = if result.session_id != result.run_id {
            format!(" --session {}", result.session_id)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "Waiting    : {} ({}) — loom approve {} --call {}{session}{}",
            pending.tool_name,
            pending.call_id,
            result.run_id,
            pending.call_id,
            tenant_flag(tenant)
        );
    }
    if result.unverified {
        let _ = writeln!(
            out,
            "Verified   : no (kept despite its contract or its judge)"
        );
    }
    if result.fallback {
        let _ = writeln!(
            out,
            "Fallback   : yes (answer replaced by the fallback message of its contract or its judge)"
        );
    }
    if let Some(error) = &result.error {
        let kind = result.error_type.as_deref().unwrap_or("error");
        let _ = writeln!(out, "Error      : {error} ({kind})");
    }
    out
}

/// What a judge judged, for people: `final answer`, or `role X, call N`.
fn judged(target: &str, call_id: Option<&str>) -> String {
    match (target.strip_prefix("role:"), call_id) {
        (Some(role), Some(call)) => format!("role {role}, call {call}"),
        (Some(role), None) => format!("role {role}"),
        (None, _) if target == "output" => "final answer".to_owned(),
        (None, _) => target.to_owned(),
    }
}

/// Why a judge did not run, for people.
fn skip_reason(reason: &str) -> String {
    match reason {
        "caller_skip" => "skipped by the caller (--judges skip)".to_owned(),
        "other_profile" => "not under this profile".to_owned(),
        "tenant_filtered" => "not for this tenant".to_owned(),
        "sampled_out" => "left out of its sample".to_owned(),
        "condition_false" => "its condition does not hold".to_owned(),
        other => match other.strip_prefix("judge_error: ") {
            Some(error) => format!("the judge failed ({error}), output let through"),
            None => other.to_owned(),
        },
    }
}

/// One progress line for `--stream` (shared with the MCP server's progress notifications).
pub(crate) use loom_ia::progress_line;

/// `loom inspect`.
pub(crate) fn trace(trace: &Trace, full: bool) -> String {
    let mut out = String::new();
    let mut line = |text: String| {
        let text = if full { text } else { cut(&text) };
        out.push_str(&text);
        out.push('\n');
    };
    line(format!(
        "Run        : {} (agent {}, tenant {})",
        trace.run_id, trace.agent, trace.tenant_id
    ));
    line(format!("Session    : {}", trace.session_id));
    let mut status = format!(
        "Status     : {}, {} iteration(s)",
        trace.status, trace.iterations
    );
    if let Some(kind) = &trace.error_type {
        let _ = write!(status, " ({kind})");
    }
    if !trace.finished {
        status.push_str(" — run not finished: durations are provisional");
    }
    line(status);
    line(format!(
        "Usage      : {} → {} tokens, {:.6} $, {} of piloting",
        trace.usage.prompt_tokens(),
        trace.usage.output_tokens,
        trace.cost_usd,
        duration(trace.active_ms)
    ));
    line(String::new());
    line(format!(
        "run {} — {}, {}, {:.6} $",
        trace.agent,
        trace.status,
        duration(trace.duration_ms),
        trace.cost_usd
    ));
    let (mut model_calls, mut tool_calls, mut refused, mut approvals) = (0, 0, 0, 0);
    for step in &trace.steps {
        let mut head = format!("  step {} ({})", step.step_no, step_effect(step.effect));
        if let Some(ms) = step.duration_ms {
            let _ = write!(head, " — {}", duration(ms));
        }
        if let Some(outcome) = step.outcome
            && outcome != loom_ia::core::event::Outcome::Ok
        {
            let _ = write!(
                head,
                " ({})",
                serde_json::to_value(outcome)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            );
        }
        line(head);
        for call in &step.calls {
            match call {
                TraceCall::Model {
                    model_id,
                    model,
                    role,
                    latency_ms,
                    usage,
                    cost_usd,
                    text,
                    tool_calls: calls,
                    ..
                } => {
                    model_calls += 1;
                    let label = match model {
                        Some(model) => format!("{model} ({model_id})"),
                        None => model_id.clone(),
                    };
                    line(format!(
                        "    model {label} ({}) — {}, {} → {} tokens, {:.6} $",
                        role.as_deref().unwrap_or("main"),
                        duration(*latency_ms),
                        usage.prompt_tokens(),
                        usage.output_tokens,
                        cost_usd
                    ));
                    if !text.is_empty() {
                        line(format!("      · answers   : {}", one_line(text)));
                    }
                    for (name, arguments) in calls {
                        line(format!(
                            "      · calls     : {name}({})",
                            compact(arguments)
                        ));
                    }
                }
                TraceCall::Tool {
                    name,
                    arguments,
                    result,
                    is_error,
                    latency_ms,
                    refused: was_refused,
                    ..
                } => {
                    tool_calls += 1;
                    let mut head = format!("    tool {name}");
                    if *was_refused {
                        refused += 1;
                        head.push_str(" — refused before launch");
                    } else if let Some(ms) = latency_ms {
                        let _ = write!(head, " — {}", duration(*ms));
                    } else {
                        head.push_str(" (open)");
                    }
                    if *is_error {
                        head.push_str(" (error)");
                    }
                    line(head);
                    line(format!("      · arguments : {}", compact(arguments)));
                    if let Some(result) = result {
                        line(format!("      · result    : {}", one_line(result)));
                    }
                }
                TraceCall::Approval {
                    name,
                    status,
                    by,
                    reason,
                    decision_reason,
                    arguments,
                    ..
                } => {
                    approvals += 1;
                    let who = by.as_deref().unwrap_or("?");
                    let why = decision_reason
                        .as_deref()
                        .map(|r| format!(" ({r})"))
                        .unwrap_or_default();
                    let decided = match status.as_str() {
                        "granted" => format!("granted by {who}{why}"),
                        "rejected" => format!("rejected by {who}{why}"),
                        "expired" => "expired".to_owned(),
                        _ => "waiting".to_owned(),
                    };
                    line(format!("    approval for {name} — {decided}"));
                    line(format!("      · asked     : {}", one_line(reason)));
                    if let Some(arguments) = arguments {
                        line(format!("      · corrected : {}", compact(arguments)));
                    }
                }
            }
        }
    }
    if let Some(output) = &trace.output {
        line(String::new());
        line("Final answer:".to_owned());
        for text in output.lines() {
            line(format!("  {text}"));
        }
    }
    if let Some(error) = &trace.error {
        line(format!("Error      : {error}"));
    }
    let mut summary =
        format!("Summary    : {model_calls} model call(s), {tool_calls} tool call(s)");
    if refused > 0 {
        let _ = write!(summary, " including {refused} refused before launch");
    }
    if approvals > 0 {
        let _ = write!(summary, ", {approvals} approval(s)");
    }
    line(summary);
    out
}

fn step_effect(effect: loom_ia::core::event::Effect) -> &'static str {
    effect.as_str()
}

/// `loom report`.
pub(crate) fn usage(report: &UsageReport) -> String {
    let mut sections = vec![("By role", lines(&report.roles))];
    if !report.sub_runs.is_empty() {
        let subs = report
            .sub_runs
            .iter()
            .map(|sub| {
                let label = match &sub.agent {
                    Some(agent) => format!("{} ({agent})", sub.run_id),
                    None => sub.run_id.clone(),
                };
                (label, &sub.usage)
            })
            .collect();
        sections.push(("By sub-run", subs));
    }
    sections.push(("By model", lines(&report.models)));
    usage_table(
        &format!("Usage — run {}", report.run_id),
        &report.total,
        &sections,
    )
}

/// `loom report --session`.
pub(crate) fn session_usage(report: &SessionReport) -> String {
    let runs = report
        .runs
        .iter()
        .map(|run| {
            let label = format!(
                "{} ({}, {})",
                run.run_id,
                run.agent.as_deref().unwrap_or("-"),
                run.status
            );
            (label, &run.usage)
        })
        .collect();
    let mut sections = vec![("By run", runs), ("By role", lines(&report.roles))];
    if !report.sub_agents.is_empty() {
        sections.push(("By sub-agent", lines(&report.sub_agents)));
    }
    sections.push(("By model", lines(&report.models)));
    usage_table(
        &format!(
            "Usage — session {} (tenant {})",
            report.session_id, report.tenant_id
        ),
        &report.total,
        &sections,
    )
}

/// `loom report --tenant/--period`.
pub(crate) fn tenant_usage(report: &TenantReport) -> String {
    let mut sections = vec![
        ("By agent", lines(&report.agents)),
        ("By role", lines(&report.roles)),
    ];
    if !report.sub_agents.is_empty() {
        sections.push(("By sub-agent", lines(&report.sub_agents)));
    }
    sections.push(("By model", lines(&report.models)));
    usage_table(
        &format!(
            "Usage — tenant {}, {} {} (UTC): {} run(s) in {} session(s)",
            report.tenant_id,
            report.period,
            report.period.label(report.from),
            report.runs,
            report.sessions
        ),
        &report.total,
        &sections,
    )
}

fn lines(map: &std::collections::BTreeMap<String, UsageLine>) -> Vec<(String, &UsageLine)> {
    map.iter().map(|(k, v)| (k.clone(), v)).collect()
}

/// A usage report: a title, the total, then each section's rows, labels in one column.
fn usage_table(
    title: &str,
    total: &UsageLine,
    sections: &[(&str, Vec<(String, &UsageLine)>)],
) -> String {
    let width = sections
        .iter()
        .flat_map(|(_, rows)| rows.iter().map(|(label, _)| label.chars().count()))
        .max()
        .unwrap_or(0)
        .max(14);
    let row = |label: &str, line: &UsageLine, indent: usize| {
        let tokens = format!(
            "{}/{}",
            line.usage.prompt_tokens(),
            line.usage.output_tokens
        );
        format!(
            "{:indent$}{label:<width$}  {:>3} call(s) · {tokens:>13} tokens · {:.5} $\n",
            "",
            line.calls,
            line.cost_usd,
            indent = indent,
            width = width + 2 - indent.saturating_sub(2),
        )
    };
    let mut out = format!("{title}\n");
    out.push_str(&row("Total", total, 2));
    for (name, rows) in sections {
        let _ = writeln!(out, "  {name}:");
        for (label, line) in rows {
            out.push_str(&row(label, line, 4));
        }
    }
    out
}

/// `loom validate`.
pub(crate) fn validation(validation: &Validation) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Config     : {}", validation.file.display());
    let _ = writeln!(
        out,
        "Profile    : {}",
        validation.profile.map_or("(none)", |p| p.as_str())
    );
    let _ = writeln!(out, "Journal    : {}", validation.journal);
    let models: Vec<String> = validation
        .models
        .iter()
        .map(|(id, sdk, model)| format!("{id} ({sdk}: {model})"))
        .collect();
    let _ = writeln!(
        out,
        "Models     : {}",
        if models.is_empty() {
            "none".into()
        } else {
            models.join(", ")
        }
    );
    if !validation.mcp_servers.is_empty() {
        let _ = writeln!(out, "MCP        : {}", validation.mcp_servers.join(", "));
    }
    let _ = writeln!(
        out,
        "Tools      : {}",
        if validation.tools.is_empty() {
            "none".into()
        } else {
            validation.tools.join(", ")
        }
    );
    for agent in &validation.agents {
        let _ = writeln!(
            out,
            "Agent      : {} — model {}, at most {} iteration(s)",
            agent.name, agent.model, agent.max_iterations
        );
        for (name, d) in &agent.tools {
            let _ = writeln!(out, "  · tool {name}: {}", declarations(d));
        }
        for line in &agent.guards {
            let _ = writeln!(out, "  · {line}");
        }
        for source in &agent.sources {
            let required = if source.required { ", required" } else { "" };
            match &source.error {
                Some(error) => {
                    let _ = writeln!(
                        out,
                        "  · mcp {}{required}: unreachable — {error}",
                        source.name
                    );
                }
                None => {
                    let _ = writeln!(
                        out,
                        "  · mcp {}{required}: {} tool(s)",
                        source.name,
                        source.tools.len()
                    );
                    for (name, d) in &source.tools {
                        let _ = writeln!(out, "      {name}: {}", declarations(d));
                    }
                }
            }
        }
    }
    let _ = writeln!(
        out,
        "{} agent(s) loaded without error.",
        validation.agents.len()
    );
    out
}

fn declarations(d: &loom_ia::core::tool::ToolDeclarations) -> String {
    let timeout = d
        .timeout
        .map_or("default".to_owned(), |t| format!("{} s", t.as_secs_f64()));
    format!(
        "side_effects {}, approval {}, idempotent {}, timeout {timeout}",
        enum_name(&d.side_effects),
        enum_name(&d.approval),
        d.idempotent
    )
}

fn enum_name(value: &impl serde::Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn compact(value: &Value) -> String {
    value.to_string()
}

fn one_line(text: &str) -> String {
    text.replace('\n', " ⏎ ")
}

fn cut(text: &str) -> String {
    if text.chars().count() <= MAX_LINE {
        return text.to_owned();
    }
    let mut short: String = text.chars().take(MAX_LINE - 1).collect();
    short.push('…');
    short
}

/// `N ms` below a second, else `N.N s`.
fn duration(ms: f64) -> String {
    if ms < 1000.0 {
        format!("{} ms", ms.round() as u64)
    } else {
        format!("{:.1} s", ms / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use loom_ia::{SubRunUsage, Usage};

    use super::*;

    fn line(calls: u32, input: u64, output: u64, cost_usd: f64) -> UsageLine {
        UsageLine {
            calls,
            usage: Usage {
                input_tokens: input,
                output_tokens: output,
                ..Usage::default()
            },
            cost_usd,
        }
    }

    #[test]
    fn a_run_report_lists_its_sub_runs_between_roles_and_models() {
        let report = UsageReport {
            run_id: "r1".into(),
            total: line(3, 300, 30, 0.003),
            roles: [("main".to_owned(), line(1, 100, 10, 0.001))].into(),
            models: [("fake-1 (FAKE)".to_owned(), line(3, 300, 30, 0.003))].into(),
            sub_runs: vec![SubRunUsage {
                run_id: "c1".into(),
                agent: Some("recherche".into()),
                call_id: Some("call-1".into()),
                usage: line(2, 200, 20, 0.002),
            }],
        };
        assert_eq!(
            usage(&report),
            "Usage — run r1\n\
             \x20 Total               3 call(s) ·        300/30 tokens · 0.00300 $\n\
             \x20 By role:\n\
             \x20   main              1 call(s) ·        100/10 tokens · 0.00100 $\n\
             \x20 By sub-run:\n\
             \x20   c1 (recherche)    2 call(s) ·        200/20 tokens · 0.00200 $\n\
             \x20 By model:\n\
             \x20   fake-1 (FAKE)     3 call(s) ·        300/30 tokens · 0.00300 $\n"
        );
    }
}
