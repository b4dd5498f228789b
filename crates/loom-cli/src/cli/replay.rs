//! `loom replay`: a closed run re-driven from its journal (or from an exported JSONL file) with
//! the configuration of today, its models and tools answered from the journal; exit code 0 when
//! identical, 1 at the first divergence, 2 when it cannot be replayed.

use std::path::{Path, PathBuf};

use loom_ia::{Event, Loom, LoomError, ReplayReport};
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
}

pub(super) async fn replay(loom: &Loom, args: ReplayArgs) -> Result<u8, LoomError> {
    let reports = match (&args.journal, &args.run_id) {
        (Some(_), _) if args.export.is_some() => {
            return Err(LoomError::Refused(
                "--export writes a run of this configuration's journal: it cannot be combined \
                 with --journal"
                    .into(),
            ));
        }
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
            let mut reports = Vec::with_capacity(runs.len());
            for run_id in &runs {
                reports.push(loom.replay_events(&session, run_id).await?);
            }
            reports
        }
        (None, Some(run_id)) => {
            let run = args.at.locate(loom, run_id).await?;
            if let Some(file) = &args.export {
                let events = loom.export_run(&run).await?;
                write_journal(file, &events)?;
                eprintln!("Exported {} events to {}", events.len(), file.display());
            }
            vec![loom.replay(&run).await?]
        }
        (None, None) => {
            return Err(LoomError::Invalid(
                "name the run to replay, or a journal file with --journal".into(),
            ));
        }
    };
    let code = if reports.iter().all(ReplayReport::is_identical) {
        OK
    } else {
        FAILED
    };
    if args.json {
        let printed = match (args.run_id.is_some(), reports.as_slice()) {
            (true, [one]) => print_json(one),
            _ => print_json(&reports),
        };
        return Ok(if printed == OK { code } else { printed });
    }
    let text: Vec<String> = reports.iter().map(render).collect();
    out!("{}", text.join("\n"));
    Ok(code)
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
