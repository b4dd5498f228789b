//! The event envelope and its payloads: the only facts Loom persists.
//!
//! The layout follows the reference journal byte for byte in field order: the envelope
//! (`event_id, ts, schema_version, tenant_id, session_id, run_id, root_run_id, span_id,
//! parent_span_id, type, category, status, agent, role, facets, payload, seq`) and each payload
//! with `type` first. `type`, `category`, `status` and `facets` are *derived* from the payload;
//! [`Event::from_json`] recomputes them and refuses an event whose envelope contradicts its
//! payload. Readers ignore unknown fields, so adding an optional field never breaks old readers.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value, json};

use crate::{
    content::Message,
    model::HttpExchange,
    state::RunStatus,
    tool::{ToolKind, ToolOutput},
    usage::Usage,
};

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

/// A journaled fact.
///
/// Its JSON Schema (`schemars`) describes the envelope; the payload is described as an object
/// whose `type` is the event type (the schema of each payload type is not part of it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Event {
    /// UUIDv7, chosen when the event is built.
    pub event_id: String,
    /// When it was built (UTC, microseconds).
    #[serde(serialize_with = "ser_ts", deserialize_with = "de_ts")]
    pub ts: DateTime<Utc>,
    /// Always [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Tenant.
    pub tenant_id: String,
    /// Session (equal to `run_id` for a run without session).
    pub session_id: String,
    /// Run.
    pub run_id: String,
    /// Root of the run tree.
    pub root_run_id: String,
    /// Span of the event.
    pub span_id: String,
    /// Parent span.
    pub parent_span_id: Option<String>,
    /// Payload type string (derived).
    #[serde(rename = "type")]
    pub event_type: String,
    /// Category (derived).
    pub category: Category,
    /// Status (derived).
    pub status: EventStatus,
    /// Agent running.
    pub agent: Option<String>,
    /// Model slot (`main`, a role name, `judge:<n>`) for model events.
    pub role: Option<String>,
    /// Scalar summary of the payload (derived), for queries and traces.
    pub facets: Map<String, Value>,
    /// What happened. On disk, a payload sealed at rest (`storage.encryption`) is
    /// `{"sealed", "key_id"}` without a `type` ([`Payload::Sealed`]); every other payload carries
    /// its `type`.
    #[schemars(schema_with = "payload_schema")]
    #[serde(serialize_with = "ser_payload", deserialize_with = "de_payload")]
    pub payload: Payload,
    /// Position in the session journal, from 1, assigned by the store (0 until appended).
    #[serde(default)]
    pub seq: u64,
}

/// Where an event sits: everything in the envelope that is not derived from the payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// Event id.
    pub event_id: String,
    /// Timestamp.
    pub ts: DateTime<Utc>,
    /// Tenant.
    pub tenant_id: String,
    /// Session.
    pub session_id: String,
    /// Run.
    pub run_id: String,
    /// Root run.
    pub root_run_id: String,
    /// Span.
    pub span_id: String,
    /// Parent span.
    pub parent_span_id: Option<String>,
    /// Agent.
    pub agent: Option<String>,
    /// Role.
    pub role: Option<String>,
}

/// A journal line that cannot be accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EventReadError {
    /// Not an event at all.
    #[error("unreadable event: {0}")]
    Json(String),
    /// A schema version this build does not read.
    #[error(
        "event {event_id}: unsupported event schema version {found} (expected {SCHEMA_VERSION})"
    )]
    Version {
        /// The event.
        event_id: String,
        /// The version found.
        found: u32,
    },
    /// The envelope contradicts the payload.
    #[error("event {event_id} (seq {seq}): field '{field}' contradicts the payload")]
    Inconsistent {
        /// The event.
        event_id: String,
        /// Its seq.
        seq: u64,
        /// The contradicting field.
        field: &'static str,
    },
    /// The payload breaks an invariant.
    #[error("event {event_id} (seq {seq}): {reason}")]
    Invalid {
        /// The event.
        event_id: String,
        /// Its seq.
        seq: u64,
        /// What is wrong.
        reason: String,
    },
}

impl Event {
    /// Builds an event from its envelope and payload, deriving type, category, status and facets.
    pub fn new(envelope: Envelope, payload: Payload) -> Event {
        Event {
            event_id: envelope.event_id,
            ts: envelope.ts,
            schema_version: SCHEMA_VERSION,
            tenant_id: envelope.tenant_id,
            session_id: envelope.session_id,
            run_id: envelope.run_id,
            root_run_id: envelope.root_run_id,
            span_id: envelope.span_id,
            parent_span_id: envelope.parent_span_id,
            event_type: payload.type_name().to_owned(),
            category: payload.category(),
            status: payload.status(),
            agent: envelope.agent,
            role: envelope.role,
            facets: payload.facets(),
            payload,
            seq: 0,
        }
    }

    /// Parses one journal line and checks it: schema version, derived fields, invariants.
    pub fn from_json(line: &str) -> Result<Event, EventReadError> {
        let event: Event = serde_json::from_str(line).map_err(|e| {
            let id = serde_json::from_str::<Value>(line)
                .ok()
                .and_then(|v| v.get("event_id").and_then(Value::as_str).map(str::to_owned));
            match id {
                Some(id) => EventReadError::Json(format!("event {id}: {e}")),
                None => EventReadError::Json(e.to_string()),
            }
        })?;
        event.check()?;
        Ok(event)
    }

    /// Checks the derived fields and the payload invariants.
    ///
    /// A sealed payload ([`Payload::Sealed`]) cannot be compared with its envelope: only its
    /// shape is checked here, and the whole event once it is opened (the envelope's derived
    /// fields must then match the clear payload).
    pub fn check(&self) -> Result<(), EventReadError> {
        if self.schema_version != SCHEMA_VERSION {
            return Err(EventReadError::Version {
                event_id: self.event_id.clone(),
                found: self.schema_version,
            });
        }
        if let Payload::Sealed(sealed) = &self.payload {
            return sealed.check().map_err(|reason| EventReadError::Invalid {
                event_id: self.event_id.clone(),
                seq: self.seq,
                reason,
            });
        }
        let inconsistent = |field| EventReadError::Inconsistent {
            event_id: self.event_id.clone(),
            seq: self.seq,
            field,
        };
        if self.event_type != self.payload.type_name() {
            return Err(inconsistent("type"));
        }
        if self.category != self.payload.category() {
            return Err(inconsistent("category"));
        }
        if self.status != self.payload.status() {
            return Err(inconsistent("status"));
        }
        if self.facets != self.payload.facets() {
            return Err(inconsistent("facets"));
        }
        if let Err(reason) = self.payload.check() {
            return Err(EventReadError::Invalid {
                event_id: self.event_id.clone(),
                seq: self.seq,
                reason,
            });
        }
        Ok(())
    }

    /// The event as one compact JSON line (without the newline).
    pub fn to_json(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The schema of [`Event::payload`]: an object whose `type` is the event type, with the fields
/// of that type.
fn payload_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "description": "What happened: the fields of the event type named by `type` (the same as the envelope's).",
        "properties": {"type": {"type": "string"}},
        "required": ["type"],
    })
}

