//! The glob of a case's `replay:` (`runs/*.jsonl`, `base--devis-?.jsonl`, `j[0-9]/*.jsonl`):
//! each `/`-separated part of the pattern is matched against the names of one directory level
//! (`*` any run of characters, `?` one character, `[abc]`, `[a-z]` and `[!a]` one character of
//! a set), the files found returned in path order so that the trials of a case are numbered the
//! same way on every machine.

use std::path::{Path, PathBuf};

/// Whether `pattern` holds a glob wildcard (`*`, `?`, `[`).
pub(crate) fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?', '['])
}

/// The files under `dir` whose path relative to it matches `pattern`, sorted; an unreadable
/// directory on the way is an error naming it.
pub(crate) fn files(dir: &Path, pattern: &str) -> Result<Vec<PathBuf>, String> {
    let parts: Vec<&str> = pattern.split('/').filter(|p| !p.is_empty()).collect();
    let mut found = Vec::new();
    let start = if pattern.starts_with('/') {
        PathBuf::from("/")
    } else {
        dir.to_path_buf()
    };
    walk(&start, &parts, &mut found)?;
    found.sort();
    Ok(found)
}

fn walk(dir: &Path, parts: &[&str], found: &mut Vec<PathBuf>) -> Result<(), String> {
    let Some((part, rest)) = parts.split_first() else {
        return Ok(());
    };
    if !is_glob(part) {
        let path = dir.join(part);
        if rest.is_empty() {
            if path.is_file() {
                found.push(path);
            }
        } else if path.is_dir() {
            walk(&path, rest, found)?;
        }
        return Ok(());
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        // Hidden files are matched only by a pattern that starts with a dot.
        if name.starts_with('.') && !part.starts_with('.') {
            continue;
        }
        if !matches(part, name) {
            continue;
        }
        let path = entry.path();
        if rest.is_empty() {
            if path.is_file() {
                found.push(path);
            }
        } else if path.is_dir() {
            walk(&path, rest, found)?;
        }
    }
    Ok(())
}

/// Whether the file name `name` matches the one-level pattern `pattern`.
pub(crate) fn matches(pattern: &str, name: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    matches_from(&pattern, &name)
}

fn matches_from(pattern: &[char], name: &[char]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some(('*', rest)) => (0..=name.len()).any(|skip| matches_from(rest, &name[skip..])),
        Some(('?', rest)) => !name.is_empty() && matches_from(rest, &name[1..]),
        Some(('[', rest)) => match (set(rest), name.split_first()) {
            (Some((members, negated, after)), Some((c, name))) => {
                member(members, *c) != negated && matches_from(after, name)
            }
            // An unclosed `[` is an ordinary character.
            (None, Some(('[', name))) => matches_from(rest, name),
            _ => false,
        },
        Some((c, rest)) => name.first() == Some(c) && matches_from(rest, &name[1..]),
    }
}

/// The set opened by a `[` (its text after the bracket): its members, whether it is negated
/// (`[!...]`, `[^...]`), and the rest of the pattern after its `]`; `None` when the set is not
/// closed. A `]` right after the opening is a member.
fn set(text: &[char]) -> Option<(&[char], bool, &[char])> {
    let (negated, body) = match text.first() {
        Some('!' | '^') => (true, &text[1..]),
        _ => (false, text),
    };
    let close = body.iter().skip(1).position(|c| *c == ']')? + 1;
    Some((&body[..close], negated, &body[close + 1..]))
}

/// Whether `c` is one of `members` (single characters and `a-z` ranges).
fn member(members: &[char], c: char) -> bool {
    let mut i = 0;
    while i < members.len() {
        if i + 2 < members.len() && members[i + 1] == '-' {
            if members[i] <= c && c <= members[i + 2] {
                return true;
            }
            i += 3;
        } else {
            if members[i] == c {
                return true;
            }
            i += 1;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_sets_and_plain_characters() {
        assert!(matches("*.jsonl", "base--a--1.jsonl"));
        assert!(!matches("*.jsonl", "base.json"));
        assert!(matches("base--?.jsonl", "base--1.jsonl"));
        assert!(!matches("base--?.jsonl", "base--12.jsonl"));
        assert!(matches("j[0-9].jsonl", "j7.jsonl"));
        assert!(!matches("j[!0-9].jsonl", "j7.jsonl"));
        assert!(matches("j[!0-9].jsonl", "jx.jsonl"));
        assert!(matches("[]a]", "]"));
        assert!(matches("a[b", "a[b"));
        assert!(!matches("a*b", "ac"));
    }

    #[test]
    fn files_are_found_level_by_level_in_path_order() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        for file in [
            "runs/b.jsonl",
            "runs/a.jsonl",
            "runs/c.txt",
            "runs/.h.jsonl",
            "x/a.jsonl",
        ] {
            let path = dir.path().join(file);
            std::fs::create_dir_all(path.parent().unwrap_or(dir.path()))
                .unwrap_or_else(|e| panic!("{e}"));
            std::fs::write(&path, "").unwrap_or_else(|e| panic!("{e}"));
        }
        let found = files(dir.path(), "*/?.jsonl").unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<String> = found
            .iter()
            .filter_map(|p| p.strip_prefix(dir.path()).ok())
            .map(|p| p.display().to_string())
            .collect();
        assert_eq!(names, ["runs/a.jsonl", "runs/b.jsonl", "x/a.jsonl"]);
        assert!(
            files(dir.path(), "absent/*.jsonl")
                .unwrap_or_default()
                .is_empty()
        );
    }
}
