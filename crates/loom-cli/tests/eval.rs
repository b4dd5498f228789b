//! Evaluations through the binaries (`loom eval`): a suite with a passing and a failing case
//! (exit 1, the failing expectation named), the `--json` shape, `--case` selection, `--export`
//! replayed by `loom replay --journal`, the `relance` example's irreversible tool answered by a
//! double or refused without one (its file never written), the example suite of `devis`, and a
//! malformed suite (exit 2 with its location).

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::{fs, path::Path};

use serde_json::Value;

const DEVIS_SUITE: &str = r#"version: 1
name: devis-suite
agent: devis
cases:
  - name: juste
    input: "Quel prix TTC pour 1 250 € HT (TVA à 10 %) ?"
    expect:
      contains: ["TTC"]
      matches: ['1\s375']
      called:
        - {name: prix_ttc, arguments: {taux_tva: 10}}
  - name: faux
    input: "Quel prix TTC pour 99 € HT ?"
    expect:
      contains: ["99"]
      not_called: [prix_ttc]
      max_cost_usd: 0.5
"#;

/// A devis project with `suite.yaml` holding `suite`.
fn devis_with(suite: &str) -> tempfile::TempDir {
    let dir = devis_project();
    fs::write(dir.path().join("suite.yaml"), suite).unwrap();
    dir
}

fn no_journal_written(dir: &Path) {
    assert!(
        !dir.join("data").exists(),
        "an evaluation writes only scratch journals"
    );
}

#[test]
fn a_passing_and_a_failing_case_exit_1_naming_the_failed_expectations() {
    let dir = devis_with(DEVIS_SUITE);
    let out = run_in(&devis_bin(), dir.path(), &["eval", "suite.yaml"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("Suite      : devis-suite — agent devis, 2 case(s), 1 variant(s)"));
    assert!(
        stdout.contains("Variant base — 1/2 case(s) passed"),
        "{stdout}"
    );
    assert!(stdout.contains("  ok       juste"), "{stdout}");
    assert!(stdout.contains("  FAILED   faux"), "{stdout}");
    assert!(
        stdout.contains("✗ contains \"99\" — not in the answer"),
        "{stdout}"
    );
    assert!(
        stdout.contains("✗ not_called prix_ttc — called 1 time(s)"),
        "{stdout}"
    );
    assert!(stdout.contains("Verdict    : some expectations fail"));
    no_journal_written(dir.path());

    let run_id = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("run "))
        .and_then(|l| l.split(',').next())
        .unwrap()
        .to_owned();
    insta::assert_snapshot!(stdout.replace(&run_id, "<run>"));
}

#[test]
fn json_shape_and_case_selection() {
    let dir = devis_with(DEVIS_SUITE);
    let out = run_in(
        &devis_bin(),
        dir.path(),
        &["eval", "suite.yaml", "--json", "--case", "juste"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["suite"], "devis-suite");
    assert_eq!(report["agent"], "devis");
    assert_eq!(report["cases"], 1);
    assert_eq!(report["variants"], serde_json::json!(["base"]));
    assert_eq!(
        (report["passed"].clone(), report["failed"].clone()),
        (1.into(), 0.into())
    );
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    assert_eq!(run["case"], "juste");
    assert_eq!(run["variant"], "base");
    assert_eq!(run["passed"], true);
    assert_eq!(run["status"], "completed");
    assert!(run["run_id"].is_string());
    assert!(run["cost_usd"].as_f64().unwrap() > 0.0);
    assert!(run["text"].as_str().unwrap().contains("TTC"));
    let checks: Vec<&str> = run["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["passed"], true);
            c["expectation"].as_str().unwrap()
        })
        .collect();
    assert_eq!(
        checks,
        vec![
            "status completed",
            "contains \"TTC\"",
            "matches /1\\s375/",
            "called prix_ttc with {\"taux_tva\":10}"
        ]
    );

    let unknown = run_in(
        &devis_bin(),
        dir.path(),
        &["eval", "suite.yaml", "--case", "autre"],
    );
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        text(&unknown.stderr).contains("the suite has no case 'autre' (its cases: juste, faux)"),
        "{}",
        text(&unknown.stderr)
    );
}

