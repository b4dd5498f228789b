//! The journal through the `loom` binary: a corrupted session named "corrupted at
//! `<file>:<line>`" by every command that meets it, its valid events exported, its unreadable
//! line set aside (and journaled); a run refused in a session of another agent (exit code 2);
//! the offset index beside a session, kept by the runs and rebuilt when a crash damaged it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::{fs, process::Output};

use serde_json::Value;

/// A project with two agents on the echoing fake model and a JSONL journal in `data/`.
fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("loom.yaml"),
        "version: 1\n\
         models:\n  - {id: fake, sdk: fake, model: FAKE}\n\
         storage:\n  events: {backend: jsonl, path: data}\n\
         telemetry:\n  logging: {level: ERROR}\n",
    )
    .unwrap();
    fs::create_dir_all(dir.path().join("agents")).unwrap();
    for agent in ["chef", "devis"] {
        fs::write(
            dir.path().join("agents").join(format!("{agent}.yaml")),
            format!("name: {agent}\nmain:\n  model: fake\n"),
        )
        .unwrap();
    }
    dir
}

fn ok(out: &Output) -> (String, String) {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    (stdout, stderr)
}

/// A session whose last line cannot be read: `inspect` and `export` say where it is corrupted
/// (not that the run is unknown), the tenant's report leaves it out, `export --valid-only`
/// gives the rest, and `repair` sets the line aside, journaling what it did.
#[test]
fn a_corrupted_session_is_named_exported_and_repaired() {
    let dir = project();
    let (_, stderr) = ok(&loom(
        dir.path(),
        &["run", "chef", "Bonjour", "--session", "bad"],
    ));
    let run = run_id_of(&stderr);
    ok(&loom(
        dir.path(),
        &["run", "chef", "Salut", "--session", "good"],
    ));
    let path = dir.path().join("data/default/bad.jsonl");
    let original = fs::read_to_string(&path).unwrap();
    let mut lines: Vec<&str> = original.lines().collect();
    assert_eq!(lines.len(), 8);
    let last = lines[7].replace("\"status\":\"ok\"", "\"status\":\"error\"");
    lines[7] = &last;
    fs::write(&path, lines.join("\n") + "\n").unwrap();
    let at = format!("corrupted at {}:8", path.canonicalize().unwrap().display());
    let at_relative = "bad.jsonl:8";

    for args in [
        vec!["inspect", run.as_str()],
        vec!["sessions", "export", "bad"],
    ] {
        let out = loom(dir.path(), &args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("journal corrupted at") && stderr.contains(at_relative),
            "{args:?}: {stderr} (expected {at})"
        );
        assert!(stderr.contains("loom sessions repair"), "{stderr}");
    }
    // The tenant's report reads every session: the corrupted one is left out.
    ok(&loom(dir.path(), &["report", "--json"]));

    let (stdout, stderr) = ok(&loom(
        dir.path(),
        &["sessions", "export", "bad", "--valid-only"],
    ));
    assert_eq!(stdout.lines().count(), 7);
    assert!(stderr.contains("skipped: corrupted at") && stderr.contains(at_relative));
    assert!(stderr.contains("7 event(s) exported, 1 unreadable line(s) left out."));

    // Without --yes, only the list.
    let out = loom(dir.path(), &["sessions", "repair", "bad"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("add --yes"));
    assert_eq!(fs::read_to_string(&path).unwrap(), lines.join("\n") + "\n");

    let (_, stderr) = ok(&loom(
        dir.path(),
        &["sessions", "repair", "bad", "--yes", "--by", "ops"],
    ));
    assert!(
        stderr.contains("1 line(s) set aside in bad.jsonl.corrupt"),
        "{stderr}"
    );
    assert_eq!(
        fs::read_to_string(dir.path().join("data/default/bad.jsonl.corrupt")).unwrap(),
        format!("{last}\n")
    );
    let (stdout, _) = ok(&loom(dir.path(), &["sessions", "export", "bad"]));
    let events: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 8);
    let repaired = &events[7];
    assert_eq!(repaired["type"], "session.repaired");
    assert_eq!(repaired["seq"], 8);
    assert_eq!(repaired["run_id"], run.as_str());
    assert_eq!(repaired["payload"]["by"], "ops");
    assert_eq!(repaired["payload"]["moved_to"], "bad.jsonl.corrupt");
    assert_eq!(repaired["payload"]["bytes"], last.len());
    ok(&loom(dir.path(), &["inspect", run.as_str()]));
    let (_, stderr) = ok(&loom(dir.path(), &["sessions", "repair", "bad", "--yes"]));
    assert!(stderr.contains("nothing to repair"), "{stderr}");
}

/// A session belongs to the agent that opened it: another agent is refused, exit code 2, and
/// nothing is written.
#[test]
fn a_run_in_a_session_of_another_agent_is_refused() {
    let dir = project();
    ok(&loom(
        dir.path(),
        &["run", "devis", "Le devis", "--session", "quotes"],
    ));
    let before = fs::read(dir.path().join("data/default/quotes.jsonl")).unwrap();
    let out = loom(
        dir.path(),
        &["run", "chef", "Et alors ?", "--session", "quotes"],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("session quotes belongs to the agent 'devis'"),
        "{stderr}"
    );
    assert_eq!(
        fs::read(dir.path().join("data/default/quotes.jsonl")).unwrap(),
        before
    );
    ok(&loom(
        dir.path(),
        &["run", "devis", "Encore", "--session", "quotes"],
    ));
}

/// The offset index beside a session file (`<session>.jsonl.idx`) is written by the runs; lost,
/// truncated or garbled (a crash while it was written), it changes nothing the commands show,
/// is written again by the next read, and the next run continues the session.
#[test]
fn the_offset_index_is_kept_beside_the_session_and_rebuilt_when_damaged() {
    let dir = project();
    let mut runs = Vec::new();
    for message in ["Bonjour", "Encore", "Et encore"] {
        let (_, stderr) = ok(&loom(
            dir.path(),
            &["run", "chef", message, "--session", "long"],
        ));
        runs.push(run_id_of(&stderr));
    }
    let index = dir.path().join("data/default/long.jsonl.idx");
    let kept = fs::read_to_string(&index).unwrap();
    assert!(kept.starts_with("loom-jsonl-index 1 "), "{kept}");
    for run in &runs {
        assert!(
            kept.lines()
                .any(|l| l.starts_with("mark run.started ") && l.ends_with(run.as_str())),
            "{run} not marked: {kept}"
        );
    }
    let inspect = |run: &str| ok(&loom(dir.path(), &["inspect", run, "--session", "long"])).0;
    let shown: Vec<String> = runs.iter().map(|run| inspect(run)).collect();
    let damages: [(&str, &dyn Fn()); 3] = [
        ("truncated", &|| {
            fs::write(&index, &kept[..kept.len() / 2]).unwrap()
        }),
        ("garbled", &|| fs::write(&index, "not an index\n").unwrap()),
        ("lost", &|| fs::remove_file(&index).unwrap()),
    ];
    for (damage, apply) in damages {
        apply();
        for (run, shown) in runs.iter().zip(&shown) {
            assert_eq!(&inspect(run), shown, "{damage}: {run}");
        }
        let rebuilt = fs::read_to_string(&index).unwrap();
        assert!(
            rebuilt.starts_with("loom-jsonl-index 1 "),
            "{damage}: {rebuilt}"
        );
    }
    ok(&loom(
        dir.path(),
        &["run", "chef", "Enfin", "--session", "long"],
    ));
    let events = journal(dir.path(), "long");
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
    assert_eq!(events.len(), 32);
}
