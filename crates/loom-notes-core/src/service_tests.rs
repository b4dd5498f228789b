//! The service's rules (A.5, A.7, A.11, A.12, quirks 3–5 of A.13) with the fake models over an
//! in-memory store; the upstream Python service tests are ported here.

use std::sync::Mutex;

use super::*;
use crate::memory::InMemoryStore;

const PLOMBERIE: &str = "# Relance de devis plomberie\n\nLes plombiers perdent des devis faute de relance. L'agent relance automatiquement à J+3 et J+7 par email puis SMS.";
const FLUTTER: &str = "# Localisation Flutter\n\nLes fichiers ARB portent les traductions. GoRouter gère la navigation et Riverpod l'état.";

fn service() -> MemoryService {
    MemoryService::with_fake_models(Arc::new(InMemoryStore::new()), Settings::default())
}

fn tags(items: &[&str]) -> Vec<String> {
    items.iter().map(|t| (*t).to_owned()).collect()
}

fn query(q: &str) -> SearchQuery {
    SearchQuery::new(q, 5)
}

fn no_progress(_: usize, _: usize) {}

async fn add(svc: &MemoryService, text: &str, title: &str, project: &str) -> IngestResult {
    svc.add_text(text, title, project, None)
        .await
        .expect("added")
}

fn file(text: &str) -> Extracted {
    Extracted {
        title: "Note".to_owned(),
        text: text.to_owned(),
    }
}

#[tokio::test]
async fn add_and_search_by_project_and_tags() {
    let svc = service();
    let vente = tags(&["vente"]);
    let r1 = svc
        .add_text(PLOMBERIE, "Relance devis", "agent-pro", Some(&vente))
        .await
        .expect("added");
    let r2 = add(&svc, FLUTTER, "Localisation", "VaultLyra").await;
    assert!(r1.chunks >= 1 && r2.chunks >= 1);
    assert_eq!((r1.duplicate_of.as_ref(), r1.updated), (None, false));
    assert_eq!(r2.project, "vaultlyra");

    let hits = svc
        .search(&query("relance devis plombiers"))
        .await
        .expect("search");
    assert_eq!(hits[0].doc_id, r1.doc_id);
    assert_eq!(hits[0].project, "agent-pro");
    assert!(hits[0].heading_path.starts_with("Relance devis"));

    let mut q = query("relance devis plombiers");
    q.project = Some(" VaultLyra ".to_owned());
    let hits = svc.search(&q).await.expect("search");
    assert!(hits.iter().all(|h| h.project == "vaultlyra"));

    let mut q = query("traductions ARB");
    q.tags = tags(&["Vente"]);
    let hits = svc.search(&q).await.expect("search");
    assert!(hits.iter().all(|h| h.doc_id == r1.doc_id));

    let projects = svc.projects().await.expect("projects");
    assert_eq!(
        projects.into_iter().collect::<Vec<_>>(),
        vec![("agent-pro".to_owned(), 1), ("vaultlyra".to_owned(), 1)]
    );
}

#[tokio::test]
async fn same_text_under_another_title_is_a_duplicate() {
    let svc = service();
    let r1 = add(&svc, PLOMBERIE, "Relance devis", "agent-pro").await;
    let upper = PLOMBERIE.to_uppercase();
    let r2 = add(&svc, &format!("  {upper}\n"), "Autre titre", "autre").await;
    assert_eq!(r2.duplicate_of.as_deref(), Some(r1.doc_id.as_str()));
    assert_eq!((r2.doc_id.as_str(), r2.chunks), (r1.doc_id.as_str(), 0));
    assert_eq!(
        (r2.title.as_str(), r2.project.as_str()),
        ("Relance devis", "agent-pro")
    );
    assert_eq!(svc.projects().await.expect("projects").len(), 1);
}

