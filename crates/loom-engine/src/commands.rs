//! What callers ask of the engine outside the loop: open a run.

use serde_json::{Map, Value};

use loom_core::Message;

use crate::{attachments::Attachment, judges::JudgeMode};

/// A request to open a run.
#[derive(Debug, Clone)]
pub struct BeginRun {
    /// Tenant.
    pub tenant_id: String,
    /// Session to continue (its conversation is re-read); `None` = the run is its own session.
    pub session_id: Option<String>,
    /// Chosen run id; `None` = a new UUIDv7.
    pub run_id: Option<String>,
    /// End user.
    pub user_id: Option<String>,
    /// Caller metadata.
    pub metadata: Map<String, Value>,
    /// The user's message.
    pub message: Message,
    /// How the agent's judges run (`run.started.judges`).
    pub judges: JudgeMode,
    /// Limits of this run, journaled in `run.started.budget`; they tighten the agent's run
    /// limits key by key.
    pub budget: Option<loom_core::event::RunBudget>,
    /// Files attached to the request (checked against [`Engine::attachment_limits`], stored in
    /// the artifact store, referenced by `artifact` blocks after the message's own blocks).
    pub attachments: Vec<Attachment>,
    /// The trigger (webhook) that opened the run, journaled in `run.started.trigger`.
    pub trigger: Option<String>,
}
