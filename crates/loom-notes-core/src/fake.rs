//! Deterministic fake models (reference A.8), used by the tests and by `--fake`: a hashed
//! bag-of-words dense vector, word counts as the sparse vector, and a reranker scoring the share
//! of the query's words a passage contains.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::LazyLock;

use blake2::Blake2b;
use blake2::digest::{Digest, consts::U4};
use regex::Regex;

use crate::ports::{Embedder, Embedding, ModelError, Reranker, SparseVector};
use crate::text::{casefold, char_len};

/// Python's `\w` on `str`: letters, numbers (any `N` category) and `_`, but not combining marks
/// (Rust's `\w` would take marks and connector punctuation too).
#[allow(clippy::expect_used)] // constant pattern, checked by the tests
static WORD: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"[\p{L}\p{N}_]+").expect("word pattern"));

/// The dimension of the fake dense vectors.
pub const FAKE_DIM: usize = 64;
/// The modulus of the fake sparse indices (2^20).
pub const SPARSE_BUCKETS: u32 = 1 << 20;

/// The words of a text: Unicode `\w+` runs longer than one code point, each case-folded.
pub fn tokens(text: &str) -> Vec<String> {
    WORD.find_iter(text)
        .map(|m| m.as_str())
        .filter(|word| char_len(word) > 1)
        .map(casefold)
        .collect()
}

/// BLAKE2b with a 4-byte digest (a distinct parameterisation, not a truncated BLAKE2b-512):
/// `blake2b4(b"qdrant") == [0xde, 0xda, 0xe7, 0x22]`.
pub fn blake2b4(bytes: &[u8]) -> [u8; 4] {
    Blake2b::<U4>::digest(bytes).into()
}

/// The bucket of a token: the 4-byte BLAKE2b digest of its UTF-8, big-endian, modulo `modulus`.
pub fn bucket(token: &str, modulus: u32) -> u32 {
    u32::from_be_bytes(blake2b4(token.as_bytes())) % modulus.max(1)
}

/// Counts per token, in first-seen order (Python's `Counter`).
fn counts(text: &str) -> Vec<(String, u32)> {
    let mut order: Vec<(String, u32)> = Vec::new();
    let mut position: HashMap<String, usize> = HashMap::new();
    for token in tokens(text) {
        match position.get(&token) {
            Some(&i) => order[i].1 += 1,
            None => {
                position.insert(token.clone(), order.len());
                order.push((token, 1));
            }
        }
    }
    order
}

/// The fake embedder `fake-64`: dense = token counts hashed into 64 buckets, L2-normalised (an
/// empty text gives a zero vector); sparse = token counts hashed into 2^20 buckets, indices
/// ascending. Queries and documents are embedded alike.
#[derive(Debug, Clone, Copy, Default)]
pub struct FakeEmbedder;

impl FakeEmbedder {
    /// The fake embedder.
    pub fn new() -> Self {
        FakeEmbedder
    }

    /// The embedding of one text.
    pub fn embed_one(&self, text: &str) -> Embedding {
        let counts = counts(text);
        let mut dense = [0f64; FAKE_DIM];
        for (token, n) in &counts {
            dense[bucket(token, FAKE_DIM as u32) as usize] += f64::from(*n);
        }
        let norm = dense.iter().map(|x| x * x).sum::<f64>().sqrt();
        let norm = if norm == 0.0 { 1.0 } else { norm };
        let mut sparse: BTreeMap<u32, f64> = BTreeMap::new();
        for (token, n) in &counts {
            *sparse.entry(bucket(token, SPARSE_BUCKETS)).or_default() += f64::from(*n);
        }
        Embedding {
            dense: dense.iter().map(|x| (x / norm) as f32).collect(),
            sparse: SparseVector {
                indices: sparse.keys().copied().collect(),
                values: sparse.values().map(|v| *v as f32).collect(),
            },
        }
    }
}

impl Embedder for FakeEmbedder {
    fn model_name(&self) -> &str {
        "fake-64"
    }

    fn dim(&self) -> usize {
        FAKE_DIM
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Embedding>, ModelError> {
        Ok(texts.iter().map(|text| self.embed_one(text)).collect())
    }

    fn embed_query(&self, text: &str) -> Result<Embedding, ModelError> {
        Ok(self.embed_one(text))
    }
}

/// The fake reranker `fake-reranker`: the share of the query's distinct tokens found in the
/// passage (0.0 for every passage when the query has no token).
#[derive(Debug, Clone, Copy, Default)]
pub struct FakeReranker;

impl FakeReranker {
    /// The fake reranker.
    pub fn new() -> Self {
        FakeReranker
    }
}

impl Reranker for FakeReranker {
    fn model_name(&self) -> &str {
        "fake-reranker"
    }

