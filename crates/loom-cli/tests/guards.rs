//! Policies, output contracts and judges end to end, through the `garde` example binary: the
//! YAML of a copied project hooks them (with `params`), the facade wires them, the run goes on
//! the scripted fake model, and the assertions read the JSONL journal the binary wrote, its exit
//! code and what it printed. Each test works on a copy of examples/garde in its own temporary
//! directory, edited for its case.

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

// ---------------------------------------------------------------------------------------------
// Helpers

/// Runs the `garde` example binary in `dir` on its `loom.yaml`.
fn garde(dir: &Path, args: &[&str]) -> Output {
    Command::new(example_bin("garde"))
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .args(["--config", "loom.yaml"])
        .args(args)
        .output()
        .unwrap()
}

/// `garde run <agent> <message> --run-id <run_id> <extra…>`.
fn run(dir: &Path, agent: &str, message: &str, run_id: &str, extra: &[&str]) -> Output {
    let mut args = vec!["run", agent, message, "--run-id", run_id];
    args.extend_from_slice(extra);
    garde(dir, &args)
}

/// Asserts the exit code, showing what the binary printed otherwise.
fn exits(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// Replaces the one occurrence of `from` in `dir/file` with `to`.
fn edit(dir: &Path, file: &str, from: &str, to: &str) {
    let path = dir.join(file);
    let content = fs::read_to_string(&path).unwrap();
    assert_eq!(content.matches(from).count(), 1, "{from:?} in {content}");
    fs::write(&path, content.replacen(from, to, 1)).unwrap();
}

/// Replaces the `policies:` block that ends `agents/devis.yaml`.
fn policies(dir: &Path, block: &str) {
    edit(
        dir,
        "agents/devis.yaml",
        "policies:\n  - hook: numero_devis\n",
        block,
    );
}

/// Gives the model `id` a new script (the example's model keeps its script under another id).
fn script(dir: &Path, id: &str, replies: Value) {
    edit(
        dir,
        "loom.yaml",
        &format!("- id: {id}\n"),
        &format!("- id: {id}-exemple\n"),
    );
    edit(
        dir,
        "loom.yaml",
        "models:\n",
        &format!(
            "models:\n  - {{id: {id}, sdk: fake, model: TEST, params: {{script: {replies}}}}}\n"
        ),
    );
}

/// A scripted reply calling `chercher_devis` for `numero`.
fn lookup(numero: &str) -> Value {
    json!({"text": "Je cherche le devis.",
           "tool_calls": [{"name": "chercher_devis", "arguments": {"numero": numero}}]})
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// The payloads of the events of `kind`, in journal order.
fn payloads<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["type"] == kind)
        .map(|e| &e["payload"])
        .collect()
}

/// The only event of `kind`.
fn only<'a>(events: &'a [Value], kind: &str) -> &'a Value {
    let found = payloads(events, kind);
    assert_eq!(found.len(), 1, "{kind} in {:?}", types(events));
    found[0]
}

/// Position of the first event of `kind` matching `filter`.
fn position(events: &[Value], kind: &str, filter: impl Fn(&Value) -> bool) -> usize {
    events
        .iter()
        .position(|e| e["type"] == kind && filter(&e["payload"]))
        .unwrap_or_else(|| panic!("no matching {kind} in {:?}", types(events)))
}

