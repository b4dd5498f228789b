//! # Loom
//!
//! Run AI agents whose every fact is journaled.
//!
//! A user describes an agent (its model, its tools, its rules) in `loom.yaml` and
//! `agents/*.yaml`, registers the Rust tools it uses, and runs it. Every fact of the run
//! (message, model call, tool call, decision, cost) is appended to the journal *before* it is
//! applied; run state, conversation, costs and traces are projections of that journal.
//!
//! ```no_run
//! use loom_ia::{Loom, RunOptions};
//!
//! /// Calcule le prix TTC à partir d'un montant HT et d'un taux de TVA en pourcentage.
//! #[loom_ia::tool]
//! fn prix_ttc(montant_ht: f64, taux_tva: f64) -> String {
//!     format!("{:.2} € TTC", montant_ht * (1.0 + taux_tva / 100.0))
//! }
//!
//! # async fn demo() -> Result<(), loom_ia::LoomError> {
//! let loom = Loom::from_config("loom.yaml")?;
//! loom.register("prix_ttc", prix_ttc_tool())?;
//! let result = loom.run("devis", "Prix TTC de 1 250 € HT à 10 % ?", RunOptions::default()).await?;
//! println!("{} ({})", result.text, result.status);
//! # Ok(()) }
//! ```
//!
//! Rust tools are registered in code with [`Loom::register`]; the Python reference's
//! `imports:` key has no equivalent (Rust has no runtime import), and an agent naming a tool
//! that is not registered is refused with the file, line and key of the reference.
//!
//! **Architecture invariant:** this facade is the only crate that knows every concrete
//! adapter; it picks them from the configuration and Cargo features. Access crates (the CLI)
//! depend on it and on nothing below it.

mod appended;
pub mod budget;
mod bus;
mod clock;
pub mod compaction;
mod counters;
mod counting;
mod env;
mod error;
pub mod eval;
pub mod follow;
mod forge_source;
mod journals;
mod limits;
mod loom;
#[cfg(feature = "mcp")]
mod mcp;
mod notify;
mod postgres;
mod progress;
mod queue;

#[cfg(feature = "openapi")]
mod openapi_source;
pub mod query;
pub mod query_string;
pub mod quota;
mod recovery;
pub mod redact;
mod repair;
mod resolve;
mod result;
mod retention;
mod routing;
mod sealing;
mod secrets;
mod session_state;
mod sessions;
mod sources;
mod telemetry;
pub mod testing;
mod tool_sources;
mod trigger;

pub use budget::{Period, TenantBudget};
pub use clock::SystemClock;
pub use error::{LIMITS_RETRY_AFTER, LoomError};
pub use loom::{
    DEFAULT_TENANT, Decided, Loom, RunOptions, StreamItem, ValidatedAgent, ValidatedSource,
    ValidatedTenant, Validation,
};
pub use loom_config::{self as config, Config, ConfigError, Profile};
pub use loom_core::{
    self as core, Event, Message, RunState, RunStatus, Usage,
    approval::{Approver, Decision, PendingApproval},
    policy,
    ports::{SourceContext, SourceError, ToolSource},
    tool::{FnTool, IntoToolOutput, Json, Tool, ToolContext, ToolError, ToolOutput, Views},
};
pub use loom_engine::{
    Attachment, AttachmentLimits, COMPACTION_AGENT, Image, JudgeCondition, JudgeInput, JudgeMode,
    Observer, RunRef, ToolFile,
    replay::{Divergence, Miss, ReplayCounts, VariantCounts},
};
pub use loom_macros::tool;
pub use tool_sources::{
    FixedSource, SourceFactory, SourceFactoryError, SourceRequest, SourceSecrets,
};
pub mod report;
/// The sandbox runner behind `loom sandbox serve` and its client (feature `remote-sandbox`):
/// the [`Sandbox`](loom_core::sandbox::Sandbox) contract over HTTP.
#[cfg(feature = "remote-sandbox")]
pub mod sandbox_runner {
    pub use loom_core::sandbox::Limits;
    pub use loom_sandbox::remote::{RemoteSandbox, router, serve};
}
pub use compaction::CompactionNote;
pub use follow::FollowOptions;
pub use loom::{
    EVAL_APPROVER, EvalOptions, LIVE_BUFFER, LiveDelta, Readiness, ReadinessCheck, ReplayReport,
    Residents, RunSide, VariantOptions, VariantReport, WorkOptions,
};
pub use postgres::storage_sql;
pub use progress::progress_line;
pub use query::{EventQuery, RunListed, RunPage, RunQuery};
pub use query_string::QueryString;
pub use recovery::{LeaseWatch, MAX_SWEEP_PERIOD, MIN_SWEEP_PERIOD, sweep_period};
pub use redact::Redact;
pub use repair::{BadLine, SessionRepair, ValidExport};
pub use report::{RunUsage, Span, SpanEvent, SpanKind, SpanStatus, Trace, UsageLine, UsageReport};
pub use result::{CriterionVerdict, JudgeVerdict, RunArtifact, RunResult, SkippedJudge};
pub use retention::{RetentionReport, RetentionSession, RetentionTenant};
pub use sessions::{
    FILE_ORIGINS, SessionDeletion, SessionFile, SessionInfo, SessionListed, SessionRun,
};
pub use trigger::Triggered;

#[doc(hidden)]
pub mod __private {
    //! Paths used by the code `#[tool]` generates. Not a public API.
    pub use loom_core::BoxFuture;
    pub use loom_core::tool::{
        Approval, BusinessKey, FnTool, IntoToolOutput, Json, OnUnknown, SideEffects, ToolContext,
        ToolDeclarations, ToolError, ToolKind, ToolOutput, ToolSpec, schema_description,
        schema_for,
    };
    pub use schemars;
    pub use serde;
    pub use serde_json;

    /// Runs a synchronous tool function on the blocking thread pool.
    pub async fn run_blocking<T: Send + 'static>(
        function: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ToolError> {
        tokio::task::spawn_blocking(function)
            .await
            .map_err(|error| ToolError::new(format!("the tool stopped abnormally: {error}")))
    }
}
