//! Control of a run: approve or reject a paused call, steer, cancel.

use super::{Decided, Loom};
use crate::LoomError;
use loom_core::Message;
use loom_core::approval::Decision;
use loom_core::bus::Signal;
use loom_core::queue::JobKind;
use loom_engine::RunRef;
use serde_json::Value;
use std::collections::HashMap;

impl Loom {
    /// Grants the approval requests of a paused run, or of the sub-runs a run waits for (a
    /// root run answers for its tree): the request of `call_id`, or every waiting one. `by` and `reason` are journaled; corrected `arguments` (with `call_id`
    /// only; checked against the tool's schema) are what the tool receives, while the
    /// journal's `tool.called` keeps the model's. Works from any process. Unless `no_wait`,
    /// the run is then driven on (until it closes or pauses again): here, or, with a job
    /// queue (`storage.queue: rabbitmq`), by a worker while this process follows it.
    ///
    /// Refused ([`LoomError::Refused`]) when nothing waits for a decision, the call has no
    /// waiting request, its request expired, or the arguments are unusable; and
    /// ([`LoomError::Invalid`], nothing written) when `by`, `reason` or `arguments` pass their
    /// bounds ([`loom_core::limits`]: 64 levels, sizes).
    pub async fn approve(
        &self,
        run: &RunRef,
        call_id: Option<&str>,
        by: &str,
        reason: Option<&str>,
        arguments: Option<Value>,
        no_wait: bool,
    ) -> Result<Decided, LoomError> {
        crate::limits::check_decision(by, reason, arguments.as_ref())?;
        let decision = Decision::Approved {
            by: by.to_owned(),
            reason: reason.map(str::to_owned),
            arguments,
        };
        self.decide(run, call_id, decision, no_wait).await
    }

    /// Rejects the approval requests of a paused run (the request of `call_id`, or every
    /// waiting one): the model receives each call's error result with `reason`. Unless
    /// `no_wait`, the run is then driven on. Refused like [`Loom::approve`].
    pub async fn reject(
        &self,
        run: &RunRef,
        call_id: Option<&str>,
        by: &str,
        reason: Option<&str>,
        no_wait: bool,
    ) -> Result<Decided, LoomError> {
        crate::limits::check_decision(by, reason, None)?;
        let decision = Decision::Rejected {
            by: by.to_owned(),
            reason: reason.map(str::to_owned),
        };
        self.decide(run, call_id, decision, no_wait).await
    }

    pub(super) async fn decide(
        &self,
        run: &RunRef,
        call_id: Option<&str>,
        decision: Decision,
        no_wait: bool,
    ) -> Result<Decided, LoomError> {
        let state = self.state(run).await?;
        let agent = state
            .agent
            .clone()
            .ok_or_else(|| LoomError::UnknownRun(run.run_id.clone()))?;
        let runtime = self.agent(&agent, &run.tenant_id)?;
        let calls = self
            .inner
            .engine
            .settle(run, &runtime, call_id, &decision)
            .await?;
        // A sub-run is driven by its root, which re-plays the call that resumes it.
        let root = RunRef {
            run_id: state.root_run_id.clone(),
            ..run.clone()
        };
        // With a job queue, a worker drives the run on, and this process follows it.
        if !no_wait && self.enqueue_run(JobKind::Resume, &root).await? {
            let result = self.settled(run, &()).await?;
            return Ok(Decided { calls, result });
        }
        let result = if no_wait {
            self.result(run).await?
        } else if root.run_id == run.run_id {
            self.drive(run, &runtime, &()).await?
        } else {
            let root_agent = self
                .state(&root)
                .await?
                .agent
                .ok_or_else(|| LoomError::UnknownRun(root.run_id.clone()))?;
            let root_runtime = self.agent(&root_agent, &root.tenant_id)?;
            self.drive(&root, &root_runtime, &()).await?
        };
        Ok(Decided { calls, result })
    }

    /// Cancels a run: a run driven by this instance stops at once (between or during steps);
    /// so does a root run another process drives, asked through the event bus
    /// (`storage.bus`: `redis` or `postgres`); another open run is closed as cancelled in its
    /// journal. Either way its `run.cancelled`
    /// records `by`, and is journaled when this returns `true` (for a run driven here, unless
    /// its step in progress ignores the cancellation for longer than
    /// `execution.shutdown_timeout`: then it is journaled when that step ends). `false` if the
    /// run had closed, or closed otherwise while the cancellation reached it.
    ///
    /// A caller that drives the run in the same task (awaiting [`Loom::run`], say) must keep
    /// polling that drive while it awaits `cancel` (`tokio::join!`), since `cancel` waits for
    /// the drive to journal the cancellation.
    pub async fn cancel(&self, run: &RunRef, by: Option<String>) -> Result<bool, LoomError> {
        crate::limits::check_by(by.as_deref())?;
        let token = self
            .inner
            .active
            .lock()
            .ok()
            .and_then(|a| a.get(run).cloned());
        if let Some(token) = token {
            token.cancel(by.clone());
            // Answer from the journal: wait until the drive has let the run go.
            if tokio::time::timeout(self.shutdown_timeout(), self.not_driven(run, &token))
                .await
                .is_err()
            {
                return Ok(true);
            }
            let state = self.state(run).await?;
            if state.finished {
                return Ok(state.status == loom_core::RunStatus::Cancelled);
            }
            // The drive let the run go without closing it (a stop at the same moment): it is
            // driven nowhere now, so it is closed here.
        } else if let Some(cancelled) = self.cancel_elsewhere(run, &by).await? {
            return Ok(cancelled);
        }
        let state = self.state(run).await?;
        let agent = state.agent.unwrap_or_default();
        Ok(self.inner.engine.cancel_idle(run, &agent, by).await?)
    }

