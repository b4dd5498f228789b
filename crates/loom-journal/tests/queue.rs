//! `MemoryQueue` runs the job queue conformance suite of every `JobQueue` (RabbitMQ's in
//! `crates/loom-rabbitmq`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use loom_core::queue::JobQueue;
use loom_journal::MemoryQueue;

async fn open(_test: &str) -> Option<((), Arc<dyn JobQueue>)> {
    Some(((), Arc::new(MemoryQueue::new(3))))
}

async fn close(_guard: ()) {}

loom_testkit::queue_conformance!(memory, open, close);
