//! The memory service (reference A.5, A.7, A.11, A.12): the one API the CLI and the MCP server
//! call. It validates input, deduplicates, chunks, embeds, stores and searches.
//!
//! Decisions on the reference's observed quirks (A.13):
//! * **3 — heading-only text** is kept as in Python: the document is stored with 0 chunks
//!   (`chunks: 0`, `duplicate_of: null`) and is never found by search, but it is listed,
//!   exported and can be updated.
//! * **4 — duplicate detection before replacement** is kept: an update or a replace-by-source
//!   whose new text equals *another* document's text returns that document as `duplicate_of`
//!   and leaves the target unchanged; equal to its own text, it returns itself.
//! * **5 — a query sharing no word still gets dense candidates**: kept. The dense branch ranks
//!   every filtered chunk, even at cosine 0, so with `min_score` 0 (eval) such a chunk can come
//!   first with score 0.0; with the default `MIN_SCORE` 0.1 the fake reranker's 0 scores are cut.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::chunk::{chunk_document, embed_text};
use crate::eval::{EvalCase, EvalReport, evaluate};
use crate::ids::new_doc_id;
use crate::model::{DocSummary, Document, Hit, IngestResult, SourceKind};
use crate::ports::{Embedder, Embedding, ModelError, Reranker};
use crate::search::{Grouping, group, passage, rerank_order, rrf};
use crate::settings::Settings;
use crate::store::{ChunkFilter, IndexMeta, IndexedChunk, NoteStore, StoreError};
use crate::text::{char_len, clean_project, clean_tags, content_hash, now_iso, py_strip};

/// A title and a text ready to be ingested (from `add_text`, a file or a web page).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted {
    /// The document's title.
    pub title: String,
    /// Its text (already stripped by the entry points).
    pub text: String,
}

/// A search request.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchQuery {
    /// The question or keywords; blank gives no hit.
    pub query: String,
    /// Restrict to this project (cleaned; blank = every project).
    pub project: Option<String>,
    /// Tags that must all be present (cleaned).
    pub tags: Vec<String>,
    /// At most this many hits (at least 1).
    pub k: usize,
    /// The threshold under which the walk stops; `None` = `MIN_SCORE`.
    pub min_score: Option<f64>,
}

impl SearchQuery {
    /// A global search for `query` with `k` results and the default threshold.
    pub fn new(query: impl Into<String>, k: usize) -> Self {
        SearchQuery {
            query: query.into(),
            project: None,
            tags: Vec::new(),
            k,
            min_score: None,
        }
    }
}

/// What an import did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImportReport {
    /// Documents indexed.
    pub imported: usize,
    /// Documents whose `doc_id` already existed, left alone.
    pub skipped: usize,
}

/// Why the service refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum NotesError {
    /// Bad input; the message names the rule (`title too short`, `project is required`,
    /// `empty content`).
    #[error("{0}")]
    Invalid(String),
    /// No document has this id.
    #[error("unknown document: {doc_id}")]
    NotFound {
        /// The id asked for.
        doc_id: String,
    },
    /// The index was built with another embedder: searching it would compare unrelated vectors.
    #[error(
        "the index was built with {stored_model} ({stored_dim}), the configuration asks for {model} ({dim}): run `loom-notes reindex`"
    )]
    ModelMismatch {
        /// The model recorded in the index.
        stored_model: String,
        /// Its dimension.
        stored_dim: usize,
        /// The configured model.
        model: String,
        /// Its dimension.
        dim: usize,
    },
    /// A model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The memory: ingestion, search, maintenance.
#[derive(Debug, Clone)]
pub struct MemoryService {
    embedder: Arc<dyn Embedder>,
    reranker: Arc<dyn Reranker>,
    store: Arc<dyn NoteStore>,
    settings: Settings,
}

/// Runs a model call on the blocking pool (models are CPU-bound).
async fn blocking<T: Send + 'static>(
    model: String,
    work: impl FnOnce() -> Result<T, ModelError> + Send + 'static,
) -> Result<T, ModelError> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|err| {
            Err(ModelError {
                model,
                message: format!("the model's task failed: {err}"),
            })
        })
}

impl MemoryService {
    /// A service over these models, store and settings.
    pub fn new(
        embedder: Arc<dyn Embedder>,
        reranker: Arc<dyn Reranker>,
        store: Arc<dyn NoteStore>,
        settings: Settings,
    ) -> Self {
        MemoryService {
            embedder,
            reranker,
            store,
            settings,
        }
    }

