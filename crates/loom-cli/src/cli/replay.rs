//! `loom replay`: a closed run re-driven from its journal (or from an exported JSONL file) with
//! the configuration of today, its models and tools answered from the journal; exit code 0 when
//! identical, 1 at the first divergence, 2 when it cannot be replayed. `--mode variant`: the
//! same conversation with other models (`--model STEP=MODEL`) and tool doubles
//! (`--double TOOL=REF`), reported side by side; exit code 0 when the variant completed with no
//! tool call refused, 1 otherwise, 2 when it cannot be replayed.

use std::path::{Path, PathBuf};

use loom_ia::{
    Event, Loom, LoomError, ReplayReport, RunSide, ToolOutput, VariantOptions, VariantReport,
    testing::ToolDouble,
};
use serde_json::Value;

use crate::{FAILED, OK, output::out};

use super::{exit::print_json, runs::At};

/// What `loom replay` was asked.
pub(super) struct ReplayArgs {
    pub(super) run_id: Option<String>,
    pub(super) at: At,
    pub(super) journal: Option<PathBuf>,
    pub(super) json: bool,
    pub(super) export: Option<PathBuf>,
    pub(super) variant: bool,
    pub(super) models: Vec<String>,
    pub(super) doubles: Vec<String>,
}

pub(super) async fn replay(loom: &Loom, args: ReplayArgs) -> Result<u8, LoomError> {
    if args.variant {
        return variant(loom, args).await;
    }
    if !args.models.is_empty() || !args.doubles.is_empty() {
        return Err(LoomError::Invalid(
            "--model and --double change a variant: add --mode variant".into(),
        ));
    }
    let reports = match target(loom, &args).await? {
        Target::File { session, runs } => {
            let mut reports = Vec::with_capacity(runs.len());
            for run_id in &runs {
                reports.push(loom.replay_events(&session, run_id).await?);
            }
            reports
        }
        Target::Run(run) => vec![loom.replay(&run).await?],
    };
    let ok = reports.iter().all(ReplayReport::is_identical);
    Ok(finish(&args, &reports, ok, render))
}

/// What a replay re-drives: the closed root runs of a journal file (or the one named), or a
/// run of this configuration's journal.
enum Target {
    File {
        session: Vec<Event>,
        runs: Vec<String>,
    },
    Run(loom_ia::RunRef),
}

/// The target `args` name; with `--export` (an exact replay), the run is written to its file
/// first.
async fn target(loom: &Loom, args: &ReplayArgs) -> Result<Target, LoomError> {
    match (&args.journal, &args.run_id) {
        (Some(_), _) if args.export.is_some() => Err(LoomError::Refused(
            "--export writes a run of this configuration's journal: it cannot be combined \
             with --journal"
                .into(),
        )),
        (Some(file), run_id) => {
            let session = read_journal(file)?;
            let runs = match run_id {
                Some(run_id) => vec![run_id.clone()],
                None => Loom::closed_root_runs(&session),
            };
            if runs.is_empty() {
                return Err(LoomError::Invalid(format!(
                    "{}: the file holds no closed run to replay",
                    file.display()
                )));
            }
            Ok(Target::File { session, runs })
        }
        (None, Some(run_id)) => {
            let run = args.at.locate(loom, run_id).await?;
            // A variant exports its own run, once it ran.
            if let (Some(file), false) = (&args.export, args.variant) {
                export(file, &loom.export_run(&run).await?)?;
            }
            Ok(Target::Run(run))
        }
        (None, None) => Err(LoomError::Invalid(
            "name the run to replay, or a journal file with --journal".into(),
        )),
    }
}

/// Prints `reports` (as JSON with `--json`: one object for a named run, else an array) and
/// returns the exit code: `OK` when `ok`, else `FAILED`.
fn finish<R: serde::Serialize>(
    args: &ReplayArgs,
    reports: &[R],
    ok: bool,
    render: fn(&R) -> String,
) -> u8 {
    let code = if ok { OK } else { FAILED };
    if args.json {
        let printed = match (args.run_id.is_some(), reports) {
            (true, [one]) => print_json(one),
            _ => print_json(&reports),
        };
        return if printed == OK { code } else { printed };
    }
    let text: Vec<String> = reports.iter().map(render).collect();
    out!("{}", text.join("\n"));
    code
}

