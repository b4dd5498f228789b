//! The BERT embedder on a tiny random model: shapes, normalisation, pooling, masking,
//! truncation, the token-count sparse vectors and the loading errors.
#![cfg(feature = "candle")]

mod common;

use std::fs;

use anyhow::Result;
use candle_transformers::models::bert;
use common::*;
use loom_notes_candle::{
    BertEmbedder, Error, LoadOptions, Pooling, load_embedder, load_embedder_with, load_reranker,
};
use loom_notes_core::Embedder;

fn tiny_bert() -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    write_bert(dir.path())?;
    Ok(dir)
}

/// The hidden states of `ids` by candle's BertModel, outside the embedder.
fn hidden_states(dir: &std::path::Path, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
    let config: bert::Config = serde_json::from_value(bert_config())?;
    let model = bert::BertModel::load(var_builder(dir)?, &config)?;
    let input = input(ids)?;
    rows(&model.forward(&input, &input.zeros_like()?, None)?)
}

fn bert_ids(words: &[&str]) -> Vec<u32> {
    let mut ids = vec![id(BERT_SPECIALS, "[CLS]")];
    ids.extend(words.iter().map(|word| id(BERT_SPECIALS, word)));
    ids.push(id(BERT_SPECIALS, "[SEP]"));
    ids
}

#[test]
fn embeddings_have_the_configured_dim_and_unit_norm() -> Result<()> {
    let dir = tiny_bert()?;
    let embedder = load_embedder(dir.path())?;
    assert_eq!(embedder.dim(), HIDDEN);
    let name = dir
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_eq!(embedder.model_name(), name);
    assert!(format!("{embedder:?}").starts_with("BertEmbedder"));
    let texts = ["the cat sits on the mat .", "a dog runs", ""];
    let embeddings = embedder.embed(&texts)?;
    assert_eq!(embeddings.len(), 3);
    for embedding in &embeddings {
        assert_eq!(embedding.dense.len(), HIDDEN);
        assert!((norm(&embedding.dense) - 1.0).abs() < 1e-5);
    }
    assert_ne!(embeddings[0].dense, embeddings[1].dense);
    assert!(embedder.embed(&[])?.is_empty());
    Ok(())
}

#[test]
fn the_callers_name_is_the_model_name() -> Result<()> {
    let dir = tiny_bert()?;
    let options = LoadOptions {
        name: Some("sentence-transformers/all-MiniLM-L6-v2".into()),
        ..LoadOptions::default()
    };
    let embedder = load_embedder_with(dir.path(), &options)?;
    assert_eq!(
        embedder.model_name(),
        "sentence-transformers/all-MiniLM-L6-v2"
    );
    Ok(())
}

#[test]
fn mean_pooling_is_the_masked_mean_of_the_hidden_states() -> Result<()> {
    let dir = tiny_bert()?;
    let embedder = BertEmbedder::load(dir.path(), &LoadOptions::default())?;
    assert_eq!(embedder.pooling(), Pooling::Mean);
    let hidden = hidden_states(
        dir.path(),
        &bert_ids(&["the", "cat", "sits", "on", "the", "mat"]),
    )?;
    let mean: Vec<f32> = (0..HIDDEN)
        .map(|d| hidden.iter().map(|row| row[d]).sum::<f32>() / hidden.len() as f32)
        .collect();
    let embedding = embedder.embed_query("The cat sits on the mat")?;
    assert_close(&embedding.dense, &normalized(&mean), 1e-5);
    Ok(())
}

#[test]
fn cls_pooling_takes_the_first_hidden_state() -> Result<()> {
    let dir = tiny_bert()?;
    let mean =
        BertEmbedder::load(dir.path(), &LoadOptions::default())?.embed_query("a dog runs")?;
    write_pooling(dir.path(), true)?;
    let embedder = BertEmbedder::load(dir.path(), &LoadOptions::default())?;
    assert_eq!(embedder.pooling(), Pooling::Cls);
    let hidden = hidden_states(dir.path(), &bert_ids(&["a", "dog", "runs"]))?;
    let cls = embedder.embed_query("a dog runs")?;
    assert_close(&cls.dense, &normalized(&hidden[0]), 1e-5);
    assert!(
        dot(&cls.dense, &mean.dense) < 0.9999,
        "CLS and mean pooling must differ"
    );
    Ok(())
}

#[test]
fn padding_in_a_batch_does_not_change_an_embedding() -> Result<()> {
    let dir = tiny_bert()?;
    let embedder = load_embedder(dir.path())?;
    let short = "a cat";
    let alone = embedder.embed_query(short)?;
    let batch = embedder.embed(&[
        "the dog runs on the rug and the cat sits on the mat",
        short,
        "revenue grew fast",
    ])?;
    assert_close(&batch[1].dense, &alone.dense, 1e-5);
    assert_eq!(batch[1].sparse, alone.sparse);
    Ok(())
}

