//! Model-call resilience: the retry policy, the three stream timeouts, and the circuit
//! breakers shared by every run of an engine (one [`loom_core::circuit::Breaker`] per model,
//! the same state machine as an MCP server's).
//!
//! The decisions themselves (retry, fall back, fail) are taken by the driver's model step,
//! which journals each of them (`model.retried`, `model.fell_back`, `circuit.opened`).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
pub use loom_core::circuit::CircuitSettings;
use loom_core::{
    circuit::{Admission, Breaker},
    model::{
        HttpExchange, ModelChunk, ModelClient, ModelError, ModelErrorKind, ModelRequest,
        ModelResponse, ResponseAccumulator,
    },
};

use crate::units::fmt_secs;

/// How a model call that failed with a retryable error (`transient`, `overloaded`) is tried
/// again (`models[].retry`).
///
/// The delay after failed attempt `n` (from 1) is
/// `min(max_delay, initial_delay × multiplier^(n-1)) × (0.5 + jitter/2)` with `jitter` in
/// `[0, 1]`. A delay asked by the provider (`Retry-After`) replaces it; when that delay exceeds
/// `max_delay` the model is abandoned at once, as if its attempts were exhausted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (`0` behaves as `1`: no retry).
    pub max_attempts: u32,
    /// Delay before the second attempt, before jitter.
    pub initial_delay: Duration,
    /// Growth of the delay from one attempt to the next (at least 1).
    pub multiplier: f64,
    /// Cap on the computed delay, and on an acceptable `Retry-After`.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    /// `{max_attempts: 3, initial_delay: 1 s, multiplier: 2.0, max_delay: 30 s}`.
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 3,
            initial_delay: Duration::from_secs(1),
            multiplier: 2.0,
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries (one attempt).
    pub fn none() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// The delay after failed attempt `attempt` (from 1), for a `jitter` in `[0, 1]`.
    pub fn delay(&self, attempt: u32, jitter: f64) -> Duration {
        let exponent = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let base = self.initial_delay.as_secs_f64() * self.multiplier.max(1.0).powi(exponent);
        let capped = if base.is_finite() {
            base.min(self.max_delay.as_secs_f64())
        } else {
            self.max_delay.as_secs_f64()
        };
        let factor = 0.5 + jitter.clamp(0.0, 1.0) / 2.0;
        Duration::try_from_secs_f64((capped * factor).max(0.0)).unwrap_or(self.max_delay)
    }

    /// Attempts in all, at least one.
    pub fn attempts(&self) -> u32 {
        self.max_attempts.max(1)
    }
}

/// Bounds on one streamed model call (`models[].timeouts`); `None` disables a bound.
///
/// Each one that passes ends the attempt with a `transient` error, retried like any other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelTimeouts {
    /// Until the first content chunk (a usage chunk does not count).
    pub first_token: Option<Duration>,
    /// Between two chunks, once content has started.
    pub idle: Option<Duration>,
    /// For the whole call.
    pub total: Option<Duration>,
}

impl Default for ModelTimeouts {
    /// `{first_token: 60 s, idle: 60 s, total: 300 s}`.
    fn default() -> ModelTimeouts {
        ModelTimeouts {
            first_token: Some(Duration::from_secs(60)),
            idle: Some(Duration::from_secs(60)),
            total: Some(Duration::from_secs(300)),
        }
    }
}

impl ModelTimeouts {
    /// No bound at all.
    pub fn none() -> ModelTimeouts {
        ModelTimeouts {
            first_token: None,
            idle: None,
            total: None,
        }
    }
}

/// The circuit breakers of an engine, keyed `model:<config id>`, shared by all its runs (and by
/// its clones): one [`loom_core::circuit::Breaker`] per model, over the engine's clock.
///
/// Consecutive failed attempts of kinds `transient`, `overloaded` and `quota_exhausted` are
/// counted; at [`CircuitSettings::failures`] the breaker opens for
/// [`CircuitSettings::cooldown`], during which the model is skipped. After the cooldown one
/// trial call goes through: its success closes the breaker, its failure reopens it; a trial
/// that never reports (its run stopped) expires after another cooldown.
/// Time is read from the engine's clock.
#[derive(Debug, Default)]
pub struct Breakers {
    states: Mutex<HashMap<String, Breaker<DateTime<Utc>>>>,
}

impl Breakers {
    /// No breaker open.
    pub fn new() -> Breakers {
        Breakers::default()
    }

