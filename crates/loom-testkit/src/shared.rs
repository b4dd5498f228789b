//! `../shared`: the reference journals and recorded provider transcripts that sit beside the
//! repository (read in place, never copied into it).
//!
//! A test that reads them asks [`path`] (or [`text`]) first. On a bare clone, where `../shared`
//! does not exist, the test writes `skipped <test>: ../shared not found …` on stderr and returns
//! early, so the suite passes on a clone without it. With `LOOM_REQUIRE_SHARED=1`, which `.ci/run`
//! sets when `../shared` is beside the repository, a `../shared` the test cannot find fails it
//! instead: there, the tests that read it must run.
//!
//! Only a missing `../shared` folder skips: a file missing inside an existing `../shared` is a
//! failure (the test names a file the reference set does not have).

use std::{
    io::Write,
    path::{Path, PathBuf},
};

/// The variable that turns a skip into a failure when set to `1`.
pub const REQUIRE_SHARED: &str = "LOOM_REQUIRE_SHARED";

/// The workspace root: the nearest folder above the running test's package (`cargo test` sets
/// `CARGO_MANIFEST_DIR` when it runs a test) whose `Cargo.toml` declares `[workspace]`.
///
/// Looked up when the test runs, not when this crate is compiled: two checkouts sharing one
/// target directory share this crate's compiled form (Cargo hashes path packages relative to
/// their workspace), so a path baked in at compile time could be the other checkout's.
fn workspace_root() -> PathBuf {
    let package = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    package
        .ancestors()
        .find(|dir| declares_a_workspace(&dir.join("Cargo.toml")))
        .map_or_else(|| package.clone(), Path::to_path_buf)
}

/// Whether the manifest at `path` has a `[workspace]` table.
fn declares_a_workspace(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .is_ok_and(|manifest| manifest.lines().any(|line| line.trim() == "[workspace]"))
}

/// Where `../shared` is expected: the folder `shared` beside the workspace root.
pub fn root() -> PathBuf {
    let workspace = workspace_root();
    workspace
        .parent()
        .map_or_else(|| workspace.clone(), Path::to_path_buf)
        .join("shared")
}

/// Whether the tests that read `../shared` must fail rather than skip when it is missing.
pub fn required() -> bool {
    std::env::var(REQUIRE_SHARED).as_deref() == Ok("1")
}

/// What [`locate`] decided for a path under `../shared`.
#[derive(Debug, PartialEq, Eq)]
pub enum Located {
    /// `../shared` exists: the path of the file (which may still be missing inside it).
    Found(PathBuf),
    /// `../shared` does not exist and nothing requires it: the notice to print.
    Skip(String),
    /// `../shared` does not exist and it is required: the failure message.
    Missing(String),
}

/// Decides for `relative` under the shared folder `root`, on behalf of `test`.
pub fn locate(root: &Path, relative: &str, test: &str, required: bool) -> Located {
    if root.is_dir() {
        return Located::Found(root.join(relative));
    }
    let what = format!(
        "../shared not found (looked for {}); {test} reads {relative}",
        root.display()
    );
    if required {
        Located::Missing(format!(
            "{what}: {REQUIRE_SHARED}=1 requires it (put the shared reference set beside the \
             repository)"
        ))
    } else {
        Located::Skip(format!("skipped: {what}"))
    }
}

/// The name of the running test (libtest names each test's thread after it).
fn current_test() -> String {
    std::thread::current()
        .name()
        .filter(|name| *name != "main")
        .unwrap_or("this test")
        .to_owned()
}

/// `../shared/<relative>`, or `None` when `../shared` does not exist: the test then returns
/// early. Prints the skip notice on stderr (past the test harness's capture, so that a normal
/// `cargo test` shows it). Panics when `../shared` is missing and [`required`].
pub fn path(relative: &str) -> Option<PathBuf> {
    match locate(&root(), relative, &current_test(), required()) {
        Located::Found(path) => Some(path),
        Located::Skip(notice) => {
            let _ = writeln!(std::io::stderr(), "{notice}");
            None
        }
        Located::Missing(message) => panic!("{message}"),
    }
}

/// The text of `../shared/<relative>` (see [`path`]). Panics when `../shared` exists and the
/// file cannot be read.
pub fn text(relative: &str) -> Option<String> {
    let path = path(relative)?;
    match std::fs::read_to_string(&path) {
        Ok(text) => Some(text),
        Err(error) => panic!("cannot read {}: {error}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_shared_folder_skips_with_a_notice() {
        let dir = std::env::temp_dir().join("loom-testkit-no-such-shared-folder");
        let Located::Skip(notice) = locate(&dir, "reference/x.jsonl", "t::a", false) else {
            panic!("not a skip");
        };
        assert!(
            notice.starts_with("skipped: ../shared not found"),
            "{notice}"
        );
        assert!(notice.contains("t::a reads reference/x.jsonl"), "{notice}");
    }

    #[test]
    fn a_missing_shared_folder_fails_when_it_is_required() {
        let dir = std::env::temp_dir().join("loom-testkit-no-such-shared-folder");
        let Located::Missing(message) = locate(&dir, "reference/x.jsonl", "t::a", true) else {
            panic!("not a failure");
        };
        assert!(
            message.contains("LOOM_REQUIRE_SHARED=1 requires it"),
            "{message}"
        );
    }

    #[test]
    fn an_existing_shared_folder_gives_the_path_even_of_a_missing_file() {
        let dir = std::env::temp_dir();
        assert_eq!(
            locate(&dir, "no/such/file", "t::a", false),
            Located::Found(dir.join("no/such/file"))
        );
    }

    #[test]
    fn the_shared_folder_is_beside_the_workspace() {
        let root = root();
        let workspace = workspace_root();
        assert_eq!(root.file_name().and_then(|n| n.to_str()), Some("shared"));
        assert_eq!(root.parent(), workspace.parent());
        assert!(declares_a_workspace(&workspace.join("Cargo.toml")));
        assert_eq!(
            workspace.join("crates/loom-testkit"),
            Path::new(&std::env::var_os("CARGO_MANIFEST_DIR").unwrap())
        );
    }
}
