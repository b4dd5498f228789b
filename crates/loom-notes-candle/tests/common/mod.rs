//! Tiny random models written to temporary directories: a BERT (MiniLM layout) and XLM-R
//! models (BGE-M3 and bge-reranker-v2-m3 layouts), with a word-level `tokenizer.json`.
#![allow(dead_code, unreachable_pub)]

use std::path::Path;

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::{bert, xlm_roberta};
use serde_json::{Value, json};

/// The words of the tiny vocabularies (after the special tokens).
pub const WORDS: &[&str] = &[
    "the", "a", "cat", "dog", "sits", "runs", "on", "mat", "rug", "is", "sitting", "and", "fast",
    "revenue", "grew", ".", ",",
];
/// Hidden size of the tiny models.
pub const HIDDEN: usize = 16;

/// The tiny BERT's special tokens, ids 0..5.
pub const BERT_SPECIALS: &[&str] = &["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
/// The tiny XLM-R's special tokens, ids 0..5 (XLM-R's order).
pub const XLMR_SPECIALS: &[&str] = &["<s>", "<pad>", "</s>", "<unk>", "<mask>"];

/// The id of `token` in a vocabulary made of `specials` then [`WORDS`].
pub fn id(specials: &[&str], token: &str) -> u32 {
    specials
        .iter()
        .chain(WORDS)
        .position(|t| *t == token)
        .map(|position| position as u32)
        .unwrap_or_else(|| panic!("{token} is not in the tiny vocabulary"))
}

fn vocab_size(specials: &[&str]) -> usize {
    specials.len() + WORDS.len()
}

/// A word-level tokenizer (lowercase, whitespace/punctuation split) adding `cls`/`sep` around a
/// text and `cls A sep [sep] B sep` around a pair.
fn tokenizer_json(
    specials: &[&str],
    unk: &str,
    cls: &str,
    sep: &str,
    pair_double_sep: bool,
) -> Value {
    let vocab: serde_json::Map<String, Value> = specials
        .iter()
        .chain(WORDS)
        .enumerate()
        .map(|(index, token)| ((*token).to_owned(), json!(index)))
        .collect();
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(index, token)| {
            json!({"id": index, "content": token, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let special =
        |token: &str, type_id: u32| json!({"SpecialToken": {"id": token, "type_id": type_id}});
    let sequence = |name: &str, type_id: u32| json!({"Sequence": {"id": name, "type_id": type_id}});
    let mut pair = vec![special(cls, 0), sequence("A", 0), special(sep, 0)];
    if pair_double_sep {
        pair.push(special(sep, 0));
    }
    pair.extend([sequence("B", 0), special(sep, 0)]);
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [special(cls, 0), sequence("A", 0), special(sep, 0)],
            "pair": pair,
            "special_tokens": {
                cls: {"id": cls, "ids": [id(specials, cls)], "tokens": [cls]},
                sep: {"id": sep, "ids": [id(specials, sep)], "tokens": [sep]},
            }
        },
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": unk}
    })
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(value)?)?;
    Ok(())
}

/// The tiny BERT's `config.json`.
pub fn bert_config() -> Value {
    json!({
        "architectures": ["BertModel"],
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": 32,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 32,
        "model_type": "bert",
        "num_attention_heads": 2,
        "num_hidden_layers": 2,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "type_vocab_size": 2,
        "vocab_size": vocab_size(BERT_SPECIALS)
    })
}

/// The tiny XLM-R's `config.json` (`architectures` as given).
pub fn xlmr_config(architecture: &str) -> Value {
    json!({
        "architectures": [architecture],
        "attention_probs_dropout_prob": 0.1,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": 32,
        "layer_norm_eps": 1e-5,
        "max_position_embeddings": 34,
        "model_type": "xlm-roberta",
        "num_attention_heads": 2,
        "num_hidden_layers": 2,
        "pad_token_id": 1,
        "position_embedding_type": "absolute",
        "type_vocab_size": 1,
        "vocab_size": vocab_size(XLMR_SPECIALS)
    })
}

