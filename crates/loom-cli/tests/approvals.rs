//! Human approval end to end, through the `devis` example binary with its tool declared
//! `approval: always`: the run pauses and says how to decide, a second process approves,
//! rejects or corrects the arguments, and the journal follows the reference's sequence.
//! Each test works on a copy of examples/devis in its own temporary directory.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::{
    fs,
    path::Path,
    process::{Command, Output},
};

use serde_json::{Value, json};

const QUESTION: &str = "Quel prix TTC pour un devis de 1 250 € HT en rénovation (TVA à 10 %) ?";

/// A copy of examples/devis whose tool `prix_ttc` needs approval (`extra` is appended to its
/// tool reference).
fn devis_project(extra: &str) -> tempfile::TempDir {
    let dir = copy_example("devis");
    let agent_file = dir.path().join("agents/devis.yaml");
    let agent = fs::read_to_string(&agent_file).unwrap();
    assert!(agent.ends_with("    side_effects: none\n"), "{agent}");
    fs::write(&agent_file, format!("{agent}{extra}")).unwrap();
    dir
}

fn approval_project() -> tempfile::TempDir {
    devis_project("    approval: always\n")
}

fn devis(dir: &Path, args: &[&str]) -> Output {
    Command::new(devis_bin())
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .args(["--config", "loom.yaml"])
        .args(args)
        .output()
        .unwrap()
}

fn journal(dir: &Path, session: &str) -> Vec<Value> {
    let path = dir.join("data/default").join(format!("{session}.jsonl"));
    fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

fn payload<'a>(events: &'a [Value], kind: &str) -> &'a Value {
    &events
        .iter()
        .find(|e| e["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the journal"))["payload"]
}

/// Runs the agent until it pauses; returns the run id.
fn paused_run(dir: &Path) -> String {
    let out = devis(dir, &["run", "devis", QUESTION]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert_eq!(stdout, "", "a paused run prints no answer");
    assert!(stderr.contains("Status     : paused"), "{stderr}");
    let run_id = run_id_of(&stderr);
    assert!(
        stderr.contains(&format!(
            "Waiting    : prix_ttc (fake_0_0) — loom approve {run_id} --call fake_0_0\n"
        )),
        "{stderr}"
    );
    run_id
}

const ANSWER: &str = "Pour ce devis de rénovation, le prix est de 1\u{202f}375 € TTC (1\u{202f}250 € HT + 125 € de TVA à 10 %).";

#[test]
fn a_paused_run_is_approved_from_a_second_process_as_in_the_reference() {
    let Some(reference) = reference_journal("approval-granted.jsonl") else {
        return;
    };
    let dir = approval_project();
    let run_id = paused_run(dir.path());
    let paused = journal(dir.path(), &run_id);
    assert_eq!(
        types(&paused)[7..],
        [
            "step.started",
            "approval.requested",
            "step.completed",
            "run.transitioned",
            "run.claimed"
        ]
    );
    let requested = payload(&paused, "approval.requested");
    let keys: Vec<&str> = requested
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "type",
            "call_id",
            "tool_name",
            "arguments",
            "reason",
            "policy",
            "scope",
            "expire_at"
        ]
    );
    assert_eq!(
        requested["arguments"],
        json!({"montant_ht": 1250, "taux_tva": 10})
    );

    let out = devis(
        dir.path(),
        &["approve", &run_id, "--by", "denis", "--reason", "ok"],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.starts_with("Approved: fake_0_0\n"), "{stderr}");
    assert_eq!(stdout.trim(), ANSWER);
    assert!(stderr.contains("Status     : completed"), "{stderr}");

    // The same event types, in the same order, as the reference journal.
    let events = journal(dir.path(), &run_id);
    assert_eq!(types(&events), types(&reference));
    let granted = payload(&events, "approval.granted");
    assert_eq!(
        granted,
        &json!({"type": "approval.granted", "call_id": "fake_0_0", "tool_name": "prix_ttc",
                "by": "denis", "reason": "ok", "arguments": null})
    );
    // The second process claimed the run with its own worker id.
    let claims: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "run.claimed")
        .map(|e| e["payload"]["worker_id"].as_str().unwrap())
        .collect();
    assert_eq!(claims.len(), 3);
    assert_eq!(claims[0], claims[1]);
    assert_ne!(claims[1], claims[2]);

    // Nothing waits any more: a second decision is refused.
    let out = devis(dir.path(), &["approve", &run_id]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("nothing is waiting for a decision"),
        "{}",
        text(&out.stderr)
    );

    // `inspect` shows the approval.
    let out = devis(dir.path(), &["inspect", &run_id]);
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        shown.contains("    approval for prix_ttc — granted by denis (ok)\n"),
        "{shown}"
    );
    assert!(shown.contains(", 1 approval(s)"), "{shown}");
}

