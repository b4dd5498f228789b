//! Exact replay through the binaries (`loom replay`): a run replayed identical (exit 0), the
//! divergence a prompt change causes (exit 1, the event and the request part named), an
//! exported file replayed in a fresh directory without the original journal, a replay that
//! never runs a tool with a side effect (the `relance` example's file stays untouched), and the
//! errors (exit 2); several approvals that expired in one run, a steering message and a
//! cancellation re-applied in a variant replay, and the refusal of a run that began with a
//! model's circuit breaker already open (two runs of one `loom serve`).

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::{fs, path::Path};

use serde_json::Value;

const QUESTION: &str = "Quel prix TTC pour un devis de 1 250 € HT en rénovation (TVA à 10 %) ?";

/// A devis run in `dir`: its run id.
fn devis_run(dir: &Path) -> String {
    let out = run_in(&devis_bin(), dir, &["run", "devis", QUESTION]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    run_id_of(&text(&out.stderr))
}

/// The report's lines with the run and session ids masked.
fn masked(report: &str, run_id: &str) -> String {
    report.replace(run_id, "<run>")
}

#[test]
fn a_run_replays_identical_and_the_journal_is_left_untouched() {
    let dir = devis_project();
    let run_id = devis_run(dir.path());
    let journal = dir
        .path()
        .join("data/default")
        .join(format!("{run_id}.jsonl"));
    let before = fs::read_to_string(&journal).unwrap();

    let out = run_in(&devis_bin(), dir.path(), &["replay", &run_id]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    insta::assert_snapshot!("replay_identical", masked(&stdout, &run_id));
    assert_eq!(
        fs::read_to_string(&journal).unwrap(),
        before,
        "a replay writes nothing to the journal"
    );

    let out = run_in(&devis_bin(), dir.path(), &["replay", &run_id, "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["outcome"], "identical");
    assert_eq!(report["divergence"], Value::Null);
    assert_eq!(report["counts"]["models_served"], 2);
    assert_eq!(report["counts"]["tools_served"], 1);
}

#[test]
fn a_prompt_change_is_a_divergence_named_with_its_event_and_part() {
    let dir = devis_project();
    let run_id = devis_run(dir.path());
    let agent = dir.path().join("agents/devis.yaml");
    let yaml = fs::read_to_string(&agent).unwrap();
    assert!(yaml.contains("system_file: devis.md"));
    fs::write(
        &agent,
        yaml.replace(
            "system_file: devis.md",
            "system: Tu prépares des devis, arrondis à l'euro.",
        ),
    )
    .unwrap();

    let out = run_in(&devis_bin(), dir.path(), &["replay", &run_id]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains("Divergence : event #5 (model.responded) of run"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  field    : payload.request_parts.system\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  changed  : the model request's system prompt\n"),
        "{stdout}"
    );

    let out = run_in(&devis_bin(), dir.path(), &["replay", &run_id, "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["outcome"], "divergent");
    assert_eq!(report["divergence"]["seq"], 5);
    assert_eq!(report["divergence"]["event_type"], "model.responded");
    assert_eq!(
        report["divergence"]["field"],
        "payload.request_parts.system"
    );
    assert_ne!(
        report["divergence"]["expected"],
        report["divergence"]["got"]
    );
}

#[test]
fn an_exported_run_replays_in_a_fresh_directory_without_the_journal() {
    let dir = devis_project();
    let first = devis_run(dir.path());
    // A second run of the same session: its history (the first run) travels with the export.
    let out = run_in(
        &devis_bin(),
        dir.path(),
        &["run", "devis", QUESTION, "--session", &first],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let second = run_id_of(&text(&out.stderr));
    let file = dir.path().join("devis-run.jsonl");
    let out = run_in(
        &devis_bin(),
        dir.path(),
        &[
            "replay",
            &second,
            "--session",
            &first,
            "--export",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let exported = fs::read_to_string(&file).unwrap();
    assert!(
        exported.lines().count() > 17,
        "the history before the run is exported too"
    );

    let fresh = devis_project();
    fs::copy(&file, fresh.path().join("devis-run.jsonl")).unwrap();
    assert!(!fresh.path().join("data").exists());
    let out = run_in(
        &devis_bin(),
        fresh.path(),
        &["replay", "--journal", "devis-run.jsonl"],
    );
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert_eq!(
        stdout
            .matches("Identical  : the run replays as it was")
            .count(),
        2,
        "both closed runs of the file are replayed: {stdout}"
    );
    let out = run_in(
        &devis_bin(),
        fresh.path(),
        &["replay", &second, "--journal", "devis-run.jsonl"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(
        !fresh.path().join("data").exists(),
        "nothing written in the fresh directory"
    );

    // The prompt changed in the fresh checkout: the regression shows.
    let prompt = fresh.path().join("prompts/devis.md");
    let mut system = fs::read_to_string(&prompt).unwrap();
    system.push_str("\nRéponds en une phrase.\n");
    fs::write(&prompt, system).unwrap();
    let out = run_in(
        &devis_bin(),
        fresh.path(),
        &["replay", &second, "--journal", "devis-run.jsonl"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
}

#[test]
fn a_replay_never_runs_a_tool_with_a_side_effect() {
    let dir = copy_example("relance");
    let out = run_in(
        &example_bin("relance"),
        dir.path(),
        &["run", "relance", "Relance le devis D-2024-017"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let run_id = run_id_of(&text(&out.stderr));
    let sent = dir.path().join("relances.txt");
    assert_eq!(fs::read_to_string(&sent).unwrap(), "relance D-2024-017\n");

    for _ in 0..2 {
        let out = run_in(&example_bin("relance"), dir.path(), &["replay", &run_id]);
        let stdout = text(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{stdout}\n{}",
            text(&out.stderr)
        );
        assert!(
            stdout.contains("Tools      : 1 result(s) in the journal, 1 served to the replay"),
            "{stdout}"
        );
    }
    assert_eq!(
        fs::read_to_string(&sent).unwrap(),
        "relance D-2024-017\n",
        "the reminder was sent once, by the run, never by its replays"
    );
}

#[test]
fn what_cannot_be_replayed_exits_2_with_a_message_naming_it() {
    let dir = devis_project();
    // `loom replay <args>` exits 2, its message naming `named`.
    let refused = |args: &[&str], named: &str| {
        let out = run_in(&devis_bin(), dir.path(), args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(text(&out.stderr).contains(named), "{}", text(&out.stderr));
    };
    refused(&["replay", "no-such-run"], "no-such-run");
    refused(&["replay", "--journal", "missing.jsonl"], "missing.jsonl");
    fs::write(dir.path().join("bad.jsonl"), "{\"not\": \"an event\"}\n").unwrap();
    refused(&["replay", "--journal", "bad.jsonl"], "bad.jsonl:1");

    let out = run_in(&devis_bin(), dir.path(), &["replay"]);
    assert_eq!(out.status.code(), Some(2));
}

/// Adds the model `fake-2` (scripted with `script`, YAML lines at the script's indentation) to
/// the configuration of `dir`.
fn add_model(dir: &Path, script: &str) {
    let config = dir.join("loom.yaml");
    let yaml = fs::read_to_string(&config).unwrap();
    let model = format!(
        "models:\n  - id: fake-2\n    sdk: fake\n    model: FAKE\n    params:\n      script:\n{script}"
    );
    fs::write(&config, yaml.replacen("models:\n", &model, 1)).unwrap();
}

#[test]
fn a_variant_with_another_model_answers_otherwise_side_by_side() {
    let dir = devis_project();
    add_model(
        dir.path(),
        "        - text: \"Calcul en cours.\"\n          tool_calls:\n            - name: prix_ttc\n              arguments: {montant_ht: 1250, taux_tva: 10}\n        - text: \"Total TTC : {{ tool_result }}.\"\n",
    );
    let run_id = devis_run(dir.path());
    let journal = dir
        .path()
        .join("data/default")
        .join(format!("{run_id}.jsonl"));
    let before = fs::read_to_string(&journal).unwrap();

    let args = [
        "replay",
        &run_id,
        "--mode",
        "variant",
        "--model",
        "main=fake-2",
    ];
    let out = run_in(&devis_bin(), dir.path(), &args);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("Variant    : main=fake-2\n"), "{stdout}");
    assert!(stdout.contains("Answer     : different\n"), "{stdout}");
    assert!(
        stdout.contains("  journal  : Pour ce devis de rénovation, le prix est de"),
        "{stdout}"
    );
    assert!(stdout.contains("  variant  : Total TTC : "), "{stdout}");
    assert!(
        stdout.contains("2 call(s): 2 made, 0 from the journal"),
        "{stdout}"
    );
    assert!(
        stdout.contains("1 call(s): 1 from the journal, 0 doubled"),
        "{stdout}"
    );
    assert_eq!(
        fs::read_to_string(&journal).unwrap(),
        before,
        "a variant writes nothing to the journal"
    );

    let mut json_args = args.to_vec();
    json_args.push("--json");
    let out = run_in(&devis_bin(), dir.path(), &json_args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["same_answer"], false);
    assert_eq!(report["models"]["main"], "fake-2");
    assert_eq!(report["original"]["status"], "completed");
    assert_eq!(report["variant"]["status"], "completed");
    assert_eq!(report["counts"]["models_called"], 2);
    assert_eq!(report["counts"]["tools_served"], 1);
    assert!(
        report["variant"]["text"]
            .as_str()
            .unwrap()
            .starts_with("Total TTC : "),
        "{report}"
    );
    assert!(report["original"]["cost_usd"].as_f64().unwrap() > 0.0);

    // An unknown step or model, or a --model without --mode variant: exit 2, named.
    for (args, named) in [
        (
            vec!["--mode", "variant", "--model", "writer=fake-2"],
            "writer",
        ),
        (
            vec!["--mode", "variant", "--model", "main=fake-9"],
            "fake-9",
        ),
        (vec!["--model", "main=fake-2"], "--mode variant"),
    ] {
        let mut all = vec!["replay", run_id.as_str()];
        all.extend(args);
        let out = run_in(&devis_bin(), dir.path(), &all);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
        assert!(text(&out.stderr).contains(named), "{}", text(&out.stderr));
    }
}

#[test]
fn a_variant_never_runs_a_tool_with_a_side_effect() {
    let dir = copy_example("relance");
    // The variant's model chases another quote, whose reminder the journal never recorded.
    add_model(
        dir.path(),
        "        - text: \"Je relance.\"\n          tool_calls:\n            - name: envoyer_relance\n              arguments: {numero: \"D-2024-099\"}\n        - text: \"{{ tool_result }}\"\n",
    );
    let out = run_in(
        &example_bin("relance"),
        dir.path(),
        &["run", "relance", "Relance le devis D-2024-017"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let run_id = run_id_of(&text(&out.stderr));
    let sent = dir.path().join("relances.txt");
    assert_eq!(fs::read_to_string(&sent).unwrap(), "relance D-2024-017\n");

    // Without a double: refused, named, exit 1, and the tool never ran.
    let out = run_in(
        &example_bin("relance"),
        dir.path(),
        &[
            "replay",
            &run_id,
            "--mode",
            "variant",
            "--model",
            "main=fake-2",
        ],
    );
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains("Refused    : tool call fake_0_0 of envoyer_relance not executed: the tool declares irreversible side effects"),
        "{stdout}"
    );
    assert!(stdout.contains("0 doubled, 0 run, 1 refused"), "{stdout}");

    // With a double: answered by it, exit 0, and the tool never ran either.
    let out = run_in(
        &example_bin("relance"),
        dir.path(),
        &[
            "replay",
            &run_id,
            "--mode",
            "variant",
            "--model",
            "main=fake-2",
            "--double",
            "envoyer_relance=\"relance simulée\"",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["counts"]["tools_doubled"], 1, "{report}");
    assert_eq!(report["counts"]["tools_refused"], 0);
    assert_eq!(report["misses"], serde_json::json!([]));
    assert_eq!(report["variant"]["text"], "relance simulée");
    assert_eq!(
        report["original"]["text"],
        "relance envoyée pour le devis D-2024-017"
    );

    assert_eq!(
        fs::read_to_string(&sent).unwrap(),
        "relance D-2024-017\n",
        "the reminder was sent once, by the run, never by a variant"
    );
}

#[test]
fn a_variant_exports_its_own_run_not_the_original() {
    let dir = devis_project();
    add_model(
        dir.path(),
        "        - text: \"Calcul en cours.\"\n          tool_calls:\n            - name: prix_ttc\n              arguments: {montant_ht: 1250, taux_tva: 10}\n        - text: \"Total TTC : {{ tool_result }}.\"\n",
    );
    let run_id = devis_run(dir.path());
    let file = dir.path().join("variant.jsonl");
    let out = run_in(
        &devis_bin(),
        dir.path(),
        &[
            "replay",
            &run_id,
            "--mode",
            "variant",
            "--model",
            "main=fake-2",
            "--export",
            file.to_str().unwrap(),
        ],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("Exported "), "{stderr}");
    let events: Vec<Value> = fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let answers: Vec<String> = events
        .iter()
        .filter(|e| e["type"] == "model.responded")
        .map(|e| e["payload"]["message"].to_string())
        .collect();
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert!(answers[0].contains("Calcul en cours."), "{answers:?}");
    assert!(answers[1].contains("Total TTC : "), "{answers:?}");
    assert!(
        events
            .iter()
            .filter(|e| e["type"] == "model.responded")
            .all(|e| e["payload"]["model"] == "fake-2"),
        "the variant's model answered"
    );
    let last = events.last().unwrap();
    assert_eq!(last["type"], "run.completed");
    assert_eq!(last["run_id"], run_id.as_str());
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
}

/// The `equipe` example (examples/equipe: `secretariat` delegates to the sub-agent `comptable`)
/// run in `dir` with `args`, the bank statements of its `releve_bancaire` tool kept in
/// `dir/releves`.
fn equipe_command(dir: &Path, args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(example_bin("equipe"));
    command
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .env("RELEVES_DIR", dir.join("releves"))
        .args(["--config", "loom.yaml"])
        .args(args);
    command
}

fn equipe(dir: &Path, args: &[&str]) -> std::process::Output {
    equipe_command(dir, args).output().unwrap()
}

/// `loom replay RUN` then `--json` of the `equipe` example in `dir`, expected identical, the run
/// having `ended` (`completed`, `cancelled`) in the journal and in the replay: the report.
fn replays_identical(dir: &Path, run_id: &str, ended: &str) -> Value {
    let out = equipe(dir, &["replay", run_id]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains("Identical  : the run replays as it was, call by call."),
        "{stdout}"
    );
    let out = equipe(dir, &["replay", run_id, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["outcome"], "identical", "{report}");
    assert_eq!(report["misses"], serde_json::json!([]), "{report}");
    assert_eq!(report["recorded_status"], ended, "{report}");
    assert_eq!(report["replay_status"], ended, "{report}");
    report
}

/// How many events of the session `session` in `dir` (tenant `default`) are `kind`, of a run
/// that `of_run` accepts.
fn count(dir: &Path, session: &str, kind: &str, of_run: impl Fn(&str) -> bool) -> usize {
    journal(dir, session)
        .iter()
        .filter(|e| e["type"] == kind && of_run(e["run_id"].as_str().unwrap()))
        .count()
}

const SOLDE: &str = "Quel est le solde du compte bancaire 512 ?";
const VIREMENT: &str = "Règle la facture F-2024-031 de Dupont Matériaux par virement.";
const RELEVE: &str = "Récupère le relevé de la banque pour le rapprochement.";

#[test]
fn a_run_delegating_to_a_sub_agent_replays_identical() {
    let dir = copy_example("equipe");
    let out = equipe(dir.path(), &["run", "secretariat", SOLDE, "--run-id", "d1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let sub_runs = count(dir.path(), "d1", "run.started", |run| run != "d1");
    assert_eq!(sub_runs, 1, "one sub-run");

    let report = replays_identical(dir.path(), "d1", "completed");
    // The secretariat's two answers and the comptable's two, the comptable's tool result.
    assert_eq!(report["counts"]["models_recorded"], 4, "{report}");
    assert_eq!(report["counts"]["models_served"], 4, "{report}");
    assert_eq!(report["counts"]["tools_served"], 1, "{report}");
}

#[test]
fn a_sub_runs_decided_approval_is_answered_from_the_recorded_decision() {
    let dir = copy_example("equipe");
    let out = equipe(
        dir.path(),
        &["run", "secretariat", VIREMENT, "--run-id", "v1"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
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
    assert!(out.status.success(), "{}", text(&out.stderr));
    let decided = count(dir.path(), "v1", "approval.granted", |run| run != "v1");
    assert_eq!(decided, 1, "the sub-run's request was decided");

    let report = replays_identical(dir.path(), "v1", "completed");
    assert_eq!(report["counts"]["tools_served"], 1, "{report}");
}

#[test]
fn a_run_cancelled_while_waiting_for_a_sub_runs_approval_replays_to_the_same_cancellation() {
    let dir = copy_example("equipe");
    let out = equipe(
        dir.path(),
        &["run", "secretariat", VIREMENT, "--run-id", "w1"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let out = equipe(dir.path(), &["cancel", "w1", "--by", "denis"]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    replays_identical(dir.path(), "w1", "cancelled");
}

/// Starts the `equipe` run `run_id` on the bank-statement scenario in `dir`: its comptable's
/// tool waits for the bank's file. Returns the running process once the request is made.
fn waiting_for_the_bank(dir: &Path, run_id: &str) -> std::process::Child {
    let releves = dir.join("releves");
    fs::create_dir_all(&releves).unwrap();
    let running = equipe_command(dir, &["run", "secretariat", RELEVE, "--run-id", run_id])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let request = releves.join("demande-cic.txt");
    loom_testkit::wait::blocking_until(format!("{} to appear", request.display()), || {
        request.exists()
    });
    running
}

/// The bank's file arrives: the tool of the run `running` returns. What the run printed.
fn the_bank_answers(dir: &Path, running: std::process::Child) -> std::process::Output {
    fs::write(
        dir.join("releves/releve-cic.txt"),
        "relevé CIC de novembre\n",
    )
    .unwrap();
    running.wait_with_output().unwrap()
}

#[test]
fn a_run_cancelled_while_its_sub_runs_tool_ran_replays_to_the_same_cancellation() {
    let dir = copy_example("equipe");
    let running = waiting_for_the_bank(dir.path(), "c1");
    let out = equipe(dir.path(), &["cancel", "c1", "--by", "alice"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = the_bank_answers(dir.path(), running);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let completed = count(dir.path(), "c1", "tool.completed", |_| true);
    assert_eq!(completed, 0, "the comptable's tool never completed");

    let report = replays_identical(dir.path(), "c1", "cancelled");
    assert_eq!(report["counts"]["tools_recorded"], 0, "{report}");
}

#[test]
fn a_steered_run_replays_with_the_steering_message_read_at_the_same_point() {
    let dir = copy_example("equipe");
    let running = waiting_for_the_bank(dir.path(), "s1");
    let steering = "Joins aussi le relevé au dossier du rapprochement.";
    let out = equipe(dir.path(), &["steer", "s1", steering]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = the_bank_answers(dir.path(), running);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = journal(dir.path(), "s1");
    let steer = events
        .iter()
        .position(|e| e["type"] == "message.user" && e["payload"]["kind"] == "steer")
        .expect("the run was steered");
    // The secretariat read it at its next model call, after the comptable answered (the
    // replay re-applies it at the same place, or that request's messages differ).
    let read = events
        .iter()
        .rposition(|e| e["run_id"] == "s1" && e["type"] == "model.responded")
        .unwrap();
    assert!(steer < read);

    replays_identical(dir.path(), "s1", "completed");
}

#[test]
fn an_expired_approval_is_re_applied_from_the_journal_not_the_clock() {
    let dir = copy_example("equipe");
    // The comptable's requests wait half a second; an expired one is denied.
    let agent = dir.path().join("agents/comptable.yaml");
    let mut yaml = fs::read_to_string(&agent).unwrap();
    yaml.push_str("approval: {expires_in: 0.5, on_expiry: deny}\n");
    fs::write(&agent, yaml).unwrap();
    let out = equipe(
        dir.path(),
        &["run", "secretariat", VIREMENT, "--run-id", "e1"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    std::thread::sleep(std::time::Duration::from_millis(700));
    let out = equipe(dir.path(), &["resume", "e1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(count(dir.path(), "e1", "approval.expired", |_| true), 1);

    // The replay does not wait for the deadline: the journal says it passed.
    replays_identical(dir.path(), "e1", "completed");
}

/// A 1×1 PNG.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0xf0,
    0x1f, 0x00, 0x05, 0x00, 0x01, 0xff, 0x89, 0x99, 0x3d, 0x1d, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
    0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

#[test]
fn a_run_with_attached_files_replays_identical_and_an_export_without_them_is_refused() {
    let dir = devis_project();
    fs::write(dir.path().join("plan.png"), PNG).unwrap();
    let out = run_in(
        &devis_bin(),
        dir.path(),
        &["run", "devis", QUESTION, "--attach", "plan.png"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let run_id = run_id_of(&text(&out.stderr));
    let events = journal(dir.path(), &run_id);
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "artifact.stored" && e["payload"]["origin"] == "attachment"),
        "the file was attached"
    );

    let file = dir.path().join("run.jsonl");
    let out = run_in(
        &devis_bin(),
        dir.path(),
        &[
            "replay",
            &run_id,
            "--json",
            "--export",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["outcome"], "identical", "{report}");

    // Elsewhere, the exported journal holds no file: refused, the file named.
    let fresh = devis_project();
    fs::copy(&file, fresh.path().join("run.jsonl")).unwrap();
    let out = run_in(
        &devis_bin(),
        fresh.path(),
        &["replay", "--journal", "run.jsonl"],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("its attached file 'plan.png'")
            && stderr.contains("is not in the artifact store"),
        "{stderr}"
    );
}

#[test]
fn a_run_whose_model_was_retried_then_fell_back_replays_identical() {
    let dir = devis_project();
    // `fake-flaky` fails every attempt: retried once, its breaker opens at the second failure,
    // and the call falls back to fake-1, which the run keeps.
    flaky_with_fallback(dir.path());
    let run_id = devis_run(dir.path());
    let types: Vec<String> = journal(dir.path(), &run_id)
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect();
    for kind in ["model.retried", "circuit.opened", "model.fell_back"] {
        assert!(types.iter().any(|t| t == kind), "{kind} in {types:?}");
    }

    let out = run_in(&devis_bin(), dir.path(), &["replay", &run_id, "--json"]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["outcome"], "identical", "{report}");
    assert_eq!(report["misses"], serde_json::json!([]), "{report}");
    assert_eq!(report["counts"]["models_served"], 2, "{report}");
}

#[test]
fn an_agent_with_mcp_tools_is_refused_naming_what_the_journal_lacks() {
    let dir = devis_project();
    let run_id = devis_run(dir.path());
    // Today the agent also reads the tools of an MCP server (never started by the replay).
    let config = dir.path().join("loom.yaml");
    let mut yaml = fs::read_to_string(&config).unwrap();
    yaml.push_str(
        "\nmcp_servers:\n  - name: notes\n    transport: stdio\n    command: python3\n    args: [no_such_server.py]\n",
    );
    fs::write(&config, yaml).unwrap();
    let agent = dir.path().join("agents/devis.yaml");
    let mut yaml = fs::read_to_string(&agent).unwrap();
    yaml.push_str("  - mcp: notes\n");
    fs::write(&agent, yaml).unwrap();

    let out = run_in(&devis_bin(), dir.path(), &["replay", &run_id]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("agent 'devis' reads tools from source 'notes'")
            && stderr.contains("no tool.source_opened"),
        "{stderr}"
    );
}

/// A project of the stock `loom` binary whose agent `horloge` asks the time of two cities in
/// one turn, then of a third: each call needs an approval that expires after half a second
/// (denied).
fn horloge_project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("loom.yaml"),
        r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: HORLOGE
    params:
      script:
        - text: "Je regarde l'heure à Paris et à Tokyo."
          tool_calls:
            - {name: current_datetime, arguments: {timezone: Europe/Paris}}
            - {name: current_datetime, arguments: {timezone: Asia/Tokyo}}
        - text: "Et à New York."
          tool_calls:
            - {name: current_datetime, arguments: {timezone: America/New_York}}
        - text: "Personne n'a répondu à temps : je n'ai pas l'heure."
storage:
  events: {backend: jsonl, path: data}
telemetry:
  logging: {level: WARN}
agents:
  - name: horloge
    main: {model: fake-1}
    approval: {expires_in: 0.5, on_expiry: deny}
    tools:
      - tool: loom.current_datetime
        approval: always
"#,
    )
    .unwrap();
    dir
}

#[test]
fn several_expired_approvals_in_one_run_replay_identical() {
    let dir = horloge_project();
    let out = loom(
        dir.path(),
        &["run", "horloge", "Quelle heure est-il ?", "--run-id", "h1"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    // Two requests of the first turn expire together, the third one after the next turn.
    // The first resume pauses again on the third request (exit 1), the second completes.
    for code in [1, 0] {
        std::thread::sleep(std::time::Duration::from_millis(700));
        let out = loom(dir.path(), &["resume", "h1"]);
        assert_eq!(out.status.code(), Some(code), "{}", text(&out.stderr));
    }
    let events = journal(dir.path(), "h1");
    let kinds = |kind: &str| events.iter().filter(|e| e["type"] == kind).count();
    assert_eq!(kinds("approval.requested"), 3, "{events:?}");
    assert_eq!(kinds("approval.expired"), 3, "{events:?}");
    assert_eq!(kinds("run.completed"), 1, "{events:?}");

    // Each deadline is read from the journal: the replay waits for none of them.
    let out = loom(dir.path(), &["replay", "h1", "--json"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["outcome"], "identical", "{report}");
    assert_eq!(report["misses"], serde_json::json!([]), "{report}");
    assert_eq!(report["replay_status"], "completed", "{report}");
}

/// The events of the JSONL file `path`.
fn events_of(path: &Path) -> Vec<Value> {
    fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_variant_replay_re_applies_a_steering_message_and_a_cancellation() {
    let dir = copy_example("equipe");
    // A steered run: its variant reads the steering message at the same point.
    let running = waiting_for_the_bank(dir.path(), "vs1");
    let steering = "Joins aussi le relevé au dossier du rapprochement.";
    let out = equipe(dir.path(), &["steer", "vs1", steering]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = the_bank_answers(dir.path(), running);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let variant = dir.path().join("variant.jsonl");
    let out = equipe(
        dir.path(),
        &[
            "replay",
            "vs1",
            "--mode",
            "variant",
            "--model",
            "main=fake-secretariat",
            "--json",
            "--export",
            variant.to_str().unwrap(),
        ],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["variant"]["status"], "completed", "{report}");
    assert_eq!(report["same_answer"], true, "{report}");
    let events = events_of(&variant);
    let steer = events
        .iter()
        .position(|e| e["type"] == "message.user" && e["payload"]["kind"] == "steer")
        .unwrap_or_else(|| panic!("the variant was not steered: {events:?}"));
    assert!(
        events[steer].to_string().contains(steering),
        "{}",
        events[steer]
    );
    let read = events
        .iter()
        .rposition(|e| e["run_id"] == "vs1" && e["type"] == "model.responded")
        .unwrap();
    assert!(steer < read, "read at the secretariat's last call");

    // A run cancelled while it waited for its sub-run's approval: the variant is cancelled
    // there too (exit 1: the variant did not complete).
    let out = equipe(
        dir.path(),
        &["run", "secretariat", VIREMENT, "--run-id", "vw1"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let out = equipe(dir.path(), &["cancel", "vw1", "--by", "denis"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = equipe(
        dir.path(),
        &[
            "replay",
            "vw1",
            "--mode",
            "variant",
            "--model",
            "main=fake-secretariat",
            "--json",
        ],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["original"]["status"], "cancelled", "{report}");
    assert_eq!(report["variant"]["status"], "cancelled", "{report}");
}

#[test]
fn a_run_that_began_with_a_breaker_already_open_is_refused() {
    let dir = devis_project();
    // `fake-flaky` fails every attempt; its breaker opens at the second failure and stays
    // open for ten minutes, for every run of the same process.
    flaky_with_fallback(dir.path());
    // Two runs of one server: the first opens the breaker, the second begins with it open.
    let server = common::server::Server::start(
        &devis_bin(),
        dir.path(),
        &["--config", "loom.yaml", "serve", "--port", "0"],
    );
    let mut runs = Vec::new();
    for session in ["b1", "b2"] {
        let body = serde_json::json!({"message": QUESTION, "session_id": session}).to_string();
        let (status, body) =
            common::server::request(&server.address, "POST", "/v1/agents/devis/runs", &body);
        assert_eq!(status, 201, "{body}");
        let result: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(result["status"], "completed", "{result}");
        runs.push(result["run_id"].as_str().unwrap().to_owned());
    }
    server.stop();
    let second = journal(dir.path(), "b2");
    assert!(
        second
            .iter()
            .any(|e| e["type"] == "model.fell_back" && e["payload"]["reason"] == "circuit_open"),
        "{second:?}"
    );
    assert!(!second.iter().any(|e| e["type"] == "circuit.opened"));

    // The first run replays identical (its own failures open the replay's fresh breaker).
    let out = run_in(&devis_bin(), dir.path(), &["replay", &runs[0]]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    // The second cannot: the journal does not hold the breaker's state. Refused, named, and
    // the same for a variant.
    for mode in ["exact", "variant"] {
        let out = run_in(
            &devis_bin(),
            dir.path(),
            &["replay", &runs[1], "--mode", mode, "--session", "b2"],
        );
        let stderr = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{mode}: {stderr}{}",
            text(&out.stdout)
        );
        assert!(
            stderr.contains(
                "a model was skipped because its circuit breaker was already open when the run \
                 began, and the breakers' state is not in the journal"
            ),
            "{mode}: {stderr}"
        );
    }
}

/// Gives the devis project in `dir` the model `fake-flaky` (every attempt fails: retried once,
/// its breaker opens at the second failure for ten minutes) and makes it the agent's model,
/// falling back to `fake-1`.
fn flaky_with_fallback(dir: &Path) {
    let config = dir.join("loom.yaml");
    let yaml = fs::read_to_string(&config).unwrap();
    fs::write(
        &config,
        yaml.replacen(
            "models:\n",
            "models:\n  - id: fake-flaky\n    sdk: fake\n    model: FLAKY\n    retry: {max_attempts: 2, initial_delay: 0.01}\n    circuit_breaker: {failures: 2, cooldown: 600}\n    params:\n      script:\n        - error: transient\n",
            1,
        ),
    )
    .unwrap();
    let agent = dir.join("agents/devis.yaml");
    let yaml = fs::read_to_string(&agent).unwrap();
    fs::write(
        &agent,
        yaml.replace(
            "  model: fake-1\n",
            "  model: fake-flaky\n  fallbacks: [fake-1]\n",
        ),
    )
    .unwrap();
}
