//! Tidiness checks: module docs on every source file, versions on internal path dependencies
//! so every crate stays publishable, and hex written by one crate (`hex`), not by hand.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::workspace::{Error, Workspace};

/// The directories, relative to the workspace root, whose `.rs` files must
/// start with a `//!` doc comment.
pub const DOC_ROOTS: &[&str] = &["crates", "examples", "xtask"];

/// Whether `source` starts with a `//!` doc comment, ignoring blank lines.
pub fn starts_with_doc_comment(source: &str) -> bool {
    source
        .trim_start_matches('\u{feff}')
        .lines()
        .find(|line| !line.trim().is_empty())
        .is_some_and(|line| line.trim_start().starts_with("//!"))
}

/// The `.rs` files under [`DOC_ROOTS`] that do not start with `//!`,
/// relative to `root` and sorted. `target` and hidden directories are skipped.
pub fn check_doc_comments(root: &Path) -> Result<Vec<String>, Error> {
    let mut files = Vec::new();
    for dir in DOC_ROOTS {
        collect_rust_files(&root.join(dir), &mut files)?;
    }
    let mut missing = Vec::new();
    for file in files {
        let source = fs::read_to_string(&file)
            .map_err(|e| Error::new(format!("cannot read {}: {e}", file.display())))?;
        if !starts_with_doc_comment(&source) {
            let relative = file.strip_prefix(root).unwrap_or(&file);
            missing.push(relative.display().to_string());
        }
    }
    missing.sort();
    Ok(missing)
}

