//! `loom sessions`: list, show, files, export, repair, delete.
//!
//! `list --json` and `show --json` print what `GET /v1/sessions` and `GET /v1/sessions/{id}`
//! answer (`[SessionListed]`, `SessionInfo`), and `files --json` what
//! `GET /v1/sessions/{id}/files` answers (`[SessionFile]`); the text is for people.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use clap::Subcommand;
use loom_ia::{FILE_ORIGINS, Loom, LoomError, SessionFile};

use crate::{
    OK, REFUSED,
    cli::{print_json, user_name},
    output::out,
    render,
};

#[derive(Debug, Subcommand)]
pub(crate) enum SessionsCommand {
    /// The sessions, most recent first.
    List {
        /// Print them as JSON (`[{session_id, last_seq, updated_at}]`).
        #[arg(long)]
        json: bool,
    },
    /// A session: its runs (sub-runs included) and the approvals waiting in it.
    Show {
        /// Session id.
        session: String,
        /// Print it as JSON (`{session_id, last_seq, updated_at, runs, pending_approvals}`).
        #[arg(long)]
        json: bool,
    },
    /// The files stored beside a session (attachments, tool outputs, offloaded results), or
    /// with --out their bytes written to a folder.
    Files {
        /// Session id.
        session: String,
        /// Only the files of this origin (repeatable).
        #[arg(long = "origin", value_name = "ORIGIN", value_parser = FILE_ORIGINS)]
        origins: Vec<String>,
        /// Write the files into this folder (created if needed), each under its name when it
        /// has a plain one of its own, else as `<sha256>.<ext>`.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// With --out: overwrite files that exist (without it, nothing is written then).
        #[arg(long, requires = "out")]
        force: bool,
        /// Print the list as JSON (`[SessionFile]`).
        #[arg(long)]
        json: bool,
    },
    /// The session's journal as JSONL.
    Export {
        /// Session id.
        session: String,
        /// Write to this file instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Export the events that read back, leaving out (and naming on stderr) the lines of a
        /// corrupted journal that do not.
        #[arg(long = "valid-only")]
        valid_only: bool,
    },
    /// Set the unreadable lines of a corrupted journal aside: their bytes are kept beside it
    /// (`<session>.jsonl.corrupt`, or the SQLite table `set_aside`) and a `session.repaired`
    /// event takes each one's place, so the session reads again.
    Repair {
        /// Session id.
        session: String,
        /// Who repairs (journaled; default: the user name).
        #[arg(long, value_name = "NAME")]
        by: Option<String>,
        /// Confirm (without it, the lines that would be set aside are only listed).
        #[arg(long)]
        yes: bool,
    },
    /// Erase a session: its journal and its files (GDPR).
    Delete {
        /// Session id.
        session: String,
        /// Confirm the deletion.
        #[arg(long)]
        yes: bool,
    },
}

/// `loom sessions …` in `tenant` (default `default`), refused when the tenant is not declared.
pub(crate) async fn run(
    loom: &Loom,
    command: SessionsCommand,
    tenant: Option<&str>,
) -> Result<u8, LoomError> {
    let tenant_id = tenant.unwrap_or(loom_ia::DEFAULT_TENANT);
    loom.config()
        .check_tenant(tenant_id)
        .map_err(|e| LoomError::Refused(e.to_string()))?;
    match command {
        SessionsCommand::List { json } => {
            let sessions = loom.sessions(tenant).await?;
            if json {
                return Ok(print_json(&sessions));
            }
            out!("{}", render::session_list(&sessions));
            Ok(OK)
        }
        SessionsCommand::Show { session, json } => {
            let info = loom.session(&session, tenant).await?;
            if json {
                return Ok(print_json(&info));
            }
            out!("{}", render::session(&info, tenant_id));
            Ok(OK)
        }
        SessionsCommand::Files {
            session,
            origins,
            out,
            force,
            json,
        } => {
            let files = loom.session_files(&session, &origins, tenant).await?;
            if let Some(dir) = out {
                write_files(loom, &session, tenant, &files, &dir, force).await?;
            }
            if json {
                return Ok(print_json(&files));
            }
            out!("{}", render::session_files(&files));
            Ok(OK)
        }
        SessionsCommand::Export {
            session,
            out,
            valid_only,
        } => {
            let jsonl = if valid_only {
                valid_events(loom, &session, tenant).await?
            } else {
                loom.export_session(&session, tenant).await?
            };
            match out {
                Some(path) => {
                    std::fs::write(&path, jsonl).map_err(|e| {
                        LoomError::Refused(format!("cannot write {}: {e}", path.display()))
                    })?;
                    eprintln!("Session {session} exported to {}.", path.display());
                }
                None => out!("{jsonl}"),
            }
            Ok(OK)
        }
        SessionsCommand::Delete { session, yes } => {
            if !yes {
                eprintln!(
                    "Deleting session {session} erases its journal and its files for good: add --yes."
                );
                return Ok(REFUSED);
            }
            let deleted = loom.delete_session(&session, tenant).await?;
            eprintln!(
                "Session {session}: {} event(s) and {} file(s) deleted.",
                deleted.events_deleted, deleted.files_deleted
            );
            Ok(OK)
        }
        SessionsCommand::Repair { session, by, yes } => {
            repair(loom, &session, tenant, by, yes).await
        }
    }
}