/// `loom replay --mode variant`.
async fn variant(loom: &Loom, args: ReplayArgs) -> Result<u8, LoomError> {
    let options = variant_options(&args.models, &args.doubles)?;
    let reports = match target(loom, &args).await? {
        Target::File { session, runs } => {
            let mut reports = Vec::with_capacity(runs.len());
            for run_id in &runs {
                reports.push(
                    loom.replay_variant_events(&session, run_id, &options)
                        .await?,
                );
            }
            reports
        }
        Target::Run(run) => {
            let report = loom.replay_variant(&run, &options).await?;
            if let Some(file) = &args.export {
                export(file, &report.journal)?;
            }
            vec![report]
        }
    };
    let ok = reports.iter().all(VariantReport::is_success);
    Ok(finish(&args, &reports, ok, render_variant))
}

/// The variant of `--model STEP=MODEL` and `--double TOOL=REF`.
fn variant_options(models: &[String], doubles: &[String]) -> Result<VariantOptions, LoomError> {
    let mut options = VariantOptions::default();
    for pair in models {
        let (step, model) = split(pair, "--model", "STEP=MODEL")?;
        if options.models.contains_key(step) {
            return Err(LoomError::Invalid(format!(
                "--model {pair}: step {step} is named twice"
            )));
        }
        options = options.model(step, model);
    }
    for pair in doubles {
        let (tool, reference) = split(pair, "--double", "TOOL=REF")?;
        if options.doubles.contains_key(tool) {
            return Err(LoomError::Invalid(format!(
                "--double {pair}: tool {tool} is named twice"
            )));
        }
        let result = double_result(reference)
            .map_err(|reason| LoomError::Invalid(format!("--double {pair}: {reason}")))?;
        options = options.double(tool, ToolDouble::returning(tool, result));
    }
    Ok(options)
}

/// `NAME=VALUE`, both non-empty.
fn split<'a>(pair: &'a str, flag: &str, shape: &str) -> Result<(&'a str, &'a str), LoomError> {
    match pair.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() && !value.trim().is_empty() => {
            Ok((name.trim(), value.trim()))
        }
        _ => Err(LoomError::Invalid(format!(
            "{flag} {pair}: expected {shape}"
        ))),
    }
}

/// The result a double's REF gives: a JSON value inline or in the file `@FILE`; a JSON string
/// is a text result, any other value a structured result.
fn double_result(reference: &str) -> Result<ToolOutput, String> {
    let text = match reference.strip_prefix('@') {
        Some(file) => std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?,
        None => reference.to_owned(),
    };
    let value: Value = serde_json::from_str(&text).map_err(|e| {
        format!("not a JSON value ({e}); a text result is a JSON string, e.g. '\"sent\"'")
    })?;
    Ok(match value {
        Value::String(text) => ToolOutput::text(text),
        other => ToolOutput::json(other),
    })
}

/// The human-readable report of one variant replay: the journal and the variant side by side.
pub(crate) fn render_variant(report: &VariantReport) -> String {
    let (o, v) = (&report.original, &report.variant);
    let counts = &report.counts;
    let changed: Vec<String> = report
        .models
        .iter()
        .map(|(step, model)| format!("{step}={model}"))
        .chain(report.doubles.iter().map(|tool| format!("double {tool}")))
        .collect();
    let mut text = format!(
        "Run        : {}\nSession    : {}\nAgent      : {}\nVariant    : {}\n",
        report.run_id,
        report.session_id,
        report.agent,
        if changed.is_empty() {
            "the configuration of today".to_owned()
        } else {
            changed.join(", ")
        },
    );
    let row =
        |label: &str, left: String, right: String| format!("{label:<11}: {left:<30} | {right}\n");
    text.push_str(&row("", "journal".into(), "variant".into()));
    text.push_str(&row("End", o.status.clone(), v.status.clone()));
    text.push_str(&row(
        "Models",
        format!("{} call(s)", o.model_calls),
        format!(
            "{} call(s): {} made, {} from the journal",
            v.model_calls, counts.models_called, counts.models_served
        ),
    ));
    text.push_str(&row(
        "Tools",
        format!("{} call(s)", o.tool_calls),
        format!(
            "{} call(s): {} from the journal, {} doubled, {} run, {} refused",
            v.tool_calls,
            counts.tools_served,
            counts.tools_doubled,
            counts.tools_run,
            counts.tools_refused
        ),
    ));
    let tokens = |side: &RunSide| format!("{}/{}", side.input_tokens, side.output_tokens);
    text.push_str(&row("Tokens", tokens(o), tokens(v)));
    let cost = |side: &RunSide| format!("{:.6} $", side.cost_usd);
    text.push_str(&row("Cost", cost(o), cost(v)));
    let latency = |side: &RunSide| {
        format!(
            "{} ms ({:.0} ms in models)",
            side.duration_ms, side.model_latency_ms
        )
    };
    text.push_str(&row("Duration", latency(o), latency(v)));
    let guards = |side: &RunSide| {
        let mut line = if side.guards.is_empty() {
            "—".to_owned()
        } else {
            side.guards.join("; ")
        };
        if side.unverified {
            line.push_str(" (unverified)");
        }
        if side.fallback {
            line.push_str(" (fallback)");
        }
        line
    };
    text.push_str(&row("Guards", guards(o), guards(v)));
    for miss in &report.misses {
        text.push_str(&format!("Refused    : {} {}\n", miss.kind, miss.detail));
    }
    text.push_str(&format!(
        "Answer     : {}\n  journal  : {}\n  variant  : {}\n",
        if report.same_answer {
            "the same"
        } else {
            "different"
        },
        answer_line(&o.text),
        answer_line(&v.text),
    ));
    text
}

