//! Retrieval evaluation on a golden set (reference A.12): recall@1, recall@5, MRR, and the
//! highest `min_score` that loses no found case, with the share of noise it would filter.

use serde::{Deserialize, Serialize};

use crate::model::Hit;
use crate::text::round_to;

/// One golden case: a query and the document it should find (a line of `golden.jsonl`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvalCase {
    /// The query.
    pub query: String,
    /// The expected document.
    pub doc_id: String,
    /// The document's title, for the reader of the file only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The project the search is restricted to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
}

/// What one case gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseResult {
    /// The case's query.
    pub query: String,
    /// The expected document.
    pub doc_id: String,
    /// The expected document's 1-based rank among the hits' distinct documents, `None` if
    /// absent.
    pub rank: Option<usize>,
    /// The score of the expected document's first hit.
    pub expected_score: Option<f64>,
    /// The first hit's document.
    pub top_doc_id: Option<String>,
    /// The first hit's score.
    pub top_score: Option<f64>,
}

/// The evaluation of a golden set (`eval --json` prints it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    /// The number of cases.
    pub cases: usize,
    /// Share of cases whose document ranks first.
    pub recall_at_1: f64,
    /// Share of cases whose document ranks in the first 5.
    pub recall_at_5: f64,
    /// Mean reciprocal rank (absent = 0), unrounded.
    pub mrr: f64,
    /// The highest threshold losing no found case: the lowest expected score, rounded to 3
    /// decimals; `None` when no case was found.
    pub suggested_min_score: Option<f64>,
    /// Share of the other documents' hits scoring under the suggestion, rounded to 3
    /// decimals; `None` without a suggestion or without such hits.
    pub noise_removed_at_suggested: Option<f64>,
    /// One result per case, in order.
    pub results: Vec<CaseResult>,
}

/// The result of one case from its hits (searched with `min_score` 0).
pub fn case_result(case: &EvalCase, hits: &[Hit]) -> CaseResult {
    let mut docs: Vec<&str> = Vec::new();
    for hit in hits {
        if !docs.contains(&hit.doc_id.as_str()) {
            docs.push(&hit.doc_id);
        }
    }
    CaseResult {
        query: case.query.clone(),
        doc_id: case.doc_id.clone(),
        rank: docs.iter().position(|d| *d == case.doc_id).map(|i| i + 1),
        expected_score: hits
            .iter()
            .find(|h| h.doc_id == case.doc_id)
            .map(|h| h.score),
        top_doc_id: hits.first().map(|h| h.doc_id.clone()),
        top_score: hits.first().map(|h| h.score),
    }
}

/// The report over every case and its hits, in order.
pub fn evaluate<'a>(runs: impl IntoIterator<Item = (&'a EvalCase, &'a [Hit])>) -> EvalReport {
    let mut results = Vec::new();
    let mut positives: Vec<f64> = Vec::new();
    let mut negatives: Vec<f64> = Vec::new();
    for (case, hits) in runs {
        let result = case_result(case, hits);
        positives.extend(result.expected_score);
        negatives.extend(
            hits.iter()
                .filter(|h| h.doc_id != case.doc_id)
                .map(|h| h.score),
        );
        results.push(result);
    }
    let n = results.len();
    let share = |count: usize| if n == 0 { 0.0 } else { count as f64 / n as f64 };
    let ranks: Vec<usize> = results.iter().filter_map(|r| r.rank).collect();
    let suggested = positives
        .iter()
        .copied()
        .reduce(f64::min)
        .map(|min| round_to(min, 3));
    let noise = match suggested {
        Some(threshold) if !negatives.is_empty() => {
            let under = negatives.iter().filter(|s| **s < threshold).count();
            Some(round_to(under as f64 / negatives.len() as f64, 3))
        }
        _ => None,
    };
    EvalReport {
        cases: n,
        recall_at_1: share(ranks.iter().filter(|r| **r == 1).count()),
        recall_at_5: share(ranks.iter().filter(|r| **r <= 5).count()),
        mrr: if n == 0 {
            0.0
        } else {
            // From 0.0: an empty f64 `sum()` is -0.0, which would print `-0.00`.
            ranks.iter().fold(0.0, |sum, r| sum + 1.0 / *r as f64) / n as f64
        },
        suggested_min_score: suggested,
        noise_removed_at_suggested: noise,
        results,
    }
}

