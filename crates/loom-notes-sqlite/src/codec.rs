//! Rows to and from the domain types: documents, chunk payloads and vector blobs.

use loom_notes_core::scoring::{VectorRow, unit};
use loom_notes_core::{ChunkPayload, Document, SourceKind, SparseVector, StoreError};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

/// The columns of `documents` read back as a [`Document`].
pub(crate) const DOCUMENT_COLUMNS: &str = "doc_id, title, project, tags, source_kind, source, \
                                           added_at, updated_at, content_hash, text";

/// The columns of `chunks` read back as a [`VectorRow`].
pub(crate) const CHUNK_COLUMNS: &str = "doc_id, idx, heading_path, text, title, project, tags, \
                                        source, added_at, dense, sparse_indices, sparse_values";

/// Wraps a database error with the file's path.
pub(crate) fn db_error(location: &str, err: sqlx::Error) -> StoreError {
    StoreError::Database {
        location: location.to_owned(),
        source: Box::new(err),
    }
}

pub(crate) fn corrupted(location: &str, what: String, detail: impl ToString) -> StoreError {
    StoreError::Corrupted {
        location: location.to_owned(),
        what,
        detail: detail.to_string(),
    }
}

pub(crate) fn kind_name(kind: SourceKind) -> &'static str {
    match kind {
        SourceKind::Text => "text",
        SourceKind::Url => "url",
        SourceKind::File => "file",
    }
}

fn kind_of(name: &str) -> Option<SourceKind> {
    match name {
        "text" => Some(SourceKind::Text),
        "url" => Some(SourceKind::Url),
        "file" => Some(SourceKind::File),
        _ => None,
    }
}

pub(crate) fn tags_json(tags: &[String]) -> String {
    serde_json::Value::from(tags.to_vec()).to_string()
}

fn tags_of(json: &str) -> Result<Vec<String>, String> {
    serde_json::from_str(json).map_err(|err| format!("tags {json:?}: {err}"))
}

pub(crate) fn f32_blob(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub(crate) fn u32_blob(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn words(blob: &[u8], name: &str) -> Result<Vec<[u8; 4]>, String> {
    if !blob.len().is_multiple_of(4) {
        return Err(format!(
            "{name} blob of {} bytes, not a multiple of 4",
            blob.len()
        ));
    }
    Ok(blob
        .chunks_exact(4)
        .map(|w| [w[0], w[1], w[2], w[3]])
        .collect())
}

/// A `documents` row (selected with [`DOCUMENT_COLUMNS`]).
pub(crate) fn document(location: &str, row: &SqliteRow) -> Result<Document, StoreError> {
    let doc_id: String = row.try_get("doc_id").map_err(|e| db_error(location, e))?;
    let bad = |detail: String| corrupted(location, format!("document {doc_id}"), detail);
    let get = |name: &str| -> Result<String, StoreError> {
        row.try_get(name).map_err(|e| bad(format!("{name}: {e}")))
    };
    let opt = |name: &str| -> Result<Option<String>, StoreError> {
        row.try_get(name).map_err(|e| bad(format!("{name}: {e}")))
    };
    let kind = get("source_kind")?;
    Ok(Document {
        title: get("title")?,
        project: get("project")?,
        tags: tags_of(&get("tags")?).map_err(bad)?,
        source_kind: kind_of(&kind).ok_or_else(|| bad(format!("source_kind {kind:?}")))?,
        source: opt("source")?,
        added_at: get("added_at")?,
        updated_at: opt("updated_at")?,
        content_hash: get("content_hash")?,
        text: get("text")?,
        doc_id,
    })
}

/// A `chunks` row (selected with [`CHUNK_COLUMNS`]) as held in memory for scoring.
pub(crate) fn vector_row(location: &str, row: &SqliteRow) -> Result<VectorRow, StoreError> {
    let doc_id: String = row.try_get("doc_id").map_err(|e| db_error(location, e))?;
    let index: i64 = row.try_get("idx").map_err(|e| db_error(location, e))?;
    let bad = |detail: String| corrupted(location, format!("chunk {doc_id}:{index}"), detail);
    let text = |name: &str| -> Result<String, StoreError> {
        row.try_get(name).map_err(|e| bad(format!("{name}: {e}")))
    };
    let blob = |name: &str| -> Result<Vec<u8>, StoreError> {
        row.try_get(name).map_err(|e| bad(format!("{name}: {e}")))
    };
    let dense: Vec<f32> = words(&blob("dense")?, "dense")
        .map_err(bad)?
        .into_iter()
        .map(f32::from_le_bytes)
        .collect();
    let indices: Vec<u32> = words(&blob("sparse_indices")?, "sparse_indices")
        .map_err(bad)?
        .into_iter()
        .map(u32::from_le_bytes)
        .collect();
    let values: Vec<f32> = words(&blob("sparse_values")?, "sparse_values")
        .map_err(bad)?
        .into_iter()
        .map(f32::from_le_bytes)
        .collect();
    if indices.len() != values.len() {
        return Err(bad(format!(
            "{} sparse indices for {} values",
            indices.len(),
            values.len()
        )));
    }
    Ok(VectorRow {
        payload: ChunkPayload {
            index: usize::try_from(index).map_err(|_| bad(format!("index {index}")))?,
            heading_path: text("heading_path")?,
            text: text("text")?,
            title: text("title")?,
            project: text("project")?,
            tags: tags_of(&text("tags")?).map_err(bad)?,
            source: row
                .try_get("source")
                .map_err(|e| bad(format!("source: {e}")))?,
            added_at: text("added_at")?,
            doc_id: doc_id.clone(),
        },
        dense: unit(&dense),
        sparse: SparseVector { indices, values },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_little_endian() {
        assert_eq!(f32_blob(&[1.0]), vec![0, 0, 0x80, 0x3f]);
        assert_eq!(u32_blob(&[0x0102_0304]), vec![4, 3, 2, 1]);
        assert!(words(&[1, 2, 3], "dense").is_err());
        assert_eq!(tags_json(&["a".into(), "b\"".into()]), r#"["a","b\""]"#);
        assert_eq!(tags_of(r#"["x"]"#), Ok(vec!["x".to_owned()]));
        assert!(tags_of("nope").is_err());
        assert_eq!(kind_of(kind_name(SourceKind::Url)), Some(SourceKind::Url));
        assert_eq!(kind_of("pdf"), None);
    }
}
