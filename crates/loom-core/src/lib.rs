//! # loom-core
//!
//! The domain of Loom, and nothing else: messages and content blocks, the event envelope and
//! its payloads, the run-state projection, usage and pricing, and the ports (object-safe traits)
//! through which the engine reaches the world.
//!
//! **Architecture invariant:** this crate does no IO and names no async runtime. It reads no
//! clock and no environment variable; time and identifiers come in as values. Everything here
//! can be unit-tested without a runtime, and every other crate depends on it.
//!
//! The journal is the truth: [`event::Event`] is the only persisted fact, and
//! [`state::RunState`] is a pure fold over a run's events.

pub mod approval;
pub mod bus;
pub mod circuit;
pub mod content;
pub mod counters;
pub mod event;
pub mod ids;
pub mod journal;
pub mod limits;
pub mod model;
pub mod policy;
pub mod ports;
pub mod queue;
pub mod redact;
pub mod sandbox;
pub mod search;
pub mod state;
pub mod tool;
pub mod usage;

pub use content::{Block, BlockKind, Message, Role};
pub use event::{Category, Event, EventStatus, Payload};
pub use state::{RunState, RunStatus};
pub use usage::{Pricing, Usage};

use std::{future::Future, pin::Pin};

/// A boxed, sendable future: what object-safe ports return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A boxed, sendable stream: what streaming ports return.
pub type BoxStream<'a, T> = Pin<Box<dyn futures_core::Stream<Item = T> + Send + 'a>>;
