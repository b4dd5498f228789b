//! `loom inspect`: a run's trace for people. The run's figures, then its spans as a tree (the
//! run, its steps, model calls, tool calls, judges, approvals and sub-runs, each indented under
//! its parent, with what happened inside as `·` lines), the final answer and a summary.

use std::fmt::Write as _;

use loom_ia::{Span, SpanEvent, SpanKind, SpanStatus, Trace};
use serde_json::Value;

/// Longest line `inspect` prints without `--full`.
const MAX_LINE: usize = 110;

/// `loom inspect` (`full`: lines uncut).
pub(crate) fn trace(trace: &Trace, full: bool) -> String {
    let mut out = Out {
        text: String::new(),
        full,
    };
    out.line(format!(
        "Run        : {} (agent {}, tenant {})",
        trace.run_id, trace.agent, trace.tenant_id
    ));
    out.line(format!("Session    : {}", trace.session_id));
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
    out.line(status);
    out.line(format!(
        "Usage      : {} → {} tokens, {:.6} $, {} of piloting",
        trace.usage.prompt_tokens(),
        trace.usage.output_tokens,
        trace.cost_usd,
        duration(trace.active_ms)
    ));
    if !trace.content {
        out.line("Content    : not in this trace (metadata only)".to_owned());
    }
    out.line(String::new());
    let mut tally = Tally::default();
    for root in trace.children(None) {
        span(&mut out, trace, root, 0, &mut tally);
    }
    if let Some(output) = &trace.output {
        out.line(String::new());
        out.line("Final answer:".to_owned());
        for text in output.lines() {
            out.line(format!("  {text}"));
        }
    }
    let root = trace
        .spans
        .iter()
        .find(|s| s.kind == SpanKind::Run && s.run_id == trace.run_id);
    if let Some(error) = root.and_then(|s| s.text("loom.error")) {
        out.line(format!("Error      : {error}"));
    }
    out.line(tally.summary());
    out.text
}

/// What the summary line counts.
#[derive(Default)]
struct Tally {
    model_calls: u64,
    tool_calls: u64,
    refused: u64,
    approvals: u64,
    sub_runs: u64,
}

impl Tally {
    fn summary(&self) -> String {
        let mut summary = format!(
            "Summary    : {} model call(s), {} tool call(s)",
            self.model_calls, self.tool_calls
        );
        if self.refused > 0 {
            let _ = write!(summary, " including {} refused before launch", self.refused);
        }
        if self.approvals > 0 {
            let _ = write!(summary, ", {} approval(s)", self.approvals);
        }
        if self.sub_runs > 0 {
            let _ = write!(summary, ", {} sub-run(s)", self.sub_runs);
        }
        summary
    }
}

/// The text being written, lines cut unless `full`.
struct Out {
    text: String,
    full: bool,
}

impl Out {
    fn line(&mut self, text: String) {
        let text = if self.full { text } else { cut(&text) };
        self.text.push_str(&text);
        self.text.push('\n');
    }

    fn at(&mut self, depth: usize, text: String) {
        self.line(format!("{:width$}{text}", "", width = depth * 2));
    }
}

/// A span, its own lines, then its children and its events in the order they happened.
fn span(out: &mut Out, trace: &Trace, span: &Span, depth: usize, tally: &mut Tally) {
    let head = match span.kind {
        SpanKind::Run => run_head(trace, span, tally),
        SpanKind::Step => step_head(span),
        SpanKind::Chat | SpanKind::Model => {
            tally.model_calls += calls(span);
            model_head("model", span)
        }
        SpanKind::Judge => {
            tally.model_calls += calls(span);
            let judge = span.text("loom.judge").unwrap_or("?");
            model_head(&format!("judge {judge}: model"), span)
        }
        SpanKind::Tool => tool_head(span, tally),
        SpanKind::Other => other_head(span),
    };
    out.at(depth, head);
    let (before, after) = details(span);
    for detail in before {
        out.at(depth + 1, detail);
    }
    let children: Vec<&Span> = trace.children(Some(&span.span_id)).collect();
    let (mut next_child, mut next_event) = (0, 0);
    while next_child < children.len() || next_event < span.events.len() {
        let child_first = match (children.get(next_child), span.events.get(next_event)) {
            (Some(child), Some(event)) => child.start_time <= event.time,
            (child, _) => child.is_some(),
        };
        if child_first {
            self::span(out, trace, children[next_child], depth + 1, tally);
            next_child += 1;
        } else {
            let event = &span.events[next_event];
            if event.name == "approval.requested" {
                tally.approvals += 1;
            }
            if let Some(text) = event_line(span, event) {
                out.at(depth + 1, text);
            }
            next_event += 1;
        }
    }
    for detail in after {
        out.at(depth + 1, detail);
    }
}

