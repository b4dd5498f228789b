//! Repository checks for the Loom workspace, run by `cargo test` (through
//! `xtask/tests/tidy.rs`) and by `cargo run -p xtask -- tidy`.
//!
//! They turn the architecture's invariants into failures: the layering of
//! crate dependencies ([`layers`]), the engine's module graph (no module names
//! its dispatcher, no import circle: [`modules`]), a `//!` doc comment atop
//! every source file, versions on internal path dependencies and Cargo
//! features that gate something ([`tidy`]), and test code that neither times
//! nor hand-polls nor reads `../shared` directly ([`hygiene`]).

#![warn(missing_docs)]

pub mod hygiene;
pub mod layers;
pub mod modules;
pub mod tidy;
pub mod workspace;

use std::path::{Path, PathBuf};

use workspace::{Error, Workspace};

/// The outcome of one named check.
#[derive(Debug)]
pub struct Check {
    /// A short name, such as `layering`.
    pub name: &'static str,
    /// One line per violation; empty when the check passes.
    pub violations: Vec<String>,
}

/// The workspace root: the parent of the `xtask` package.
///
/// Read when the checks run (`cargo test` and `cargo run` set `CARGO_MANIFEST_DIR`), the
/// compile-time path only as a fallback: two checkouts sharing one target directory share this
/// crate's compiled form (Cargo hashes path packages relative to their workspace), so a path
/// baked in at compile time can be the other checkout's, even one since deleted.
pub fn workspace_root() -> PathBuf {
    let xtask = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    xtask
        .parent()
        .map_or_else(|| xtask.clone(), Path::to_path_buf)
}

/// Runs every check on the workspace at `root`.
pub fn run_all(root: &Path) -> Result<Vec<Check>, Error> {
    let workspace = Workspace::load(root)?;
    let manifest_path = root.join("Cargo.toml");
    let manifest = std::fs::read_to_string(&manifest_path)
        .map_err(|e| Error::new(format!("cannot read {}: {e}", manifest_path.display())))?;
    Ok(vec![
        Check {
            name: "layering",
            violations: layers::check_layering(&workspace),
        },
        Check {
            name: "engine modules",
            violations: modules::check_engine(root)?,
        },
        Check {
            name: "doc comments",
            violations: tidy::check_doc_comments(root)?
                .into_iter()
                .map(|file| format!("{file} does not start with a //! doc comment"))
                .collect(),
        },
        Check {
            name: "path dependency versions",
            violations: tidy::check_path_versions(&manifest, &workspace),
        },
        Check {
            name: "features that gate nothing",
            violations: tidy::check_features(&workspace)?,
        },
        Check {
            name: "test hygiene",
            violations: hygiene::check_tests(root)?,
        },
    ])
}
