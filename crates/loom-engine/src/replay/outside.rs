//! What came from outside a recorded run, re-applied at the same point of its replay.
//!
//! A run's journal records facts no model or tool decided: a steering message
//! ([`Engine::steer`](crate::Engine::steer)) and a cancellation (`loom cancel`, written by
//! [`Engine::cancel_idle`](crate::Engine::cancel_idle) or by the pilot that was told to stop).
//! Their place is their position among the run tree's events: [`facts`] reads each fact with the
//! number of the tree's events written before it. The replay's journal is an [`OutsideStore`]:
//! after each write, once the replay's tree holds as many events as the recording held before a
//! fact, the fact is applied again through the engine, the way it was the first time: the
//! steering message is sent with [`Engine::steer`](crate::Engine::steer) (the pilot reads it
//! just before its next model call, as it did), the cancellation is written with
//! [`Engine::cancel_idle`](crate::Engine::cancel_idle) and the replay's [`Cancel`] fired so that a
//! pilot still driving stops. A call the recording never answered because the run was cancelled
//! while it ran waits, in the replay, until that cancellation ([`Outside::cut_short`]).
//!
//! Time is never read: a fact is placed by position only.

use std::sync::Arc;

use loom_core::{
    BoxFuture, Event, Message, Payload,
    ports::{EventStore, SessionSummary, StoreError},
};

use crate::{Cancel, Engine, EngineError, RunRef};

/// One fact from outside the run.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Fact {
    /// A steering message sent to `run_id` (of agent `agent`).
    Steer {
        /// The run steered.
        run_id: String,
        /// Its agent.
        agent: Option<String>,
        /// The message.
        message: Message,
    },
    /// The root run cancelled on request, by `by`.
    Cancel {
        /// Who asked (`run.cancelled.by`).
        by: Option<String>,
    },
}

/// A fact and its place: the number of the tree's events written before it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Placed {
    pub(super) after: usize,
    pub(super) fact: Fact,
}

/// The outside facts of `recorded` (the root run `root` and its sub-runs, from its
/// `run.started`, in journal order), in order. A cancellation is the block that closes the
/// tree: the sub-runs' cancellations (reason `parent`) and the root's (reason `requested`),
/// each with its transition.
pub(super) fn facts(recorded: &[Event], root: &str) -> Vec<Placed> {
    let mut facts = Vec::new();
    for (index, event) in recorded.iter().enumerate() {
        match &event.payload {
            Payload::MessageUser(user) if user.kind == loom_core::state::STEER => {
                facts.push(Placed {
                    after: index,
                    fact: Fact::Steer {
                        run_id: event.run_id.clone(),
                        agent: event.agent.clone(),
                        message: user.message.clone(),
                    },
                });
            }
            Payload::RunCancelled(cancelled)
                if event.run_id == root && cancelled.reason == "requested" =>
            {
                let mut start = index;
                while start > 0 && in_closing_block(&recorded[start - 1]) {
                    start -= 1;
                }
                facts.push(Placed {
                    after: start,
                    fact: Fact::Cancel {
                        by: cancelled.by.clone(),
                    },
                });
            }
            _ => {}
        }
    }
    facts
}

/// Whether `event` belongs to the block of events a cancellation writes.
fn in_closing_block(event: &Event) -> bool {
    match &event.payload {
        Payload::RunCancelled(_) => true,
        Payload::RunTransitioned(t) => t.to_state == loom_core::RunStatus::Cancelled,
        _ => false,
    }
}

/// What the replay applies, and where: shared by the [`OutsideStore`] and the doubles that
/// wait for a cancellation.
#[derive(Debug)]
pub(super) struct Outside {
    /// The scratch engine over the plain store (what applying a fact writes through).
    engine: Engine,
    root: RunRef,
    agent: String,
    cancel: Cancel,
    pending: tokio::sync::Mutex<Vec<Placed>>,
    clock: Arc<ReplayClock>,
    /// The clock's pins not passed yet ([`pins`]).
    pins: std::sync::Mutex<Vec<(usize, chrono::DateTime<chrono::Utc>)>>,
    /// An engine error met while applying a fact, reported after the drive.
    failure: std::sync::Mutex<Option<EngineError>>,
}

impl Outside {
    /// The facts `facts` of the run `root` (of agent `agent`), applied through `engine`, whose
    /// pilots obey `cancel`; `clock` (the engine's) pinned at `pins` ([`pins`]).
    pub(super) fn new(
        engine: Engine,
        root: RunRef,
        agent: String,
        cancel: Cancel,
        mut facts: Vec<Placed>,
        clock: Arc<ReplayClock>,
        pins: Vec<(usize, chrono::DateTime<chrono::Utc>)>,
    ) -> Outside {
        facts.sort_by_key(|placed| placed.after);
        if let Some((_, at)) = pins.first() {
            clock.set(*at);
        }
        Outside {
            engine,
            root,
            agent,
            cancel,
            pending: tokio::sync::Mutex::new(facts),
            clock,
            pins: std::sync::Mutex::new(pins),
            failure: std::sync::Mutex::new(None),
        }
    }