/// The model calls a span sums.
fn calls(span: &Span) -> u64 {
    span.attributes
        .get("loom.calls")
        .and_then(Value::as_u64)
        .unwrap_or(1)
}

fn run_head(trace: &Trace, span: &Span, tally: &mut Tally) -> String {
    let agent = span.text("gen_ai.agent.name").unwrap_or("?");
    let mut head = if span.run_id == trace.run_id {
        format!("run {agent}")
    } else {
        tally.sub_runs += 1;
        format!("sub-run {agent} ({})", span.run_id)
    };
    let _ = write!(head, " — {}", span.text("loom.status").unwrap_or("?"));
    if let Some(kind) = span.text("error.type") {
        let _ = write!(head, " ({kind})");
    }
    match span.duration_ms {
        Some(ms) => {
            let _ = write!(head, ", {}", duration(ms));
        }
        None => head.push_str(", open"),
    }
    let _ = write!(
        head,
        ", {:.6} $",
        span.number("loom.cost_usd").unwrap_or(0.0)
    );
    head
}

fn step_head(span: &Span) -> String {
    let mut head = format!(
        "step {} ({})",
        span.attributes
            .get("loom.step_no")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        span.text("loom.effect").unwrap_or("?")
    );
    match span.duration_ms {
        Some(ms) => {
            let _ = write!(head, " — {}", duration(ms));
        }
        None => head.push_str(" (open)"),
    }
    if let Some(outcome) = span.text("loom.outcome").filter(|o| *o != "ok") {
        let _ = write!(head, " ({outcome})");
    }
    head
}

/// `model fake-1 (FAKE) (main) — 2 ms, 181 → 61 tokens, 0.000000 $`: the config id, then the
/// provider's model name.
fn model_head(what: &str, span: &Span) -> String {
    let model = span.text("gen_ai.request.model").unwrap_or("?");
    let label = match span.text("loom.model") {
        Some(config) => format!("{config} ({model})"),
        None => model.to_owned(),
    };
    let usage = span.usage();
    format!(
        "{what} {label} ({}) — {}, {} → {} tokens, {:.6} $",
        span.text("loom.role").unwrap_or("main"),
        duration(span.number("loom.latency_ms").unwrap_or(0.0)),
        usage.prompt_tokens(),
        usage.output_tokens,
        span.number("loom.cost_usd").unwrap_or(0.0)
    )
}

/// `tool prix_ttc — 3 ms`, `role X`, `sub-agent X`, `— refused before launch`, `(error)`,
/// `(open)`.
fn tool_head(span: &Span, tally: &mut Tally) -> String {
    tally.tool_calls += 1;
    let name = span.text("gen_ai.tool.name").unwrap_or("?");
    let mut head = match span.text("loom.tool_kind") {
        Some("role") => format!("role {name}"),
        Some("agent") => format!("sub-agent {name}"),
        _ => format!("tool {name}"),
    };
    if span.flag("loom.refused") {
        tally.refused += 1;
        head.push_str(" — refused before launch");
    } else if let Some(ms) = span.duration_ms {
        let _ = write!(head, " — {}", duration(ms));
    } else {
        head.push_str(" (open)");
    }
    if span.status == SpanStatus::Error {
        head.push_str(" (error)");
    }
    head
}

/// `approval for envoyer — granted by denis (ok)`, `rejected by …`, `expired`, `waiting`.
fn other_head(span: &Span) -> String {
    let Some(state) = span.text("loom.approval") else {
        return span.name.clone();
    };
    let tool = span.text("gen_ai.tool.name").unwrap_or("?");
    let decision = span
        .events
        .iter()
        .rev()
        .find(|e| e.name.starts_with("approval.") && e.name != "approval.requested");
    let who = decision.and_then(|e| e.text("loom.by")).unwrap_or("?");
    let why = decision
        .and_then(|e| e.text("loom.reason"))
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    let decided = match state {
        "granted" => format!("granted by {who}{why}"),
        "rejected" => format!("rejected by {who}{why}"),
        "expired" => "expired".to_owned(),
        _ => "waiting".to_owned(),
    };
    format!("approval for {tool} — {decided}")
}