#[test]
fn approve_no_wait_journals_the_decision_and_leaves_the_run_paused() {
    let dir = approval_project();
    let run_id = paused_run(dir.path());

    let out = devis(
        dir.path(),
        &["approve", &run_id, "--call", "fake_0_0", "--no-wait"],
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.starts_with("Approved: fake_0_0\n"), "{stderr}");
    assert!(stderr.contains("stays paused"), "{stderr}");
    assert_eq!(text(&out.stdout), "");
    let events = journal(dir.path(), &run_id);
    assert_eq!(events.last().unwrap()["type"], "approval.granted");

    let out = devis(dir.path(), &["inspect", &run_id]);
    let shown = text(&out.stdout);
    assert!(shown.contains("Status     : paused"), "{shown}");
    assert!(
        shown.contains("approval for prix_ttc — granted by"),
        "{shown}"
    );
    // The decision is taken: a second one is refused, and `loom resume` continues the run.
    let out = devis(dir.path(), &["approve", &run_id]);
    assert_eq!(out.status.code(), Some(2));
    let resumed = devis(dir.path(), &["resume", &run_id]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert!(
        text(&resumed.stdout).contains("375 € TTC"),
        "{}",
        text(&resumed.stdout)
    );
}

#[test]
fn a_rejection_reaches_the_model_with_its_reason() {
    let dir = approval_project();
    let run_id = paused_run(dir.path());

    let out = devis(
        dir.path(),
        &["reject", &run_id, "--by", "denis", "--reason", "trop cher"],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.starts_with("Rejected: fake_0_0\n"), "{stderr}");
    // The fake model repeats the tool's result: here, the rejection.
    assert!(
        stdout.contains("Call to prix_ttc rejected by denis: trop cher."),
        "{stdout}"
    );
    let events = journal(dir.path(), &run_id);
    assert!(!types(&events).contains(&"tool.called".to_owned()));
    let completed = payload(&events, "tool.completed");
    assert_eq!(completed["output"]["is_error"], true);
    let rejected = payload(&events, "approval.rejected");
    assert_eq!(rejected["reason"], "trop cher");
    assert_eq!(rejected["by"], "denis");
}

#[test]
fn corrected_arguments_are_what_the_tool_receives_while_the_journal_keeps_the_models() {
    let dir = approval_project();
    let run_id = paused_run(dir.path());
    let corrected = r#"{"montant_ht": 2000, "taux_tva": 10}"#;

    // Corrections name one call, and must be JSON that fits the tool's schema.
    let out = devis(dir.path(), &["approve", &run_id, "--arguments", corrected]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--arguments corrects one named call: add --call."),
        "{}",
        text(&out.stderr)
    );
    for (bad, why) in [
        ("{montant", "not valid JSON"),
        (r#"{"montant_ht": "2000"}"#, "do not match the schema"),
    ] {
        let out = devis(
            dir.path(),
            &["approve", &run_id, "--call", "fake_0_0", "--arguments", bad],
        );
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(text(&out.stderr).contains(why), "{}", text(&out.stderr));
    }
    let out = devis(dir.path(), &["approve", &run_id, "--call", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no approval is waiting for call 'nope' (waiting: fake_0_0)"),
        "{}",
        text(&out.stderr)
    );

    let out = devis(
        dir.path(),
        &[
            "approve",
            &run_id,
            "--call",
            "fake_0_0",
            "--arguments",
            corrected,
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("2\u{202f}200 € TTC"), "{stdout}");
    let events = journal(dir.path(), &run_id);
    assert_eq!(
        payload(&events, "tool.called")["arguments"],
        json!({"montant_ht": 1250, "taux_tva": 10})
    );
    assert_eq!(
        payload(&events, "approval.granted")["arguments"],
        json!({"montant_ht": 2000, "taux_tva": 10})
    );
}

#[test]
fn deciding_a_run_that_waits_for_nothing_is_refused() {
    let dir = devis_project("");
    let out = devis(dir.path(), &["run", "devis", QUESTION]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let run_id = run_id_of(&text(&out.stderr));
    for command in ["approve", "reject"] {
        let out = devis(dir.path(), &[command, &run_id]);
        assert_eq!(out.status.code(), Some(2), "{command}");
        assert!(
            text(&out.stderr).contains(&format!("run {run_id}: nothing is waiting for a decision")),
            "{}",
            text(&out.stderr)
        );
    }
    let out = devis(dir.path(), &["approve", "no-such-run"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn approval_policy_and_pausing_on_the_memory_journal_are_refused_at_load() {
    let dir = devis_project("    approval: policy\n");
    let out = devis(dir.path(), &["validate"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(
            "config error: agents/devis.yaml:11:15 tools[0].approval: tool 'prix_ttc': approval: policy means a policy decides when a human is asked, but no policy of the agent is hooked on before_tool with the decision 'pause'"
        ),
        "{stderr}"
    );

    let dir = approval_project();
    let config = fs::read_to_string(dir.path().join("loom.yaml")).unwrap();
    let config = config.replace("backend: jsonl", "backend: memory");
    fs::write(dir.path().join("loom.yaml"), config).unwrap();
    let out = devis(dir.path(), &["validate"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("tools[0].approval"), "{stderr}");
    assert!(
        stderr.contains("tool 'prix_ttc' can pause the run for a human decision"),
        "{stderr}"
    );
    // Accepted in the dev profile, where losing paused runs at exit is fine.
    let out = devis(dir.path(), &["--profile", "dev", "validate"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}
