//! An in-memory [`NoteStore`], for tests and throw-away services: documents and chunks in
//! vectors behind a mutex, scored by [`crate::scoring`] like the SQLite store.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;

use crate::model::Document;
use crate::ports::SparseVector;
use crate::scoring::{self, VectorRow};
use crate::store::{
    ChunkFilter, ChunkPayload, IndexMeta, IndexedChunk, NoteStore, ScoredChunk, StoreError,
};

#[derive(Debug, Default)]
struct State {
    meta: Option<IndexMeta>,
    /// In insertion order; a replaced document keeps its place.
    documents: Vec<Document>,
    /// In write order, oldest first.
    chunks: Vec<VectorRow>,
}

/// A [`NoteStore`] that lives in memory only.
#[derive(Debug, Default)]
pub struct InMemoryStore {
    state: Mutex<State>,
}

impl InMemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        InMemoryStore::default()
    }

    fn state(&self) -> Result<MutexGuard<'_, State>, StoreError> {
        self.state.lock().map_err(|_| StoreError::Corrupted {
            location: "memory".to_owned(),
            what: "state".to_owned(),
            detail: "a writer panicked while holding it".to_owned(),
        })
    }
}

#[async_trait]
impl NoteStore for InMemoryStore {
    async fn meta(&self) -> Result<Option<IndexMeta>, StoreError> {
        Ok(self.state()?.meta.clone())
    }

    async fn set_meta(&self, meta: &IndexMeta) -> Result<(), StoreError> {
        self.state()?.meta = Some(meta.clone());
        Ok(())
    }

    async fn get(&self, doc_id: &str) -> Result<Option<Document>, StoreError> {
        Ok(self
            .state()?
            .documents
            .iter()
            .find(|d| d.doc_id == doc_id)
            .cloned())
    }

    async fn find_by_source(&self, source: &str) -> Result<Option<Document>, StoreError> {
        let state = self.state()?;
        Ok(state
            .documents
            .iter()
            .find(|d| d.source.as_deref() == Some(source))
            .cloned())
    }

    async fn find_by_hash(&self, hash: &str) -> Result<Option<Document>, StoreError> {
        let state = self.state()?;
        Ok(state
            .documents
            .iter()
            .find(|d| d.content_hash == hash)
            .cloned())
    }

    async fn put(&self, doc: &Document, chunks: &[IndexedChunk]) -> Result<(), StoreError> {
        let mut state = self.state()?;
        match state.documents.iter_mut().find(|d| d.doc_id == doc.doc_id) {
            Some(old) => *old = doc.clone(),
            None => state.documents.push(doc.clone()),
        }
        state.chunks.retain(|row| row.payload.doc_id != doc.doc_id);
        for indexed in chunks {
            state.chunks.push(VectorRow {
                payload: ChunkPayload::new(doc, &indexed.chunk),
                dense: scoring::unit(&indexed.embedding.dense),
                sparse: indexed.embedding.sparse.clone(),
            });
        }
        Ok(())
    }

    async fn delete(&self, doc_id: &str) -> Result<bool, StoreError> {
        let mut state = self.state()?;
        state.chunks.retain(|row| row.payload.doc_id != doc_id);
        let before = state.documents.len();
        state.documents.retain(|d| d.doc_id != doc_id);
        Ok(state.documents.len() != before)
    }

    async fn list(&self, project: Option<&str>, limit: usize) -> Result<Vec<Document>, StoreError> {
        let state = self.state()?;
        let mut docs: Vec<Document> = state
            .documents
            .iter()
            .filter(|d| project.is_none_or(|p| d.project == p))
            .cloned()
            .collect();
        docs.sort_by(|a, b| b.added_at.cmp(&a.added_at));
        docs.truncate(limit);
        Ok(docs)
    }

    async fn projects(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        let mut counts = BTreeMap::new();
        for doc in &self.state()?.documents {
            *counts.entry(doc.project.clone()).or_default() += 1;
        }
        Ok(counts)
    }

    async fn documents(&self) -> Result<Vec<Document>, StoreError> {
        Ok(self.state()?.documents.clone())
    }

    async fn dense_top(
        &self,
        query: &[f32],
        filter: &ChunkFilter,
        limit: usize,
    ) -> Result<Vec<ScoredChunk>, StoreError> {
        Ok(scoring::dense_top(
            &self.state()?.chunks,
            query,
            filter,
            limit,
        ))
    }

    async fn sparse_top(
        &self,
        query: &SparseVector,
        filter: &ChunkFilter,
        limit: usize,
    ) -> Result<Vec<ScoredChunk>, StoreError> {
        Ok(scoring::sparse_top(
            &self.state()?.chunks,
            query,
            filter,
            limit,
        ))
    }

    async fn clear_chunks(&self) -> Result<(), StoreError> {
        self.state()?.chunks.clear();
        Ok(())
    }
}
