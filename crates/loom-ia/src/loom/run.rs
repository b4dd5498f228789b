//! Running: opening a run, driving it to its end or a pause, observing and streaming it,
//! resuming it, and background submission.

use super::{DEFAULT_TENANT, Loom, RunOptions, StreamItem};
use crate::{LoomError, RunResult};
use futures_util::StreamExt;
use loom_core::approval::Approver;
use loom_core::{BoxStream, Event, Message, Payload, RunStatus, queue::JobKind};
use loom_engine::{AgentRuntime, BeginRun, Observer, RunRef};
use std::sync::Arc;

impl Loom {
    /// What opens a run: the tenant (declared, allowed to use the agent), the caller's
    /// judge mode (`skip` refused in `prod`), the resolved agent and the engine's request.
    pub(super) fn opening(
        &self,
        agent: &str,
        message: String,
        options: RunOptions,
    ) -> Result<(Arc<AgentRuntime>, BeginRun), LoomError> {
        crate::limits::check_run(&message, &options)?;
        let tenant = options
            .tenant_id
            .clone()
            .unwrap_or_else(|| DEFAULT_TENANT.to_owned());
        let config = &self.inner.config;
        config
            .check_tenant(&tenant)
            .map_err(|e| LoomError::Refused(e.to_string()))?;
        if let Some(spec) = config.tenant(&tenant)
            && !spec.allows_agent(agent)
        {
            return Err(LoomError::AgentNotAllowed {
                tenant,
                agent: agent.to_owned(),
            });
        }
        options
            .judges
            .check(config.profile().map(|p| p.as_str()))
            .map_err(|e| LoomError::Refused(e.to_string()))?;
        let runtime = self.agent(agent, &tenant)?;
        let begin = BeginRun {
            tenant_id: tenant,
            session_id: options.session_id,
            run_id: options.run_id,
            user_id: options.user_id,
            metadata: options.metadata,
            message: Message::user(message),
            judges: options.judges,
            budget: options.budget,
            attachments: options.attachments,
            trigger: options.trigger,
            state: options.state,
        };
        Ok((runtime, begin))
    }

    /// Runs `agent` on `message` until the run closes, and returns its result. A run that
    /// fails is a result with status `failed`, not an error. With a job queue
    /// (`storage.queue: rabbitmq`) a worker drives it and this process follows the journal
    /// until it closes or waits for a decision (driven here when the queue cannot take it, or
    /// when [`RunOptions::approver`] decides inline).
    pub async fn run(
        &self,
        agent: &str,
        message: impl Into<String>,
        options: RunOptions,
    ) -> Result<RunResult, LoomError> {
        self.run_observed(agent, message, options, &()).await
    }

    /// Like [`Loom::run`], telling `observer` about each event and text delta as they happen.
    pub async fn run_observed(
        &self,
        agent: &str,
        message: impl Into<String>,
        options: RunOptions,
        observer: &dyn Observer,
    ) -> Result<RunResult, LoomError> {
        let approver = options.approver.clone();
        let (runtime, begin) = self.opening(agent, message.into(), options)?;
        let run = self.open_run(&runtime, begin, observer).await?;
        // With a job queue a worker drives it (an inline approver lives here: driven here).
        if approver.is_none() {
            match self.enqueue_run(JobKind::Run, &run).await {
                Ok(true) => return self.settled(&run, observer).await,
                Ok(false) => {}
                Err(error) => tracing::warn!(
                    run_id = %run.run_id,
                    %error,
                    "the job queue did not take the run: driven in this process"
                ),
            }
        }
        self.drive_approved(&run, &runtime, observer, approver)
            .await
    }

    /// Follows `run`, driven by another process (a worker), until it closes or waits (paused,
    /// or waiting for sub-runs that are), telling `observer` about each event; its result.
    pub(super) async fn settled(
        &self,
        run: &RunRef,
        observer: &dyn Observer,
    ) -> Result<RunResult, LoomError> {
        let after = self.events(run).await?.last().map_or(0, |e| e.seq);
        let mut events = self.follow(run, after);
        while let Some(event) = events.next().await {
            let event = event?;
            observer.event(&event);
            let waits = event.run_id == run.run_id
                && matches!(
                    &event.payload,
                    Payload::RunTransitioned(t)
                        if matches!(t.to_state, RunStatus::Paused | RunStatus::WaitingChild)
                );
            if waits {
                break;
            }
        }
        self.result(run).await
    }

    /// Drives a run again from its journal (after a crash, or a stop): it continues exactly
    /// where the journal ends. A closed run is returned as it is.
    pub async fn resume(&self, run: &RunRef) -> Result<RunResult, LoomError> {
        self.resume_observed(run, &()).await
    }

    /// Like [`Loom::resume`], telling `observer` about each event and text delta as they happen.
    pub async fn resume_observed(
        &self,
        run: &RunRef,
        observer: &dyn Observer,
    ) -> Result<RunResult, LoomError> {
        let state = self.state(run).await?;
        if let Some(parent) = &state.parent_run_id {
            return Err(LoomError::Refused(format!(
                "run {} is a sub-run of {parent}: resume its root run {}, which drives it",
                run.run_id, state.root_run_id
            )));
        }
        let agent = state
            .agent
            .clone()
            .ok_or_else(|| LoomError::UnknownRun(run.run_id.clone()))?;
        let runtime = self.agent(&agent, &run.tenant_id)?;
        self.drive(run, &runtime, observer).await
    }

