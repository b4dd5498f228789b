//! Serialized writes of one run into its session journal, under optimistic concurrency.

use loom_core::{
    Event,
    event::Payload,
    ports::{EventStore, StoreError},
};

use crate::{EngineError, RunRef, driver::Observer};

/// How many times a write is retried when other runs of the session wrote in between.
const MAX_CONFLICT_RETRIES: usize = 5;

/// Writes the events of one run, in order, and tells the observer once they are durable.
pub(crate) struct SessionWriter<'a> {
    store: &'a dyn EventStore,
    run: &'a RunRef,
    worker_id: &'a str,
    observer: &'a dyn Observer,
    last_seq: u64,
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
                    if let Some(intruder) = newer.iter().find(|e| e.run_id == self.run.run_id) {
                        return Err(self.taken_over(intruder));
                    }
                    self.last_seq = newer.last().map_or(found, |e| e.seq);
                }
                Err(other) => return Err(other.into()),
            }
        }
        Err(EngineError::Contention(self.run.session_id.clone()))
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
