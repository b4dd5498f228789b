//! What a point of the loop uses to act on its run ([`Io`]): the run's events, written to the
//! journal and applied to the state; the lease, taken, renewed while the point waits, handed
//! back; the run's cancellation; its piloting time against its timeout; and the frame of a step
//! ([`StepSpan`]).
//!
//! It holds no agent, no tools and no decision: each point gets the settings it reads as its
//! own narrow context, and acts through this one.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use loom_core::{
    Event, RunState,
    event::{Effect, Outcome, Payload, RunClaimed, StepCompleted, StepStarted},
    ports::EventStore,
    state::SessionState,
};

use crate::{
    cancel::Cancel,
    error::EngineError,
    events::Events,
    names::ModelNames,
    tree,
    units::{fmt_secs, millis},
    window::Window,
    writer::SessionWriter,
};

/// How a wait for a step's effect ended.
pub(crate) enum StepEnd<T> {
    /// The effect finished.
    Done(T),
    /// The run was cancelled meanwhile.
    Cancelled,
    /// The run's timeout passed meanwhile.
    TimedOut,
}

/// The lease a driver holds on a root run (a sub-run holds none: its parent's pilot holds the
/// lease of the whole tree).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lease<'a> {
    /// This driver's worker id.
    pub(crate) worker_id: &'a str,
    /// How long a claim lasts.
    pub(crate) duration: Duration,
    /// A sub-run: no lease is taken, renewed or handed back.
    pub(crate) sub: bool,
}

/// The effects of one pilot of one run (see the module documentation).
pub(crate) struct Io<'a> {
    events: Events<'a>,
    store: &'a dyn EventStore,
    writer: SessionWriter<'a>,
    lease: Lease<'a>,
    cancel: &'a Cancel,
    /// Bound on cumulated piloting time (the agent's `timeout`).
    timeout: Option<Duration>,
    /// Time spent in decisions outside steps by this pilot (counted in the run's timeout).
    decided: Duration,
    /// The ids of the last decisive events written, for `cause_event_id`.
    pub(crate) last_ids: LastIds,
    /// Which model configs produced each provider model name in the session.
    pub(crate) names: ModelNames,
    /// When this pilot last wrote its claim, and the lease that claim gave it.
    claimed: Option<(DateTime<Utc>, Duration)>,
    /// The session's state, folded from the journal the pilot read, then from every event
    /// written or read since (this run's, and other runs' met on a conflict).
    pub(crate) session_state: SessionState,
}

/// The shortest time between two renewals of a lease (the reference renews every third of the
/// lease, at least every second).
pub(crate) const MIN_RENEWAL_PERIOD: Duration = Duration::from_secs(1);

