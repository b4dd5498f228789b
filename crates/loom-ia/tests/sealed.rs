//! Encryption at rest through the Rust API: keys read from the env file, a sealed journal read
//! back, and without its key a `LoomError::MissingKey` for reads of the session while listings
//! leave it out; it can still be erased.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;

use loom_ia::{Loom, LoomError, RunOptions, RunStatus, query::RunQuery};

const KEY_A: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const ID_A: &str = "4ed42d1a2576";

/// A project sealed with the key `LOOM_TEST_SEAL_KEY`, whose value the env file gives (or not).
fn project(key: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("loom.yaml"),
        "version: 1\n\
         models:\n  - {id: fake, sdk: fake, model: FAKE, params: {script: [{text: 'Le secret est 42.'}]}}\n\
         agents:\n  - {name: chef, main: {model: fake}}\n\
         storage:\n  events: {backend: jsonl, path: data}\n  encryption: {keys: [LOOM_TEST_SEAL_KEY]}\n",
    )
    .unwrap();
    let env = key.map_or(String::new(), |k| format!("LOOM_TEST_SEAL_KEY={k}\n"));
    fs::write(dir.path().join(".env"), env).unwrap();
    dir
}

async fn open(dir: &std::path::Path) -> Loom {
    Loom::open_config(dir.join("loom.yaml"), None)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_sealed_session_reads_back_and_without_its_key_is_a_missing_key() {
    let dir = project(Some(KEY_A));
    let loom = open(dir.path()).await;
    let options = RunOptions {
        session_id: Some("s-1".into()),
        ..RunOptions::default()
    };
    let result = loom
        .run("chef", "Quel est le secret ?", options)
        .await
        .unwrap();
    assert_eq!(result.status, RunStatus::Completed);
    assert_eq!(result.text, "Le secret est 42.");
    let text = fs::read_to_string(dir.path().join("data/default/s-1.jsonl")).unwrap();
    assert!(!text.contains("secret"), "{text}");
    assert!(text.contains(ID_A));
    assert_eq!(loom.session("s-1", None).await.unwrap().runs.len(), 1);

    // The key gone from the env file.
    fs::write(dir.path().join(".env"), "").unwrap();
    let shredded = open(dir.path()).await;
    match shredded.session("s-1", None).await.unwrap_err() {
        LoomError::MissingKey {
            tenant,
            key_id,
            reason,
        } => {
            assert_eq!((tenant.as_str(), key_id.as_str()), ("default", ID_A));
            assert!(
                reason.contains("'LOOM_TEST_SEAL_KEY' is not set"),
                "{reason}"
            );
        }
        other => panic!("{other}"),
    }
    // A listing over the tenant leaves the unreadable session out rather than failing.
    let page = shredded.runs(&RunQuery::default()).await.unwrap();
    assert!(page.runs.is_empty(), "{page:?}");
    assert_eq!(shredded.sessions(None).await.unwrap().len(), 1);
    // Nothing is written without the sealing key.
    assert!(matches!(
        shredded
            .run("chef", "Encore ?", RunOptions::default())
            .await
            .unwrap_err(),
        LoomError::MissingKey { .. }
    ));
    let deletion = shredded.delete_session("s-1", None).await.unwrap();
    assert!(deletion.events_deleted > 0);
}
