//! The in-process event bus: a tokio broadcast channel, for a service of one process
//! (`storage.bus.backend: memory`, the default).

use loom_core::{
    BoxFuture,
    bus::{BusError, EventBus, Signal, Signals},
};
use tokio::sync::broadcast::{self, error::RecvError};

/// How many signals wait for a slow subscriber before the oldest are dropped for it (a
/// subscriber that lags loses signals, never the journal: it is told with a warning and reads
/// the journal on its slow period).
pub const MEMORY_BUS_CAPACITY: usize = 1024;

/// An [`EventBus`] within one process: every subscriber of this bus (and of its clones)
/// receives what any of them publishes after it subscribed. Nothing crosses a process.
#[derive(Debug, Clone)]
pub struct MemoryBus {
    sender: broadcast::Sender<Signal>,
}

impl MemoryBus {
    /// A bus with no subscriber yet.
    pub fn new() -> MemoryBus {
        let (sender, _) = broadcast::channel(MEMORY_BUS_CAPACITY);
        MemoryBus { sender }
    }
}

impl Default for MemoryBus {
    fn default() -> MemoryBus {
        MemoryBus::new()
    }
}

impl EventBus for MemoryBus {
    fn publish<'a>(&'a self, signal: &'a Signal) -> BoxFuture<'a, Result<(), BusError>> {
        // No subscriber is not an error: nobody was listening.
        let _ = self.sender.send(signal.clone());
        Box::pin(async { Ok(()) })
    }

    fn subscribe(&self) -> BoxFuture<'_, Result<Signals, BusError>> {
        let receiver = self.sender.subscribe();
        Box::pin(async move {
            let signals: Signals = Box::pin(futures_util::stream::unfold(
                receiver,
                |mut receiver| async move {
                    loop {
                        match receiver.recv().await {
                            Ok(signal) => return Some((Ok(signal), receiver)),
                            Err(RecvError::Lagged(missed)) => {
                                tracing::warn!(
                                    missed,
                                    "a slow subscriber of the memory bus lost signals"
                                );
                            }
                            Err(RecvError::Closed) => return None,
                        }
                    }
                },
            ));
            Ok(signals)
        })
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), BusError>> {
        Box::pin(async { Ok(()) })
    }
}