/// A payload as written: a sealed one is `{"sealed", "key_id"}`, any other its tagged form.
fn ser_payload<S: Serializer>(payload: &Payload, s: S) -> Result<S::Ok, S::Error> {
    match payload {
        Payload::Sealed(sealed) => sealed.serialize(s),
        clear => clear.serialize(s),
    }
}

/// A payload as read: an object with `sealed` and without `type` is a sealed payload, anything
/// else a tagged payload.
///
/// The first key decides the path, so the common case costs what the derived reader costs: a
/// payload whose first key is `type` (as Loom and the reference write it) is handed whole to
/// the derived reader, its `type` replayed ([`TypeFirst`]); any other is gathered first, then
/// read by the rule above (a sealed payload is two short strings).
fn de_payload<'de, D: Deserializer<'de>>(d: D) -> Result<Payload, D::Error> {
    d.deserialize_map(PayloadVisitor)
}

struct PayloadVisitor;

impl<'de> serde::de::Visitor<'de> for PayloadVisitor {
    type Value = Payload;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a payload object (with its `type`, or sealed)")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Payload, A::Error> {
        let Some(first) = map.next_key::<String>()? else {
            return Payload::deserialize(Value::Object(Map::new()))
                .map_err(serde::de::Error::custom);
        };
        if first == "type" {
            let tag: String = map.next_value()?;
            return Payload::deserialize(serde::de::value::MapAccessDeserializer::new(TypeFirst {
                tag: Some(tag),
                key_given: false,
                rest: map,
            }));
        }
        let mut object = Map::new();
        let value: Value = map.next_value()?;
        object.insert(first, value);
        while let Some((key, value)) = map.next_entry::<String, Value>()? {
            object.insert(key, value);
        }
        if object.contains_key("sealed") && !object.contains_key("type") {
            SealedPayload::deserialize(Value::Object(object))
                .map(Payload::Sealed)
                .map_err(serde::de::Error::custom)
        } else {
            Payload::deserialize(Value::Object(object)).map_err(serde::de::Error::custom)
        }
    }
}

/// The entries of a payload object whose `type` (its first key) was already read: `type` and
/// its value replayed, then the rest of the object as it comes.
struct TypeFirst<M> {
    tag: Option<String>,
    key_given: bool,
    rest: M,
}

impl<'de, M: serde::de::MapAccess<'de>> serde::de::MapAccess<'de> for TypeFirst<M> {
    type Error = M::Error;

    fn next_key_seed<K: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, M::Error> {
        if self.tag.is_some() && !self.key_given {
            self.key_given = true;
            return seed
                .deserialize(serde::de::value::StrDeserializer::<M::Error>::new("type"))
                .map(Some);
        }
        self.rest.next_key_seed(seed)
    }

    fn next_value_seed<V: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, M::Error> {
        match self.tag.take() {
            Some(tag) => {
                seed.deserialize(serde::de::value::StringDeserializer::<M::Error>::new(tag))
            }
            None => self.rest.next_value_seed(seed),
        }
    }
}

/// A payload sealed at rest (`storage.encryption`, reference §9): AES-256-GCM of the clear
/// payload's JSON with one of the tenant's keys, bound to its envelope.
///
/// Only journals hold it: the sealing journal (`loom-crypto`) opens every sealed payload before
/// an event leaves it, so no reader, projection or engine code is ever handed one (the
/// projection refuses it, [`crate::state::RunState::apply`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealedPayload {
    /// Base64 (standard, padded) of the 12-byte nonce followed by the ciphertext and its tag.
    pub sealed: String,
    /// The first 12 hex digits of `sha256("loom.key.v1" + key)`: which key sealed it.
    pub key_id: String,
}

impl SealedPayload {
    /// The length of a key id, in hex digits.
    pub const KEY_ID_LEN: usize = 12;

    /// Refuses what cannot be a sealed payload: an empty seal, a key id that is not 12
    /// lowercase hex digits.
    pub fn check(&self) -> Result<(), String> {
        let hex = self.key_id.len() == Self::KEY_ID_LEN
            && self
                .key_id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hex {
            return Err(format!(
                "sealed payload with an ill-formed key_id {:?} (expected 12 hex digits)",
                self.key_id
            ));
        }
        if self.sealed.is_empty() {
            return Err("sealed payload without its ciphertext".into());
        }
        Ok(())
    }
}

fn ser_ts<S: Serializer>(ts: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
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

/// The payloads, discriminated by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
#[allow(clippy::large_enum_variant)]
pub enum Payload {
    /// A run begins.
    #[serde(rename = "run.started")]
    RunStarted(RunStarted),
    /// A step (one effect) begins.
    #[serde(rename = "step.started")]
    StepStarted(StepStarted),
    /// A step ends.
    #[serde(rename = "step.completed")]
    StepCompleted(StepCompleted),
    /// The run changes state.
    #[serde(rename = "run.transitioned")]
    RunTransitioned(RunTransitioned),
    /// The run completed.
    #[serde(rename = "run.completed")]
    RunCompleted(RunCompleted),
    /// The run failed.
    #[serde(rename = "run.failed")]
    RunFailed(RunFailed),
    /// The run was cancelled.
    #[serde(rename = "run.cancelled")]
    RunCancelled(RunCancelled),
    /// A worker holds the run.
    #[serde(rename = "run.claimed")]
    RunClaimed(RunClaimed),
    /// A user message.
    #[serde(rename = "message.user")]
    MessageUser(MessageUser),
    /// A model answered.
    #[serde(rename = "model.responded")]
    ModelResponded(ModelResponded),
    /// A tool call was launched.
    #[serde(rename = "tool.called")]
    ToolCalled(ToolCalled),
    /// A tool call ended (or was refused before launch).
    #[serde(rename = "tool.completed")]
    ToolCompleted(ToolCompleted),
    /// A tool source (an MCP server) could not be reached for the run.
    #[serde(rename = "tool.source_unavailable")]
    ToolSourceUnavailable(ToolSourceUnavailable),
    /// A circuit breaker opened.
    #[serde(rename = "circuit.opened")]
    CircuitOpened(CircuitOpened),
    /// A file was stored beside the journal.
    #[serde(rename = "artifact.stored")]
    ArtifactStored(ArtifactStored),
    /// A model call failed and will be tried again (or a billed final failure).
    #[serde(rename = "model.retried")]
    ModelRetried(ModelRetried),
    /// A slot switched to its next model.
    #[serde(rename = "model.fell_back")]
    ModelFellBack(ModelFellBack),
    /// The raw HTTP exchange of one model attempt (opt-in capture).
    #[serde(rename = "model.exchanged")]
    ModelExchanged(ModelExchanged),
    /// A call waits for a human decision.
    #[serde(rename = "approval.requested")]
    ApprovalRequested(ApprovalRequested),
    /// A human (or an inline approver) let a call run.
    #[serde(rename = "approval.granted")]
    ApprovalGranted(ApprovalGranted),
    /// A human (or an inline approver) refused a call.
    #[serde(rename = "approval.rejected")]
    ApprovalRejected(ApprovalRejected),
    /// A request passed its deadline without a decision.
    #[serde(rename = "approval.expired")]
    ApprovalExpired(ApprovalExpired),
    /// The result of a call with a business key was recorded in the idempotency store.
    #[serde(rename = "idempotency.recorded")]
    IdempotencyRecorded(IdempotencyRecorded),
    /// A call with a business key already completed was not run: its recorded result was reused.
    #[serde(rename = "idempotency.reused")]
    IdempotencyReused(IdempotencyReused),
    /// A policy decided something other than "continue" (or failed).
    #[serde(rename = "policy.decided")]
    PolicyDecided(PolicyDecided),
    /// A contract or a judge checked an output.
    #[serde(rename = "guard.checked")]
    GuardChecked(GuardChecked),
    /// A judge scored an output.
    #[serde(rename = "judge.evaluated")]
    JudgeEvaluated(JudgeEvaluated),
    /// A run or session budget was reached.
    #[serde(rename = "budget.exceeded")]
    BudgetExceeded(BudgetExceeded),
    /// An unreadable line of the journal was set aside, and this event took its place.
    #[serde(rename = "session.repaired")]
    SessionRepaired(SessionRepaired),
    /// A payload sealed at rest, as a journal holds it (`{"sealed", "key_id"}`, no `type`):
    /// opened by the sealing journal before the event reaches anyone else (see
    /// [`SealedPayload`]). Its `type_name` is `sealed`; the event's envelope keeps the clear
    /// payload's type, category, status and facets.
    #[serde(skip)]
    Sealed(SealedPayload),
}

/// Who the run is for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunContext {
    /// Tenant.
    pub tenant_id: String,
    /// End user, if known.
    #[serde(default)]
    pub user_id: Option<String>,
    /// Caller metadata.
    #[serde(default)]
    pub metadata: Map<String, Value>,
}