    /// The key of a model's breaker: `model:<config id>`.
    pub fn model_key(config_id: &str) -> String {
        format!("model:{config_id}")
    }

    /// Whether the breaker `key` currently refuses calls (open and still cooling down, or a
    /// trial in flight).
    pub fn is_open(&self, key: &str, now: DateTime<Utc>) -> bool {
        self.lock().get(key).is_some_and(|b| b.is_open(now))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Breaker<DateTime<Utc>>>> {
        // A poisoned lock only means another thread panicked mid-update: the map is intact.
        self.states
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks whether a call may go through.
    pub(crate) fn admit(
        &self,
        key: &str,
        settings: &CircuitSettings,
        now: DateTime<Utc>,
    ) -> Admission<DateTime<Utc>> {
        match self.lock().get_mut(key) {
            Some(breaker) => breaker.admit(settings.cooldown, now),
            None => Admission::Go,
        }
    }

    /// A call succeeded: the breaker closes.
    pub(crate) fn success(&self, key: &str) {
        self.lock().entry(key.to_owned()).or_default().success();
    }

    /// A call failed with `kind`. Returns the failure count when this failure opened the
    /// breaker.
    pub(crate) fn failure(
        &self,
        key: &str,
        settings: &CircuitSettings,
        kind: ModelErrorKind,
        now: DateTime<Utc>,
    ) -> Option<u32> {
        if !counts(kind) {
            // Not a sign that the provider is down: a trial in flight is simply released.
            self.release(key, now);
            return None;
        }
        self.lock()
            .entry(key.to_owned())
            .or_default()
            .failure(settings, now)
    }

    /// A trial call ended without a verdict (cancelled, or an error that says nothing about
    /// the provider's health): the next call may be the trial.
    pub(crate) fn release(&self, key: &str, now: DateTime<Utc>) {
        if let Some(breaker) = self.lock().get_mut(key) {
            breaker.release(now);
        }
    }
}

/// Whether an error kind counts toward opening a breaker.
fn counts(kind: ModelErrorKind) -> bool {
    matches!(
        kind,
        ModelErrorKind::Transient | ModelErrorKind::Overloaded | ModelErrorKind::QuotaExhausted
    )
}

/// A jitter in `[0, 1]` from the random bits of a fresh UUIDv7.
pub(crate) fn jitter(uuid: &str) -> f64 {
    let hex: String = uuid.chars().filter(char::is_ascii_hexdigit).collect();
    let tail = &hex[hex.len().saturating_sub(13)..];
    let bits = u64::from_str_radix(tail, 16).unwrap_or(0) & ((1 << 52) - 1);
    bits as f64 / ((1u64 << 52) - 1) as f64
}

/// Which bound a stream broke.
#[derive(Debug, Clone, Copy)]
enum Bound {
    FirstToken,
    Idle,
    Total,
}

/// Streams one attempt of a call under `timeouts`, handing each text delta to `on_text` and
/// each captured HTTP exchange to `on_exchange`.
///
/// The first content chunk (anything but usage or an exchange) must come within
/// `first_token`, then each chunk within `idle` of the previous one, and the whole call within
/// `total`; each broken bound is a `transient` error. The partial answer of a failed attempt is
/// dropped.
pub(crate) async fn stream_once(
    client: Arc<dyn ModelClient>,
    request: &ModelRequest,
    timeouts: ModelTimeouts,
    mut on_text: impl FnMut(&str),
    mut on_exchange: impl FnMut(HttpExchange),
) -> Result<ModelResponse, ModelError> {
    let start = tokio::time::Instant::now();
    let total = timeouts.total.map(|d| start + d);
    let first = timeouts.first_token.map(|d| start + d);
    let mut stream = client.stream(request);
    let mut acc = ResponseAccumulator::new();
    let mut content = false;
    let mut last = start;
    loop {
        let mut bound: Option<(tokio::time::Instant, Bound)> = None;
        let mut consider = |at: Option<tokio::time::Instant>, which: Bound| {
            if let Some(at) = at
                && bound.is_none_or(|(earliest, _)| at < earliest)
            {
                bound = Some((at, which));
            }
        };
        consider(total, Bound::Total);
        if content {
            consider(timeouts.idle.map(|d| last + d), Bound::Idle);
        } else {
            consider(first, Bound::FirstToken);
        }
        let next = match bound {
            Some((at, which)) => match tokio::time::timeout_at(at, stream.next()).await {
                Ok(next) => next,
                Err(_) => return Err(timed_out(which, &timeouts)),
            },
            None => stream.next().await,
        };
        let Some(chunk) = next else { break };
        let chunk = chunk?;
        last = tokio::time::Instant::now();
        if let ModelChunk::Exchange(exchange) = chunk {
            on_exchange(*exchange);
            continue;
        }
        if !matches!(chunk, ModelChunk::Usage(_)) {
            content = true;
        }
        if let ModelChunk::TextDelta(text) = &chunk {
            on_text(text);
        }
        acc.push(chunk);
    }
    let response = acc.finish()?;
    // A tool call cut by the token cap may hold half its arguments: it must never run.
    if response.stop_reason == loom_core::model::StopReason::MaxTokens
        && response.message.tool_calls().next().is_some()
    {
        return Err(ModelError::new(
            loom_core::model::ModelErrorKind::Truncated,
            "answer cut by max_tokens in the middle of a tool call: raise max_tokens",
        ));
    }
    Ok(response)
}

fn timed_out(which: Bound, timeouts: &ModelTimeouts) -> ModelError {
    let secs = |d: Option<Duration>| fmt_secs(d.unwrap_or_default());
    let message = match which {
        Bound::FirstToken => format!(
            "timed out: no first chunk in {} s",
            secs(timeouts.first_token)
        ),
        Bound::Idle => format!(
            "timed out: idle for {} s between chunks",
            secs(timeouts.idle)
        ),
        Bound::Total => format!(
            "timed out: total time of {} s exceeded",
            secs(timeouts.total)
        ),
    };
    ModelError::new(ModelErrorKind::Transient, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_follows_the_formula() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.delay(1, 1.0), Duration::from_secs(1));
        assert_eq!(policy.delay(1, 0.0), Duration::from_millis(500));
        assert_eq!(policy.delay(3, 1.0), Duration::from_secs(4));
        assert_eq!(policy.delay(10, 1.0), Duration::from_secs(30));
        assert_eq!(policy.delay(u32::MAX, 0.0), Duration::from_secs(15));
    }

    #[test]
    fn jitter_is_in_range() {
        let ids = crate::Ids::new(Arc::new(FixedClock));
        for _ in 0..100 {
            let j = jitter(&ids.uuid());
            assert!((0.0..=1.0).contains(&j), "{j}");
        }
    }

    #[derive(Debug)]
    struct FixedClock;
    impl loom_core::ports::Clock for FixedClock {
        fn now(&self) -> DateTime<Utc> {
            DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default()
        }
    }

    #[test]
    fn the_settings_are_those_of_every_breaker() {
        // One breaker for models and MCP servers: the core's settings.
        let settings: loom_core::circuit::CircuitSettings = crate::CircuitSettings::default();
        assert_eq!(settings.cooldown, Duration::from_secs(60));
    }

    #[test]
    fn breaker_opens_skips_and_closes_after_a_trial() {
        let breakers = Breakers::new();
        let settings = CircuitSettings {
            failures: 2,
            cooldown: Duration::from_secs(60),
        };
        let t0 = DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default();
        let key = "model:M";
        assert_eq!(breakers.admit(key, &settings, t0), Admission::Go);
        let kind = ModelErrorKind::Transient;
        assert_eq!(breakers.failure(key, &settings, kind, t0), None);
        assert_eq!(breakers.failure(key, &settings, kind, t0), Some(2));
        assert!(matches!(
            breakers.admit(key, &settings, t0),
            Admission::Skip { .. }
        ));
        let later = t0 + chrono::Duration::seconds(61);
        assert_eq!(breakers.admit(key, &settings, later), Admission::Trial);
        // While the trial is in flight, others skip.
        assert!(matches!(
            breakers.admit(key, &settings, later),
            Admission::Skip { .. }
        ));
        assert_eq!(breakers.failure(key, &settings, kind, later), Some(1));
        assert!(breakers.is_open(key, later));
        let much_later = later + chrono::Duration::seconds(61);
        assert_eq!(breakers.admit(key, &settings, much_later), Admission::Trial);
        breakers.success(key);
        assert_eq!(breakers.admit(key, &settings, much_later), Admission::Go);
        // Auth errors do not count.
        for _ in 0..5 {
            assert_eq!(
                breakers.failure(key, &settings, ModelErrorKind::Auth, much_later),
                None
            );
        }
        assert_eq!(breakers.admit(key, &settings, much_later), Admission::Go);
    }
}
