//! Tenant quotas (`tenants[].quotas.runs_per_minute`): how many runs a tenant may open in a
//! sliding minute, counted in memory by each [`crate::Loom`] instance, so a refused run writes
//! nothing and two processes count separately.

use std::{
    collections::{HashMap, VecDeque},
    sync::Mutex,
    time::{Duration, Instant},
};

/// The window a quota counts over.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);

/// When each tenant opened its runs of the last minute.
#[derive(Debug, Default)]
pub(crate) struct RunQuotas {
    opened: Mutex<HashMap<String, VecDeque<Instant>>>,
}

impl RunQuotas {
    /// Takes a slot for a run of `tenant` at `now`, allowed `limit` runs per [`WINDOW`]: the
    /// slot's instant (to give it back if the run is not opened after all), or how long until
    /// the oldest slot of the window frees.
    pub(crate) fn take(&self, tenant: &str, limit: u32, now: Instant) -> Result<Instant, Duration> {
        let Ok(mut opened) = self.opened.lock() else {
            // A poisoned table counts nothing rather than refusing every run.
            return Ok(now);
        };
        let slots = opened.entry(tenant.to_owned()).or_default();
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

    /// Gives back the slot taken at `at` (the run was not opened).
    pub(crate) fn give_back(&self, tenant: &str, at: Instant) {
        if let Ok(mut opened) = self.opened.lock()
            && let Some(slots) = opened.get_mut(tenant)
            && let Some(index) = slots.iter().rposition(|slot| *slot == at)
        {
            slots.remove(index);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_sliding_minute_per_tenant() {
        let quotas = RunQuotas::default();
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
}
