//! The `sqlite` journal backend: its path, the artifacts beside it, and its refusal without a
//! path.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{dir_with, load_dir, refused};
use loom_config::EventsBackend;

#[test]
fn sqlite_journal_is_a_file_with_artifacts_beside_it() {
    let dir = dir_with(&[(
        "loom.yaml",
        "version: 1\nstorage:\n  events:\n    backend: sqlite\n    path: data/loom.db\n",
    )]);
    let config = load_dir(dir.path(), None).unwrap();
    assert_eq!(config.raw().storage.events.backend, EventsBackend::Sqlite);
    assert_eq!(config.events_path(), Some(dir.path().join("data/loom.db")));
    assert_eq!(
        config.artifacts_path(),
        Some(dir.path().join("data").join(".artifacts"))
    );
}

#[test]
fn sqlite_artifacts_can_be_placed_or_kept_in_memory() {
    let dir = dir_with(&[(
        "loom.yaml",
        "version: 1\nstorage:\n  events:\n    backend: sqlite\n    path: loom.db\n  \
         artifacts:\n    backend: local\n    path: files\n",
    )]);
    let config = load_dir(dir.path(), None).unwrap();
    assert_eq!(config.events_path(), Some(dir.path().join("loom.db")));
    assert_eq!(config.artifacts_path(), Some(dir.path().join("files")));

    let dir = dir_with(&[(
        "loom.yaml",
        "version: 1\nstorage:\n  events:\n    backend: sqlite\n    path: loom.db\n  \
         artifacts:\n    backend: memory\n",
    )]);
    assert_eq!(load_dir(dir.path(), None).unwrap().artifacts_path(), None);
}

#[test]
fn sqlite_without_path() {
    let root = "\
version: 1
storage:
  events:
    backend: sqlite
";
    assert_eq!(
        refused(root, &[]),
        "loom.yaml:4:14 storage.events.backend: backend 'sqlite' requires 'path' (the database file)"
    );
}
