//! all-MiniLM-L6-v2 (real weights) through the same loading code: token ids, the first dims of
//! an embedding (frozen against an independent float64 NumPy forward) and a semantic ordering.
//!
//! The model directory comes from `LOOM_NOTES_TEST_MODEL_DIR` (installed by
//! `install-test-model.sh DIR`). Unset: the test prints a skip message and passes, unless
//! `LOOM_REQUIRE_MODELS=1`, where it fails.
#![cfg(feature = "candle")]

use std::path::PathBuf;

use anyhow::Result;
use loom_notes_candle::{BertEmbedder, LoadOptions, load_embedder_with};

const MODEL_DIR_VAR: &str = "LOOM_NOTES_TEST_MODEL_DIR";
const REQUIRE_VAR: &str = "LOOM_REQUIRE_MODELS";

const CAT: &str = "The cat sits on the mat.";
const CAT_PARAPHRASE: &str = "A cat is sitting on a rug.";
const REVENUE: &str = "Quarterly revenue grew by 12 percent.";

fn model_dir() -> Option<PathBuf> {
    match std::env::var_os(MODEL_DIR_VAR) {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => {
            assert!(
                std::env::var(REQUIRE_VAR).as_deref() != Ok("1"),
                "{REQUIRE_VAR}=1 but {MODEL_DIR_VAR} is not set: install the model with \
                 crates/loom-notes-candle/install-test-model.sh DIR and set {MODEL_DIR_VAR}=DIR"
            );
            eprintln!(
                "skipped: {MODEL_DIR_VAR} is not set (install all-MiniLM-L6-v2 with \
                 crates/loom-notes-candle/install-test-model.sh DIR)"
            );
            None
        }
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn minilm_tokenizes_embeds_and_orders_like_sentence_transformers() -> Result<()> {
    let Some(dir) = model_dir() else {
        return Ok(());
    };
    let embedder = BertEmbedder::load(&dir, &LoadOptions::default())?;
    assert_eq!(
        embedder.max_length(),
        256,
        "sentence_bert_config.json's max_seq_length"
    );
    assert_eq!(
        embedder.token_ids(CAT)?,
        [101, 1996, 4937, 7719, 2006, 1996, 13523, 1012, 102]
    );

    let options = LoadOptions {
        name: Some("sentence-transformers/all-MiniLM-L6-v2".into()),
        ..LoadOptions::default()
    };
    let embedder = load_embedder_with(&dir, &options)?;
    assert_eq!(
        embedder.model_name(),
        "sentence-transformers/all-MiniLM-L6-v2"
    );
    assert_eq!(embedder.dim(), 384);

    let embeddings = embedder.embed(&[CAT, CAT_PARAPHRASE, REVENUE])?;
    let expected = [
        0.134_177_1,
        -0.032_900_31,
        -0.024_803_746,
        0.041_438_986,
        -0.036_347_67,
    ];
    for (index, (actual, expected)) in embeddings[0].dense.iter().zip(expected).enumerate() {
        assert!(
            (actual - expected).abs() <= 1e-5,
            "dim {index}: {actual} vs {expected}"
        );
    }
    for embedding in &embeddings {
        let norm = cosine(&embedding.dense, &embedding.dense).sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
    }

    let similar = cosine(&embeddings[0].dense, &embeddings[1].dense);
    let unrelated = cosine(&embeddings[0].dense, &embeddings[2].dense);
    eprintln!("cos(cat, paraphrase) = {similar}, cos(cat, revenue) = {unrelated}");
    assert!(
        (similar - 0.7689).abs() < 1e-3,
        "cos(cat, paraphrase) = {similar}"
    );
    assert!(unrelated < 0.1, "cos(cat, revenue) = {unrelated}");
    assert!(similar > unrelated + 0.5);

    // The query embedding is the same function, and padding in a batch changes nothing.
    let query = embedder.embed_query(CAT)?;
    for (a, b) in query.dense.iter().zip(&embeddings[0].dense) {
        assert!((a - b).abs() < 1e-5);
    }
    // The lexical branch: token ids without [CLS]/[SEP], weight = count ("the" twice).
    assert_eq!(query.sparse.indices, [1012, 1996, 2006, 4937, 7719, 13523]);
    assert_eq!(query.sparse.values, [1.0, 2.0, 1.0, 1.0, 1.0, 1.0]);
    Ok(())
}
