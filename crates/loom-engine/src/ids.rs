//! UUIDv7 ids from the engine's clock.

use std::sync::{Arc, Mutex};

use loom_core::ports::Clock;
use uuid::{ContextV7, Timestamp, Uuid};

/// Generates UUIDv7 strings, monotonic within the process, from the engine's clock.
#[derive(Debug, Clone)]
pub struct Ids {
    clock: Arc<dyn Clock>,
    context: Arc<Mutex<ContextV7>>,
}

impl Ids {
    /// Ids from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Ids {
        Ids {
            clock,
            context: Arc::new(Mutex::new(ContextV7::new())),
        }
    }

    /// A new UUIDv7 string.
    pub fn uuid(&self) -> String {
        let now = self.clock.now();
        let seconds = u64::try_from(now.timestamp()).unwrap_or(0);
        let nanos = now.timestamp_subsec_nanos();
        let ts = match self.context.lock() {
            Ok(context) => Timestamp::from_unix(&*context, seconds, nanos),
            // A poisoned lock only means another thread panicked mid-call: the context is intact.
            Err(poisoned) => Timestamp::from_unix(&*poisoned.into_inner(), seconds, nanos),
        };
        Uuid::new_v7(ts).to_string()
    }
}