#[tokio::test]
async fn update_keeps_identity_and_reindexes() {
    let svc = service();
    let vente = tags(&["vente"]);
    let r = svc
        .add_text(PLOMBERIE, "Relance devis", "agent-pro", Some(&vente))
        .await
        .expect("added");
    let before = svc.get(&r.doc_id).await.expect("doc");
    let u = svc
        .update(&r.doc_id, &format!("{FLUTTER}\n\n"))
        .await
        .expect("updated");
    assert_eq!((u.doc_id.as_str(), u.updated), (r.doc_id.as_str(), true));
    assert_eq!(u.duplicate_of, None);
    let doc = svc.get(&r.doc_id).await.expect("doc");
    assert_eq!(doc.text, FLUTTER);
    assert_eq!(doc.tags, vente);
    assert_eq!(doc.title, "Relance devis");
    assert_eq!(doc.project, "agent-pro");
    assert_eq!(doc.source_kind, SourceKind::Text);
    assert_eq!(doc.added_at, before.added_at);
    assert!(doc.updated_at.is_some());
    assert_eq!(doc.content_hash, content_hash(FLUTTER));

    let hits = svc.search(&query("traductions ARB")).await.expect("search");
    assert_eq!(hits[0].doc_id, r.doc_id);
    for hit in svc
        .search(&query("plombiers relance"))
        .await
        .expect("search")
    {
        assert!(!hit.snippet.contains("plomb"), "old content still indexed");
    }
    let err = svc.update("nope", "text").await.expect_err("unknown");
    assert!(matches!(err, NotesError::NotFound { ref doc_id } if doc_id == "nope"));
    assert_eq!(err.to_string(), "unknown document: nope");
}

#[tokio::test]
async fn delete_returns_the_summary_and_forgets() {
    let svc = service();
    let r = add(&svc, PLOMBERIE, "Relance devis", "agent-pro").await;
    let summary = svc.delete(&r.doc_id).await.expect("deleted");
    assert_eq!(summary.doc_id, r.doc_id);
    assert_eq!(summary.title, "Relance devis");
    assert_eq!(summary.chars, PLOMBERIE.chars().count());
    assert!(matches!(
        svc.get(&r.doc_id).await,
        Err(NotesError::NotFound { .. })
    ));
    assert!(
        svc.search(&query("plombiers"))
            .await
            .expect("search")
            .is_empty()
    );
    assert!(matches!(
        svc.delete(&r.doc_id).await,
        Err(NotesError::NotFound { .. })
    ));
    assert!(matches!(
        svc.get("00000000-0000-0000-0000-000000000000").await,
        Err(NotesError::NotFound { .. })
    ));
}