/// Limits of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunBudget {
    /// Dollars.
    #[serde(default)]
    pub max_cost: Option<f64>,
    /// Tokens.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Model calls.
    #[serde(default)]
    pub max_calls: Option<u64>,
}

/// `run.started`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStarted {
    /// "normal" or "compaction".
    pub kind: String,
    /// Who the run is for.
    pub context: RunContext,
    /// Parent run of a sub-agent run.
    #[serde(default)]
    pub parent_run_id: Option<String>,
    /// Call of the parent that opened it.
    #[serde(default)]
    pub parent_call_id: Option<String>,
    /// Depth in the run tree.
    #[serde(default)]
    pub depth: u32,
    /// Who triggered it.
    #[serde(default)]
    pub triggered_by: Option<String>,
    /// Trigger name.
    #[serde(default)]
    pub trigger: Option<String>,
    /// "auto", "force" or "skip".
    #[serde(default = "auto")]
    pub judges: String,
    /// Run budget.
    #[serde(default)]
    pub budget: Option<RunBudget>,
    /// Session state written by the application.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub state: Map<String, Value>,
}

fn auto() -> String {
    "auto".into()
}

/// What a step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// One model call.
    ModelCall,
    /// One batch of tool calls.
    ToolBatch,
    /// The last answer, without tools.
    Finalize,
    /// Waiting for a child run.
    WaitChild,
}

impl Effect {
    /// Journal string.
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::ModelCall => "model_call",
            Effect::ToolBatch => "tool_batch",
            Effect::Finalize => "finalize",
            Effect::WaitChild => "wait_child",
        }
    }
}

/// `step.started`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepStarted {
    /// Step number, from 1.
    pub step_no: u32,
    /// State the step starts from.
    pub state: RunStatus,
    /// What it does.
    pub effect: Effect,
}

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Fine.
    Ok,
    /// Failed.
    Error,
    /// Cancelled.
    Cancelled,
}

/// `step.completed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepCompleted {
    /// Step number.
    pub step_no: u32,
    /// Duration in milliseconds.
    pub duration_ms: f64,
    /// Events written inside the step.
    #[serde(default)]
    pub events_emitted: u32,
    /// How it ended.
    pub outcome: Outcome,
}

/// `run.transitioned`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunTransitioned {
    /// Previous state.
    pub from_state: RunStatus,
    /// New state.
    pub to_state: RunStatus,
    /// Step after which it happens.
    #[serde(default)]
    pub step_no: u32,
    /// Event type or reason that caused it.
    pub cause_type: String,
    /// Event that caused it.
    #[serde(default)]
    pub cause_event_id: Option<String>,
}

/// `run.completed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunCompleted {
    /// Final answer (null when a terminal tool result is the answer).
    pub output: Option<Message>,
    /// The `tool.completed` whose result is the answer.
    #[serde(default)]
    pub output_event_id: Option<String>,
    /// Orchestrator model calls.
    pub iterations: u32,
    /// Usage of the whole run.
    pub usage: Usage,
    /// Cost in dollars.
    pub cost_usd: f64,
    /// Structured answer.
    #[serde(default)]
    pub data: Option<Value>,
    /// Kept despite its contract or judge.
    #[serde(default)]
    pub unverified: bool,
    /// Replaced by a fallback message.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fallback: bool,
}

/// `run.failed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunFailed {
    /// Classification ("timeout", "model.auth", …).
    pub error_type: String,
    /// Message.
    pub error: String,
    /// Orchestrator model calls.
    pub iterations: u32,
    /// Usage.
    pub usage: Usage,
    /// Cost.
    pub cost_usd: f64,
}

/// `run.cancelled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunCancelled {
    /// "requested" or "parent".
    pub reason: String,
    /// Who cancelled.
    #[serde(default)]
    pub by: Option<String>,
    /// Orchestrator model calls.
    pub iterations: u32,
    /// Usage.
    pub usage: Usage,
    /// Cost.
    pub cost_usd: f64,
    /// Open approvals withdrawn.
    #[serde(default)]
    pub withdrawn: Vec<String>,
}

/// `run.claimed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunClaimed {
    /// The worker.
    pub worker_id: String,
    /// End of the lease.
    #[serde(serialize_with = "ser_ts", deserialize_with = "de_ts")]
    pub lease_until: DateTime<Utc>,
}

/// `message.user`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageUser {
    /// The message.
    pub message: Message,
    /// "request" or "repair".
    #[serde(default = "request")]
    pub kind: String,
    /// Policy behind a repair.
    #[serde(default)]
    pub policy: Option<String>,
    /// Whether tools stay offered.
    #[serde(default = "yes")]
    pub tools: bool,
}

fn request() -> String {
    "request".into()
}

fn yes() -> bool {
    true
}

/// `model.responded`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelResponded {
    /// Provider model name.
    pub model_id: String,
    /// Config model id.
    #[serde(default)]
    pub model: Option<String>,
    /// Provider.
    pub provider: String,
    /// The answer.
    pub message: Message,
    /// Tokens.
    pub usage: Usage,
    /// Cost.
    pub cost_usd: f64,
    /// Why it stopped.
    pub stop_reason: crate::model::StopReason,
    /// Latency.
    pub latency_ms: f64,
    /// Attempts made.
    #[serde(default = "one")]
    pub attempts: u32,
    /// SHA-256 of the canonical request.
    #[serde(default)]
    pub request_hash: Option<String>,
    /// Per-part hashes of the request.
    #[serde(default)]
    pub request_parts: Map<String, Value>,
    /// Role call this answers.
    #[serde(default)]
    pub call_id: Option<String>,
    /// Judge this answers.
    #[serde(default)]
    pub judge: Option<String>,
}

