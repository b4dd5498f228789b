//! # loom-engine
//!
//! The run loop, as a state machine over journal events.
//!
//! A run is advanced by [`Engine::drive`]: the state is recomputed from the journal
//! ([`loom_core::RunState::fold`]), the next effect is chosen from the state alone, and every
//! event is appended to the journal *before* it is applied. One step performs one effect: a
//! model call, or one batch of tool calls. Decisions (transitions, the closing event) are
//! written outside steps, in the run's root span. Because nothing lives only in memory, a run
//! can be driven again from its journal at any point.
//!
//! **Model calls are resilient.** A model step tries the slot's chain ([`AgentRuntime::main`]
//! then [`AgentRuntime::fallbacks`], starting from the model the run last switched to): each
//! call is streamed under the model's [`ModelTimeouts`], retryable errors are tried again per
//! its [`RetryPolicy`] (`model.retried`, written before the delay), exhausted retries, quota
//! and context overflow move on to the next model (`model.fell_back`), and the engine's
//! [`Breakers`] skip a model that keeps failing (`circuit.opened`, then `model.fell_back`
//! with reason `circuit_open`). Only the answer of the attempt that succeeded is journaled,
//! priced with the model that gave it.
//!
//! **Layout.** The loop is a dispatcher (`driver.rs`) over its points, each a module given only
//! what it reads: the decisions (`decide.rs`), the model step (`model_step.rs`), the review of
//! an answer and the final output's guards (`review.rs`, `judging.rs`), the tool batch
//! (`tools/`), and the fidelity guard of compaction summaries (`fidelity.rs`, used by
//! `compaction.rs`). They act on the run through `io.rs` (events written and applied, lease,
//! cancellation, timeout). No module names the driver and the modules import each other in no
//! circle (checked by `xtask/tests/tidy.rs`); this file only declares modules and re-exports.
//!
//! **Architecture invariant:** the engine depends on `loom-core` only. It reaches storage,
//! models, tools and the wall clock through the ports it is given (`Arc<dyn EventStore>`,
//! `Arc<dyn ModelClient>`, `Arc<dyn Tool>`, `Arc<dyn Clock>`); it reads no environment
//! variable and no configuration file.

mod agent;
pub mod attachments;
mod binding;
pub mod budget;
mod cancel;
mod chain;
mod commands;
pub mod compaction;
mod context;
pub mod contract;
mod decide;
mod driver;
mod engine;
mod error;
mod events;
pub mod fidelity;
mod hooks;
mod ids;
mod io;
mod judges;
mod judging;
pub mod media;
mod model_step;
mod names;
mod observer;
mod offer;
mod offload;
mod output;
mod ownership;
pub mod replay;
mod request;
mod resilience;
mod review;
mod role_guards;
pub mod roles;
mod session_state;
mod snapshot;
mod stop;
mod subagents;
mod tools;
mod tree;
mod units;
mod window;
mod writer;

pub use agent::{
    AgentRuntime, ApprovalSettings, DEFAULT_APPROVAL_EXPIRY, DEFAULT_TOOL_TIMEOUT, SubAgentRuntime,
};
pub use attachments::{
    Attachment, AttachmentLimits, IMAGE_TYPES, media_type_of_name, sniff_media_type,
};
pub use binding::{
    BoundPolicy, BoundSource, BoundTool, DEFAULT_POLICY_TIMEOUT, ModelBinding, PolicyOnError,
};
pub use budget::{BudgetLimits, OnExceed, RunLimits, SessionLimits};
pub use cancel::Cancel;
pub use commands::BeginRun;
pub use compaction::{COMPACTION_AGENT, COMPACTION_SYSTEM, Compaction, Compactor};
pub use context::{ContextScope, RoleContext};
pub use engine::{DEFAULT_LEASE, DEFAULT_SNAPSHOT_EVERY, Engine};
pub use error::EngineError;
pub use events::RunRef;
pub use ids::Ids;
pub use judges::{
    Criterion, JUDGE_SYSTEM, JudgeCondition, JudgeContext, JudgeInput, JudgeMode, JudgeRuntime,
    JudgeWhen, VERDICT_TOOL, parse_verdict, sample_point, sampled,
};
pub use media::{Image, TOOL_OUTPUT_ORIGIN, ToolFile};
pub use observer::Observer;
pub use offload::artifact_read as artifact_reader;
pub use request::request_hash;
pub use resilience::{Breakers, CircuitSettings, ModelTimeouts, RetryPolicy};
pub use roles::{REFS_HINT, RoleRuntime};
pub use session_state::{
    STATE_HINT, STATE_TAG, StateFrom, StateKeySpec, StateSpec, StateValue, StateView,
};
pub use stop::StopSignal;
pub use subagents::AGENT_HINT;
pub use tools::{UNKNOWN_REASON, UNKNOWN_STATE, idempotency_key, traceparent};
pub use tree::{descendant_approvals, open_descendants};
