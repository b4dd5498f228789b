//! The file itself: schema version, concurrent creation, damaged rows, unusable directories.

// Test helpers panic on failure: that is the failed test.
#![allow(clippy::expect_used)]

use loom_notes_core::fake::FakeEmbedder;
use loom_notes_core::{
    Chunk, ChunkFilter, Document, IndexMeta, IndexedChunk, NoteStore, SourceKind, StoreError,
};
use loom_notes_sqlite::{DB_FILE, SCHEMA_VERSION, SqliteStore};
use sqlx::{Connection, Row, SqliteConnection};

async fn raw(dir: &std::path::Path) -> SqliteConnection {
    let url = format!("sqlite://{}", dir.join(DB_FILE).display());
    SqliteConnection::connect(&url)
        .await
        .expect("raw connection")
}

async fn put_one(store: &SqliteStore, id: &str) {
    let doc = Document {
        doc_id: id.to_owned(),
        title: "T".to_owned(),
        project: "p".to_owned(),
        tags: Vec::new(),
        source_kind: SourceKind::File,
        source: Some("/notes/a.md".to_owned()),
        added_at: "2026-11-29T11:56:00+00:00".to_owned(),
        updated_at: None,
        content_hash: "h".to_owned(),
        text: "texte".to_owned(),
    };
    let chunk = Chunk {
        doc_id: id.to_owned(),
        index: 0,
        heading_path: "T".to_owned(),
        text: "texte".to_owned(),
    };
    let embedding = FakeEmbedder::new().embed_one("T\n\ntexte");
    store
        .put(&doc, &[IndexedChunk { chunk, embedding }])
        .await
        .expect("put");
}

#[tokio::test]
async fn schema_version_is_recorded_and_a_newer_one_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path()).await.expect("open");
    store.close().await;
    let mut conn = raw(dir.path()).await;
    let version: i64 = sqlx::query("PRAGMA user_version")
        .fetch_one(&mut conn)
        .await
        .and_then(|row| row.try_get(0))
        .expect("version");
    assert_eq!(version, SCHEMA_VERSION);
    let mode: String = sqlx::query("PRAGMA journal_mode")
        .fetch_one(&mut conn)
        .await
        .and_then(|row| row.try_get(0))
        .expect("mode");
    assert_eq!(mode, "wal");
    sqlx::query("PRAGMA user_version = 99")
        .execute(&mut conn)
        .await
        .expect("bump");
    conn.close().await.expect("close");
    let err = SqliteStore::open(dir.path())
        .await
        .expect_err("newer schema");
    assert!(matches!(err, StoreError::Corrupted { ref what, .. } if what == "schema"));
    assert!(
        err.to_string()
            .contains("version 99 was written by a newer loom-notes")
    );
}

#[tokio::test]
async fn two_processes_creating_the_file_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("new/data");
    let (a, b) = tokio::join!(SqliteStore::open(&target), SqliteStore::open(&target));
    let (a, b) = (a.expect("first"), b.expect("second"));
    put_one(&a, "d1").await;
    assert_eq!(b.documents().await.expect("docs").len(), 1);
    let meta = IndexMeta {
        dense_model: "fake-64".to_owned(),
        dense_dim: 64,
        indexed_at: "2026-11-29T11:55:32.695750+00:00".to_owned(),
    };
    b.set_meta(&meta).await.expect("meta");
    assert_eq!(a.meta().await.expect("meta"), Some(meta));
    assert_eq!(
        a.find_by_source("/notes/a.md")
            .await
            .expect("find")
            .map(|d| d.doc_id),
        Some("d1".to_owned())
    );
    assert_eq!(a.find_by_source("/notes/b.md").await.expect("find"), None);
    assert_eq!(
        b.find_by_hash("h").await.expect("find").map(|d| d.doc_id),
        Some("d1".to_owned())
    );
}

#[tokio::test]
async fn a_damaged_vector_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path()).await.expect("open");
    put_one(&store, "d1").await;
    let mut conn = raw(dir.path()).await;
    sqlx::query("UPDATE chunks SET dense = x'010203'")
        .execute(&mut conn)
        .await
        .expect("damage");
    sqlx::query("UPDATE meta SET value = '100' WHERE key = 'generation'")
        .execute(&mut conn)
        .await
        .expect("bump");
    let err = store
        .dense_top(&[0.0; 64], &ChunkFilter::default(), 5)
        .await
        .expect_err("damaged");
    assert!(matches!(err, StoreError::Corrupted { ref what, .. } if what == "chunk d1:0"));
    assert!(err.to_string().contains("dense blob of 3 bytes"), "{err}");

    sqlx::query("UPDATE documents SET source_kind = 'pdf'")
        .execute(&mut conn)
        .await
        .expect("damage");
    let err = store.get("d1").await.expect_err("damaged");
    assert!(err.to_string().contains("corrupted document d1"), "{err}");
}

#[tokio::test]
async fn a_data_dir_that_is_a_file_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("plain");
    std::fs::write(&file, "x").expect("file");
    let err = SqliteStore::open(&file).await.expect_err("not a directory");
    assert!(matches!(err, StoreError::Database { .. }));
    assert!(err.to_string().contains("plain"), "{err}");
}
