//! What the CLI prints (reference A.11, in English).

use std::fmt::Write as _;

use loom_notes_core::{DocSummary, Hit};
use serde::Serialize;

/// Seven spaces: the indent of a hit's heading path and snippet lines.
const INDENT: &str = "       ";

/// `value` as JSON with a 2-space indent, non-ASCII characters as they are.
pub(crate) fn json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(value)?)
}

/// Search hits, each as `score  title  [project]  doc_id`, its heading path (`  (extract)`
/// when the snippet is cut), its snippet indented, then an empty line; `no results` when none.
pub(crate) fn hits(hits: &[Hit]) -> String {
    if hits.is_empty() {
        return "no results\n".to_owned();
    }
    let mut out = String::new();
    for hit in hits {
        let _ = writeln!(
            out,
            "{:.3}  {}  [{}]  {}",
            hit.score, hit.title, hit.project, hit.doc_id
        );
        let cut = if hit.truncated { "  (extract)" } else { "" };
        let _ = writeln!(out, "{INDENT}{}{cut}", hit.heading_path);
        let snippet = hit.snippet.replace('\n', &format!("\n{INDENT}"));
        let _ = writeln!(out, "{INDENT}{snippet}");
        out.push('\n');
    }
    out
}

/// One line per document: `date  project(12)  title  (N chars)  doc_id`, the date being the
/// last update (else the addition) to the second.
pub(crate) fn list(docs: &[DocSummary]) -> String {
    let mut out = String::new();
    for doc in docs {
        let when = doc.updated_at.as_deref().unwrap_or(&doc.added_at);
        let when: String = when.chars().take(19).collect();
        let _ = writeln!(
            out,
            "{when}  {:<12}  {}  ({} chars)  {}",
            doc.project, doc.title, doc.chars, doc.doc_id
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use loom_notes_core::{DocSummary, Hit, SourceKind};

    use super::{hits, list};

    fn hit(score: f64, title: &str, snippet: &str, truncated: bool) -> Hit {
        Hit {
            doc_id: "d-1".into(),
            title: title.into(),
            project: "p".into(),
            score,
            snippet: snippet.into(),
            truncated,
            heading_path: format!("{title} > Section 0"),
            source: None,
            added_at: "2026-11-29T11:56:48.123456+00:00".into(),
        }
    }

    #[test]
    fn hits_are_printed_as_the_reference_prints_them() {
        let printed = hits(&[
            hit(1.0, "Long doc", "one…", true),
            hit(1.0 / 3.0, "Court", "line 1\nline 2", false),
        ]);
        assert_eq!(
            printed,
            "1.000  Long doc  [p]  d-1\n       Long doc > Section 0  (extract)\n       one…\n\n\
             0.333  Court  [p]  d-1\n       Court > Section 0\n       line 1\n       line 2\n\n"
        );
        assert_eq!(hits(&[]), "no results\n");
    }

    #[test]
    fn list_lines_show_the_last_change_and_pad_the_project() {
        let doc = DocSummary {
            doc_id: "e60a4b3e".into(),
            title: "Note qdrant".into(),
            project: "alpha".into(),
            tags: vec![],
            source_kind: SourceKind::Text,
            source: None,
            added_at: "2026-11-29T11:56:48.861794+00:00".into(),
            updated_at: None,
            chars: 83,
        };
        assert_eq!(
            list(std::slice::from_ref(&doc)),
            "2026-11-29T11:56:48  alpha         Note qdrant  (83 chars)  e60a4b3e\n"
        );
        let updated = DocSummary {
            updated_at: Some("2026-12-01T08:00:00.000001+00:00".into()),
            ..doc
        };
        assert!(list(&[updated]).starts_with("2026-12-01T08:00:00  alpha  "));
    }
}
