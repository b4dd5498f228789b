//! Text for people: run summaries, progress lines, traces, usage reports, validation.

use std::fmt::Write as _;

use std::collections::BTreeSet;

use loom_ia::{
    RunResult, RunUsage, SessionFile, SessionInfo, SessionListed, UsageLine, UsageReport,
    Validation,
};

/// ` --tenant <tenant>` for a command that names a run of `tenant`, empty for the default one.
pub(crate) fn tenant_flag(tenant: &str) -> String {
    if tenant == loom_ia::DEFAULT_TENANT {
        String::new()
    } else {
        format!(" --tenant {tenant}")
    }
}

/// When a session was last written, to the minute (UTC), or `-`.
fn minute(at: Option<chrono::DateTime<chrono::Utc>>) -> String {
    at.map_or_else(
        || "-".to_owned(),
        |t| t.format("%Y-%m-%d %H:%M").to_string(),
    )
}

/// `loom sessions list`: one line per session (id, events, last write), as the reference
/// lays it out.
pub(crate) fn session_list(sessions: &[SessionListed]) -> String {
    if sessions.is_empty() {
        return "No session.\n".to_owned();
    }
    let mut out = String::new();
    for session in sessions {
        let _ = writeln!(
            out,
            "{:<24} {:>6} events   {}",
            session.session_id,
            session.last_seq,
            minute(session.updated_at)
        );
    }
    out
}

/// `loom sessions show`: the session, its runs, and the approvals waiting in it with the
/// command that decides each (`tenant`: the session's, named in that command).
pub(crate) fn session(info: &SessionInfo, tenant: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Session    : {} · {} events · {}",
        info.session_id,
        info.last_seq,
        minute(info.updated_at)
    );
    let _ = writeln!(out, "Runs       :");
    for run in &info.runs {
        let _ = writeln!(
            out,
            "  {}  {:<12} {:<17} {} iteration(s)  {:.4} ${}",
            run.run_id,
            run.agent,
            run.status.to_string(),
            run.iterations,
            run.cost_usd,
            if run.unpiloted { "  (left open)" } else { "" }
        );
    }
    if info.pending_approvals.is_empty() {
        let _ = writeln!(out, "Waiting    : nothing");
    }
    for pending in &info.pending_approvals {
        let session = if pending.session_id != pending.run_id {
            format!(" --session {}", pending.session_id)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "Waiting    : {} ({}) — loom approve {} --call {}{session}{}",
            pending.tool_name,
            pending.call_id,
            pending.run_id,
            pending.call_id,
            tenant_flag(tenant)
        );
    }
    out
}

