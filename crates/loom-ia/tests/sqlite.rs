//! The `sqlite` journal through the facade: with the `sqlite` feature `Loom::new` opens the
//! database the configuration names; without it the configuration is refused, naming the
//! feature.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use loom_ia::{
    Loom,
    config::{AgentSpec, Config, EventsBackend, LoomConfig, ModelSpec, Sdk},
};
use serde_json::json;

/// One agent on the scripted fake model, journaled in `data/loom.db`.
fn config(dir: &std::path::Path) -> Config {
    let mut model = ModelSpec::new("fake-1", Sdk::Fake, "FAKE");
    model
        .params
        .insert("script".into(), json!([{"text": "Bonjour."}]));
    let mut raw = LoomConfig {
        models: vec![model],
        agents: vec![AgentSpec::new("hello", "fake-1")],
        ..LoomConfig::default()
    };
    raw.storage.events.backend = EventsBackend::Sqlite;
    raw.storage.events.path = Some("data/loom.db".into());
    Config::new(raw, dir.to_path_buf()).unwrap()
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn runs_are_journaled_in_the_database_and_read_back_by_another_loom() {
    let dir = tempfile::tempdir().unwrap();
    let loom = Loom::new(config(dir.path())).unwrap();
    assert!(dir.path().join("data/loom.db").is_file());
    let result = loom
        .run("hello", "Salut", loom_ia::RunOptions::default())
        .await
        .unwrap();
    assert!(result.ok());
    assert_eq!(result.text, "Bonjour.");
    let validation = loom.validate().await.unwrap();
    assert!(format!("{validation:?}").contains("sqlite in "));

    // Another Loom on the same file (another process) reads the same run.
    let other = Loom::new(config(dir.path())).unwrap();
    let run = other.locate(&result.run_id, None, None).await.unwrap();
    assert_eq!(other.result(&run).await.unwrap(), result);
    assert_eq!(
        other.events(&run).await.unwrap(),
        loom.events(&run).await.unwrap()
    );
}

/// Inside a runtime, `Loom::open` sets the SQLite files up (the journal and the idempotency
/// store) without holding a worker thread: on a one-thread runtime, another task runs
/// meanwhile (`Loom::new` would block the thread until the file is ready).
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "current_thread")]
async fn open_sets_the_database_up_without_holding_the_runtime() {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path()).raw().clone();
    config.storage.idempotency = Some(loom_ia::config::IdempotencyStorage {
        backend: loom_ia::config::IdempotencyBackend::Sqlite,
        path: Some("data/keys.db".into()),
        dsn_env: None,
        url_env: None,
        role: None,
        pool: None,
    });
    let config = Config::new(config, dir.path().to_path_buf()).unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let other = tokio::spawn({
        let ran = ran.clone();
        async move { ran.store(true, Ordering::SeqCst) }
    });
    let loom = Loom::open(config).await.unwrap();
    assert!(
        ran.load(Ordering::SeqCst),
        "the runtime's only thread was held while the database was set up"
    );
    other.await.unwrap();
    let result = loom
        .run("hello", "Salut", loom_ia::RunOptions::default())
        .await
        .unwrap();
    assert_eq!(result.text, "Bonjour.");
    assert!(dir.path().join("data/loom.db").is_file());
    assert!(dir.path().join("data/keys.db").is_file());
}

#[cfg(not(feature = "sqlite"))]
#[test]
fn without_the_feature_the_backend_is_a_located_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = Loom::new(config(dir.path())).unwrap_err().to_string();
    assert!(err.contains("storage.events.backend"), "{err}");
    assert!(err.contains("`sqlite` feature"), "{err}");
    assert!(!dir.path().join("data").exists());
}