/// An answer on one line (`—` when there is none).
fn answer_line(text: &str) -> String {
    if text.is_empty() {
        "—".to_owned()
    } else {
        text.replace('\n', "\n             ")
    }
}

/// The events of a JSONL journal file, each line read and checked.
fn read_journal(file: &Path) -> Result<Vec<Event>, LoomError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| LoomError::Invalid(format!("{}: {e}", file.display())))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            Event::from_json(line)
                .map_err(|e| LoomError::Invalid(format!("{}:{}: {e}", file.display(), index + 1)))
        })
        .collect()
}

/// Writes `events` to `file` and says so on stderr.
fn export(file: &Path, events: &[Event]) -> Result<(), LoomError> {
    write_journal(file, events)?;
    eprintln!("Exported {} events to {}", events.len(), file.display());
    Ok(())
}

/// Writes `events` as JSONL, one event a line.
fn write_journal(file: &Path, events: &[Event]) -> Result<(), LoomError> {
    let mut text = String::new();
    for event in events {
        text.push_str(&event.to_json());
        text.push('\n');
    }
    std::fs::write(file, text).map_err(|e| LoomError::Invalid(format!("{}: {e}", file.display())))
}

/// The human-readable report of one replay.
pub(crate) fn render(report: &ReplayReport) -> String {
    let counts = &report.counts;
    let mut text = format!(
        "Run        : {}\nSession    : {}\nAgent      : {}\nEnd        : {} in the journal, {} in the replay\n\
         Models     : {} answer(s) in the journal, {} served to the replay\n\
         Tools      : {} result(s) in the journal, {} served to the replay\n",
        report.run_id,
        report.session_id,
        report.agent,
        report.recorded_status,
        report.replay_status,
        counts.models_recorded,
        counts.models_served,
        counts.tools_recorded,
        counts.tools_served,
    );
    for miss in &report.misses {
        text.push_str(&format!(
            "Unanswered : {} {} (the journal has no answer; nothing was called)\n",
            miss.kind, miss.detail
        ));
    }
    match &report.divergence {
        None => text.push_str("Identical  : the run replays as it was, call by call.\n"),
        Some(divergence) => {
            let at = match divergence.seq {
                Some(seq) => format!("event #{seq} ({})", divergence.event_type),
                None => format!("an extra {} event in the replay", divergence.event_type),
            };
            text.push_str(&format!("Divergence : {at} of run {}\n", divergence.run_id));
            let field = if divergence.field.is_empty() {
                "(the event itself)"
            } else {
                divergence.field.as_str()
            };
            text.push_str(&format!("  field    : {field}\n"));
            if let Some(part) = part_name(&divergence.field) {
                text.push_str(&format!("  changed  : the model request's {part}\n"));
            }
            text.push_str(&format!(
                "  expected : {}\n  got      : {}\n",
                shown(&divergence.expected),
                shown(&divergence.got)
            ));
        }
    }
    text
}

/// What a `request_parts` field of a model request covers.
fn part_name(field: &str) -> Option<&'static str> {
    let part = field.strip_prefix("payload.request_parts.")?;
    Some(match part {
        "model" => "model",
        "system" => "system prompt",
        "tools" => "tools offered",
        "messages" => "messages",
        "messages_count" => "number of messages",
        "settings" => "settings (tool choice, token cap, parameters, output schema)",
        _ => return None,
    })
}

/// A value on one line, cut at 200 characters.
fn shown(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}
