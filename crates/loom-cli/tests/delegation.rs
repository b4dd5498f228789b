//! Sub-agents, budgets and tenants end to end through the `equipe` example binary
//! (examples/equipe: the orchestrator `secretariat` delegates to `comptable`, which may delegate
//! to `controleur`), asserting on the JSONL journal: child runs in the root's session with their
//! budget share, depth limits, cancellation and approvals through the root, run and session
//! budgets stopping a run into finalizing, tenant ceilings refusing a run, and the reports.
//! Each test works on a copy of examples/equipe in its own temporary directory.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use serde_json::{Value, json};

const SOLDE: &str = "Quel est le solde du compte bancaire 512 ?";
const SOLDE_ANSWER: &str =
    "Réponse du service comptable : compte 512 (Banque) : solde débiteur de 12\u{202f}480,50 €";
const VIREMENT: &str = "Règle la facture F-2024-031 de Dupont Matériaux par virement.";
const RELEVE: &str = "Récupère le relevé de la banque pour le rapprochement.";
const POINTAGE: &str = "Fais le pointage des comptes 512, 411 et 401.";

/// The secretariat's run budget (agents/secretariat.yaml) and the comptable's share of it.
const MAX_CALLS: u64 = 6;
const MAX_COST: f64 = 0.05;
const SHARE: f64 = 0.5;

/// A copy of examples/equipe.
fn project() -> tempfile::TempDir {
    copy_example("equipe")
}

/// Replaces `old` (which must be there once) by `new` in the project file `file`.
fn edit(dir: &Path, file: &str, old: &str, new: &str) {
    let path = dir.join(file);
    let text = fs::read_to_string(&path).unwrap();
    assert_eq!(text.matches(old).count(), 1, "{file}: {old:?} in\n{text}");
    fs::write(&path, text.replace(old, new)).unwrap();
}

/// Appends `extra` to the project file `file`.
fn append(dir: &Path, file: &str, extra: &str) {
    let path = dir.join(file);
    let text = fs::read_to_string(&path).unwrap();
    assert!(text.ends_with('\n'));
    fs::write(&path, format!("{text}{extra}")).unwrap();
}

fn command(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(example_bin("equipe"));
    command
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .env("RELEVES_DIR", dir.join("releves"))
        .args(["--config", "loom.yaml"])
        .args(args);
    command
}

fn equipe(dir: &Path, args: &[&str]) -> Output {
    command(dir, args).output().unwrap()
}

/// Runs `args` and expects success; returns stdout.
fn ok(dir: &Path, args: &[&str]) -> String {
    let out = equipe(dir, args);
    assert!(
        out.status.success(),
        "{args:?}\nstdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The events of a session of `tenant`.
fn session(dir: &Path, tenant: &str, session: &str) -> Vec<Value> {
    let path = dir
        .join("data")
        .join(tenant)
        .join(format!("{session}.jsonl"));
    fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every journal file under `dir/data`, with its content, sorted.
fn journal_files(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    let Ok(tenants) = fs::read_dir(dir.join("data")) else {
        return files;
    };
    for tenant in tenants {
        let tenant = tenant.unwrap().path();
        if !tenant.is_dir() {
            continue;
        }
        for file in fs::read_dir(&tenant).unwrap() {
            let path = file.unwrap().path();
            if path.is_file() && path.extension() == Some("jsonl".as_ref()) {
                let content = fs::read_to_string(&path).unwrap();
                files.push((path, content));
            }
        }
    }
    files.sort();
    files
}

/// The events of run `run_id`.
fn of_run<'a>(events: &'a [Value], run_id: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["run_id"] == run_id).collect()
}

fn types(events: &[&Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

/// The payloads of the events of type `kind`.
fn payloads<'a>(events: &[&'a Value], kind: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["type"] == kind)
        .map(|e| &e["payload"])
        .collect()
}

/// The payload of the only event of type `kind`.
fn one<'a>(events: &[&'a Value], kind: &str) -> &'a Value {
    let found = payloads(events, kind);
    assert_eq!(found.len(), 1, "{kind}: {found:?}");
    found[0]
}

/// The runs started with `parent` as their parent, in journal order.
fn children(events: &[Value], parent: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == "run.started" && e["payload"]["parent_run_id"] == parent)
        .map(|e| e["run_id"].as_str().unwrap().to_owned())
        .collect()
}

/// The only child run of `parent`.
fn child(events: &[Value], parent: &str) -> String {
    let children = children(events, parent);
    assert_eq!(children.len(), 1, "children of {parent}: {children:?}");
    children[0].clone()
}

fn cost(payload: &Value) -> f64 {
    payload["cost_usd"].as_f64().unwrap()
}