    /// Whether the recording ends in a requested cancellation.
    pub(super) fn cancels(facts: &[Placed]) -> bool {
        facts.iter().any(|p| matches!(p.fact, Fact::Cancel { .. }))
    }

    /// The cancellation the replay's pilots obey.
    pub(super) fn cancel(&self) -> &Cancel {
        &self.cancel
    }

    /// The deadline of the first request still waiting in `replayed` (the replay's events)
    /// whose recorded fate is to expire, passed: the clock moves past it, and the next pinned
    /// instant is taken once the replay's tree has moved on.
    pub(super) fn pass_next_expiry(&self, replayed: &[Event], expiring: &mut Vec<String>) -> bool {
        let Some((call_id, deadline)) = next_expiry(replayed, expiring) else {
            return false;
        };
        self.clock.pass(deadline);
        expiring.retain(|c| *c != call_id);
        true
    }

    /// Pins the clock at the next recorded request that expired and that the replay's tree (of
    /// `written` events) has not written yet. A pin is dropped once its request is written,
    /// whatever expired it: the engine may expire several requests at one pass of the clock
    /// (requests made a moment apart), and the next pin must still hold for the request after.
    fn pin(&self, written: usize) {
        let mut pins = self
            .pins
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        pins.retain(|(index, _)| written <= *index);
        if let Some((_, at)) = pins.first() {
            self.clock.set(*at);
        }
    }

    /// Applies, in order, every fact whose place the replay's tree has reached.
    async fn apply_due(&self) {
        match self.tree_events().await {
            Ok(written) => self.pin(written),
            Err(error) => return self.fail(error),
        }
        let mut pending = self.pending.lock().await;
        while let Some(next) = pending.first().cloned() {
            let written = match self.tree_events().await {
                Ok(written) => written,
                Err(error) => return self.fail(error),
            };
            if written < next.after {
                return;
            }
            pending.remove(0);
            if let Err(error) = self.apply(&next.fact).await {
                return self.fail(error);
            }
        }
    }

    /// Applies the remaining cancellation now, wherever the replay is: what a call the
    /// recording never answered (the run was cancelled while it ran) asks for. Then waits for
    /// the replay's cancellation.
    pub(super) async fn cut_short(&self) {
        {
            let mut pending = self.pending.lock().await;
            while !pending.is_empty() {
                let next = pending.remove(0);
                if let Err(error) = self.apply(&next.fact).await {
                    self.fail(error);
                    break;
                }
            }
        }
        // Whatever was applied, the call ends with the replay's cancellation: it never hangs.
        self.cancel.cancel(None);
        self.cancel.cancelled().await;
    }

    /// Applies what is left once the replay's drive returned (a cancellation of a run at rest
    /// whose place was reached while no pilot wrote).
    pub(super) async fn finish(&self) -> Result<(), EngineError> {
        self.apply_due().await;
        match self
            .failure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
        {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Whether the recorded cancellation was applied.
    pub(super) fn cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    async fn apply(&self, fact: &Fact) -> Result<(), EngineError> {
        match fact {
            Fact::Steer {
                run_id,
                agent,
                message,
            } => {
                let run = RunRef {
                    run_id: run_id.clone(),
                    ..self.root.clone()
                };
                let agent = agent.as_deref().unwrap_or(&self.agent);
                self.engine.steer(&run, agent, message.clone()).await
            }
            Fact::Cancel { by } => {
                self.engine
                    .cancel_idle(&self.root, &self.agent, by.clone())
                    .await?;
                // A pilot still driving stops: it finds its run closed.
                self.cancel.cancel(by.clone());
                Ok(())
            }
        }
    }

    /// How many events of the tree the replay's journal holds.
    async fn tree_events(&self) -> Result<usize, EngineError> {
        let events = self
            .engine
            .store()
            .read(&self.root.tenant_id, &self.root.session_id, 0)
            .await?;
        Ok(events
            .iter()
            .filter(|e| e.root_run_id == self.root.run_id)
            .count())
    }

    /// Records a failure to apply a fact. A fact the replay's run refuses (it closed, or
    /// diverged before the fact's place) is not one: the comparison names the divergence.
    fn fail(&self, error: EngineError) {
        tracing::warn!(%error, "replay: an outside fact could not be applied again");
        if matches!(error, EngineError::Invalid(_) | EngineError::Unusable(_)) {
            return;
        }
        let mut failure = self
            .failure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        failure.get_or_insert(error);
    }
}

/// The replay's journal: the scratch store, which after each write applies the outside facts
/// whose place the replay reached ([`Outside`]).
#[derive(Debug)]
pub(super) struct OutsideStore {
    pub(super) inner: Arc<dyn EventStore>,
    pub(super) outside: Arc<Outside>,
}

impl EventStore for OutsideStore {
    fn append(
        &self,
        batch: Vec<Event>,
        expected_last_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Event>, StoreError>> {
        Box::pin(async move {
            let written = self.inner.append(batch, expected_last_seq).await?;
            self.outside.apply_due().await;
            Ok(written)
        })
    }

    fn read<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        self.inner.read(tenant_id, session_id, after_seq)
    }

    fn last_seq<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.inner.last_seq(tenant_id, session_id)
    }

    fn sessions<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SessionSummary>, StoreError>> {
        self.inner.sessions(tenant_id)
    }

    fn delete<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.inner.delete(tenant_id, session_id)
    }
}

