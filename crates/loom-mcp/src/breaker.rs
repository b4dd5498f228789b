//! The circuit breaker of one server and the growing delay between reconnections.
//!
//! The breaker is the core's ([`loom_core::circuit`], the same state machine as a model's in
//! the engine) over monotonic `Instant`s, so it is tested without waiting.

use std::time::{Duration, Instant};

use loom_core::{
    circuit::{self, Admission, CircuitSettings, Moment},
    ports::CircuitNotice,
};

/// First reconnection delay after a failure.
pub(crate) const BACKOFF_BASE: Duration = Duration::from_millis(500);
/// Longest reconnection delay.
pub(crate) const BACKOFF_CAP: Duration = Duration::from_secs(30);

/// The delay before reconnecting after `failures` consecutive failures: 0 for none, then
/// 0.5 s, 1 s, 2 s … capped at 30 s.
pub(crate) fn backoff_delay(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let exponent = (failures - 1).min(16);
    BACKOFF_BASE
        .saturating_mul(1u32 << exponent)
        .min(BACKOFF_CAP)
}

/// Why the breaker refused an attempt.
#[derive(Debug)]
pub(crate) struct Refusal {
    /// Time until a trial is let through.
    pub(crate) remaining: Duration,
}

/// The breaker of one server: the core state machine ([`circuit::Breaker`]) over monotonic
/// instants, the server's settings, and the notice of its last opening, reported once.
///
/// Consecutive connection failures ≥ `failures` open it for `cooldown`; after the cooldown one
/// trial goes through: success closes it, failure opens it again at once.
#[derive(Debug)]
pub(crate) struct Breaker {
    target: String,
    settings: CircuitSettings,
    /// A trial whose caller vanished (cancelled future) stops blocking after this long.
    trial_expiry: Duration,
    circuit: circuit::Breaker<Instant>,
    /// The opening not yet reported (cleared once reported, or when the breaker moves on).
    notice: Option<CircuitNotice>,
}

impl Breaker {
    pub(crate) fn new(
        target: String,
        settings: CircuitSettings,
        trial_expiry: Duration,
    ) -> Breaker {
        Breaker {
            target,
            settings,
            trial_expiry,
            circuit: circuit::Breaker::new(),
            notice: None,
        }
    }

    /// May a connection attempt start now?
    pub(crate) fn admit(&mut self, now: Instant) -> Result<(), Refusal> {
        match self.circuit.admit(self.trial_expiry, now) {
            Admission::Go => Ok(()),
            Admission::Trial => {
                tracing::info!(target = %self.target, "circuit breaker: cooldown over, one trial");
                self.notice = None;
                Ok(())
            }
            Admission::Skip { until } => Err(Refusal {
                remaining: now.until(until),
            }),
        }
    }

    /// How long it stays open, when it is open and not yet due for a trial.
    pub(crate) fn open_for(&self, now: Instant) -> Option<Duration> {
        self.circuit.open_until(now).map(|until| now.until(until))
    }

    /// A connection or a call succeeded.
    pub(crate) fn success(&mut self) {
        if self.circuit.success() {
            tracing::info!(target = %self.target, "circuit breaker closed");
        }
        self.notice = None;
    }

    /// A connection failed; opens the breaker when the threshold is reached.
    pub(crate) fn failure(&mut self, now: Instant, error: &str) {
        let Some(failures) = self.circuit.failure(&self.settings, now) else {
            return;
        };
        tracing::warn!(
            target = %self.target,
            failures,
            cooldown_s = self.settings.cooldown.as_secs_f64(),
            error,
            "circuit breaker opened"
        );
        self.notice = Some(CircuitNotice {
            target: self.target.clone(),
            failures,
            cooldown_s: self.settings.cooldown.as_secs_f64(),
            error: error.to_owned(),
        });
    }

    /// The notice of the opening, the first time it is asked for after the breaker opened.
    pub(crate) fn take_notice(&mut self) -> Option<CircuitNotice> {
        self.notice.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(
            "mcp:x".into(),
            CircuitSettings {
                failures: 3,
                cooldown: Duration::from_secs(60),
            },
            Duration::from_secs(10),
        )
    }

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff_delay(0), Duration::ZERO);
        assert_eq!(backoff_delay(1), Duration::from_millis(500));
        assert_eq!(backoff_delay(2), Duration::from_secs(1));
        assert_eq!(backoff_delay(3), Duration::from_secs(2));
        assert_eq!(backoff_delay(10), BACKOFF_CAP);
        assert_eq!(backoff_delay(u32::MAX), BACKOFF_CAP);
    }

    #[test]
    fn opens_reports_once_then_trial() {
        let mut b = breaker();
        let t0 = Instant::now();
        b.failure(t0, "e1");
        b.failure(t0, "e2");
        assert!(b.admit(t0).is_ok());
        assert!(b.take_notice().is_none());
        b.failure(t0, "e3");
        assert_eq!(b.open_for(t0), Some(Duration::from_secs(60)));
        assert!(b.admit(t0).is_err());
        let notice = b.take_notice().unwrap();
        assert_eq!(notice.target, "mcp:x");
        assert_eq!(notice.failures, 3);
        assert_eq!(notice.error, "e3");
        assert!(b.take_notice().is_none(), "reported once");

        // After the cooldown: one trial, the others wait.
        let later = t0 + Duration::from_secs(61);
        assert!(b.admit(later).is_ok());
        assert!(b.admit(later).is_err());
        // The trial fails: open again, with a new notice.
        b.failure(later, "e4");
        assert!(b.admit(later).is_err());
        let reopened = b.take_notice().unwrap();
        assert_eq!(reopened.error, "e4");
        // The failed trial alone reopened it, as a model's breaker says.
        assert_eq!(reopened.failures, 1);

        // Next trial succeeds: closed.
        let much_later = later + Duration::from_secs(61);
        assert!(b.admit(much_later).is_ok());
        b.success();
        assert!(b.admit(much_later).is_ok());
        b.failure(much_later, "e5");
        assert!(b.admit(much_later).is_ok(), "one failure does not open it");
    }

    #[test]
    fn the_settings_are_those_of_every_breaker() {
        // One breaker for models and MCP servers: the core's state machine and settings.
        let settings: loom_core::circuit::CircuitSettings = crate::CircuitSettings::default();
        assert_eq!(settings.failures, 5);
        let _: circuit::Breaker<Instant> = breaker().circuit;
    }

    #[test]
    fn abandoned_trial_expires() {
        let mut b = breaker();
        let t0 = Instant::now();
        for _ in 0..3 {
            b.failure(t0, "e");
        }
        let after = t0 + Duration::from_secs(61);
        assert!(b.admit(after).is_ok());
        assert!(b.admit(after + Duration::from_secs(5)).is_err());
        assert!(b.admit(after + Duration::from_secs(11)).is_ok());
    }
}
