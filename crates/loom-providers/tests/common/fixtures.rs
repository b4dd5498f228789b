//! Shared helpers for the provider fixture tests: where the fixtures live, the expected results
//! of `EXPECTED.md`, the ways to cut a transcript into chunks, and long-string comparison.
//!
//! The fixtures are read in place from `../shared/fixtures/providers` (never copied into the
//! repository); a test that reads them starts with [`present`], which skips it on a clone
//! without `../shared` (see `loom_testkit::shared`). Provider-neutral: each adapter's test
//! normalizes its own output.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The fixtures folder: `<workspace>/../shared/fixtures/providers`.
pub fn dir() -> PathBuf {
    loom_testkit::shared::root().join("fixtures/providers")
}

/// Whether the fixtures can be read: `false` (after a skip notice) on a clone without
/// `../shared`, where the test returns at once.
pub fn present() -> bool {
    loom_testkit::shared::path("fixtures/providers").is_some()
}

/// The bytes of a fixture, by path relative to the fixtures folder (`anthropic/…`).
pub fn read(relative: &str) -> Vec<u8> {
    let path = dir().join(relative);
    std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read fixture {}: {e}", path.display()))
}

/// A JSON fixture (error bodies, `*.meta.json` sidecars).
pub fn read_json(relative: &str) -> Value {
    serde_json::from_slice(&read(relative))
        .unwrap_or_else(|e| panic!("fixture {relative} is not JSON: {e}"))
}

/// The fixture files of one provider folder with the given extension, sorted
/// (`list("anthropic", ".sse")` → `["anthropic/stream-…sse", …]`).
pub fn list(provider: &str, suffix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir().join(provider))
        .unwrap_or_else(|e| panic!("cannot list fixtures of {provider}: {e}"))
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(suffix) && !name.ends_with(".meta.json"))
        .map(|name| format!("{provider}/{name}"))
        .collect();
    names.sort();
    names
}

/// The `EXPECTED.md` section of a transcript: the text from its `#### \`path\`` heading to the
/// next heading.
pub fn section(relative: &str) -> String {
    let text = std::fs::read_to_string(dir().join("EXPECTED.md")).expect("EXPECTED.md");
    let heading = format!("#### `{relative}`");
    let start = text
        .find(&heading)
        .unwrap_or_else(|| panic!("EXPECTED.md has no entry for {relative}"));
    let rest = &text[start + heading.len()..];
    let end = rest.find("\n#").unwrap_or(rest.len());
    rest[..end].to_string()
}

/// The expected normalized result of a transcript (the JSON block of its section).
pub fn expected(relative: &str) -> Value {
    let section = section(relative);
    let start = section.find("```json").expect("a ```json block") + "```json".len();
    let end = start
        + section[start..]
            .find("```")
            .expect("the end of the ```json block");
    serde_json::from_str(&section[start..end])
        .unwrap_or_else(|e| panic!("EXPECTED.md block of {relative} is not JSON: {e}"))
}

/// The byte offsets listed for a UTF-8 fixture (`ü@711 (2 B)` → 711); empty when none.
pub fn utf8_offsets(relative: &str) -> Vec<usize> {
    let section = section(relative);
    let Some(line) = section.lines().find(|l| l.starts_with("Byte offsets")) else {
        return Vec::new();
    };
    line.split('@')
        .skip(1)
        .filter_map(|part| {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// The ways a transcript is delivered: whole, one byte at a time, split at `offset + 1` of every
/// listed multi-byte character (inside it), and whole with `\n` turned into `\r\n`.
pub fn chunkings(bytes: &[u8], offsets: &[usize]) -> Vec<(String, Vec<Vec<u8>>)> {
    let mut out = vec![
        ("whole".to_string(), vec![bytes.to_vec()]),
        (
            "byte by byte".to_string(),
            bytes.iter().map(|b| vec![*b]).collect(),
        ),
    ];
    if !offsets.is_empty() {
        let mut cuts: Vec<usize> = offsets
            .iter()
            .map(|o| o + 1)
            .filter(|c| *c < bytes.len())
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut pieces = Vec::new();
        let mut from = 0;
        for cut in cuts {
            pieces.push(bytes[from..cut].to_vec());
            from = cut;
        }
        pieces.push(bytes[from..].to_vec());
        out.push(("split at the listed offsets".to_string(), pieces));
    }
    let mut crlf = Vec::with_capacity(bytes.len() * 2);
    for b in bytes {
        if *b == b'\n' {
            crlf.push(b'\r');
        }
        crlf.push(*b);
    }
    out.push(("CRLF".to_string(), vec![crlf]));
    out
}

/// Lowercase hex SHA-256 of `text`'s UTF-8 bytes.
pub fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Compares `actual` to an expected string, or to `{len_chars, sha256, starts_with, ends_with}`
/// for a long one.
pub fn assert_long_string(actual: &str, expected: &Value, what: &str) {
    match expected {
        Value::String(s) => assert_eq!(actual, s, "{what}"),
        Value::Object(o) => {
            if let Some(prefix) = o.get("starts_with").and_then(Value::as_str) {
                assert!(actual.starts_with(prefix), "{what}: starts with {prefix:?}");
            }
            if let Some(suffix) = o.get("ends_with").and_then(Value::as_str) {
                assert!(actual.ends_with(suffix), "{what}: ends with {suffix:?}");
            }
            assert_eq!(
                Some(actual.chars().count() as u64),
                o.get("len_chars").and_then(Value::as_u64),
                "{what}: length in chars"
            );
            assert_eq!(
                Some(sha256_hex(actual).as_str()),
                o.get("sha256").and_then(Value::as_str),
                "{what}: sha256"
            );
        }
        other => panic!("{what}: unexpected expectation {other}"),
    }
}