/// The name each file is written under in `--out`: its own name when it is a plain file name
/// (no folder, not hidden) that no other file of the list takes, else `<sha256>.<ext>`.
fn out_names(files: &[SessionFile]) -> Vec<String> {
    let plain = |name: &str| {
        !name.is_empty()
            && !name.starts_with('.')
            && !name.contains(['/', '\\', '\0'])
            && Path::new(name).file_name().is_some_and(|n| n == name)
    };
    let mut taken: BTreeMap<&str, usize> = BTreeMap::new();
    for file in files {
        if let Some(name) = file.name.as_deref().filter(|n| plain(n)) {
            *taken.entry(name).or_default() += 1;
        }
    }
    files
        .iter()
        .map(|file| match file.name.as_deref() {
            Some(name) if plain(name) && taken.get(name) == Some(&1) => name.to_owned(),
            _ => file.file.clone(),
        })
        .collect()
}

/// `sessions files --out DIR`: checks first that no file would be overwritten (unless
/// `force`), then writes each file's bytes.
async fn write_files(
    loom: &Loom,
    session: &str,
    tenant: Option<&str>,
    files: &[SessionFile],
    dir: &Path,
    force: bool,
) -> Result<(), LoomError> {
    let cannot = |what: &Path, e: std::io::Error| {
        LoomError::Refused(format!("cannot write {}: {e}", what.display()))
    };
    let names = out_names(files);
    if !force && let Some(existing) = names.iter().map(|n| dir.join(n)).find(|p| p.exists()) {
        return Err(LoomError::Refused(format!(
            "{} exists: add --force to overwrite it (nothing was written)",
            existing.display()
        )));
    }
    std::fs::create_dir_all(dir).map_err(|e| cannot(dir, e))?;
    for (file, name) in files.iter().zip(&names) {
        let (_, bytes) = loom.session_file(session, &file.file, tenant).await?;
        let path = dir.join(name);
        std::fs::write(&path, &bytes).map_err(|e| cannot(&path, e))?;
        eprintln!("Written    : {} ({} bytes)", path.display(), bytes.len());
    }
    eprintln!("{} file(s) written to {}.", files.len(), dir.display());
    Ok(())
}

/// The events of `session` that read back, naming on stderr each line left out.
async fn valid_events(
    loom: &Loom,
    session: &str,
    tenant: Option<&str>,
) -> Result<String, LoomError> {
    let export = loom.export_valid(session, tenant).await?;
    for line in &export.skipped {
        eprintln!(
            "skipped: corrupted at {}:{} ({} bytes): {}",
            export.journal, line.line, line.bytes, line.error
        );
    }
    eprintln!(
        "{} event(s) exported, {} unreadable line(s) left out.",
        export.events,
        export.skipped.len()
    );
    Ok(export.jsonl)
}

/// `loom sessions repair`: lists the unreadable lines, and with `yes` sets them aside.
async fn repair(
    loom: &Loom,
    session: &str,
    tenant: Option<&str>,
    by: Option<String>,
    yes: bool,
) -> Result<u8, LoomError> {
    if !yes {
        let export = loom.export_valid(session, tenant).await?;
        if export.skipped.is_empty() {
            eprintln!("Session {session}: every line reads back, nothing to repair.");
            return Ok(OK);
        }
        for line in &export.skipped {
            eprintln!(
                "corrupted at {}:{} ({} bytes): {}",
                export.journal, line.line, line.bytes, line.error
            );
        }
        eprintln!(
            "Repairing sets these {} line(s) aside (their bytes are kept) and journals a \
             session.repaired event in place of each: add --yes.",
            export.skipped.len()
        );
        return Ok(REFUSED);
    }
    let by = by.unwrap_or_else(user_name);
    let repaired = loom.repair_session(session, tenant, Some(&by)).await?;
    if repaired.set_aside.is_empty() {
        eprintln!("Session {session}: every line reads back, nothing to repair.");
        return Ok(OK);
    }
    for line in &repaired.set_aside {
        eprintln!(
            "set aside: corrupted at {}:{} ({} bytes): {}",
            repaired.journal, line.line, line.bytes, line.error
        );
    }
    eprintln!(
        "Session {session}: {} line(s) set aside in {}, each replaced by a session.repaired event.",
        repaired.set_aside.len(),
        repaired.moved_to
    );
    Ok(OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(sha: &str, name: Option<&str>) -> SessionFile {
        SessionFile {
            file: format!("{sha}.png"),
            uri: format!("artifact://default/s/{sha}.png"),
            name: name.map(str::to_owned),
            media_type: "image/png".into(),
            size: 1,
            origin: "attachment".into(),
            run_id: "r".into(),
            call_id: None,
            stored_at: chrono::Utc::now(),
        }
    }

    /// A file keeps its name only when it is a plain one that no other file takes: a name from
    /// the journal never leads out of the folder.
    #[test]
    fn files_are_written_under_plain_unique_names_only() {
        let files = [
            file("a1", Some("plan.png")),
            file("b2", Some("../../etc/passwd")),
            file("c3", Some("twice.png")),
            file("d4", Some("twice.png")),
            file("e5", None),
            file("f6", Some(".hidden")),
            file("g7", Some("dir/inner.png")),
            file("h8", Some("..")),
        ];
        assert_eq!(
            out_names(&files),
            [
                "plan.png", "b2.png", "c3.png", "d4.png", "e5.png", "f6.png", "g7.png", "h8.png"
            ]
        );
    }
}
