//! [`Payload`], the closed enum of what can happen, and what is derived from it: its `type`,
//! category, status and facets, its invariants, whether it closes a run.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    ApprovalExpired, ApprovalGranted, ApprovalRejected, ApprovalRequested, ArtifactStored,
    BudgetExceeded, Category, CircuitOpened, CriterionScore, EventStatus, GuardChecked,
    IdempotencyRecorded, IdempotencyReused, JudgeEvaluated, MessageUser, ModelExchanged,
    ModelFellBack, ModelResponded, ModelRetried, Outcome, PolicyDecided, RunCancelled, RunClaimed,
    RunCompleted, RunFailed, RunStarted, RunTransitioned, SealedPayload, SessionCompacted,
    SessionRepaired, SessionSnapshot, SessionTrimmed, StepCompleted, StepStarted, ToolCalled,
    ToolCompleted, ToolSourceOpened, ToolSourceUnavailable,
    facets::{Facets, Matches},
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
        let mut facets = Map::new();
        self.put_facets(&mut facets);
        facets
    }

    /// Whether `facets` are this payload's, compared without building them.
    pub fn has_facets(&self, facets: &Map<String, Value>) -> bool {
        let mut matches = Matches::new(facets);
        self.put_facets(&mut matches);
        matches.all()
    }

    fn put_facets(&self, f: &mut impl Facets) {
        match self {
            Payload::RunStarted(p) => {
                f.put("kind", &p.kind);
                if p.judges != "auto" {
                    f.put("judges", &p.judges);
                }
                if let Some(trigger) = &p.trigger {
                    f.put("trigger", &trigger);
                }
            }
            Payload::StepStarted(p) => {
                f.put("effect", &p.effect);
            }
            Payload::StepCompleted(p) => {
                f.put("outcome", &p.outcome);
                f.put("duration_ms", &p.duration_ms);
            }
            Payload::RunTransitioned(p) => {
                f.put("from_state", &p.from_state);
                f.put("to_state", &p.to_state);
            }
            Payload::RunCompleted(p) => {
                f.put("iterations", &p.iterations);
                f.put("cost_usd", &p.cost_usd);
                if p.unverified {
                    f.put("unverified", &true);
                }
                if p.fallback {
                    f.put("fallback", &true);
                }
            }
            Payload::RunFailed(p) => {
                f.put("error_type", &p.error_type);
            }
            Payload::RunCancelled(p) => {
                f.put("reason", &p.reason);
            }
            Payload::RunClaimed(p) => {
                f.put("worker_id", &p.worker_id);
            }
            Payload::MessageUser(p) => {
                if p.kind != "request" {
                    f.put("kind", &p.kind);
                }
            }
            Payload::ModelResponded(p) => {
                f.put("model_id", &p.model_id);
                f.put("provider", &p.provider);
                f.put("stop_reason", &p.stop_reason);
                f.put("cost_usd", &p.cost_usd);
                f.put("latency_ms", &p.latency_ms);
                f.put("tokens", &p.usage.total_tokens());
                if let Some(model) = &p.model {
                    f.put("model", &model);
                }
                if let Some(judge) = &p.judge {
                    f.put("judge", &judge);
                }
            }
            Payload::ToolCalled(p) => {
                f.put("tool_name", &p.tool_name);
                f.put("tool_kind", &p.tool_kind);
            }
            Payload::ModelRetried(p) => {
                f.put("model_id", &p.model_id);
                f.put("provider", &p.provider);
                f.put("error_kind", &p.error_kind);
                f.put("attempt", &p.attempt);
                if let Some(model) = &p.model {
                    f.put("model", &model);
                }
                if let Some(judge) = &p.judge {
                    f.put("judge", &judge);
                }
            }
            Payload::ModelExchanged(p) => {
                f.put("model_id", &p.model_id);
                f.put("provider", &p.provider);
                f.put("attempt", &p.attempt);
                f.put("status_code", &p.status_code);
                f.put("duration_ms", &p.duration_ms);
                f.put("request_bytes", &p.request_bytes);
                f.put("response_bytes", &p.response_bytes);
                if let Some(model) = &p.model {
                    f.put("model", &model);
                }
                if p.synthetic {
                    f.put("synthetic", &true);
                }
                if let Some(judge) = &p.judge {
                    f.put("judge", &judge);
                }
            }
            Payload::ModelFellBack(p) => {
                f.put("slot", &p.slot);
                f.put("from_model", &p.from_model);
                f.put("to_model", &p.to_model);
                f.put("reason", &p.reason);
            }
            Payload::ToolSourceUnavailable(p) => {
                f.put("source", &p.source);
                f.put("required", &p.required);
            }
            Payload::ToolSourceOpened(p) => {
                f.put("source", &p.source);
                f.put("tools", &p.tools.len());
            }
            Payload::CircuitOpened(p) => {
                f.put("target_kind", &p.target_kind);
                f.put("target", &p.target);
                f.put("failures", &p.failures);
            }
            Payload::ArtifactStored(p) => {
                f.put("origin", &p.origin);
                f.put("media_type", &p.media_type);
                f.put("size", &p.size);
            }
            Payload::ToolCompleted(p) => {
                f.put("tool_name", &p.tool_name);
                f.put("latency_ms", &p.latency_ms);
                f.put("size", &p.size);
                f.put("is_error", &p.output.is_error);
                if p.output.offloaded.is_some() {
                    f.put("offloaded", &true);
                }
            }
            Payload::ApprovalRequested(p) => {
                f.put("tool_name", &p.tool_name);
                f.put("scope", &p.scope);
            }
            Payload::ApprovalGranted(p) => {
                f.put("tool_name", &p.tool_name);
                f.put("by", &p.by);
            }
            Payload::ApprovalRejected(p) => {
                f.put("tool_name", &p.tool_name);
                f.put("by", &p.by);
            }
            Payload::ApprovalExpired(p) => {
                f.put("tool_name", &p.tool_name);
                f.put("action", &p.action);
            }
            Payload::IdempotencyRecorded(p) => {
                f.put("tool_name", &p.tool_name);
                f.put("key", &p.key);
            }
            Payload::IdempotencyReused(p) => {
                f.put("tool_name", &p.tool_name);
                f.put("key", &p.key);
            }
            Payload::PolicyDecided(p) => {
                f.put("policy", &p.policy);
                f.put("point", &p.point);
                f.put("decision", &p.decision);
            }
            Payload::GuardChecked(p) => {
                f.put("guard", &p.guard);
                f.put("target", &p.target);
                f.put("outcome", &p.outcome);
            }
            Payload::JudgeEvaluated(p) => {
                f.put("judge", &p.judge);
                f.put("target", &p.target);
                f.put("model_id", &p.model_id);
                f.put("passed", &p.passed);
                f.put("blocked", &p.blocked);
                if let Some(model) = &p.model {
                    f.put("model", &model);
                }
            }
            Payload::BudgetExceeded(p) => {
                f.put("scope", &p.scope);
                f.put("limit", &p.limit);
                f.put("action", &p.action);
            }
            Payload::SessionRepaired(p) => {
                f.put("bytes", &p.bytes);
            }
            Payload::SessionSnapshot(p) => {
                f.put("up_to_seq", &p.up_to_seq);
                f.put("messages", &p.messages.len());
                f.put("tokens", &p.tokens);
            }
            Payload::SessionCompacted(p) => {
                f.put("up_to_seq", &p.up_to_seq);
                f.put("kept", &p.kept);
                f.put("tokens_before", &p.tokens_before);
                f.put("tokens_after", &p.tokens_after);
                f.put("fidelity", &p.fidelity);
            }
            Payload::SessionTrimmed(p) => {
                f.put("up_to_seq", &p.up_to_seq);
                f.put("dropped", &p.dropped);
            }
            // The envelope of a sealed event keeps the facets of its clear payload.
            Payload::Sealed(_) => {}
        }
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
