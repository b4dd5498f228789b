//! Unit tests of the suite format and of expectation scoring.

use serde_json::json;

use super::*;

fn suite(cases: &str) -> Suite {
    let text = format!("version: 1\nname: s\nagent: devis\njudge: {{model: j}}\ncases:\n{cases}");
    Suite::from_yaml(&text, "suite.yaml", ".").unwrap()
}

fn outcome(text: &str) -> Outcome {
    Outcome {
        status: "completed".into(),
        text: text.into(),
        calls: vec![CallSeen {
            name: "prix_ttc".into(),
            arguments: json!({"montant_ht": 1250, "taux_tva": 10, "note": {"a": 1, "b": 2}}),
        }],
        cost_usd: 0.002,
        ..Outcome::default()
    }
}

fn failed(checks: &[Check]) -> Vec<&str> {
    checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| c.expectation.as_str())
        .collect()
}

#[test]
fn texts_and_patterns_are_scored_one_check_each() {
    let suite = suite(
        "  - name: a\n    input: x\n    expect:\n      contains: ['1 375', 'absent']\n      \
         not_contains: [erreur, TTC]\n      matches: ['\\d+ \\d{3},\\d{2}', '^Non']\n",
    );
    let checks = suite.score(0, &outcome("Le prix est de 1 375,00 € TTC."));
    assert_eq!(checks.len(), 7, "{checks:?}");
    assert_eq!(
        failed(&checks),
        vec![
            "contains \"absent\"",
            "not_contains \"TTC\"",
            "matches /^Non/"
        ]
    );
}

#[test]
fn status_defaults_to_completed() {
    let suite = suite("  - name: a\n    input: x\n");
    let mut seen = outcome("");
    assert!(failed(&suite.score(0, &seen)).is_empty());
    seen.status = "failed".into();
    let checks = suite.score(0, &seen);
    assert_eq!(failed(&checks), vec!["status completed"]);
    assert_eq!(checks[0].detail.as_deref(), Some("the run ended failed"));
}

#[test]
fn a_tool_call_matches_on_a_subset_of_its_arguments() {
    let suite = suite(
        "  - name: a\n    input: x\n    expect:\n      called:\n        - prix_ttc\n        \
         - {name: prix_ttc, arguments: {taux_tva: 10, note: {b: 2}}}\n        \
         - {name: prix_ttc, arguments: {taux_tva: 20}}\n        - autre\n      \
         not_called: [prix_ttc, envoyer]\n",
    );
    let checks = suite.score(0, &outcome(""));
    assert_eq!(
        failed(&checks),
        vec![
            "called prix_ttc with {\"taux_tva\":20}",
            "called autre",
            "not_called prix_ttc"
        ]
    );
    let detail = |name: &str| {
        checks
            .iter()
            .find(|c| c.expectation == name)
            .and_then(|c| c.detail.clone())
            .unwrap()
    };
    assert!(detail("called autre").contains("autre was not called"));
    assert!(detail("called prix_ttc with {\"taux_tva\":20}").contains("\"taux_tva\":10"));
    assert_eq!(detail("not_called prix_ttc"), "called 1 time(s)");
}

#[test]
fn subset_is_recursive_on_objects_only() {
    assert!(subset(
        &json!({"a": {"b": 1}}),
        &json!({"a": {"b": 1, "c": 2}, "d": 3})
    ));
    assert!(!subset(&json!({"a": [1]}), &json!({"a": [1, 2]})));
    assert!(!subset(&json!({"a": 1}), &json!({"b": 1})));
}

#[test]
fn the_output_schema_reads_the_data_else_the_text_as_json() {
    let suite = suite(
        "  - name: a\n    input: x\n    expect:\n      schema: {type: object, required: [ttc], \
         properties: {ttc: {type: number}}}\n",
    );
    assert!(failed(&suite.score(0, &outcome("{\"ttc\": 1375}"))).is_empty());
    let wrong = suite.score(0, &outcome("{\"ttc\": \"1375\"}"));
    assert_eq!(failed(&wrong), vec!["schema"]);
    assert!(
        wrong[1].detail.as_deref().unwrap().contains("/ttc"),
        "{wrong:?}"
    );
    let text = suite.score(0, &outcome("1 375 €"));
    assert!(text[1].detail.as_deref().unwrap().contains("not JSON"));
    let mut data = outcome("not json");
    data.data = Some(json!({"ttc": 1.5}));
    assert!(failed(&suite.score(0, &data)).is_empty());
}

#[test]
fn the_cost_ceiling_of_the_case_wins_over_the_suite() {
    let text = "version: 1\nname: s\nagent: devis\nmax_cost_usd: 0.01\ncases:\n  - name: a\n    \
                input: x\n  - name: b\n    input: x\n    expect: {max_cost_usd: 0.001}\n";
    let suite = Suite::from_yaml(text, "suite.yaml", ".").unwrap();
    assert!(failed(&suite.score(0, &outcome(""))).is_empty());
    let checks = suite.score(1, &outcome(""));
    assert_eq!(failed(&checks), vec!["cost at most 0.001 $"]);
    assert_eq!(checks[1].detail.as_deref(), Some("the run cost 0.002000 $"));
}

