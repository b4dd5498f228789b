//! The commands on runs: `validate`, `run` (and its `--stream` progress), `approve` and
//! `reject`, `inspect`, `report`, `resume`, `cancel`, `steer`.

use std::sync::Mutex;

use loom_ia::{Event, Loom, LoomError, Period, RunOptions, RunStatus, core::event::Payload};

use crate::{
    FAILED, OK, REFUSED,
    output::{out, outln},
    render,
};

use super::{args::DecisionArgs, exit::print_json};

pub(super) async fn validate(loom: &Loom) -> Result<u8, LoomError> {
    let validation = loom.validate().await?;
    out!("{}", render::validation(&validation));
    Ok(OK)
}

pub(super) async fn run(
    loom: &Loom,
    agent: &str,
    message: &str,
    options: RunOptions,
    json: bool,
    stream: bool,
) -> Result<u8, LoomError> {
    // Ctrl-C cancels the run: it closes as `cancelled` in its journal instead of being left open.
    let interrupt = {
        let loom = loom.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("Interrupted.");
                loom.cancel_all();
            }
        })
    };
    let tenant = options
        .tenant_id
        .clone()
        .unwrap_or_else(|| loom_ia::DEFAULT_TENANT.to_owned());
    let result = if stream {
        let progress = Progress {
            deltas: !json,
            wrote_text: Mutex::new(false),
        };
        let result = loom
            .run_observed(agent, message, options, &progress)
            .await?;
        if progress.wrote() {
            outln!();
        }
        result
    } else {
        loom.run(agent, message, options).await?
    };
    interrupt.abort();
    // A compaction this run triggered runs in this process: the report says what it did, and
    // the process does not exit under it.
    let result = if loom.compactions_idle().await {
        loom.result(&result.run_ref(&tenant)).await?
    } else {
        result
    };
    Ok(report_result(&result, &tenant, json, stream))
}

/// `loom compact`: compacts a session now and says what became of it.
pub(super) async fn compact(
    loom: &Loom,
    session: &str,
    tenant: Option<&str>,
    json: bool,
) -> Result<u8, LoomError> {
    let note = loom.compact(tenant, session).await?;
    if json {
        print_json(&note);
    }
    eprintln!("{}", render::compaction_line(&note));
    Ok(if matches!(note.outcome.as_str(), "applied" | "nothing") {
        OK
    } else {
        FAILED
    })
}

/// Prints a run's result as `loom run` does: the answer on stdout (nothing for a paused run),
/// the summary on stderr; the exit code says whether it completed.
fn report_result(result: &loom_ia::RunResult, tenant: &str, json: bool, streamed: bool) -> u8 {
    if json {
        print_json(result);
    } else if !streamed && !waits(result.status) {
        outln!(
            "{}",
            if result.text.is_empty() {
                "—"
            } else {
                &result.text
            }
        );
    }
    eprint!("{}", render::run_summary(result, tenant));
    if result.ok() { OK } else { FAILED }
}

/// Whether a run stopped to wait for a human: its own approval, or a sub-run's.
fn waits(status: RunStatus) -> bool {
    matches!(status, RunStatus::Paused | RunStatus::WaitingChild)
}

/// `approve` (with `arguments`, possibly `None` inside) and `reject` (`arguments` `None`).
pub(super) async fn decide(
    loom: &Loom,
    args: DecisionArgs,
    arguments: Option<Option<String>>,
) -> Result<u8, LoomError> {
    let approving = arguments.is_some();
    let corrected = match arguments.flatten() {
        Some(_) if args.call.is_none() => {
            eprintln!("error: --arguments corrects one named call: add --call.");
            return Ok(REFUSED);
        }
        Some(text) => match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(value) => Some(value),
            Err(error) => {
                eprintln!("error: --arguments is not valid JSON: {error}");
                return Ok(REFUSED);
            }
        },
        None => None,
    };
    let by = args.by.clone().unwrap_or_else(user_name);
    let run = loom
        .locate(
            &args.run_id,
            args.session.as_deref(),
            args.tenant.as_deref(),
        )
        .await?;
    let call = args.call.as_deref();
    let reason = args.reason.as_deref();
    let decided = if approving {
        loom.approve(&run, call, &by, reason, corrected, args.no_wait)
            .await?
    } else {
        loom.reject(&run, call, &by, reason, args.no_wait).await?
    };
    let verb = if approving { "Approved" } else { "Rejected" };
    eprintln!("{verb}: {}", decided.calls.join(", "));
    let result = decided.result;
    if args.no_wait {
        if args.json {
            print_json(&result);
        }
        eprintln!(
            "Run {}: decision journaled; the run stays {} until `loom resume {}{}`.",
            result.run_id,
            result.status,
            result.run_id,
            render::tenant_flag(&run.tenant_id)
        );
        return Ok(OK);
    }
    if args.json {
        print_json(&result);
    } else if !waits(result.status) {
        outln!(
            "{}",
            if result.text.is_empty() {
                "—"
            } else {
                &result.text
            }
        );
    }
    eprint!("{}", render::run_summary(&result, &run.tenant_id));
    Ok(if result.ok() { OK } else { FAILED })
}