    fn score(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>, ModelError> {
        let query: HashSet<String> = tokens(query).into_iter().collect();
        if query.is_empty() {
            return Ok(vec![0.0; passages.len()]);
        }
        Ok(passages
            .iter()
            .map(|passage| {
                let words: HashSet<String> = tokens(passage).into_iter().collect();
                let common = query.intersection(&words).count();
                (common as f64 / query.len() as f64) as f32
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn non_zero(embedding: &Embedding) -> Vec<(usize, f32)> {
        embedding
            .dense
            .iter()
            .enumerate()
            .filter(|(_, x)| **x != 0.0)
            .map(|(i, x)| (i, *x))
            .collect()
    }

    fn close(got: &[(usize, f32)], want: &[(usize, f32)]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for ((gi, gx), (wi, wx)) in got.iter().zip(want) {
            assert_eq!(gi, wi);
            assert!((gx - wx).abs() < 1e-6, "{gx} vs {wx}");
        }
    }

    #[test]
    fn blake2b_with_a_4_byte_digest() {
        assert_eq!(hex::encode(blake2b4(b"qdrant")), "dedae722");
        assert_eq!(bucket("qdrant", 64), 34);
        assert_eq!(bucket("qdrant", 1 << 20), 714_530);
    }

    #[test]
    fn tokens_follow_python_word_rules() {
        assert_eq!(
            tokens("Qdrant stocke les vecteurs"),
            vec!["qdrant", "stocke", "les", "vecteurs"]
        );
        assert_eq!(tokens("a b cc"), vec!["cc"]);
        assert_eq!(tokens("Élan élan ÉLAN"), vec!["élan", "élan", "élan"]);
        assert!(tokens("x").is_empty());
        // Length is checked before folding (Python filters the raw match): `ß` stays out.
        assert!(tokens("ß").is_empty());
        assert_eq!(tokens("snake_case x²y"), vec!["snake_case", "x²y"]);
        // A combining mark is not a word character in Python: `e\u{301}t\u{301}e` splits.
        assert_eq!(tokens("e\u{301}te\u{301}s"), vec!["te"]);
    }

    #[test]
    fn dense_and_sparse_vectors() {
        let embedder = FakeEmbedder::new();
        let e = embedder.embed_one("Qdrant stocke les vecteurs");
        close(&non_zero(&e), &[(31, 0.5), (32, 0.5), (34, 0.5), (35, 0.5)]);
        assert_eq!(e.sparse.indices, vec![23_971, 624_288, 643_679, 714_530]);
        assert_eq!(e.sparse.values, vec![1.0; 4]);

        let e = embedder.embed_one("fusion RRF");
        let half = std::f32::consts::FRAC_1_SQRT_2; // 0.707107 in the reference
        close(&non_zero(&e), &[(54, half), (61, half)]);
        assert_eq!(e.sparse.indices, vec![136_125, 576_054]);

        let e = embedder.embed_one("a b cc");
        close(&non_zero(&e), &[(51, 1.0)]);
        assert_eq!(e.sparse.indices, vec![1_026_867]);

        let e = embedder.embed_one("Élan élan ÉLAN");
        close(&non_zero(&e), &[(42, 1.0)]);
        assert_eq!(e.sparse.indices, vec![70_122]);
        assert_eq!(e.sparse.values, vec![3.0]);

        let e = embedder.embed_query("x").expect("fake model");
        assert_eq!(e.dense, vec![0.0; 64]);
        assert!(e.sparse.indices.is_empty());
        assert_eq!(embedder.model_name(), "fake-64");
        assert_eq!(embedder.dim(), 64);
    }

    #[test]
    fn reranker_scores_shared_words() {
        let reranker = FakeReranker::new();
        let scores = reranker
            .score(
                "fusion RRF qdrant",
                &["la fusion rrf", "rien", "Qdrant, fusion, RRF!"],
            )
            .expect("fake model");
        let rounded: Vec<f64> = scores
            .iter()
            .map(|s| crate::text::round4(f64::from(*s)))
            .collect();
        assert_eq!(rounded, vec![0.6667, 0.0, 1.0]);
        assert_eq!(
            reranker.score("x", &["x y", "z"]).expect("fake"),
            vec![0.0, 0.0]
        );
        assert_eq!(reranker.model_name(), "fake-reranker");
    }
}