fn tokens(usage: &Value) -> u64 {
    [
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
    ]
    .iter()
    .map(|k| usage[k].as_u64().unwrap())
    .sum()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// The sum of `usage` objects, key by key.
fn sum_usage<'a>(usages: impl IntoIterator<Item = &'a Value>) -> Value {
    let mut sum = serde_json::Map::new();
    for usage in usages {
        for (key, value) in usage.as_object().unwrap() {
            let total = sum.get(key).and_then(Value::as_u64).unwrap_or(0) + value.as_u64().unwrap();
            sum.insert(key.clone(), json!(total));
        }
    }
    Value::Object(sum)
}

/// Report text with run ids of sub-runs replaced by stable ids of the same length (so columns
/// stay aligned) and today's UTC date by placeholders.
fn redacted(text: &str, child_ids: &[&str]) -> String {
    let mut text = text.to_owned();
    for (i, id) in child_ids.iter().enumerate() {
        text = text.replace(id, &format!("00000000-0000-0000-0000-{:012}", i + 1));
    }
    let today = chrono::Utc::now();
    text.replace(&today.format("%Y-%m-%d").to_string(), "<today>")
        .replace(&today.format("%Y-%m").to_string(), "<month>")
}

/// Waits (bounded) until `path` exists.
fn wait_for(path: &Path) {
    loom_testkit::wait::blocking_until(format!("{} to appear", path.display()), || path.exists());
}

#[test]
fn a_sub_agent_runs_as_a_child_run_in_the_roots_journal_and_its_cost_rolls_up() {
    let dir = project();
    let answer = ok(dir.path(), &["run", "secretariat", SOLDE, "--run-id", "r1"]);
    assert_eq!(answer.trim(), SOLDE_ANSWER);

    // One journal file: the child run lives in its root's session.
    let files = journal_files(dir.path());
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].0.ends_with("data/default/r1.jsonl"));
    let events = session(dir.path(), "default", "r1");
    let child_id = child(&events, "r1");
    let root = of_run(&events, "r1");
    let sub = of_run(&events, &child_id);
    assert_eq!(root.len() + sub.len(), events.len());

    // The parent's call names its child run; the child names its parent, its call and its root.
    let called = one(&root, "tool.called");
    assert_eq!(called["tool_name"], "comptable");
    assert_eq!(called["child_run_id"], child_id.as_str());
    assert_eq!(
        called["arguments"],
        json!({"message": "Donne le solde du compte 512 (banque) au dernier pointage."})
    );
    let call_event = root.iter().find(|e| e["type"] == "tool.called").unwrap();
    let started_event = sub[0];
    assert_eq!(started_event["type"], "run.started");
    assert_eq!(started_event["agent"], "comptable");
    assert_eq!(started_event["root_run_id"], "r1");
    assert_eq!(started_event["parent_span_id"], call_event["span_id"]);
    let started = &started_event["payload"];
    assert_eq!(started["parent_run_id"], "r1");
    assert_eq!(started["parent_call_id"], called["call_id"]);
    assert_eq!(started["depth"], 1);
    assert!(sub.iter().all(|e| e["root_run_id"] == "r1"));

    // Its budget: half of what remained of the secretariat's when it was called (one model call
    // made, its cost spent).
    let first_cost = cost(payloads(&root, "model.responded")[0]);
    let budget = &started["budget"];
    assert_eq!(
        budget["max_calls"],
        ((MAX_CALLS - 1) as f64 * SHARE).floor() as u64
    );
    assert!(
        close(
            budget["max_cost"].as_f64().unwrap(),
            (MAX_COST - first_cost) * SHARE
        ),
        "{budget}"
    );
    assert_eq!(budget["max_tokens"], Value::Null);

    // The parent's pilot holds the lease for the tree: the child never claims.
    assert!(types(&root).contains(&"run.claimed".to_owned()));
    assert!(!types(&sub).contains(&"run.claimed".to_owned()));
    assert_eq!(
        types(&sub),
        [
            "run.started",
            "message.user",
            "step.started",
            "model.responded",
            "step.completed",
            "run.transitioned",
            "step.started",
            "tool.called",
            "tool.completed",
            "step.completed",
            "run.transitioned",
            "step.started",
            "model.responded",
            "step.completed",
            "run.transitioned",
            "run.completed",
        ]
    );
    // The child's events sit between the parent's call and its result.
    let position = |id: &str, kind: &str| {
        events
            .iter()
            .position(|e| e["run_id"] == id && e["type"] == kind)
            .unwrap()
    };
    assert!(position("r1", "tool.called") < position(&child_id, "run.started"));
    assert!(position(&child_id, "run.completed") < position("r1", "tool.completed"));

    // The child's consumption rides on the parent's tool.completed and rolls up.
    let child_done = one(&sub, "run.completed");
    let completed = one(&root, "tool.completed");
    assert_eq!(completed["tool_name"], "comptable");
    assert_eq!(completed["usage"], child_done["usage"]);
    assert!(close(cost(completed), cost(child_done)));
    let child_calls = payloads(&sub, "model.responded");
    assert!(close(
        cost(child_done),
        child_calls.iter().map(|p| cost(p)).sum()
    ));
    let own = payloads(&root, "model.responded");
    let root_done = one(&root, "run.completed");
    assert!(cost(child_done) > 0.0);
    assert!(close(
        cost(root_done),
        own.iter().map(|p| cost(p)).sum::<f64>() + cost(child_done)
    ));
    assert_eq!(
        root_done["usage"],
        sum_usage(
            own.iter()
                .map(|p| &p["usage"])
                .chain([&child_done["usage"]])
        )
    );

    // The report: the run's total is the roll-up, broken down run by run (the child under
    // the call that opened it), by role, by agent and by model.
    let report = ok(dir.path(), &["report", "r1"]);
    insta::assert_snapshot!("report_run", redacted(&report, &[&child_id]));
    let report: Value = serde_json::from_str(&ok(dir.path(), &["report", "r1", "--json"])).unwrap();
    assert_eq!(report["run_id"], "r1");
    assert_eq!(report["total"]["calls"], 4);
    assert_eq!(report["total"]["usage"], root_done["usage"]);
    assert!(close(cost(&report["total"]), cost(root_done)));
    assert_eq!(report["roles"]["main"]["calls"], 4);
    assert_eq!(report["agents"]["secretariat"]["calls"], 2);
    let runs = report["runs"].as_object().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs["r1"]["calls"], 2);
    assert_eq!(runs["r1"]["depth"], 0);
    assert_eq!(runs["r1"]["with_sub_runs"]["usage"], root_done["usage"]);
    let sub = &runs[child_id.as_str()];
    assert_eq!(
        (
            &sub["agent"],
            &sub["parent_run_id"],
            &sub["call_id"],
            &sub["depth"]
        ),
        (
            &json!("comptable"),
            &json!("r1"),
            &called["call_id"],
            &json!(1)
        )
    );
    assert_eq!(
        (&sub["calls"], &sub["usage"], &sub["cost_usd"]),
        (&json!(2), &child_done["usage"], &child_done["cost_usd"])
    );
    assert_eq!(sub["with_sub_runs"]["usage"], child_done["usage"]);
    let models = report["models"].as_object().unwrap();
    assert_eq!(
        models.keys().collect::<Vec<_>>(),
        [
            "fake-comptable (FAKE-COMPTABLE)",
            "fake-secretariat (FAKE-SECRETARIAT)"
        ]
    );
    assert_eq!(
        models["fake-comptable (FAKE-COMPTABLE)"]["usage"],
        child_done["usage"]
    );
}