#[test]
fn small_batches_give_the_same_embeddings_in_the_same_order() -> Result<()> {
    let dir = tiny_bert()?;
    let texts = [
        "a cat",
        "the dog runs on the rug and the cat sits on the mat",
        "revenue grew",
        "the mat",
        "a dog is sitting on a rug",
    ];
    let whole = load_embedder(dir.path())?.embed(&texts)?;
    let options = LoadOptions {
        batch_size: 2,
        ..LoadOptions::default()
    };
    let small = load_embedder_with(dir.path(), &options)?.embed(&texts)?;
    for (a, b) in whole.iter().zip(&small) {
        assert_close(&a.dense, &b.dense, 1e-5);
        assert_eq!(a.sparse, b.sparse);
    }
    Ok(())
}

#[test]
fn the_sparse_vector_counts_token_ids_without_special_tokens() -> Result<()> {
    let dir = tiny_bert()?;
    let embedder = load_embedder(dir.path())?;
    // "zebra" is out of the vocabulary: [UNK], left out like [CLS] and [SEP].
    let sparse = embedder
        .embed_query("The cat, the zebra and THE mat")?
        .sparse;
    let mut expected = [
        (id(BERT_SPECIALS, "the"), 3.0),
        (id(BERT_SPECIALS, "cat"), 1.0),
        (id(BERT_SPECIALS, ","), 1.0),
        (id(BERT_SPECIALS, "and"), 1.0),
        (id(BERT_SPECIALS, "mat"), 1.0),
    ];
    expected.sort_by_key(|(id, _)| *id);
    assert_eq!(sparse.indices, expected.map(|(id, _)| id));
    assert_eq!(sparse.values, expected.map(|(_, count)| count));
    Ok(())
}

#[test]
fn texts_are_truncated_at_max_length() -> Result<()> {
    let dir = tiny_bert()?;
    let options = LoadOptions {
        max_length: Some(5),
        ..LoadOptions::default()
    };
    let embedder = BertEmbedder::load(dir.path(), &options)?;
    assert_eq!(embedder.max_length(), 5);
    let long = embedder.embed_query("a cat sits on the mat")?;
    let cut = embedder.embed_query("a cat sits")?;
    assert_close(&long.dense, &cut.dense, 1e-6);
    assert_eq!(long.sparse, cut.sparse);
    // Longer than the 32 positions: truncated by default, no error.
    let words = vec!["cat"; 100].join(" ");
    let embedding = load_embedder(dir.path())?.embed_query(&words)?;
    assert_eq!(embedding.sparse.values, [30.0]);
    Ok(())
}

#[test]
fn a_bert_directory_is_not_a_reranker() -> Result<()> {
    let dir = tiny_bert()?;
    let error = load_reranker(dir.path()).unwrap_err();
    assert!(matches!(error, Error::NotAReranker { .. }), "{error:?}");
    Ok(())
}

#[test]
fn missing_and_invalid_files_are_named() -> Result<()> {
    for file in ["config.json", "tokenizer.json", "model.safetensors"] {
        let dir = tiny_bert()?;
        fs::remove_file(dir.path().join(file))?;
        let error = load_embedder(dir.path()).unwrap_err();
        assert!(
            matches!(&error, Error::MissingFile { .. }),
            "{file}: {error:?}"
        );
        assert!(error.to_string().contains(file), "{error}");
    }

    let dir = tiny_bert()?;
    fs::write(dir.path().join("tokenizer.json"), "{\"model\": 3}")?;
    let error = load_embedder(dir.path()).unwrap_err();
    assert!(
        matches!(&error, Error::Tokenizer { path, .. } if path.ends_with("tokenizer.json")),
        "{error:?}"
    );

    let dir = tiny_bert()?;
    fs::write(dir.path().join("model.safetensors"), b"not safetensors")?;
    let error = load_embedder(dir.path()).unwrap_err();
    assert!(
        matches!(&error, Error::Weights { path, .. } if path.ends_with("model.safetensors")),
        "{error:?}"
    );

    // Weights of another architecture: a tensor BERT needs is missing.
    let dir = tiny_bert()?;
    let other = tempfile::tempdir()?;
    write_xlmr_reranker(other.path())?;
    fs::copy(
        other.path().join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )?;
    let error = load_embedder(dir.path()).unwrap_err();
    assert!(matches!(&error, Error::Weights { .. }), "{error:?}");

    // A field candle's BERT needs.
    let dir = tiny_bert()?;
    let mut config = bert_config();
    config.as_object_mut().unwrap().remove("intermediate_size");
    fs::write(dir.path().join("config.json"), config.to_string())?;
    let error = load_embedder(dir.path()).unwrap_err();
    assert!(
        matches!(&error, Error::InvalidConfig { path, message }
            if path.ends_with("config.json") && message.contains("intermediate_size")),
        "{error:?}"
    );
    Ok(())
}

#[test]
fn a_bert_loader_refuses_another_architecture() -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_xlmr_embedder(dir.path())?;
    let error = BertEmbedder::load(dir.path(), &LoadOptions::default()).unwrap_err();
    assert!(
        matches!(
            &error,
            Error::WrongArchitecture {
                expected: "bert",
                found: "xlm-roberta",
                ..
            }
        ),
        "{error:?}"
    );
    Ok(())
}
