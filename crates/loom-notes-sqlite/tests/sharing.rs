//! One data directory used by two stores at once (the CLI while the MCP server runs), and the
//! vector cache: reloaded only when another connection wrote.

// Test helpers panic on failure: that is the failed test.
#![allow(clippy::expect_used)]

use std::sync::Arc;

use loom_notes_core::fake::FakeEmbedder;
use loom_notes_core::{
    Chunk, ChunkFilter, Document, IndexedChunk, MemoryService, NoteStore, SearchQuery, Settings,
    SourceKind,
};
use loom_notes_sqlite::{DB_FILE, SqliteStore};

fn doc(id: &str, project: &str, text: &str) -> (Document, Vec<IndexedChunk>) {
    let doc = Document {
        doc_id: id.to_owned(),
        title: format!("Title {id}"),
        project: project.to_owned(),
        tags: vec!["t".to_owned()],
        source_kind: SourceKind::Text,
        source: None,
        added_at: "2026-11-29T11:56:00.861794+00:00".to_owned(),
        updated_at: None,
        content_hash: format!("hash-{id}"),
        text: text.to_owned(),
    };
    let chunk = Chunk {
        doc_id: id.to_owned(),
        index: 0,
        heading_path: doc.title.clone(),
        text: text.to_owned(),
    };
    let embedding = FakeEmbedder::new().embed_one(text);
    (doc, vec![IndexedChunk { chunk, embedding }])
}

async fn dense_docs(store: &SqliteStore, text: &str) -> Vec<String> {
    let query = FakeEmbedder::new().embed_one(text);
    store
        .dense_top(&query.dense, &ChunkFilter::default(), 10)
        .await
        .expect("search")
        .into_iter()
        .map(|hit| hit.chunk.doc_id)
        .collect()
}

#[tokio::test]
async fn two_stores_on_one_directory_see_each_others_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = SqliteStore::open(dir.path()).await.expect("open");
    let cli = SqliteStore::open(dir.path()).await.expect("open twice");
    assert!(dir.path().join(DB_FILE).is_file());
    assert_eq!(server.path(), dir.path().join(DB_FILE));

    let (a, chunks) = doc("a", "p", "qdrant stocke les vecteurs");
    cli.put(&a, &chunks).await.expect("put");
    assert_eq!(server.get("a").await.expect("get"), Some(a.clone()));
    assert_eq!(dense_docs(&server, "qdrant").await, vec!["a"]);
    let sparse = FakeEmbedder::new().embed_one("vecteurs").sparse;
    let hits = server
        .sparse_top(&sparse, &ChunkFilter::default(), 10)
        .await
        .expect("sparse");
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].chunk.title, "Title a");
    assert_eq!(hits[0].chunk.tags, vec!["t"]);

    server.delete("a").await.expect("delete");
    assert!(dense_docs(&cli, "qdrant").await.is_empty());
    assert_eq!(cli.get("a").await.expect("get"), None);
}

#[tokio::test]
async fn the_cache_reloads_only_after_another_connections_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = SqliteStore::open(dir.path()).await.expect("open");
    let cli = SqliteStore::open(dir.path()).await.expect("open twice");

    let (a, chunks) = doc("a", "p", "fusion rrf");
    server.put(&a, &chunks).await.expect("put");
    assert_eq!(dense_docs(&server, "fusion").await, vec!["a"]);
    let loads = server.cache_loads();
    assert_eq!(loads, 1, "first search loads");
    dense_docs(&server, "fusion").await;
    dense_docs(&server, "rrf").await;
    assert_eq!(server.cache_loads(), loads, "no write, no reload");

    // Its own write updates the copy in place.
    let (b, chunks) = doc("b", "p", "fusion hybride");
    server.put(&b, &chunks).await.expect("put");
    let mut found = dense_docs(&server, "fusion").await;
    found.sort();
    assert_eq!(found, vec!["a", "b"]);
    assert_eq!(
        server.cache_loads(),
        loads,
        "own write applied without reload"
    );

    // Another connection's write is seen, through one reload.
    let (c, chunks) = doc("c", "p", "fusion externe");
    cli.put(&c, &chunks).await.expect("put");
    let found = dense_docs(&server, "fusion externe").await;
    assert_eq!(found[0], "c");
    assert_eq!(found.len(), 3);
    assert_eq!(server.cache_loads(), loads + 1);
    dense_docs(&server, "fusion").await;
    assert_eq!(server.cache_loads(), loads + 1);

    cli.clear_chunks().await.expect("clear");
    assert!(dense_docs(&server, "fusion").await.is_empty());
    assert_eq!(server.cache_loads(), loads + 2);
    assert_eq!(server.documents().await.expect("docs").len(), 3);
}

#[tokio::test]
async fn services_on_one_directory_share_documents_and_search() {
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = Settings::default();
    let server = loom_notes_sqlite::open_fake_service(dir.path(), settings.clone())
        .await
        .expect("server");
    let store = Arc::new(SqliteStore::open(dir.path()).await.expect("open"));
    let cli = MemoryService::with_fake_models(store, settings);
    server.check_model().await.expect("meta written");
    cli.check_model().await.expect("same model");

    assert!(
        server
            .search(&SearchQuery::new("plombiers", 5))
            .await
            .expect("search")
            .is_empty()
    );
    let added = cli
        .add_text(
            "Les plombiers perdent des devis.",
            "Relance devis",
            "pro",
            None,
        )
        .await
        .expect("added");
    let hits = server
        .search(&SearchQuery::new("plombiers devis", 5))
        .await
        .expect("search");
    assert_eq!(hits[0].doc_id, added.doc_id);
    let dup = server
        .add_text("les PLOMBIERS perdent des devis.", "Autre", "x", None)
        .await
        .expect("answered");
    assert_eq!(dup.duplicate_of.as_deref(), Some(added.doc_id.as_str()));
}

#[tokio::test]
async fn concurrent_writers_from_two_stores_all_land() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one = Arc::new(SqliteStore::open(dir.path()).await.expect("open"));
    let two = Arc::new(SqliteStore::open(dir.path()).await.expect("open twice"));
    let mut tasks = Vec::new();
    for i in 0..20 {
        let store = if i % 2 == 0 {
            Arc::clone(&one)
        } else {
            Arc::clone(&two)
        };
        tasks.push(tokio::spawn(async move {
            let (d, chunks) = doc(&format!("d{i}"), "p", &format!("texte commun numéro {i}"));
            store.put(&d, &chunks).await.expect("put");
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(dense_docs(&one, "texte commun").await.len(), 10);
    let all = two
        .dense_top(
            &FakeEmbedder::new().embed_one("commun").dense,
            &ChunkFilter::default(),
            100,
        )
        .await
        .expect("search");
    assert_eq!(all.len(), 20);
    assert_eq!(one.documents().await.expect("docs").len(), 20);
}
