//! Evaluations through the binaries (`loom eval`): a suite with a passing and a failing case
//! (exit 1, the failing expectation named), the `--json` shape, `--case` selection, `--export`
//! replayed by `loom replay --journal`, the `relance` example's irreversible tool answered by a
//! double or refused without one (its file never written), the example suite of `devis`, a
//! malformed suite (exit 2 with its location), `repeat` (each run scored, each case aggregated),
//! `expect.fields` and `expect.state`, cases that `replay` a recorded conversation (from the
//! journal and from an exported file) under two variants, and a binary (PNG) attachment; the
//! suite's and a variant's `config` (and a variant's `models` by step), a case's `tenant`, a
//! `replay` glob (one trial per file, in path order), and approvals during an eval (granted
//! when a double answers, refused when the tool would really run).

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

/// `stateful_with`'s project, its agent `suivi` answering the same way every time.
#[test]
fn a_repeated_case_is_scored_per_run_and_aggregated() {
    let dir = stateful_with(
        r#"version: 1
name: repete
agent: suivi
repeat: 3
cases:
  - name: bon
    input: "Bonjour"
    expect: {contains: ["dossier"]}
  - name: mauvais
    input: "Bonjour"
    repeat: 2
    expect: {contains: ["absent"]}
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
    let runs = report["runs"].as_array().unwrap();
    let attempts: Vec<(&str, u64, bool)> = runs
        .iter()
        .map(|r| {
            (
                r["case"].as_str().unwrap(),
                r["attempt"].as_u64().unwrap(),
                r["passed"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        vec![
            ("bon", 1, true),
            ("bon", 2, true),
            ("bon", 3, true),
            ("mauvais", 1, false),
            ("mauvais", 2, false)
        ]
    );
    assert!(runs.iter().all(|r| r["input_tokens"].as_u64().unwrap() > 0
        && r["output_tokens"].as_u64().unwrap() > 0
        && r["latency_ms"].as_i64().unwrap() >= 0));
    assert_eq!(
        (report["passed"].clone(), report["failed"].clone()),
        (3.into(), 2.into())
    );
    let summary = report["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 2, "{stdout}");
    let bon = &summary[0];
    assert_eq!(
        (bon["case"].as_str(), bon["variant"].as_str()),
        (Some("bon"), Some("base"))
    );
    assert_eq!(
        (bon["runs"].as_u64(), bon["passed"].as_u64()),
        (Some(3), Some(3))
    );
    assert_eq!(bon["pass_rate"].as_f64(), Some(1.0));
    let mean = |key: &str| {
        let total: f64 = runs[..3].iter().map(|r| r[key].as_f64().unwrap()).sum();
        total / 3.0
    };
    for key in ["cost_usd", "input_tokens", "output_tokens", "latency_ms"] {
        let got = bon[format!("mean_{key}")].as_f64().unwrap();
        assert!(
            (got - mean(key)).abs() < 1e-9,
            "mean_{key}: {got} ≠ {}",
            mean(key)
        );
    }
    assert!(bon["mean_cost_usd"].as_f64().unwrap() > 0.0);
    let mauvais = &summary[1];
    assert_eq!(
        (mauvais["runs"].as_u64(), mauvais["passed"].as_u64()),
        (Some(2), Some(0))
    );
    assert_eq!(mauvais["pass_rate"].as_f64(), Some(0.0));
    for n in 1..=3 {
        assert!(
            dir.path()
                .join(format!("out/base--bon--{n}.jsonl"))
                .exists()
        );
    }
    assert!(dir.path().join("out/base--mauvais--2.jsonl").exists());
    no_journal_written(dir.path());

    // The table: one line per case with its pass rate and means, each failed run under it.
    let out = run_in(&loom_bin(), dir.path(), &["eval", "suite.yaml"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("Variant base — 1/2 case(s) passed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  ok       bon                      3/3 run(s) passed (100 %), mean 0.0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  FAILED   mauvais                  0/2 run(s) passed (0 %), mean"),
        "{stdout}"
    );
    for attempt in ["attempt 1: run ", "attempt 2: run "] {
        assert!(stdout.contains(attempt), "{stdout}");
    }
    assert_eq!(
        stdout
            .matches("✗ contains \"absent\" — not in the answer")
            .count(),
        2
    );
    assert!(
        stdout.contains("Result     : 3/5 run(s) passed"),
        "{stdout}"
    );

    // A repeat out of bounds is refused with its location.
    for (from, to, at) in [
        (
            "repeat: 3",
            "repeat: 0",
            "suite.yaml:4:9 repeat: repeat 0 is not between 1 and 100",
        ),
        (
            "    repeat: 2",
            "    repeat: 1000",
            "suite.yaml:11:13 cases[1].repeat: repeat 1000 is not between 1 and 100",
        ),
    ] {
        let suite = fs::read_to_string(dir.path().join("suite.yaml")).unwrap();
        let dir = stateful_with(&suite.replace(from, to));
        let out = run_in(&loom_bin(), dir.path(), &["eval", "suite.yaml"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out.stderr).contains(at), "{}", text(&out.stderr));
        assert!(out.stdout.is_empty());
    }
}

/// A project of the stock `loom` binary whose agent `fiche` answers a devis's card as JSON
/// (its output contract gives `data`) after reading the time, which fills the state key `zone`;
/// the model `fake-autre` answers another card at once.
fn fiche_with(suite: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("loom.yaml"),
        r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: FICHE
    pricing: {input: 3.0, output: 15.0}
    params:
      script:
        - {text: "Je regarde l'heure.", tool_calls: [{name: current_datetime, arguments: {timezone: Europe/Paris}}]}
        - {text: '{"numero": "D-2026-042", "montant_ttc": 1840.0, "lignes": [{"ref": "A-1"}]}'}
  - id: fake-autre
    sdk: fake
    model: AUTRE
    params:
      script:
        - {text: '{"numero": "D-2026-099", "montant_ttc": 10.0, "lignes": []}'}
storage:
  events: {backend: jsonl, path: data}
telemetry:
  logging: {level: WARN}
agents:
  - name: fiche
    main: {model: fake-1}
    tools:
      - tool: loom.current_datetime
    output:
      schema:
        type: object
        required: [numero, montant_ttc]
        properties:
          numero: {type: string}
          montant_ttc: {type: number}
          lignes: {type: array}
    state:
      zone:
        schema: {type: string}
        from: [{tool: current_datetime, path: /timezone}]
      client: {schema: {type: string}}
"#,
    )
    .unwrap();
    fs::write(dir.path().join("suite.yaml"), suite).unwrap();
    dir
}

#[test]
fn fields_of_the_output_and_the_session_state_are_expected() {
    let dir = fiche_with(
        r#"version: 1
name: fiches
agent: fiche
cases:
  - name: juste
    input: "La fiche du devis 42"
    expect:
      fields:
        /numero: D-2026-042
        /montant_ttc: 1840.0
        /lignes/0/ref: {matches: '^A-\d$'}
        /lignes: {equals: [{ref: A-1}]}
      state:
        zone: Europe/Paris
  - name: faux
    input: "La fiche du devis 42"
    expect:
      fields:
        /numero: {matches: '^F-'}
        /absent: 1
      state:
        zone: {matches: '^UTC$'}
        client: C-1
"#,
    );
    let out = run_in(&loom_bin(), dir.path(), &["eval", "suite.yaml"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("  ok       juste                    6/6 check(s)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  FAILED   faux                     1/5 check(s)"),
        "{stdout}"
    );
    for failed in [
        "✗ field /numero matches /^F-/ — found \"D-2026-042\"",
        "✗ field /absent = 1 — no value there",
        "✗ state zone matches /^UTC$/ — found \"Europe/Paris\"",
        "✗ state client = \"C-1\" — not in the session state",
    ] {
        assert!(stdout.contains(failed), "{failed}\n{stdout}");
    }

    let out = run_in(
        &loom_bin(),
        dir.path(),
        &["eval", "suite.yaml", "--json", "--case", "juste"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let checks: Vec<&str> = report["runs"][0]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["expectation"].as_str().unwrap())
        .collect();
    assert_eq!(
        checks,
        vec![
            "status completed",
            "field /lignes = [{\"ref\":\"A-1\"}]",
            "field /lignes/0/ref matches /^A-\\d$/",
            "field /montant_ttc = 1840.0",
            "field /numero = \"D-2026-042\"",
            "state zone = \"Europe/Paris\"",
        ]
    );

    // A key that is not a JSON pointer, a pattern that is not a regular expression: refused
    // with their location.
    for (suite, at) in [
        (
            "version: 1\nname: s\nagent: fiche\ncases:\n  - name: a\n    input: x\n    expect:\n      fields: {numero: x}\n",
            "suite.yaml:8:24 cases[0].expect.fields.numero: 'numero' is not a JSON pointer",
        ),
        (
            "version: 1\nname: s\nagent: fiche\ncases:\n  - name: a\n    input: x\n    expect:\n      state: {zone: {matches: '('}}\n",
            "suite.yaml:8:31 cases[0].expect.state.zone.matches: not a regular expression",
        ),
    ] {
        fs::write(dir.path().join("suite.yaml"), suite).unwrap();
        let out = run_in(&loom_bin(), dir.path(), &["eval", "suite.yaml"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out.stderr).contains(at), "{}", text(&out.stderr));
    }
}

#[test]
fn a_case_replays_a_recorded_conversation_under_each_variant() {
    let dir = fiche_with(
        r#"version: 1
name: rejeu
agent: fiche
variants:
  - name: base
  - name: autre
    model: fake-autre
cases:
  - name: du-journal
    replay: r-1
    expect:
      fields: {/numero: D-2026-042}
      state: {zone: Europe/Paris}
  - name: du-fichier
    replay: conv.jsonl
    expect:
      fields: {/numero: D-2026-042}
      called: [current_datetime]
"#,
    );
    record_fiche(dir.path(), "r-1", "conv.jsonl");

    let out = run_in(&loom_bin(), dir.path(), &["eval", "suite.yaml", "--json"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let shown = report.to_string();
    let run = |variant: &str, case: &str| -> Value {
        report["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["variant"] == variant && r["case"] == case)
            .cloned()
            .unwrap_or_else(|| panic!("no {variant}/{case} in {shown}"))
    };
    // Under the base variant the conversation is the recorded one: same answer, the tool's
    // result served from the journal (so the state it filled).
    for case in ["du-journal", "du-fichier"] {
        let base = run("base", case);
        assert_eq!(base["passed"], true, "{case}: {shown}");
        assert_eq!(base["run_id"], "r-1");
        assert!(base["text"].as_str().unwrap().contains("D-2026-042"));
    }
    // Under `autre`, its model answers the same question otherwise, and the case fails.
    for case in ["du-journal", "du-fichier"] {
        let autre = run("autre", case);
        assert_eq!(autre["passed"], false, "{case}: {shown}");
        assert!(
            autre["text"].as_str().unwrap().contains("D-2026-099"),
            "{shown}"
        );
        let failed: Vec<&str> = autre["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["passed"] == false)
            .map(|c| c["expectation"].as_str().unwrap())
            .collect();
        assert!(
            failed.contains(&"field /numero = \"D-2026-042\""),
            "{shown}"
        );
    }

    // What cannot be replayed is refused before any run, with its location.
    for (from, to, at) in [
        (
            "replay: r-1",
            "replay: r-absent",
            "suite.yaml:10:13 cases[0].replay: 'r-absent' is neither a journal file next to the suite nor a run of tenant 'default'",
        ),
        (
            "replay: conv.jsonl",
            "replay: absent.jsonl",
            "suite.yaml:15:13 cases[1].replay: ",
        ),
        (
            "    replay: r-1\n",
            "    replay: r-1\n    input: Bonjour\n",
            "suite.yaml:10:13 cases[0].replay: a case replays a recorded conversation or sends an `input`, not both",
        ),
        (
            "    replay: r-1\n",
            "",
            "suite.yaml:9:5 cases[0]: a case needs an `input` message or a conversation to `replay`",
        ),
    ] {
        let suite = fs::read_to_string(dir.path().join("suite.yaml")).unwrap();
        fs::write(dir.path().join("bad.yaml"), suite.replace(from, to)).unwrap();
        let out = run_in(&loom_bin(), dir.path(), &["eval", "bad.yaml"]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&at.replace("suite.yaml", "bad.yaml")),
            "{stderr}"
        );
    }
}

/// A 1×1 PNG, to attach.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0xf0,
    0x1f, 0x00, 0x05, 0x00, 0x01, 0xff, 0x89, 0x99, 0x3d, 0x1d, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
    0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

#[test]
fn a_binary_attachment_goes_with_its_case_message() {
    let dir = stateful_with(
        r#"version: 1
name: pieces
agent: suivi
cases:
  - name: plan
    input: "Voici le plan"
    attachments: [files/plan.png]
    expect: {contains: ["dossier"]}
  - name: plan-faux
    input: "Voici le plan"
    attachments: [files/plan.png]
    expect: {contains: ["cuisine"]}
"#,
    );
    fs::create_dir(dir.path().join("files")).unwrap();
    fs::write(dir.path().join("files/plan.png"), PNG).unwrap();
    let out = run_in(
        &loom_bin(),
        dir.path(),
        &["eval", "suite.yaml", "--export", "out"],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("  ok       plan "), "{stdout}");
    assert!(stdout.contains("  FAILED   plan-faux "), "{stdout}");
    for case in ["plan", "plan-faux"] {
        let journal: Vec<Value> =
            fs::read_to_string(dir.path().join(format!("out/base--{case}.jsonl")))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
        let stored: Vec<&Value> = journal
            .iter()
            .filter(|e| e["type"] == "artifact.stored")
            .map(|e| &e["payload"])
            .collect();
        assert_eq!(stored.len(), 1, "{journal:?}");
        assert_eq!(stored[0]["origin"], "attachment");
        assert_eq!(stored[0]["media_type"], "image/png");
        assert_eq!(stored[0]["name"], "plan.png");
        assert_eq!(stored[0]["size"], PNG.len());
        let uri = stored[0]["uri"].as_str().unwrap();
        let message = journal
            .iter()
            .find(|e| e["type"] == "message.user")
            .unwrap();
        assert!(message.to_string().contains(uri), "{message}");
    }
    no_journal_written(dir.path());

    // Bytes that are not the image their name says, a missing file: refused before any run.
    fs::write(dir.path().join("files/plan.png"), b"not a png at all").unwrap();
    let out = run_in(&loom_bin(), dir.path(), &["eval", "suite.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr)
            .contains("suite.yaml:7:19 cases[0].attachments[0]: request refused: attachment 'plan.png' is declared image/png"),
        "{}",
        text(&out.stderr)
    );
    assert!(out.stdout.is_empty());
    fs::remove_file(dir.path().join("files/plan.png")).unwrap();
    let out = run_in(&loom_bin(), dir.path(), &["eval", "suite.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("suite.yaml:7:19 cases[0].attachments[0]: "),
        "{}",
        text(&out.stderr)
    );
}

/// A `loom.yaml` of the stock binary whose agent `suivi` answers `answer`, its journal in
/// `data` next to it, and `tenants` (YAML of a `tenants:` list, or nothing).
fn suivi_config(answer: &str, extra_models: &str, tenants: &str) -> String {
    format!(
        r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: SUIVI
    params:
      script:
        - {{text: "{answer}"}}
{extra_models}storage:
  events: {{backend: jsonl, path: data}}
telemetry:
  logging: {{level: WARN}}
agents:
  - name: suivi
    main: {{model: fake-1}}
{tenants}"#
    )
}

const CONFIG_SUITE: &str = r#"version: 1
name: ailleurs
config: ../projet/loom.yaml
agent: suivi
variants:
  - name: base
  - name: autre
    config: ../autre/loom.yaml
  - name: bref
    models: {main: fake-bref}
cases:
  - name: dossier
    input: "Où en est mon dossier ?"
    expect: {contains: ["dossier"]}
"#;

#[test]
fn the_suite_and_a_variant_name_the_configuration_they_run_against() {
    // No loom.yaml where `loom eval` runs: the suite's `config` is what it opens.
    let dir = tempfile::tempdir().unwrap();
    for (sub, answer, extra) in [
        (
            "projet",
            "Votre dossier est complet.",
            "  - id: fake-bref\n    sdk: fake\n    model: BREF\n    params:\n      script:\n        - {text: \"Complet.\"}\n",
        ),
        ("autre", "Je regarde cela.", ""),
    ] {
        fs::create_dir_all(dir.path().join(sub)).unwrap();
        fs::write(
            dir.path().join(sub).join("loom.yaml"),
            suivi_config(answer, extra, ""),
        )
        .unwrap();
    }
    fs::create_dir_all(dir.path().join("evals")).unwrap();
    fs::write(dir.path().join("evals/suite.yaml"), CONFIG_SUITE).unwrap();
    let out = run_in(
        &loom_bin(),
        dir.path(),
        &["eval", "evals/suite.yaml", "--json"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let shown = report.to_string();
    let runs = report["runs"].as_array().unwrap();
    let run = |variant: &str| {
        runs.iter()
            .find(|r| r["variant"] == variant)
            .unwrap_or_else(|| panic!("no {variant} in {shown}"))
    };
    // The suite's configuration answers, the variant's configuration answers otherwise, and
    // the variant naming the main step's model answers with it.
    assert_eq!(run("base")["text"], "Votre dossier est complet.", "{shown}");
    assert_eq!(run("base")["passed"], true);
    assert_eq!(run("autre")["text"], "Je regarde cela.", "{shown}");
    assert_eq!(run("autre")["passed"], false);
    assert_eq!(run("bref")["text"], "Complet.", "{shown}");
    for sub in ["projet", "autre"] {
        assert!(
            !dir.path().join(sub).join("data").exists(),
            "an evaluation writes no journal"
        );
    }

    // Refused before any run, located in the suite: a variant's configuration that is not
    // there, or that declares no such agent; a step the agent does not have; the main model
    // given twice; a suite configuration that is not there.
    let autre = suivi_config("Je regarde cela.", "", "");
    for (from, to, renamed, at) in [
        (
            "config: ../autre/loom.yaml",
            "config: ../absent/loom.yaml",
            false,
            "suite.yaml:8:13 variants[1].config: ",
        ),
        (
            "",
            "",
            true,
            "suite.yaml:8:13 variants[1].config: unknown agent 'suivi' (agents: autre)",
        ),
        (
            "models: {main: fake-bref}",
            "models: {critique: fake-bref}",
            false,
            "suite.yaml:10:24 variants[2].models.critique: agent 'suivi' has no step 'critique' (its steps: main)",
        ),
        (
            "models: {main: fake-bref}",
            "model: fake-1\n    models: {main: fake-bref}",
            false,
            "variants[2].models.main: the main step's model is given twice",
        ),
        (
            "config: ../projet/loom.yaml",
            "config: ../nulle-part/loom.yaml",
            false,
            "suite.yaml:3:9 config: ",
        ),
    ] {
        let config = if renamed {
            autre.replace("name: suivi", "name: autre")
        } else {
            autre.clone()
        };
        fs::write(dir.path().join("autre/loom.yaml"), config).unwrap();
        let suite = if from.is_empty() {
            CONFIG_SUITE.to_owned()
        } else {
            CONFIG_SUITE.replace(from, to)
        };
        fs::write(dir.path().join("evals/suite.yaml"), suite).unwrap();
        let out = run_in(&loom_bin(), dir.path(), &["eval", "evals/suite.yaml"]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{at}: {stderr}");
        assert!(stderr.contains(at), "{at}: {stderr}");
        assert!(out.stdout.is_empty(), "{at}: refused before any run");
    }
}

#[test]
fn a_case_runs_under_its_tenant_or_the_suites() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("loom.yaml"),
        suivi_config(
            "Bonjour, je regarde votre dossier.",
            "  - id: fake-acme\n    sdk: fake\n    model: ACME\n    params:\n      script:\n        - {text: \"Acme vous répond.\"}\n",
            "tenants:\n  - id: default\n  - id: acme\n    models: {fake-1: fake-acme}\n",
        ),
    )
    .unwrap();
    let suite = r#"version: 1
name: locataires
agent: suivi
tenant: acme
cases:
  - name: chez-acme
    input: "Bonjour"
    expect: {contains: ["Acme"]}
  - name: par-defaut
    tenant: default
    input: "Bonjour"
    expect: {contains: ["Acme"]}
"#;
    fs::write(dir.path().join("suite.yaml"), suite).unwrap();
    let out = run_in(
        &loom_bin(),
        dir.path(),
        &["eval", "suite.yaml", "--json", "--export", "out"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let shown = report.to_string();
    let runs = report["runs"].as_array().unwrap();
    // Acme's model mapping answers Acme's case; the default tenant keeps the configured model.
    assert_eq!(runs[0]["tenant"], "acme", "{shown}");
    assert_eq!(runs[0]["text"], "Acme vous répond.", "{shown}");
    assert_eq!(runs[0]["passed"], true, "{shown}");
    assert_eq!(runs[1]["tenant"], "default", "{shown}");
    assert_eq!(runs[1]["text"], "Bonjour, je regarde votre dossier.");
    assert_eq!(runs[1]["passed"], false);
    // The exported journals are the tenants'.
    for (case, tenant) in [("chez-acme", "acme"), ("par-defaut", "default")] {
        let journal =
            fs::read_to_string(dir.path().join(format!("out/base--{case}.jsonl"))).unwrap();
        let events: Vec<Value> = journal
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(!events.is_empty());
        assert!(
            events.iter().all(|e| e["tenant_id"] == tenant),
            "{case}: {journal}"
        );
    }
    no_journal_written(dir.path());

    // A tenant the configuration does not declare: refused before any run, located.
    for (from, to, at) in [
        (
            "    tenant: default\n",
            "    tenant: inconnu\n",
            "suite.yaml:10:13 cases[1].tenant: tenant 'inconnu' is not declared (tenants: default, acme)",
        ),
        (
            "tenant: acme\n",
            "tenant: absent\n",
            "suite.yaml:4:9 tenant: tenant 'absent' is not declared",
        ),
    ] {
        fs::write(dir.path().join("bad.yaml"), suite.replacen(from, to, 1)).unwrap();
        let out = run_in(&loom_bin(), dir.path(), &["eval", "bad.yaml"]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&at.replace("suite.yaml", "bad.yaml")),
            "{stderr}"
        );
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn a_replay_glob_makes_each_matching_journal_a_trial_in_path_order() {
    let dir = fiche_with(
        r#"version: 1
name: corpus
agent: fiche
variants:
  - name: base
  - name: autre
    model: fake-autre
cases:
  - name: corpus
    replay: "runs/*.jsonl"
    expect:
      fields: {/numero: D-2026-042}
"#,
    );
    fs::create_dir(dir.path().join("runs")).unwrap();
    // Exported in the reverse of their names' order: the trials follow the paths.
    for (run_id, file) in [("r-2", "runs/b.jsonl"), ("r-1", "runs/a.jsonl")] {
        record_fiche(dir.path(), run_id, file);
    }
    fs::write(dir.path().join("runs/notes.txt"), "not a journal").unwrap();

    let out = run_in(
        &loom_bin(),
        dir.path(),
        &["eval", "suite.yaml", "--json", "--export", "out"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let shown = report.to_string();
    let trials: Vec<(String, u64, String, String, bool)> = report["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["variant"].as_str().unwrap().to_owned(),
                r["attempt"].as_u64().unwrap(),
                r["journal"].as_str().unwrap().to_owned(),
                r["run_id"].as_str().unwrap().to_owned(),
                r["passed"].as_bool().unwrap(),
            )
        })
        .collect();
    let trial = |variant: &str, attempt, journal: &str, run: &str, passed| {
        (
            variant.to_owned(),
            attempt,
            journal.to_owned(),
            run.to_owned(),
            passed,
        )
    };
    assert_eq!(
        trials,
        vec![
            trial("base", 1, "runs/a.jsonl", "r-1", true),
            trial("base", 2, "runs/b.jsonl", "r-2", true),
            trial("autre", 1, "runs/a.jsonl", "r-1", false),
            trial("autre", 2, "runs/b.jsonl", "r-2", false),
        ],
        "{shown}"
    );
    let summary = &report["summary"][0];
    assert_eq!(
        (summary["runs"].clone(), summary["passed"].clone()),
        (2.into(), 2.into())
    );
    for n in [1, 2] {
        assert!(
            dir.path()
                .join(format!("out/base--corpus--{n}.jsonl"))
                .exists()
        );
    }
    // The text report names each failed trial's file.
    let out = run_in(
        &loom_bin(),
        dir.path(),
        &["eval", "suite.yaml", "--variant", "autre"],
    );
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("attempt 2 (runs/b.jsonl): run r-2"),
        "{stdout}"
    );

    // A glob that matches nothing: refused before any run, located.
    let suite = fs::read_to_string(dir.path().join("suite.yaml")).unwrap();
    fs::write(
        dir.path().join("bad.yaml"),
        suite.replace("runs/*.jsonl", "absent/*.jsonl"),
    )
    .unwrap();
    let out = run_in(&loom_bin(), dir.path(), &["eval", "bad.yaml"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("bad.yaml:10:13 cases[0].replay: 'absent/*.jsonl' matches no journal file"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn an_approval_is_granted_when_a_double_answers_and_the_tool_never_runs() {
    let dir = relance_with(RELANCE_SUITE);
    let agent = dir.path().join("agents/relance.yaml");
    let yaml = fs::read_to_string(&agent).unwrap();
    fs::write(&agent, format!("{yaml}    approval: always\n")).unwrap();
    let out = run_in(
        &example_bin("relance"),
        dir.path(),
        &["eval", "suite.yaml", "--json", "--export", "out"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["runs"][0]["status"], "completed", "{report}");
    let events: Vec<Value> = fs::read_to_string(dir.path().join("out/base--relance.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |kind: &str| {
        events
            .iter()
            .filter(|e| e["type"] == kind)
            .collect::<Vec<_>>()
    };
    assert_eq!(of("approval.requested").len(), 1, "{events:?}");
    let granted = of("approval.granted");
    assert_eq!(granted.len(), 1, "{events:?}");
    assert_eq!(granted[0]["payload"]["by"], "loom eval");
    assert!(
        !dir.path().join("relances.txt").exists(),
        "the irreversible tool ran during an evaluation"
    );
}

#[test]
fn an_approval_is_refused_when_the_tool_would_really_run() {
    // The time tool declares no side effect: it would run for real, so its approval is refused
    // and the state it fills stays empty.
    let dir = fiche_with(
        r#"version: 1
name: heure
agent: fiche
cases:
  - name: heure
    input: "La fiche du devis 42"
    expect:
      state: {zone: Europe/Paris}
"#,
    );
    let config = dir.path().join("loom.yaml");
    let yaml = fs::read_to_string(&config).unwrap().replace(
        "      - tool: loom.current_datetime\n",
        "      - tool: loom.current_datetime\n        approval: always\n",
    );
    fs::write(&config, yaml).unwrap();
    let out = run_in(
        &loom_bin(),
        dir.path(),
        &["eval", "suite.yaml", "--json", "--export", "out"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let run = &report["runs"][0];
    assert_eq!(run["status"], "completed", "{report}");
    assert_eq!(run["passed"], false, "{report}");
    let events: Vec<Value> = fs::read_to_string(dir.path().join("out/base--heure.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let rejected: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "approval.rejected")
        .collect();
    assert_eq!(rejected.len(), 1, "{events:?}");
    assert_eq!(rejected[0]["payload"]["by"], "loom eval");
    assert!(
        rejected[0]["payload"]["reason"]
            .as_str()
            .unwrap()
            .contains("'current_datetime' would really run"),
        "{}",
        rejected[0]
    );
    // The call's result is the refusal, not the time.
    let completed: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "tool.completed")
        .collect();
    assert_eq!(completed.len(), 1, "{events:?}");
    assert_eq!(completed[0]["payload"]["output"]["is_error"], true);
    assert!(
        completed[0]["payload"]["output"]["blocks"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("Call to current_datetime rejected by loom eval"),
        "{}",
        completed[0]
    );
    assert!(
        !events.iter().any(|e| e["type"] == "approval.granted"),
        "{events:?}"
    );
}

#[test]
fn a_replayed_case_decides_approvals_the_journal_has_no_fate_for() {
    let dir = fiche_with(
        r#"version: 1
name: rejeu-approbation
agent: fiche
variants:
  - name: base
  - name: tokyo
    model: fake-tokyo
cases:
  - name: rejeu
    replay: conv.jsonl
    expect:
      state: {zone: Europe/Paris}
"#,
    );
    record_fiche(dir.path(), "r-1", "conv.jsonl");
    // Since then the time tool needs an approval, and a model asks Tokyo's time instead.
    let config = dir.path().join("loom.yaml");
    let yaml = fs::read_to_string(&config)
        .unwrap()
        .replace(
            "      - tool: loom.current_datetime\n",
            "      - tool: loom.current_datetime\n        approval: always\n",
        )
        .replacen(
            "storage:\n",
            "  - id: fake-tokyo\n    sdk: fake\n    model: TOKYO\n    params:\n      script:\n        - {text: \"L'heure de Tokyo.\", tool_calls: [{name: current_datetime, arguments: {timezone: Asia/Tokyo}}]}\n        - {text: '{\"numero\": \"D-2026-042\", \"montant_ttc\": 1840.0}'}\nstorage:\n",
            1,
        );
    fs::write(&config, yaml).unwrap();

    let out = run_in(
        &loom_bin(),
        dir.path(),
        &["eval", "suite.yaml", "--json", "--export", "out"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let shown = report.to_string();
    let decided = |variant: &str, kind: &str| -> Vec<Value> {
        fs::read_to_string(dir.path().join(format!("out/{variant}--rejeu.jsonl")))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|e| e["type"] == kind)
            .collect()
    };
    // The recorded call: its result is in the journal, nothing runs for real: granted, and
    // the state it filled is there.
    assert_eq!(report["runs"][0]["variant"], "base", "{shown}");
    assert_eq!(report["runs"][0]["passed"], true, "{shown}");
    let granted = decided("base", "approval.granted");
    assert_eq!(granted.len(), 1, "{shown}");
    assert_eq!(granted[0]["payload"]["by"], "loom eval");
    // Tokyo's call has no recorded result and the tool would really run: refused.
    assert_eq!(report["runs"][1]["variant"], "tokyo", "{shown}");
    assert_eq!(report["runs"][1]["status"], "completed", "{shown}");
    assert_eq!(report["runs"][1]["passed"], false, "{shown}");
    let rejected = decided("tokyo", "approval.rejected");
    assert_eq!(rejected.len(), 1, "{shown}");
    assert_eq!(rejected[0]["payload"]["by"], "loom eval");
    assert!(decided("tokyo", "approval.granted").is_empty());
}

/// Runs the `fiche` agent of `dir` as `run_id` and exports that run's journal to `file`
/// (relative to `dir`): a recorded conversation for a case's `replay`.
fn record_fiche(dir: &Path, run_id: &str, file: &str) {
    let run = run_in(
        &loom_bin(),
        dir,
        &["run", "fiche", "La fiche du devis 42", "--run-id", run_id],
    );
    assert!(run.status.success(), "{}", text(&run.stderr));
    let export = run_in(&loom_bin(), dir, &["replay", run_id, "--export", file]);
    assert!(export.status.success(), "{}", text(&export.stderr));
}
