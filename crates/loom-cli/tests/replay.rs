//! Exact replay through the binaries (`loom replay`): a run replayed identical (exit 0), the
//! divergence a prompt change causes (exit 1, the event and the request part named), an
//! exported file replayed in a fresh directory without the original journal, a replay that
//! never runs a tool with a side effect (the `relance` example's file stays untouched), and the
//! errors (exit 2).

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