/// `loom sessions files`: one line per file (URI, type, size, origin, name).
pub(crate) fn session_files(files: &[SessionFile]) -> String {
    if files.is_empty() {
        return "No file.\n".to_owned();
    }
    let mut out = String::new();
    for file in files {
        let name = file
            .name
            .as_deref()
            .map(|n| format!(", {n}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{} ({}, {} bytes, {}{name})",
            file.uri, file.media_type, file.size, file.origin
        );
    }
    out
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
    if let Some(note) = &result.compaction {
        let _ = writeln!(out, "{}", compaction_line(note));
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

/// `loom report`: a run's (run by run when it has sub-runs, each indented under its parent),
/// a session's (run by run) or a tenant's over a period (by agent), then by role, by agent
/// (when several ran) and by model.
pub(crate) fn usage(report: &UsageReport) -> String {
    let roots = report.root_runs();
    let title = match (&report.run_id, &report.session_id, report.period) {
        (Some(run), _, _) => format!("Usage — run {run}"),
        (None, Some(session), _) => {
            format!("Usage — session {session} (tenant {})", report.tenant_id)
        }
        (None, None, Some(period)) => {
            let sessions: BTreeSet<&str> = roots.iter().map(|r| r.session_id.as_str()).collect();
            format!(
                "Usage — tenant {}, {period} {} (UTC): {} run(s) in {} session(s)",
                report.tenant_id,
                report
                    .from
                    .map(|from| period.label(from))
                    .unwrap_or_default(),
                roots.len(),
                sessions.len()
            )
        }
        (None, None, None) => format!("Usage — tenant {}", report.tenant_id),
    };
    let mut sections = Vec::new();
    if report.period.is_none() && (report.run_id.is_none() || report.runs.len() > 1) {
        let mut rows = Vec::new();
        for root in &roots {
            run_rows(report, root, 0, &mut rows);
        }
        sections.push(("By run", rows));
    }
    // A tenant's usage is read by agent first; a run's or a session's, run by run.
    if report.period.is_some() {
        sections.push(("By agent", lines(&report.agents)));
    }
    sections.push(("By role", lines(&report.roles)));
    if report.period.is_none() && report.agents.len() > 1 {
        sections.push(("By agent", lines(&report.agents)));
    }
    sections.push(("By model", lines(&report.models)));
    usage_table(&title, &report.total, &sections)
}

/// `run` and its sub-runs, each indented under its parent, in the order they started: a row
/// of its own calls each.
fn run_rows<'a>(
    report: &'a UsageReport,
    run: &'a RunUsage,
    depth: usize,
    rows: &mut Vec<(String, &'a UsageLine)>,
) {
    let label = format!(
        "{:width$}{} ({}, {})",
        "",
        run.run_id,
        run.agent.as_deref().unwrap_or("-"),
        run.status,
        width = depth * 2
    );
    rows.push((label, &run.own));
    let mut children: Vec<&RunUsage> = report
        .runs
        .values()
        .filter(|r| r.parent_run_id.as_deref() == Some(run.run_id.as_str()))
        .collect();
    children.sort_by_key(|r| r.started_at);
    if depth < 64 {
        for child in children {
            run_rows(report, child, depth + 1, rows);
        }
    }
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
    let _ = writeln!(
        out,
        "Env        : {}",
        validation
            .env_file
            .as_ref()
            .map_or("none".to_owned(), |(path, count)| format!(
                "{} ({count} variable(s))",
                path.display()
            ))
    );
    let _ = writeln!(out, "Journal    : {}", validation.journal);
    for (name, what) in &validation.services {
        let _ = writeln!(out, "{name:<11}: {what}");
    }
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
            "Agent      : {} — model {}, at most {} iteration(s){}",
            agent.name,
            agent.model,
            agent.max_iterations,
            agent
                .tenant
                .as_ref()
                .map_or(String::new(), |t| format!(" (as tenant {t} runs it)"))
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
                        "  · {} {}{required}: unreachable — {error}",
                        source.kind, source.name
                    );
                }
                None => {
                    let _ = writeln!(
                        out,
                        "  · {} {}{required}: {} tool(s)",
                        source.kind,
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
    for tenant in &validation.tenants {
        tenant_lines(&mut out, tenant);
    }
    let _ = writeln!(
        out,
        "{} agent(s) loaded without error.",
        validation.agents.len()
    );
    out
}

/// What one tenant gets, in `loom validate`: names only, never a secret's value.
fn tenant_lines(out: &mut String, tenant: &loom_ia::ValidatedTenant) {
    let list = |items: Vec<String>| {
        if items.is_empty() {
            "none".to_owned()
        } else {
            items.join(", ")
        }
    };
    let _ = writeln!(
        out,
        "Tenant     : {} — agents {}",
        tenant.id,
        list(tenant.agents.clone())
    );
    if !tenant.tools_deny.is_empty() {
        let _ = writeln!(out, "  · tools denied: {}", tenant.tools_deny.join(", "));
    }
    if !tenant.models.is_empty() {
        let pairs = tenant.models.iter().map(|(f, t)| format!("{f} → {t}"));
        let _ = writeln!(out, "  · models: {}", list(pairs.collect()));
    }
    if !tenant.approvals.is_empty() {
        let pairs = tenant.approvals.iter().map(|(t, a)| format!("{t} {a}"));
        let _ = writeln!(out, "  · approvals: {}", list(pairs.collect()));
    }
    for (name, source, set) in &tenant.secrets {
        let state = if *set { "set" } else { "NOT SET" };
        let _ = writeln!(out, "  · secret {name}: from {source} ({state})");
    }
    if !tenant.variables.is_empty() {
        let _ = writeln!(out, "  · variables: {}", tenant.variables.join(", "));
    }
    if let Some(journal) = &tenant.journal {
        let _ = writeln!(out, "  · journal: {journal}");
    }
    if let Some(days) = tenant.retention_days {
        let _ = writeln!(out, "  · retention: {days} day(s)");
    }
    if let Some((raw, bytes)) = tenant.capture {
        let _ = writeln!(
            out,
            "  · capture: raw exchanges {}, {bytes} bytes kept",
            if raw { "on" } else { "off" }
        );
    }
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

/// The report line of a compaction (`loom run`, `loom compact`).
pub(crate) fn compaction_line(note: &loom_ia::CompactionNote) -> String {
    let when = match note.when.as_deref() {
        Some("after") => "after this run, ",
        Some("before") => "before this run, ",
        _ => "",
    };
    let run = note
        .run_id
        .as_deref()
        .map(|id| format!(" (run {id})"))
        .unwrap_or_default();
    let what = match note.outcome.as_str() {
        "applied" => format!(
            "earlier turns summarized, {} kept · history {} → {} tokens · cost: {:.4} $",
            note.kept.unwrap_or(0),
            note.tokens_before.unwrap_or(0),
            note.tokens_after.unwrap_or(0),
            note.cost_usd
        ),
        "kept" => "the summary left out details of the originals: the original turns are kept \
                   (see its guard.checked fidelity)"
            .to_owned(),
        "failed" => "the summarizer failed: the original turns are kept".to_owned(),
        "running" => "in progress".to_owned(),
        "queued" => "queued for a worker".to_owned(),
        _ => "nothing to summarize".to_owned(),
    };
    format!("Compaction : {when}{what}{run}")
}

#[cfg(test)]
mod tests {
    use loom_ia::{RunStatus, Usage};

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

    fn run(id: &str, agent: &str, parent: Option<&str>, minute: u32, own: UsageLine) -> RunUsage {
        use chrono::TimeZone;
        RunUsage {
            run_id: id.into(),
            session_id: "s1".into(),
            agent: Some(agent.into()),
            status: RunStatus::Completed,
            started_at: chrono::Utc
                .with_ymd_and_hms(2026, 11, 29, 8, minute, 0)
                .unwrap(),
            parent_run_id: parent.map(str::to_owned),
            call_id: parent.map(|_| "call-1".to_owned()),
            depth: u32::from(parent.is_some()),
            with_sub_runs: own.clone(),
            own,
        }
    }

    #[test]
    fn a_run_report_lists_its_sub_runs_under_it() {
        let report = UsageReport {
            tenant_id: "default".into(),
            run_id: Some("r1".into()),
            session_id: Some("s1".into()),
            total: line(3, 300, 30, 0.003),
            runs: [
                (
                    "r1".to_owned(),
                    run("r1", "chef", None, 0, line(1, 100, 10, 0.001)),
                ),
                (
                    "c1".to_owned(),
                    run("c1", "recherche", Some("r1"), 1, line(2, 200, 20, 0.002)),
                ),
            ]
            .into(),
            roles: [("main".to_owned(), line(3, 300, 30, 0.003))].into(),
            agents: [
                ("chef".to_owned(), line(1, 100, 10, 0.001)),
                ("recherche".to_owned(), line(2, 200, 20, 0.002)),
            ]
            .into(),
            models: [("fake-1 (FAKE)".to_owned(), line(3, 300, 30, 0.003))].into(),
            ..UsageReport::default()
        };
        assert_eq!(
            usage(&report),
            "Usage — run r1\n\
             \x20 Total                            3 call(s) ·        300/30 tokens · 0.00300 $\n\
             \x20 By run:\n\
             \x20   r1 (chef, completed)           1 call(s) ·        100/10 tokens · 0.00100 $\n\
             \x20     c1 (recherche, completed)    2 call(s) ·        200/20 tokens · 0.00200 $\n\
             \x20 By role:\n\
             \x20   main                           3 call(s) ·        300/30 tokens · 0.00300 $\n\
             \x20 By agent:\n\
             \x20   chef                           1 call(s) ·        100/10 tokens · 0.00100 $\n\
             \x20   recherche                      2 call(s) ·        200/20 tokens · 0.00200 $\n\
             \x20 By model:\n\
             \x20   fake-1 (FAKE)                  3 call(s) ·        300/30 tokens · 0.00300 $\n"
        );
    }
}