    /// A service with the fake models of A.8 (tests, `--fake`).
    pub fn with_fake_models(store: Arc<dyn NoteStore>, settings: Settings) -> Self {
        MemoryService::new(
            Arc::new(crate::fake::FakeEmbedder::new()),
            Arc::new(crate::fake::FakeReranker::new()),
            store,
            settings,
        )
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn NoteStore> {
        &self.store
    }

    /// The meta describing the current embedder, stamped now.
    fn current_meta(&self) -> IndexMeta {
        IndexMeta {
            dense_model: self.embedder.model_name().to_owned(),
            dense_dim: self.embedder.dim(),
            indexed_at: now_iso(),
        }
    }

    /// A.1: compares the stored [`IndexMeta`] with the embedder (refusing a different model
    /// or dimension with [`NotesError::ModelMismatch`]); writes it when absent. Every command
    /// but `reindex` calls it first.
    pub async fn check_model(&self) -> Result<(), NotesError> {
        match self.store.meta().await? {
            Some(meta)
                if meta.dense_model != self.embedder.model_name()
                    || meta.dense_dim != self.embedder.dim() =>
            {
                Err(NotesError::ModelMismatch {
                    stored_model: meta.dense_model,
                    stored_dim: meta.dense_dim,
                    model: self.embedder.model_name().to_owned(),
                    dim: self.embedder.dim(),
                })
            }
            Some(_) => Ok(()),
            None => Ok(self.store.set_meta(&self.current_meta()).await?),
        }
    }

    /// Adds a plain text: the title is trimmed and must be 3 code points or more (checked
    /// first), the text is trimmed; kind `text`, no source.
    pub async fn add_text(
        &self,
        text: &str,
        title: &str,
        project: &str,
        tags: Option<&[String]>,
    ) -> Result<IngestResult, NotesError> {
        let title = py_strip(title);
        if char_len(title) < 3 {
            return Err(NotesError::Invalid("title too short".to_owned()));
        }
        let extracted = Extracted {
            title: title.to_owned(),
            text: py_strip(text).to_owned(),
        };
        self.ingest(extracted, SourceKind::Text, None, project, tags)
            .await
    }

    /// A.5 `_ingest`, the common path of `add_text`, `add_file` and `add_url`: a known `source`
    /// is replaced (same `doc_id`) rather than duplicated.
    pub async fn ingest(
        &self,
        extracted: Extracted,
        kind: SourceKind,
        source: Option<String>,
        project: &str,
        tags: Option<&[String]>,
    ) -> Result<IngestResult, NotesError> {
        self.ingest_replacing(extracted, kind, source, project, tags, None)
            .await
    }

    /// The ingestion rules, in the reference's order:
    /// 1. the project is cleaned, blank → `project is required`;
    /// 2. blank text → `empty content`;
    /// 3. without `replace`, a document with the same `source` is the one replaced;
    /// 4. a document with the same content hash (itself included) → nothing written, the
    ///    result names it in `duplicate_of`;
    /// 5. else the document is written (replacing: same id and `added_at`, `updated_at` now;
    ///    tags given replace, absent tags keep the old ones), chunked and embedded.
    async fn ingest_replacing(
        &self,
        extracted: Extracted,
        kind: SourceKind,
        source: Option<String>,
        project: &str,
        tags: Option<&[String]>,
        replace: Option<Document>,
    ) -> Result<IngestResult, NotesError> {
        let Some(project) = clean_project(Some(project)) else {
            return Err(NotesError::Invalid("project is required".to_owned()));
        };
        if py_strip(&extracted.text).is_empty() {
            return Err(NotesError::Invalid("empty content".to_owned()));
        }
        let replace = match (replace, &source) {
            (None, Some(source)) => self.store.find_by_source(source).await?,
            (replace, _) => replace,
        };
        let digest = content_hash(&extracted.text);
        if let Some(same) = self.store.find_by_hash(&digest).await? {
            tracing::debug!(doc_id = %same.doc_id, "identical content already stored");
            return Ok(IngestResult {
                doc_id: same.doc_id.clone(),
                title: same.title,
                project: same.project,
                chunks: 0,
                updated: false,
                duplicate_of: Some(same.doc_id),
            });
        }
        let tags = clean_tags(tags)
            .or_else(|| replace.as_ref().map(|old| old.tags.clone()))
            .unwrap_or_default();
        let updated = replace.is_some();
        let doc = Document {
            doc_id: replace
                .as_ref()
                .map_or_else(new_doc_id, |old| old.doc_id.clone()),
            title: extracted.title,
            project,
            tags,
            source_kind: kind,
            source,
            added_at: replace
                .as_ref()
                .map_or_else(now_iso, |old| old.added_at.clone()),
            updated_at: updated.then(now_iso),
            content_hash: digest,
            text: extracted.text,
        };
        let chunks = self.index(&doc).await?;
        tracing::info!(doc_id = %doc.doc_id, chunks, updated, "document indexed");
        Ok(IngestResult {
            doc_id: doc.doc_id,
            title: doc.title,
            project: doc.project,
            chunks,
            updated,
            duplicate_of: None,
        })
    }

    /// Chunks, embeds and stores a document (replacing its old chunks); the number of chunks.
    async fn index(&self, doc: &Document) -> Result<usize, NotesError> {
        let chunks = chunk_document(
            &doc.doc_id,
            &doc.title,
            &doc.text,
            &self.settings.chunk_sizes(),
        );
        let texts: Vec<String> = chunks.iter().map(embed_text).collect();
        let embeddings = if texts.is_empty() {
            Vec::new()
        } else {
            let embedder = Arc::clone(&self.embedder);
            blocking(self.embedder.model_name().to_owned(), move || {
                let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                embedder.embed(&refs)
            })
            .await?
        };
        if embeddings.len() != chunks.len() {
            return Err(self.model_error(format!(
                "returned {} embeddings for {} chunks",
                embeddings.len(),
                chunks.len()
            )));
        }
        for embedding in &embeddings {
            self.check_dim(embedding)?;
        }
        let indexed: Vec<IndexedChunk> = chunks
            .into_iter()
            .zip(embeddings)
            .map(|(chunk, embedding)| IndexedChunk { chunk, embedding })
            .collect();
        self.store.put(doc, &indexed).await?;
        Ok(indexed.len())
    }

    fn model_error(&self, message: String) -> NotesError {
        NotesError::Model(ModelError {
            model: self.embedder.model_name().to_owned(),
            message,
        })
    }

    fn check_dim(&self, embedding: &Embedding) -> Result<(), NotesError> {
        if embedding.dense.len() == self.embedder.dim() {
            return Ok(());
        }
        Err(self.model_error(format!(
            "returned a dense vector of {} dimensions, {} expected",
            embedding.dense.len(),
            self.embedder.dim()
        )))
    }

    /// Replaces a document's text, keeping its id, title, kind, source, project, tags and
    /// `added_at` (the text is trimmed; see quirk 4 in the module's documentation).
    pub async fn update(&self, doc_id: &str, text: &str) -> Result<IngestResult, NotesError> {
        let old = self.get(doc_id).await?;
        let extracted = Extracted {
            title: old.title.clone(),
            text: py_strip(text).to_owned(),
        };
        let (kind, source, project, tags) = (
            old.source_kind,
            old.source.clone(),
            old.project.clone(),
            old.tags.clone(),
        );
        self.ingest_replacing(extracted, kind, source, &project, Some(&tags), Some(old))
            .await
    }

    /// Deletes a document and its chunks; the summary of what was deleted.
    pub async fn delete(&self, doc_id: &str) -> Result<DocSummary, NotesError> {
        let doc = self.get(doc_id).await?;
        if !self.store.delete(doc_id).await? {
            return Err(NotesError::NotFound {
                doc_id: doc_id.to_owned(),
            });
        }
        tracing::info!(doc_id, "document deleted");
        Ok(DocSummary::from(&doc))
    }

    /// A document, or [`NotesError::NotFound`].
    pub async fn get(&self, doc_id: &str) -> Result<Document, NotesError> {
        self.store
            .get(doc_id)
            .await?
            .ok_or_else(|| NotesError::NotFound {
                doc_id: doc_id.to_owned(),
            })
    }

    /// Up to `n` documents of `project` (cleaned; blank = all), newest `added_at` first.
    pub async fn list(
        &self,
        project: Option<&str>,
        n: usize,
    ) -> Result<Vec<DocSummary>, NotesError> {
        let project = clean_project(project);
        let docs = self.store.list(project.as_deref(), n).await?;
        Ok(docs.iter().map(DocSummary::from).collect())
    }

    /// The number of documents per project, sorted by project name.
    pub async fn projects(&self) -> Result<BTreeMap<String, u64>, NotesError> {
        Ok(self.store.projects().await?)
    }

    /// A.7: embeds the query, takes the dense and sparse top `PREFETCH_LIMIT` under the filter,
    /// fuses them (RRF, `RERANK_CANDIDATES`), reranks, and groups into at most `k` hits.
    pub async fn search(&self, query: &SearchQuery) -> Result<Vec<Hit>, NotesError> {
        if query.k == 0 {
            return Err(NotesError::Invalid("k must be at least 1".to_owned()));
        }
        let text = py_strip(&query.query).to_owned();
        if text.is_empty() {
            return Ok(Vec::new());
        }
        let filter = ChunkFilter {
            project: clean_project(query.project.as_deref()),
            tags: clean_tags(Some(&query.tags)).unwrap_or_default(),
        };
        let embedder = Arc::clone(&self.embedder);
        let q = text.clone();
        let embedding = blocking(self.embedder.model_name().to_owned(), move || {
            embedder.embed_query(&q)
        })
        .await?;
        self.check_dim(&embedding)?;
        let limit = self.settings.prefetch_limit;
        let dense = self
            .store
            .dense_top(&embedding.dense, &filter, limit)
            .await?;
        let sparse = self
            .store
            .sparse_top(&embedding.sparse, &filter, limit)
            .await?;
        let fused = rrf(&[&dense, &sparse], self.settings.rerank_candidates);
        if fused.is_empty() {
            return Ok(Vec::new());
        }
        let candidates: Vec<_> = fused.into_iter().map(|f| f.chunk).collect();
        let passages: Vec<String> = candidates.iter().map(passage).collect();
        let reranker = Arc::clone(&self.reranker);
        let scores = blocking(self.reranker.model_name().to_owned(), move || {
            let refs: Vec<&str> = passages.iter().map(String::as_str).collect();
            reranker.score(&text, &refs)
        })
        .await?;
        if scores.len() != candidates.len() {
            return Err(NotesError::Model(ModelError {
                model: self.reranker.model_name().to_owned(),
                message: format!(
                    "returned {} scores for {} passages",
                    scores.len(),
                    candidates.len()
                ),
            }));
        }
        let ranked = rerank_order(candidates, &scores);
        Ok(group(
            &ranked,
            &Grouping {
                k: query.k,
                threshold: query.min_score.unwrap_or(self.settings.min_score),
                max_per_doc: self.settings.max_chunks_per_doc,
                full_chunk_chars: self.settings.full_chunk_chars,
                snippet_chars: self.settings.snippet_chars,
            },
        ))
    }

    /// Every document, in insertion order (the reference backup: one JSON line each).
    pub async fn export(&self) -> Result<Vec<Document>, NotesError> {
        Ok(self.store.documents().await?)
    }

    /// Indexes exported documents as they are (no deduplication, fields kept verbatim),
    /// skipping those whose `doc_id` exists. `progress(done, total)` after each document.
    pub async fn import(
        &self,
        docs: Vec<Document>,
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> Result<ImportReport, NotesError> {
        let total = docs.len();
        let mut report = ImportReport {
            imported: 0,
            skipped: 0,
        };
        for (i, doc) in docs.into_iter().enumerate() {
            if py_strip(&doc.doc_id).is_empty() {
                return Err(NotesError::Invalid(format!(
                    "document {} of the import has an empty doc_id",
                    i + 1
                )));
            }
            if self.store.get(&doc.doc_id).await?.is_some() {
                report.skipped += 1;
            } else {
                self.index(&doc).await?;
                report.imported += 1;
            }
            progress(i + 1, total);
        }
        Ok(report)
    }

    /// Rebuilds every chunk from the documents with the current embedder and records it as the
    /// index's model (the one command that skips [`MemoryService::check_model`]). The number of
    /// documents; `progress(done, total)` after each.
    pub async fn reindex(
        &self,
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> Result<usize, NotesError> {
        let docs = self.store.documents().await?;
        self.store.clear_chunks().await?;
        self.store.set_meta(&self.current_meta()).await?;
        let total = docs.len();
        for (i, doc) in docs.iter().enumerate() {
            self.index(doc).await?;
            progress(i + 1, total);
        }
        tracing::info!(documents = total, "index rebuilt");
        Ok(total)
    }

    /// A.12: searches each case (its project, `k` hits, `min_score` 0) and measures where the
    /// expected document ranks. `progress(done, total)` after each case.
    pub async fn eval(
        &self,
        cases: &[EvalCase],
        k: usize,
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> Result<EvalReport, NotesError> {
        let mut runs = Vec::with_capacity(cases.len());
        for (i, case) in cases.iter().enumerate() {
            let query = SearchQuery {
                query: case.query.clone(),
                project: case.project.clone(),
                tags: Vec::new(),
                k,
                min_score: Some(0.0),
            };
            runs.push(self.search(&query).await?);
            progress(i + 1, cases.len());
        }
        Ok(evaluate(cases.iter().zip(runs.iter().map(Vec::as_slice))))
    }
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;