fn collect_rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), Error> {
    if !dir.is_dir() {
        return Ok(());
    }
    let entries =
        fs::read_dir(dir).map_err(|e| Error::new(format!("cannot list {}: {e}", dir.display())))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::new(format!("cannot list {}: {e}", dir.display())))?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let file_type = entry
            .file_type()
            .map_err(|e| Error::new(format!("cannot stat {}: {e}", path.display())))?;
        if file_type.is_dir() {
            if name != "target" && !name.starts_with('.') {
                collect_rust_files(&path, out)?;
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The shipped sources (`crates/*/src`) that format bytes as hex by hand (`{b:02x}`) instead
/// of calling the `hex` crate, relative to `root` and sorted, with the line of each.
pub fn check_hand_written_hex(root: &Path) -> Result<Vec<String>, Error> {
    let mut files = Vec::new();
    let crates = root.join("crates");
    let entries = fs::read_dir(&crates)
        .map_err(|e| Error::new(format!("cannot list {}: {e}", crates.display())))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::new(format!("cannot list crates: {e}")))?;
        collect_rust_files(&entry.path().join("src"), &mut files)?;
    }
    let mut found = Vec::new();
    for file in files {
        let source = fs::read_to_string(&file)
            .map_err(|e| Error::new(format!("cannot read {}: {e}", file.display())))?;
        for (index, line) in source.lines().enumerate() {
            if hand_written_hex(line) {
                let relative = file.strip_prefix(root).unwrap_or(&file);
                found.push(format!("{}:{}", relative.display(), index + 1));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Whether `line` formats a byte as two hex digits (`{b:02x}`, `{:02X}`).
fn hand_written_hex(line: &str) -> bool {
    line.contains(":02x}") || line.contains(":02X}")
}

/// Internal path dependencies that carry no `version`, so cannot be published.
///
/// Looks at the entries of `[workspace.dependencies]` in the root manifest
/// text `root_manifest`, and at the shipped dependencies that publishable
/// workspace crates declare on a path directly.
pub fn check_path_versions(root_manifest: &str, workspace: &Workspace) -> Vec<String> {
    let mut violations: Vec<String> = workspace_dependencies(root_manifest)
        .into_iter()
        .filter(|(_, keys)| {
            keys.iter().any(|k| k == "path") && !keys.iter().any(|k| k == "version")
        })
        .map(|(name, _)| {
            format!(
                "[workspace.dependencies] {name} has a path but no version: \
                 the crates depending on it cannot be published"
            )
        })
        .collect();
    for package in workspace.packages.iter().filter(|p| p.publish) {
        for dep in &package.dependencies {
            if dep.is_shipped() && dep.path.is_some() && dep.req == "*" {
                violations.push(format!(
                    "{} depends on the path dependency {} without a version: \
                     it cannot be published",
                    package.name, dep.name
                ));
            }
        }
    }
    violations
}

/// The entries of `[workspace.dependencies]`: each name with its keys.
///
/// A small reader for the shapes Cargo manifests use here: `name = "1"`,
/// `name = { path = "..", version = ".." }`, dotted `name.path = ".."`, and
/// `[workspace.dependencies.name]` tables.
fn workspace_dependencies(manifest: &str) -> Vec<(String, Vec<String>)> {
    const SECTION: &str = "workspace.dependencies";
    let mut entries: Vec<(String, Vec<String>)> = Vec::new();
    let mut table: Option<Option<String>> = None;
    let mut lines = manifest.lines().map(strip_comment);
    while let Some(line) = lines.next() {
        let line = line.trim();
        if line.starts_with('[') {
            let header = line.trim_matches(|c| c == '[' || c == ']').trim();
            table = if header == SECTION {
                Some(None)
            } else {
                header
                    .strip_prefix(SECTION)
                    .and_then(|rest| rest.strip_prefix('.'))
                    .map(|name| Some(unquote(name).to_owned()))
            };
            if let Some(Some(name)) = &table {
                entries.push((name.clone(), Vec::new()));
            }
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = unquote(key.trim()).to_owned();
        match &table {
            None => {}
            Some(Some(name)) => add_key(&mut entries, name, key),
            Some(None) => {
                let mut value = value.trim().to_owned();
                // An inline table left open continues on the next lines.
                while value.starts_with('{') && !balanced(&value) {
                    match lines.next() {
                        Some(more) => value.push_str(&more),
                        None => break,
                    }
                }
                match key.split_once('.') {
                    Some((name, sub)) => add_key(&mut entries, name, unquote(sub).to_owned()),
                    None => {
                        let keys = match value.strip_prefix('{') {
                            Some(inner) => inline_table_keys(inner.trim_end_matches('}')),
                            None => vec!["version".to_owned()],
                        };
                        entries.push((key, keys));
                    }
                }
            }
        }
    }
    entries
}

fn add_key(entries: &mut Vec<(String, Vec<String>)>, name: &str, key: String) {
    match entries.iter_mut().find(|(n, _)| n == name) {
        Some((_, keys)) => keys.push(key),
        None => entries.push((name.to_owned(), vec![key])),
    }
}

fn unquote(s: &str) -> &str {
    s.trim().trim_matches('"').trim_matches('\'')
}

/// `line` without its `#` comment, minding quoted strings.
fn strip_comment(line: &str) -> String {
    let mut quote = None;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, '#') => return line[..i].to_owned(),
            _ => {}
        }
    }
    line.to_owned()
}

fn balanced(value: &str) -> bool {
    value.matches('{').count() <= value.matches('}').count()
}

/// The keys of an inline table's body, splitting at top-level commas.
fn inline_table_keys(body: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let (mut depth, mut quote, mut start) = (0usize, None, 0);
    let mut push = |item: &str| {
        if let Some((key, _)) = item.split_once('=') {
            keys.push(unquote(key).to_owned());
        }
    };
    for (i, c) in body.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, '[' | '{') => depth += 1,
            (None, ']' | '}') => depth = depth.saturating_sub(1),
            (None, ',') if depth == 0 => {
                push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    push(&body[start..]);
    keys
}

/// Cargo features that gate nothing: a feature must enable a dependency (`dep:x`, `x/f`), or
/// be read by the crate's code (`cfg(feature = "name")`, `cfg!(…)`, a target's
/// `required-features`), or enable such features. `default` is exempt (it names others).
///
/// A feature `x/f` of another workspace crate counts only when `f` itself gates something.
pub fn check_features(workspace: &Workspace) -> Result<Vec<String>, Error> {
    let mut read: BTreeMap<(String, String), bool> = BTreeMap::new();
    for package in &workspace.packages {
        let mut text = String::new();
        if let Some(dir) = &package.dir {
            let mut files = Vec::new();
            collect_rust_files(dir, &mut files)?;
            files.push(dir.join("Cargo.toml"));
            for file in files {
                let source = fs::read_to_string(&file)
                    .map_err(|e| Error::new(format!("cannot read {}: {e}", file.display())))?;
                text.push_str(&source);
            }
        }
        for name in package.features.keys() {
            let used = text.contains(&format!("feature = \"{name}\""))
                || text.lines().any(|line| {
                    line.trim_start().starts_with("required-features")
                        && line.contains(&format!("\"{name}\""))
                });
            read.insert((package.name.clone(), name.clone()), used);
        }
    }
    let mut violations = Vec::new();
    for package in &workspace.packages {
        for name in package.features.keys().filter(|n| *n != "default") {
            let mut seen = Vec::new();
            if !gates(workspace, &read, &package.name, name, &mut seen) {
                violations.push(format!(
                    "{}: the feature '{name}' gates no code and enables no dependency: remove \
                     it until it has code",
                    package.name
                ));
            }
        }
    }
    Ok(violations)
}

/// Whether `feature` of `package` gates something (see [`check_features`]).
fn gates(
    workspace: &Workspace,
    read: &BTreeMap<(String, String), bool>,
    package: &str,
    feature: &str,
    seen: &mut Vec<(String, String)>,
) -> bool {
    let key = (package.to_owned(), feature.to_owned());
    if seen.contains(&key) {
        return false;
    }
    if read.get(&key).copied().unwrap_or(false) {
        return true;
    }
    seen.push(key);
    let Some(member) = workspace.packages.iter().find(|p| p.name == package) else {
        // Outside the workspace: assumed to gate something.
        return true;
    };
    let Some(enables) = member.features.get(feature) else {
        return false;
    };
    enables.iter().any(|entry| {
        if entry.starts_with("dep:") {
            return true;
        }
        match entry.split_once('/') {
            Some((dep, sub)) => {
                let dep = dep.trim_end_matches('?');
                if workspace.is_member(dep) {
                    gates(workspace, read, dep, sub, seen)
                } else {
                    true
                }
            }
            None => gates(workspace, read, package, entry, seen),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::{DepKind, Dependency, Package};

    #[test]
    fn a_doc_comment_may_follow_blank_lines() {
        assert!(starts_with_doc_comment("\n\n//! Docs.\nfn main() {}\n"));
        assert!(!starts_with_doc_comment("fn main() {}\n"));
        assert!(!starts_with_doc_comment("// A plain comment.\n//! Docs.\n"));
        assert!(!starts_with_doc_comment("/// An item doc.\nfn f() {}\n"));
        assert!(!starts_with_doc_comment(""));
    }

    const MANIFEST: &str = r#"
[workspace.package]
version = "0.1.0" # not a dependency

[workspace.dependencies]
loom-core = { path = "crates/loom-core", version = "0.1.0" }
loom-bad = { path = "crates/loom-bad", features = ["a", "b"] } # no version
serde = { version = "1", features = ["derive"] }
anyhow = "1"
loom-dotted.path = "crates/loom-dotted"

[workspace.dependencies.loom-table]
path = "crates/loom-table"
version = "0.1.0"

[workspace.dependencies.loom-table-bad]
path = "crates/loom-table-bad"

[workspace.lints.rust]
path = "not a dependency"
"#;

    fn workspace(packages: Vec<Package>) -> Workspace {
        Workspace {
            root: PathBuf::from("/nowhere"),
            packages,
        }
    }

    #[test]
    fn hex_by_hand_is_seen() {
        assert!(hand_written_hex(r#"    .map(|b| format!("{b:02x}"))"#));
        assert!(hand_written_hex(
            r#"out.push_str(&format!("{:02X}", byte));"#
        ));
        assert!(!hand_written_hex("hex::encode(digest)"));
    }

    #[test]
    fn workspace_path_dependencies_need_a_version() {
        let violations = check_path_versions(MANIFEST, &workspace(Vec::new()));
        let names: Vec<&str> = violations
            .iter()
            .filter_map(|v| v.split(' ').nth(1))
            .collect();
        assert_eq!(
            names,
            ["loom-bad", "loom-dotted", "loom-table-bad"],
            "{violations:?}"
        );
    }

    #[test]
    fn a_direct_path_dependency_needs_a_version_unless_private_or_dev() {
        let path_dep = |kind| Dependency {
            path: Some(PathBuf::from("../loom-core")),
            ..Dependency::new("loom-core", kind)
        };
        let private = Package {
            publish: false,
            ..Package::new("xtask", vec![path_dep(DepKind::Normal)])
        };
        let packages = vec![
            Package::new("loom-engine", vec![path_dep(DepKind::Normal)]),
            Package::new("loom-models", vec![path_dep(DepKind::Dev)]),
            private,
        ];
        assert_eq!(
            check_path_versions("", &workspace(packages)),
            [
                "loom-engine depends on the path dependency loom-core without a version: \
              it cannot be published"
            ]
        );
    }
}