fn one() -> u32 {
    1
}

/// `tool.called`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCalled {
    /// Call id.
    pub call_id: String,
    /// Tool.
    pub tool_name: String,
    /// Tool family.
    pub tool_kind: ToolKind,
    /// Arguments as written by the model.
    pub arguments: Value,
    /// `$ref`s resolved.
    #[serde(default)]
    pub refs: Vec<Value>,
    /// Relaunched on resume.
    #[serde(default)]
    pub resumed: bool,
    /// Child run of a sub-agent call.
    #[serde(default)]
    pub child_run_id: Option<String>,
}

/// `tool.completed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCompleted {
    /// Call id.
    pub call_id: String,
    /// Tool.
    pub tool_name: String,
    /// Result.
    pub output: ToolOutput,
    /// Latency.
    pub latency_ms: f64,
    /// Bytes of the output's JSON.
    pub size: u64,
    /// Usage of a sub-agent.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Cost of a sub-agent or role.
    #[serde(default)]
    pub cost_usd: f64,
}

/// `tool.source_unavailable`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSourceUnavailable {
    /// The source (MCP server name or alias).
    pub source: String,
    /// Why.
    pub error: String,
    /// Whether the agent requires it (the run then fails).
    #[serde(default)]
    pub required: bool,
}

/// `circuit.opened`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CircuitOpened {
    /// "model" or "mcp".
    pub target_kind: String,
    /// The model id or server name.
    pub target: String,
    /// Consecutive failures that opened it.
    pub failures: u32,
    /// How long it stays open.
    pub cooldown_s: f64,
    /// The last error.
    #[serde(default)]
    pub error: Option<String>,
    /// Role call involved.
    #[serde(default)]
    pub call_id: Option<String>,
    /// Judge involved.
    #[serde(default)]
    pub judge: Option<String>,
}

/// `artifact.stored`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArtifactStored {
    /// `artifact://<tenant>/<session>/<sha256>.<ext>`.
    pub uri: String,
    /// MIME type.
    pub media_type: String,
    /// Bytes.
    pub size: u64,
    /// Display name.
    #[serde(default)]
    pub name: Option<String>,
    /// "attachment", "tool_output" or "offload".
    pub origin: String,
    /// The call that produced it.
    #[serde(default)]
    pub call_id: Option<String>,
}

/// `model.retried`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRetried {
    /// Provider model name.
    pub model_id: String,
    /// Config model id.
    #[serde(default)]
    pub model: Option<String>,
    /// Provider.
    pub provider: String,
    /// The attempt that failed, from 1.
    pub attempt: u32,
    /// The error kind (`transient`, `overloaded`, …).
    pub error_kind: String,
    /// The error message.
    pub error: String,
    /// HTTP status, when there was one.
    #[serde(default)]
    pub http_status: Option<u16>,
    /// Seconds waited before the next attempt (0 for a final, billed failure).
    pub delay_s: f64,
    /// Role call involved.
    #[serde(default)]
    pub call_id: Option<String>,
    /// Judge involved.
    #[serde(default)]
    pub judge: Option<String>,
    /// Tokens billed by the failed attempt, when known.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Their cost.
    #[serde(default)]
    pub cost_usd: f64,
    /// Whether no attempt follows.
    #[serde(default)]
    pub r#final: bool,
}

/// `model.fell_back`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelFellBack {
    /// `main`, a role name or `judge:<name>`.
    pub slot: String,
    /// Config id of the model left.
    pub from_model: String,
    /// Config id of the model used from now on.
    pub to_model: String,
    /// The error kind, or "circuit_open".
    pub reason: String,
    /// The error message.
    #[serde(default)]
    pub error: Option<String>,
    /// Role call involved.
    #[serde(default)]
    pub call_id: Option<String>,
    /// Judge involved.
    #[serde(default)]
    pub judge: Option<String>,
}

/// `model.exchanged`: the raw HTTP exchange of one attempt of a model call, written only when
/// `telemetry.capture.raw_exchanges` is on. API keys are redacted and file bytes replaced by
/// their size; bodies are cut at `raw_max_bytes` (sizes and hashes are the full bodies').
///
/// Content fields (never exported): the headers, the bodies and `error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelExchanged {
    /// Provider model name.
    pub model_id: String,
    /// Config model id.
    #[serde(default)]
    pub model: Option<String>,
    /// Provider.
    pub provider: String,
    /// The attempt, from 1.
    pub attempt: u32,
    /// HTTP method.
    pub method: String,
    /// Request URL.
    pub url: String,
    /// Response status; null when no response arrived.
    #[serde(default)]
    pub status_code: Option<u16>,
    /// From sending the request to the end of the response.
    pub duration_ms: f64,
    /// Request headers (credentials redacted).
    #[serde(default)]
    pub request_headers: BTreeMap<String, String>,
    /// Request body (file bytes replaced, cut at the limit).
    #[serde(default)]
    pub request_body: String,
    /// Size of the full request body.
    pub request_bytes: u64,
    /// SHA-256 (hex) of the full request body.
    pub request_sha256: String,
    /// Whether `request_body` was cut.
    #[serde(default)]
    pub request_truncated: bool,
    /// Response headers (credentials redacted).
    #[serde(default)]
    pub response_headers: BTreeMap<String, String>,
    /// Response body as received (cut at the limit).
    #[serde(default)]
    pub response_body: String,
    /// Size of the response body received.
    pub response_bytes: u64,
    /// SHA-256 (hex) of the response body received.
    pub response_sha256: String,
    /// Whether `response_body` was cut.
    #[serde(default)]
    pub response_truncated: bool,
    /// The error that ended the exchange.
    #[serde(default)]
    pub error: Option<String>,
    /// Built by Loom rather than observed on the wire.
    #[serde(default)]
    pub synthetic: bool,
    /// Role call involved.
    #[serde(default)]
    pub call_id: Option<String>,
    /// Judge involved.
    #[serde(default)]
    pub judge: Option<String>,
}

/// `approval.requested`: the call is held until a decision.
///
/// Content fields: `arguments`, `reason`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequested {
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool_name: String,
    /// The arguments the call would run with.
    pub arguments: Value,
    /// Why a human is asked.
    pub reason: String,
    /// The policy that asked (none: the tool's declaration).
    #[serde(default)]
    pub policy: Option<String>,
    /// What the decision allows ([`crate::approval::APPROVE_SCOPE`]).
    #[serde(default = "approve")]
    pub scope: String,
    /// Deadline (`null`: never expires).
    #[serde(default, serialize_with = "ser_opt_ts", deserialize_with = "de_opt_ts")]
    pub expire_at: Option<DateTime<Utc>>,
}

fn approve() -> String {
    crate::approval::APPROVE_SCOPE.into()
}