#[test]
fn max_depth_decides_whether_a_child_is_offered_its_own_sub_agents() {
    let dir = project();
    // max_depth 1 (the comptable's): at depth 1 the controleur is not offered, so the fake
    // model's replies kept by `with_tool: controleur` are filtered out and it reads the balance
    // itself (`without_tool: controleur`).
    ok(dir.path(), &["run", "secretariat", SOLDE, "--run-id", "d1"]);
    let events = session(dir.path(), "default", "d1");
    let comptable = child(&events, "d1");
    let sub = of_run(&events, &comptable);
    assert_eq!(one(&sub, "tool.called")["tool_name"], "solde_compte");
    assert!(children(&events, &comptable).is_empty());
    assert!(
        events
            .iter()
            .all(|e| e["payload"]["depth"].as_u64().unwrap_or(0) < 2)
    );

    // max_depth 2: the comptable's run at depth 1 hands the check to the controleur, a
    // grandchild run at depth 2 in the same journal.
    edit(
        dir.path(),
        "agents/comptable.yaml",
        "max_depth: 1",
        "max_depth: 2",
    );
    let answer = ok(dir.path(), &["run", "secretariat", SOLDE, "--run-id", "d2"]);
    assert_eq!(
        answer.trim(),
        "Réponse du service comptable : Solde contrôlé : Contrôle fait, compte 512 (Banque) : \
         solde débiteur de 12\u{202f}480,50 €"
    );
    let events = session(dir.path(), "default", "d2");
    let comptable = child(&events, "d2");
    let controleur = child(&events, &comptable);
    let sub = of_run(&events, &comptable);
    let grand = of_run(&events, &controleur);
    let called = one(&sub, "tool.called");
    assert_eq!(called["tool_name"], "controleur");
    assert_eq!(called["child_run_id"], controleur.as_str());
    assert_eq!(grand[0]["agent"], "controleur");
    assert_eq!(grand[0]["root_run_id"], "d2");
    let started = &grand[0]["payload"];
    assert_eq!(started["depth"], 2);
    assert_eq!(started["parent_run_id"], comptable.as_str());
    assert_eq!(started["parent_call_id"], called["call_id"]);
    // No share declared for the controleur: its run has no budget of its own.
    assert_eq!(started["budget"], Value::Null);
    assert!(!types(&grand).contains(&"run.claimed".to_owned()));
    assert_eq!(one(&grand, "tool.called")["tool_name"], "solde_compte");
    // Costs roll up level by level.
    let grand_done = one(&grand, "run.completed");
    let sub_done = one(&sub, "run.completed");
    let root_done = one(&of_run(&events, "d2"), "run.completed");
    let own = |run: &[&Value]| -> f64 {
        payloads(run, "model.responded")
            .iter()
            .map(|p| cost(p))
            .sum()
    };
    assert!(close(cost(sub_done), own(&sub) + cost(grand_done)));
    assert!(close(
        cost(root_done),
        own(&of_run(&events, "d2")) + cost(sub_done)
    ));
    let report: Value = serde_json::from_str(&ok(dir.path(), &["report", "d2", "--json"])).unwrap();
    assert_eq!(report["total"]["calls"], 6);
    assert!(close(cost(&report["total"]), cost(root_done)));
    // Three runs, each with its own calls; the comptable's roll-up holds the controleur's.
    let runs = report["runs"].as_object().unwrap();
    assert_eq!(runs.len(), 3);
    let comptable = runs.values().find(|r| r["depth"] == 1).unwrap();
    assert_eq!(comptable["calls"], 2);
    assert_eq!(comptable["with_sub_runs"]["calls"], 4);
    let controleur = runs.values().find(|r| r["depth"] == 2).unwrap();
    assert_eq!(controleur["parent_run_id"], comptable["run_id"]);
    assert_eq!(controleur["agent"], "controleur");
    assert!(
        report["models"]
            .as_object()
            .unwrap()
            .contains_key("fake-controleur (FAKE-CONTROLEUR)")
    );
}