/// The `·` lines of a span's own content, those before its children (a model's answers and
/// calls, a tool's arguments) and those after (a tool's result, a judge's verdict).
fn details(span: &Span) -> (Vec<String>, Vec<String>) {
    let mut lines = Vec::new();
    if let Some(Value::Array(messages)) = span.attributes.get("gen_ai.output.messages") {
        for message in messages {
            for part in message["parts"].as_array().into_iter().flatten() {
                match part["type"].as_str() {
                    Some("text") => {
                        let text = part["content"].as_str().unwrap_or_default();
                        if !text.is_empty() {
                            lines.push(format!("· answers   : {}", one_line(text)));
                        }
                    }
                    Some("tool_call") => lines.push(format!(
                        "· calls     : {}({})",
                        part["name"].as_str().unwrap_or("?"),
                        part["arguments"]
                    )),
                    _ => {}
                }
            }
        }
    }
    if let Some(arguments) = span.attributes.get("gen_ai.tool.call.arguments") {
        lines.push(format!("· arguments : {arguments}"));
    }
    let mut after = Vec::new();
    if let Some(result) = span.text("gen_ai.tool.call.result") {
        after.push(format!("· result    : {}", one_line(result)));
    }
    if let Some(verdict) = verdict(span.text("loom.judge"), &span.attributes) {
        after.push(verdict);
    }
    (lines, after)
}

/// `· verdict ton: poli 0.90 — accepted (attempt 1)`.
fn verdict(
    judge: Option<&str>,
    attributes: &std::collections::BTreeMap<String, Value>,
) -> Option<String> {
    let passed = attributes.get("loom.judge.passed")?.as_bool()?;
    let scores: Vec<String> = attributes
        .get("loom.judge.criteria")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{} {:.2}",
                c["name"].as_str().unwrap_or("?"),
                c["score"].as_f64().unwrap_or(0.0)
            )
        })
        .collect();
    let mut line = format!(
        "· verdict {}: {} — {}",
        judge.unwrap_or("?"),
        scores.join(", "),
        if passed { "accepted" } else { "refused" }
    );
    if let Some(attempt) = attributes.get("loom.judge.attempt").and_then(Value::as_u64) {
        let _ = write!(line, " (attempt {attempt})");
    }
    Some(line)
}

/// The line of a span event, or none for what the tree already says.
fn event_line(span: &Span, event: &SpanEvent) -> Option<String> {
    let text = |key: &str| event.text(key).unwrap_or("?");
    Some(match event.name.as_str() {
        "policy.decided" => format!(
            "· policy {} ({}): {}",
            text("loom.policy"),
            text("loom.point"),
            text("loom.decision")
        ),
        "guard.checked" => {
            let mut line = format!(
                "· check {} {}: {}",
                text("loom.guard"),
                text("loom.target"),
                text("loom.outcome")
            );
            if let Some(resolution) = event.text("loom.resolution") {
                let _ = write!(line, " → {resolution}");
            }
            line
        }
        "judge.evaluated" => verdict(event.text("loom.judge"), &event.attributes)?,
        "model.retried" => {
            let attempt = event.attributes.get("loom.attempt").and_then(Value::as_u64);
            format!(
                "· attempt {} failed ({}){}",
                attempt.unwrap_or(0),
                text("loom.error_kind"),
                if event.attributes.contains_key("loom.final") {
                    ""
                } else {
                    ", retrying"
                }
            )
        }
        "model.fell_back" => format!(
            "· fallback: {} → {}",
            text("loom.from_model"),
            text("loom.to_model")
        ),
        "circuit.opened" => format!(
            "· circuit opened: {} {}",
            text("loom.target_kind"),
            text("loom.target")
        ),
        "artifact.stored" => format!("· file stored: {}", text("loom.uri")),
        "budget.exceeded" => format!(
            "· budget of the {} reached: {} ({})",
            text("loom.scope"),
            text("loom.limit"),
            text("loom.action")
        ),
        "idempotency.reused" => format!("· result reused: {}", text("loom.key")),
        "tool.source_unavailable" => format!("· source {} unavailable", text("loom.source")),
        "tool.source_opened" => format!("· source {} opened", text("loom.source")),
        "message.user" => match event.text("loom.kind") {
            Some("repair") => format!("· repair asked ({})", text("loom.policy")),
            _ => format!("· message   : {}", one_line(text("loom.message"))),
        },
        "approval.requested" if span.kind == SpanKind::Other => {
            format!("· asked     : {}", one_line(text("loom.reason")))
        }
        "approval.granted" if span.kind == SpanKind::Other => {
            let corrected = event.attributes.get("loom.arguments")?;
            format!("· corrected : {corrected}")
        }
        "approval.requested" => format!("· approval asked: {}", one_line(text("loom.reason"))),
        "approval.granted" => format!("· approval granted by {}", text("loom.by")),
        "approval.rejected" => format!("· approval rejected by {}", text("loom.by")),
        "approval.expired" => "· approval expired".to_owned(),
        _ => return None,
    })
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
pub(crate) fn duration(ms: f64) -> String {
    if ms < 1000.0 {
        format!("{} ms", ms.round() as u64)
    } else {
        format!("{:.1} s", ms / 1000.0)
    }
}
