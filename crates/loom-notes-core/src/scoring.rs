//! Exact brute-force scoring of stored chunks (reference C.3), shared by the stores: cosine top-N
//! over the chunks passing a filter, and sparse dot-product top-N over the chunks sharing at
//! least one index with the query. This is what the Python version's embedded mode (qdrant-client
//! local mode) runs, so results match it.

use std::cmp::Ordering;

use crate::ports::SparseVector;
use crate::store::{ChunkFilter, ChunkPayload, ScoredChunk};

/// A stored chunk with its vectors, as held in memory for scoring.
#[derive(Debug, Clone, PartialEq)]
pub struct VectorRow {
    /// The chunk and its payload.
    pub payload: ChunkPayload,
    /// The dense vector, L2-normalised by [`unit()`] (or all zeros).
    pub dense: Vec<f32>,
    /// The sparse vector (indices ascending).
    pub sparse: SparseVector,
}

/// `v` scaled to unit length (Qdrant normalises vectors of a cosine collection on insertion); a
/// zero vector stays zero.
pub fn unit(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm == 0.0 || !norm.is_finite() {
        return v.to_vec();
    }
    v.iter().map(|x| x / norm).collect()
}

/// The dot product of two dense vectors (over the shorter length), summed in 8 lanes so that
/// the compiler vectorises it.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut lanes = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (a8.remainder(), b8.remainder());
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    lanes.iter().sum::<f32>() + tail
}

/// The dot product of two sparse vectors with ascending indices; `None` when they share no index.
pub fn sparse_dot(a: &SparseVector, b: &SparseVector) -> Option<f32> {
    let (mut i, mut j) = (0, 0);
    let mut sum = 0f32;
    let mut overlap = false;
    while i < a.indices.len() && j < b.indices.len() {
        match a.indices[i].cmp(&b.indices[j]) {
            Ordering::Less => i += 1,
            Ordering::Greater => j += 1,
            Ordering::Equal => {
                overlap = true;
                sum += a.values.get(i).copied().unwrap_or(0.0)
                    * b.values.get(j).copied().unwrap_or(0.0);
                i += 1;
                j += 1;
            }
        }
    }
    overlap.then_some(sum)
}

/// The best `limit` of `(position, score)` pairs: score descending, then the latest position
/// first (qdrant-client's local mode reverses an ascending argsort, so among equal scores the
/// most recently written point comes first).
fn best(mut scored: Vec<(usize, f32)>, limit: usize) -> Vec<(usize, f32)> {
    let order = |a: &(usize, f32), b: &(usize, f32)| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0));
    if scored.len() > limit && limit > 0 {
        scored.select_nth_unstable_by(limit - 1, order);
        scored.truncate(limit);
    }
    scored.sort_by(order);
    scored.truncate(limit);
    scored
}

fn collect(rows: &[VectorRow], best: Vec<(usize, f32)>) -> Vec<ScoredChunk> {
    best.into_iter()
        .map(|(i, score)| ScoredChunk {
            chunk: rows[i].payload.clone(),
            score,
        })
        .collect()
}

/// The `limit` rows passing `filter` with the highest cosine similarity to `query` (rows are in
/// write order, oldest first). Every passing row is a candidate, even at score 0.
pub fn dense_top(
    rows: &[VectorRow],
    query: &[f32],
    filter: &ChunkFilter,
    limit: usize,
) -> Vec<ScoredChunk> {
    let query = unit(query);
    let scored = rows
        .iter()
        .enumerate()
        .filter(|(_, row)| filter.matches(&row.payload.project, &row.payload.tags))
        .map(|(i, row)| {
            let dot = row
                .dense
                .iter()
                .zip(&query)
                .map(|(a, b)| a * b)
                .sum::<f32>();
            (i, dot)
        })
        .collect();
    collect(rows, best(scored, limit))
}

