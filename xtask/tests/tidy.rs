//! The architecture's invariants as a test: `cargo test` fails when a crate
//! breaks the layering, a module of the engine names its dispatcher or the
//! engine's modules import each other in a circle, a source file lacks its
//! `//!` doc comment, an internal path dependency lacks a version, a Cargo
//! feature gates nothing, or shipped code formats hex by hand.

use xtask::workspace::Workspace;
use xtask::{layers, modules, tidy, workspace_root};

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
fn engine_modules_form_no_circle_around_the_driver() {
    let violations = modules::check_engine(&workspace_root()).unwrap();
    fail_on("engine modules", &violations);
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
fn every_feature_gates_something() {
    let workspace = Workspace::load(&workspace_root()).unwrap();
    fail_on(
        "features that gate nothing",
        &tidy::check_features(&workspace).unwrap(),
    );
}

/// `loom-ia --no-default-features` is the small build (fake model, memory and JSONL journals):
/// no HTTP client, no TLS and no HTML parser may come with it.
#[test]
fn the_facade_without_features_pulls_no_http_client() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = std::process::Command::new(cargo)
        .args([
            "tree",
            "-p",
            "loom-ia",
            "--no-default-features",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--offline",
            "--locked",
        ])
        .arg("--manifest-path")
        .arg(workspace_root().join("Cargo.toml"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tree = String::from_utf8_lossy(&output.stdout);
    let pulled: Vec<&str> = tree
        .lines()
        .filter(|line| {
            ["reqwest ", "hyper ", "rustls ", "html5ever ", "htmd "]
                .iter()
                .any(|name| line.starts_with(name))
        })
        .collect();
    assert!(
        pulled.is_empty(),
        "loom-ia --no-default-features pulls {pulled:?}"
    );
}

#[test]
fn hex_is_written_by_the_hex_crate() {
    let found = tidy::check_hand_written_hex(&workspace_root()).unwrap();
    fail_on("hex formatted by hand (use hex::encode)", &found);
}
