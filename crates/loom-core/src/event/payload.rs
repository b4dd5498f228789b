//! [`Payload`], the closed enum of what can happen, and what is derived from it: its `type`,
//! category, status and facets, its invariants, whether it closes a run.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::{
    ApprovalExpired, ApprovalGranted, ApprovalRejected, ApprovalRequested, ArtifactStored,
    BudgetExceeded, Category, CircuitOpened, CriterionScore, EventStatus, GuardChecked,
    IdempotencyRecorded, IdempotencyReused, JudgeEvaluated, MessageUser, ModelExchanged,
    ModelFellBack, ModelResponded, ModelRetried, Outcome, PolicyDecided, RunCancelled, RunClaimed,
    RunCompleted, RunFailed, RunStarted, RunTransitioned, SealedPayload, SessionCompacted,
    SessionRepaired, SessionSnapshot, SessionTrimmed, StepCompleted, StepStarted, ToolCalled,
    ToolCompleted, ToolSourceOpened, ToolSourceUnavailable,
};

/// Calls `$apply! { "type" => Variant, … }` with every payload type but `Sealed`: the one list
/// [`Payload::type_name`] and the reader's dispatch on `type` ([`read_typed`]) are made from, so
/// a variant missing from it does not compile.
macro_rules! payload_types {
    ($apply:ident) => {
        $apply! {
            "run.started" => RunStarted,
            "step.started" => StepStarted,
            "step.completed" => StepCompleted,
            "run.transitioned" => RunTransitioned,
            "run.completed" => RunCompleted,
            "run.failed" => RunFailed,
            "run.cancelled" => RunCancelled,
            "run.claimed" => RunClaimed,
            "message.user" => MessageUser,
            "model.responded" => ModelResponded,
            "tool.called" => ToolCalled,
            "tool.completed" => ToolCompleted,
            "tool.source_unavailable" => ToolSourceUnavailable,
            "tool.source_opened" => ToolSourceOpened,
            "circuit.opened" => CircuitOpened,
            "artifact.stored" => ArtifactStored,
            "model.retried" => ModelRetried,
            "model.fell_back" => ModelFellBack,
            "model.exchanged" => ModelExchanged,
            "approval.requested" => ApprovalRequested,
            "approval.granted" => ApprovalGranted,
            "approval.rejected" => ApprovalRejected,
            "approval.expired" => ApprovalExpired,
            "idempotency.recorded" => IdempotencyRecorded,
            "idempotency.reused" => IdempotencyReused,
            "policy.decided" => PolicyDecided,
            "guard.checked" => GuardChecked,
            "judge.evaluated" => JudgeEvaluated,
            "budget.exceeded" => BudgetExceeded,
            "session.repaired" => SessionRepaired,
            "session.snapshot" => SessionSnapshot,
            "session.compacted" => SessionCompacted,
            "session.trimmed" => SessionTrimmed,
        }
    };
}

/// Reads the payload of type `tag` from the rest of its object (`type`, its first key, already
/// read) straight into its variant's struct, without the buffering serde's internally tagged
/// reader does; hands `rest` back (`Err`) for a `type` no variant has, which the derived reader
/// then refuses with its own message.
pub(super) fn read_typed<'de, A: serde::de::MapAccess<'de>>(
    tag: &str,
    rest: A,
) -> Result<Result<Payload, A::Error>, A> {
    use serde::de::value::MapAccessDeserializer;
    macro_rules! read {
        ($($name:literal => $variant:ident,)*) => {
            match tag {
                $($name => Ok($variant::deserialize(MapAccessDeserializer::new(rest))
                    .map(Payload::$variant)),)*
                _ => Err(rest),
            }
        };
    }
    payload_types!(read)
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
    /// A tool source (an MCP server) gave its tools for the run.
    #[serde(rename = "tool.source_opened")]
    ToolSourceOpened(ToolSourceOpened),
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
    /// The session history, projected up to a seq (a read shortcut for long sessions).
    #[serde(rename = "session.snapshot")]
    SessionSnapshot(SessionSnapshot),
    /// Older turns of the session were summarized.
    #[serde(rename = "session.compacted")]
    SessionCompacted(SessionCompacted),
    /// The history sent to a run was cut to its cap.
    #[serde(rename = "session.trimmed")]
    SessionTrimmed(SessionTrimmed),
    /// A payload sealed at rest, as a journal holds it (`{"sealed", "key_id"}`, no `type`):
    /// opened by the sealing journal before the event reaches anyone else (see
    /// [`SealedPayload`]). Its `type_name` is `sealed`; the event's envelope keeps the clear
    /// payload's type, category, status and facets.
    #[serde(skip)]
    Sealed(SealedPayload),
}

impl Payload {
    /// The `type` string.
    pub fn type_name(&self) -> &'static str {
        macro_rules! names {
            ($($name:literal => $variant:ident,)*) => {
                match self {
                    $(Payload::$variant(_) => $name,)*
                    Payload::Sealed(_) => "sealed",
                }
            };
        }
        payload_types!(names)
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
            | Payload::ToolSourceUnavailable(_)
            | Payload::ToolSourceOpened(_) => Category::Tool,
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
            Payload::SessionRepaired(_)
            | Payload::SessionSnapshot(_)
            | Payload::SessionCompacted(_)
            | Payload::SessionTrimmed(_) => Category::Session,
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
            Payload::SessionCompacted(p) if p.fidelity == "warning" => EventStatus::Warning,
            Payload::BudgetExceeded(_)
            | Payload::SessionRepaired(_)
            | Payload::SessionTrimmed(_) => EventStatus::Warning,
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
            Payload::ToolSourceOpened(p) => {
                f.insert("source".into(), json!(p.source));
                f.insert("tools".into(), json!(p.tools.len()));
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
            Payload::SessionSnapshot(p) => {
                f.insert("up_to_seq".into(), json!(p.up_to_seq));
                f.insert("messages".into(), json!(p.messages.len()));
                f.insert("tokens".into(), json!(p.tokens));
            }
            Payload::SessionCompacted(p) => {
                f.insert("up_to_seq".into(), json!(p.up_to_seq));
                f.insert("kept".into(), json!(p.kept));
                f.insert("tokens_before".into(), json!(p.tokens_before));
                f.insert("tokens_after".into(), json!(p.tokens_after));
                f.insert("fidelity".into(), json!(p.fidelity));
            }
            Payload::SessionTrimmed(p) => {
                f.insert("up_to_seq".into(), json!(p.up_to_seq));
                f.insert("dropped".into(), json!(p.dropped));
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
