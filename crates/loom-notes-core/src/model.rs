//! The data model (reference A.2), serialized with the reference's field order.

use serde::{Deserialize, Serialize};

/// Where a document came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// Text given as is (`add_text`).
    Text,
    /// A web page (`add_url`).
    Url,
    /// A local file (`add_file`).
    File,
}

/// A stored document: the source of truth, from which every chunk can be rebuilt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Document {
    /// A UUID v4, as a string.
    pub doc_id: String,
    /// Its title.
    pub title: String,
    /// Its project (trimmed, lower case).
    pub project: String,
    /// Its tags (trimmed, lower case, de-duplicated).
    #[serde(default)]
    pub tags: Vec<String>,
    /// Where it came from.
    pub source_kind: SourceKind,
    /// The URL or the resolved file path, `None` for text.
    #[serde(default)]
    pub source: Option<String>,
    /// When it was first added (ISO-8601, UTC, microseconds).
    pub added_at: String,
    /// When its text was last replaced.
    #[serde(default)]
    pub updated_at: Option<String>,
    /// SHA-256 (hex) of its normalized text.
    pub content_hash: String,
    /// Its full text.
    pub text: String,
}

/// A document without its text (`list_docs`, `delete`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DocSummary {
    /// See [`Document::doc_id`].
    pub doc_id: String,
    /// See [`Document::title`].
    pub title: String,
    /// See [`Document::project`].
    pub project: String,
    /// See [`Document::tags`].
    pub tags: Vec<String>,
    /// See [`Document::source_kind`].
    pub source_kind: SourceKind,
    /// See [`Document::source`].
    pub source: Option<String>,
    /// See [`Document::added_at`].
    pub added_at: String,
    /// See [`Document::updated_at`].
    pub updated_at: Option<String>,
    /// The length of its text in Unicode code points.
    pub chars: usize,
}

/// One search result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hit {
    /// The document the chunk belongs to.
    pub doc_id: String,
    /// The document's title.
    pub title: String,
    /// The document's project.
    pub project: String,
    /// The reranker's score, rounded to 4 decimals.
    pub score: f64,
    /// The whole chunk when short, else an extract (see `truncated`).
    pub snippet: String,
    /// Whether `snippet` is an extract.
    pub truncated: bool,
    /// The chunk's heading path (`Title > Section > Sub`).
    pub heading_path: String,
    /// The document's source.
    pub source: Option<String>,
    /// When the document was added.
    pub added_at: String,
}

/// What an ingestion did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngestResult {
    /// The document written, or the one whose content is identical.
    pub doc_id: String,
    /// Its title.
    pub title: String,
    /// Its project.
    pub project: String,
    /// How many chunks were indexed (0 for a duplicate).
    pub chunks: usize,
    /// Whether an existing document was replaced.
    #[serde(default)]
    pub updated: bool,
    /// The document with identical content, when nothing was written.
    #[serde(default)]
    pub duplicate_of: Option<String>,
}

/// A piece of a document, the unit that is embedded and searched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// The document it belongs to.
    pub doc_id: String,
    /// Its position in the document, from 0.
    pub index: usize,
    /// `Title > Section > Sub`.
    pub heading_path: String,
    /// Its text.
    pub text: String,
}

impl From<&Document> for DocSummary {
    fn from(doc: &Document) -> Self {
        DocSummary {
            doc_id: doc.doc_id.clone(),
            title: doc.title.clone(),
            project: doc.project.clone(),
            tags: doc.tags.clone(),
            source_kind: doc.source_kind,
            source: doc.source.clone(),
            added_at: doc.added_at.clone(),
            updated_at: doc.updated_at.clone(),
            chars: doc.text.chars().count(),
        }
    }
}