#[tokio::test]
async fn input_is_validated_in_order() {
    let svc = service();
    let invalid = |r: Result<IngestResult, NotesError>| match r {
        Err(NotesError::Invalid(message)) => message,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(
        invalid(svc.add_text("x", " ab ", "  ", None).await),
        "title too short"
    );
    assert_eq!(
        invalid(svc.add_text("texte", "titre", "  ", None).await),
        "project is required"
    );
    assert_eq!(
        invalid(svc.add_text("   ", "titre", "p", None).await),
        "empty content"
    );
    let empty = Extracted {
        title: "T".to_owned(),
        text: " \n ".to_owned(),
    };
    assert_eq!(
        invalid(svc.ingest(empty, SourceKind::Url, None, "p", None).await),
        "empty content"
    );
    assert!(svc.projects().await.expect("projects").is_empty());
}

#[tokio::test]
async fn same_source_is_replaced_not_duplicated() {
    let svc = service();
    let source = Some("/notes/note.md".to_owned());
    let a = tags(&["a"]);
    let r1 = svc
        .ingest(
            file("# Note\n\nversion un"),
            SourceKind::File,
            source.clone(),
            "loom",
            Some(&a),
        )
        .await
        .expect("added");
    assert!(!r1.updated);

    let same = svc
        .ingest(
            file("# Note\n\nversion un"),
            SourceKind::File,
            source.clone(),
            "loom",
            None,
        )
        .await
        .expect("duplicate");
    assert_eq!(same.duplicate_of.as_deref(), Some(r1.doc_id.as_str()));
    assert_eq!(same.chunks, 0);

    let renamed = Extracted {
        title: "Note v2".to_owned(),
        text: "# Note v2\n\nversion deux".to_owned(),
    };
    let r2 = svc
        .ingest(renamed, SourceKind::File, source.clone(), "loom", None)
        .await
        .expect("replaced");
    assert_eq!(r2.doc_id, r1.doc_id);
    assert!(r2.updated && r2.duplicate_of.is_none());
    let doc = svc.get(&r1.doc_id).await.expect("doc");
    assert!(doc.text.contains("version deux"));
    assert_eq!(doc.title, "Note v2");
    assert_eq!(doc.tags, a, "tags kept when none are given");
    let listed = svc.list(None, 20).await.expect("list");
    assert_eq!(doc.added_at, listed[0].added_at);
    assert!(doc.updated_at.is_some());
    assert_eq!(svc.projects().await.expect("projects").len(), 1);

    let b = tags(&["B"]);
    let r3 = svc
        .ingest(
            file("# Note\n\nversion trois"),
            SourceKind::File,
            source,
            "Autre",
            Some(&b),
        )
        .await
        .expect("replaced");
    let doc = svc.get(&r3.doc_id).await.expect("doc");
    assert_eq!(
        (doc.project.as_str(), doc.tags.clone()),
        ("autre", tags(&["b"]))
    );
    assert_eq!(r3.doc_id, r1.doc_id);
}

/// Quirk 4: duplicate detection runs before replacement.
#[tokio::test]
async fn update_to_another_documents_text_changes_nothing() {
    let svc = service();
    let r1 = add(&svc, PLOMBERIE, "Relance devis", "agent-pro").await;
    let r2 = add(&svc, FLUTTER, "Localisation", "vaultlyra").await;
    let u = svc.update(&r2.doc_id, PLOMBERIE).await.expect("answered");
    assert_eq!(u.duplicate_of.as_deref(), Some(r1.doc_id.as_str()));
    assert_eq!(
        (u.doc_id.as_str(), u.chunks, u.updated),
        (r1.doc_id.as_str(), 0, false)
    );
    let target = svc.get(&r2.doc_id).await.expect("doc");
    assert_eq!(target.text, FLUTTER);
    assert_eq!(target.updated_at, None);
    // Equal to its own text: itself.
    let own = svc.update(&r1.doc_id, PLOMBERIE).await.expect("answered");
    assert_eq!(own.duplicate_of.as_deref(), Some(r1.doc_id.as_str()));
}

/// Quirk 3: a text of headings only is stored with 0 chunks and never found.
#[tokio::test]
async fn heading_only_text_is_stored_without_chunks() {
    let svc = service();
    let r = add(&svc, "# Titre seul", "Titre seul", "p").await;
    assert_eq!((r.chunks, r.duplicate_of.as_ref()), (0, None));
    assert_eq!(svc.get(&r.doc_id).await.expect("doc").text, "# Titre seul");
    let mut q = query("titre seul");
    q.min_score = Some(0.0);
    assert!(svc.search(&q).await.expect("search").is_empty());
    assert_eq!(svc.list(None, 5).await.expect("list").len(), 1);
}

/// Quirk 5: the dense branch brings candidates for a query sharing no word.
#[tokio::test]
async fn unrelated_query_still_gets_dense_candidates() {
    let svc = service();
    let r = add(&svc, PLOMBERIE, "Relance devis", "agent-pro").await;
    assert!(
        svc.search(&query("licorne"))
            .await
            .expect("search")
            .is_empty()
    );
    let mut q = query("licorne");
    q.min_score = Some(0.0);
    let hits = svc.search(&q).await.expect("search");
    assert_eq!(hits.len(), 1);
    assert_eq!(
        (hits[0].doc_id.as_str(), hits[0].score),
        (r.doc_id.as_str(), 0.0)
    );
}

#[tokio::test]
async fn search_edges() {
    let svc = service();
    add(&svc, PLOMBERIE, "Relance devis", "agent-pro").await;
    assert!(svc.search(&query("   ")).await.expect("search").is_empty());
    let err = svc
        .search(&SearchQuery::new("devis", 0))
        .await
        .expect_err("k 0");
    assert!(matches!(err, NotesError::Invalid(_)));
    let mut q = query("devis");
    q.project = Some("   ".to_owned());
    assert_eq!(svc.search(&q).await.expect("search").len(), 1);
}

#[tokio::test]
async fn short_chunks_are_whole_and_long_ones_snippets() {
    let svc = service();
    let table = "| a | b |\n|---|---|\n| 1 | 2 |";
    add(
        &svc,
        &format!("Tableau des rôles.\n\n{table}"),
        "Rôles",
        "p",
    )
    .await;
    let hits = svc.search(&query("tableau rôles")).await.expect("search");
    assert!(!hits[0].truncated && hits[0].snippet.contains(table));

    add(&svc, &"Mot ".repeat(600), "Long texte", "p").await;
    let hits = svc.search(&query("mot mot mot")).await.expect("search");
    let hit = hits
        .iter()
        .find(|h| h.title == "Long texte")
        .expect("found");
    assert!(hit.truncated && hit.snippet.chars().count() <= 301 && hit.snippet.ends_with('…'));
}

#[tokio::test]
async fn list_is_newest_first_and_projects_sorted() {
    let svc = service();
    let mut ids = Vec::new();
    for (i, project) in ["zeta", "Alpha", "zeta"].iter().enumerate() {
        let r = add(&svc, &format!("document numéro {i}"), "Titre", project).await;
        ids.push(r.doc_id);
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let listed: Vec<String> = svc
        .list(None, 20)
        .await
        .expect("list")
        .into_iter()
        .map(|d| d.doc_id)
        .collect();
    assert_eq!(listed, vec![ids[2].clone(), ids[1].clone(), ids[0].clone()]);
    let zeta = svc.list(Some(" ZETA "), 1).await.expect("list");
    assert_eq!(zeta.len(), 1);
    assert_eq!(zeta[0].doc_id, ids[2]);
    let projects: Vec<(String, u64)> = svc
        .projects()
        .await
        .expect("projects")
        .into_iter()
        .collect();
    assert_eq!(
        projects,
        vec![("alpha".to_owned(), 1), ("zeta".to_owned(), 2)]
    );
}

#[tokio::test]
async fn export_import_reindex() {
    let svc = service();
    let r1 = add(&svc, PLOMBERIE, "Relance devis", "agent-pro").await;
    let r2 = add(&svc, FLUTTER, "Localisation", "vaultlyra").await;
    let exported = svc.export().await.expect("export");
    assert_eq!(
        exported
            .iter()
            .map(|d| d.doc_id.as_str())
            .collect::<Vec<_>>(),
        vec![r1.doc_id.as_str(), r2.doc_id.as_str()]
    );
    svc.delete(&r1.doc_id).await.expect("deleted");
    let calls = Mutex::new(Vec::new());
    let progress = |done, total| calls.lock().expect("lock").push((done, total));
    let report = svc
        .import(exported.clone(), &progress)
        .await
        .expect("import");
    assert_eq!(
        report,
        ImportReport {
            imported: 1,
            skipped: 1
        }
    );
    assert_eq!(*calls.lock().expect("lock"), vec![(1, 2), (2, 2)]);
    assert_eq!(svc.get(&r1.doc_id).await.expect("doc"), exported[0]);
    assert_eq!(svc.get(&r2.doc_id).await.expect("doc").text, FLUTTER);

    assert_eq!(svc.reindex(&no_progress).await.expect("reindex"), 2);
    let hits = svc
        .search(&query("relance devis plombiers"))
        .await
        .expect("search");
    assert_eq!(hits[0].doc_id, r1.doc_id);
}

#[tokio::test]
async fn import_keeps_fields_verbatim_without_dedup() {
    let svc = service();
    let r = add(&svc, PLOMBERIE, "Relance devis", "agent-pro").await;
    let mut copy = svc.get(&r.doc_id).await.expect("doc");
    copy.doc_id = "11111111-1111-4111-8111-111111111111".to_owned();
    copy.project = "Mixed Case".to_owned();
    let report = svc
        .import(vec![copy.clone()], &no_progress)
        .await
        .expect("import");
    assert_eq!(report.imported, 1);
    assert_eq!(svc.get(&copy.doc_id).await.expect("doc"), copy);
    let mut blank = copy;
    blank.doc_id = " ".to_owned();
    assert!(matches!(
        svc.import(vec![blank], &no_progress).await,
        Err(NotesError::Invalid(_))
    ));
}

#[tokio::test]
async fn model_check_writes_then_refuses_another_model() {
    let store: Arc<dyn NoteStore> = Arc::new(InMemoryStore::new());
    let svc = MemoryService::with_fake_models(Arc::clone(&store), Settings::default());
    svc.check_model().await.expect("first start");
    let meta = store.meta().await.expect("meta").expect("written");
    assert_eq!((meta.dense_model.as_str(), meta.dense_dim), ("fake-64", 64));
    svc.check_model().await.expect("same model");

    store
        .set_meta(&IndexMeta {
            dense_model: "BAAI/bge-m3".to_owned(),
            dense_dim: 1024,
            indexed_at: meta.indexed_at.clone(),
        })
        .await
        .expect("meta");
    let err = svc.check_model().await.expect_err("mismatch");
    assert!(matches!(
        err,
        NotesError::ModelMismatch {
            stored_dim: 1024,
            dim: 64,
            ..
        }
    ));
    assert_eq!(
        err.to_string(),
        "the index was built with BAAI/bge-m3 (1024), the configuration asks for fake-64 (64): run `loom-notes reindex`"
    );
    svc.reindex(&no_progress)
        .await
        .expect("reindex skips the check");
    svc.check_model()
        .await
        .expect("rebuilt with the current model");
}

#[tokio::test]
async fn upstream_eval_metrics_and_threshold() {
    let svc = service();
    let docs = [
        (
            "Lancer Qdrant",
            "docker run qdrant avec le stockage dans le dépôt et restart unless-stopped",
        ),
        (
            "Rôles loom-fs",
            "reference sourcecode workspace sont les rôles plafonds de loom-fs",
        ),
        (
            "Localisation",
            "les fichiers ARB portent les traductions flutter de vaultlyra",
        ),
    ];
    let mut ids = Vec::new();
    for (title, text) in docs {
        ids.push(add(&svc, text, title, "p").await.doc_id);
    }
    let case = |query: &str, doc_id: &str| EvalCase {
        query: query.to_owned(),
        doc_id: doc_id.to_owned(),
        title: None,
        project: None,
    };
    let cases = [
        case("docker qdrant restart", &ids[0]),
        case("rôles plafonds loom-fs", &ids[1]),
        case("traductions ARB flutter", &ids[2]),
        case("sujet inconnu", "00000000-0000-0000-0000-0"),
    ];
    let report = svc.eval(&cases, 10, &no_progress).await.expect("eval");
    assert_eq!(report.cases, 4);
    let ranks: Vec<Option<usize>> = report.results.iter().map(|r| r.rank).collect();
    assert_eq!(ranks, vec![Some(1), Some(1), Some(1), None]);
    assert_eq!(report.results[3].expected_score, None);
    assert_eq!((report.recall_at_1, report.recall_at_5), (0.75, 0.75));
    assert!((report.mrr - 0.75).abs() < 1e-9);
    let suggested = report.suggested_min_score.expect("suggested");
    assert!(suggested > 0.0 && suggested <= 1.0);
    assert!(report.noise_removed_at_suggested.is_some());
}
