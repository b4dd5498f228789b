//! Structural chunking (reference A.6, exact algorithm; lengths in code points): sections by
//! markdown heading, long sections packed from paragraphs with an overlap, tiny pieces merged
//! into the previous one.

use std::sync::LazyLock;

use regex::Regex;

use crate::model::Chunk;
use crate::text::{char_len, char_slice, is_py_space, py_strip, splitlines};

/// The sizes that drive chunking (`LOOM_NOTES_CHUNK_*`), in code points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSizes {
    /// Packing target T (1800).
    pub target: usize,
    /// A body up to this length stays whole; merges never exceed it (2400).
    pub max: usize,
    /// Overlap carried from one packed chunk to the next (180).
    pub overlap: usize,
    /// Pieces shorter than this are merged into the previous one (200).
    pub min: usize,
}

impl Default for ChunkSizes {
    fn default() -> Self {
        ChunkSizes {
            target: 1800,
            max: 2400,
            overlap: 180,
            min: 200,
        }
    }
}

// `\s` is written `[\s\x1c-\x1f]`: Python's `\s` also matches the information separators.
#[allow(clippy::expect_used)] // constant patterns, checked by the tests
static HEADING: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(#{1,6})[\s\x1c-\x1f]+(.+?)[\s\x1c-\x1f]*#*[\s\x1c-\x1f]*$")
        .expect("heading pattern")
});
#[allow(clippy::expect_used)]
static FENCE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[\s\x1c-\x1f]*(```|~~~)").expect("fence pattern"));
#[allow(clippy::expect_used)]
static PARAGRAPH_BREAK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\n[\s\x1c-\x1f]*\n").expect("paragraph pattern"));

/// Cuts a document into chunks. `title` is the root of every heading path; a first H1 equal to
/// the title is not repeated. A text made only of headings gives no chunk.
pub fn chunk_document(doc_id: &str, title: &str, text: &str, sizes: &ChunkSizes) -> Vec<Chunk> {
    let mut pieces = Vec::new();
    for (path, body) in split_sections(title, text) {
        for piece in split_body(&body, sizes) {
            pieces.push((path.clone(), piece));
        }
    }
    merge_tiny(pieces, sizes)
        .into_iter()
        .enumerate()
        .map(|(index, (heading_path, text))| Chunk {
            doc_id: doc_id.to_owned(),
            index,
            heading_path,
            text,
        })
        .collect()
}

/// The text a chunk is embedded and reranked as: `heading_path + "\n\n" + text`.
pub fn embed_text(chunk: &Chunk) -> String {
    if chunk.heading_path.is_empty() {
        chunk.text.clone()
    } else {
        format!("{}\n\n{}", chunk.heading_path, chunk.text)
    }
}

/// `(heading path, body)` per heading; `[(title, "")]` when there is none.
fn split_sections(title: &str, text: &str) -> Vec<(String, String)> {
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut sections = Vec::new();
    let mut buffer: Vec<&str> = Vec::new();
    let mut in_fence = false;
    let flush = |buffer: &mut Vec<&str>, stack: &[(usize, String)], sections: &mut Vec<_>| {
        let joined = buffer.join("\n");
        let body = py_strip(&joined);
        if !body.is_empty() {
            sections.push((heading_path(title, stack), body.to_owned()));
        }
        buffer.clear();
    };
    for line in splitlines(text) {
        if FENCE.is_match(line) {
            in_fence = !in_fence;
            buffer.push(line);
            continue;
        }
        let heading = if in_fence {
            None
        } else {
            HEADING.captures(line)
        };
        let Some(caps) = heading else {
            buffer.push(line);
            continue;
        };
        flush(&mut buffer, &stack, &mut sections);
        let level = caps.get(1).map_or(0, |m| m.as_str().len());
        let name = py_strip(caps.get(2).map_or("", |m| m.as_str())).to_owned();
        while stack.last().is_some_and(|(top, _)| *top >= level) {
            stack.pop();
        }
        if !(level == 1 && stack.is_empty() && name == title) {
            stack.push((level, name));
        }
    }
    flush(&mut buffer, &stack, &mut sections);
    if sections.is_empty() {
        sections.push((title.to_owned(), String::new()));
    }
    sections
}

fn heading_path(title: &str, stack: &[(usize, String)]) -> String {
    std::iter::once(title)
        .chain(stack.iter().map(|(_, h)| h.as_str()))
        .collect::<Vec<_>>()
        .join(" > ")
}

/// A section body as pieces: whole when short enough, else packed paragraphs with overlap.
fn split_body(body: &str, sizes: &ChunkSizes) -> Vec<String> {
    if body.is_empty() {
        return Vec::new();
    }
    if char_len(body) <= sizes.max {
        return vec![body.to_owned()];
    }
    let unit_max = sizes.target.saturating_sub(sizes.overlap).max(1);
    let mut units = Vec::new();
    for paragraph in PARAGRAPH_BREAK.split(body) {
        let paragraph = py_strip(paragraph);
        if paragraph.is_empty() {
            continue;
        }
        if char_len(paragraph) > unit_max {
            units.extend(split_long(paragraph, unit_max));
        } else {
            units.push(paragraph.to_owned());
        }
    }
    let mut chunks: Vec<String> = Vec::new();
    let mut current: Vec<String> = Vec::new();
    let mut size = 0;
    for unit in units {
        let len = char_len(&unit);
        if !current.is_empty() && size + len + 2 > sizes.target {
            let emitted = current.join("\n\n");
            let tail = tail(&emitted, sizes.overlap);
            chunks.push(emitted);
            size = char_len(&tail);
            current = if tail.is_empty() {
                Vec::new()
            } else {
                vec![tail]
            };
        }
        current.push(unit);
        size += len + 2;
    }
    if !current.is_empty() {
        chunks.push(current.join("\n\n"));
    }
    chunks
}

/// Python's `re.split(r"(?<=[.!?…])\s+", paragraph)`: cuts after sentence-ending punctuation.
fn sentences(paragraph: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut prev: Option<char> = None;
    let mut chars = paragraph.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if is_py_space(c) && prev.is_some_and(|p| matches!(p, '.' | '!' | '?' | '…')) {
            out.push(&paragraph[start..i]);
            let mut end = i + c.len_utf8();
            while let Some(&(j, next)) = chars.peek() {
                if !is_py_space(next) {
                    break;
                }
                end = j + next.len_utf8();
                chars.next();
            }
            start = end;
            prev = None;
            continue;
        }
        prev = Some(c);
    }
    out.push(&paragraph[start..]);
    out
}

/// A paragraph longer than `max`: cut at sentence ends, hard-cut when a sentence is too long.
fn split_long(paragraph: &str, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for sentence in sentences(paragraph) {
        let len = char_len(sentence);
        if len > max {
            if !current.is_empty() {
                out.push(std::mem::take(&mut current));
            }
            let chars: Vec<char> = sentence.chars().collect();
            out.extend(
                chars
                    .chunks(max)
                    .map(|slice| slice.iter().collect::<String>()),
            );
            continue;
        }
        if !current.is_empty() && char_len(&current) + len + 1 > max {
            out.push(std::mem::replace(&mut current, sentence.to_owned()));
        } else {
            current = py_strip(&format!("{current} {sentence}")).to_owned();
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// The overlap carried to the next chunk: the last `overlap` code points, from after their first
/// space when there is one (else whole); empty when the text is not longer than `overlap`.
fn tail(text: &str, overlap: usize) -> String {
    let len = char_len(text);
    if overlap == 0 || len <= overlap {
        return String::new();
    }
    let tail = char_slice(text, len - overlap, len);
    match tail.find(' ') {
        Some(space) => tail[space + 1..].to_owned(),
        None => tail.to_owned(),
    }
}

/// Appends each piece shorter than `min` to the previous kept piece when the result fits in
/// `max`; the first piece is never merged.
fn merge_tiny(pieces: Vec<(String, String)>, sizes: &ChunkSizes) -> Vec<(String, String)> {
    let mut merged: Vec<(String, String)> = Vec::new();
    for (path, body) in pieces {
        let len = char_len(&body);
        if let Some((_, prev)) = merged.last_mut()
            && len < sizes.min
            && char_len(prev) + len + 2 <= sizes.max
        {
            prev.push_str("\n\n");
            prev.push_str(&body);
        } else {
            merged.push((path, body));
        }
    }
    merged
}

#[cfg(test)]
#[path = "chunk_tests.rs"]
mod tests;
