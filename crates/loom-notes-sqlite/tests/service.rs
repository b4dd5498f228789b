//! The memory service end to end on the SQLite store with the fake models: the acceptance
//! scenarios (add, duplicate, replace by source, update, delete, filtered search,
//! export/import, reindex, model mismatch, reopening).

// Test helpers panic on failure: that is the failed test.
#![allow(clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use loom_notes_core::fake::{FakeEmbedder, FakeReranker};
use loom_notes_core::{
    Document, Embedder, Embedding, Extracted, MemoryService, ModelError, NotesError, SearchQuery,
    Settings, SourceKind, SparseVector,
};
use loom_notes_sqlite::{SqliteStore, open_fake_service, open_service};

/// Two sections of more than `CHUNK_MIN_CHARS` (200), so two chunks.
fn qdrant() -> String {
    let filler = "Ceci complète la section. ".repeat(8);
    format!(
        "# Guide Qdrant\n\nQdrant stocke les vecteurs. Le port gRPC est 6334. {filler}\n\n## Fusion\n\nLa fusion RRF combine dense et sparse. {filler}"
    )
}
const DOCKER: &str = "Le conteneur docker redémarre avec restart unless-stopped.";

async fn service(dir: &Path) -> MemoryService {
    let svc = open_fake_service(dir, Settings::default())
        .await
        .expect("service");
    svc.check_model().await.expect("model");
    svc
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn no_progress(_: usize, _: usize) {}

#[tokio::test]
async fn add_search_filters_and_duplicates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let svc = service(dir.path()).await;
    let rag = strings(&["RAG", " qdrant "]);
    let q = svc
        .add_text(&qdrant(), "Guide Qdrant", " Alpha ", Some(&rag))
        .await
        .expect("added");
    assert_eq!((q.project.as_str(), q.chunks), ("alpha", 2));
    let d = svc
        .add_text(DOCKER, "Docker", "beta", None)
        .await
        .expect("added");
    assert_eq!(d.chunks, 1);

    let hits = svc
        .search(&SearchQuery::new("fusion RRF qdrant", 5))
        .await
        .expect("search");
    assert_eq!(hits[0].doc_id, q.doc_id);
    assert_eq!(hits[0].heading_path, "Guide Qdrant > Fusion");
    assert_eq!(hits[0].score, 1.0);
    assert!(hits.len() <= 2 || hits[2].doc_id != q.doc_id);

    let mut filtered = SearchQuery::new("fusion RRF qdrant conteneur", 5);
    filtered.project = Some("BETA".to_owned());
    let hits = svc.search(&filtered).await.expect("search");
    assert!(!hits.is_empty() && hits.iter().all(|h| h.doc_id == d.doc_id));

    let mut tagged = SearchQuery::new("conteneur docker", 5);
    tagged.tags = strings(&["rag", "qdrant"]);
    tagged.min_score = Some(0.0);
    let hits = svc.search(&tagged).await.expect("search");
    assert!(!hits.is_empty() && hits.iter().all(|h| h.doc_id == q.doc_id));
    tagged.tags = strings(&["rag", "absent"]);
    assert!(svc.search(&tagged).await.expect("search").is_empty());

    let dup = svc
        .add_text(&qdrant().to_uppercase(), "Autre titre", "gamma", None)
        .await
        .expect("answered");
    assert_eq!(dup.duplicate_of.as_deref(), Some(q.doc_id.as_str()));
    assert_eq!((dup.chunks, dup.project.as_str()), (0, "alpha"));
    let projects: Vec<(String, u64)> = svc
        .projects()
        .await
        .expect("projects")
        .into_iter()
        .collect();
    assert_eq!(projects, vec![("alpha".into(), 1), ("beta".into(), 1)]);
}

