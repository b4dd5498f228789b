//! The pure parts of the search pipeline (reference A.7): reciprocal rank fusion of the dense and
//! sparse candidate lists, the reranked order, and the grouping into hits.

use std::collections::HashMap;

use crate::model::Hit;
use crate::store::{ChunkPayload, ScoredChunk};
use crate::text::{char_len, round4, snippet};

/// The RRF constant: a candidate at 0-based rank `pos` in a list scores `1 / (pos + RRF_K)`.
pub const RRF_K: usize = 2;

/// A candidate after fusion.
#[derive(Debug, Clone, PartialEq)]
pub struct Fused {
    /// The chunk.
    pub chunk: ChunkPayload,
    /// Its RRF score, `Σ 1 / (pos0 + 2)` over the lists it appears in.
    pub score: f64,
}

/// Reciprocal rank fusion of ranked lists (dense first, then sparse), the best `limit`.
/// A chunk is identified by `(doc_id, index)`; ties keep first-seen order (the first list's
/// order first), as the Python `sorted(..., reverse=True)` over an insertion-ordered dict does.
pub fn rrf(lists: &[&[ScoredChunk]], limit: usize) -> Vec<Fused> {
    let mut fused: Vec<Fused> = Vec::new();
    let mut position: HashMap<(String, usize), usize> = HashMap::new();
    for list in lists {
        for (pos, candidate) in list.iter().enumerate() {
            let add = 1.0 / (pos + RRF_K) as f64;
            let key = (candidate.chunk.doc_id.clone(), candidate.chunk.index);
            match position.get(&key) {
                Some(&i) => fused[i].score += add,
                None => {
                    position.insert(key, fused.len());
                    fused.push(Fused {
                        chunk: candidate.chunk.clone(),
                        score: add,
                    });
                }
            }
        }
    }
    fused.sort_by(|a, b| b.score.total_cmp(&a.score));
    fused.truncate(limit);
    fused
}

/// The passage the reranker scores for a chunk: `heading_path + "\n\n" + text`.
pub fn passage(chunk: &ChunkPayload) -> String {
    format!("{}\n\n{}", chunk.heading_path, chunk.text)
}

/// Candidates paired with their reranker scores, best first; a stable sort, so ties keep the
/// fusion's order.
pub fn rerank_order(candidates: Vec<ChunkPayload>, scores: &[f32]) -> Vec<(ChunkPayload, f64)> {
    let mut ranked: Vec<(ChunkPayload, f64)> = candidates
        .into_iter()
        .zip(scores.iter().map(|s| f64::from(*s)))
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked
}

/// How ranked chunks become hits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grouping {
    /// At most this many hits.
    pub k: usize,
    /// The walk stops at the first score below this.
    pub threshold: f64,
    /// Hits per document (`MAX_CHUNKS_PER_DOC`); further chunks of a document are skipped.
    pub max_per_doc: usize,
    /// Chunks up to this length are shown whole (`FULL_CHUNK_CHARS`).
    pub full_chunk_chars: usize,
    /// The extract's length for longer chunks (`SNIPPET_CHARS`).
    pub snippet_chars: usize,
}

