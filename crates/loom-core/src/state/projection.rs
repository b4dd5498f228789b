//! The projection of a run's life cycle: [`RunState::fold`], [`RunState::start`] and
//! [`RunState::apply`], which dispatches each event by family, keeps the order of the state
//! machine (transitions, closing events, nothing after the close) and records claims, steps,
//! failures, guards, budgets and offloaded artifacts.

use crate::{
    event::{Event, Payload},
    usage::Usage,
};

use super::{Claim, FoldError, ProjectionError, RunState, RunStatus};

impl RunState {
    /// Folds a run's events (other runs' events are skipped).
    /// The events may be owned or shared (`Arc<Event>`).
    pub fn fold<'a, E: std::borrow::Borrow<Event> + 'a>(
        run_id: &str,
        events: impl IntoIterator<Item = &'a E>,
    ) -> Result<RunState, FoldError> {
        let mut state: Option<RunState> = None;
        for event in events {
            let event = event.borrow();
            if event.run_id != run_id {
                continue;
            }
            match &mut state {
                None => state = Some(RunState::start(event)?),
                Some(state) => state.apply(event)?,
            }
        }
        state.ok_or(FoldError::Unknown(run_id.to_owned()))
    }

    /// A fresh state from the run's first event, which must be `run.started`.
    pub fn start(event: &Event) -> Result<RunState, ProjectionError> {
        let Payload::RunStarted(started) = &event.payload else {
            return Err(error(event, "the first event of a run must be run.started"));
        };
        Ok(RunState {
            run_id: event.run_id.clone(),
            session_id: event.session_id.clone(),
            tenant_id: event.tenant_id.clone(),
            root_run_id: event.root_run_id.clone(),
            run_span_id: event.span_id.clone(),
            parent_run_id: started.parent_run_id.clone(),
            depth: started.depth,
            agent: event.agent.clone(),
            kind: started.kind.clone(),
            status: RunStatus::ReadyForModel,
            step: 0,
            active_ms: 0.0,
            iterations: 0,
            messages: Vec::new(),
            pending_calls: Vec::new(),
            usage: Usage::default(),
            cost_usd: 0.0,
            model_calls: 0,
            output: None,
            output_data: None,
            error_type: None,
            error: None,
            claim: None,
            finished: false,
            offloaded: Vec::new(),
            approvals: Vec::new(),
            steering: Vec::new(),
            models: std::collections::BTreeMap::new(),
            pending_repair: None,
            retries: std::collections::BTreeMap::new(),
            repair_without_tools: false,
            replaced_output: None,
            unverified: false,
            fallback: false,
            exceeded: std::collections::BTreeSet::new(),
            judges: started.judges.clone(),
            budget: started.budget.clone(),
            parent_call_id: started.parent_call_id.clone(),
            tools_called: Vec::new(),
            amendments: Vec::new(),
            priced_calls: std::collections::BTreeSet::new(),
            last_seq: event.seq,
            started_at: event.ts,
            updated_at: event.ts,
        })
    }

    /// Applies one event of this run.
    pub fn apply(&mut self, event: &Event) -> Result<(), ProjectionError> {
        // A line set aside and replaced (`session.repaired`) says nothing about the run.
        if matches!(event.payload, Payload::SessionRepaired(_)) {
            return Ok(());
        }
        self.apply_payload(event)?;
        self.last_seq = event.seq;
        self.updated_at = event.ts;
        Ok(())
    }