#[test]
fn criteria_are_scored_from_the_eval_judge_and_missing_scores_fail() {
    let suite = suite(
        "  - name: a\n    input: x\n    criteria:\n      - Le montant est exact.\n      \
         - {name: poli, rule: Poli., min_score: 0.5}\n",
    );
    let criteria = suite.criteria(0);
    assert_eq!(criteria[0].name, "c1");
    assert_eq!(criteria[0].min_score, DEFAULT_MIN_SCORE);
    assert_eq!(criteria[1].min_score, 0.5);
    assert!(criteria.iter().all(|c| !c.blocking));
    let mut seen = outcome("");
    seen.verdict = vec![
        ("c1".into(), 0.9, 0.8, None),
        ("poli".into(), 0.2, 0.5, Some("pas de bonjour".into())),
    ];
    let checks = suite.score(0, &seen);
    assert_eq!(failed(&checks), vec!["criterion poli (at least 0.50)"]);
    assert_eq!(
        checks[2].detail.as_deref(),
        Some("scored 0.20: pas de bonjour")
    );
    seen.verdict.clear();
    assert_eq!(failed(&suite.score(0, &seen)).len(), 2);
}

#[test]
fn a_refused_side_effect_fails_the_case_first() {
    let suite = suite("  - name: a\n    input: x\n");
    let mut seen = outcome("");
    seen.refused = vec!["tool envoyer_relance has side effects and no double (call c1)".into()];
    let checks = suite.score(0, &seen);
    assert_eq!(
        checks[0].detail.as_deref(),
        Some("tool envoyer_relance has side effects and no double (call c1): refused, never run")
    );
    assert!(!checks[0].passed);
}

#[test]
fn bad_suites_are_refused_with_their_location() {
    let error = |text: &str| {
        Suite::from_yaml(text, "suite.yaml", ".")
            .unwrap_err()
            .to_string()
    };
    let head = "version: 1\nname: s\nagent: devis\ncases:\n";
    assert_eq!(
        error(&format!(
            "{head}  - name: a\n    input: x\n    expect: {{contain: [x]}}\n"
        )),
        "suite.yaml:7:14 cases[0].expect.contain: unknown key 'contain' (expected one of: \
         status, contains, not_contains, matches, schema, fields, called, not_called, state, \
         max_cost_usd)"
    );
    assert!(
        error(&format!(
            "{head}  - name: a\n    input: x\n    expect: {{matches: ['(']}}\n"
        ))
        .starts_with("suite.yaml:7:24 cases[0].expect.matches[0]: not a regular expression")
    );
    let twice = error(&format!(
        "{head}  - name: a\n    input: x\n  - name: a\n    input: z\n"
    ));
    assert!(
        twice.starts_with("suite.yaml:7:11 cases[1].name: case 'a' is declared twice"),
        "{twice}"
    );
    assert!(
        error(&format!(
            "{head}  - name: a\n    input: x\n    criteria: [poli]\n"
        ))
        .contains("cases[0].criteria: criteria are scored by the suite's judge")
    );
    assert!(error("version: 1\nname: s\nagent: devis\ncases: []\n").contains("cases: a suite"));
    assert!(
        error("version: 1\nname: s\ncases:\n  - {name: a, input: x}\n")
            .contains("missing required key 'agent'")
    );
}

#[test]
fn fields_and_state_read_values_regexes_and_escaped_values() {
    let suite = suite(
        "  - name: a\n    input: x\n    repeat: 2\n    expect:\n      fields:\n        \
         /ttc: 1375\n        /ref: {matches: '^D-'}\n        /form: {equals: {matches: x}}\n      \
         state: {zone: {matches: Paris}, visits: 3}\n",
    );
    assert_eq!(suite.repeat(0), 2);
    let mut seen = outcome("");
    seen.data = Some(json!({"ttc": 1375, "ref": "D-1", "form": {"matches": "x"}}));
    seen.state = [
        ("zone".to_owned(), json!("Europe/Paris")),
        ("visits".to_owned(), json!(3)),
    ]
    .into_iter()
    .collect();
    assert!(
        failed(&suite.score(0, &seen)).is_empty(),
        "{:?}",
        suite.score(0, &seen)
    );
    seen.data = Some(json!({"ttc": "1375", "ref": 7}));
    seen.state.remove("visits");
    let checks = suite.score(0, &seen);
    assert_eq!(
        failed(&checks),
        vec![
            "field /form = {\"matches\":\"x\"}",
            "field /ref matches /^D-/",
            "field /ttc = 1375",
            "state visits = 3"
        ]
    );
    let text = suite.score(0, &outcome("pas du JSON"));
    assert!(
        text.iter()
            .any(|c| c.detail.as_deref().is_some_and(|d| d.contains("not JSON"))),
        "{text:?}"
    );
}
