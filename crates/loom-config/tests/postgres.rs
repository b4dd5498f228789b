//! The `postgres` storage settings: the journal (`dsn_env`, `role`, `pool`), `storage.migrate`,
//! the idempotency store and the artifacts following the journal into the database, and the
//! located refusals of what is missing or out of range.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{dir_with, load_dir, refused};
use loom_config::{ArtifactsBackend, EventsBackend, IdempotencyBackend, MigrateMode, PostgresPool};

#[test]
fn a_postgres_journal_takes_its_dsn_from_a_variable_with_reference_defaults() {
    let dir = dir_with(&[(
        "loom.yaml",
        "version: 1\nstorage:\n  events:\n    backend: postgres\n    dsn_env: LOOM_PG_DSN\n",
    )]);
    let config = load_dir(dir.path(), None).unwrap();
    let events = &config.raw().storage.events;
    assert_eq!(events.backend, EventsBackend::Postgres);
    assert_eq!(events.dsn_env.as_deref(), Some("LOOM_PG_DSN"));
    assert_eq!(events.role, "loom_app");
    assert_eq!(
        events.pool,
        PostgresPool {
            min_size: 1,
            max_size: 10,
            command_timeout: 60.0,
            lock_timeout: 10.0,
            acquire_timeout: 30.0,
        }
    );
    assert_eq!(config.raw().storage.migrate, MigrateMode::Check);
    // Artifacts follow the journal into the database.
    assert!(config.artifacts_in_postgres());
    assert_eq!(config.artifacts_path(), None);
    assert_eq!(config.events_path(), None);
}

#[test]
fn everything_can_be_set() {
    let dir = dir_with(&[(
        "loom.yaml",
        "version: 1\nstorage:\n  migrate: auto\n  events:\n    backend: postgres\n    \
         dsn_env: PG\n    role: loom_billing\n    pool: {min_size: 2, max_size: 4, \
         command_timeout: 5, lock_timeout: 1.5, acquire_timeout: 2}\n  idempotency:\n    \
         backend: postgres\n  artifacts:\n    backend: local\n    path: files\n",
    )]);
    let config = load_dir(dir.path(), None).unwrap();
    let storage = &config.raw().storage;
    assert_eq!(storage.migrate, MigrateMode::Auto);
    assert_eq!(storage.events.role, "loom_billing");
    assert_eq!(storage.events.pool.max_size, 4);
    assert_eq!(storage.events.pool.lock_timeout, 1.5);
    let idempotency = storage.idempotency.as_ref().unwrap();
    assert_eq!(idempotency.backend, IdempotencyBackend::Postgres);
    assert_eq!(idempotency.dsn_env, None, "the journal's, by default");
    assert!(!config.artifacts_in_postgres());
    assert_eq!(config.artifacts_path(), Some(dir.path().join("files")));

    let dir = dir_with(&[(
        "loom.yaml",
        "version: 1\nstorage:\n  events: {backend: postgres, dsn_env: PG}\n  \
         artifacts: {backend: postgres}\n  idempotency: {backend: postgres, dsn_env: OTHER, \
         role: other_app, pool: {max_size: 3}}\n",
    )]);
    let config = load_dir(dir.path(), None).unwrap();
    assert_eq!(
        config.raw().storage.artifacts.backend,
        Some(ArtifactsBackend::Postgres)
    );
    assert!(config.artifacts_in_postgres());
    let idempotency = config.raw().storage.idempotency.as_ref().unwrap();
    assert_eq!(idempotency.role.as_deref(), Some("other_app"));
    assert_eq!(idempotency.pool.unwrap().max_size, 3);
}

#[test]
fn bad_postgres_settings_are_refused_where_they_are() {
    let cases = [
        (
            "storage:\n  events: {backend: postgres}\n",
            "loom.yaml:3:21 storage.events.backend: backend 'postgres' requires 'dsn_env' (the name of the environment variable holding the DSN)",
        ),
        (
            "storage:\n  events: {backend: postgres, dsn_env: 'postgres://u@h/db'}\n",
            "loom.yaml:3:40 storage.events.dsn_env: 'postgres://u@h/db' is not an environment variable name (it names the variable holding the DSN, not the DSN)",
        ),
        (
            "storage:\n  events: {backend: postgres, dsn_env: PG, role: Loom-App}\n",
            "loom.yaml:3:50 storage.events.role: role 'Loom-App' is not a lowercase identifier [a-z_][a-z0-9_]* of at most 63 bytes",
        ),
        (
            "storage:\n  events: {backend: postgres, dsn_env: PG, pool: {min_size: 0}}\n",
            "loom.yaml:3:61 storage.events.pool.min_size: must be 1 or more",
        ),
        (
            "storage:\n  events: {backend: postgres, dsn_env: PG, pool: {min_size: 5, max_size: 2}}\n",
            "loom.yaml:3:74 storage.events.pool.max_size: max_size 2 is below min_size 5",
        ),
        (
            "storage:\n  events: {backend: postgres, dsn_env: PG, pool: {lock_timeout: 0}}\n",
            "loom.yaml:3:65 storage.events.pool.lock_timeout: must be a number of seconds above 0 (at most a day)",
        ),
        (
            "storage:\n  events: {backend: postgres, dsn_env: PG, path: x.db}\n",
            "loom.yaml:3:50 storage.events.path: the postgres journal has no path (its database is named by dsn_env)",
        ),
        (
            "storage:\n  events: {backend: jsonl, path: data, dsn_env: PG}\n",
            "loom.yaml:3:49 storage.events.dsn_env: 'dsn_env' is only for the postgres backend",
        ),
        (
            "storage:\n  events: {backend: jsonl, path: data}\n  idempotency: {backend: postgres}\n",
            "loom.yaml:4:26 storage.idempotency.backend: backend 'postgres' requires 'dsn_env' (or a postgres journal to share)",
        ),
        (
            "storage:\n  events: {backend: sqlite, path: l.db}\n  idempotency: {backend: sqlite, dsn_env: PG}\n",
            "loom.yaml:4:43 storage.idempotency.dsn_env: 'dsn_env' is only for the postgres backend",
        ),
        (
            "storage:\n  events: {backend: jsonl, path: data}\n  artifacts: {backend: postgres}\n",
            "loom.yaml:4:24 storage.artifacts.backend: backend 'postgres' keeps artifacts in the journal's database: it needs storage.events.backend: postgres",
        ),
        (
            "storage:\n  events: {backend: postgres, dsn_env: PG}\n  artifacts: {backend: local}\n",
            "loom.yaml:4:24 storage.artifacts.backend: backend 'local' requires 'path' beside a postgres journal (by default artifacts follow it into the database)",
        ),
        (
            "storage:\n  migrate: always\n",
            "loom.yaml:3:12 storage.migrate: unknown value 'always' (expected one of: auto, check)",
        ),
    ];
    for (section, expected) in cases {
        let root = format!("version: 1\n{section}");
        assert_eq!(refused(&root, &[]), expected, "{section}");
    }
}