#[test]
fn cancelling_the_root_from_a_second_process_cancels_its_busy_child() {
    let dir = project();
    let releves = dir.path().join("releves");
    fs::create_dir(&releves).unwrap();
    // The comptable's tool asks the bank for its statement and waits for the file.
    let running = command(
        dir.path(),
        &["run", "secretariat", RELEVE, "--run-id", "c1"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    wait_for(&releves.join("demande-cic.txt"));

    let out = equipe(dir.path(), &["cancel", "c1", "--by", "alice"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "Run c1: cancelled.\n");
    let cancelled = session(dir.path(), "default", "c1");

    // The bank answers: the tool returns, and its run finds itself closed.
    fs::write(releves.join("releve-cic.txt"), "relevé CIC de novembre\n").unwrap();
    let out = running.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("Status     : cancelled"), "{stderr}");
    // Nothing was written after the cancellation: the tool's late result is dropped.
    let events = session(dir.path(), "default", "c1");
    assert_eq!(events, cancelled);

    let comptable = child(&events, "c1");
    let sub = of_run(&events, &comptable);
    assert_eq!(one(&sub, "tool.called")["tool_name"], "releve_bancaire");
    assert!(payloads(&sub, "tool.completed").is_empty());
    // One write closes the tree, the child first: reason `parent`, by its root.
    let tail: Vec<(&str, &str)> = events[events.len() - 4..]
        .iter()
        .map(|e| (e["run_id"].as_str().unwrap(), e["type"].as_str().unwrap()))
        .collect();
    assert_eq!(
        tail,
        [
            (comptable.as_str(), "run.transitioned"),
            (comptable.as_str(), "run.cancelled"),
            ("c1", "run.transitioned"),
            ("c1", "run.cancelled"),
        ]
    );
    let child_cancel = one(&sub, "run.cancelled");
    assert_eq!(child_cancel["reason"], "parent");
    assert_eq!(child_cancel["by"], "c1");
    assert_eq!(
        payloads(&sub, "run.transitioned").last().unwrap()["from_state"],
        "awaiting_tools"
    );
    let root_cancel = one(&of_run(&events, "c1"), "run.cancelled");
    assert_eq!(root_cancel["reason"], "requested");
    assert_eq!(root_cancel["by"], "alice");

    // Closed: a second cancel has nothing to do.
    let out = equipe(dir.path(), &["cancel", "c1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("already closed"));
}

/// Runs the transfer scenario until the root waits for its child; returns the child's run id.
fn waiting_for_approval(dir: &Path, run_id: &str, tenant: Option<&str>) -> String {
    let mut args = vec!["run", "secretariat", VIREMENT, "--run-id", run_id];
    if let Some(tenant) = tenant {
        args.extend(["--tenant", tenant]);
    }
    let out = equipe(dir, &args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert_eq!(stdout, "", "a waiting run prints no answer");
    assert!(stderr.contains("Status     : waiting_child"), "{stderr}");
    // The child's request is shown on the root, with the command that decides it there.
    let tenant_flag = tenant.map(|t| format!(" --tenant {t}")).unwrap_or_default();
    assert!(
        stderr.contains(&format!(
            "Waiting    : virement (fake_0_0) — loom approve {run_id} --call fake_0_0{tenant_flag}\n"
        )),
        "{stderr}"
    );
    let events = session(dir, tenant.unwrap_or("default"), run_id);
    let comptable = child(&events, run_id);
    let sub = of_run(&events, &comptable);
    let requested = one(&sub, "approval.requested");
    assert_eq!(requested["tool_name"], "virement");
    assert_eq!(requested["call_id"], "fake_0_0");
    assert_eq!(
        payloads(&sub, "run.transitioned").last().unwrap()["to_state"],
        "paused"
    );
    let root = of_run(&events, run_id);
    assert_eq!(
        payloads(&root, "run.transitioned").last().unwrap()["to_state"],
        "waiting_child"
    );
    // The root hands its lease back.
    assert_eq!(events.last().unwrap()["type"], "run.claimed");
    assert_eq!(events.last().unwrap()["run_id"], run_id);
    comptable
}

const VIREMENT_ANSWER: &str =
    "C'est fait : virement de 1250 € vers FR76…123 enregistré (Facture F-2024-031)";

#[test]
fn a_childs_approval_surfaces_on_the_root_and_is_decided_there_from_a_second_process() {
    let dir = project();
    let comptable = waiting_for_approval(dir.path(), "v1", None);

    let out = equipe(
        dir.path(),
        &[
            "approve",
            "v1",
            "--by",
            "denis",
            "--reason",
            "facture vérifiée",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.starts_with("Approved: fake_0_0\n"), "{stderr}");
    assert!(stderr.contains("Status     : completed"), "{stderr}");
    assert_eq!(stdout.trim(), VIREMENT_ANSWER);

    let events = session(dir.path(), "default", "v1");
    // The decision is the child's, and the child was resumed, not relaunched.
    assert_eq!(children(&events, "v1"), std::slice::from_ref(&comptable));
    let sub = of_run(&events, &comptable);
    let granted = one(&sub, "approval.granted");
    assert_eq!(granted["by"], "denis");
    assert_eq!(granted["reason"], "facture vérifiée");
    let called = one(&sub, "tool.called");
    assert_eq!(called["tool_name"], "virement");
    assert_eq!(
        called["arguments"],
        json!({"iban": "FR7630004000010000000000123", "montant": 1250,
               "libelle": "Facture F-2024-031"})
    );
    assert!(
        !one(&sub, "tool.completed")["output"]["is_error"]
            .as_bool()
            .unwrap()
    );
    let child_done = one(&sub, "run.completed");
    // The root re-played its call, which names the same child, then completed.
    let root = of_run(&events, "v1");
    assert!(
        payloads(&root, "tool.called")
            .iter()
            .all(|c| c["child_run_id"] == comptable.as_str())
    );
    let completed = one(&root, "tool.completed");
    assert_eq!(completed["usage"], child_done["usage"]);
    let root_done = one(&root, "run.completed");
    assert!(close(
        cost(root_done),
        payloads(&root, "model.responded")
            .iter()
            .map(|p| cost(p))
            .sum::<f64>()
            + cost(child_done)
    ));
    assert_eq!(events.last().unwrap()["type"], "run.completed");
    assert_eq!(events.last().unwrap()["run_id"], "v1");

    // Nothing waits any more.
    let out = equipe(dir.path(), &["approve", "v1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("nothing is waiting for a decision"));
}

#[test]
fn cancelling_a_root_waiting_for_an_approval_withdraws_its_childs_request() {
    let dir = project();
    let comptable = waiting_for_approval(dir.path(), "w1", None);
    let out = equipe(dir.path(), &["cancel", "w1", "--by", "denis"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = session(dir.path(), "default", "w1");
    let child_cancel = one(&of_run(&events, &comptable), "run.cancelled");
    assert_eq!(child_cancel["reason"], "parent");
    assert_eq!(child_cancel["by"], "w1");
    assert_eq!(child_cancel["withdrawn"], json!(["fake_0_0"]));
    let root_cancel = one(&of_run(&events, "w1"), "run.cancelled");
    assert_eq!(root_cancel["reason"], "requested");
    assert_eq!(events.last().unwrap()["run_id"], "w1");
    // The request went with its run.
    let out = equipe(dir.path(), &["approve", "w1"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn runs_of_another_tenant_are_decided_inspected_and_cancelled_with_tenant() {
    let dir = project();
    // Dupont's first run of the day is allowed; its pending approval names the tenant.
    let comptable = waiting_for_approval(dir.path(), "tv", Some("dupont"));
    // Without --tenant the run is looked for in `default`.
    let out = equipe(dir.path(), &["approve", "tv"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("run tv not found"),
        "{}",
        text(&out.stderr)
    );
    let out = equipe(dir.path(), &["inspect", "tv", "--tenant", "dupont"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("Status     : waiting_child"));

    let out = equipe(
        dir.path(),
        &["approve", "tv", "--tenant", "dupont", "--no-wait"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("until `loom resume tv --tenant dupont`"),
        "{}",
        text(&out.stderr)
    );
    let out = equipe(dir.path(), &["resume", "tv", "--tenant", "dupont"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), VIREMENT_ANSWER);
    let events = session(dir.path(), "dupont", "tv");
    assert_eq!(children(&events, "tv"), [comptable]);
    assert_eq!(events.last().unwrap()["type"], "run.completed");
    assert!(!dir.path().join("data/default").exists());

    // Cancel reaches a tenant's run the same way (here: already closed).
    let out = equipe(dir.path(), &["cancel", "tv", "--tenant", "dupont"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("already closed"));
}

#[test]
fn a_childs_spend_counts_in_its_tenants_budget_before_its_result_reaches_the_root() {
    let dir = project();
    // Dupont's first run waits for an approval in its child, which has already spent.
    let comptable = waiting_for_approval(dir.path(), "tv", Some("dupont"));
    let events = session(dir.path(), "dupont", "tv");
    let spent = |run_id: &str| -> u64 {
        payloads(&of_run(&events, run_id), "model.responded")
            .iter()
            .map(|p| tokens(&p["usage"]))
            .sum()
    };
    let total = spent("tv") + spent(&comptable);
    assert!(spent(&comptable) > 0);
    let check = |when: &str| {
        // The tenant's report counts every model call of the tree…
        let report: Value = serde_json::from_str(&ok(
            dir.path(),
            &["report", "--tenant", "dupont", "--period", "day", "--json"],
        ))
        .unwrap();
        assert_eq!(tokens(&report["total"]["usage"]), total, "{when}");
        // …and so does the ceiling that refuses the next run.
        let out = equipe(
            dir.path(),
            &[
                "run",
                "secretariat",
                SOLDE,
                "--tenant",
                "dupont",
                "--run-id",
                "tx",
            ],
        );
        assert_eq!(out.status.code(), Some(2), "{when}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "tenant budget reached for the day: {total} tokens (limit 100 tokens)"
            )),
            "{when}: {stderr}"
        );
    };
    check("while the child waits");
    // Cancelled from another process, the child's result never reaches the root.
    let out = equipe(dir.path(), &["cancel", "tv", "--tenant", "dupont"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let cancelled = session(dir.path(), "dupont", "tv");
    assert!(payloads(&of_run(&cancelled, "tv"), "tool.completed").is_empty());
    check("once the tree is cancelled");
}

/// Appends a run budget to the comptable, run alone on the reconciliation of three accounts
/// (one model call each, then the answer).
fn pointage_with(dir: &Path, budget: &str) -> (String, Vec<Value>) {
    append(dir, "agents/comptable.yaml", budget);
    let answer = ok(dir, &["run", "comptable", POINTAGE, "--run-id", "p1"]);
    (answer, session(dir, "default", "p1"))
}

#[test]
fn a_run_budget_stops_the_run_into_finalizing() {
    let dir = project();
    let (answer, events) = pointage_with(dir.path(), "budget:\n  run: {max_calls: 2}\n");
    // The last answer is written without tools: the fake model's `forced` text.
    assert_eq!(
        answer.trim(),
        "Pointage partiel : comptes 512 et 411 vus, le 401 reste à faire."
    );
    let run: Vec<&Value> = events.iter().collect();
    let called: Vec<&Value> = payloads(&run, "tool.called")
        .iter()
        .map(|c| &c["arguments"]["compte"])
        .collect();
    assert_eq!(called, [&json!("512"), &json!("411")]);
    // Before the third call: the limit is journaled, the policy stops, the run finalizes.
    let at = types(&run)
        .iter()
        .position(|t| t == "budget.exceeded")
        .unwrap();
    assert_eq!(
        types(&run)[at - 1..],
        [
            "step.started",
            "budget.exceeded",
            "policy.decided",
            "step.completed",
            "run.transitioned",
            "step.started",
            "model.responded",
            "step.completed",
            "run.transitioned",
            "run.completed",
        ]
    );
    assert_eq!(
        run[at]["payload"],
        json!({"type": "budget.exceeded", "scope": "run", "limit": "max_calls", "value": 2.0,
               "spent": 2.0, "action": "stop", "policy": "loom.budget"})
    );
    let decided = &run[at + 1]["payload"];
    assert_eq!(decided["policy"], "loom.budget");
    assert_eq!(decided["point"], "before_model");
    assert_eq!(decided["decision"], "stop");
    assert_eq!(
        decided["reason"],
        "run budget reached: 2 calls (limit 2 calls)"
    );
    let finalizing = &run[at + 3]["payload"];
    assert_eq!(
        (&finalizing["from_state"], &finalizing["to_state"]),
        (&json!("ready_for_model"), &json!("finalizing"))
    );
    let last = &run[at + 5]["payload"];
    let blocks = last["message"]["blocks"].as_array().unwrap();
    assert!(blocks.iter().all(|b| b["type"] == "text"), "{blocks:?}");
    assert_eq!(last["stop_reason"], "end");
    let ended = &run[at + 7]["payload"];
    assert_eq!(
        (&ended["from_state"], &ended["to_state"]),
        (&json!("finalizing"), &json!("completed"))
    );
    assert_eq!(payloads(&run, "model.responded").len(), 3);
}

#[test]
fn on_exceed_warn_only_journals_the_limit() {
    let dir = project();
    let (answer, events) = pointage_with(
        dir.path(),
        "budget:\n  run: {max_calls: 2}\n  on_exceed: warn\n",
    );
    assert_eq!(
        answer.trim(),
        "Pointage terminé : comptes 512, 411 et 401 vus."
    );
    let run: Vec<&Value> = events.iter().collect();
    let exceeded = one(&run, "budget.exceeded");
    assert_eq!(exceeded["action"], "warn");
    assert_eq!(exceeded["limit"], "max_calls");
    assert!(payloads(&run, "policy.decided").is_empty());
    assert!(
        payloads(&run, "run.transitioned")
            .iter()
            .all(|t| t["to_state"] != "finalizing")
    );
    assert_eq!(payloads(&run, "tool.called").len(), 3);
    assert_eq!(payloads(&run, "model.responded").len(), 4);
}

#[test]
fn a_session_budget_counts_the_earlier_runs_of_the_session() {
    let dir = project();
    // What one run spends, in tokens (the fake model's usage is deterministic).
    ok(
        dir.path(),
        &["run", "secretariat", SOLDE, "--run-id", "mesure"],
    );
    let measured = session(dir.path(), "default", "mesure");
    let spent = tokens(&one(&of_run(&measured, "mesure"), "run.completed")["usage"]);
    fs::remove_file(dir.path().join("data/default/mesure.jsonl")).unwrap();

    // A session limit the first run reaches with its last call, checked before each call.
    let limit = spent - 1;
    edit(
        dir.path(),
        "loom.yaml",
        "  session: {max_cost: 0.50}\n",
        &format!("  session: {{max_cost: 0.50, max_tokens: {limit}}}\n"),
    );
    let first = ok(
        dir.path(),
        &[
            "run",
            "secretariat",
            SOLDE,
            "--session",
            "S",
            "--run-id",
            "s1",
        ],
    );
    assert_eq!(first.trim(), SOLDE_ANSWER);
    let events = session(dir.path(), "default", "S");
    let s1 = of_run(&events, "s1");
    assert_eq!(tokens(&one(&s1, "run.completed")["usage"]), spent);
    assert!(payloads(&s1, "budget.exceeded").is_empty());

    // The second run of the session is stopped before its first call.
    let second = ok(
        dir.path(),
        &[
            "run",
            "secretariat",
            SOLDE,
            "--session",
            "S",
            "--run-id",
            "s2",
        ],
    );
    assert_eq!(
        second.trim(),
        "Le budget est atteint : je ne peux pas interroger le service comptable maintenant."
    );
    let events = session(dir.path(), "default", "S");
    let s2 = of_run(&events, "s2");
    assert_eq!(
        one(&s2, "budget.exceeded"),
        &json!({"type": "budget.exceeded", "scope": "session", "limit": "max_tokens",
                "value": limit as f64, "spent": spent as f64, "action": "stop",
                "policy": "loom.budget"})
    );
    assert_eq!(
        one(&s2, "policy.decided")["reason"],
        format!("session budget reached: {spent} tokens (limit {limit} tokens)")
    );
    assert!(payloads(&s2, "tool.called").is_empty());
    assert!(children(&events, "s2").is_empty());
    assert_eq!(payloads(&s2, "model.responded").len(), 1);
    assert!(
        payloads(&s2, "run.transitioned")
            .iter()
            .any(|t| t["to_state"] == "finalizing")
    );

    // The session's report: both runs, the sub-agent's share, the models.
    let comptable = child(&events, "s1");
    let report = ok(dir.path(), &["report", "--session", "S"]);
    insta::assert_snapshot!("report_session", redacted(&report, &[&comptable]));
    let report: Value =
        serde_json::from_str(&ok(dir.path(), &["report", "--session", "S", "--json"])).unwrap();
    let runs: Vec<(&Value, &Value, &Value)> = report["runs"]
        .as_object()
        .unwrap()
        .values()
        .map(|r| (&r["run_id"], &r["status"], &r["depth"]))
        .collect();
    assert_eq!(
        runs,
        [
            (&json!(comptable), &json!("completed"), &json!(1)),
            (&json!("s1"), &json!("completed"), &json!(0)),
            (&json!("s2"), &json!("completed"), &json!(0))
        ]
    );
    let s1_done = one(&s1, "run.completed");
    let s2_done = one(&s2, "run.completed");
    assert_eq!(
        report["total"]["usage"],
        sum_usage([&s1_done["usage"], &s2_done["usage"]])
    );
    assert!(close(cost(&report["total"]), cost(s1_done) + cost(s2_done)));
    assert_eq!(report["agents"]["comptable"]["calls"], 2);
}

#[test]
fn a_tenant_over_its_day_ceiling_is_refused_and_nothing_is_written() {
    let dir = project();
    let dupont = |run_id: &str| {
        equipe(
            dir.path(),
            &[
                "run",
                "secretariat",
                SOLDE,
                "--tenant",
                "dupont",
                "--run-id",
                run_id,
            ],
        )
    };
    // Nothing spent today: the first run goes through, and spends more than 100 tokens.
    let out = dupont("t1");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = session(dir.path(), "dupont", "t1");
    let spent = tokens(&one(&of_run(&events, "t1"), "run.completed")["usage"]);
    assert!(spent > 100);
    let before = journal_files(dir.path());
    assert_eq!(before.len(), 1);

    let out = dupont("t2");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(text(&out.stdout), "");
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(&format!(
            "error: tenant 'dupont': tenant budget reached for the day: {spent} tokens \
             (limit 100 tokens) — retry in "
        )),
        "{stderr}"
    );
    // An undeclared tenant is refused too.
    let out = equipe(
        dir.path(),
        &[
            "run",
            "secretariat",
            SOLDE,
            "--tenant",
            "x",
            "--run-id",
            "t3",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("tenant 'x' is not declared (tenants: default, dupont)"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        journal_files(dir.path()),
        before,
        "a refused run writes nothing"
    );

    // The ceiling is Dupont's: the default tenant still runs.
    ok(dir.path(), &["run", "secretariat", SOLDE, "--run-id", "d1"]);

    // Dupont's usage over the day and the month: its one run, the sub-agent's part included.
    let comptable = child(&events, "t1");
    let day = ok(
        dir.path(),
        &["report", "--tenant", "dupont", "--period", "day"],
    );
    insta::assert_snapshot!("report_tenant_day", redacted(&day, &[&comptable]));
    let t1_done = one(&of_run(&events, "t1"), "run.completed");
    for period in ["day", "month"] {
        let report: Value = serde_json::from_str(&ok(
            dir.path(),
            &["report", "--tenant", "dupont", "--period", period, "--json"],
        ))
        .unwrap();
        assert_eq!(report["tenant_id"], "dupont");
        assert_eq!(report["period"], period);
        let runs = report["runs"].as_object().unwrap();
        let mut listed: Vec<&str> = runs.keys().map(String::as_str).collect();
        listed.sort_by_key(|id| *id != "t1");
        assert_eq!(listed, ["t1", comptable.as_str()]);
        assert_eq!(runs["t1"]["session_id"], "t1");
        assert_eq!(report["total"]["usage"], t1_done["usage"]);
        assert!(close(cost(&report["total"]), cost(t1_done)));
        assert_eq!(
            report["agents"]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["comptable", "secretariat"]
        );
        assert_eq!(report["agents"]["comptable"]["calls"], 2);
        assert_eq!(report["roles"]["main"]["calls"], 4);
    }
}