    /// Cancels a root run that another process drives (its lease is live, and not this
    /// instance's): asks its driver through the event bus ([`Signal::Cancel`]), which cancels
    /// it at once and journals `run.cancelled` with `by`, and waits up to
    /// `execution.shutdown_timeout` for the run to close in the journal. `None` when the run is
    /// not driven elsewhere, the bus does not reach other processes (`memory`) or did not take
    /// the signal, or the driver did not close it in time (a crashed process whose lease has
    /// not run out): the caller then closes it in the journal, as a run driven nowhere. A
    /// sub-run is always closed that way, since its root's drive notices it.
    async fn cancel_elsewhere(
        &self,
        run: &RunRef,
        by: &Option<String>,
    ) -> Result<Option<bool>, LoomError> {
        if !self.inner.bus_shared {
            return Ok(None);
        }
        let mut watch = self.notices().watch(&run.tenant_id, &run.session_id);
        watch.mark_seen();
        let state = self.state(run).await?;
        let now = loom_core::ports::Clock::now(&crate::SystemClock);
        let elsewhere = state
            .claim
            .as_ref()
            .is_some_and(|claim| claim.lease_until > now && claim.worker_id != self.worker_id());
        if state.finished
            || state.status.is_terminal()
            || state.parent_run_id.is_some()
            || !elsewhere
        {
            return Ok(None);
        }
        self.listen();
        let signal = Signal::Cancel {
            tenant_id: run.tenant_id.clone(),
            session_id: run.session_id.clone(),
            run_id: run.run_id.clone(),
            by: by.clone(),
        };
        if let Err(error) = self.bus().publish(&signal).await {
            tracing::warn!(run_id = %run.run_id, %error, "the cancellation could not reach the run's driver: closing it here");
            return Ok(None);
        }
        let closed = tokio::time::timeout(self.shutdown_timeout(), async {
            loop {
                watch.mark_seen();
                let state = self.state(run).await?;
                if state.finished {
                    return Ok::<_, LoomError>(state.status == loom_core::RunStatus::Cancelled);
                }
                watch.wait(0, crate::follow::FALLBACK_PERIOD).await;
            }
        })
        .await;
        match closed {
            Ok(cancelled) => cancelled.map(Some),
            Err(_) => {
                tracing::warn!(run_id = %run.run_id, "the run's driver did not close it in time: closing it here");
                Ok(None)
            }
        }
    }

    /// Resolves once the drive that `token` cancels has let `run` go (a later drive of the
    /// same run is another one).
    pub(super) async fn not_driven(&self, run: &RunRef, token: &loom_engine::Cancel) {
        self.until_active(|active| active.get(run).is_none_or(|t| !t.is_same(token)))
            .await;
    }

    /// Resolves once the table of the runs this instance drives satisfies `done` (checked
    /// each time a run leaves it).
    pub(super) async fn until_active(
        &self,
        done: impl Fn(&HashMap<RunRef, loom_engine::Cancel>) -> bool,
    ) {
        loop {
            let notified = self.inner.idle.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.inner.active.lock().map(|a| done(&a)).unwrap_or(true) {
                return;
            }
            notified.await;
        }
    }

    /// Sends a message to a run that has not closed: it joins the conversation just before the
    /// run's next model call (never in the middle of one), as a user turn.
    pub async fn steer(&self, run: &RunRef, message: impl Into<String>) -> Result<(), LoomError> {
        let message = message.into();
        crate::limits::check_steer(&message)?;
        let state = self.state(run).await?;
        let agent = state.agent.unwrap_or_default();
        Ok(self
            .inner
            .engine
            .steer(run, &agent, Message::user(message))
            .await?)
    }

    /// Cancels every run this instance is driving (what Ctrl-C does in the CLI).
    pub fn cancel_all(&self) {
        if let Ok(active) = self.inner.active.lock() {
            for token in active.values() {
                token.cancel(None);
            }
        }
    }
}
