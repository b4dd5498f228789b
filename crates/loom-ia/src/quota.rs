//! [`MemoryCounters`]: the [`Counters`] port in memory, for one process (`storage.limits`
//! `backend: memory`, the default): the sliding windows of tenant quotas
//! (`tenants[].quotas.runs_per_minute`) and of API keys' rate limits
//! (`security.api_keys[].rate_limit`) are counted per process, so two processes count apart.
//!
//! Sums are not kept: [`Counters::sum`] answers `None` and [`Counters::seed`] hands its value
//! back, so every tenant-budget check reads the journal, which is the truth and is shared by
//! every process already; only a shared backend (`backend: redis`) keeps the windows' sums.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use loom_core::{
    BoxFuture,
    counters::{CounterError, Counters, Slot, Sum, Taken},
};

/// The window of quotas and rate limits: a sliding minute.
pub const WINDOW: Duration = Duration::from_secs(60);

/// One window's slots: when each was taken, and its member.
type Slots = VecDeque<(Instant, u64)>;

/// The [`Counters`] port in memory (see the module documentation).
#[derive(Debug, Default)]
pub struct MemoryCounters {
    windows: Mutex<HashMap<String, Slots>>,
    next: AtomicU64,
}

impl MemoryCounters {
    /// Empty counters.
    pub fn new() -> MemoryCounters {
        MemoryCounters::default()
    }

    /// Takes a slot of `key` at `now`, allowed `limit` slots per `window`, or says how long
    /// until the oldest slot of the window frees.
    pub fn take_at(&self, key: &str, limit: u32, window: Duration, now: Instant) -> Taken {
        let mut windows = self.table();
        let slots = windows.entry(key.to_owned()).or_default();
        while slots
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= window)
        {
            slots.pop_front();
        }
        if slots.len() >= usize::try_from(limit).unwrap_or(usize::MAX) {
            let oldest = slots.front().map_or(now, |(at, _)| *at);
            return Taken::Full {
                retry_after: window.saturating_sub(now.saturating_duration_since(oldest)),
            };
        }
        let member = self.next.fetch_add(1, Ordering::Relaxed);
        slots.push_back((now, member));
        Taken::Slot(Slot {
            key: key.to_owned(),
            member: member.to_string(),
        })
    }

    /// Gives a slot back.
    pub fn give_back_now(&self, slot: &Slot) {
        let mut windows = self.table();
        if let Some(slots) = windows.get_mut(&slot.key)
            && let Some(index) = slots
                .iter()
                .position(|(_, member)| member.to_string() == slot.member)
        {
            slots.remove(index);
        }
    }

    /// The table, also after a panic while it was held: every step above leaves it valid (a
    /// window of instants), so it keeps counting and the limits keep refusing, never failing
    /// open.
    fn table(&self) -> MutexGuard<'_, HashMap<String, Slots>> {
        self.windows.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Counters for MemoryCounters {
    fn take<'a>(
        &'a self,
        key: &'a str,
        limit: u32,
        window: Duration,
    ) -> BoxFuture<'a, Result<Taken, CounterError>> {
        let taken = self.take_at(key, limit, window, Instant::now());
        Box::pin(async move { Ok(taken) })
    }

    fn give_back<'a>(&'a self, slot: &'a Slot) -> BoxFuture<'a, Result<(), CounterError>> {
        self.give_back_now(slot);
        Box::pin(async { Ok(()) })
    }

    fn sum<'a>(&'a self, _key: &'a str) -> BoxFuture<'a, Result<Option<Sum>, CounterError>> {
        Box::pin(async { Ok(None) })
    }

    fn seed<'a>(
        &'a self,
        _key: &'a str,
        value: Sum,
        _ttl: Duration,
    ) -> BoxFuture<'a, Result<Sum, CounterError>> {
        Box::pin(async move { Ok(value) })
    }

    fn add<'a>(&'a self, _key: &'a str, _amount: Sum) -> BoxFuture<'a, Result<bool, CounterError>> {
        Box::pin(async { Ok(false) })
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), CounterError>> {
        Box::pin(async { Ok(()) })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn slot(taken: Taken) -> Slot {
        match taken {
            Taken::Slot(slot) => slot,
            Taken::Full { retry_after } => panic!("full for {retry_after:?}"),
        }
    }

    fn full(secs: u64) -> Taken {
        Taken::Full {
            retry_after: Duration::from_secs(secs),
        }
    }

    #[test]
    fn a_sliding_minute_per_key() {
        let counters = MemoryCounters::new();
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        slot(counters.take_at("acme", 2, WINDOW, at(0)));
        slot(counters.take_at("acme", 2, WINDOW, at(10)));
        // Full: the oldest slot frees 60 s after it was taken.
        assert_eq!(counters.take_at("acme", 2, WINDOW, at(15)), full(45));
        // Another key counts apart.
        slot(counters.take_at("beta", 2, WINDOW, at(15)));
        // The first slot has left the window.
        let late = slot(counters.take_at("acme", 2, WINDOW, at(60)));
        assert_eq!(counters.take_at("acme", 2, WINDOW, at(61)), full(9));
        // A slot given back is free again.
        counters.give_back_now(&late);
        slot(counters.take_at("acme", 2, WINDOW, at(61)));
    }

    #[tokio::test]
    async fn sums_are_left_to_the_journal() {
        let counters = MemoryCounters::new();
        let value = Sum {
            cost_usd: 1.0,
            tokens: 10,
        };
        assert_eq!(counters.sum("k").await.unwrap(), None);
        assert!(!counters.add("k", value).await.unwrap());
        assert_eq!(counters.seed("k", value, WINDOW).await.unwrap(), value);
        assert_eq!(counters.sum("k").await.unwrap(), None);
        counters.ping().await.unwrap();
    }

    /// A panic while the table was held poisons its lock: the limits still refuse.
    #[test]
    fn a_poisoned_table_still_refuses() {
        let counters = MemoryCounters::new();
        let now = Instant::now();
        let taken = slot(counters.take_at("key", 1, WINDOW, now));
        let poisoned = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let _held = counters.windows.lock().unwrap();
                    panic!("a panic while the table is held");
                })
                .join()
        });
        assert!(poisoned.is_err());
        assert!(counters.windows.is_poisoned());
        assert_eq!(counters.take_at("key", 1, WINDOW, now), full(60));
        counters.give_back_now(&taken);
        slot(counters.take_at("key", 1, WINDOW, now));
    }
}
