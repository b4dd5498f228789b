//! The wall clock, as the engine's `Clock` port.

use chrono::{DateTime, Utc};
use loom_core::ports::Clock;

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}