#[test]
fn an_exported_run_replays_identical() {
    let dir = devis_with(DEVIS_SUITE);
    let out = run_in(
        &devis_bin(),
        dir.path(),
        &["eval", "suite.yaml", "--case", "juste", "--export", "runs"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let file = dir.path().join("runs/base--juste.jsonl");
    assert!(file.exists(), "{}", text(&out.stderr));
    let replay = run_in(
        &devis_bin(),
        dir.path(),
        &["replay", "--journal", file.to_str().unwrap()],
    );
    assert_eq!(
        replay.status.code(),
        Some(0),
        "{}{}",
        text(&replay.stdout),
        text(&replay.stderr)
    );
    assert!(text(&replay.stdout).contains("Identical"));
}

const RELANCE_SUITE: &str = r#"version: 1
name: relances
agent: relance
doubles:
  envoyer_relance: "relance simulée pour le devis D-2024-017"
cases:
  - name: relance
    input: "Relance le devis D-2024-017"
    expect:
      contains: ["relance simulée"]
      called:
        - {name: envoyer_relance, arguments: {numero: "D-2024-017"}}
"#;

fn relance_with(suite: &str) -> tempfile::TempDir {
    let dir = copy_example("relance");
    fs::write(dir.path().join("suite.yaml"), suite).unwrap();
    dir
}

#[test]
fn an_irreversible_tool_is_answered_by_its_double_and_never_runs() {
    let dir = relance_with(RELANCE_SUITE);
    let out = run_in(
        &example_bin("relance"),
        dir.path(),
        &["eval", "suite.yaml", "--json"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["passed"], 1);
    assert!(
        report["runs"][0]["text"]
            .as_str()
            .unwrap()
            .contains("relance simulée pour le devis D-2024-017")
    );
    assert!(
        !dir.path().join("relances.txt").exists(),
        "the irreversible tool ran during an evaluation"
    );
}

#[test]
fn an_irreversible_tool_without_a_double_is_refused_and_never_runs() {
    let suite = RELANCE_SUITE.replace(
        "doubles:\n  envoyer_relance: \"relance simulée pour le devis D-2024-017\"\n",
        "",
    );
    let dir = relance_with(&suite);
    let out = run_in(&example_bin("relance"), dir.path(), &["eval", "suite.yaml"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains(
            "✗ side-effect tools answered by doubles — tool envoyer_relance has side effects \
             and no double (call fake_0_0): refused, never run"
        ),
        "{stdout}"
    );
    assert!(
        !dir.path().join("relances.txt").exists(),
        "the irreversible tool ran during an evaluation"
    );
}

#[test]
fn a_malformed_suite_exits_2_with_its_location() {
    let dir = devis_with(&DEVIS_SUITE.replace("      not_called:", "      not_caled:"));
    let out = run_in(&devis_bin(), dir.path(), &["eval", "suite.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("suite.yaml:16:7 cases[1].expect.not_caled: unknown key 'not_caled'"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());

    let dir =
        devis_with(&DEVIS_SUITE.replace("agent: devis", "agent: devis\ndoubles: {prix_ttc: x}"));
    let out = run_in(&devis_bin(), dir.path(), &["eval", "suite.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr)
            .contains("suite.yaml:4:21 doubles.prix_ttc: tool 'prix_ttc' has no side effects"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn the_example_suite_passes_under_both_variants() {
    let dir = devis_project();
    let suite = repo().join("examples/devis/evals/devis.yaml");
    let out = run_in(
        &devis_bin(),
        dir.path(),
        &["eval", suite.to_str().unwrap(), "--concurrency", "2"],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("Variant base — 1/1 case(s) passed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Variant bref — 1/1 case(s) passed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Result     : 2/2 run(s) passed"),
        "{stdout}"
    );
}

const GARDE_SUITE: &str = r#"version: 1
name: politesse
agent: devis
judge: {model: fake-juge}
variants:
  - name: base
  - name: poli
    model: fake-poli
    system: Tu salues le client avant de répondre.
cases:
  - name: salue
    input: "Que vaut le devis 42 ?"
    criteria:
      - {name: poli, rule: "Le client est salué."}
"#;

/// The garde project with a model that greets (`fake-poli`) and `suite.yaml`.
fn garde_with(suite: &str) -> tempfile::TempDir {
    let dir = copy_example("garde");
    let config = dir.path().join("loom.yaml");
    let text = fs::read_to_string(&config).unwrap().replacen(
        "models:\n",
        "models:\n  - id: fake-poli\n    sdk: fake\n    model: FAKE_POLI\n    params:\n      \
         script:\n        - text: \"Bonjour Madame Martin, votre devis D-2026-042 est prêt.\"\n",
        1,
    );
    fs::write(config, text).unwrap();
    fs::write(dir.path().join("suite.yaml"), suite).unwrap();
    dir
}

#[test]
fn criteria_are_scored_by_the_suite_judge_under_each_variant() {
    let dir = garde_with(GARDE_SUITE);
    let garde = example_bin("garde");
    let out = run_in(&garde, dir.path(), &["eval", "suite.yaml"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("Variant base — 0/1 case(s) passed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("✗ criterion poli (at least 0.80) — scored 0.20: pas de salutation"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Variant poli — 1/1 case(s) passed"),
        "{stdout}"
    );

    let out = run_in(
        &garde,
        dir.path(),
        &["eval", "suite.yaml", "--variant", "poli", "--json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["variants"], serde_json::json!(["poli"]));
    let run = &report["runs"][0];
    assert!(
        run["text"]
            .as_str()
            .unwrap()
            .starts_with("Bonjour Madame Martin")
    );
    assert_eq!(
        run["checks"][1]["expectation"],
        "criterion poli (at least 0.80)"
    );
    assert_eq!(run["checks"][1]["passed"], true);

    let dir = garde_with(&GARDE_SUITE.replace("model: fake-poli", "model: fake-absent"));
    let out = run_in(&garde, dir.path(), &["eval", "suite.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr)
            .contains("suite.yaml:8:12 variants[1].model: unknown model 'fake-absent'"),
        "{}",
        text(&out.stderr)
    );
}

/// A project of the stock `loom` binary whose agent `suivi` declares the state key `client`.
fn stateful_with(suite: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("loom.yaml"),
        r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: SUIVI
    pricing: {input: 3.0, output: 15.0}
    params:
      script:
        - {text: "Bonjour, je regarde votre dossier."}
storage:
  events: {backend: jsonl, path: data}
telemetry:
  logging: {level: WARN}
agents:
  - name: suivi
    main: {model: fake-1, context: [session_state]}
    state:
      client: {schema: {type: string}}
"#,
    )
    .unwrap();
    fs::write(dir.path().join("suite.yaml"), suite).unwrap();
    dir
}

/// The `run.started` payload of an exported case's journal.
fn exported_start(dir: &Path, file: &str) -> Value {
    let text = fs::read_to_string(dir.join("out").join(file)).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["type"] == "run.started")
        .unwrap()["payload"]
        .clone()
}

#[test]
fn a_cases_state_opens_its_run_and_a_cost_ceiling_fails_a_case() {
    let dir = stateful_with(
        r#"version: 1
name: etat
agent: suivi
cases:
  - name: connu
    input: "Bonjour"
    state: {client: C-42}
    expect: {contains: ["dossier"]}
  - name: inconnu
    input: "Bonjour"
    expect: {contains: ["dossier"]}
  - name: trop-cher
    input: "Bonjour"
    expect: {max_cost_usd: 0.0000001}
"#,
    );
    let out = run_in(
        &loom_bin(),
        dir.path(),
        &["eval", "suite.yaml", "--json", "--export", "out"],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let shown = report.to_string();
    let case = |name: &str| -> Value {
        report["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["case"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no case {name} in {shown}"))
    };
    assert_eq!(case("connu")["passed"], true, "{shown}");
    assert_eq!(case("inconnu")["passed"], true, "{shown}");
    assert_eq!(case("trop-cher")["passed"], false, "{shown}");
    assert!(
        case("trop-cher")["cost_usd"].as_f64().unwrap() > 0.0000001,
        "{shown}"
    );
    // The case's state opened its run (journaled in its `run.started`), and only its run.
    assert_eq!(
        exported_start(dir.path(), "base--connu.jsonl")["state"],
        serde_json::json!({"client": "C-42"})
    );
    assert!(
        exported_start(dir.path(), "base--inconnu.jsonl")
            .get("state")
            .is_none_or(|s| s.is_null() || s == &serde_json::json!({}))
    );
    no_journal_written(dir.path());

    // A state value off the agent's schema is refused before anything runs.
    fs::write(
        dir.path().join("suite.yaml"),
        "version: 1\nname: etat\nagent: suivi\ncases:\n  - name: faux\n    input: Bonjour\n    state: {client: 7}\n",
    )
    .unwrap();
    let out = run_in(&loom_bin(), dir.path(), &["eval", "suite.yaml"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("session state: client: does not follow its schema"),
        "{stdout}"
    );
    assert!(stdout.contains("some runs could not be played"), "{stdout}");
    no_journal_written(dir.path());
}