/// The replay's clock: the time of day, except around an approval request the journal says
/// expired. From the replay's start until that request is written, the clock reads the instant
/// the request was recorded at (its recorded deadline less the agent's `expires_in`), so that
/// the replay's request has the recorded deadline; once the replay waits for it, the deadline
/// passes ([`ReplayClock::pass`]) without waiting: how an `approval.expired` is re-applied.
#[derive(Debug)]
pub(super) struct ReplayClock {
    inner: Arc<dyn loom_core::ports::Clock>,
    at: std::sync::Mutex<Option<chrono::DateTime<chrono::Utc>>>,
}

impl ReplayClock {
    pub(super) fn new(inner: Arc<dyn loom_core::ports::Clock>) -> ReplayClock {
        ReplayClock {
            inner,
            at: std::sync::Mutex::new(None),
        }
    }

    fn set(&self, at: chrono::DateTime<chrono::Utc>) {
        *self
            .at
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(at);
    }

    /// From now on, the time is just past `deadline`.
    pub(super) fn pass(&self, deadline: chrono::DateTime<chrono::Utc>) {
        self.set(deadline + chrono::Duration::milliseconds(1));
    }
}

impl loom_core::ports::Clock for ReplayClock {
    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        let at = *self
            .at
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        at.unwrap_or_else(|| self.inner.now())
    }
}

/// Where the replay's clock is pinned: for each recorded approval request that expired, its
/// place among the tree's events and the instant it was made at (its deadline less the
/// `expires_in` of its agent, found in `agent`'s tree), in journal order.
pub(super) fn pins(
    recorded: &[Event],
    agent: &crate::AgentRuntime,
) -> Vec<(usize, chrono::DateTime<chrono::Utc>)> {
    let expiring = expired(recorded);
    recorded
        .iter()
        .enumerate()
        .filter_map(|(index, e)| match &e.payload {
            Payload::ApprovalRequested(requested) if expiring.contains(&requested.call_id) => {
                let owner = agent.find(e.agent.as_deref().unwrap_or(&agent.name))?;
                let waits = chrono::Duration::from_std(owner.approval.expires_in?).ok()?;
                Some((index, requested.expire_at?.checked_sub_signed(waits)?))
            }
            _ => None,
        })
        .collect()
}

/// The calls whose approval request expired in `recorded`, in journal order.
pub(super) fn expired(recorded: &[Event]) -> Vec<String> {
    recorded
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ApprovalExpired(expired) => Some(expired.call_id.clone()),
            _ => None,
        })
        .collect()
}

/// The deadline of the first request of `replayed` (the replay's events) still waiting whose
/// call is one of `expiring` (the recorded expiries not yet re-applied), with its call id.
fn next_expiry(
    replayed: &[Event],
    expiring: &[String],
) -> Option<(String, chrono::DateTime<chrono::Utc>)> {
    let settled = |call_id: &str| {
        replayed.iter().any(|e| match &e.payload {
            Payload::ApprovalGranted(p) => p.call_id == call_id,
            Payload::ApprovalRejected(p) => p.call_id == call_id,
            Payload::ApprovalExpired(p) => p.call_id == call_id,
            _ => false,
        })
    };
    replayed.iter().find_map(|e| match &e.payload {
        Payload::ApprovalRequested(requested)
            if expiring.contains(&requested.call_id) && !settled(&requested.call_id) =>
        {
            Some((requested.call_id.clone(), requested.expire_at?))
        }
        _ => None,
    })
}
