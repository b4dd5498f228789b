//! Settings, data directory and the memory service every command and the server use.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::Context;
use loom_notes_core::{MemoryService, Settings};
use loom_notes_sqlite::SqliteStore;

use crate::models;

/// Everything a command needs: the service and where its files are.
#[derive(Debug)]
pub(crate) struct Opened {
    /// The memory service over the data directory's store.
    pub(crate) service: Arc<MemoryService>,
    /// The data directory (exists).
    pub(crate) data_dir: PathBuf,
}

/// Reads the settings from the environment (`--fake` forces the fake models), resolves the
/// data directory (reference A.1: `--data-dir`, else `LOOM_NOTES_DATA_DIR`, else
/// `$XDG_DATA_HOME/loom-notes` when absolute, else `~/.local/share/loom-notes`) and creates
/// it, loads the models and opens the store.
pub(crate) async fn open(fake: bool, flag: Option<&Path>) -> anyhow::Result<Opened> {
    let mut settings = Settings::from_env()?;
    if fake {
        settings.fake_models = true;
    }
    if let Some(flag) = flag {
        settings.data_dir = Some(flag.to_path_buf());
    }
    let xdg = std::env::var_os("XDG_DATA_HOME").map(PathBuf::from);
    let home = std::env::var_os("HOME")
        .filter(|home| !home.is_empty())
        .map(PathBuf::from);
    let Some(dir) = settings.resolve_data_dir(xdg.as_deref(), home.as_deref()) else {
        anyhow::bail!(
            "no data directory: set LOOM_NOTES_DATA_DIR or pass --data-dir (HOME is not set)"
        );
    };
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
    settings.data_dir = Some(dir.clone());
    let (embedder, reranker) = models::load(&settings)?;
    let store = SqliteStore::open(&dir).await?;
    let service = MemoryService::new(embedder, reranker, Arc::new(store), settings);
    Ok(Opened {
        service: Arc::new(service),
        data_dir: dir,
    })
}