/// `approval.granted`.
///
/// Content fields: `arguments`, `reason`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalGranted {
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool_name: String,
    /// Who decided.
    pub by: String,
    /// Why.
    #[serde(default)]
    pub reason: Option<String>,
    /// Corrected arguments the call runs with (`null`: the model's).
    #[serde(default)]
    pub arguments: Option<Value>,
}

/// `approval.rejected`.
///
/// Content field: `reason`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRejected {
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool_name: String,
    /// Who decided.
    pub by: String,
    /// Why (given to the model).
    #[serde(default)]
    pub reason: Option<String>,
}

/// `approval.expired`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalExpired {
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool_name: String,
    /// "deny" (the model is told) or "fail" (the run fails).
    pub action: String,
    /// The deadline that passed.
    #[serde(default, serialize_with = "ser_opt_ts", deserialize_with = "de_opt_ts")]
    pub expire_at: Option<DateTime<Utc>>,
}

/// `idempotency.recorded`.
///
/// Content field: `result`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdempotencyRecorded {
    /// The full business key (`<tenant>:<tool>:<business key>`).
    pub key: String,
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool_name: String,
    /// The recorded result.
    pub result: crate::tool::ToolOutput,
}

/// `idempotency.reused`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdempotencyReused {
    /// The full business key (`<tenant>:<tool>:<business key>`).
    pub key: String,
    /// The call that was not run.
    pub call_id: String,
    /// Its tool.
    pub tool_name: String,
}

/// `policy.decided`: a decision of a policy at one hook point, journaled before it takes effect.
///
/// Content fields: `reason`, `arguments`, `output`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyDecided {
    /// The policy (`loom.contract`, `loom.judge.<name>`, `loom.budget`, or a user policy).
    pub policy: String,
    /// The hook point (`before_model`, `after_model`, `before_tool`, `after_tool`, `on_output`).
    pub point: String,
    /// `continue`, `replace`, `retry`, `deny`, `pause`, `stop` or `fail`.
    pub decision: String,
    /// Why.
    #[serde(default)]
    pub reason: Option<String>,
    /// The tool call concerned (tool points).
    #[serde(default)]
    pub call_id: Option<String>,
    /// Repair attempt number (retry).
    #[serde(default)]
    pub attempt: Option<u32>,
    /// Whether the repair keeps tools offered (retry).
    #[serde(default)]
    pub tools: Option<bool>,
    /// Replacement arguments (replace at `before_tool`).
    #[serde(default)]
    pub arguments: Option<Value>,
    /// Replacement output (replace at `on_output` / `after_tool`).
    #[serde(default)]
    pub output: Option<Value>,
    /// Whether the policy itself failed (exception, timeout, decision not allowed).
    #[serde(default)]
    pub error: bool,
}

/// `guard.checked`: a contract or judge verdict on an output.
///
/// Content field: `reason`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuardChecked {
    /// `contract`, `judge` or `fidelity`.
    pub guard: String,
    /// `output`, `role:<name>` or `tool:<name>`.
    pub target: String,
    /// `passed`, `failed` or `skipped`.
    pub outcome: String,
    /// The diagnostic, or why the guard was skipped.
    #[serde(default)]
    pub reason: Option<String>,
    /// Attempt number (1 for the first check).
    #[serde(default)]
    pub attempt: Option<u32>,
    /// Whether normalization changed the output.
    #[serde(default)]
    pub normalized: bool,
    /// What a failure leads to: `retry`, `fail`, `unverified` or `fallback`.
    #[serde(default)]
    pub resolution: Option<String>,
    /// The policy running the guard (`loom.contract`, `loom.judge.<name>`).
    #[serde(default)]
    pub policy: Option<String>,
    /// The tool call whose result was checked.
    #[serde(default)]
    pub call_id: Option<String>,
}

/// One criterion of a judge's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CriterionScore {
    /// Criterion name.
    pub name: String,
    /// Score between 0 and 1.
    pub score: f64,
    /// Threshold.
    pub min_score: f64,
    /// Whether a score under the threshold refuses the output.
    pub blocking: bool,
    /// The judge's explanation.
    #[serde(default)]
    pub reason: Option<String>,
}

impl CriterionScore {
    /// Whether the score reaches the threshold.
    pub fn passed(&self) -> bool {
        self.score >= self.min_score
    }
}

/// `judge.evaluated`: a judge's scores.
///
/// Content field: `criteria[].reason`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgeEvaluated {
    /// Judge name.
    pub judge: String,
    /// `output` or `role:<name>`.
    pub target: String,
    /// Provider model name of the judge.
    pub model_id: String,
    /// Config model id of the judge.
    #[serde(default)]
    pub model: Option<String>,
    /// One score per criterion (at least one).
    pub criteria: Vec<CriterionScore>,
    /// Every criterion passed.
    pub passed: bool,
    /// A blocking criterion failed.
    pub blocked: bool,
    /// Attempt number.
    #[serde(default)]
    pub attempt: Option<u32>,
    /// The policy running the judge.
    #[serde(default)]
    pub policy: Option<String>,
    /// The role call judged.
    #[serde(default)]
    pub call_id: Option<String>,
}

/// `budget.exceeded`: a run or session limit was reached (once per limit and run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetExceeded {
    /// `run` or `session`.
    pub scope: String,
    /// `max_cost`, `max_tokens` or `max_calls`.
    pub limit: String,
    /// The limit's value.
    pub value: f64,
    /// What was spent.
    pub spent: f64,
    /// `warn` or `stop`.
    pub action: String,
    /// The policy (`loom.budget`).
    #[serde(default)]
    pub policy: Option<String>,
}

/// `session.repaired`: a line of the session's journal that could not be read was set aside
/// (its bytes kept in `moved_to`), and this event was written in its place, at its seq, so that
/// the journal reads again. Not in the reference catalogue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRepaired {
    /// Bytes of the line set aside.
    pub bytes: u64,
    /// Why it could not be read.
    pub error: String,
    /// Where its bytes are kept: the side file beside the journal (`<session>.jsonl.corrupt`),
    /// or the SQLite table `set_aside`.
    pub moved_to: String,
    /// Who asked for the repair.
    #[serde(default)]
    pub by: Option<String>,
}

impl ModelExchanged {
    /// The event of `exchange`, observed on the wire (`synthetic` false), for the main slot.
    pub fn observed(
        exchange: HttpExchange,
        model_id: String,
        model: Option<String>,
        provider: String,
        attempt: u32,
    ) -> ModelExchanged {
        ModelExchanged {
            model_id,
            model,
            provider,
            attempt,
            method: exchange.method,
            url: exchange.url,
            status_code: exchange.status_code,
            duration_ms: exchange.duration_ms,
            request_headers: exchange.request_headers,
            request_body: exchange.request_body,
            request_bytes: exchange.request_bytes,
            request_sha256: exchange.request_sha256,
            request_truncated: exchange.request_truncated,
            response_headers: exchange.response_headers,
            response_body: exchange.response_body,
            response_bytes: exchange.response_bytes,
            response_sha256: exchange.response_sha256,
            response_truncated: exchange.response_truncated,
            error: exchange.error,
            synthetic: false,
            call_id: None,
            judge: None,
        }
    }
}

