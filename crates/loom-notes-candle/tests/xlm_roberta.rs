//! The XLM-R embedder (BGE-M3 layout) and reranker (bge-reranker-v2-m3 layout) on tiny random
//! models: CLS pooling, masking, the sparse head, the reranker's sigmoid, the architecture choice.
#![cfg(feature = "candle")]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use candle_core::{Device, Tensor};
use candle_transformers::models::xlm_roberta;
use common::*;
use loom_notes_candle::{
    Error, LoadOptions, Pooling, XlmRobertaEmbedder, XlmRobertaReranker, load_embedder,
    load_reranker, load_reranker_with,
};
use loom_notes_core::Embedder;

fn tiny_embedder() -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    write_xlmr_embedder(dir.path())?;
    Ok(dir)
}

fn tiny_reranker() -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    write_xlmr_reranker(dir.path())?;
    Ok(dir)
}

fn config() -> Result<xlm_roberta::Config> {
    Ok(serde_json::from_value(xlmr_config("XLMRobertaModel"))?)
}

/// `<s> words </s>` of the tiny XLM-R vocabulary.
fn xlmr_ids(words: &[&str]) -> Vec<u32> {
    let mut ids = vec![id(XLMR_SPECIALS, "<s>")];
    ids.extend(words.iter().map(|word| id(XLMR_SPECIALS, word)));
    ids.push(id(XLMR_SPECIALS, "</s>"));
    ids
}

/// The hidden states of `ids` by candle's XLMRobertaModel, outside the embedder.
fn hidden_states(dir: &Path, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
    let model = xlm_roberta::XLMRobertaModel::new(&config()?, var_builder(dir)?)?;
    let input = input(ids)?;
    let mask = input.ones_like()?;
    rows(&model.forward(&input, &mask, &input.zeros_like()?, None, None, None)?)
}

#[test]
fn dense_vectors_are_the_normalised_cls_state() -> Result<()> {
    let dir = tiny_embedder()?;
    let embedder = load_embedder(dir.path())?;
    assert!(format!("{embedder:?}").starts_with("XlmRobertaEmbedder"));
    assert_eq!(embedder.dim(), HIDDEN);
    let embedding = embedder.embed_query("the cat sits on the mat")?;
    let hidden = hidden_states(
        dir.path(),
        &xlmr_ids(&["the", "cat", "sits", "on", "the", "mat"]),
    )?;
    assert_close(&embedding.dense, &normalized(&hidden[0]), 1e-5);
    assert!((norm(&embedding.dense) - 1.0).abs() < 1e-5);
    Ok(())
}

#[test]
fn mean_pooling_is_chosen_by_the_pooling_file() -> Result<()> {
    let dir = tiny_embedder()?;
    write_pooling(dir.path(), false)?;
    let embedder = XlmRobertaEmbedder::load(dir.path(), &LoadOptions::default())?;
    assert_eq!(embedder.pooling(), Pooling::Mean);
    let hidden = hidden_states(dir.path(), &xlmr_ids(&["a", "dog", "runs"]))?;
    let mean: Vec<f32> = (0..HIDDEN)
        .map(|d| hidden.iter().map(|row| row[d]).sum::<f32>() / hidden.len() as f32)
        .collect();
    assert_close(
        &embedder.embed_query("a dog runs")?.dense,
        &normalized(&mean),
        1e-5,
    );
    Ok(())
}

#[test]
fn padding_in_a_batch_does_not_change_an_embedding() -> Result<()> {
    let dir = tiny_embedder()?;
    write_sparse_head(dir.path(), &[0.5; HIDDEN], 0.1)?;
    let embedder = load_embedder(dir.path())?;
    let alone = embedder.embed_query("a cat")?;
    let batch = embedder.embed(&[
        "the dog runs on the rug and the cat sits on the mat",
        "a cat",
    ])?;
    assert_close(&batch[1].dense, &alone.dense, 1e-5);
    assert_eq!(batch[1].sparse.indices, alone.sparse.indices);
    assert_close(&batch[1].sparse.values, &alone.sparse.values, 1e-5);
    Ok(())
}

#[test]
fn weights_saved_under_a_roberta_prefix_load_too() -> Result<()> {
    let bare = tiny_embedder()?;
    let prefixed = tempfile::tempdir()?;
    write_xlmr_embedder_with_prefix(prefixed.path(), Some("roberta"))?;
    let embedding = load_embedder(prefixed.path())?.embed_query("a cat")?;
    assert_eq!(embedding.dense.len(), HIDDEN);
    // Different random weights, same plumbing.
    assert!((norm(&embedding.dense) - 1.0).abs() < 1e-5);
    assert!(load_embedder(bare.path())?.embed_query("a cat")?.dense != embedding.dense);
    Ok(())
}

