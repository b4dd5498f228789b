//! The counters port: limits counted once for every process of a service (`storage.limits`).
//!
//! Two kinds of counts: sliding windows of slots (API-key rate limits, tenant quotas: how many
//! requests or runs in the last minute) and sums over calendar windows (a tenant's spending of
//! the day or the month, dollars and tokens). Each operation is atomic in the backend, so N
//! servers enforce one limit; keys expire with their window, so nothing has to be swept.
//!
//! A sum is only a fast copy of what the journal holds: a missing sum (a first use, a restart of
//! the backend) is seeded from the journal with [`Counters::seed`], which never overwrites a
//! sum another process seeded or added to first.

use std::{fmt, time::Duration};

use crate::BoxFuture;

/// Why a counter operation failed, classified by kind.
#[derive(Debug, thiserror::Error)]
pub enum CounterError {
    /// The backend cannot be reached: the caller decides whether to refuse (a limit never fails
    /// open silently: the access crates answer 503).
    #[error("shared counters unavailable: {0}")]
    Unavailable(String),
    /// The backend refused the operation, or holds a value that is not a count.
    #[error("shared counters refused: {0}")]
    Refused(String),
}

/// A slot taken in a sliding window, to give back when what it counted did not happen.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Slot {
    /// The window's key.
    pub key: String,
    /// The slot's unique member in the window.
    pub member: String,
}

/// What [`Counters::take`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// A slot was free and is now taken.
    Slot(Slot),
    /// The window is full: the oldest slot frees after this delay.
    Full {
        /// How long until a slot frees.
        retry_after: Duration,
    },
}

/// A sum over a calendar window, in dollars and tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sum {
    /// Dollars.
    pub cost_usd: f64,
    /// Tokens.
    pub tokens: u64,
}

/// The counters port.
pub trait Counters: Send + Sync + fmt::Debug {
    /// Takes a slot in the sliding window `key` (`limit` slots per `window`), timed by the
    /// backend's clock, or says how long until one frees.
    fn take<'a>(
        &'a self,
        key: &'a str,
        limit: u32,
        window: Duration,
    ) -> BoxFuture<'a, Result<Taken, CounterError>>;

    /// Gives a slot back (what it counted did not happen after all).
    fn give_back<'a>(&'a self, slot: &'a Slot) -> BoxFuture<'a, Result<(), CounterError>>;

    /// The sum `key`, or `None` when the backend holds none (never seeded, or expired).
    fn sum<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Sum>, CounterError>>;

    /// Sets the sum `key` to `value`, living `ttl`, unless it exists (then it is left as it is).
    /// Returns the sum the backend holds afterwards.
    fn seed<'a>(
        &'a self,
        key: &'a str,
        value: Sum,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Sum, CounterError>>;

    /// Adds `amount` to the sum `key` if it exists (a missing sum is seeded from the journal
    /// later, which already counts this amount). Returns whether it existed.
    fn add<'a>(&'a self, key: &'a str, amount: Sum) -> BoxFuture<'a, Result<bool, CounterError>>;

    /// Whether the backend answers (the readiness check).
    fn ping(&self) -> BoxFuture<'_, Result<(), CounterError>>;
}
