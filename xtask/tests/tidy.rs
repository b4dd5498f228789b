//! The architecture's invariants as a test: `cargo test` fails when a crate
//! breaks the layering, a source file lacks its `//!` doc comment, an
//! internal path dependency lacks a version, or shipped code formats hex by hand.

use xtask::workspace::Workspace;
use xtask::{layers, tidy, workspace_root};

fn fail_on(check: &str, violations: &[String]) {
    assert!(
        violations.is_empty(),
        "{check}: {} violation(s)\n  {}",
        violations.len(),
        violations.join("\n  ")
    );
}

#[test]
fn crates_respect_the_layering() {
    let workspace = Workspace::load(&workspace_root()).unwrap();
    fail_on("layering", &layers::check_layering(&workspace));
}

#[test]
fn every_source_file_starts_with_a_doc_comment() {
    let missing = tidy::check_doc_comments(&workspace_root()).unwrap();
    fail_on("files without a //! doc comment", &missing);
}

#[test]
fn internal_path_dependencies_carry_a_version() {
    let root = workspace_root();
    let workspace = Workspace::load(&root).unwrap();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    fail_on(
        "path dependency versions",
        &tidy::check_path_versions(&manifest, &workspace),
    );
}

#[test]
fn hex_is_written_by_the_hex_crate() {
    let found = tidy::check_hand_written_hex(&workspace_root()).unwrap();
    fail_on("hex formatted by hand (use hex::encode)", &found);
}