#[test]
fn the_sparse_head_keeps_the_max_weight_per_id_without_special_tokens() -> Result<()> {
    let dir = tiny_embedder()?;
    let weight: Vec<f32> = (0..HIDDEN)
        .map(|i| ((i * 7 % 5) as f32 - 2.0) * 0.3)
        .collect();
    let bias = 0.05;
    write_sparse_head(dir.path(), &weight, bias)?;
    let embedder = XlmRobertaEmbedder::load(dir.path(), &LoadOptions::default())?;
    assert!(embedder.has_sparse_head());
    // "zebra" is out of the vocabulary: <unk>.
    let words = [
        "the", "cat", "sits", "on", "the", "mat", "zebra", "the", "cat",
    ];
    let text = words.join(" ");
    let sparse = embedder.embed_query(&text)?.sparse;

    // Independent computation: ReLU(w·h + b) per token, max per id, no specials, > 0 only.
    let ids: Vec<u32> = xlmr_ids(&words.map(|w| if w == "zebra" { "<unk>" } else { w }));
    let hidden = hidden_states(dir.path(), &ids)?;
    let mut expected: BTreeMap<u32, f32> = BTreeMap::new();
    for (token, state) in ids.iter().zip(&hidden) {
        let w = (dot(&weight, state) + bias).max(0.0);
        if [0, 1, 2, 3].contains(token) {
            continue;
        }
        if w <= 0.0 {
            continue;
        }
        let entry = expected.entry(*token).or_insert(w);
        *entry = entry.max(w);
    }
    assert_eq!(sparse.indices, expected.keys().copied().collect::<Vec<_>>());
    assert_close(
        &sparse.values,
        &expected.values().copied().collect::<Vec<_>>(),
        1e-5,
    );
    for special in ["<s>", "</s>", "<unk>", "<pad>"] {
        assert!(
            !sparse.indices.contains(&id(XLMR_SPECIALS, special)),
            "{special} kept"
        );
    }
    assert!(sparse.values.iter().all(|v| *v > 0.0));
    // Repeated ids: the maximum over their positions is what is checked above.
    assert_eq!(
        ids.iter()
            .filter(|&&t| t == id(XLMR_SPECIALS, "the"))
            .count(),
        3
    );
    Ok(())
}

#[test]
fn a_pytorch_sparse_head_is_read() -> Result<()> {
    // tests/fixtures/sparse_linear_16.pt: torch.nn.Linear(16, 1) saved in PyTorch's zip format
    // (tests/fixtures/make_sparse_linear_pt.py): weight[i] = 0.1 i - 0.75, bias 10 (every
    // token's weight stays positive: |w·h| ≤ |w| |h| = 1.84 × 4 after the layer norm).
    let dir = tiny_embedder()?;
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sparse_linear_16.pt");
    std::fs::copy(fixture, dir.path().join("sparse_linear.pt"))?;
    let embedder = XlmRobertaEmbedder::load(dir.path(), &LoadOptions::default())?;
    assert!(embedder.has_sparse_head());
    let sparse = embedder.embed_query("the cat sits")?.sparse;

    let weight: Vec<f32> = (0..HIDDEN).map(|i| 0.1 * i as f32 - 0.75).collect();
    let ids = xlmr_ids(&["the", "cat", "sits"]);
    let hidden = hidden_states(dir.path(), &ids)?;
    let expected: BTreeMap<u32, f32> = ids[1..4]
        .iter()
        .zip(&hidden[1..4])
        .map(|(token, state)| (*token, dot(&weight, state) + 10.0))
        .collect();
    assert_eq!(expected.len(), 3);
    assert_eq!(sparse.indices, expected.keys().copied().collect::<Vec<_>>());
    assert_close(
        &sparse.values,
        &expected.values().copied().collect::<Vec<_>>(),
        1e-5,
    );
    Ok(())
}

#[test]
fn a_negative_sparse_head_gives_an_empty_sparse_vector() -> Result<()> {
    let dir = tiny_embedder()?;
    write_sparse_head(dir.path(), &[0.0; HIDDEN], -1.0)?;
    let sparse = load_embedder(dir.path())?
        .embed_query("the cat sits")?
        .sparse;
    assert!(sparse.indices.is_empty() && sparse.values.is_empty());
    write_sparse_head(dir.path(), &[0.0; HIDDEN], 0.75)?;
    let sparse = load_embedder(dir.path())?
        .embed_query("the cat sits")?
        .sparse;
    let mut ids = [
        id(XLMR_SPECIALS, "the"),
        id(XLMR_SPECIALS, "cat"),
        id(XLMR_SPECIALS, "sits"),
    ];
    ids.sort_unstable();
    assert_eq!(sparse.indices, ids);
    assert_eq!(sparse.values, [0.75; 3]);
    Ok(())
}

