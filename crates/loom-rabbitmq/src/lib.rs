//! # loom-rabbitmq
//!
//! Loom's job queue on RabbitMQ (`storage.queue: {backend: rabbitmq}`): the queues `loom.jobs`,
//! the delayed queues and `loom.jobs.dead`, consumed by `loom worker`.
