//! # loom-models
//!
//! Model adapters behind [`loom_core::model::ModelClient`]. Today: the scripted [`FakeModel`]
//! (`sdk: fake`), which needs no network and no key, streams its text in deltas and reports
//! token usage, so runs are deterministic in tests, demos and benchmarks. Real providers
//! (Anthropic, OpenAI) arrive behind Cargo features of their own.
//!
//! **Architecture invariant:** adapters depend on `loom-core` only, never on the engine.

pub mod fake;

pub use fake::{FakeModel, FakeScriptError};