impl Payload {
    /// The `type` string.
    pub fn type_name(&self) -> &'static str {
        match self {
            Payload::RunStarted(_) => "run.started",
            Payload::StepStarted(_) => "step.started",
            Payload::StepCompleted(_) => "step.completed",
            Payload::RunTransitioned(_) => "run.transitioned",
            Payload::RunCompleted(_) => "run.completed",
            Payload::RunFailed(_) => "run.failed",
            Payload::RunCancelled(_) => "run.cancelled",
            Payload::RunClaimed(_) => "run.claimed",
            Payload::MessageUser(_) => "message.user",
            Payload::ModelResponded(_) => "model.responded",
            Payload::ToolCalled(_) => "tool.called",
            Payload::ToolCompleted(_) => "tool.completed",
            Payload::ToolSourceUnavailable(_) => "tool.source_unavailable",
            Payload::CircuitOpened(_) => "circuit.opened",
            Payload::ArtifactStored(_) => "artifact.stored",
            Payload::ModelRetried(_) => "model.retried",
            Payload::ModelFellBack(_) => "model.fell_back",
            Payload::ModelExchanged(_) => "model.exchanged",
            Payload::ApprovalRequested(_) => "approval.requested",
            Payload::ApprovalGranted(_) => "approval.granted",
            Payload::ApprovalRejected(_) => "approval.rejected",
            Payload::ApprovalExpired(_) => "approval.expired",
            Payload::IdempotencyRecorded(_) => "idempotency.recorded",
            Payload::IdempotencyReused(_) => "idempotency.reused",
            Payload::PolicyDecided(_) => "policy.decided",
            Payload::GuardChecked(_) => "guard.checked",
            Payload::JudgeEvaluated(_) => "judge.evaluated",
            Payload::BudgetExceeded(_) => "budget.exceeded",
            Payload::SessionRepaired(_) => "session.repaired",
            Payload::Sealed(_) => "sealed",
        }
    }

    /// The category.
    pub fn category(&self) -> Category {
        match self {
            Payload::MessageUser(_) => Category::Message,
            Payload::ModelResponded(_)
            | Payload::ModelRetried(_)
            | Payload::ModelFellBack(_)
            | Payload::ModelExchanged(_) => Category::Model,
            Payload::ToolCalled(_)
            | Payload::ToolCompleted(_)
            | Payload::ToolSourceUnavailable(_) => Category::Tool,
            Payload::CircuitOpened(_) => Category::Circuit,
            Payload::ArtifactStored(_) => Category::Artifact,
            Payload::ApprovalRequested(_)
            | Payload::ApprovalGranted(_)
            | Payload::ApprovalRejected(_)
            | Payload::ApprovalExpired(_) => Category::Approval,
            Payload::IdempotencyRecorded(_) | Payload::IdempotencyReused(_) => {
                Category::Idempotency
            }
            Payload::PolicyDecided(_) | Payload::BudgetExceeded(_) => Category::Policy,
            Payload::GuardChecked(_) | Payload::JudgeEvaluated(_) => Category::Guard,
            Payload::SessionRepaired(_) => Category::Session,
            _ => Category::Run,
        }
    }

    /// The status.
    pub fn status(&self) -> EventStatus {
        match self {
            Payload::StepCompleted(p) if p.outcome != Outcome::Ok => EventStatus::Error,
            Payload::RunCompleted(p) if p.unverified || p.fallback => EventStatus::Warning,
            Payload::RunFailed(_) => EventStatus::Error,
            Payload::RunCancelled(_) => EventStatus::Warning,
            Payload::ToolCompleted(p) if p.output.is_error => EventStatus::Error,
            Payload::ToolSourceUnavailable(p) if p.required => EventStatus::Error,
            Payload::PolicyDecided(p) if p.decision == "fail" => EventStatus::Error,
            Payload::PolicyDecided(p) if p.error || p.decision == "continue" => {
                EventStatus::Warning
            }
            Payload::GuardChecked(p) if p.outcome == "failed" => {
                if p.resolution.as_deref() == Some("fail") {
                    EventStatus::Error
                } else {
                    EventStatus::Warning
                }
            }
            Payload::JudgeEvaluated(p) if !p.passed => EventStatus::Warning,
            Payload::BudgetExceeded(_) | Payload::SessionRepaired(_) => EventStatus::Warning,
            Payload::ModelExchanged(p)
                if p.error.is_some() || p.status_code.is_some_and(|s| s >= 400) =>
            {
                EventStatus::Warning
            }
            Payload::ToolSourceUnavailable(_)
            | Payload::CircuitOpened(_)
            | Payload::ModelRetried(_)
            | Payload::ModelFellBack(_)
            | Payload::ApprovalRequested(_)
            | Payload::ApprovalRejected(_)
            | Payload::ApprovalExpired(_) => EventStatus::Warning,
            _ => EventStatus::Ok,
        }
    }

    /// The facets, in the reference's order.
    pub fn facets(&self) -> Map<String, Value> {
        let mut f = Map::new();
        match self {
            Payload::RunStarted(p) => {
                f.insert("kind".into(), json!(p.kind));
                if p.judges != "auto" {
                    f.insert("judges".into(), json!(p.judges));
                }
                if let Some(trigger) = &p.trigger {
                    f.insert("trigger".into(), json!(trigger));
                }
            }
            Payload::StepStarted(p) => {
                f.insert("effect".into(), json!(p.effect));
            }
            Payload::StepCompleted(p) => {
                f.insert("outcome".into(), json!(p.outcome));
                f.insert("duration_ms".into(), json!(p.duration_ms));
            }
            Payload::RunTransitioned(p) => {
                f.insert("from_state".into(), json!(p.from_state));
                f.insert("to_state".into(), json!(p.to_state));
            }
            Payload::RunCompleted(p) => {
                f.insert("iterations".into(), json!(p.iterations));
                f.insert("cost_usd".into(), json!(p.cost_usd));
                if p.unverified {
                    f.insert("unverified".into(), json!(true));
                }
                if p.fallback {
                    f.insert("fallback".into(), json!(true));
                }
            }
            Payload::RunFailed(p) => {
                f.insert("error_type".into(), json!(p.error_type));
            }
            Payload::RunCancelled(p) => {
                f.insert("reason".into(), json!(p.reason));
            }
            Payload::RunClaimed(p) => {
                f.insert("worker_id".into(), json!(p.worker_id));
            }
            Payload::MessageUser(p) => {
                if p.kind != "request" {
                    f.insert("kind".into(), json!(p.kind));
                }
            }
            Payload::ModelResponded(p) => {
                f.insert("model_id".into(), json!(p.model_id));
                f.insert("provider".into(), json!(p.provider));
                f.insert("stop_reason".into(), json!(p.stop_reason));
                f.insert("cost_usd".into(), json!(p.cost_usd));
                f.insert("latency_ms".into(), json!(p.latency_ms));
                f.insert("tokens".into(), json!(p.usage.total_tokens()));
                if let Some(model) = &p.model {
                    f.insert("model".into(), json!(model));
                }
                if let Some(judge) = &p.judge {
                    f.insert("judge".into(), json!(judge));
                }
            }
            Payload::ToolCalled(p) => {
                f.insert("tool_name".into(), json!(p.tool_name));
                f.insert("tool_kind".into(), json!(p.tool_kind));
            }
            Payload::ModelRetried(p) => {
                f.insert("model_id".into(), json!(p.model_id));
                f.insert("provider".into(), json!(p.provider));
                f.insert("error_kind".into(), json!(p.error_kind));
                f.insert("attempt".into(), json!(p.attempt));
                if let Some(model) = &p.model {
                    f.insert("model".into(), json!(model));
                }
                if let Some(judge) = &p.judge {
                    f.insert("judge".into(), json!(judge));
                }
            }
            Payload::ModelExchanged(p) => {
                f.insert("model_id".into(), json!(p.model_id));
                f.insert("provider".into(), json!(p.provider));
                f.insert("attempt".into(), json!(p.attempt));
                f.insert("status_code".into(), json!(p.status_code));
                f.insert("duration_ms".into(), json!(p.duration_ms));
                f.insert("request_bytes".into(), json!(p.request_bytes));
                f.insert("response_bytes".into(), json!(p.response_bytes));
                if let Some(model) = &p.model {
                    f.insert("model".into(), json!(model));
                }
                if p.synthetic {
                    f.insert("synthetic".into(), json!(true));
                }
                if let Some(judge) = &p.judge {
                    f.insert("judge".into(), json!(judge));
                }
            }
            Payload::ModelFellBack(p) => {
                f.insert("slot".into(), json!(p.slot));
                f.insert("from_model".into(), json!(p.from_model));
                f.insert("to_model".into(), json!(p.to_model));
                f.insert("reason".into(), json!(p.reason));
            }
            Payload::ToolSourceUnavailable(p) => {
                f.insert("source".into(), json!(p.source));
                f.insert("required".into(), json!(p.required));
            }
            Payload::CircuitOpened(p) => {
                f.insert("target_kind".into(), json!(p.target_kind));
                f.insert("target".into(), json!(p.target));
                f.insert("failures".into(), json!(p.failures));
            }
            Payload::ArtifactStored(p) => {
                f.insert("origin".into(), json!(p.origin));
                f.insert("media_type".into(), json!(p.media_type));
                f.insert("size".into(), json!(p.size));
            }
            Payload::ToolCompleted(p) => {
                f.insert("tool_name".into(), json!(p.tool_name));
                f.insert("latency_ms".into(), json!(p.latency_ms));
                f.insert("size".into(), json!(p.size));
                f.insert("is_error".into(), json!(p.output.is_error));
                if p.output.offloaded.is_some() {
                    f.insert("offloaded".into(), json!(true));
                }
            }
            Payload::ApprovalRequested(p) => {
                f.insert("tool_name".into(), json!(p.tool_name));
                f.insert("scope".into(), json!(p.scope));
            }
            Payload::ApprovalGranted(p) => {
                f.insert("tool_name".into(), json!(p.tool_name));
                f.insert("by".into(), json!(p.by));
            }
            Payload::ApprovalRejected(p) => {
                f.insert("tool_name".into(), json!(p.tool_name));
                f.insert("by".into(), json!(p.by));
            }
            Payload::ApprovalExpired(p) => {
                f.insert("tool_name".into(), json!(p.tool_name));
                f.insert("action".into(), json!(p.action));
            }
            Payload::IdempotencyRecorded(p) => {
                f.insert("tool_name".into(), json!(p.tool_name));
                f.insert("key".into(), json!(p.key));
            }
            Payload::IdempotencyReused(p) => {
                f.insert("tool_name".into(), json!(p.tool_name));
                f.insert("key".into(), json!(p.key));
            }
            Payload::PolicyDecided(p) => {
                f.insert("policy".into(), json!(p.policy));
                f.insert("point".into(), json!(p.point));
                f.insert("decision".into(), json!(p.decision));
            }
            Payload::GuardChecked(p) => {
                f.insert("guard".into(), json!(p.guard));
                f.insert("target".into(), json!(p.target));
                f.insert("outcome".into(), json!(p.outcome));
            }
            Payload::JudgeEvaluated(p) => {
                f.insert("judge".into(), json!(p.judge));
                f.insert("target".into(), json!(p.target));
                f.insert("model_id".into(), json!(p.model_id));
                f.insert("passed".into(), json!(p.passed));
                f.insert("blocked".into(), json!(p.blocked));
                if let Some(model) = &p.model {
                    f.insert("model".into(), json!(model));
                }
            }
            Payload::BudgetExceeded(p) => {
                f.insert("scope".into(), json!(p.scope));
                f.insert("limit".into(), json!(p.limit));
                f.insert("action".into(), json!(p.action));
            }
            Payload::SessionRepaired(p) => {
                f.insert("bytes".into(), json!(p.bytes));
            }
            // The envelope of a sealed event keeps the facets of its clear payload.
            Payload::Sealed(_) => {}
        }
        f
    }

    /// Payload invariants: well-formed messages, no file bytes in the journal.
    pub fn check(&self) -> Result<(), String> {
        let message = match self {
            Payload::MessageUser(p) => Some(&p.message),
            Payload::ModelResponded(p) => Some(&p.message),
            Payload::RunCompleted(p) => p.output.as_ref(),
            _ => None,
        };
        if let Some(message) = message {
            message.check()?;
        }
        if let Payload::JudgeEvaluated(p) = self {
            if p.criteria.is_empty() {
                return Err("judge.evaluated without criteria".into());
            }
            let passed = p.criteria.iter().all(CriterionScore::passed);
            let blocked = p.criteria.iter().any(|c| c.blocking && !c.passed());
            if p.passed != passed || p.blocked != blocked {
                return Err("judge.evaluated: passed/blocked contradict the criteria".into());
            }
        }
        if let Payload::ToolCompleted(p) = self
            && p.output
                .blocks
                .iter()
                .any(|b| matches!(b.kind, crate::BlockKind::InlineData { .. }))
        {
            return Err("file bytes are not allowed in the journal".into());
        }
        Ok(())
    }

    /// The events of this payload that close a run.
    pub fn is_closing(&self) -> bool {
        matches!(
            self,
            Payload::RunCompleted(_) | Payload::RunFailed(_) | Payload::RunCancelled(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"event_id":"01a2272b-2a5d-7c60-ae0f-8690fd14d194","ts":"2026-11-29T11:57:50.044443Z","schema_version":1,"tenant_id":"default","session_id":"plain-run-1","run_id":"plain-run-1","root_run_id":"plain-run-1","span_id":"01a2272b-2a58-7207-9988-3ca389305581","parent_span_id":"01a2272b-2a56-7cc7-a088-a8f4c887158b","type":"tool.completed","category":"tool","status":"ok","agent":"demo","role":null,"facets":{"tool_name":"calculer","latency_ms":0.351611999974466,"size":164,"is_error":false},"payload":{"type":"tool.completed","call_id":"fake_0_0","tool_name":"calculer","output":{"blocks":[{"cache_breakpoint":false,"provider_meta":{},"type":"text","text":"87"}],"data":null,"is_error":false,"artifacts":[],"offloaded":null,"unverified":false},"latency_ms":0.351611999974466,"size":164,"usage":null,"cost_usd":0.0},"seq":10}"#;

    #[test]
    fn reference_line_round_trips_byte_for_byte() {
        let event = Event::from_json(LINE).unwrap();
        assert_eq!(event.seq, 10);
        assert_eq!(event.to_json(), LINE);
    }

    /// A sealed payload (`{"sealed", "key_id"}`, no `type`) reads as [`Payload::Sealed`] and is
    /// written back byte for byte; its envelope is not compared with it; an ill-formed key id is
    /// refused, and the projection refuses to fold it.
    #[test]
    fn a_sealed_payload_reads_and_writes_as_the_reference_writes_it() {
        let start = LINE.find(r#""payload":{"#).unwrap();
        let end = LINE.find(r#","seq":10"#).unwrap();
        let sealed = format!(
            r#"{}"payload":{{"sealed":"AAECAwQFBgcICQoL","key_id":"4ed42d1a2576"}}{}"#,
            &LINE[..start],
            &LINE[end..]
        );
        let event = Event::from_json(&sealed).unwrap();
        assert_eq!(
            event.payload,
            Payload::Sealed(SealedPayload {
                sealed: "AAECAwQFBgcICQoL".into(),
                key_id: "4ed42d1a2576".into(),
            })
        );
        assert_eq!(event.event_type, "tool.completed");
        assert_eq!(event.to_json(), sealed);
        let bad = sealed.replace("4ed42d1a2576", "4ED42D1A2576");
        assert!(matches!(
            Event::from_json(&bad).unwrap_err(),
            EventReadError::Invalid { .. }
        ));
        // A payload with `type` is never taken for a sealed one.
        let typed = sealed.replace(r#"{"sealed""#, r#"{"type":"tool.completed","sealed""#);
        assert!(Event::from_json(&typed).is_err());
        // Keys in another order read the same: `key_id` first, or `type` after other fields.
        let reordered = sealed.replace(
            r#"{"sealed":"AAECAwQFBgcICQoL","key_id":"4ed42d1a2576"}"#,
            r#"{"key_id":"4ed42d1a2576","sealed":"AAECAwQFBgcICQoL"}"#,
        );
        assert_eq!(Event::from_json(&reordered).unwrap(), event);
        let type_last = LINE.replace(
            r#""payload":{"type":"tool.completed","call_id":"fake_0_0","#,
            r#""payload":{"call_id":"fake_0_0","#,
        );
        let type_last = type_last.replace(
            r#""cost_usd":0.0},"seq""#,
            r#""cost_usd":0.0,"type":"tool.completed"},"seq""#,
        );
        assert_ne!(type_last, LINE);
        assert_eq!(
            Event::from_json(&type_last).unwrap(),
            Event::from_json(LINE).unwrap()
        );
        let envelope = Envelope {
            event_id: "e0".into(),
            ts: event.ts,
            tenant_id: event.tenant_id.clone(),
            session_id: event.session_id.clone(),
            run_id: event.run_id.clone(),
            root_run_id: event.root_run_id.clone(),
            span_id: "sp".into(),
            parent_span_id: None,
            agent: None,
            role: None,
        };
        let started = Event::new(
            envelope,
            Payload::RunStarted(RunStarted {
                kind: "normal".into(),
                context: RunContext {
                    tenant_id: event.tenant_id.clone(),
                    user_id: None,
                    metadata: Map::new(),
                },
                parent_run_id: None,
                parent_call_id: None,
                depth: 0,
                triggered_by: None,
                trigger: None,
                judges: "auto".into(),
                budget: None,
                state: Map::new(),
            }),
        );
        let mut state = crate::state::RunState::start(&started).unwrap();
        let refused = state.apply(&event).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("sealed payload that was not opened"),
            "{refused}"
        );
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let line = LINE.replace(r#""seq":10"#, r#""seq":10,"later":{"x":1}"#);
        assert!(Event::from_json(&line).is_ok());
    }

    #[test]
    fn contradicting_envelope_is_refused_with_the_event_named() {
        let line = LINE.replace(r#""status":"ok""#, r#""status":"error""#);
        let err = Event::from_json(&line).unwrap_err();
        assert!(matches!(
            err,
            EventReadError::Inconsistent {
                field: "status",
                ..
            }
        ));
        assert!(
            err.to_string()
                .contains("01a2272b-2a5d-7c60-ae0f-8690fd14d194")
        );
        let line = LINE.replace(r#""size":164,"is_error""#, r#""size":165,"is_error""#);
        assert!(matches!(
            Event::from_json(&line).unwrap_err(),
            EventReadError::Inconsistent {
                field: "facets",
                ..
            }
        ));
    }

    fn exchanged(status_code: Option<u16>, error: Option<&str>) -> Event {
        let exchange = HttpExchange {
            method: "POST".into(),
            url: "https://api.anthropic.com/v1/messages".into(),
            status_code,
            duration_ms: 12.5,
            request_bytes: 300,
            response_bytes: 40,
            error: error.map(str::to_owned),
            ..HttpExchange::default()
        };
        let payload = Payload::ModelExchanged(ModelExchanged::observed(
            exchange,
            "claude-sonnet-4-5".into(),
            Some("claude".into()),
            "anthropic".into(),
            2,
        ));
        let envelope = Envelope {
            event_id: "e".into(),
            ts: DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default(),
            tenant_id: "default".into(),
            session_id: "s".into(),
            run_id: "s".into(),
            root_run_id: "s".into(),
            span_id: "p".into(),
            parent_span_id: None,
            agent: Some("a".into()),
            role: Some("main".into()),
        };
        Event::new(envelope, payload)
    }

    #[test]
    fn model_exchanged_status_facets_and_round_trip() {
        let ok = exchanged(Some(200), None);
        assert_eq!(ok.event_type, "model.exchanged");
        assert_eq!(ok.category, Category::Model);
        assert_eq!(ok.status, EventStatus::Ok);
        let keys: Vec<&str> = ok.facets.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "model_id",
                "provider",
                "attempt",
                "status_code",
                "duration_ms",
                "request_bytes",
                "response_bytes",
                "model"
            ]
        );
        assert_eq!(Event::from_json(&ok.to_json()).unwrap(), ok);
        assert_eq!(exchanged(Some(529), None).status, EventStatus::Warning);
        assert_eq!(
            exchanged(Some(200), Some("stream interrupted")).status,
            EventStatus::Warning
        );
        let none = exchanged(None, Some("network error"));
        assert_eq!(none.status, EventStatus::Warning);
        assert_eq!(none.facets["status_code"], Value::Null);
    }

    #[test]
    fn other_schema_versions_are_refused() {
        let line = LINE.replace(r#""schema_version":1"#, r#""schema_version":2"#);
        assert!(matches!(
            Event::from_json(&line).unwrap_err(),
            EventReadError::Version { found: 2, .. }
        ));
    }
}