#[tokio::test]
async fn replace_by_source_update_and_delete() {
    let dir = tempfile::tempdir().expect("tempdir");
    let svc = service(dir.path()).await;
    let source = Some("https://example.org/page".to_owned());
    let page = |title: &str, text: &str| Extracted {
        title: title.to_owned(),
        text: text.to_owned(),
    };
    let a = strings(&["a"]);
    let first = svc
        .ingest(
            page("Page", "version un"),
            SourceKind::Url,
            source.clone(),
            "web",
            Some(&a),
        )
        .await
        .expect("added");
    let again = svc
        .ingest(
            page("Page", "version un"),
            SourceKind::Url,
            source.clone(),
            "web",
            None,
        )
        .await
        .expect("duplicate of itself");
    assert_eq!(again.duplicate_of.as_deref(), Some(first.doc_id.as_str()));
    let replaced = svc
        .ingest(
            page("Page 2", "version deux"),
            SourceKind::Url,
            source,
            "web",
            None,
        )
        .await
        .expect("replaced");
    assert_eq!(replaced.doc_id, first.doc_id);
    assert!(replaced.updated);
    let doc = svc.get(&first.doc_id).await.expect("doc");
    assert_eq!(
        (doc.title.as_str(), doc.text.as_str()),
        ("Page 2", "version deux")
    );
    assert_eq!(doc.tags, a);
    assert_eq!(doc.source_kind, SourceKind::Url);
    assert!(doc.updated_at.is_some());

    let updated = svc
        .update(&first.doc_id, "  version trois  ")
        .await
        .expect("updated");
    assert!(updated.updated);
    let after = svc.get(&first.doc_id).await.expect("doc");
    assert_eq!(after.text, "version trois");
    assert_eq!(after.added_at, doc.added_at);
    assert_eq!(after.source, doc.source);
    let hits = svc
        .search(&SearchQuery::new("version trois", 5))
        .await
        .expect("search");
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].snippet, "version trois");

    let summary = svc.delete(&first.doc_id).await.expect("deleted");
    assert_eq!((summary.chars, summary.title.as_str()), (13, "Page 2"));
    assert!(matches!(
        svc.get(&first.doc_id).await,
        Err(NotesError::NotFound { .. })
    ));
    assert!(
        svc.search(&SearchQuery::new("version trois", 5))
            .await
            .expect("search")
            .is_empty()
    );
}

#[tokio::test]
async fn export_import_round_trip_through_jsonl() {
    let dir = tempfile::tempdir().expect("tempdir");
    let svc = service(dir.path()).await;
    let q = svc
        .add_text(&qdrant(), "Guide Qdrant", "alpha", None)
        .await
        .expect("added");
    svc.add_text(DOCKER, "Docker", "beta", None)
        .await
        .expect("added");
    let lines: Vec<String> = svc
        .export()
        .await
        .expect("export")
        .iter()
        .map(|d| serde_json::to_string(d).expect("json"))
        .collect();
    assert!(lines[0].starts_with(&format!(
        r#"{{"doc_id":"{}","title":"Guide Qdrant""#,
        q.doc_id
    )));

    let other = tempfile::tempdir().expect("tempdir");
    let fresh = service(other.path()).await;
    let docs: Vec<Document> = lines
        .iter()
        .map(|l| serde_json::from_str(l).expect("document"))
        .collect();
    let report = fresh
        .import(docs.clone(), &no_progress)
        .await
        .expect("import");
    assert_eq!((report.imported, report.skipped), (2, 0));
    assert_eq!(fresh.export().await.expect("export"), docs);
    let report = fresh.import(docs, &no_progress).await.expect("import");
    assert_eq!((report.imported, report.skipped), (0, 2));
    let hits = fresh
        .search(&SearchQuery::new("fusion RRF", 5))
        .await
        .expect("search");
    assert_eq!(hits[0].doc_id, q.doc_id);
}

/// An embedder of another model, to check the index's model guard.
#[derive(Debug)]
struct OtherEmbedder;

