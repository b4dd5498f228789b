//! [`CountingStore`]: the journal wrapped so that what each tenant spends is added to its
//! budget sums (`storage.limits` `backend: redis`) as it is journaled.
//!
//! Every model call billed (`model.responded`, and `model.retried` with its usage: a failed
//! attempt that was billed) adds its dollars and tokens to the sums of its tenant's UTC day and
//! month, `budget:<tenant>:day:<YYYY-MM-DD>` and `budget:<tenant>:month:<YYYY-MM>`, windows
//! taken at the event's time. This counts what the journal scan counts
//! (`loom_engine::budget::root_runs_spent`): every model call of every run, sub-agents' and
//! roles' and judges' included, once (a sub-agent's `tool.completed`, which restates its
//! child's spending, adds nothing). The one difference: the scan counts a run's spending in the
//! window its root run *started* in, the sums in the window it *happened* in (a run across
//! midnight). A sum not seeded yet is left alone ([`Counters::add`]): the check that seeds it
//! from the journal counts the spending. A counting failure is logged and never fails the
//! append.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use loom_config::{Config, LimitsBackend};
use loom_core::{
    BoxFuture, Event,
    counters::{Counters, Sum},
    event::Payload,
    ports::EventStore,
};

use crate::appended::{AfterAppend, Appended};
use crate::budget::Period;

/// The key of `tenant`'s budget sum over the `period` window holding `at`.
pub(crate) fn sum_key(tenant: &str, period: Period, at: DateTime<Utc>) -> String {
    format!("budget:{tenant}:{}:{}", period.as_str(), period.label(at))
}

/// `store`, counting spending into `counters` when they are shared (`backend: redis`); as it
/// is otherwise (the memory counters keep no sums: the journal is read).
pub(crate) fn counting(
    config: &Config,
    store: Arc<dyn EventStore>,
    counters: Arc<dyn Counters>,
) -> Arc<dyn EventStore> {
    match config.raw().storage.limits.backend {
        LimitsBackend::Memory => store,
        LimitsBackend::Redis => Arc::new(Appended::new(store, CountingStore { counters })),
    }
}

/// Adds each billed model call to its tenant's budget sums once it is written (the hook of an
/// [`Appended`] journal).
#[derive(Debug)]
pub(crate) struct CountingStore {
    counters: Arc<dyn Counters>,
}

/// What `event` spent, if it is a billed model call.
fn billed(event: &Event) -> Option<Sum> {
    match &event.payload {
        Payload::ModelResponded(response) => Some(Sum {
            cost_usd: response.cost_usd,
            tokens: response.usage.total_tokens(),
        }),
        Payload::ModelRetried(retried) if retried.usage.is_some() || retried.cost_usd > 0.0 => {
            Some(Sum {
                cost_usd: retried.cost_usd,
                tokens: retried.usage.as_ref().map_or(0, |u| u.total_tokens()),
            })
        }
        _ => None,
    }
}

/// The spending of `events` by sum key.
fn spending(events: &[&Event]) -> Vec<(String, Sum)> {
    let mut sums: Vec<(String, Sum)> = Vec::new();
    for event in events {
        let Some(spent) = billed(event) else {
            continue;
        };
        for period in [Period::Day, Period::Month] {
            let key = sum_key(&event.tenant_id, period, event.ts);
            match sums.iter_mut().find(|(k, _)| *k == key) {
                Some((_, sum)) => {
                    sum.cost_usd += spent.cost_usd;
                    sum.tokens += spent.tokens;
                }
                None => sums.push((key, spent)),
            }
        }
    }
    sums
}

impl AfterAppend for CountingStore {
    fn after<'a>(&'a self, written: &'a [&'a Event]) -> BoxFuture<'a, ()> {
        Box::pin(self.count(written))
    }
}

impl CountingStore {
    async fn count(&self, written: &[&Event]) {
        for (key, amount) in spending(written) {
            if let Err(error) = self.counters.add(&key, amount).await {
                tracing::warn!(
                    key,
                    %error,
                    "spending not added to the shared budget sum (it is journaled; the sum \
                     is re-seeded from the journal when it expires)"
                );
            }
        }
    }
}
