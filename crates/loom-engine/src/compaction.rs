//! Compaction of a session's history ([`Engine::compact`]) and the history a run is sent
//! within its caps (`history`).
//!
//! A compaction summarizes the turns before the last `keep_last` successful ones
//! ([`loom_core::state::compaction::plan`]) with the internal agent `_compaction` (no tools,
//! one iteration, its own system prompt): a `kind: compaction` run in the same session, whose
//! `run.started.triggered_by` names the run that triggered it, journaled like any run. Its
//! final output goes through the fidelity guard ([`crate::fidelity`]): once it passes (or when
//! the check is off), `session.compacted` is written and the summary replaces the turns in the
//! history of every later run. When the summary misses markers after its one retry, the run
//! fails with `guard.fidelity` and nothing replaces the turns: the originals are kept (where
//! the reference keeps the bad summary with a warning).

use std::sync::Arc;

use loom_core::{
    BlockKind, Event, Message, Role, RunStatus,
    event::{Payload, RunContext, RunStarted, SessionCompacted, SessionTrimmed},
    state::compaction::{self, Caps, Plan, Trim, TurnGroup},
};

use crate::{
    agent::AgentRuntime,
    binding::ModelBinding,
    cancel::Cancel,
    engine::Engine,
    error::EngineError,
    events::RunRef,
    fidelity::{FIDELITY, Fidelity},
    observer::Observer,
    window::Window,
    writer::{Attempt, Reading, append_fresh},
};

/// The internal agent that writes compaction summaries.
pub const COMPACTION_AGENT: &str = "_compaction";

/// The summarizer's system prompt when `sessions.compaction.system_file` gives none.
pub const COMPACTION_SYSTEM: &str = "You summarize the earlier part of a conversation between \
a user and an assistant, so that the conversation can go on from your summary alone. Keep every \
fact the assistant may need later: who the user is, what was asked and answered, the decisions \
taken and what remains to do. Copy every amount, number, date, reference and e-mail address \
exactly as written. Write only the summary, in the language of the conversation, without a \
preamble.";

/// What compacting a session needs (`sessions.compaction`).
#[derive(Debug, Clone)]
pub struct Compactor {
    /// The `_compaction` agent: the summarizer's model and system prompt, no tools, one
    /// iteration.
    pub agent: AgentRuntime,
    /// Successful turns kept verbatim after the summary.
    pub keep_last: u32,
    /// Whether the summary goes through the fidelity check.
    pub fidelity_check: bool,
}

impl Compactor {
    /// The `_compaction` agent on `model`, with `system` (or [`COMPACTION_SYSTEM`]).
    pub fn new(
        model: ModelBinding,
        system: Option<String>,
        keep_last: u32,
        fidelity_check: bool,
    ) -> Compactor {
        let mut agent = AgentRuntime::new(
            COMPACTION_AGENT,
            system.unwrap_or_else(|| COMPACTION_SYSTEM.to_owned()),
            model,
        );
        agent.max_iterations = 1;
        Compactor {
            agent,
            keep_last,
            fidelity_check,
        }
    }
}

/// What a compaction did.
#[derive(Debug, Clone, PartialEq)]
pub enum Compaction {
    /// Nothing to summarize (too few turns, nothing new, or a compaction already running).
    Nothing,
    /// The summary replaces the turns (`session.compacted`).
    Applied(SessionCompacted),
    /// The summary left out markers of the originals, after one retry: the turns are kept.
    Kept {
        /// The compaction run.
        run_id: String,
        /// The markers the summary left out.
        missing: Vec<String>,
    },
    /// The summarizer's run did not complete (a model error, a cancellation): the turns are
    /// kept.
    Failed {
        /// The compaction run.
        run_id: String,
        /// Why.
        error: String,
    },
}

impl Engine {
    /// Sets the caps on the history a run is sent (`sessions.history`, and `hard_tokens` as
    /// the last resort of a compacting session); none by default.
    pub fn with_history_caps(mut self, caps: Caps) -> Engine {
        self.history_caps = caps;
        self
    }

    /// The caps on the history a run is sent.
    pub fn history_caps(&self) -> Caps {
        self.history_caps
    }

    /// The turns of the history the next run of the session would be sent, before caps (the
    /// latest compaction applied), read from the session's last snapshot on.
    pub async fn history_groups(
        &self,
        tenant_id: &str,
        session_id: &str,
    ) -> Result<Vec<TurnGroup>, EngineError> {
        Window::latest(self.store.as_ref(), tenant_id, session_id)
            .await?
            .groups_before("")
    }

    /// Estimated tokens of the history the next run of the session would be sent, before caps.
    pub async fn history_tokens(
        &self,
        tenant_id: &str,
        session_id: &str,
    ) -> Result<u64, EngineError> {
        let groups = self.history_groups(tenant_id, session_id).await?;
        Ok(compaction::groups_tokens(&groups))
    }