/// Random weights created by `build` through a `VarMap`, saved as safetensors.
fn save_weights(
    path: &Path,
    build: impl FnOnce(VarBuilder<'_>) -> candle_core::Result<()>,
) -> Result<()> {
    let varmap = VarMap::new();
    build(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    varmap.save(path)?;
    Ok(())
}

/// A tiny random BERT sentence-transformers directory (mean pooling by default).
pub fn write_bert(dir: &Path) -> Result<()> {
    let config = bert_config();
    write_json(&dir.join("config.json"), &config)?;
    write_json(
        &dir.join("tokenizer.json"),
        &tokenizer_json(BERT_SPECIALS, "[UNK]", "[CLS]", "[SEP]", false),
    )?;
    let config: bert::Config = serde_json::from_value(config)?;
    save_weights(&dir.join("model.safetensors"), |vb| {
        bert::BertModel::load(vb, &config).map(drop)
    })
}

/// A tiny random XLM-R embedder directory, BGE-M3 layout (bare `XLMRobertaModel` tensors), with
/// no sparse head.
pub fn write_xlmr_embedder(dir: &Path) -> Result<()> {
    write_xlmr_embedder_with_prefix(dir, None)
}

/// Same, the model's tensors under `prefix.` when given.
pub fn write_xlmr_embedder_with_prefix(dir: &Path, prefix: Option<&str>) -> Result<()> {
    let config = xlmr_config("XLMRobertaModel");
    write_xlmr_files(dir, &config)?;
    let config: xlm_roberta::Config = serde_json::from_value(config)?;
    save_weights(&dir.join("model.safetensors"), |vb| {
        let vb = match prefix {
            Some(prefix) => vb.pp(prefix),
            None => vb,
        };
        xlm_roberta::XLMRobertaModel::new(&config, vb).map(drop)
    })
}

/// A tiny random bge-reranker-v2-m3 directory (`XLMRobertaForSequenceClassification`, 1 label).
pub fn write_xlmr_reranker(dir: &Path) -> Result<()> {
    let mut config = xlmr_config("XLMRobertaForSequenceClassification");
    config["id2label"] = json!({"0": "LABEL_0"});
    config["label2id"] = json!({"LABEL_0": 0});
    write_xlmr_files(dir, &config)?;
    let config: xlm_roberta::Config = serde_json::from_value(config)?;
    save_weights(&dir.join("model.safetensors"), |vb| {
        xlm_roberta::XLMRobertaForSequenceClassification::new(1, &config, vb).map(drop)
    })
}

fn write_xlmr_files(dir: &Path, config: &Value) -> Result<()> {
    write_json(&dir.join("config.json"), config)?;
    write_json(
        &dir.join("tokenizer.json"),
        &tokenizer_json(XLMR_SPECIALS, "<unk>", "<s>", "</s>", true),
    )
}

/// Writes BGE-M3's sparse head (`Linear(HIDDEN, 1)`) as `sparse_linear.safetensors`.
pub fn write_sparse_head(dir: &Path, weight: &[f32], bias: f32) -> Result<()> {
    let tensors = [
        (
            "weight".to_owned(),
            Tensor::from_slice(weight, (1, HIDDEN), &Device::Cpu)?,
        ),
        ("bias".to_owned(), Tensor::new(&[bias], &Device::Cpu)?),
    ];
    candle_core::safetensors::save(
        &tensors.into_iter().collect(),
        dir.join("sparse_linear.safetensors"),
    )?;
    Ok(())
}

/// Writes `1_Pooling/config.json` choosing CLS or mean pooling.
pub fn write_pooling(dir: &Path, cls: bool) -> Result<()> {
    write_json(
        &dir.join("1_Pooling/config.json"),
        &json!({
            "word_embedding_dimension": HIDDEN,
            "pooling_mode_cls_token": cls,
            "pooling_mode_mean_tokens": !cls,
            "pooling_mode_max_tokens": false,
            "pooling_mode_mean_sqrt_len_tokens": false
        }),
    )
}

/// The weights saved in `dir`, for independent forward passes in the tests.
pub fn var_builder(dir: &Path) -> Result<VarBuilder<'static>> {
    let bytes = std::fs::read(dir.join("model.safetensors"))?;
    Ok(VarBuilder::from_buffered_safetensors(
        bytes,
        DType::F32,
        &Device::Cpu,
    )?)
}

/// The L2 norm of a vector.
pub fn norm(vector: &[f32]) -> f32 {
    vector.iter().map(|x| x * x).sum::<f32>().sqrt()
}

/// The cosine of two L2-normalised vectors.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Asserts `actual` ≈ `expected` element-wise (absolute tolerance).
pub fn assert_close(actual: &[f32], expected: &[f32], tolerance: f32) {
    assert_eq!(actual.len(), expected.len(), "lengths differ");
    for (index, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= tolerance,
            "value {index}: {a} vs expected {e} (tolerance {tolerance})\nactual {actual:?}\nexpected {expected:?}"
        );
    }
}

/// `vector` divided by its L2 norm.
pub fn normalized(vector: &[f32]) -> Vec<f32> {
    let n = norm(vector);
    vector.iter().map(|x| x / n).collect()
}

/// The `[length, hidden]` hidden states of one sequence as rows.
pub fn rows(hidden: &Tensor) -> Result<Vec<Vec<f32>>> {
    Ok(hidden.squeeze(0)?.to_vec2::<f32>()?)
}

/// `ids` as a `[1, len]` input.
pub fn input(ids: &[u32]) -> Result<Tensor> {
    Ok(Tensor::new(ids, &Device::Cpu)?.unsqueeze(0)?)
}