    fn apply_payload(&mut self, event: &Event) -> Result<(), ProjectionError> {
        if event.run_id != self.run_id {
            return Err(error(event, "event of another run"));
        }
        if let Payload::RunClaimed(claim) = &event.payload {
            self.claim = Some(Claim {
                worker_id: claim.worker_id.clone(),
                lease_until: claim.lease_until,
            });
            return Ok(());
        }
        // Session events (snapshots, compaction) say nothing of the run that wrote them, and
        // may come after it closed.
        if matches!(
            &event.payload,
            Payload::SessionSnapshot(_) | Payload::SessionCompacted(_) | Payload::SessionTrimmed(_)
        ) {
            return Ok(());
        }
        // A decision that arrives after the run closed (cancelled meanwhile) changes nothing.
        if (self.finished || self.status.is_terminal())
            && matches!(
                &event.payload,
                Payload::ApprovalGranted(_) | Payload::ApprovalRejected(_)
            )
        {
            return Ok(());
        }
        self.check_order(event)?;
        match &event.payload {
            Payload::RunStarted(_) => return Err(error(event, "duplicate run.started")),
            Payload::StepStarted(step) => self.step = step.step_no,
            Payload::StepCompleted(step) => self.active_ms += step.duration_ms,
            Payload::MessageUser(user) => self.apply_user(user),
            Payload::ModelResponded(response) => self.apply_response(response),
            Payload::ModelRetried(retried) => {
                if let Some(usage) = &retried.usage {
                    self.usage.add(usage);
                }
                self.cost_usd += retried.cost_usd;
            }
            Payload::ModelFellBack(fell_back) => {
                self.models
                    .insert(fell_back.slot.clone(), fell_back.to_model.clone());
            }
            Payload::ToolCalled(called) => self.apply_called(event, called)?,
            Payload::ToolCompleted(completed) => self.apply_completed(event, completed)?,
            Payload::RunTransitioned(transition) => {
                if transition.from_state != self.status {
                    return Err(error(
                        event,
                        &format!(
                            "transition from {} while the run is {}",
                            transition.from_state, self.status
                        ),
                    ));
                }
                self.status = transition.to_state;
            }
            Payload::RunCompleted(completed) => self.apply_completion(completed),
            Payload::RunFailed(failed) => {
                self.error_type = Some(failed.error_type.clone());
                self.error = Some(failed.error.clone());
                self.finished = true;
            }
            Payload::RunCancelled(_) => self.finished = true,
            Payload::PolicyDecided(decided) => self.apply_decision(event, decided)?,
            Payload::GuardChecked(checked) => {
                if checked.target == "output" && checked.outcome == "failed" {
                    match checked.resolution.as_deref() {
                        Some("unverified") => self.unverified = true,
                        Some("fallback") => self.fallback = true,
                        _ => {}
                    }
                }
            }
            Payload::BudgetExceeded(exceeded) => {
                self.exceeded
                    .insert(format!("{}.{}", exceeded.scope, exceeded.limit));
            }
            Payload::ArtifactStored(stored) => {
                if stored.origin == "offload" {
                    self.offloaded.push(stored.uri.clone());
                }
            }
            Payload::ApprovalRequested(requested) => self.apply_request(event, requested)?,
            Payload::ApprovalGranted(_)
            | Payload::ApprovalRejected(_)
            | Payload::ApprovalExpired(_) => self.apply_approval_decision(event)?,
            Payload::Sealed(_) => {
                return Err(error(
                    event,
                    "sealed payload that was not opened (a journal sealed with storage.encryption \
                     is read through the sealing journal of the `crypto` feature)",
                ));
            }
            Payload::RunClaimed(_)
            | Payload::JudgeEvaluated(_)
            | Payload::ToolSourceUnavailable(_)
            | Payload::ToolSourceOpened(_)
            | Payload::CircuitOpened(_)
            | Payload::ModelExchanged(_)
            | Payload::IdempotencyRecorded(_)
            | Payload::IdempotencyReused(_)
            | Payload::SessionRepaired(_)
            | Payload::SessionSnapshot(_)
            | Payload::SessionCompacted(_)
            | Payload::SessionTrimmed(_) => {}
        }
        Ok(())
    }

    /// Refuses an event the state machine does not allow now: anything after the closing
    /// event, a closing event before a terminal transition, anything but the closing event
    /// after a terminal transition.
    fn check_order(&self, event: &Event) -> Result<(), ProjectionError> {
        if self.finished {
            return Err(error(
                event,
                &format!("event after the run closed in state {}", self.status),
            ));
        }
        if event.payload.is_closing() && !self.status.is_terminal() {
            return Err(error(
                event,
                &format!(
                    "closing event while the run is {} (a terminal transition must come first)",
                    self.status
                ),
            ));
        }
        if self.status.is_terminal() && !closes(self.status, &event.payload) {
            return Err(error(
                event,
                &format!("event after the state {}", self.status),
            ));
        }
        Ok(())
    }
}

fn closes(status: RunStatus, payload: &Payload) -> bool {
    matches!(
        (status, payload),
        (RunStatus::Completed, Payload::RunCompleted(_))
            | (RunStatus::Failed, Payload::RunFailed(_))
            | (RunStatus::Cancelled, Payload::RunCancelled(_))
    )
}

pub(super) fn error(event: &Event, reason: &str) -> ProjectionError {
    ProjectionError {
        run_id: event.run_id.clone(),
        event_id: event.event_id.clone(),
        seq: event.seq,
        event_type: event.event_type.clone(),
        reason: reason.to_owned(),
    }
}
