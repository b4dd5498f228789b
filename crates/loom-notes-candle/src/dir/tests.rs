use std::fs;

use serde_json::json;

use super::*;

fn bert_config() -> Value {
    json!({
        "model_type": "bert",
        "architectures": ["BertModel"],
        "hidden_size": 384,
        "max_position_embeddings": 512,
        "pad_token_id": 0
    })
}

fn xlmr_reranker_config() -> Value {
    json!({
        "model_type": "xlm-roberta",
        "architectures": ["XLMRobertaForSequenceClassification"],
        "hidden_size": 1024,
        "max_position_embeddings": 8194,
        "pad_token_id": 1,
        "id2label": {"0": "LABEL_0"}
    })
}

/// A directory with `config.json`, `tokenizer.json` and `model.safetensors` (contents are not
/// read by `ModelDir`, only the configuration files).
fn model_dir(config: &Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join(CONFIG_FILE), config.to_string()).unwrap();
    fs::write(dir.path().join(TOKENIZER_FILE), "{}").unwrap();
    fs::write(dir.path().join(SAFETENSORS_WEIGHTS_FILE), b"").unwrap();
    dir
}

#[test]
fn a_bert_directory_is_described() {
    let dir = model_dir(&bert_config());
    let model = ModelDir::open(dir.path()).unwrap();
    assert_eq!(model.architecture(), Architecture::Bert);
    assert_eq!(model.hidden_size(), 384);
    assert_eq!(model.pad_token_id(), 0);
    assert_eq!(model.pooling(), Pooling::Mean);
    assert_eq!(model.position_limit(), 512);
    assert_eq!(model.weights().format, WeightsFormat::Safetensors);
    assert_eq!(model.weights().path, dir.path().join("model.safetensors"));
    assert!(model.sparse_head().is_none());
    assert_eq!(model.architectures(), ["BertModel".to_owned()]);
    assert_eq!(model.num_labels(), None);
    assert_eq!(model.tokenizer_path(), dir.path().join("tokenizer.json"));
}

#[test]
fn the_name_is_the_callers_or_the_directorys() {
    let parent = tempfile::tempdir().unwrap();
    let path = parent.path().join("all-MiniLM-L6-v2");
    fs::create_dir(&path).unwrap();
    fs::write(path.join(CONFIG_FILE), bert_config().to_string()).unwrap();
    fs::write(path.join(TOKENIZER_FILE), "{}").unwrap();
    fs::write(path.join(SAFETENSORS_WEIGHTS_FILE), b"").unwrap();
    let model = ModelDir::open(&path).unwrap();
    assert_eq!(model.name(&LoadOptions::default()), "all-MiniLM-L6-v2");
    let named = LoadOptions {
        name: Some("sentence-transformers/all-MiniLM-L6-v2".into()),
        ..LoadOptions::default()
    };
    assert_eq!(model.name(&named), "sentence-transformers/all-MiniLM-L6-v2");
}

#[test]
fn an_xlm_roberta_reranker_directory_is_described() {
    let dir = model_dir(&xlmr_reranker_config());
    let model = ModelDir::open(dir.path()).unwrap();
    assert_eq!(model.architecture(), Architecture::XlmRoberta);
    assert_eq!(model.pooling(), Pooling::Cls);
    assert_eq!(model.position_limit(), 8192);
    assert_eq!(model.num_labels(), Some(1));
    model.check_reranker().unwrap();
    assert_eq!(model.max_length(Purpose::Reranking, None).unwrap(), 512);
    assert_eq!(model.max_length(Purpose::Embedding, None).unwrap(), 1024);
}

#[test]
fn a_missing_directory_is_named() {
    let parent = tempfile::tempdir().unwrap();
    let missing = parent.path().join("nowhere");
    let error = ModelDir::open(&missing).unwrap_err();
    assert!(matches!(&error, Error::NotADirectory { dir } if *dir == missing));
    assert!(error.to_string().contains("nowhere"), "{error}");
}

#[test]
fn each_missing_file_is_named() {
    for file in [CONFIG_FILE, TOKENIZER_FILE] {
        let dir = model_dir(&bert_config());
        fs::remove_file(dir.path().join(file)).unwrap();
        let error = ModelDir::open(dir.path()).unwrap_err();
        match &error {
            Error::MissingFile {
                dir: reported,
                file: missing,
            } => {
                assert_eq!(reported, dir.path());
                assert_eq!(missing, file);
            }
            other => panic!("{file}: unexpected {other:?}"),
        }
        assert!(
            error.to_string().ends_with(&format!("missing {file}")),
            "{error}"
        );
    }
    let dir = model_dir(&bert_config());
    fs::remove_file(dir.path().join(SAFETENSORS_WEIGHTS_FILE)).unwrap();
    let error = ModelDir::open(dir.path()).unwrap_err();
    assert!(
        matches!(&error, Error::MissingFile { file, .. } if file == "model.safetensors (or pytorch_model.bin)"),
        "{error:?}"
    );
}

#[test]
fn pytorch_weights_are_used_without_safetensors() {
    let dir = model_dir(&bert_config());
    fs::remove_file(dir.path().join(SAFETENSORS_WEIGHTS_FILE)).unwrap();
    fs::write(dir.path().join(PYTORCH_WEIGHTS_FILE), b"").unwrap();
    let model = ModelDir::open(dir.path()).unwrap();
    assert_eq!(model.weights().format, WeightsFormat::PyTorch);
    assert_eq!(model.weights().path, dir.path().join(PYTORCH_WEIGHTS_FILE));
}

