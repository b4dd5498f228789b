//! `storage.encryption` and `storage.retention`: accepted as the reference writes them, and
//! each mistake refused at its key.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{load_str, no_env, refused};

const MODELS: &str = "\
version: 1
models:
  - id: fake-1
    sdk: fake
    model: scripted
";

fn with(storage: &str) -> String {
    format!("{MODELS}storage:\n  events: {{backend: jsonl, path: data}}\n{storage}")
}

#[test]
fn encryption_and_retention_are_read() {
    let root =
        with("  encryption: {keys: [journal_key, old_key]}\n  retention: {events_days: 30}\n");
    let config = load_str(&root, &[], None, &no_env).unwrap();
    let storage = &config.raw().storage;
    assert_eq!(
        storage.encryption.as_ref().unwrap().keys,
        ["journal_key", "old_key"]
    );
    assert_eq!(storage.retention.events_days, Some(30));
    let plain = load_str(&with(""), &[], None, &no_env).unwrap();
    assert_eq!(plain.raw().storage.encryption, None);
    assert_eq!(plain.raw().storage.retention.events_days, None);
    let null = load_str(
        &with("  retention: {events_days: null}\n"),
        &[],
        None,
        &no_env,
    )
    .unwrap();
    assert_eq!(null.raw().storage.retention.events_days, None);
}

#[test]
fn encryption_mistakes_are_refused_where_they_are() {
    assert_eq!(
        refused(&with("  encryption: {keys: []}\n"), &[]),
        "loom.yaml:8:22 storage.encryption.keys: at least one key name is needed (the first \
         seals, all open)"
    );
    assert_eq!(
        refused(&with("  encryption:\n    keys: [a, b, a]\n"), &[]),
        "loom.yaml:9:18 storage.encryption.keys[2]: key 'a' is listed twice"
    );
    assert_eq!(
        refused(&with("  encryption: {keys: ['']}\n"), &[]),
        "loom.yaml:8:23 storage.encryption.keys[0]: '' cannot name a secret (a variable name is \
         expected)"
    );
    assert_eq!(
        refused(&with("  encryption: {}\n"), &[]),
        "loom.yaml:8:15 storage.encryption.keys: missing required key 'keys'"
    );
    let memory = format!("{MODELS}storage:\n  encryption: {{keys: [k]}}\n");
    assert_eq!(
        refused(&memory, &[]),
        "loom.yaml:7:15 storage.encryption: encryption needs a durable journal \
         (storage.events.backend jsonl or sqlite): the memory journal keeps nothing at rest"
    );
}

#[test]
fn retention_mistakes_are_refused_where_they_are() {
    assert_eq!(
        refused(&with("  retention: {events_days: 0}\n"), &[]),
        "loom.yaml:8:28 storage.retention.events_days: must be a whole number of days, 1 or more \
         (or null to keep everything)"
    );
    let negative = refused(&with("  retention: {events_days: -3}\n"), &[]);
    assert!(
        negative.starts_with(
            "loom.yaml:8:28 storage.retention.events_days: invalid value: integer `-3`"
        ),
        "{negative}"
    );
    let unknown = refused(&with("  retention: {days: 3}\n"), &[]);
    assert!(
        unknown.starts_with("loom.yaml:8:15 storage.retention.days: unknown key 'days'"),
        "{unknown}"
    );
}
