//! Which models a run uses: the fake ones (`--fake`, `LOOM_NOTES_FAKE_MODELS=true`), else the
//! real ones when the binary is built with the `candle` feature.

use std::sync::Arc;

use loom_notes_core::{
    Embedder, Reranker, Settings,
    fake::{FakeEmbedder, FakeReranker},
};

/// The embedder and reranker `settings` ask for.
pub(crate) fn load(settings: &Settings) -> anyhow::Result<(Arc<dyn Embedder>, Arc<dyn Reranker>)> {
    if settings.fake_models {
        return Ok((Arc::new(FakeEmbedder::new()), Arc::new(FakeReranker::new())));
    }
    real(settings)
}

#[cfg(not(feature = "candle"))]
fn real(_settings: &Settings) -> anyhow::Result<(Arc<dyn Embedder>, Arc<dyn Reranker>)> {
    anyhow::bail!(
        "this loom-notes was built without real models: rebuild it with \
         `cargo install --path crates/loom-notes --features candle` (then point \
         LOOM_NOTES_MODEL_DIR at a local model directory), or use the fake models with \
         --fake or LOOM_NOTES_FAKE_MODELS=true"
    )
}

/// The real models: the dense embedder from `LOOM_NOTES_MODEL_DIR`, the reranker from
/// `LOOM_NOTES_RERANKER_DIR` — or, without it, the fake reranker, said loudly.
#[cfg(feature = "candle")]
fn real(settings: &Settings) -> anyhow::Result<(Arc<dyn Embedder>, Arc<dyn Reranker>)> {
    use anyhow::Context as _;

    let Some(dir) = &settings.model_dir else {
        anyhow::bail!(
            "no model: set LOOM_NOTES_MODEL_DIR to a local model directory (config.json, \
             tokenizer.json and the weights of BGE-M3 or a sentence-transformers BERT such as \
             all-MiniLM-L6-v2; crates/loom-notes-candle/install-test-model.sh installs the \
             latter), or use the fake models with --fake"
        )
    };
    let embedder = loom_notes_candle::load_embedder(dir)
        .with_context(|| format!("cannot load the embedder of {}", dir.display()))?;
    let reranker: Arc<dyn Reranker> = match std::env::var_os(RERANKER_DIR) {
        Some(dir) if !dir.is_empty() => {
            loom_notes_candle::load_reranker(&dir).with_context(|| {
                format!(
                    "cannot load the reranker of {}",
                    std::path::Path::new(&dir).display()
                )
            })?
        }
        _ => {
            eprintln!(
                "warning: {RERANKER_DIR} is not set: search results are reranked by the FAKE \
                 reranker (the share of query words a passage contains), not by a cross-encoder"
            );
            Arc::new(FakeReranker::new())
        }
    };
    Ok((embedder, reranker))
}

/// Where the real reranker is read from (`candle` builds).
#[cfg(feature = "candle")]
const RERANKER_DIR: &str = "LOOM_NOTES_RERANKER_DIR";