#[test]
fn the_sparse_head_prefers_safetensors() {
    let dir = model_dir(&xlmr_reranker_config());
    fs::write(dir.path().join(SPARSE_HEAD_PYTORCH_FILE), b"").unwrap();
    let model = ModelDir::open(dir.path()).unwrap();
    let head = model.sparse_head().unwrap();
    assert_eq!(head.format, WeightsFormat::PyTorch);
    fs::write(dir.path().join(SPARSE_HEAD_SAFETENSORS_FILE), b"").unwrap();
    let model = ModelDir::open(dir.path()).unwrap();
    let head = model.sparse_head().unwrap();
    assert_eq!(head.format, WeightsFormat::Safetensors);
    assert_eq!(head.path, dir.path().join(SPARSE_HEAD_SAFETENSORS_FILE));
}

#[test]
fn invalid_json_and_missing_fields_name_the_file() {
    let dir = model_dir(&bert_config());
    let config_path = dir.path().join(CONFIG_FILE);
    fs::write(&config_path, "{not json").unwrap();
    let error = ModelDir::open(dir.path()).unwrap_err();
    assert!(matches!(&error, Error::InvalidConfig { path, .. } if *path == config_path));

    let mut config = bert_config();
    config.as_object_mut().unwrap().remove("hidden_size");
    fs::write(&config_path, config.to_string()).unwrap();
    let error = ModelDir::open(dir.path()).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("hidden_size is missing or not a positive integer"),
        "{error}"
    );

    let mut config = bert_config();
    config.as_object_mut().unwrap().remove("model_type");
    fs::write(&config_path, config.to_string()).unwrap();
    let error = ModelDir::open(dir.path()).unwrap_err();
    assert!(error.to_string().contains("model_type"), "{error}");
}

#[test]
fn unsupported_model_types_are_refused() {
    let mut config = bert_config();
    config["model_type"] = json!("t5");
    let dir = model_dir(&config);
    let error = ModelDir::open(dir.path()).unwrap_err();
    assert!(
        matches!(&error, Error::UnsupportedModelType { model_type, .. } if model_type == "t5"),
        "{error:?}"
    );
}

#[test]
fn the_pooling_file_chooses_the_pooling() {
    let dir = model_dir(&bert_config());
    fs::create_dir(dir.path().join("1_Pooling")).unwrap();
    let pooling_path = dir.path().join(POOLING_CONFIG_FILE);
    fs::write(
        &pooling_path,
        json!({"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}).to_string(),
    )
    .unwrap();
    assert_eq!(ModelDir::open(dir.path()).unwrap().pooling(), Pooling::Cls);
    fs::write(
        &pooling_path,
        json!({"pooling_mode_cls_token": false, "pooling_mode_mean_tokens": true}).to_string(),
    )
    .unwrap();
    assert_eq!(ModelDir::open(dir.path()).unwrap().pooling(), Pooling::Mean);
    fs::write(
        &pooling_path,
        json!({"pooling_mode_max_tokens": true}).to_string(),
    )
    .unwrap();
    let error = ModelDir::open(dir.path()).unwrap_err();
    assert!(matches!(&error, Error::InvalidConfig { path, .. } if *path == pooling_path));
}

#[test]
fn max_length_defaults_and_limits() {
    let dir = model_dir(&bert_config());
    let model = ModelDir::open(dir.path()).unwrap();
    assert_eq!(model.max_length(Purpose::Embedding, None).unwrap(), 512);
    fs::write(
        dir.path().join(SENTENCE_BERT_CONFIG_FILE),
        json!({"max_seq_length": 256, "do_lower_case": false}).to_string(),
    )
    .unwrap();
    let model = ModelDir::open(dir.path()).unwrap();
    assert_eq!(model.max_length(Purpose::Embedding, None).unwrap(), 256);
    assert_eq!(
        model.max_length(Purpose::Embedding, Some(128)).unwrap(),
        128
    );
    let error = model.max_length(Purpose::Embedding, Some(513)).unwrap_err();
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
    assert!(
        error.to_string().contains("513 exceeds the 512 positions"),
        "{error}"
    );
    let error = model.max_length(Purpose::Embedding, Some(2)).unwrap_err();
    assert!(matches!(
        &error,
        Error::InvalidOption {
            option: "max_length",
            ..
        }
    ));
}

#[test]
fn only_single_label_xlm_roberta_classifiers_are_rerankers() {
    let dir = model_dir(&bert_config());
    let error = ModelDir::open(dir.path())
        .unwrap()
        .check_reranker()
        .unwrap_err();
    assert!(matches!(&error, Error::NotAReranker { .. }), "{error:?}");

    let mut config = xlmr_reranker_config();
    config["architectures"] = json!(["XLMRobertaModel"]);
    let dir = model_dir(&config);
    let error = ModelDir::open(dir.path())
        .unwrap()
        .check_reranker()
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("XLMRobertaForSequenceClassification"),
        "{error}"
    );

    let mut config = xlmr_reranker_config();
    config["num_labels"] = json!(3);
    let dir = model_dir(&config);
    let error = ModelDir::open(dir.path())
        .unwrap()
        .check_reranker()
        .unwrap_err();
    assert!(error.to_string().contains("3 labels"), "{error}");
}

#[test]
fn options_are_validated() {
    LoadOptions::default().validate().unwrap();
    assert_eq!(LoadOptions::default().batch_size, 16);
    let error = LoadOptions {
        batch_size: 0,
        ..LoadOptions::default()
    }
    .validate()
    .unwrap_err();
    assert!(matches!(
        &error,
        Error::InvalidOption {
            option: "batch_size",
            ..
        }
    ));
    let error = LoadOptions {
        name: Some("  ".into()),
        ..LoadOptions::default()
    }
    .validate()
    .unwrap_err();
    assert!(matches!(
        &error,
        Error::InvalidOption { option: "name", .. }
    ));
}