    pub(super) async fn drive(
        &self,
        run: &RunRef,
        runtime: &AgentRuntime,
        observer: &dyn Observer,
    ) -> Result<RunResult, LoomError> {
        self.drive_approved(run, runtime, observer, None).await
    }

    pub(super) async fn drive_approved(
        &self,
        run: &RunRef,
        runtime: &AgentRuntime,
        observer: &dyn Observer,
        approver: Option<Arc<dyn Approver>>,
    ) -> Result<RunResult, LoomError> {
        // A cancellation from another process reaches this drive through the bus.
        self.listen();
        let token = loom_engine::Cancel::new();
        {
            let mut active =
                self.inner.active.lock().map_err(|_| {
                    LoomError::Conflict("the table of active runs is unusable".into())
                })?;
            if active.contains_key(run) {
                return Err(LoomError::Conflict(format!(
                    "run {} is already being driven by this process",
                    run.run_id
                )));
            }
            active.insert(run.clone(), token.clone());
        }
        // Also when this future is dropped mid-drive (a caller that gave up): the run is then
        // driven nowhere, and the lease sweep or a resume can take it.
        // The journal's seq before this drive: its trace export covers what it writes.
        let exported_after = match &self.inner.telemetry {
            Some(_) => self
                .inner
                .engine
                .store()
                .last_seq(&run.tenant_id, &run.session_id)
                .await
                .unwrap_or(0),
            None => 0,
        };
        let driving = Driving { loom: self, run };
        let observer = super::live::Publishing {
            observer,
            run,
            live: &self.inner.live,
        };
        let outcome = self
            .inner
            .engine
            .drive_with(run, runtime, &observer, &token, approver)
            .await;
        drop(driving);
        let state = outcome?;
        if state.finished && state.parent_run_id.is_none() && state.kind == "normal" {
            self.after_run(run, state.status).await;
        }
        let waits = matches!(
            state.status,
            loom_core::RunStatus::Paused | loom_core::RunStatus::WaitingChild
        );
        // A root run that closed or waits for a decision: its trace so far leaves the process.
        if let Some(telemetry) = &self.inner.telemetry
            && state.parent_run_id.is_none()
            && (state.finished || waits)
        {
            telemetry.export(self, run, exported_after).await;
        }
        if self.is_stopping() && !state.finished && !waits {
            return Err(LoomError::Interrupted(run.clone()));
        }
        self.result(run).await
    }

    /// Runs `agent` in the background and streams what happens: events once durable, text
    /// deltas as the model writes, then [`StreamItem::Finished`].
    pub fn stream(
        &self,
        agent: &str,
        message: impl Into<String>,
        options: RunOptions,
    ) -> BoxStream<'static, Result<StreamItem, LoomError>> {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let loom = self.clone();
        let agent = agent.to_owned();
        let message = message.into();
        tokio::spawn(async move {
            let observer = ChannelObserver(sender.clone());
            let outcome = loom.run_observed(&agent, message, options, &observer).await;
            let _ = sender.send(outcome.map(|result| StreamItem::Finished(Box::new(result))));
        });
        Box::pin(futures_util::stream::unfold(
            receiver,
            |mut receiver| async move { receiver.recv().await.map(|item| (item, receiver)) },
        ))
    }

    /// Starts a run in the background and returns as soon as it is journaled: the run can be
    /// followed (`events`, `result`), steered and cancelled while it goes on. With a job queue
    /// (`storage.queue: rabbitmq`) it is handed to the queue, and a `loom worker` drives it.
    pub async fn submit(
        &self,
        agent: &str,
        message: impl Into<String>,
        options: RunOptions,
    ) -> Result<RunRef, LoomError> {
        let (runtime, begin) = self.opening(agent, message.into(), options)?;
        let run = self.open_run(&runtime, begin, &()).await?;
        self.start_background(run.clone(), runtime).await;
        Ok(run)
    }

    pub(crate) fn spawn_drive(&self, run: RunRef, runtime: Arc<AgentRuntime>) {
        let loom = self.clone();
        tokio::spawn(async move {
            match loom.drive(&run, &runtime, &()).await {
                Ok(_) => {}
                Err(LoomError::Interrupted(_)) => {
                    tracing::info!(run_id = %run.run_id, "background run interrupted: it resumes at the next start");
                }
                Err(LoomError::Conflict(reason)) => {
                    // Another driver holds it (it took it first): not this process's to drive.
                    tracing::info!(run_id = %run.run_id, %reason, "background run left to its driver");
                }
                Err(error) => {
                    tracing::warn!(run_id = %run.run_id, %error, "background run stopped");
                }
            }
        });
    }
}

struct ChannelObserver(tokio::sync::mpsc::UnboundedSender<Result<StreamItem, LoomError>>);

impl Observer for ChannelObserver {
    fn event(&self, event: &Event) {
        let _ = self.0.send(Ok(StreamItem::Event(Box::new(event.clone()))));
    }

    fn text_delta(&self, run_id: &str, text: &str) {
        let _ = self.0.send(Ok(StreamItem::TextDelta {
            run_id: run_id.to_owned(),
            text: text.to_owned(),
        }));
    }
}

/// A run this instance drives: leaves the table of active runs when dropped, however the
/// drive ends (returned, failed, or its future dropped), and wakes who waits on that table.
struct Driving<'a> {
    loom: &'a Loom,
    run: &'a RunRef,
}

impl Drop for Driving<'_> {
    fn drop(&mut self) {
        if let Ok(mut active) = self.loom.inner.active.lock() {
            active.remove(self.run);
        }
        self.loom.inner.idle.notify_waiters();
    }
}