    /// Compacts the session's history: the turns before the last `keep_last` successful ones
    /// are summarized by a `kind: compaction` run of `compactor.agent` (`triggered_by` names
    /// the run that asked), checked for fidelity, then `session.compacted` replaces them. See
    /// the module documentation for what happens when the check fails.
    pub async fn compact(
        &self,
        tenant_id: &str,
        session_id: &str,
        compactor: &Compactor,
        triggered_by: Option<&str>,
        observer: &dyn Observer,
    ) -> Result<Compaction, EngineError> {
        // From the last snapshot: an open compaction run is never before it.
        let mut window = Window::latest(self.store.as_ref(), tenant_id, session_id).await?;
        let (live, stale) = self.open_compactions(&window.events)?;
        if live {
            return Ok(Compaction::Nothing);
        }
        if !stale.is_empty() {
            // An interrupted compaction (its process died) is closed before another begins.
            for run_id in stale {
                let run = RunRef {
                    tenant_id: tenant_id.to_owned(),
                    session_id: session_id.to_owned(),
                    run_id,
                };
                self.cancel_idle(&run, COMPACTION_AGENT, Some(COMPACTION_AGENT.into()))
                    .await?;
            }
            window = Window::latest(self.store.as_ref(), tenant_id, session_id).await?;
        }
        let groups = window.groups_before("")?;
        let Some(plan) = compaction::plan(&groups, compactor.keep_last) else {
            return Ok(Compaction::Nothing);
        };
        let (transcript, originals) = transcript(&plan.segment);
        let run = RunRef {
            tenant_id: tenant_id.to_owned(),
            session_id: session_id.to_owned(),
            run_id: self.ids.uuid(),
        };
        self.open_compaction(&run, triggered_by, transcript, observer)
            .await?;
        let mut agent = compactor.agent.clone();
        let fidelity = Fidelity::of(&originals);
        if compactor.fidelity_check {
            agent.fidelity = Some(fidelity.clone());
        }
        tracing::debug!(%session_id, run_id = %run.run_id, up_to_seq = plan.up_to_seq, "compacting the session");
        let state = self
            .drive_with(&run, &agent, observer, Cancel::new(), None)
            .await?;
        let summary = state.output_text().unwrap_or_default();
        match state.status {
            RunStatus::Completed if !summary.trim().is_empty() => {
                let compacted = SessionCompacted {
                    up_to_seq: plan.up_to_seq,
                    tokens_after: plan.tokens_kept
                        + compaction::estimate_tokens(&[compaction::summary_message(&summary)]),
                    summary,
                    kept: plan.kept,
                    tokens_before: plan.tokens_before,
                    cost_usd: state.cost_usd,
                    fidelity: if compactor.fidelity_check {
                        "ok"
                    } else {
                        "skipped"
                    }
                    .into(),
                    run_id: Some(run.run_id.clone()),
                    missing: Vec::new(),
                };
                self.write_compacted(&run, &plan, &compacted, observer)
                    .await?;
                // The history changed shape: the next run reads it from a snapshot.
                if let Err(error) = self.snapshot_if_due(&run).await {
                    tracing::warn!(%session_id, %error, "session snapshot not written");
                }
                Ok(Compaction::Applied(compacted))
            }
            RunStatus::Failed if state.error_type.as_deref() == Some("guard.fidelity") => {
                let last = state
                    .messages
                    .iter()
                    .rev()
                    .find(|m| m.role == Role::Assistant)
                    .map(Message::text)
                    .unwrap_or_default();
                let missing = fidelity.missing(&last);
                tracing::warn!(%session_id, run_id = %run.run_id, missing = %missing.join(", "), "compaction summary refused by {FIDELITY}: the original turns are kept");
                Ok(Compaction::Kept {
                    run_id: run.run_id,
                    missing,
                })
            }
            status => Ok(Compaction::Failed {
                run_id: run.run_id,
                error: state
                    .error
                    .clone()
                    .unwrap_or_else(|| format!("the summarizer's run ended {status}")),
            }),
        }
    }

    /// Writes the opening of a compaction run: `run.started` (`kind: compaction`) and the
    /// request holding the turns to summarize.
    async fn open_compaction(
        &self,
        run: &RunRef,
        triggered_by: Option<&str>,
        transcript: String,
        observer: &dyn Observer,
    ) -> Result<(), EngineError> {
        let events = self.events(run, COMPACTION_AGENT, &run.run_id);
        let span = self.ids.uuid();
        let opening = vec![
            events.event(
                &span,
                None,
                None,
                Payload::RunStarted(RunStarted {
                    kind: "compaction".into(),
                    context: RunContext {
                        tenant_id: run.tenant_id.clone(),
                        user_id: None,
                        metadata: Default::default(),
                    },
                    parent_run_id: None,
                    parent_call_id: None,
                    depth: 0,
                    triggered_by: triggered_by.map(str::to_owned),
                    trigger: None,
                    judges: "auto".into(),
                    budget: None,
                    state: Default::default(),
                }),
            ),
            events.event(
                &span,
                None,
                None,
                Payload::MessageUser(loom_core::event::MessageUser {
                    message: Message::user(format!(
                        "Summarize the earlier exchanges of this conversation below, so that it \
                         can go on from your summary alone.\n\n<exchanges>\n{transcript}\n\
                         </exchanges>"
                    )),
                    kind: "request".into(),
                    policy: None,
                    tools: false,
                }),
            ),
        ];
        let ((), written) = append_fresh(self.store.as_ref(), run, Reading::Latest, |_| {
            Ok(Attempt::Write(opening.clone(), ()))
        })
        .await?;
        for event in &written {
            observer.event(event);
        }
        Ok(())
    }