impl Embedder for OtherEmbedder {
    fn model_name(&self) -> &str {
        "other-8"
    }
    fn dim(&self) -> usize {
        8
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Embedding>, ModelError> {
        texts.iter().map(|t| self.embed_query(t)).collect()
    }
    fn embed_query(&self, text: &str) -> Result<Embedding, ModelError> {
        let mut dense = vec![0.0; 8];
        dense[text.len() % 8] = 1.0;
        Ok(Embedding {
            dense,
            sparse: SparseVector::default(),
        })
    }
}

#[tokio::test]
async fn another_model_is_refused_until_reindex() {
    let dir = tempfile::tempdir().expect("tempdir");
    let svc = service(dir.path()).await;
    let q = svc
        .add_text(&qdrant(), "Guide Qdrant", "alpha", None)
        .await
        .expect("added");
    let other = open_service(
        dir.path(),
        Arc::new(OtherEmbedder),
        Arc::new(FakeReranker::new()),
        Settings::default(),
    )
    .await
    .expect("service");
    let err = other.check_model().await.expect_err("mismatch");
    assert_eq!(
        err.to_string(),
        "the index was built with fake-64 (64), the configuration asks for other-8 (8): run `loom-notes reindex`"
    );
    let calls = std::sync::Mutex::new(0);
    let progress = |_, _| *calls.lock().expect("lock") += 1;
    assert_eq!(other.reindex(&progress).await.expect("reindex"), 1);
    assert_eq!(*calls.lock().expect("lock"), 1);
    other.check_model().await.expect("rebuilt");
    let mut query = SearchQuery::new("fusion", 5);
    query.min_score = Some(0.0);
    assert_eq!(
        other.search(&query).await.expect("search")[0].doc_id,
        q.doc_id
    );
    // And now the fake model is the stranger.
    assert!(matches!(
        svc.check_model().await,
        Err(NotesError::ModelMismatch {
            stored_dim: 8,
            dim: 64,
            ..
        })
    ));
}

#[tokio::test]
async fn data_survives_reopening() {
    let dir = tempfile::tempdir().expect("tempdir");
    let id = {
        let store = SqliteStore::open(dir.path()).await.expect("open");
        let svc = MemoryService::with_fake_models(Arc::new(store), Settings::default());
        svc.check_model().await.expect("model");
        svc.add_text(DOCKER, "Docker", "beta", None)
            .await
            .expect("added")
            .doc_id
    };
    let svc = service(dir.path()).await;
    assert_eq!(
        svc.list(Some("beta"), 10).await.expect("list")[0].doc_id,
        id
    );
    let hits = svc
        .search(&SearchQuery::new("conteneur docker", 5))
        .await
        .expect("search");
    assert_eq!(hits[0].doc_id, id);
    assert_eq!(hits[0].title, "Docker");
    assert!(hits[0].added_at.ends_with("+00:00"));
    // The vectors went through the blobs unchanged: the chunk's own sparse vector scores
    // the sum of its squared counts, its own dense vector a cosine of 1.
    let embedded = FakeEmbedder::new().embed_one(&format!("Docker\n\n{DOCKER}"));
    let filter = loom_notes_core::ChunkFilter::default();
    let sparse = svc
        .store()
        .sparse_top(&embedded.sparse, &filter, 1)
        .await
        .expect("sparse");
    let squares: f32 = embedded.sparse.values.iter().map(|v| v * v).sum();
    assert_eq!(sparse[0].score, squares);
    let dense = svc
        .store()
        .dense_top(&embedded.dense, &filter, 1)
        .await
        .expect("dense");
    assert!((dense[0].score - 1.0).abs() < 1e-6);
}

#[tokio::test]
async fn eval_runs_on_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let svc = service(dir.path()).await;
    let q = svc
        .add_text(&qdrant(), "Guide Qdrant", "alpha", None)
        .await
        .expect("added");
    let d = svc
        .add_text(DOCKER, "Docker", "beta", None)
        .await
        .expect("added");
    let cases: Vec<loom_notes_core::EvalCase> = [
        r#"{"query":"fusion RRF qdrant","doc_id":"Q"}"#,
        r#"{"query":"conteneur docker","doc_id":"D","project":"beta"}"#,
        r#"{"query":"licorne","doc_id":"D"}"#,
    ]
    .iter()
    .map(|l| {
        let l = l.replace("\"Q\"", &format!("\"{}\"", q.doc_id));
        let l = l.replace("\"D\"", &format!("\"{}\"", d.doc_id));
        serde_json::from_str(&l).expect("case")
    })
    .collect();
    let report = svc.eval(&cases, 10, &no_progress).await.expect("eval");
    assert_eq!(report.results[0].rank, Some(1));
    assert_eq!(report.results[1].rank, Some(1));
    assert!(
        report.results[2].rank.is_some(),
        "dense candidates at score 0"
    );
    assert_eq!(report.results[2].expected_score, Some(0.0));
    assert_eq!(report.suggested_min_score, Some(0.0));
    let text = report.render_text();
    assert!(
        text.starts_with("ok       #1  1.000  fusion RRF qdrant\n"),
        "{text}"
    );
}