impl<'a> Io<'a> {
    /// The effects of a pilot writing `events` with `writer`, holding `lease`, cancelled by
    /// `cancel`, bounded by `timeout`. `window` is the session as the pilot read it (the
    /// provider model names seen come with it).
    pub(crate) fn new(
        events: Events<'a>,
        store: &'a dyn EventStore,
        writer: SessionWriter<'a>,
        lease: Lease<'a>,
        cancel: &'a Cancel,
        timeout: Option<Duration>,
        window: &Window,
    ) -> Io<'a> {
        let names = window.names();
        let journal = &window.events;
        let mut last_ids = LastIds::default();
        for event in journal.iter().filter(|e| e.run_id == events.run().run_id) {
            last_ids.note(event);
        }
        Io {
            events,
            store,
            writer,
            lease,
            cancel,
            timeout,
            decided: Duration::ZERO,
            last_ids,
            names,
            claimed: None,
            session_state: SessionState::default(),
        }
    }

    /// The run's events.
    pub(crate) fn events(&self) -> Events<'a> {
        self.events
    }

    /// An event of the run in `span` (under `parent`), with the envelope `role`.
    pub(crate) fn event(
        &self,
        span: &str,
        parent: Option<&str>,
        role: Option<&str>,
        payload: Payload,
    ) -> Event {
        self.events.event(span, parent, role, payload)
    }

    /// Writes `batch`, then applies it to `state` (after the steering messages that arrived
    /// meanwhile). Closing a run whose sub-runs are open cancels them first, in the same write.
    pub(crate) async fn write(
        &mut self,
        state: &mut RunState,
        batch: Vec<Event>,
    ) -> Result<Vec<Arc<Event>>, EngineError> {
        let run = self.events.run();
        let batch = if state.pending_calls.iter().any(|c| c.child_run_id.is_some())
            && batch
                .iter()
                .any(|e| e.run_id == run.run_id && e.payload.is_closing())
        {
            let window = Window::of_run(self.store, run).await?;
            let mut closing = tree::closing(&self.events, &window.events, &run.run_id)?;
            closing.extend(batch);
            closing
        } else {
            batch
        };
        let written = self.writer.append(batch).await?;
        for event in self
            .writer
            .take_seen()
            .iter()
            .chain(written.iter().map(|e| &**e))
        {
            self.session_state.apply(event);
        }
        for event in self.writer.take_foreign() {
            state.apply(&event)?;
        }
        for event in written.iter().filter(|e| e.run_id == run.run_id) {
            state.apply(event)?;
            self.last_ids.note(event);
            self.names.note(event);
        }
        Ok(written)
    }

    /// The run's cancellation.
    pub(crate) fn cancel(&self) -> &'a Cancel {
        self.cancel
    }

    /// Why this run is cancelled, and by whom: `requested` by whoever cancelled it (its
    /// [`Cancel`]'s `by`), or for a sub-run `parent` by its parent run (its token is its
    /// parent's).
    pub(crate) fn cancel_cause(&self, state: &RunState) -> (&'static str, Option<String>) {
        match &state.parent_run_id {
            Some(parent) => ("parent", Some(parent.clone())),
            None => ("requested", self.cancel.by().map(str::to_owned)),
        }
    }

    /// The cancellation of this run: `requested`, or for a sub-run `parent`.
    pub(crate) fn cancellation(&self, state: &RunState) -> Vec<Event> {
        let (reason, by) = self.cancel_cause(state);
        self.events.cancellation(state, reason, by)
    }

    /// The run's timeout.
    pub(crate) fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Counts time spent deciding outside steps (policies, contracts, judges) in the run's
    /// piloting time (reference §3.3).
    pub(crate) fn count_decision(&mut self, spent: Duration) {
        self.decided = self.decided.saturating_add(spent);
    }

    /// Piloting time spent: the journaled steps, plus the decisions this pilot took outside
    /// steps. A step duration read from the journal is whatever it holds ([`millis`]).
    pub(crate) fn piloted(&self, state: &RunState) -> Duration {
        millis(state.active_ms).saturating_add(self.decided)
    }

    /// The time left before the run's timeout, if it has one.
    pub(crate) fn left(&self, state: &RunState) -> Option<Duration> {
        self.timeout
            .map(|limit| limit.saturating_sub(self.piloted(state)))
    }

    /// The instant the run's timeout expires, counted from now with what is left of it.
    pub(crate) fn deadline(&self, state: &RunState) -> Option<tokio::time::Instant> {
        self.left(state)
            .map(|left| tokio::time::Instant::now() + left)
    }

    /// Takes the lease, refusing when another worker holds a live one. The claim lasts the
    /// configured lease.
    pub(crate) async fn claim(&mut self, state: &mut RunState) -> Result<(), EngineError> {
        let now = self.events.now();
        if let Some(claim) = &state.claim
            && claim.worker_id != self.lease.worker_id
            && claim.lease_until > now
        {
            return Err(EngineError::ClaimConflict {
                run_id: self.events.run().run_id.clone(),
                worker_id: claim.worker_id.clone(),
                lease_until: claim.lease_until.to_rfc3339(),
            });
        }
        self.write_claim(state, self.lease.duration).await
    }

    /// The reference's renewal period: a third of the lease, at least
    /// [`MIN_RENEWAL_PERIOD`]. A renewal gives three periods (the lease itself when it is
    /// three seconds or more).
    fn renewal_period(&self) -> Duration {
        (self.lease.duration / 3).max(MIN_RENEWAL_PERIOD)
    }

    /// How long after this pilot's last claim the lease is renewed: the renewal period, but
    /// never later than two thirds of the lease that claim gave, so that a live driver's lease
    /// never lapses (only a lease under 1.5 s is renewed sooner than by the reference).
    /// `None` when this pilot holds no claim (a sub-run, or before its claim).
    fn renew_after(&self) -> Option<Duration> {
        self.claimed
            .map(|(_, given)| self.renewal_period().min(given * 2 / 3))
    }

    /// The time left before the lease is due for renewal (zero when it is due).
    fn renewal_in(&self) -> Option<Duration> {
        let (at, _) = self.claimed?;
        let after = self.renew_after()?;
        let elapsed = (self.events.now() - at).to_std().unwrap_or(Duration::ZERO);
        Some(after.saturating_sub(elapsed))
    }

    async fn write_claim(
        &mut self,
        state: &mut RunState,
        duration: Duration,
    ) -> Result<(), EngineError> {
        if self.lease.sub {
            // The parent's pilot holds the lease of the whole tree.
            return Ok(());
        }
        let lease = chrono::Duration::from_std(duration).unwrap_or(chrono::Duration::seconds(60));
        let now = self.events.now();
        let payload = Payload::RunClaimed(RunClaimed {
            worker_id: self.lease.worker_id.to_owned(),
            lease_until: now + lease,
        });
        let event = self.events.decision(state, payload);
        self.write(state, vec![event]).await?;
        self.claimed = Some((now, duration));
        Ok(())
    }

    /// Renews the lease when it is due ([`Io::renew_after`] since this pilot's last claim),
    /// for three renewal periods.
    pub(crate) async fn renew(&mut self, state: &mut RunState) -> Result<(), EngineError> {
        if self.renewal_in() == Some(Duration::ZERO) {
            let given = (self.renewal_period() * 3).max(self.lease.duration);
            self.write_claim(state, given).await?;
        }
        Ok(())
    }

    /// Hands the lease back (`run.claimed` with `lease_until` = now): another driver may take
    /// the run at once.
    pub(crate) async fn hand_back(&mut self, state: &mut RunState) -> Result<(), EngineError> {
        let event = self.events.decision(
            state,
            Payload::RunClaimed(RunClaimed {
                worker_id: self.lease.worker_id.to_owned(),
                lease_until: self.events.now(),
            }),
        );
        self.write(state, vec![event]).await?;
        self.claimed = None;
        Ok(())
    }

    /// Waits for `future` (one step's effect) unless the run is cancelled or `deadline` (the
    /// run's timeout) passes, renewing the lease whenever it is due meanwhile
    /// ([`Io::renew`]), so a long tool call or model stream never outlives the lease.
    pub(crate) async fn wait<T>(
        &mut self,
        state: &mut RunState,
        future: impl Future<Output = T>,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<StepEnd<T>, EngineError> {
        let cancel = self.cancel;
        // Renewed on entry when a third of the lease has passed: a step waits many times (a
        // tool batch once per result, a model call once per attempt), and each wait starts
        // its own timer below, so waits shorter than the period would otherwise never renew.
        self.renew(state).await?;
        let mut future = std::pin::pin!(future);
        let expiry = async {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        let mut expiry = std::pin::pin!(expiry);
        loop {
            // When the lease is next due, so a live driver's lease never runs out under a
            // peer's sweep (`Loom::watch_leases`); never, without a claim of this pilot.
            let due = self.renewal_in();
            let renewal = async {
                match due {
                    Some(left) => tokio::time::sleep(left).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = cancel.cancelled() => return Ok(StepEnd::Cancelled),
                () = &mut expiry => return Ok(StepEnd::TimedOut),
                output = &mut future => return Ok(StepEnd::Done(output)),
                () = renewal => {
                    let given = (self.renewal_period() * 3).max(self.lease.duration);
                    self.write_claim(state, given).await?;
                }
            }
        }
    }

    /// Closes a step whose effect was interrupted: cancelled, or out of time.
    pub(crate) async fn interrupted(
        &mut self,
        state: &mut RunState,
        step: &StepSpan,
        emitted: u32,
        timed_out: bool,
    ) -> Result<(), EngineError> {
        let outcome = if timed_out {
            Outcome::Error
        } else {
            Outcome::Cancelled
        };
        let mut batch = vec![step.completed(self, state, emitted, outcome)];
        if timed_out {
            let limit = self.timeout.unwrap_or_default();
            let message = format!(
                "maximum time of {} s exceeded: step {} was interrupted ({:.1} s of completed steps)",
                fmt_secs(limit),
                step.step_no,
                state.active_ms / 1000.0
            );
            let mut projected = state.clone();
            projected.step = step.step_no;
            batch.extend(
                self.events
                    .failure(&projected, "timeout", "timeout", &message),
            );
        } else {
            batch.extend(self.cancellation(state));
        }
        self.write(state, batch).await.map(drop)
    }
}

/// The span and number of a step being executed.
pub(crate) struct StepSpan {
    pub(crate) span: String,
    pub(crate) step_no: u32,
    started: Instant,
}

impl StepSpan {
    /// Opens the next step of the run.
    pub(crate) fn open(io: &Io<'_>, state: &RunState) -> StepSpan {
        StepSpan {
            span: io.events.uuid(),
            step_no: state.step + 1,
            started: Instant::now(),
        }
    }

    /// Its `step.started`.
    pub(crate) fn started(&self, io: &Io<'_>, state: &RunState, effect: Effect) -> Event {
        io.event(
            &self.span,
            Some(&state.run_span_id),
            None,
            Payload::StepStarted(StepStarted {
                step_no: self.step_no,
                state: state.status,
                effect,
            }),
        )
    }

    /// Its `step.completed`, after `emitted` events written inside it.
    pub(crate) fn completed(
        &self,
        io: &Io<'_>,
        state: &RunState,
        emitted: u32,
        outcome: Outcome,
    ) -> Event {
        io.event(
            &self.span,
            Some(&state.run_span_id),
            None,
            Payload::StepCompleted(StepCompleted {
                step_no: self.step_no,
                duration_ms: self.started.elapsed().as_secs_f64() * 1000.0,
                events_emitted: emitted,
                outcome,
            }),
        )
    }
}

/// The ids of the last decisive events, for `cause_event_id`.
#[derive(Debug, Default)]
pub(crate) struct LastIds {
    pub(crate) model: Option<String>,
    pub(crate) tool: Option<String>,
    /// The last `policy.decided`, cause of the transitions a policy decides.
    pub(crate) policy: Option<String>,
}

impl LastIds {
    pub(crate) fn note(&mut self, event: &Event) {
        match &event.payload {
            Payload::ModelResponded(p) if p.call_id.is_none() && p.judge.is_none() => {
                self.model = Some(event.event_id.clone());
            }
            Payload::ToolCompleted(_) => self.tool = Some(event.event_id.clone()),
            Payload::PolicyDecided(_) => self.policy = Some(event.event_id.clone()),
            _ => {}
        }
    }
}
