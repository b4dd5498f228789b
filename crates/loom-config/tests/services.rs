//! The services of a deployment of several processes: `storage.queue` (RabbitMQ),
//! `storage.bus` (Redis or PostgreSQL), `storage.limits` and the Redis idempotency store, with
//! the located refusals of what is missing or belongs to another backend.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{dir_with, load_dir, refused};
use loom_config::{BusBackend, IdempotencyBackend, LimitsBackend, QueueBackend};

#[test]
fn the_defaults_need_no_service() {
    let dir = dir_with(&[("loom.yaml", "version: 1\n")]);
    let config = load_dir(dir.path(), None).unwrap();
    let storage = &config.raw().storage;
    assert_eq!(storage.queue.backend, QueueBackend::Asyncio);
    assert_eq!(storage.queue.max_running, 16);
    assert_eq!(storage.queue.max_attempts, 5);
    assert_eq!(storage.queue.name, "loom");
    assert_eq!(storage.bus.backend, BusBackend::Memory);
    assert_eq!(storage.limits.backend, LimitsBackend::Memory);
}

#[test]
fn a_deployment_on_postgres_rabbitmq_and_redis() {
    let dir = dir_with(&[(
        "loom.yaml",
        "version: 1\nstorage:\n  events: {backend: postgres, dsn_env: PG}\n  \
         queue: {backend: rabbitmq, url_env: AMQP, max_attempts: 3}\n  \
         bus: {backend: redis, url_env: REDIS}\n  limits: {backend: redis, url_env: REDIS}\n  \
         idempotency: {backend: redis, url_env: REDIS}\n",
    )]);
    let config = load_dir(dir.path(), None).unwrap();
    let storage = &config.raw().storage;
    assert_eq!(storage.queue.backend, QueueBackend::Rabbitmq);
    assert_eq!(storage.queue.url_env.as_deref(), Some("AMQP"));
    assert_eq!(storage.queue.max_attempts, 3);
    assert_eq!(storage.bus.backend, BusBackend::Redis);
    assert_eq!(storage.limits.backend, LimitsBackend::Redis);
    let idempotency = storage.idempotency.as_ref().unwrap();
    assert_eq!(idempotency.backend, IdempotencyBackend::Redis);
    // The PostgreSQL bus shares the journal's database by default.
    let dir = dir_with(&[(
        "loom.yaml",
        "version: 1\nstorage:\n  events: {backend: postgres, dsn_env: PG}\n  bus: {backend: postgres}\n",
    )]);
    let config = load_dir(dir.path(), None).unwrap();
    assert_eq!(config.raw().storage.bus.backend, BusBackend::Postgres);
    assert_eq!(config.raw().storage.bus.dsn_env, None);
}

#[test]
fn bad_service_settings_are_refused_where_they_are() {
    let cases = [
        (
            "storage:\n  events: {backend: jsonl, path: j}\n  queue: {backend: rabbitmq}\n",
            "loom.yaml:4:20 storage.queue.backend: backend 'rabbitmq' requires 'url_env' (the name of the environment variable holding the AMQP URL)",
        ),
        (
            "storage:\n  queue: {backend: rabbitmq, url_env: AMQP}\n",
            "loom.yaml:3:20 storage.queue.backend: backend 'rabbitmq' hands runs to `loom worker` processes, which cannot read a memory journal: declare a durable storage.events (postgres for workers on several hosts)",
        ),
        (
            "storage:\n  events: {backend: jsonl, path: j}\n  queue: {backend: rabbitmq, url_env: 'amqp://x'}\n",
            "loom.yaml:4:39 storage.queue.url_env: 'amqp://x' is not an environment variable name (it names the variable holding the address, not the address)",
        ),
        (
            "storage:\n  queue: {url_env: AMQP}\n",
            "loom.yaml:3:20 storage.queue.url_env: 'url_env' is only for the rabbitmq backend",
        ),
        (
            "storage:\n  queue: {max_running: 0}\n",
            "loom.yaml:3:24 storage.queue.max_running: must be 1 or more",
        ),
        (
            "storage:\n  queue: {max_attempts: 0}\n",
            "loom.yaml:3:25 storage.queue.max_attempts: must be 1 or more",
        ),
        (
            "storage:\n  queue: {backend: kafka}\n",
            "loom.yaml:3:20 storage.queue.backend: unknown value 'kafka' (expected one of: asyncio, rabbitmq)",
        ),
        (
            "storage:\n  queue: {name: 'a b'}\n",
            "loom.yaml:3:17 storage.queue.name: queue name prefix 'a b' must be 1 to 64 characters among [A-Za-z0-9_.-]",
        ),
        (
            "storage:\n  bus: {backend: redis}\n",
            "loom.yaml:3:18 storage.bus.backend: backend 'redis' requires 'url_env' (the name of the environment variable holding the Redis URL)",
        ),
        (
            "storage:\n  bus: {backend: postgres}\n",
            "loom.yaml:3:18 storage.bus.backend: backend 'postgres' requires 'dsn_env' (or a postgres journal to share)",
        ),
        (
            "storage:\n  bus: {backend: redis, url_env: R, dsn_env: PG}\n",
            "loom.yaml:3:46 storage.bus.dsn_env: 'dsn_env' is only for the postgres backend",
        ),
        (
            "storage:\n  bus: {url_env: R}\n",
            "loom.yaml:3:18 storage.bus.url_env: 'url_env' is only for the redis backend",
        ),
        (
            "storage:\n  limits: {backend: redis}\n",
            "loom.yaml:3:21 storage.limits.backend: backend 'redis' requires 'url_env' (the name of the environment variable holding the Redis URL)",
        ),
        (
            "storage:\n  idempotency: {backend: redis}\n",
            "loom.yaml:3:26 storage.idempotency.backend: backend 'redis' requires 'url_env' (the name of the environment variable holding the Redis URL)",
        ),
        (
            "storage:\n  idempotency: {backend: sqlite, path: i.db, url_env: R}\n",
            "loom.yaml:3:55 storage.idempotency.url_env: 'url_env' is only for the redis backend",
        ),
    ];
    for (section, expected) in cases {
        let root = format!("version: 1\n{section}");
        assert_eq!(refused(&root, &[]), expected, "{section}");
    }
}