#[test]
fn without_a_sparse_head_the_sparse_vector_counts_tokens() -> Result<()> {
    let dir = tiny_embedder()?;
    let embedder = XlmRobertaEmbedder::load(dir.path(), &LoadOptions::default())?;
    assert!(!embedder.has_sparse_head());
    let sparse = embedder.embed_query("the cat the zebra")?.sparse;
    let (the, cat) = (id(XLMR_SPECIALS, "the"), id(XLMR_SPECIALS, "cat"));
    let mut expected = [(the, 2.0), (cat, 1.0)];
    expected.sort_by_key(|(id, _)| *id);
    assert_eq!(sparse.indices, expected.map(|(id, _)| id));
    assert_eq!(sparse.values, expected.map(|(_, count)| count));
    Ok(())
}

#[test]
fn a_sparse_head_of_the_wrong_shape_is_refused() -> Result<()> {
    let dir = tiny_embedder()?;
    let tensors = [(
        "weight".to_owned(),
        Tensor::zeros((2, HIDDEN), candle_core::DType::F32, &Device::Cpu)?,
    )];
    candle_core::safetensors::save(
        &tensors.into_iter().collect(),
        dir.path().join("sparse_linear.safetensors"),
    )?;
    let error = load_embedder(dir.path()).unwrap_err();
    assert!(
        matches!(&error, Error::Weights { path, message }
            if path.ends_with("sparse_linear.safetensors") && message.contains("bias")),
        "{error:?}"
    );
    Ok(())
}

#[test]
fn reranker_scores_are_the_sigmoid_of_the_classifier() -> Result<()> {
    let dir = tiny_reranker()?;
    let reranker = load_reranker(dir.path())?;
    assert!(format!("{reranker:?}").starts_with("XlmRobertaReranker"));
    let passages = ["the cat sits on the mat", "revenue grew fast", "a dog"];
    let scores = reranker.score("a cat", &passages)?;
    assert_eq!(scores.len(), 3);
    assert!(scores.iter().all(|s| *s > 0.0 && *s < 1.0), "{scores:?}");

    // Independent forward of the pair `<s> a cat </s></s> revenue grew fast </s>`.
    let config: xlm_roberta::Config =
        serde_json::from_value(xlmr_config("XLMRobertaForSequenceClassification"))?;
    let model = xlm_roberta::XLMRobertaForSequenceClassification::new(
        1,
        &config,
        var_builder(dir.path())?,
    )?;
    let mut ids = xlmr_ids(&["a", "cat"]);
    ids.push(id(XLMR_SPECIALS, "</s>"));
    ids.extend(["revenue", "grew", "fast"].map(|w| id(XLMR_SPECIALS, w)));
    ids.push(id(XLMR_SPECIALS, "</s>"));
    let input = input(&ids)?;
    let logit = model
        .forward(&input, &input.ones_like()?, &input.zeros_like()?)?
        .flatten_all()?
        .to_vec1::<f32>()?[0];
    let expected = 1.0 / (1.0 + (-logit).exp());
    assert!(
        (scores[1] - expected).abs() < 1e-5,
        "{} vs {expected}",
        scores[1]
    );

    // Padding with longer pairs in the batch changes nothing.
    let alone = reranker.score("a cat", &["revenue grew fast"])?;
    assert!((alone[0] - scores[1]).abs() < 1e-5);
    assert!(reranker.score("a cat", &[])?.is_empty());
    Ok(())
}

#[test]
fn reranker_pairs_are_truncated_at_max_length() -> Result<()> {
    let dir = tiny_reranker()?;
    let options = LoadOptions {
        max_length: Some(8),
        ..LoadOptions::default()
    };
    let reranker = XlmRobertaReranker::load(dir.path(), &options)?;
    assert_eq!(reranker.max_length(), 8);
    let long_passage = vec!["cat"; 200].join(" ");
    let scores = loom_notes_core::Reranker::score(&reranker, "a dog", &[&long_passage])?;
    assert!(scores[0] > 0.0 && scores[0] < 1.0);
    // Longer than the model's 32 positions: refused when asked for.
    let error = load_reranker_with(
        dir.path(),
        &LoadOptions {
            max_length: Some(33),
            ..LoadOptions::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            &error,
            Error::InvalidOption {
                option: "max_length",
                ..
            }
        ),
        "{error:?}"
    );
    Ok(())
}

#[test]
fn an_embedder_directory_is_not_a_reranker_and_the_reverse_loads_as_embedder() -> Result<()> {
    let embedder_dir = tiny_embedder()?;
    let error = load_reranker(embedder_dir.path()).unwrap_err();
    assert!(
        matches!(&error, Error::NotAReranker { reason, .. } if reason.contains("XLMRobertaForSequenceClassification")),
        "{error:?}"
    );
    // A reranker's weights carry `roberta.` and `classifier.`: its backbone still embeds.
    let reranker_dir = tiny_reranker()?;
    let embedding = load_embedder(reranker_dir.path())?.embed_query("a cat")?;
    assert_eq!(embedding.dense.len(), HIDDEN);
    Ok(())
}