/// `(policy, point, decision)` of every `policy.decided`.
fn decisions(events: &[Value]) -> Vec<(String, String, String)> {
    payloads(events, "policy.decided")
        .into_iter()
        .map(|p| {
            (
                p["policy"].as_str().unwrap().to_owned(),
                p["point"].as_str().unwrap().to_owned(),
                p["decision"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn decision(policy: &str, point: &str, decision: &str) -> (String, String, String) {
    (policy.into(), point.into(), decision.into())
}

/// `(from, to)` of every `run.transitioned`.
fn transitions(events: &[Value]) -> Vec<(String, String)> {
    payloads(events, "run.transitioned")
        .into_iter()
        .map(|p| {
            (
                p["from_state"].as_str().unwrap().to_owned(),
                p["to_state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The text of a `tool.completed` output.
fn result_text(completed: &Value) -> String {
    completed["output"]["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect()
}

/// The text of the run's final output.
fn final_text(events: &[Value]) -> String {
    only(events, "run.completed")["output"]["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect()
}

/// The `message.user` repairs: `(policy, tools)`.
fn repairs(events: &[Value]) -> Vec<(String, bool)> {
    payloads(events, "message.user")
        .into_iter()
        .filter(|m| m["kind"] == "repair")
        .map(|m| {
            (
                m["policy"].as_str().unwrap().to_owned(),
                m["tools"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// The failure of a failed run: `(error_type, error)`.
fn failure(events: &[Value]) -> (String, String) {
    let failed = only(events, "run.failed");
    (
        failed["error_type"].as_str().unwrap().to_owned(),
        failed["error"].as_str().unwrap().to_owned(),
    )
}

const QUESTION: &str = "Que vaut le devis D-2026-042 ?";
const FOUND: &str = "Le devis D-2026-042 s'élève à 1 840 € TTC.";

// ---------------------------------------------------------------------------------------------
// before_tool: deny, replace (the reference's scenario), pause, fail

/// One line per event, with what tells the policies' story.
fn story(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| {
            let p = &e["payload"];
            let kind = e["type"].as_str().unwrap();
            match kind {
                "policy.decided" => format!(
                    "{kind} {} {} {} ({})",
                    p["policy"].as_str().unwrap(),
                    p["point"].as_str().unwrap(),
                    p["decision"].as_str().unwrap(),
                    p["call_id"].as_str().unwrap_or("-")
                ),
                "tool.called" | "tool.completed" => format!(
                    "{kind} {} ({}){}",
                    p["tool_name"].as_str().unwrap(),
                    p["call_id"].as_str().unwrap(),
                    if p["output"]["is_error"] == true {
                        " error"
                    } else {
                        ""
                    }
                ),
                "run.transitioned" => format!(
                    "{kind} {} → {}",
                    p["from_state"].as_str().unwrap(),
                    p["to_state"].as_str().unwrap()
                ),
                "step.started" => format!("{kind} {}", p["effect"].as_str().unwrap()),
                _ => kind.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_malformed_quote_number_is_denied_then_a_sloppy_one_normalized_as_in_the_reference() {
    let Some(reference) = reference_journal("policies-terminal-role.jsonl") else {
        return;
    };
    let dir = copy_example("garde");
    let out = run(dir.path(), "devis", "Que vaut le devis 42 ?", "ref", &[]);
    exits(&out, 0);
    assert_eq!(
        text(&out.stdout).trim(),
        r#"Voici le devis : {"numero":"D-2026-042","client":"Mme Martin","montant_ttc":1840.0}"#
    );
    let events = journal(dir.path(), "ref");

    let decided = payloads(&events, "policy.decided");
    assert_eq!(decided.len(), 2);
    // The refusal: journaled before the error result the model reads; the tool never ran.
    assert_eq!(
        decided[0],
        &json!({"type": "policy.decided", "policy": "numero_devis", "point": "before_tool",
                "decision": "deny",
                "reason": "numéro de devis mal formé : '42' (format attendu : D-AAAA-NNN)",
                "call_id": "fake_0_0", "attempt": null, "tools": null, "arguments": null,
                "output": null, "error": false})
    );
    let completed = payloads(&events, "tool.completed");
    assert_eq!(completed[0]["call_id"], "fake_0_0");
    assert_eq!(completed[0]["output"]["is_error"], true);
    assert_eq!(
        result_text(completed[0]),
        "Call refused (numero_devis): numéro de devis mal formé : '42' (format attendu : D-AAAA-NNN)"
    );
    // The replacement: the corrected arguments in the decision, the model's in tool.called,
    // and the tool ran with the corrected ones.
    assert_eq!(decided[1]["decision"], "replace");
    assert_eq!(decided[1]["call_id"], "fake_1_0");
    assert_eq!(decided[1]["reason"], "' d-2026-042 ' → 'D-2026-042'");
    assert_eq!(decided[1]["arguments"], json!({"numero": "D-2026-042"}));
    let called = only(&events, "tool.called");
    assert_eq!(called["call_id"], "fake_1_0");
    assert_eq!(called["arguments"], json!({"numero": " d-2026-042 "}));
    assert_eq!(
        completed[1]["output"]["data"],
        json!({"numero": "D-2026-042", "client": "Mme Martin", "montant_ttc": 1840.0})
    );

    // The reference journal's sequence up to its third model call (without its
    // `loom.require_tool`, not hooked here), then the completion.
    let mut expected: Vec<&str> = types(&reference[..27])
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != 4)
        .map(|(_, t)| t)
        .collect();
    assert_eq!(reference[4]["payload"]["policy"], "loom.require_tool");
    expected.push("run.completed");
    assert_eq!(types(&events), expected);
    insta::assert_snapshot!("deny_then_replace", story(&events));
}

#[test]
fn a_pause_before_the_tool_waits_for_a_human_who_approves_from_a_second_process() {
    let dir = copy_example("garde");
    script(
        dir.path(),
        "fake-devis",
        json!([lookup("D-2026-042"), {"text": FOUND}]),
    );
    policies(
        dir.path(),
        "policies:\n  - hook: acces_devis\n    params: {a_valider: [D-2026-042]}\n",
    );
    let out = run(dir.path(), "devis", QUESTION, "pause", &[]);
    exits(&out, 1);
    let stderr = text(&out.stderr);
    assert_eq!(text(&out.stdout), "", "a paused run prints no answer");
    assert!(stderr.contains("Status     : paused"), "{stderr}");
    assert!(
        stderr.contains(
            "Waiting    : chercher_devis (fake_0_0) — loom approve pause --call fake_0_0\n"
        ),
        "{stderr}"
    );
    let events = journal(dir.path(), "pause");
    let decided = only(&events, "policy.decided");
    assert_eq!(
        (&decided["policy"], &decided["point"], &decided["decision"]),
        (
            &json!("acces_devis"),
            &json!("before_tool"),
            &json!("pause")
        )
    );
    assert_eq!(decided["call_id"], "fake_0_0");
    let requested = only(&events, "approval.requested");
    assert_eq!(requested["policy"], "acces_devis");
    assert_eq!(
        requested["reason"],
        "le devis D-2026-042 ne se consulte qu'après validation"
    );
    assert_eq!(requested["arguments"], json!({"numero": "D-2026-042"}));
    assert!(
        position(&events, "policy.decided", |_| true)
            < position(&events, "approval.requested", |_| true)
    );
    assert!(!types(&events).contains(&"tool.called"));
    assert_eq!(
        transitions(&events).last().unwrap(),
        &("awaiting_tools".to_owned(), "paused".to_owned())
    );

    // A second process approves; the policy is not asked again and the tool runs.
    let out = garde(dir.path(), &["approve", "pause", "--by", "denis"]);
    exits(&out, 0);
    assert!(
        text(&out.stderr).starts_with("Approved: fake_0_0\n"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout).trim(), FOUND);
    let events = journal(dir.path(), "pause");
    assert_eq!(payloads(&events, "policy.decided").len(), 1);
    assert_eq!(only(&events, "approval.granted")["by"], "denis");
    let granted = position(&events, "approval.granted", |_| true);
    assert!(granted < position(&events, "tool.called", |_| true));
    assert_eq!(only(&events, "tool.completed")["output"]["is_error"], false);
    assert_eq!(final_text(&events), FOUND);

    // The run replays identically: its pause is answered again by the recorded decision, in
    // a scratch journal (the session's file is left as it was).
    let file = dir.path().join("data/default/pause.jsonl");
    let before = fs::read_to_string(&file).unwrap();
    let out = garde(dir.path(), &["replay", "pause", "--json"]);
    exits(&out, 0);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["outcome"], "identical", "{report}");
    assert_eq!(fs::read_to_string(&file).unwrap(), before);
}

#[test]
fn a_fail_before_the_tool_fails_the_run_without_running_it() {
    let dir = copy_example("garde");
    script(
        dir.path(),
        "fake-devis",
        json!([lookup("D-2026-017"), {"text": FOUND}]),
    );
    policies(
        dir.path(),
        "policies:\n  - hook: acces_devis\n    params: {interdits: [D-2026-017]}\n",
    );
    let out = run(
        dir.path(),
        "devis",
        "Le devis D-2026-017 ?",
        "interdit",
        &[],
    );
    exits(&out, 1);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "Error      : consultation du devis D-2026-017 interdite (policy.acces_devis)"
        ),
        "{stderr}"
    );
    let events = journal(dir.path(), "interdit");
    assert_eq!(
        decisions(&events),
        [decision("acces_devis", "before_tool", "fail")]
    );
    assert_eq!(
        failure(&events),
        (
            "policy.acces_devis".to_owned(),
            "consultation du devis D-2026-017 interdite".to_owned()
        )
    );
    assert!(!types(&events).contains(&"tool.called"));
    assert!(!types(&events).contains(&"tool.completed"));
    let steps = payloads(&events, "step.completed");
    assert_eq!(steps.last().unwrap()["outcome"], "error");
    // The decision (error status) precedes the failure.
    let decided = events
        .iter()
        .find(|e| e["type"] == "policy.decided")
        .unwrap();
    assert_eq!(decided["status"], "error");
    assert!(
        position(&events, "policy.decided", |_| true) < position(&events, "run.failed", |_| true)
    );
}

// ---------------------------------------------------------------------------------------------
// before_model: replace (loom.require_tool), stop, fail

#[test]
fn require_tool_forces_the_first_call_to_use_a_tool() {
    let dir = copy_example("garde");
    script(
        dir.path(),
        "fake-devis",
        json!([lookup("D-2026-042"), {"text": FOUND}]),
    );
    policies(dir.path(), "policies:\n  - hook: loom.require_tool\n");
    let out = run(dir.path(), "devis", QUESTION, "force", &[]);
    exits(&out, 0);
    let events = journal(dir.path(), "force");
    // Only before the first call: a tool was called before the second.
    let decided = only(&events, "policy.decided");
    assert_eq!(
        decided,
        &json!({"type": "policy.decided", "policy": "loom.require_tool", "point": "before_model",
                "decision": "replace",
                "reason": "no tool called yet in the run: a tool call is required",
                "call_id": null, "attempt": null, "tools": null, "arguments": null,
                "output": null, "error": false})
    );
    let at = position(&events, "policy.decided", |_| true);
    assert_eq!(types(&events)[at - 1], "step.started");
    assert_eq!(types(&events)[at + 1], "model.responded");
    assert_eq!(final_text(&events), FOUND);

    // The replaced request really asks for a tool: a model answering without one fails.
    let dir = copy_example("garde");
    script(dir.path(), "fake-devis", json!([{"text": FOUND}]));
    policies(dir.path(), "policies:\n  - hook: loom.require_tool\n");
    let out = run(dir.path(), "devis", QUESTION, "force", &[]);
    exits(&out, 1);
    let events = journal(dir.path(), "force");
    assert_eq!(
        decisions(&events),
        [decision("loom.require_tool", "before_model", "replace")]
    );
    let (error_type, error) = failure(&events);
    assert_eq!(error_type, "model.invalid_request");
    assert!(error.contains("a tool call is required"), "{error}");
}

#[test]
fn a_stop_before_the_model_finishes_the_run_without_tools() {
    let dir = copy_example("garde");
    script(
        dir.path(),
        "fake-devis",
        json!([lookup("D-2026-042"), {"text": FOUND}]),
    );
    policies(
        dir.path(),
        "policies:\n  - hook: quota_appels\n    params: {max_appels: 1, action: stop}\n",
    );
    let out = run(dir.path(), "devis", QUESTION, "quota", &[]);
    exits(&out, 0);
    assert_eq!(text(&out.stdout).trim(), FOUND);
    let events = journal(dir.path(), "quota");
    let decided = only(&events, "policy.decided");
    assert_eq!(
        (&decided["policy"], &decided["point"], &decided["decision"]),
        (
            &json!("quota_appels"),
            &json!("before_model"),
            &json!("stop")
        )
    );
    assert_eq!(decided["reason"], "quota de 1 appel(s) au modèle atteint");
    let stopped = position(&events, "run.transitioned", |p| {
        p["to_state"] == "finalizing"
    });
    assert_eq!(events[stopped]["payload"]["cause_type"], "policy.decided");
    assert!(position(&events, "policy.decided", |_| true) < stopped);
    assert_eq!(
        transitions(&events),
        [
            ("ready_for_model", "awaiting_tools"),
            ("awaiting_tools", "ready_for_model"),
            ("ready_for_model", "finalizing"),
            ("finalizing", "completed"),
        ]
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
    );
    let effects: Vec<&str> = payloads(&events, "step.started")
        .iter()
        .map(|s| s["effect"].as_str().unwrap())
        .collect();
    assert_eq!(
        effects,
        ["model_call", "tool_batch", "model_call", "finalize"]
    );
    // The stopped step called no model; the finalizing one did.
    assert_eq!(payloads(&events, "model.responded").len(), 2);
    assert_eq!(only(&events, "run.completed")["iterations"], 2);
}

#[test]
fn a_fail_before_the_model_fails_the_run_before_any_call() {
    let dir = copy_example("garde");
    policies(
        dir.path(),
        "policies:\n  - hook: quota_appels\n    params: {max_appels: 0, action: fail}\n",
    );
    let out = run(dir.path(), "devis", QUESTION, "ferme", &[]);
    exits(&out, 1);
    assert!(
        text(&out.stderr)
            .contains("Error      : quota de 0 appel(s) au modèle atteint (policy.quota_appels)"),
        "{}",
        text(&out.stderr)
    );
    let events = journal(dir.path(), "ferme");
    assert_eq!(
        decisions(&events),
        [decision("quota_appels", "before_model", "fail")]
    );
    assert_eq!(failure(&events).0, "policy.quota_appels");
    assert!(!types(&events).contains(&"model.responded"));
    assert_eq!(only(&events, "run.failed")["iterations"], 0);
}

// ---------------------------------------------------------------------------------------------
// after_model: retry, stop, fail

/// A casual first answer that calls the tool, the professional repair, its conclusion.
fn casual_script() -> Value {
    let mut casual = lookup("D-2026-042");
    casual["text"] = json!("Super, je regarde ça !");
    // As in the reference's fake model, a repair request is not a turn of the user: the
    // script answers it with its next reply.
    json!([casual, lookup("D-2026-042"), {"text": FOUND}])
}

fn ton_professionnel(dir: &Path, action: &str) {
    script(dir, "fake-devis", casual_script());
    policies(
        dir,
        &format!(
            "policies:\n  - hook: ton_professionnel\n    points: [after_model]\n    params: {{action: {action}}}\n"
        ),
    );
}

#[test]
fn a_retry_after_the_model_closes_its_calls_and_asks_for_a_repair() {
    let dir = copy_example("garde");
    ton_professionnel(dir.path(), "retry");
    let out = run(dir.path(), "devis", QUESTION, "ton", &[]);
    exits(&out, 0);
    assert_eq!(text(&out.stdout).trim(), FOUND);
    let events = journal(dir.path(), "ton");
    let decided = only(&events, "policy.decided");
    assert_eq!(
        decided,
        &json!({"type": "policy.decided", "policy": "ton_professionnel", "point": "after_model",
                "decision": "retry",
                "reason": "ton trop familier (« super ») : reformule sur un ton professionnel",
                "call_id": null, "attempt": 1, "tools": true, "arguments": null,
                "output": null, "error": false})
    );
    // The refused answer's call is closed without running; then the repair.
    let completed = payloads(&events, "tool.completed");
    assert_eq!(completed[0]["call_id"], "fake_0_0");
    assert_eq!(
        result_text(completed[0]),
        "Not run: the answer was refused by the check ton_professionnel."
    );
    assert_eq!(repairs(&events), [("ton_professionnel".to_owned(), true)]);
    let decided_at = position(&events, "policy.decided", |_| true);
    let repair_at = position(&events, "message.user", |m| m["kind"] == "repair");
    assert!(decided_at < repair_at);
    // Only the repaired answer's call ran (the scripted model's second answer).
    assert_eq!(only(&events, "tool.called")["call_id"], "fake_1_0");
    assert!(repair_at < position(&events, "tool.called", |_| true));
    assert_eq!(final_text(&events), FOUND);
}

#[test]
fn a_stop_after_the_model_closes_its_calls_and_finalizes() {
    let dir = copy_example("garde");
    let mut casual = lookup("D-2026-042");
    casual["text"] = json!("Super, je regarde ça !");
    script(
        dir.path(),
        "fake-devis",
        json!([casual, {"text": "Je ne peux pas consulter ce devis pour l'instant."}]),
    );
    policies(
        dir.path(),
        "policies:\n  - hook: ton_professionnel\n    points: [after_model]\n    params: {action: stop}\n",
    );
    let out = run(dir.path(), "devis", QUESTION, "stop", &[]);
    exits(&out, 0);
    let events = journal(dir.path(), "stop");
    assert_eq!(
        decisions(&events),
        [decision("ton_professionnel", "after_model", "stop")]
    );
    assert!(!types(&events).contains(&"tool.called"));
    assert_eq!(
        result_text(only(&events, "tool.completed")),
        "Not run: the run was stopped (ton trop familier (« super ») : reformule sur un ton professionnel)."
    );
    // Decided outside any step, the stop closes the answer's call and finalizes at once.
    assert_eq!(
        transitions(&events),
        [
            ("ready_for_model", "finalizing"),
            ("finalizing", "completed")
        ]
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
    );
    let decided = position(&events, "policy.decided", |_| true);
    assert_eq!(
        types(&events)[decided - 2..decided + 3],
        [
            "model.responded",
            "step.completed",
            "policy.decided",
            "tool.completed",
            "run.transitioned"
        ]
    );
    assert_eq!(
        final_text(&events),
        "Je ne peux pas consulter ce devis pour l'instant."
    );
}

#[test]
fn a_fail_after_the_model_fails_the_run() {
    let dir = copy_example("garde");
    ton_professionnel(dir.path(), "fail");
    let out = run(dir.path(), "devis", QUESTION, "familier", &[]);
    exits(&out, 1);
    let events = journal(dir.path(), "familier");
    assert_eq!(
        decisions(&events),
        [decision("ton_professionnel", "after_model", "fail")]
    );
    assert_eq!(
        failure(&events),
        (
            "policy.ton_professionnel".to_owned(),
            "ton trop familier (« super ») : reformule sur un ton professionnel".to_owned()
        )
    );
    assert!(!types(&events).contains(&"tool.called"));
    assert!(
        position(&events, "policy.decided", |_| true) < position(&events, "run.failed", |_| true)
    );
}

// ---------------------------------------------------------------------------------------------
// after_tool: replace, retry, fail

#[test]
fn a_replace_after_the_tool_changes_what_the_model_and_the_journal_see() {
    let dir = copy_example("garde");
    script(
        dir.path(),
        "fake-devis",
        json!([lookup("D-2026-042"), {"text": "Résultat : {{ tool_result }}"}]),
    );
    policies(dir.path(), "policies:\n  - hook: anonymisation\n");
    let out = run(dir.path(), "devis", QUESTION, "rgpd", &[]);
    exits(&out, 0);
    let masked = json!({"numero": "D-2026-042", "client": "Mme M.", "montant_ttc": 1840.0});
    assert_eq!(
        text(&out.stdout).trim(),
        format!("Résultat : {}", serde_json::to_string(&masked).unwrap())
    );
    let events = journal(dir.path(), "rgpd");
    let decided = only(&events, "policy.decided");
    assert_eq!(
        (&decided["policy"], &decided["point"], &decided["decision"]),
        (
            &json!("anonymisation"),
            &json!("after_tool"),
            &json!("replace")
        )
    );
    assert_eq!(decided["call_id"], "fake_0_0");
    assert_eq!(decided["reason"], "nom du client masqué : 'Mme M.'");
    assert_eq!(decided["output"]["data"], masked);
    let completed = only(&events, "tool.completed");
    assert_eq!(completed["output"]["data"], masked);
    assert!(
        position(&events, "policy.decided", |_| true)
            < position(&events, "tool.completed", |_| true)
    );
    assert!(
        !fs::read_to_string(dir.path().join("data/default/rgpd.jsonl"))
            .unwrap()
            .contains("Martin")
    );
}

fn plafond(dir: &Path, action: &str) {
    script(
        dir,
        "fake-devis",
        json!([lookup("D-2026-042"), {"text": "Résultat : {{ tool_result }}"}]),
    );
    policies(
        dir,
        &format!(
            "policies:\n  - hook: plafond_montant\n    params: {{plafond: 1000, action: {action}}}\n"
        ),
    );
}

const ABOVE: &str = "montant de 1840 € au-dessus du plafond de 1000 € : vérifie le numéro du devis";

#[test]
fn a_retry_after_a_plain_tool_becomes_an_error_result_never_repaired() {
    let dir = copy_example("garde");
    plafond(dir.path(), "retry");
    let out = run(dir.path(), "devis", QUESTION, "plafond", &[]);
    exits(&out, 0);
    let refused = format!("Result refused (plafond_montant): {ABOVE}");
    assert_eq!(text(&out.stdout).trim(), format!("Résultat : {refused}"));
    let events = journal(dir.path(), "plafond");
    let decided = only(&events, "policy.decided");
    assert_eq!(
        (&decided["policy"], &decided["point"], &decided["decision"]),
        (
            &json!("plafond_montant"),
            &json!("after_tool"),
            &json!("retry")
        )
    );
    assert_eq!(decided["call_id"], "fake_0_0");
    assert_eq!(decided["reason"], ABOVE);
    let completed = only(&events, "tool.completed");
    assert_eq!(completed["output"]["is_error"], true);
    assert_eq!(result_text(completed), refused);
    // A plain tool is not asked again, and the orchestrator gets no repair message.
    assert_eq!(payloads(&events, "tool.called").len(), 1);
    assert!(repairs(&events).is_empty());
}

#[test]
fn a_fail_after_the_tool_fails_the_run_once_the_result_is_journaled() {
    let dir = copy_example("garde");
    plafond(dir.path(), "fail");
    let out = run(dir.path(), "devis", QUESTION, "plafond", &[]);
    exits(&out, 1);
    let events = journal(dir.path(), "plafond");
    assert_eq!(
        decisions(&events),
        [decision("plafond_montant", "after_tool", "fail")]
    );
    assert_eq!(
        failure(&events),
        ("policy.plafond_montant".to_owned(), ABOVE.to_owned())
    );
    let decided = position(&events, "policy.decided", |_| true);
    let completed = position(&events, "tool.completed", |_| true);
    assert!(decided < completed);
    assert!(completed < position(&events, "run.failed", |_| true));
}

/// The `devis` agent prices through a role `chiffrer` (its answer checked by a JSON contract, so
/// its result carries `montant_ttc`), whose model answers `answers` in turn (a repair request is
/// not a turn: the second answer is the repair), under `plafond_montant` (1 000 €, `retry`)
/// with `max_attempts`.
fn role_above_the_ceiling(dir: &Path, answers: [f64; 2], max_attempts: u32) {
    script(
        dir,
        "fake-devis",
        json!([{"tool_calls": [{"name": "chiffrer", "arguments": {"numero": "D-2026-042"}}]},
               {"text": "Résultat : {{ tool_result }}"}]),
    );
    let replies: Vec<Value> = answers
        .iter()
        .map(|m| json!({"text": format!("{{\"montant_ttc\": {m}}}")}))
        .collect();
    edit(
        dir,
        "loom.yaml",
        "models:\n",
        &format!(
            "models:\n  - {{id: fake-chiffrage, sdk: fake, model: TEST, params: {{script: {}}}}}\n",
            Value::Array(replies)
        ),
    );
    policies(
        dir,
        &format!(
            "roles:\n  - name: chiffrer\n    description: Chiffre un devis.\n    model: \
             fake-chiffrage\n    system: Tu chiffres les devis en JSON.\n    input_schema: \
             {{type: object, properties: {{numero: {{type: string}}}}}}\n    output:\n      \
             schema: {{type: object, required: [montant_ttc], properties: {{montant_ttc: \
             {{type: number}}}}}}\npolicies:\n  - hook: plafond_montant\n    params: \
             {{plafond: 1000}}\n    max_attempts: {max_attempts}\n"
        ),
    );
}

#[test]
fn a_retry_after_a_role_is_repaired_by_the_role_in_its_own_conversation() {
    let dir = copy_example("garde");
    role_above_the_ceiling(dir.path(), [1840.0, 840.0], 1);
    let out = run(dir.path(), "devis", QUESTION, "chiffre", &[]);
    exits(&out, 0);
    assert_eq!(
        text(&out.stdout).trim(),
        "Résultat : {\"montant_ttc\": 840}"
    );
    let events = journal(dir.path(), "chiffre");
    let decided = only(&events, "policy.decided");
    assert_eq!(
        (&decided["policy"], &decided["point"], &decided["decision"]),
        (
            &json!("plafond_montant"),
            &json!("after_tool"),
            &json!("retry")
        )
    );
    assert_eq!(decided["call_id"], "fake_0_0");
    assert_eq!(decided["attempt"], 1);
    // The role answered twice in its own conversation: its answer, then the policy's feedback.
    let role_calls: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "model.responded" && e["role"] == "chiffrer")
        .collect();
    // (Called afresh, its script would give its first answer again: the second one answers
    // only a conversation holding the first answer and the repair request.)
    assert_eq!(role_calls.len(), 2, "{:?}", types(&events));
    // One call, one result: the repaired answer, not an error; the orchestrator got no repair
    // message of its own.
    assert_eq!(payloads(&events, "tool.called").len(), 1);
    let completed = only(&events, "tool.completed");
    assert_eq!(completed["output"]["is_error"], false);
    assert_eq!(completed["output"]["data"], json!({"montant_ttc": 840}));
    assert!(repairs(&events).is_empty());
    // The decision is in the call's span, before its result.
    let decided_at = position(&events, "policy.decided", |_| true);
    assert!(decided_at < position(&events, "tool.completed", |_| true));
    assert_eq!(
        events[decided_at]["span_id"],
        events[position(&events, "tool.completed", |_| true)]["span_id"]
    );
}

#[test]
fn a_role_still_refused_beyond_max_attempts_fails_the_run() {
    let dir = copy_example("garde");
    role_above_the_ceiling(dir.path(), [1840.0, 1900.0], 1);
    let out = run(dir.path(), "devis", QUESTION, "chiffre", &[]);
    exits(&out, 1);
    let events = journal(dir.path(), "chiffre");
    assert_eq!(
        decisions(&events),
        [
            decision("plafond_montant", "after_tool", "retry"),
            decision("plafond_montant", "after_tool", "fail")
        ]
    );
    let above = "montant de 1900 € au-dessus du plafond de 1000 € : vérifie le numéro du devis";
    assert_eq!(
        failure(&events),
        (
            "policy.plafond_montant".to_owned(),
            format!("1 repair(s) asked without success; last diagnostic: {above}")
        )
    );
    // The call's result is journaled before the run fails.
    let completed = position(&events, "tool.completed", |_| true);
    assert!(completed < position(&events, "run.failed", |_| true));
    assert_eq!(
        events
            .iter()
            .filter(|e| e["type"] == "model.responded" && e["role"] == "chiffrer")
            .count(),
        2
    );
}

// ---------------------------------------------------------------------------------------------
// on_output: replace, retry, fail

#[test]
fn a_replace_on_output_changes_the_final_answer() {
    let dir = copy_example("garde");
    script(dir.path(), "fake-devis", json!([{"text": FOUND}]));
    policies(dir.path(), "policies:\n  - hook: signature\n");
    let out = run(dir.path(), "devis", QUESTION, "signe", &["--json"]);
    exits(&out, 0);
    let signed = format!("{FOUND}\n— Le service devis");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["text"], signed.as_str());
    let events = journal(dir.path(), "signe");
    let decided = only(&events, "policy.decided");
    assert_eq!(
        (&decided["policy"], &decided["point"], &decided["decision"]),
        (&json!("signature"), &json!("on_output"), &json!("replace"))
    );
    assert_eq!(decided["reason"], "réponse signée");
    assert_eq!(decided["output"]["blocks"][0]["text"], signed.as_str());
    assert_eq!(final_text(&events), signed);
    // The model's answer stays in its model.responded.
    let responded = only(&events, "model.responded");
    assert_eq!(responded["message"]["blocks"][0]["text"], FOUND);
    assert!(
        position(&events, "policy.decided", |_| true)
            < position(&events, "run.completed", |_| true)
    );
}

fn cite_le_devis(dir: &Path, action: &str) {
    script(
        dir,
        "fake-devis",
        json!([{"text": "Il s'élève à 1 840 € TTC."}, {"text": FOUND}]),
    );
    policies(
        dir,
        &format!("policies:\n  - hook: cite_le_devis\n    params: {{action: {action}}}\n"),
    );
}

#[test]
fn a_retry_on_output_sends_the_answer_back_then_completes() {
    let dir = copy_example("garde");
    cite_le_devis(dir.path(), "retry");
    let out = run(dir.path(), "devis", QUESTION, "cite", &[]);
    exits(&out, 0);
    assert_eq!(text(&out.stdout).trim(), FOUND);
    let events = journal(dir.path(), "cite");
    let decided = only(&events, "policy.decided");
    assert_eq!(
        (&decided["policy"], &decided["point"], &decided["decision"]),
        (
            &json!("cite_le_devis"),
            &json!("on_output"),
            &json!("retry")
        )
    );
    assert_eq!(
        decided["reason"],
        "la réponse doit citer le numéro du devis (D-AAAA-NNN)"
    );
    assert_eq!(decided["attempt"], 1);
    assert_eq!(repairs(&events), [("cite_le_devis".to_owned(), true)]);
    assert_eq!(payloads(&events, "model.responded").len(), 2);
    assert_eq!(only(&events, "run.completed")["iterations"], 2);
    assert_eq!(final_text(&events), FOUND);
}

#[test]
fn a_fail_on_output_fails_the_run() {
    let dir = copy_example("garde");
    cite_le_devis(dir.path(), "fail");
    let out = run(dir.path(), "devis", QUESTION, "cite", &[]);
    exits(&out, 1);
    assert_eq!(text(&out.stdout).trim(), "—");
    let events = journal(dir.path(), "cite");
    assert_eq!(
        decisions(&events),
        [decision("cite_le_devis", "on_output", "fail")]
    );
    assert_eq!(
        failure(&events),
        (
            "policy.cite_le_devis".to_owned(),
            "la réponse doit citer le numéro du devis (D-AAAA-NNN)".to_owned()
        )
    );
    assert!(!types(&events).contains(&"run.completed"));
}

#[test]
fn a_policy_reference_sets_its_name_its_repairs_and_its_errors_from_yaml() {
    // `name` renames the policy in the journal and in what the model reads.
    let dir = copy_example("garde");
    policies(
        dir.path(),
        "policies:\n  - hook: numero_devis\n    name: format_devis\n",
    );
    let out = run(dir.path(), "devis", "Que vaut le devis 42 ?", "nom", &[]);
    exits(&out, 0);
    let events = journal(dir.path(), "nom");
    assert_eq!(
        decisions(&events),
        [
            decision("format_devis", "before_tool", "deny"),
            decision("format_devis", "before_tool", "replace")
        ]
    );
    assert!(
        result_text(payloads(&events, "tool.completed")[0])
            .starts_with("Call refused (format_devis): ")
    );

    // `max_attempts: 2`: two repairs, then the run fails with the last diagnostic.
    let dir = copy_example("garde");
    script(
        dir.path(),
        "fake-devis",
        json!([
            {"text": "Il s'élève à 1 840 € TTC."},
            {"text": "Il s'élève toujours à 1 840 € TTC."},
            {"text": "Il s'élève encore à 1 840 € TTC."}
        ]),
    );
    policies(
        dir.path(),
        "policies:\n  - hook: cite_le_devis\n    max_attempts: 2\n",
    );
    let out = run(dir.path(), "devis", QUESTION, "essais", &[]);
    exits(&out, 1);
    let events = journal(dir.path(), "essais");
    assert_eq!(
        decisions(&events),
        [
            decision("cite_le_devis", "on_output", "retry"),
            decision("cite_le_devis", "on_output", "retry"),
            decision("cite_le_devis", "on_output", "fail")
        ]
    );
    let attempts: Vec<&Value> = payloads(&events, "policy.decided")
        .iter()
        .map(|p| &p["attempt"])
        .collect();
    assert_eq!(attempts, [&json!(1), &json!(2), &Value::Null]);
    assert_eq!(repairs(&events).len(), 2);
    assert_eq!(
        failure(&events),
        (
            "policy.cite_le_devis".to_owned(),
            "2 repair(s) asked without success; last diagnostic: la réponse doit citer le \
             numéro du devis (D-AAAA-NNN)"
                .to_owned()
        )
    );

    // A policy that errs (an action it cannot take) blocks the run by default…
    let dir = copy_example("garde");
    script(
        dir.path(),
        "fake-devis",
        json!([{"text": "Il s'élève à 1 840 € TTC."}]),
    );
    policies(
        dir.path(),
        "policies:\n  - hook: cite_le_devis\n    params: {action: ignorer}\n",
    );
    let out = run(dir.path(), "devis", QUESTION, "bloque", &[]);
    exits(&out, 1);
    let events = journal(dir.path(), "bloque");
    let decided = only(&events, "policy.decided");
    assert_eq!(
        (&decided["decision"], &decided["error"]),
        (&json!("fail"), &json!(true))
    );
    let why =
        "policy cite_le_devis failed: params.action must be retry, stop or fail, not 'ignorer'";
    assert_eq!(
        failure(&events),
        ("policy.cite_le_devis".to_owned(), why.to_owned())
    );
    // … and lets it go on, journaled, with `on_error: allow`.
    edit(
        dir.path(),
        "agents/devis.yaml",
        "    params:",
        "    on_error: allow\n    params:",
    );
    let out = run(dir.path(), "devis", QUESTION, "laisse", &[]);
    exits(&out, 0);
    let events = journal(dir.path(), "laisse");
    let decided = events
        .iter()
        .find(|e| e["type"] == "policy.decided")
        .unwrap();
    assert_eq!(
        (
            &decided["payload"]["decision"],
            &decided["payload"]["error"]
        ),
        (&json!("continue"), &json!(true))
    );
    assert_eq!(decided["status"], "warning");
    assert_eq!(final_text(&events), "Il s'élève à 1 840 € TTC.");
}

// ---------------------------------------------------------------------------------------------
// Refused at load

/// `validate` and `run` both refuse the configuration (exit 2) with `message`; `validate`'s
/// message names the agent file, line and key.
fn refused_at_load(dir: &Path, message: &str) -> String {
    let out = garde(dir, &["validate"]);
    exits(&out, 2);
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("config error: agents/devis.yaml:"),
        "{stderr}"
    );
    assert!(stderr.contains(message), "{stderr}");
    let out = run(dir, "devis", QUESTION, "refused", &[]);
    exits(&out, 2);
    assert!(text(&out.stderr).contains(message));
    assert!(!dir.join("data/default/refused.jsonl").exists());
    stderr
}

#[test]
fn a_decision_not_allowed_at_a_point_is_refused_at_load() {
    // ton_professionnel may decide `stop`, which on_output does not allow.
    let dir = copy_example("garde");
    policies(
        dir.path(),
        "policies:\n  - hook: ton_professionnel\n    points: [on_output]\n",
    );
    let stderr = refused_at_load(
        dir.path(),
        "policy 'ton_professionnel' may decide 'stop', which is not allowed at on_output",
    );
    assert!(
        stderr.contains(":12:14 policies[0].points[0]: "),
        "{stderr}"
    );

    // The same without `points:`: every point it declares.
    let dir = copy_example("garde");
    policies(dir.path(), "policies:\n  - hook: ton_professionnel\n");
    let stderr = refused_at_load(
        dir.path(),
        "policy 'ton_professionnel' may decide 'stop', which is not allowed at on_output",
    );
    assert!(stderr.contains(":11:11 policies[0].hook: "), "{stderr}");

    // numero_devis (deny, replace) hooked after the model, which it does not declare.
    let dir = copy_example("garde");
    policies(
        dir.path(),
        "policies:\n  - hook: numero_devis\n    points: [before_tool, after_model]\n",
    );
    let stderr = refused_at_load(
        dir.path(),
        "policies[0].points[1]: policy 'numero_devis' does not apply to after_model (declared \
         points: before_tool)",
    );
    assert!(stderr.contains(":12:27 policies[0].points[1]"), "{stderr}");
}

#[test]
fn an_unknown_hook_is_refused_at_load() {
    let dir = copy_example("garde");
    policies(
        dir.path(),
        "policies:\n  - hook: numero_devis\n  - hook: horaires\n",
    );
    let stderr = refused_at_load(
        dir.path(),
        "policies[1].hook: unknown policy 'horaires' (registered policies: acces_devis, \
         anonymisation, cite_le_devis, numero_devis, plafond_montant, quota_appels, signature, \
         ton_professionnel; built in: loom.require_tool)",
    );
    assert!(stderr.contains(":12:11 policies[1].hook"), "{stderr}");

    // The stock binary registers none.
    let out = Command::new(loom_bin())
        .current_dir(dir.path())
        .args(["--config", "loom.yaml", "run", "devis", QUESTION])
        .output()
        .unwrap();
    exits(&out, 2);
    assert!(
        text(&out.stderr).contains(
            "policies[0].hook: unknown policy 'numero_devis' (registered policies: none; built \
             in: loom.require_tool)"
        ),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn require_tool_after_the_tool_is_refused_at_load() {
    let dir = copy_example("garde");
    policies(
        dir.path(),
        "policies:\n  - hook: loom.require_tool\n    points: [after_tool]\n",
    );
    refused_at_load(
        dir.path(),
        "policies[0].points[0]: policy 'loom.require_tool' does not apply to after_tool \
         (declared points: before_model)",
    );
}

// ---------------------------------------------------------------------------------------------
// Output contracts

/// The `fiche` agent's answers: prose, then (after the repair) `repaired`.
fn fiche_script(dir: &Path, repaired: &str) {
    script(
        dir,
        "fake-fiche",
        json!([lookup("D-2026-042"), {"text": FOUND}, {"text": repaired}]),
    );
}

#[test]
fn an_output_contract_failing_then_repaired_gives_the_validated_data() {
    let dir = copy_example("garde");
    let out = run(
        dir.path(),
        "fiche",
        "Fiche du devis D-2026-042",
        "fiche",
        &["--json"],
    );
    exits(&out, 0);
    let data = json!({"numero": "D-2026-042", "client": "Mme Martin", "montant_ttc": 1840.0});
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["data"], data);
    assert_eq!(result["unverified"], false);
    let events = journal(dir.path(), "fiche");
    let checks = payloads(&events, "guard.checked");
    assert_eq!(checks.len(), 2);
    assert_eq!(
        (
            &checks[0]["guard"],
            &checks[0]["target"],
            &checks[0]["outcome"]
        ),
        (&json!("contract"), &json!("output"), &json!("failed"))
    );
    assert_eq!(checks[0]["resolution"], "retry");
    assert_eq!(checks[0]["attempt"], 1);
    let reason = checks[0]["reason"].as_str().unwrap();
    assert!(
        reason
            .starts_with("The output does not meet its contract:\n- the output is not valid JSON"),
        "{reason}"
    );
    assert_eq!(
        decisions(&events),
        [decision("loom.contract", "on_output", "retry")]
    );
    // A contract repairs without tools (repair.tools: auto).
    assert_eq!(repairs(&events), [("loom.contract".to_owned(), false)]);
    assert_eq!(checks[1]["outcome"], "passed");
    assert_eq!(checks[1]["attempt"], 2);
    let completed = only(&events, "run.completed");
    assert_eq!(completed["data"], data);
    assert_eq!(completed["unverified"], false);
    assert_eq!(
        types(&events)[types(&events).len() - 4..],
        [
            "step.completed",
            "guard.checked",
            "run.transitioned",
            "run.completed"
        ]
    );
}

#[test]
fn a_schema_failure_is_repaired_by_default_as_in_the_reference() {
    // No `repair:` in the contract: the reference's default is one repair. The script is the
    // reference's shape: its first answer breaks the schema, its next one conforms.
    let dir = copy_example("garde");
    edit(
        dir.path(),
        "agents/fiche.yaml",
        "  repair: {max_attempts: 1}\n",
        "",
    );
    let repaired = r#"{"numero": "D-2026-042", "montant_ttc": 1840.0}"#;
    script(
        dir.path(),
        "fake-fiche",
        json!([{"text": "La fiche : numéro D-2026-042, 1 840 €."}, {"text": repaired}]),
    );
    let out = run(
        dir.path(),
        "fiche",
        "Fiche du devis D-2026-042",
        "defaut",
        &["--json"],
    );
    exits(&out, 0);
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "completed");
    assert_eq!(
        result["data"],
        json!({"numero": "D-2026-042", "montant_ttc": 1840.0})
    );
    let events = journal(dir.path(), "defaut");
    let checks: Vec<(&Value, &Value, &Value)> = payloads(&events, "guard.checked")
        .into_iter()
        .map(|c| (&c["outcome"], &c["resolution"], &c["attempt"]))
        .collect();
    assert_eq!(
        checks,
        [
            (&json!("failed"), &json!("retry"), &json!(1)),
            (&json!("passed"), &Value::Null, &json!(2))
        ]
    );
    // The diagnostic as the reference writes it: the problems, the rules kept (the compact
    // schema), then the request for the corrected output alone.
    let reason = payloads(&events, "guard.checked")[0]["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        reason
            .starts_with("The output does not meet its contract:\n- the output is not valid JSON"),
        "{reason}"
    );
    assert!(reason.contains("\nExpected JSON Schema: {"), "{reason}");
    assert!(
        reason.contains(r#""required":["numero","montant_ttc"]"#),
        "{reason}"
    );
    assert!(
        reason.ends_with("\nAnswer again with the corrected output, and only it."),
        "{reason}"
    );
    let decided = only(&events, "policy.decided");
    assert_eq!(
        (&decided["policy"], &decided["decision"], &decided["reason"]),
        (&json!("loom.contract"), &json!("retry"), &json!(reason))
    );
    let repair = payloads(&events, "message.user")
        .into_iter()
        .find(|m| m["kind"] == "repair")
        .unwrap();
    assert_eq!(
        repair["message"]["blocks"][0]["text"],
        format!("Answer refused by a check (loom.contract): {reason}")
    );
    assert_eq!(only(&events, "run.completed")["iterations"], 2);
}

#[test]
fn an_output_contract_still_failing_fails_the_run() {
    let dir = copy_example("garde");
    fiche_script(dir.path(), "Toujours pas de JSON.");
    let out = run(dir.path(), "fiche", "Fiche ?", "fiche", &[]);
    exits(&out, 1);
    let events = journal(dir.path(), "fiche");
    let resolutions: Vec<&Value> = payloads(&events, "guard.checked")
        .iter()
        .map(|c| &c["resolution"])
        .collect();
    assert_eq!(resolutions, [&json!("retry"), &json!("fail")]);
    let (error_type, error) = failure(&events);
    assert_eq!(error_type, "guard.contract");
    assert!(error.contains("the output is not valid JSON"), "{error}");
    assert!(
        text(&out.stderr).contains("(guard.contract)"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn an_output_contract_on_failure_unverified_keeps_the_answer_flagged() {
    let dir = copy_example("garde");
    fiche_script(dir.path(), "Toujours pas de JSON.");
    edit(
        dir.path(),
        "agents/fiche.yaml",
        "on_failure: fail",
        "on_failure: unverified",
    );
    let out = run(dir.path(), "fiche", "Fiche ?", "fiche", &[]);
    exits(&out, 0);
    assert_eq!(text(&out.stdout).trim(), "Toujours pas de JSON.");
    assert!(
        text(&out.stderr).contains("Verified   : no (kept despite its contract or its judge)\n"),
        "{}",
        text(&out.stderr)
    );
    let events = journal(dir.path(), "fiche");
    assert_eq!(
        payloads(&events, "guard.checked")[1]["resolution"],
        "unverified"
    );
    let completed = events
        .iter()
        .find(|e| e["type"] == "run.completed")
        .unwrap();
    assert_eq!(completed["status"], "warning");
    assert_eq!(completed["payload"]["unverified"], true);
    assert_eq!(completed["payload"]["data"], Value::Null);
    assert_eq!(final_text(&events), "Toujours pas de JSON.");

    let out = run(dir.path(), "fiche", "Fiche ?", "fiche-json", &["--json"]);
    exits(&out, 0);
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["unverified"], true);
    assert_eq!(result["fallback"], false);
}

#[test]
fn an_output_contract_on_failure_fallback_answers_the_fallback_message() {
    let dir = copy_example("garde");
    fiche_script(dir.path(), "Toujours pas de JSON.");
    edit(
        dir.path(),
        "agents/fiche.yaml",
        "on_failure: fail",
        "on_failure: fallback\n  fallback_message: Fiche indisponible, un conseiller vous rappelle.",
    );
    let out = run(dir.path(), "fiche", "Fiche ?", "fiche", &["--json"]);
    exits(&out, 0);
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        result["text"],
        "Fiche indisponible, un conseiller vous rappelle."
    );
    assert_eq!(result["fallback"], true);
    let events = journal(dir.path(), "fiche");
    assert_eq!(
        payloads(&events, "guard.checked")[1]["resolution"],
        "fallback"
    );
    let completed = only(&events, "run.completed");
    assert_eq!(completed["fallback"], true);
    assert_eq!(
        final_text(&events),
        "Fiche indisponible, un conseiller vous rappelle."
    );

    let out = run(dir.path(), "fiche", "Fiche ?", "fiche-texte", &[]);
    exits(&out, 0);
    assert!(
        text(&out.stderr).contains("Fallback   : yes (answer replaced by the fallback message"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_tool_output_contract_failing_gives_an_error_result_never_repaired() {
    let dir = copy_example("garde");
    script(
        dir.path(),
        "fake-devis",
        json!([lookup("D-2026-042"), {"text": "Résultat : {{ tool_result }}"}]),
    );
    edit(
        dir.path(),
        "agents/devis.yaml",
        "    side_effects: none\n",
        "    side_effects: none\n    output: {max_chars: 20}\n",
    );
    let out = run(dir.path(), "devis", QUESTION, "contrat", &[]);
    exits(&out, 0);
    let events = journal(dir.path(), "contrat");
    let checked = only(&events, "guard.checked");
    assert_eq!(
        (&checked["guard"], &checked["target"], &checked["outcome"]),
        (
            &json!("contract"),
            &json!("tool:chercher_devis"),
            &json!("failed")
        )
    );
    assert_eq!(checked["resolution"], "fail");
    assert_eq!(checked["call_id"], "fake_0_0");
    let completed = only(&events, "tool.completed");
    assert_eq!(completed["output"]["is_error"], true);
    let refused = result_text(completed);
    assert!(
        refused.starts_with(
            "The result of chercher_devis was refused by its output contract (a rule of the \
             configuration, not a failure): The output does not meet its contract:"
        ),
        "{refused}"
    );
    assert!(
        position(&events, "guard.checked", |_| true)
            < position(&events, "tool.completed", |_| true)
    );
    // Never repaired: no retry, no repair message, one call.
    assert!(decisions(&events).is_empty());
    assert!(repairs(&events).is_empty());
    assert_eq!(payloads(&events, "tool.called").len(), 1);
    assert_eq!(text(&out.stdout).trim(), format!("Résultat : {refused}"));

    // Keeping or replacing a tool's refused result is not implemented: refused, not ignored.
    edit(
        dir.path(),
        "agents/devis.yaml",
        "output: {max_chars: 20}",
        "output: {max_chars: 20, on_failure: unverified}",
    );
    let out = garde(dir.path(), &["validate"]);
    exits(&out, 2);
    assert!(
        text(&out.stderr).contains(
            "tools[0].output.on_failure: tool 'chercher_devis': on_failure 'unverified' is not \
             supported for a tool's output contract"
        ),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn an_unsupported_on_failure_on_an_mcp_tools_contract_is_refused_not_ignored() {
    let dir = copy_example("garde");
    let config = fs::read_to_string(dir.path().join("loom.yaml")).unwrap();
    fs::write(
        dir.path().join("loom.yaml"),
        format!(
            "{config}\nmcp_servers:\n  - {{name: notes, transport: stdio, command: notes-mcp}}\n"
        ),
    )
    .unwrap();
    edit(
        dir.path(),
        "agents/devis.yaml",
        "    side_effects: none\n",
        "    side_effects: none\n  - mcp: notes\n    tools:\n      lire: {output: {max_chars: 200, on_failure: unverified}}\n",
    );
    let out = garde(dir.path(), &["validate"]);
    exits(&out, 2);
    assert!(
        text(&out.stderr).contains(
            "tools[1].tools.lire.output.on_failure: tool 'notes__lire': on_failure 'unverified' \
             is not supported for a tool's output contract"
        ),
        "{}",
        text(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------------------
// Judges

#[test]
fn a_judge_blocks_then_passes_after_the_repair() {
    let dir = copy_example("garde");
    let out = run(dir.path(), "courrier", QUESTION, "juge", &[]);
    exits(&out, 0);
    let polite = "Bonjour Madame Martin, votre devis D-2026-042 s'élève à 1 840 € TTC.";
    assert_eq!(text(&out.stdout).trim(), polite);
    let events = journal(dir.path(), "juge");
    let evaluations = payloads(&events, "judge.evaluated");
    assert_eq!(evaluations.len(), 2);
    assert_eq!(
        evaluations[0]["criteria"],
        json!([{"name": "poli", "score": 0.2, "min_score": 0.8, "blocking": true,
                "reason": "pas de salutation"}])
    );
    assert_eq!(
        (&evaluations[0]["passed"], &evaluations[0]["blocked"]),
        (&json!(false), &json!(true))
    );
    assert_eq!(evaluations[0]["model"], "fake-juge");
    assert_eq!(
        (&evaluations[1]["passed"], &evaluations[1]["attempt"]),
        (&json!(true), &json!(2))
    );
    let checks = payloads(&events, "guard.checked");
    assert_eq!(
        checks
            .iter()
            .map(|c| (c["guard"].as_str().unwrap(), c["outcome"].as_str().unwrap()))
            .collect::<Vec<_>>(),
        [("judge", "failed"), ("judge", "passed")]
    );
    assert_eq!(checks[0]["resolution"], "retry");
    assert_eq!(
        checks[0]["reason"],
        "poli (score 0.20, threshold 0.80): pas de salutation"
    );
    let decided = only(&events, "policy.decided");
    assert_eq!(
        (&decided["policy"], &decided["point"], &decided["decision"]),
        (
            &json!("loom.judge.output"),
            &json!("on_output"),
            &json!("retry")
        )
    );
    assert_eq!(
        decided["reason"],
        "The judge output refuses the output:\n- poli (score 0.20, threshold 0.80): pas de \
         salutation\nFix the output on these points and give it again in full."
    );
    // A judge repairs with tools (repair.tools: auto).
    assert_eq!(repairs(&events), [("loom.judge.output".to_owned(), true)]);
    // Each judgement: the judge's call under its own role, its scores, its check.
    let roles: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "model.responded")
        .map(|e| e["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["main", "main", "judge:output", "main", "judge:output"]
    );
    let judged = position(&events, "model.responded", |p| p["judge"] == "output");
    assert_eq!(
        types(&events)[judged..judged + 5],
        [
            "model.responded",
            "judge.evaluated",
            "guard.checked",
            "policy.decided",
            "message.user"
        ]
    );
    let completed = only(&events, "run.completed");
    assert_eq!(completed["iterations"], 3);
    assert_eq!(final_text(&events), polite);
}

/// A verdict of the `courrier` judge on its criterion `poli`.
fn verdict(score: f64, reason: &str) -> Value {
    json!({"tool_calls": [{"name": "verdict", "arguments": {"criteria": [
        {"name": "poli", "score": score, "reason": reason}
    ]}}]})
}

#[test]
fn a_judge_reads_its_criteria_its_context_and_the_output_as_the_reference_builds_them() {
    // The judge model answers from what it reads, as the reference's scripted judges do: it
    // accepts only the polite answer laid out as the reference lays out a judge's message
    // (criteria, declared context sections, then the output), and refuses an answer without a
    // greeting.
    let dir = copy_example("garde");
    edit(
        dir.path(),
        "agents/courrier.yaml",
        "  repair: {max_attempts: 1}\n",
        "  context: [user_input]\n  repair: {max_attempts: 1}\n",
    );
    let polite = "Bonjour Madame Martin, votre devis D-2026-042 s'élève à 1 840 € TTC.";
    let mut accepts = verdict(0.9, "le client est salué");
    accepts["with_text"] = json!(format!(
        "<criteria>\npoli: La réponse salue le client.\n</criteria>\n\
         <user_input>\n{QUESTION}\n</user_input>\n<output>\n{polite}\n</output>"
    ));
    let mut refuses = verdict(0.2, "pas de bonjour");
    refuses["without_text"] = json!("Bonjour");
    script(dir.path(), "fake-juge", json!([accepts, refuses]));
    let out = run(dir.path(), "courrier", QUESTION, "lu", &[]);
    exits(&out, 0);
    assert_eq!(text(&out.stdout).trim(), polite);
    let events = journal(dir.path(), "lu");
    let passed: Vec<&Value> = payloads(&events, "judge.evaluated")
        .iter()
        .map(|e| &e["passed"])
        .collect();
    assert_eq!(passed, [&json!(false), &json!(true)]);
    // The refusal's diagnostic went back to the orchestrator, whose next answer greets.
    assert_eq!(
        only(&events, "policy.decided")["reason"],
        "The judge output refuses the output:\n- poli (score 0.20, threshold 0.80): pas de \
         bonjour\nFix the output on these points and give it again in full."
    );

    // A judge model that cannot be forced to call a tool is asked with tool_choice auto: an
    // answer in text is then an unusable verdict (a forced call would have been a model error).
    let dir = copy_example("garde");
    edit(
        dir.path(),
        "agents/courrier.yaml",
        "  on_failure: fail\n",
        "  on_failure: fail\n  on_error: allow\n",
    );
    script(dir.path(), "fake-juge", json!([{"text": "Poli, oui."}]));
    edit(
        dir.path(),
        "loom.yaml",
        "  - {id: fake-juge, sdk: fake, model: TEST,",
        "  - {id: fake-juge, sdk: fake, model: TEST, capabilities: {forced_tool_choice: false},",
    );
    let out = run(dir.path(), "courrier", QUESTION, "libre", &[]);
    exits(&out, 0);
    let events = journal(dir.path(), "libre");
    assert_eq!(
        only(&events, "guard.checked")["reason"],
        "judge_error: unusable verdict: no call to the tool verdict in the judge's answer"
    );
}

#[test]
fn a_judge_reads_the_session_summary_empty_before_any_compaction() {
    let dir = copy_example("garde");
    edit(
        dir.path(),
        "agents/courrier.yaml",
        "  repair: {max_attempts: 1}\n",
        "  context: [user_input, session_summary]\n  repair: {max_attempts: 1}\n",
    );
    // The judge accepts only when its message holds the (empty) summary section.
    script(
        dir.path(),
        "fake-juge",
        json!([
            {"with_text": "<session_summary>\n(none)\n</session_summary>", "tool_calls": [
                {"name": "verdict", "arguments": {"criteria": [{"name": "poli", "score": 0.9, "reason": "ok"}]}}
            ]},
            {"without_text": "<session_summary>", "tool_calls": [
                {"name": "verdict", "arguments": {"criteria": [{"name": "poli", "score": 0.1, "reason": "no summary"}]}}
            ]}
        ]),
    );
    exits(&garde(dir.path(), &["validate"]), 0);
    let out = run(dir.path(), "courrier", QUESTION, "resume", &[]);
    exits(&out, 0);
    let events = journal(dir.path(), "resume");
    assert_eq!(only(&events, "judge.evaluated")["passed"], true);
}

/// The courrier agent's judge with `when: <when>`.
fn judge_when(dir: &Path, when: &str) {
    edit(
        dir,
        "agents/courrier.yaml",
        "  repair: {max_attempts: 1}\n",
        &format!("  when: {when}\n  repair: {{max_attempts: 1}}\n"),
    );
}

/// The one `guard.checked` of a judge that did not run, with its reason.
fn skipped(events: &[Value], reason: &str) {
    assert_eq!(
        only(events, "guard.checked"),
        &json!({"type": "guard.checked", "guard": "judge", "target": "output",
                "outcome": "skipped", "reason": reason, "attempt": null, "normalized": false,
                "resolution": null, "policy": "loom.judge.output", "call_id": null})
    );
    assert!(!types(events).contains(&"judge.evaluated"));
    assert!(events.iter().all(|e| e["role"] != "judge:output"));
}

#[test]
fn a_judge_sampled_out_is_skipped_and_force_runs_it_anyway() {
    let dir = copy_example("garde");
    judge_when(dir.path(), "{sample: 0}");
    let out = run(dir.path(), "courrier", QUESTION, "auto", &[]);
    exits(&out, 0);
    let unjudged = "Votre devis D-2026-042 s'élève à 1 840 € TTC.";
    assert_eq!(text(&out.stdout).trim(), unjudged);
    let events = journal(dir.path(), "auto");
    skipped(&events, "sampled_out");
    assert_eq!(only(&events, "run.started")["judges"], "auto");
    assert_eq!(final_text(&events), unjudged);

    let out = run(
        dir.path(),
        "courrier",
        QUESTION,
        "force",
        &["--judges", "force"],
    );
    exits(&out, 0);
    let events = journal(dir.path(), "force");
    let started = events.iter().find(|e| e["type"] == "run.started").unwrap();
    assert_eq!(started["payload"]["judges"], "force");
    assert_eq!(started["facets"]["judges"], "force");
    assert_eq!(payloads(&events, "judge.evaluated").len(), 2);
    assert_eq!(
        final_text(&events),
        "Bonjour Madame Martin, votre devis D-2026-042 s'élève à 1 840 € TTC."
    );
}

#[test]
fn judges_skip_leaves_a_trace_and_is_refused_under_prod() {
    let dir = copy_example("garde");
    let out = run(
        dir.path(),
        "courrier",
        QUESTION,
        "skip",
        &["--judges", "skip"],
    );
    exits(&out, 0);
    let events = journal(dir.path(), "skip");
    skipped(&events, "caller_skip");
    assert_eq!(only(&events, "run.started")["judges"], "skip");
    assert_eq!(
        final_text(&events),
        "Votre devis D-2026-042 s'élève à 1 840 € TTC."
    );

    let out = run(
        dir.path(),
        "courrier",
        QUESTION,
        "prod",
        &["--judges", "skip", "--profile", "prod"],
    );
    exits(&out, 2);
    assert!(
        text(&out.stderr).contains("judges: skip is refused under the prod profile"),
        "{}",
        text(&out.stderr)
    );
    assert!(!dir.path().join("data/default/prod.jsonl").exists());
}

#[test]
fn a_judge_condition_registered_in_the_binary_decides_whether_it_runs() {
    let dir = copy_example("garde");
    judge_when(dir.path(), "{condition: montant_cite}");
    // The answer gives an amount: the judge runs (and refuses, then accepts the repair).
    let out = run(dir.path(), "courrier", QUESTION, "montant", &[]);
    exits(&out, 0);
    let events = journal(dir.path(), "montant");
    assert_eq!(payloads(&events, "judge.evaluated").len(), 2);

    // An answer without an amount is not judged.
    script(
        dir.path(),
        "fake-courrier",
        json!([{"text": "Je n'ai pas trouvé ce devis."}]),
    );
    let out = run(dir.path(), "courrier", QUESTION, "sans-montant", &[]);
    exits(&out, 0);
    skipped(&journal(dir.path(), "sans-montant"), "condition_false");

    // A condition that is not registered is refused at load.
    edit(
        dir.path(),
        "agents/courrier.yaml",
        "condition: montant_cite",
        "condition: client_fidele",
    );
    let out = garde(dir.path(), &["validate"]);
    exits(&out, 2);
    assert!(
        text(&out.stderr).contains(
            "judge.when.condition: unknown condition 'client_fidele' (registered conditions: \
             montant_cite)"
        ),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_judge_still_refusing_keeps_the_answer_flagged_unverified() {
    let dir = copy_example("garde");
    edit(
        dir.path(),
        "agents/courrier.yaml",
        "  repair: {max_attempts: 1}\n  on_failure: fail\n",
        "  repair: {max_attempts: 0}\n  on_failure: unverified\n",
    );
    let out = run(dir.path(), "courrier", QUESTION, "juge", &["--json"]);
    exits(&out, 0);
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["unverified"], true);
    assert_eq!(
        result["text"],
        "Votre devis D-2026-042 s'élève à 1 840 € TTC."
    );
    let events = journal(dir.path(), "juge");
    let checked = only(&events, "guard.checked");
    assert_eq!(
        (&checked["outcome"], &checked["resolution"]),
        (&json!("failed"), &json!("unverified"))
    );
    assert!(decisions(&events).is_empty());
    assert!(repairs(&events).is_empty());
    assert_eq!(only(&events, "run.completed")["unverified"], true);
}

// ---------------------------------------------------------------------------------------------
// The reference's whole scenario

fn keys(value: &Value) -> Vec<String> {
    value
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn the_reference_scenario_writes_the_reference_journal() {
    let Some(reference) = reference_journal("policies-terminal-role.jsonl") else {
        return;
    };
    // loom.require_tool, a denied and a normalized call, a terminal role whose first draft is
    // refused on output, then a draft that ends the run: policies-terminal-role.jsonl.
    let dir = copy_example("garde");
    let out = run(
        dir.path(),
        "relance",
        "Relance le client du devis D-2026-042, sur un ton cordial.",
        "j3-run",
        &[],
    );
    exits(&out, 0);
    assert_eq!(
        text(&out.stdout).trim(),
        "Objet : votre devis D-2026-042\n\nBonjour Madame Martin, devis D-2026-042 de 1 840 €."
    );
    let ours = journal(dir.path(), "j3-run");
    assert_eq!(types(&ours), types(&reference));
    for (mine, theirs) in ours.iter().zip(&reference) {
        let what = format!("{} (seq {})", theirs["type"], theirs["seq"]);
        assert_eq!(keys(mine), keys(theirs), "envelope of {what}");
        assert_eq!(
            keys(&mine["payload"]),
            expected_payload_keys(theirs),
            "payload of {what}"
        );
        assert_eq!(
            keys(&mine["facets"]),
            keys(&theirs["facets"]),
            "facets of {what}"
        );
        assert_eq!(mine["role"], theirs["role"], "envelope role of {what}");
        assert_eq!(mine["status"], theirs["status"], "status of {what}");
        // `call_id` too: the scripted models count their turns as the reference's fake model
        // does (a repair request is not a turn of the user), so the call ids are the same.
        for field in [
            "policy",
            "point",
            "decision",
            "kind",
            "tool_kind",
            "tool_name",
            "call_id",
            "to_state",
            "cause_type",
        ] {
            assert_eq!(
                mine["payload"][field], theirs["payload"][field],
                "{field} of {what}"
            );
        }
    }
    // The closing event points at the role's result instead of repeating it.
    let completed = ours.last().unwrap();
    assert_eq!(completed["payload"]["output"], Value::Null);
    let role_result = &ours[ours.len() - 4];
    assert_eq!(role_result["type"], "tool.completed");
    assert_eq!(
        completed["payload"]["output_event_id"],
        role_result["event_id"]
    );
    // Transitions decided by a policy name the decision as their cause.
    let repaired = &ours[34];
    assert_eq!(repaired["payload"]["cause_type"], "policy.decided");
    assert_eq!(repaired["payload"]["cause_event_id"], ours[32]["event_id"]);
}

#[test]
fn validate_lists_what_surrounds_each_agents_loop() {
    let dir = copy_example("garde");
    let out = garde(dir.path(), &["validate"]);
    exits(&out, 0);
    let stdout = text(&out.stdout);
    for line in [
        "  · role rediger_relance: model fake-role, terminal, context tool_results\n",
        "  · policy loom.require_tool: before_model\n",
        "  · policy numero_devis: before_tool\n",
        "  · policy cite_le_devis: on_output\n",
    ] {
        assert!(stdout.contains(line), "{line:?} not in:\n{stdout}");
    }
    assert!(stdout.contains("  · judge "), "{stdout}");
    assert!(
        stdout.contains("  · output contract: on_failure fail"),
        "{stdout}"
    );
}
