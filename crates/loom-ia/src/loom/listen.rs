//! The subscription of an instance to the event bus: one task per [`Loom`], started the first
//! time the instance drives, follows or cancels a run, ended when the instance goes. It fans
//! [`Signal::Appended`] out to the local followers ([`crate::notify::Notices`]) and cancels
//! at once a run this instance drives when a [`Signal::Cancel`] for it arrives (the drive then
//! journals `run.cancelled` with its `by`). A lost subscription is made again after a backoff
//! (0.5 s, doubling up to 30 s), and every follower then reads the journal to catch up.

use std::{
    sync::{Arc, Weak, atomic::Ordering},
    time::Duration,
};

use futures_util::StreamExt;
use loom_core::bus::{EventBus, Signal};
use loom_engine::RunRef;
use tokio_util::sync::CancellationToken;

use super::{Inner, Loom};
use crate::notify::Notices;

/// The first pause before subscribing again.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest pause before subscribing again.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

impl Loom {
    /// Starts the subscription task, once per instance, when called inside a tokio runtime
    /// (outside one it does nothing: the next call inside one starts it).
    pub(crate) fn listen(&self) {
        if self.inner.listening.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.inner.listening.store(false, Ordering::SeqCst);
            return;
        };
        runtime.spawn(subscription(
            self.inner.bus.clone(),
            self.inner.notices.clone(),
            Arc::downgrade(&self.inner),
            self.inner.stop_listening.clone(),
        ));
    }

    /// The event bus this instance publishes on.
    pub(crate) fn bus(&self) -> &Arc<dyn EventBus> {
        &self.inner.bus
    }

    /// The local fan-out of journal notices.
    pub(crate) fn notices(&self) -> &Arc<Notices> {
        &self.inner.notices
    }
}

/// The subscription task (see the module documentation).
async fn subscription(
    bus: Arc<dyn EventBus>,
    notices: Arc<Notices>,
    instance: Weak<Inner>,
    stop: CancellationToken,
) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let subscribed = tokio::select! {
            () = stop.cancelled() => return,
            subscribed = bus.subscribe() => subscribed,
        };
        match subscribed {
            Ok(mut signals) => {
                backoff = FIRST_BACKOFF;
                // What was sent while no subscription was open is read from the journal.
                notices.catch_up();
                loop {
                    let item = tokio::select! {
                        () = stop.cancelled() => return,
                        item = signals.next() => item,
                    };
                    match item {
                        Some(Ok(signal)) => {
                            if !deliver(&notices, &instance, signal) {
                                return;
                            }
                        }
                        Some(Err(error)) => {
                            tracing::warn!(%error, "the event bus subscription failed");
                        }
                        None => break,
                    }
                }
                tracing::warn!("the event bus subscription ended: subscribing again");
            }
            Err(error) => {
                tracing::warn!(%error, retry_in_s = backoff.as_secs_f64(), "cannot subscribe to the event bus");
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Hands one signal to who waits for it here; `false` once the instance is gone.
fn deliver(notices: &Notices, instance: &Weak<Inner>, signal: Signal) -> bool {
    match signal {
        Signal::Appended(notice) => {
            notices.announce(&notice);
            instance.strong_count() > 0
        }
        Signal::Cancel {
            tenant_id,
            session_id,
            run_id,
            by,
        } => {
            let Some(inner) = instance.upgrade() else {
                return false;
            };
            let run = RunRef {
                tenant_id,
                session_id,
                run_id,
            };
            let token = inner
                .active
                .lock()
                .ok()
                .and_then(|active| active.get(&run).cloned());
            if let Some(token) = token {
                tracing::info!(run_id = %run.run_id, by = ?by, "cancelled through the event bus");
                token.cancel(by);
            }
            true
        }
    }
}
