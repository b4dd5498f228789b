//! The labelled eval set (`eval/corpus.jsonl`, `eval/golden.jsonl`) imported and evaluated with
//! the fake models through the binary: the report has the reference's shape (A.12), its figures
//! are the ones its own per-case ranks give, and the fake models reach the recorded floor.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;

use common::Notes;
use serde_json::Value;

/// The floor of recall@5 the fake models reach on the set (0.79 measured, see `eval/README.md`).
/// The fake embedder only sees shared words and the queries paraphrase; the test fails if a
/// change to search, to the fake models or to the set drops it below this.
const FAKE_RECALL_AT_5_FLOOR: f64 = 0.75;

fn eval_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("eval")
}

fn json_lines(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(eval_dir().join(name)).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}: {e}: {l}")))
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn the_eval_set_is_consistent() {
    let docs = json_lines("corpus.jsonl");
    let cases = json_lines("golden.jsonl");
    assert!((40..=60).contains(&docs.len()), "{} documents", docs.len());
    assert!((60..=80).contains(&cases.len()), "{} cases", cases.len());
    let projects: HashMap<&str, &str> = docs
        .iter()
        .map(|d| {
            (
                d["doc_id"].as_str().unwrap(),
                d["project"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(projects.len(), docs.len(), "duplicate doc_id");
    for case in &cases {
        let id = case["doc_id"].as_str().unwrap();
        let project = projects
            .get(id)
            .unwrap_or_else(|| panic!("unknown doc: {case}"));
        if let Some(filter) = case.get("project") {
            assert_eq!(filter.as_str().unwrap(), *project, "{case}");
        }
    }
    assert!(cases.iter().filter(|c| c.get("project").is_some()).count() >= 3);
}

#[test]
fn the_fake_models_are_evaluated_on_the_eval_set() {
    let docs = json_lines("corpus.jsonl");
    let cases = json_lines("golden.jsonl");
    let projects: HashMap<&str, &str> = docs
        .iter()
        .map(|d| {
            (
                d["doc_id"].as_str().unwrap(),
                d["project"].as_str().unwrap(),
            )
        })
        .collect();
    let corpus = eval_dir().join("corpus.jsonl");
    let golden = eval_dir().join("golden.jsonl");
    let golden = golden.to_str().unwrap();

    let notes = Notes::new();
    assert_eq!(
        notes.run(&["import", corpus.to_str().unwrap()]).ok(),
        format!("{} imported, 0 skipped\n", docs.len())
    );

    let report = notes.run(&["eval", golden, "--json"]).json();
    assert_eq!(report["cases"], cases.len());
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), cases.len());

    // Each result is its case's, and the figures are the ones its ranks give.
    let (mut at_1, mut at_5, mut reciprocal) = (0usize, 0usize, 0.0f64);
    for (case, result) in cases.iter().zip(results) {
        assert_eq!(result["query"], case["query"]);
        assert_eq!(result["doc_id"], case["doc_id"]);
        let top = result["top_doc_id"]
            .as_str()
            .expect("every query has a hit");
        if let Some(filter) = case.get("project") {
            assert_eq!(projects[top], filter.as_str().unwrap(), "{result}");
        }
        match result["rank"].as_u64() {
            Some(rank) => {
                assert!((1..=10).contains(&rank), "{result}");
                assert!(result["expected_score"].is_f64(), "{result}");
                at_1 += usize::from(rank == 1);
                at_5 += usize::from(rank <= 5);
                reciprocal += 1.0 / rank as f64;
                if rank == 1 {
                    assert_eq!(result["top_doc_id"], case["doc_id"]);
                    assert_eq!(result["top_score"], result["expected_score"]);
                }
            }
            None => assert!(result["expected_score"].is_null(), "{result}"),
        }
    }
    let n = cases.len() as f64;
    let recall_at_1 = report["recall_at_1"].as_f64().unwrap();
    let recall_at_5 = report["recall_at_5"].as_f64().unwrap();
    let mrr = report["mrr"].as_f64().unwrap();
    assert!(close(recall_at_1, at_1 as f64 / n), "{report}");
    assert!(close(recall_at_5, at_5 as f64 / n), "{report}");
    assert!(close(mrr, reciprocal / n), "{report}");
    assert!(
        recall_at_5 >= FAKE_RECALL_AT_5_FLOOR,
        "recall@5 {recall_at_5} < {FAKE_RECALL_AT_5_FLOOR}"
    );
    assert!(recall_at_1 <= recall_at_5 && recall_at_1 <= mrr && mrr <= 1.0);
    let suggested = report["suggested_min_score"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&suggested), "{report}");

    // The text report ends with the same figures.
    let text = notes.run(&["eval", golden]).ok();
    let summary = format!(
        "{} cases — recall@1 {recall_at_1:.2}  recall@5 {recall_at_5:.2}  MRR {mrr:.2}",
        cases.len()
    );
    assert!(text.contains(&summary), "{summary}\n{text}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok ")).count(),
        at_1,
        "{text}"
    );

    // Every document is one chunk, so the top 5 of k=5 are the top 5 of k=10: same ranks up
    // to 5, same recall@1 and recall@5.
    let short = notes.run(&["eval", golden, "--json", "--k", "5"]).json();
    assert_eq!(short["recall_at_1"], report["recall_at_1"]);
    assert_eq!(short["recall_at_5"], report["recall_at_5"]);
    for (long, short) in results.iter().zip(short["results"].as_array().unwrap()) {
        let expected = long["rank"].as_u64().filter(|r| *r <= 5);
        assert_eq!(short["rank"].as_u64(), expected, "{long} / {short}");
    }
}