/// Who decides when `--by` is not given: the user name, else "cli".
pub(crate) fn user_name() -> String {
    ["USER", "USERNAME", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|n| !n.trim().is_empty()))
        .unwrap_or_else(|| "cli".to_owned())
}

/// `--stream`: text deltas on stdout as they come, one progress line per event on stderr.
struct Progress {
    deltas: bool,
    wrote_text: Mutex<bool>,
}

impl Progress {
    fn wrote(&self) -> bool {
        self.wrote_text.lock().map(|w| *w).unwrap_or(false)
    }
}

impl loom_ia::Observer for Progress {
    fn event(&self, event: &Event) {
        if let Some(line) = render::progress_line(event) {
            eprintln!("{line}");
        }
        if let Payload::ModelResponded(_) = &event.payload
            && self.wrote()
            && self.deltas
        {
            outln!();
            if let Ok(mut wrote) = self.wrote_text.lock() {
                *wrote = false;
            }
        }
    }

    fn reset(&self, _run_id: &str) {
        // The attempt that was streaming failed: what was shown of it is not the answer.
        if self.wrote() && self.deltas {
            outln!();
            if let Ok(mut wrote) = self.wrote_text.lock() {
                *wrote = false;
            }
        }
        eprintln!("· answer restarted");
    }

    fn text_delta(&self, _run_id: &str, text: &str) {
        if !self.deltas {
            return;
        }
        out!("{text}");
        if let Ok(mut wrote) = self.wrote_text.lock() {
            *wrote = true;
        }
    }
}

/// Where to look for a run: `--session` and `--tenant`.
pub(super) struct At {
    session: Option<String>,
    tenant: Option<String>,
}

impl At {
    pub(super) fn new(session: Option<String>, tenant: Option<String>) -> At {
        At { session, tenant }
    }

    pub(super) async fn locate(
        &self,
        loom: &Loom,
        run_id: &str,
    ) -> Result<loom_ia::RunRef, LoomError> {
        loom.locate(run_id, self.session.as_deref(), self.tenant.as_deref())
            .await
    }
}

pub(super) async fn inspect(
    loom: &Loom,
    run_id: &str,
    at: &At,
    full: bool,
    json: bool,
) -> Result<u8, LoomError> {
    let run = at.locate(loom, run_id).await?;
    let trace = loom.trace(&run).await?;
    if json {
        return Ok(print_json(&trace));
    }
    out!("{}", crate::inspect::trace(&trace, full));
    Ok(OK)
}

/// What `loom report` covers.
pub(super) enum ReportOf {
    Run {
        run_id: String,
        session: Option<String>,
    },
    Session(String),
    Tenant(Period),
}

pub(super) async fn report(
    loom: &Loom,
    target: ReportOf,
    tenant: Option<&str>,
    json: bool,
) -> Result<u8, LoomError> {
    let report = match target {
        ReportOf::Run { run_id, session } => {
            let run = loom.locate(&run_id, session.as_deref(), tenant).await?;
            loom.report(&run).await?
        }
        ReportOf::Session(session) => loom.session_report(&session, tenant).await?,
        ReportOf::Tenant(period) => {
            let tenant = tenant.unwrap_or(loom_ia::DEFAULT_TENANT);
            loom.tenant_report(tenant, period, chrono::Utc::now())
                .await?
        }
    };
    if json {
        return Ok(print_json(&report));
    }
    out!("{}", render::usage(&report));
    Ok(OK)
}

pub(super) async fn resume(
    loom: &Loom,
    run_id: &str,
    at: &At,
    json: bool,
) -> Result<u8, LoomError> {
    let run = at.locate(loom, run_id).await?;
    let result = loom.resume(&run).await?;
    Ok(report_result(&result, &run.tenant_id, json, false))
}

pub(super) async fn cancel(
    loom: &Loom,
    run_id: &str,
    at: &At,
    by: Option<String>,
) -> Result<u8, LoomError> {
    let run = at.locate(loom, run_id).await?;
    if loom.cancel(&run, by).await? {
        eprintln!("Run {run_id}: cancelled.");
        Ok(OK)
    } else {
        eprintln!("Run {run_id}: already closed, nothing to cancel.");
        Ok(REFUSED)
    }
}

pub(super) async fn steer(
    loom: &Loom,
    run_id: &str,
    message: &str,
    at: &At,
) -> Result<u8, LoomError> {
    let run = at.locate(loom, run_id).await?;
    loom.steer(&run, message).await?;
    eprintln!("Run {run_id}: message journaled; the run reads it before its next model call.");
    Ok(OK)
}
