//! Sliding one-minute windows, counted in memory: tenant quotas
//! (`tenants[].quotas.runs_per_minute`, how many runs a tenant may open, per [`crate::Loom`]
//! instance, so a refused run writes nothing and two processes count separately), and the
//! per-key rate limits of the access crates (`security.api_keys[].rate_limit`).

use std::{
    collections::{HashMap, VecDeque},
    sync::{Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

/// The window counted over.
pub const WINDOW: Duration = Duration::from_secs(60);

/// When each counter (a tenant, an API key) took its slots of the last minute.
#[derive(Debug, Default)]
pub struct SlidingMinute {
    opened: Mutex<HashMap<String, VecDeque<Instant>>>,
}

impl SlidingMinute {
    /// Takes a slot of `counter` at `now`, allowed `limit` slots per [`WINDOW`]: the slot's
    /// instant (to give it back if what it counted did not happen after all), or how long
    /// until the oldest slot of the window frees.
    pub fn take(&self, counter: &str, limit: u32, now: Instant) -> Result<Instant, Duration> {
        let mut opened = self.table();
        let slots = opened.entry(counter.to_owned()).or_default();
        while slots
            .front()
            .is_some_and(|at| now.saturating_duration_since(*at) >= WINDOW)
        {
            slots.pop_front();
        }
        if slots.len() >= usize::try_from(limit).unwrap_or(usize::MAX) {
            let oldest = slots.front().copied().unwrap_or(now);
            return Err(WINDOW.saturating_sub(now.saturating_duration_since(oldest)));
        }
        slots.push_back(now);
        Ok(now)
    }

    /// Gives back the slot of `counter` taken at `at`.
    pub fn give_back(&self, counter: &str, at: Instant) {
        let mut opened = self.table();
        if let Some(slots) = opened.get_mut(counter)
            && let Some(index) = slots.iter().rposition(|slot| *slot == at)
        {
            slots.remove(index);
        }
    }

    /// The table, also after a panic while it was held: every step above leaves it valid (a
    /// window of instants), so it keeps counting and the limits keep refusing, never failing
    /// open.
    fn table(&self) -> MutexGuard<'_, HashMap<String, VecDeque<Instant>>> {
        self.opened.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_sliding_minute_per_tenant() {
        let quotas = SlidingMinute::default();
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        assert!(quotas.take("acme", 2, at(0)).is_ok());
        assert!(quotas.take("acme", 2, at(10)).is_ok());
        // Full: the oldest slot frees 60 s after it was taken.
        assert_eq!(quotas.take("acme", 2, at(15)), Err(Duration::from_secs(45)));
        // Another tenant counts apart.
        assert!(quotas.take("beta", 2, at(15)).is_ok());
        // The first slot has left the window.
        assert_eq!(quotas.take("acme", 2, at(60)), Ok(at(60)));
        assert_eq!(quotas.take("acme", 2, at(61)), Err(Duration::from_secs(9)));
        // A slot given back is free again.
        quotas.give_back("acme", at(60));
        assert!(quotas.take("acme", 2, at(61)).is_ok());
    }

    /// A panic while the table was held poisons its lock: the limits still refuse.
    #[test]
    fn a_poisoned_table_still_refuses() {
        let limits = SlidingMinute::default();
        let now = Instant::now();
        assert!(limits.take("key", 1, now).is_ok());
        let poisoned = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let _held = limits.opened.lock().unwrap();
                    panic!("a panic while the table is held");
                })
                .join()
        });
        assert!(poisoned.is_err());
        assert!(limits.opened.is_poisoned());
        assert_eq!(limits.take("key", 1, now), Err(WINDOW));
        limits.give_back("key", now);
        assert!(limits.take("key", 1, now).is_ok());
    }
}