/// Walks the ranked chunks: a score under the threshold stops the walk, a document that already
/// has `max_per_doc` hits is skipped, the walk ends at `k` hits. Scores are rounded to 4
/// decimals; a chunk longer than `full_chunk_chars` is shown as a [`snippet`].
pub fn group(ranked: &[(ChunkPayload, f64)], rules: &Grouping) -> Vec<Hit> {
    let mut per_doc: HashMap<&str, usize> = HashMap::new();
    let mut hits = Vec::new();
    for (chunk, score) in ranked {
        if *score < rules.threshold {
            break;
        }
        let seen = per_doc.entry(chunk.doc_id.as_str()).or_default();
        if *seen >= rules.max_per_doc {
            continue;
        }
        *seen += 1;
        let short = char_len(&chunk.text) <= rules.full_chunk_chars;
        hits.push(Hit {
            doc_id: chunk.doc_id.clone(),
            title: chunk.title.clone(),
            project: chunk.project.clone(),
            score: round4(*score),
            snippet: if short {
                chunk.text.clone()
            } else {
                snippet(&chunk.text, rules.snippet_chars)
            },
            truncated: !short,
            heading_path: chunk.heading_path.clone(),
            source: chunk.source.clone(),
            added_at: chunk.added_at.clone(),
        });
        if hits.len() >= rules.k {
            break;
        }
    }
    hits
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(doc: &str, index: usize, text: &str) -> ChunkPayload {
        ChunkPayload {
            doc_id: doc.to_owned(),
            index,
            heading_path: format!("Title {doc}"),
            text: text.to_owned(),
            title: format!("Title {doc}"),
            project: "p".to_owned(),
            tags: Vec::new(),
            source: None,
            added_at: "2026-11-29T11:56:00.861794+00:00".to_owned(),
        }
    }

    fn scored(doc: &str, index: usize) -> ScoredChunk {
        ScoredChunk {
            chunk: chunk(doc, index, "t"),
            score: 0.0,
        }
    }

    fn ids(fused: &[Fused]) -> Vec<(String, usize)> {
        fused
            .iter()
            .map(|f| (f.chunk.doc_id.clone(), f.chunk.index))
            .collect()
    }

    fn rules(k: usize, threshold: f64) -> Grouping {
        Grouping {
            k,
            threshold,
            max_per_doc: 2,
            full_chunk_chars: 1000,
            snippet_chars: 300,
        }
    }

    #[test]
    fn rrf_sums_reciprocal_ranks_with_k_2() {
        let dense = [scored("a", 0), scored("b", 0), scored("c", 0)];
        let sparse = [scored("c", 0), scored("a", 0)];
        let fused = rrf(&[&dense, &sparse], 20);
        // a: 1/2 + 1/3, c: 1/4 + 1/2, b: 1/3.
        assert_eq!(
            ids(&fused),
            vec![("a".into(), 0), ("c".into(), 0), ("b".into(), 0)]
        );
        assert!((fused[0].score - (0.5 + 1.0 / 3.0)).abs() < 1e-12);
        assert!((fused[1].score - 0.75).abs() < 1e-12);
        assert!((fused[2].score - 1.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn rrf_ties_keep_first_seen_order_dense_first() {
        let dense = [scored("a", 0), scored("b", 0)];
        let sparse = [scored("c", 0), scored("d", 0)];
        let fused = rrf(&[&dense, &sparse], 3);
        // a and c tie at 1/2, b and d at 1/3: dense's first.
        assert_eq!(
            ids(&fused),
            vec![("a".into(), 0), ("c".into(), 0), ("b".into(), 0)]
        );
        // Same doc, other chunk index: another candidate.
        let fused = rrf(&[&[scored("a", 0)], &[scored("a", 1)]], 20);
        assert_eq!(ids(&fused), vec![("a".into(), 0), ("a".into(), 1)]);
    }

    #[test]
    fn rerank_is_a_stable_descending_sort() {
        let candidates = vec![chunk("a", 0, "x"), chunk("b", 0, "x"), chunk("c", 0, "x")];
        let ranked = rerank_order(candidates, &[0.5, 1.0, 0.5]);
        let order: Vec<&str> = ranked.iter().map(|(c, _)| c.doc_id.as_str()).collect();
        assert_eq!(order, vec!["b", "a", "c"]);
        assert_eq!(passage(&ranked[0].0), "Title b\n\nx");
    }

    #[test]
    fn grouping_stops_under_threshold_and_caps_per_doc() {
        let ranked = vec![
            (chunk("a", 0, "x"), 0.9),
            (chunk("a", 1, "x"), 0.8),
            (chunk("a", 2, "x"), 0.7),
            (chunk("b", 0, "x"), 0.66666),
            (chunk("c", 0, "x"), 0.05),
            (chunk("d", 0, "x"), 0.5),
        ];
        let hits = group(&ranked, &rules(10, 0.1));
        let got: Vec<(&str, f64)> = hits.iter().map(|h| (h.doc_id.as_str(), h.score)).collect();
        assert_eq!(got, vec![("a", 0.9), ("a", 0.8), ("b", 0.6667)]);
        let hits = group(&ranked, &rules(2, 0.0));
        assert_eq!(hits.len(), 2);
        let hits = group(&ranked, &rules(10, 0.0));
        assert_eq!(hits.len(), 5);
        assert_eq!(hits[4].doc_id, "d");
    }

    #[test]
    fn long_chunks_become_snippets() {
        let long = "mot ".repeat(300);
        let exact = "y".repeat(1000);
        let ranked = vec![
            (chunk("a", 0, &long), 1.0),
            (chunk("b", 0, &exact), 1.0),
            (chunk("c", 0, "court\ntexte"), 1.0),
        ];
        let hits = group(&ranked, &rules(10, 0.1));
        assert!(hits[0].truncated);
        assert_eq!(char_len(&hits[0].snippet), 300);
        assert!(hits[0].snippet.ends_with("mot…"));
        assert!(!hits[1].truncated);
        assert_eq!(hits[1].snippet, exact);
        assert_eq!(hits[2].snippet, "court\ntexte");
        assert_eq!(hits[2].heading_path, "Title c");
        assert_eq!(hits[2].added_at, "2026-11-29T11:56:00.861794+00:00");
    }
}
