//! `loom retention [--tenant T] [--yes] [--json]`: the sessions past `storage.retention`
//! (`Loom::retention`), listed (a dry run, the default) or erased with `--yes`. `--json` prints
//! the `RetentionReport`.

use loom_ia::{Loom, LoomError, RetentionReport};

use crate::{OK, cli::print_json, output::outln};

/// Runs the sweep and prints it.
pub(crate) async fn run(
    loom: &Loom,
    tenant: Option<&str>,
    yes: bool,
    json: bool,
) -> Result<u8, LoomError> {
    let report = loom.retention(tenant, yes).await?;
    if json {
        return Ok(print_json(&report));
    }
    print(&report);
    Ok(OK)
}

fn print(report: &RetentionReport) {
    for tenant in &report.tenants {
        let (Some(days), Some(cutoff)) = (tenant.events_days, tenant.cutoff) else {
            outln!(
                "Tenant {}: no retention (storage.retention.events_days is not set), {} session(s) kept.",
                tenant.tenant_id,
                tenant.kept
            );
            continue;
        };
        outln!(
            "Tenant {}: sessions last written more than {days} day(s) ago, before {}",
            tenant.tenant_id,
            cutoff.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
        for session in &tenant.sessions {
            let last = session
                .updated_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            match &session.deleted {
                Some(deleted) => outln!(
                    "  {}  last write {last}  erased: {} event(s), {} file(s), {} idempotency key(s)",
                    session.session_id,
                    deleted.events_deleted,
                    deleted.files_deleted,
                    deleted.idempotency_keys_deleted
                ),
                None if report.applied => outln!(
                    "  {}  last write {last}  already erased",
                    session.session_id
                ),
                None => outln!(
                    "  {}  last write {last}  {} event(s)",
                    session.session_id,
                    session.events
                ),
            }
        }
        let verb = if report.applied {
            "erased"
        } else {
            "would be erased"
        };
        outln!(
            "{} session(s) {verb}, {} kept.",
            tenant.sessions.len(),
            tenant.kept
        );
    }
    if !report.applied && report.sessions() > 0 {
        outln!("Dry run: nothing was erased; add --yes to erase these sessions.");
    }
}