    /// Writes `session.compacted`, unless a compaction covering as much was written meanwhile.
    async fn write_compacted(
        &self,
        run: &RunRef,
        plan: &Plan,
        compacted: &SessionCompacted,
        observer: &dyn Observer,
    ) -> Result<(), EngineError> {
        let events = self.events(run, COMPACTION_AGENT, &run.run_id);
        let ((), written) = append_fresh(self.store.as_ref(), run, Reading::Run(run), |journal| {
            let covered = compaction::latest_compaction(journal)
                .is_some_and(|c| c.up_to_seq >= plan.up_to_seq);
            if covered {
                return Ok(Attempt::Done(()));
            }
            let state = loom_core::RunState::fold(&run.run_id, journal)?;
            let event = events.decision(&state, Payload::SessionCompacted(compacted.clone()));
            Ok(Attempt::Write(vec![event], ()))
        })
        .await?;
        for event in &written {
            observer.event(event);
        }
        Ok(())
    }
}

impl Engine {
    /// Whether a compaction run of the session is being driven (its lease is live, or it was
    /// opened less than a lease ago), and the open ones that are not (interrupted).
    fn open_compactions(&self, events: &[Arc<Event>]) -> Result<(bool, Vec<String>), EngineError> {
        let now = self.clock.now();
        let lease = chrono::Duration::from_std(self.lease).unwrap_or(chrono::Duration::MAX);
        let mut live = false;
        let mut stale = Vec::new();
        for event in events {
            if let Payload::RunStarted(started) = &event.payload
                && started.kind == "compaction"
            {
                let state = loom_core::RunState::fold(&event.run_id, events)?;
                if state.finished {
                    continue;
                }
                let driven = match &state.claim {
                    Some(claim) => claim.lease_until > now,
                    None => state
                        .updated_at
                        .checked_add_signed(lease)
                        .is_none_or(|until| until > now),
                };
                if driven {
                    live = true;
                } else {
                    stale.push(event.run_id.clone());
                }
            }
        }
        Ok((live, stale))
    }
}

/// The turns to summarize as the summarizer reads them, and the text their markers are taken
/// from (what was said and returned, not the arguments of tool calls).
fn transcript(segment: &[TurnGroup]) -> (String, String) {
    let mut lines = Vec::new();
    let mut said = Vec::new();
    for group in segment {
        let mut names = std::collections::BTreeMap::new();
        for message in &group.messages {
            let text = message.text();
            match message.role {
                Role::User if group.summary => {
                    let summary = text
                        .strip_prefix(compaction::SUMMARY_PREFIX)
                        .unwrap_or(&text)
                        .trim()
                        .to_owned();
                    lines.push(format!("Summary of what came before: {summary}"));
                    said.push(summary);
                }
                Role::User => {
                    lines.push(format!("User: {text}"));
                    said.push(text);
                }
                Role::Assistant => {
                    if !text.trim().is_empty() {
                        lines.push(format!("Assistant: {text}"));
                        said.push(text);
                    }
                    for (call_id, name, arguments) in message.tool_calls() {
                        names.insert(call_id.to_owned(), name.to_owned());
                        lines.push(format!("Assistant called {name} with {arguments}"));
                    }
                }
                Role::Tool => {
                    for block in &message.blocks {
                        if let BlockKind::ToolResult { call_id, output } = &block.kind {
                            let name = names.get(call_id).map_or("a tool", String::as_str);
                            let result = output.visible_text();
                            lines.push(format!("Result of {name}: {result}"));
                            said.push(result);
                        }
                    }
                }
            }
        }
    }
    (lines.join("\n"), said.join("\n"))
}

/// The history a root run is sent: the session's turns before it (the latest compaction
/// applied, see [`Window::groups_before`]), within `caps`; and what the caps left out.
pub(crate) fn history(groups: Vec<TurnGroup>, caps: Caps) -> (Vec<Message>, Option<Trim>) {
    let (kept, trim) = compaction::cap(groups, caps);
    (compaction::flatten(kept), trim)
}

/// The `session.trimmed` of a cut history.
pub(crate) fn trimmed(trim: &Trim) -> Payload {
    Payload::SessionTrimmed(SessionTrimmed {
        up_to_seq: trim.up_to_seq,
        dropped: trim.dropped,
        reason: trim.reason.clone(),
    })
}

/// Whether `run_id` already journaled its `session.trimmed` (once per run).
pub(crate) fn already_trimmed<E: std::borrow::Borrow<Event>>(journal: &[E], run_id: &str) -> bool {
    journal
        .iter()
        .map(std::borrow::Borrow::borrow)
        .any(|e| e.run_id == run_id && matches!(e.payload, Payload::SessionTrimmed(_)))
}
