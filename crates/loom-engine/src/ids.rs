//! UUIDv7 ids from the engine's clock.

use std::sync::Arc;

use loom_core::ports::Clock;
use uuid::{ContextV7, Timestamp, Uuid};

/// Generates UUIDv7 strings, monotonic within the process, from the engine's clock.
#[derive(Debug, Clone)]
pub struct Ids {
    clock: Arc<dyn Clock>,
    context: Arc<ContextV7>,
}

impl Ids {
    /// Ids from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Ids {
        Ids {
            clock,
            context: Arc::new(ContextV7::new()),
        }
    }

    /// A new UUIDv7 string.
    pub fn uuid(&self) -> String {
        let now = self.clock.now();
        let seconds = u64::try_from(now.timestamp()).unwrap_or(0);
        let ts = Timestamp::from_unix(&*self.context, seconds, now.timestamp_subsec_nanos());
        Uuid::new_v7(ts).to_string()
    }
}