/// Python's `repr` of a float in 0..=1 (always with a decimal point: `0.0`, `0.667`).
fn py_float(x: f64) -> String {
    let s = x.to_string();
    if s.contains(['.', 'e', 'N', 'i']) {
        s
    } else {
        format!("{s}.0")
    }
}

impl EvalReport {
    /// The text report of `loom-notes eval` (the reference's layout, in English): one line per
    /// case (`ok ` rank 1, `~  ` found lower, `KO ` absent; the rank right-aligned in 7; the
    /// expected score with 3 decimals or `  -  `), a blank line, the metrics, and the suggested
    /// threshold when there is one. Ends with a newline.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        for r in &self.results {
            let mark = match r.rank {
                Some(1) => "ok ",
                Some(_) => "~  ",
                None => "KO ",
            };
            let rank = r
                .rank
                .map_or_else(|| "absent".to_owned(), |n| format!("#{n}"));
            let score = r
                .expected_score
                .map_or_else(|| "  -  ".to_owned(), |s| format!("{s:.3}"));
            out.push_str(&format!("{mark} {rank:>7}  {score}  {}\n", r.query));
        }
        out.push_str(&format!(
            "\n{} cases — recall@1 {:.2}  recall@5 {:.2}  MRR {:.2}\n",
            self.cases, self.recall_at_1, self.recall_at_5, self.mrr
        ));
        if let Some(suggested) = self.suggested_min_score {
            let suggested = py_float(suggested);
            match self.noise_removed_at_suggested {
                Some(noise) => out.push_str(&format!(
                    "suggested min_score: {suggested} (no case lost; {:.0}% of the noise filtered)\n",
                    noise * 100.0
                )),
                None => out.push_str(&format!("suggested min_score: {suggested}\n")),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(doc: &str, score: f64) -> Hit {
        Hit {
            doc_id: doc.to_owned(),
            title: doc.to_owned(),
            project: "p".to_owned(),
            score,
            snippet: String::new(),
            truncated: false,
            heading_path: doc.to_owned(),
            source: None,
            added_at: String::new(),
        }
    }

    fn case(query: &str, doc: &str) -> EvalCase {
        EvalCase {
            query: query.to_owned(),
            doc_id: doc.to_owned(),
            title: None,
            project: None,
        }
    }

    /// The reference's sample run: ranks 1, 1, 2, 1 with scores 1, 1, 0, 0.
    fn sample() -> EvalReport {
        let cases = [
            case("fusion RRF qdrant", "a"),
            case("port gRPC", "b"),
            case("conteneur docker", "c"),
            case("licorne", "d"),
        ];
        let hits = [
            vec![hit("a", 1.0), hit("b", 0.0)],
            vec![hit("b", 1.0), hit("b", 0.5), hit("a", 0.0)],
            vec![hit("a", 0.0), hit("c", 0.0)],
            vec![hit("d", 0.0), hit("a", 0.0)],
        ];
        evaluate(cases.iter().zip(hits.iter().map(Vec::as_slice)))
    }

    #[test]
    fn metrics_of_the_reference_sample() {
        let report = sample();
        assert_eq!(report.cases, 4);
        assert_eq!(report.recall_at_1, 0.75);
        assert_eq!(report.recall_at_5, 1.0);
        assert_eq!(report.mrr, 0.875);
        assert_eq!(report.suggested_min_score, Some(0.0));
        assert_eq!(report.noise_removed_at_suggested, Some(0.0));
        assert_eq!(report.results[2].rank, Some(2));
        assert_eq!(report.results[2].top_doc_id.as_deref(), Some("a"));
        assert_eq!(report.results[1].expected_score, Some(1.0));
    }

    #[test]
    fn text_report_has_the_reference_layout() {
        assert_eq!(
            sample().render_text(),
            "ok       #1  1.000  fusion RRF qdrant\n\
             ok       #1  1.000  port gRPC\n\
             ~        #2  0.000  conteneur docker\n\
             ok       #1  0.000  licorne\n\
             \n\
             4 cases — recall@1 0.75  recall@5 1.00  MRR 0.88\n\
             suggested min_score: 0.0 (no case lost; 0% of the noise filtered)\n"
        );
    }

    #[test]
    fn absent_cases_and_noise() {
        let cases = [case("q1", "a"), case("q2", "zz")];
        let hits = [
            vec![hit("a", 0.6667), hit("b", 0.3333), hit("c", 0.9)],
            vec![hit("b", 0.2)],
        ];
        let report = evaluate(cases.iter().zip(hits.iter().map(Vec::as_slice)));
        assert_eq!(report.results[1].rank, None);
        assert_eq!(report.results[1].expected_score, None);
        assert_eq!(report.recall_at_1, 0.5);
        assert_eq!(report.mrr, 0.5);
        assert_eq!(report.suggested_min_score, Some(0.667));
        // Negatives 0.3333, 0.9, 0.2: two of three under 0.667.
        assert_eq!(report.noise_removed_at_suggested, Some(0.667));
        let text = report.render_text();
        assert!(text.contains("KO   absent    -    q2\n"), "{text}");
        assert!(
            text.ends_with(
                "suggested min_score: 0.667 (no case lost; 67% of the noise filtered)\n"
            )
        );
    }

    #[test]
    fn nothing_found_gives_no_suggestion() {
        let cases = [case("q", "a")];
        let hits = [Vec::new()];
        let report = evaluate(cases.iter().zip(hits.iter().map(Vec::as_slice)));
        assert_eq!(report.suggested_min_score, None);
        assert_eq!(report.noise_removed_at_suggested, None);
        assert_eq!(report.results[0].top_score, None);
        let text = report.render_text();
        assert!(text.ends_with("MRR 0.00\n"), "{text:?}");
        let empty = evaluate(std::iter::empty());
        assert_eq!((empty.cases, empty.mrr, empty.recall_at_1), (0, 0.0, 0.0));
        // A suggestion without negatives prints no noise share.
        let hits = [vec![hit("a", 0.5)]];
        let report = evaluate(cases.iter().zip(hits.iter().map(Vec::as_slice)));
        assert!(report.render_text().ends_with("suggested min_score: 0.5\n"));
    }

    #[test]
    fn json_shapes() {
        let mut c = case("port gRPC", "1e09");
        assert_eq!(
            serde_json::to_string(&c).expect("json"),
            r#"{"query":"port gRPC","doc_id":"1e09"}"#
        );
        c.title = Some("Guide Qdrant".into());
        c.project = Some("other".into());
        assert_eq!(
            serde_json::to_string(&c).expect("json"),
            r#"{"query":"port gRPC","doc_id":"1e09","title":"Guide Qdrant","project":"other"}"#
        );
        let parsed: EvalCase = serde_json::from_str(r#"{"query":"q","doc_id":"d"}"#).expect("json");
        assert_eq!(parsed, case("q", "d"));
        let report = serde_json::to_value(sample()).expect("json");
        let keys: Vec<&String> = report.as_object().expect("object").keys().collect();
        assert_eq!(
            keys,
            vec![
                "cases",
                "recall_at_1",
                "recall_at_5",
                "mrr",
                "suggested_min_score",
                "noise_removed_at_suggested",
                "results"
            ]
        );
        assert_eq!(report["mrr"], serde_json::json!(0.875));
        assert_eq!(report["results"][0]["rank"], serde_json::json!(1));
    }
}
