//! Business idempotency keys through a binary (`examples/relance`): two different runs asking
//! to chase the same quote send one reminder, the second run reusing the first one's result;
//! erasing that run's session erases its key; a configuration without an idempotency store is
//! refused at load.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::{
    fs,
    path::Path,
    process::{Command, Output, Stdio},
};

/// A copy of the example's configuration in a fresh directory, with `loom.yaml` edited.
fn setup(edit: impl Fn(String) -> String) -> tempfile::TempDir {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/relance");
    let dir = tempfile::tempdir().unwrap();
    let yaml = fs::read_to_string(source.join("loom.yaml")).unwrap();
    fs::write(dir.path().join("loom.yaml"), edit(yaml)).unwrap();
    fs::create_dir_all(dir.path().join("agents")).unwrap();
    fs::copy(
        source.join("agents/relance.yaml"),
        dir.path().join("agents/relance.yaml"),
    )
    .unwrap();
    dir
}

fn relance(dir: &Path, args: &[&str]) -> Output {
    Command::new(example_bin("relance"))
        .current_dir(dir)
        .env("RELANCE_FILE", dir.join("relances.txt"))
        .args(["--config", "loom.yaml"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn journal(dir: &Path, run_id: &str) -> String {
    fs::read_to_string(dir.join("data/default").join(format!("{run_id}.jsonl"))).unwrap()
}

#[test]
fn two_runs_chasing_the_same_quote_send_one_reminder() {
    let dir = setup(|yaml| yaml);
    for run_id in ["premier", "second"] {
        let output = relance(
            dir.path(),
            &[
                "run",
                "relance",
                "Relance le devis D-2024-017",
                "--run-id",
                run_id,
            ],
        );
        assert!(
            output.status.success(),
            "{run_id}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let lines = fs::read_to_string(dir.path().join("relances.txt")).unwrap();
    assert_eq!(lines, "relance D-2024-017\n", "one reminder only");

    let first = journal(dir.path(), "premier");
    assert!(first.contains(r#""type":"idempotency.recorded""#));
    assert!(!first.contains("idempotency.reused"));
    let second = journal(dir.path(), "second");
    assert!(
        second.contains(r#""type":"idempotency.reused""#),
        "{second}"
    );
    assert!(second.contains(r#""key":"default:envoyer_relance:relance:D-2024-017""#));
    assert!(second.contains("relance envoyée pour le devis D-2024-017"));
    assert!(!second.contains("idempotency.recorded"));
    assert!(dir.path().join("data/idempotency.db").exists());

    // Erasing the first run's session erases its key: the same quote is chased again.
    let output = relance(dir.path(), &["sessions", "delete", "premier", "--yes"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = relance(
        dir.path(),
        &[
            "run",
            "relance",
            "Relance le devis D-2024-017",
            "--run-id",
            "troisieme",
        ],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines = fs::read_to_string(dir.path().join("relances.txt")).unwrap();
    assert_eq!(lines, "relance D-2024-017\nrelance D-2024-017\n");
    let third = journal(dir.path(), "troisieme");
    assert!(
        third.contains(r#""type":"idempotency.recorded""#),
        "{third}"
    );
    assert!(!third.contains("idempotency.reused"));
}

#[test]
fn a_business_key_without_an_idempotency_store_is_refused_at_load() {
    let dir = setup(|yaml| {
        yaml.lines()
            .filter(|line| !line.trim_start().starts_with("idempotency:"))
            .collect::<Vec<_>>()
            .join("\n")
    });
    let output = relance(dir.path(), &["run", "relance", "Relance le devis D-1"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("envoyer_relance"), "{stderr}");
    assert!(stderr.contains("storage.idempotency"), "{stderr}");
    assert!(!dir.path().join("relances.txt").exists());
}