/// The `limit` rows passing `filter` with the highest dot product with `query`, among the rows
/// sharing at least one index with it (rows in write order, oldest first).
pub fn sparse_top(
    rows: &[VectorRow],
    query: &SparseVector,
    filter: &ChunkFilter,
    limit: usize,
) -> Vec<ScoredChunk> {
    let scored = rows
        .iter()
        .enumerate()
        .filter(|(_, row)| filter.matches(&row.payload.project, &row.payload.tags))
        .filter_map(|(i, row)| sparse_dot(&row.sparse, query).map(|s| (i, s)))
        .collect();
    collect(rows, best(scored, limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        doc: &str,
        project: &str,
        tags: &[&str],
        dense: &[f32],
        sparse: &[(u32, f32)],
    ) -> VectorRow {
        VectorRow {
            payload: ChunkPayload {
                doc_id: doc.to_owned(),
                index: 0,
                heading_path: doc.to_owned(),
                text: doc.to_owned(),
                title: doc.to_owned(),
                project: project.to_owned(),
                tags: tags.iter().map(|t| (*t).to_owned()).collect(),
                source: None,
                added_at: String::new(),
            },
            dense: unit(dense),
            sparse: SparseVector {
                indices: sparse.iter().map(|(i, _)| *i).collect(),
                values: sparse.iter().map(|(_, v)| *v).collect(),
            },
        }
    }

    fn docs(hits: &[ScoredChunk]) -> Vec<&str> {
        hits.iter().map(|h| h.chunk.doc_id.as_str()).collect()
    }

    #[test]
    fn dense_is_cosine_with_filter_and_recent_first_ties() {
        let rows = vec![
            row("a", "p", &["x"], &[1.0, 0.0], &[]),
            row("b", "p", &[], &[3.0, 3.0], &[]),
            row("c", "q", &["x", "y"], &[0.0, 2.0], &[]),
            row("d", "p", &["x"], &[5.0, 0.0], &[]),
        ];
        let all = ChunkFilter::default();
        let hits = dense_top(&rows, &[2.0, 0.0], &all, 10);
        // a and d tie at 1.0: the later one (d) first; c scores 0 and is still a candidate.
        assert_eq!(docs(&hits), vec!["d", "a", "b", "c"]);
        assert!((hits[2].score - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6);
        assert_eq!(
            docs(&dense_top(&rows, &[2.0, 0.0], &all, 2)),
            vec!["d", "a"]
        );
        let project = ChunkFilter {
            project: Some("q".into()),
            tags: vec![],
        };
        assert_eq!(
            docs(&dense_top(&rows, &[1.0, 0.0], &project, 10)),
            vec!["c"]
        );
        let tags = ChunkFilter {
            project: None,
            tags: vec!["x".into(), "y".into()],
        };
        assert_eq!(docs(&dense_top(&rows, &[1.0, 0.0], &tags, 10)), vec!["c"]);
        let tag = ChunkFilter {
            project: Some("p".into()),
            tags: vec!["x".into()],
        };
        assert_eq!(
            docs(&dense_top(&rows, &[0.0, 1.0], &tag, 10)),
            vec!["d", "a"]
        );
        // A zero query scores every row 0.
        let zero = dense_top(&rows, &[0.0, 0.0], &all, 10);
        assert!(zero.iter().all(|h| h.score == 0.0));
        assert_eq!(docs(&zero), vec!["d", "c", "b", "a"]);
    }

    #[test]
    fn sparse_skips_rows_without_overlap() {
        let rows = vec![
            row("a", "p", &[], &[1.0], &[(1, 1.0), (5, 2.0)]),
            row("b", "p", &[], &[1.0], &[(2, 1.0)]),
            row("c", "p", &[], &[1.0], &[(5, 1.0), (9, 3.0)]),
            row("d", "p", &[], &[1.0], &[(1, 2.0)]),
        ];
        let query = SparseVector {
            indices: vec![1, 5, 9],
            values: vec![1.0, 1.0, 1.0],
        };
        let hits = sparse_top(&rows, &query, &ChunkFilter::default(), 10);
        // a = 3, c = 4, d = 2; b shares nothing.
        assert_eq!(docs(&hits), vec!["c", "a", "d"]);
        assert_eq!(hits[0].score, 4.0);
        let empty = SparseVector::default();
        assert!(sparse_top(&rows, &empty, &ChunkFilter::default(), 10).is_empty());
        assert_eq!(sparse_dot(&rows[1].sparse, &query), None);
    }

    #[test]
    fn dense_dot_covers_lanes_and_tail() {
        let a: Vec<f32> = (1..=19).map(|x| x as f32).collect();
        let b = vec![1.0; 19];
        assert_eq!(dot(&a, &b), 190.0);
        assert_eq!(dot(&a[..3], &b), 6.0);
        assert_eq!(dot(&[], &b), 0.0);
    }

    #[test]
    fn unit_keeps_zero_vectors() {
        assert_eq!(unit(&[0.0, 0.0]), vec![0.0, 0.0]);
        assert_eq!(unit(&[3.0, 4.0]), vec![0.6, 0.8]);
    }
}
