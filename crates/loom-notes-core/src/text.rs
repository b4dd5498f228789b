//! Text helpers with Python's semantics (reference A.5, A.13 item 6): lengths in Unicode code
//! points, `str.isspace`/`str.strip`/`str.split()`/`str.splitlines`, `casefold`, NFKC, the content
//! hash, the project/tags cleaning and the timestamps.

use chrono::{DateTime, Timelike, Utc};
use sha2::{Digest, Sha256};
use unicode_normalization::UnicodeNormalization;

/// Python's `str.isspace` (and `\s` of `re` on `str`): Unicode `White_Space` plus the
/// information separators `\x1c`–`\x1f`, which Python counts as whitespace and Rust does not.
pub fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()`: removes [`is_py_space`] characters at both ends.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_space)
}

/// Python's `str.rstrip()`.
pub fn py_rstrip(s: &str) -> &str {
    s.trim_end_matches(is_py_space)
}

/// Python's `str.split()` without arguments: the non-empty runs between [`is_py_space`]
/// characters.
pub fn py_split_whitespace(s: &str) -> impl Iterator<Item = &str> {
    s.split(is_py_space).filter(|part| !part.is_empty())
}

/// Python's `len(s)`: the number of Unicode code points.
pub fn char_len(s: &str) -> usize {
    s.chars().count()
}

/// Python's `s[start:end]` on code points (both clamped to the string's length).
pub fn char_slice(s: &str, start: usize, end: usize) -> &str {
    let byte_at = |n: usize| s.char_indices().nth(n).map_or(s.len(), |(i, _)| i);
    let (start, end) = (byte_at(start), byte_at(end));
    if start >= end { "" } else { &s[start..end] }
}

/// Whether `c` ends a line for Python's `str.splitlines`.
fn is_line_break(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r'
            | '\u{0b}'
            | '\u{0c}'
            | '\u{1c}'
            | '\u{1d}'
            | '\u{1e}'
            | '\u{85}'
            | '\u{2028}'
            | '\u{2029}'
    )
}

/// Python's `str.splitlines()`: splits on `\n`, `\r\n`, `\r`, `\v`, `\f`, `\x1c`–`\x1e`, `\x85`,
/// `\u2028`, `\u2029`, without the separators; a final separator does not start an empty line.
pub fn splitlines(s: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if !is_line_break(c) {
            continue;
        }
        lines.push(&s[start..i]);
        let mut end = i + c.len_utf8();
        if c == '\r'
            && let Some(&(_, '\n')) = chars.peek()
        {
            chars.next();
            end += 1;
        }
        start = end;
    }
    if start < s.len() {
        lines.push(&s[start..]);
    }
    lines
}

/// Python's `str.casefold()` (full case folding: `ß` → `ss`).
pub fn casefold(s: &str) -> String {
    caseless::default_case_fold_str(s)
}

/// The text compared for duplicates: NFKC, then case folding, then every run of whitespace
/// collapsed to one space, then trimmed. `normalize("  Ａｂｃ\tDEF  ") == "abc def"`.
pub fn normalize(text: &str) -> String {
    let folded = casefold(&text.nfkc().collect::<String>());
    py_split_whitespace(&folded).collect::<Vec<_>>().join(" ")
}

/// SHA-256 (lower-case hex) of [`normalize`]`(text)`: equal for texts that differ only by case,
/// width or spacing.
pub fn content_hash(text: &str) -> String {
    hex::encode(Sha256::digest(normalize(text).as_bytes()))
}

/// A project as stored and filtered on: trimmed, lower case; `None` when empty.
pub fn clean_project(project: Option<&str>) -> Option<String> {
    let project = py_strip(project.unwrap_or("")).to_lowercase();
    (!project.is_empty()).then_some(project)
}

/// Tags as stored and filtered on: each trimmed and lower-cased, empties dropped, de-duplicated
/// keeping the first occurrence; `None` when nothing is left.
/// `["Rag", "rag", " Search "]` → `["rag", "search"]`.
pub fn clean_tags<S: AsRef<str>>(tags: Option<&[S]>) -> Option<Vec<String>> {
    let mut cleaned: Vec<String> = Vec::new();
    for tag in tags.unwrap_or(&[]) {
        let tag = py_strip(tag.as_ref()).to_lowercase();
        if !tag.is_empty() && !cleaned.contains(&tag) {
            cleaned.push(tag);
        }
    }
    (!cleaned.is_empty()).then_some(cleaned)
}

/// A UTC instant as Python's `datetime.isoformat()`: `2026-11-29T11:56:00.861794+00:00`,
/// microseconds truncated, and no fraction at all when they are 0.
pub fn iso_timestamp(at: DateTime<Utc>) -> String {
    let micros = at.nanosecond() % 1_000_000_000 / 1_000;
    let seconds = at.format("%Y-%m-%dT%H:%M:%S");
    if micros == 0 {
        format!("{seconds}+00:00")
    } else {
        format!("{seconds}.{micros:06}+00:00")
    }
}

/// The current time as [`iso_timestamp`].
pub fn now_iso() -> String {
    iso_timestamp(Utc::now())
}

/// Python's `round(x, 4)` (correctly rounded, ties to even on the exact binary value).
pub fn round4(x: f64) -> f64 {
    round_to(x, 4)
}

/// Python's `round(x, digits)`: formats with `digits` decimals (exact, ties to even) and reads
/// the result back.
pub fn round_to(x: f64, digits: usize) -> f64 {
    if !x.is_finite() {
        return x;
    }
    format!("{x:.digits$}").parse().unwrap_or(x)
}

/// The extract shown for a long chunk: whitespace runs flattened to one space; when longer than
/// `limit`, cut at the last space before `limit` if it lies past `limit / 2` (else at `limit`),
/// right-trimmed, and ended with `…`. `"x" * 400` → 301 chars.
pub fn snippet(text: &str, limit: usize) -> String {
    let flat = py_split_whitespace(text).collect::<Vec<_>>().join(" ");
    if char_len(&flat) <= limit {
        return flat;
    }
    let head: Vec<char> = flat.chars().take(limit).collect();
    let cut = head.iter().rposition(|&c| c == ' ');
    let end = match cut {
        Some(cut) if cut > limit / 2 => cut,
        _ => limit,
    };
    let kept: String = head[..end].iter().collect();
    format!("{}…", py_rstrip(&kept))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn content_hash_matches_python() {
        let expected = "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9";
        assert_eq!(content_hash("Hello   World\n"), expected);
        assert_eq!(content_hash("hello world"), expected);
    }

    #[test]
    fn normalize_applies_nfkc_casefold_and_spaces() {
        assert_eq!(normalize("  Ａｂｃ\tDEF  "), "abc def");
        assert_eq!(normalize("Straße"), "strasse");
        assert_eq!(normalize("a\u{1f}b\u{3000}c"), "a b c");
        assert_eq!(casefold("Straße"), "strasse");
    }

    #[test]
    fn project_and_tags_are_cleaned() {
        assert_eq!(clean_project(Some("  Alpha ")), Some("alpha".to_owned()));
        assert_eq!(clean_project(Some("   ")), None);
        assert_eq!(clean_project(None), None);
        let tags = ["Rag", "rag", " Search "];
        assert_eq!(
            clean_tags(Some(&tags[..])),
            Some(vec!["rag".to_owned(), "search".to_owned()])
        );
        assert_eq!(clean_tags(Some(&["  ", ""][..])), None);
        assert_eq!(clean_tags::<String>(None), None);
    }

    #[test]
    fn splitlines_uses_python_separators() {
        assert_eq!(
            splitlines("a\nb\r\nc\rd\u{0b}e\u{0c}f\u{1c}g\u{1d}h\u{1e}i\u{85}j\u{2028}k\u{2029}l"),
            vec!["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"]
        );
        assert_eq!(splitlines("a\n"), vec!["a"]);
        assert_eq!(splitlines("a\n\nb"), vec!["a", "", "b"]);
        assert_eq!(splitlines(""), Vec::<&str>::new());
        assert_eq!(splitlines("\u{1f}x"), vec!["\u{1f}x"]);
    }

    #[test]
    fn strip_and_lengths_follow_python() {
        assert_eq!(py_strip("\u{1c} é \u{85}"), "é");
        assert_eq!(char_len("été"), 3);
        assert_eq!(char_slice("héllo", 1, 3), "él");
        assert_eq!(char_slice("héllo", 3, 99), "lo");
        assert_eq!(char_slice("héllo", 4, 2), "");
    }

    #[test]
    fn timestamps_look_like_isoformat() {
        let at = Utc
            .with_ymd_and_hms(2026, 11, 29, 11, 56, 0)
            .single()
            .expect("valid date");
        assert_eq!(iso_timestamp(at), "2026-11-29T11:56:00+00:00");
        let at = at + chrono::Duration::nanoseconds(861_794_321);
        assert_eq!(iso_timestamp(at), "2026-11-29T11:56:00.861794+00:00");
        assert_eq!(now_iso().len(), "2026-11-29T11:56:00.861794+00:00".len());
    }

    #[test]
    fn rounding_is_python_round() {
        assert_eq!(round4(2.0 / 3.0), 0.6667);
        assert_eq!(round4(0.123_45), 0.1235);
        assert_eq!(round_to(0.125, 2), 0.12);
        assert_eq!(round_to(0.875, 3), 0.875);
    }

    #[test]
    fn snippet_examples() {
        let words = "mot ".repeat(100);
        let s = snippet(&words, 300);
        assert_eq!(char_len(&s), 300);
        assert!(s.ends_with("mot…"));
        let xs = "x".repeat(400);
        let s = snippet(&xs, 300);
        assert_eq!(char_len(&s), 301);
        assert!(s.ends_with('…'));
        assert_eq!(snippet("a\n\n b\tc", 300), "a b c");
        // A space before limit / 2 is not used: the cut is hard.
        let early = format!("ab {}", "y".repeat(400));
        assert_eq!(char_len(&snippet(&early, 300)), 301);
    }
}
