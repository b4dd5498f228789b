//! Serialized writes of one run into its session journal, under optimistic concurrency.

use loom_core::{
    Event,
    event::Payload,
    ports::{EventStore, StoreError},
};

use crate::{EngineError, RunRef, observer::Observer};

/// How many times a write is retried when other runs of the session wrote in between.
const MAX_CONFLICT_RETRIES: usize = 5;

/// Writes the events of one run, in order, and tells the observer once they are durable.
pub(crate) struct SessionWriter<'a> {
    store: &'a dyn EventStore,
    run: &'a RunRef,
    worker_id: &'a str,
    observer: &'a dyn Observer,
    last_seq: u64,
    /// Events of this run written by someone else that do not take it over (steering
    /// messages), to apply before the next batch.
    foreign: Vec<Event>,
}

impl<'a> SessionWriter<'a> {
    pub(crate) fn new(
        store: &'a dyn EventStore,
        run: &'a RunRef,
        worker_id: &'a str,
        observer: &'a dyn Observer,
        last_seq: u64,
    ) -> SessionWriter<'a> {
        SessionWriter {
            store,
            run,
            worker_id,
            observer,
            last_seq,
            foreign: Vec::new(),
        }
    }

    /// Appends a batch. Conflicts caused by other runs of the session are retried; an event
    /// of this run written by someone else means another driver took over: nothing is written.
    pub(crate) async fn append(&mut self, batch: Vec<Event>) -> Result<Vec<Event>, EngineError> {
        for _ in 0..MAX_CONFLICT_RETRIES {
            match self.store.append(batch.clone(), self.last_seq).await {
                Ok(written) => {
                    if let Some(last) = written.last() {
                        self.last_seq = last.seq;
                    }
                    for event in &written {
                        self.observer.event(event);
                    }
                    return Ok(written);
                }
                Err(StoreError::Conflict { found, .. }) => {
                    let newer = self
                        .store
                        .read(&self.run.tenant_id, &self.run.session_id, self.last_seq)
                        .await?;
                    let mine = newer.iter().filter(|e| e.run_id == self.run.run_id);
                    if let Some(intruder) = mine.clone().find(|e| !is_steering(e)) {
                        return Err(self.taken_over(intruder));
                    }
                    for event in mine {
                        self.observer.event(event);
                        self.foreign.push(event.clone());
                    }
                    self.last_seq = newer.last().map_or(found, |e| e.seq);
                }
                Err(other) => return Err(other.into()),
            }
        }
        Err(EngineError::Contention(self.run.session_id.clone()))
    }

    /// Steering messages that arrived since the last write, in journal order.
    pub(crate) fn take_foreign(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.foreign)
    }

    fn taken_over(&self, intruder: &Event) -> EngineError {
        match &intruder.payload {
            payload if payload.is_closing() => EngineError::RunMoved(self.run.run_id.clone()),
            Payload::RunTransitioned(t) if t.to_state.is_terminal() => {
                EngineError::RunMoved(self.run.run_id.clone())
            }
            Payload::RunClaimed(claim) if claim.worker_id != self.worker_id => {
                EngineError::ClaimConflict {
                    run_id: self.run.run_id.clone(),
                    worker_id: claim.worker_id.clone(),
                    lease_until: claim.lease_until.to_rfc3339(),
                }
            }
            _ => EngineError::ClaimConflict {
                run_id: self.run.run_id.clone(),
                worker_id: "another driver".into(),
                lease_until: intruder.ts.to_rfc3339(),
            },
        }
    }
}

/// A message sent to the run while it is driven (`Loom::steer`): not a takeover.
fn is_steering(event: &Event) -> bool {
    matches!(&event.payload, Payload::MessageUser(user) if user.kind == loom_core::state::STEER)
}
