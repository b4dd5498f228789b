//! The event envelope and its payloads: the only facts Loom persists.
//!
//! The layout follows the reference journal byte for byte in field order: the envelope
//! (`event_id, ts, schema_version, tenant_id, session_id, run_id, root_run_id, span_id,
//! parent_span_id, type, category, status, agent, role, facets, payload, seq`) and each payload
//! with `type` first. `type`, `category`, `status` and `facets` are *derived* from the payload;
//! [`Event::from_json`] recomputes them and refuses an event whose envelope contradicts its
//! payload. Readers ignore unknown fields, so adding an optional field never breaks old readers.

mod durability;
mod envelope;
mod facets;
mod guard;
mod model;
mod payload;
mod read_error;
mod run;
mod sealed;
mod session;
mod tool;

pub use durability::{SYNCED_TYPES, must_sync};
pub use envelope::{Envelope, Event};
pub use guard::{
    ApprovalExpired, ApprovalGranted, ApprovalRejected, ApprovalRequested, BudgetExceeded,
    CriterionScore, GuardChecked, JudgeEvaluated, PolicyDecided,
};
pub use model::{ModelExchanged, ModelFellBack, ModelResponded, ModelRetried};
pub use payload::Payload;
pub use read_error::EventReadError;
pub use run::{
    Effect, MessageUser, Outcome, RunBudget, RunCancelled, RunClaimed, RunCompleted, RunContext,
    RunFailed, RunStarted, RunTransitioned, StepCompleted, StepStarted,
};
pub use sealed::SealedPayload;
pub use session::{
    ArtifactStored, SessionCompacted, SessionRepaired, SessionSnapshot, SessionSpent,
    SessionTrimmed, SnapshotTurn,
};
pub use tool::{
    CircuitOpened, IdempotencyRecorded, IdempotencyReused, OfferedTool, ToolCalled, ToolCompleted,
    ToolSourceOpened, ToolSourceUnavailable,
};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The schema version Loom writes and reads.
pub const SCHEMA_VERSION: u32 = 1;

/// The family of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Run life cycle.
    Run,
    /// Messages.
    Message,
    /// Model calls.
    Model,
    /// Tool calls.
    Tool,
    /// Contracts and judges.
    Guard,
    /// Policy decisions and budgets.
    Policy,
    /// Human approvals.
    Approval,
    /// Idempotency records.
    Idempotency,
    /// Stored files.
    Artifact,
    /// Session maintenance.
    Session,
    /// Circuit breakers.
    Circuit,
}

/// The health of an event, derived from its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventStatus {
    /// Nothing to report.
    Ok,
    /// Worth a look.
    Warning,
    /// Something failed.
    Error,
}

/// Writes a timestamp as RFC 3339 with microseconds; refuses one outside the years 0000–9999,
/// which RFC 3339 cannot write with four digits and `de_ts` would not read back.
fn ser_ts<S: Serializer>(ts: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    use chrono::Datelike;
    if !(0..=9999).contains(&ts.year()) {
        return Err(serde::ser::Error::custom(format!(
            "the timestamp {ts:?} is outside the years 0000-9999"
        )));
    }
    s.serialize_str(&ts.to_rfc3339_opts(SecondsFormat::Micros, true))
}

fn de_ts<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
    let text = String::deserialize(d)?;
    DateTime::parse_from_rfc3339(&text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(serde::de::Error::custom)
}

fn ser_opt_ts<S: Serializer>(ts: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
    match ts {
        Some(ts) => ser_ts(ts, s),
        None => s.serialize_none(),
    }
}

fn de_opt_ts<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
    match Option::<String>::deserialize(d)? {
        Some(text) => DateTime::parse_from_rfc3339(&text)
            .map(|t| Some(t.with_timezone(&Utc)))
            .map_err(serde::de::Error::custom),
        None => Ok(None),
    }
}

/// A line of the reference journal (`plain-run.jsonl`), read by the tests of the submodules.
#[cfg(test)]
const LINE: &str = r#"{"event_id":"01a2272b-2a5d-7c60-ae0f-8690fd14d194","ts":"2026-11-29T11:57:50.044443Z","schema_version":1,"tenant_id":"default","session_id":"plain-run-1","run_id":"plain-run-1","root_run_id":"plain-run-1","span_id":"01a2272b-2a58-7207-9988-3ca389305581","parent_span_id":"01a2272b-2a56-7cc7-a088-a8f4c887158b","type":"tool.completed","category":"tool","status":"ok","agent":"demo","role":null,"facets":{"tool_name":"calculer","latency_ms":0.351611999974466,"size":164,"is_error":false},"payload":{"type":"tool.completed","call_id":"fake_0_0","tool_name":"calculer","output":{"blocks":[{"cache_breakpoint":false,"provider_meta":{},"type":"text","text":"87"}],"data":null,"is_error":false,"artifacts":[],"offloaded":null,"unverified":false},"latency_ms":0.351611999974466,"size":164,"usage":null,"cost_usd":0.0},"seq":10}"#;
