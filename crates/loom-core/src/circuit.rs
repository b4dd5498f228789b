//! The circuit breaker of a remote target: one state machine for models (in the engine) and
//! MCP servers (in `loom-mcp`).
//!
//! Consecutive failures open it for a cooldown, during which calls are refused without being
//! tried; after the cooldown one trial call is let through: its success closes the breaker, its
//! failure opens it again at once. A trial whose caller vanished (a cancelled call) stops
//! blocking after a time the caller chooses.
//!
//! The machine is pure: every method takes the instant it happens at as a value, of any type
//! that is a [`Moment`] — a wall-clock `DateTime<Utc>` read from the engine's clock port, or a
//! monotonic `std::time::Instant` for an MCP server. So it is tested without waiting, and this
//! crate reads no clock. What counts as a failure (which model error kinds, which MCP errors)
//! is the caller's decision: it reports only those.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// When a breaker opens (`models[].circuit_breaker`, `mcp_servers[].circuit_breaker`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitSettings {
    /// Consecutive failures that open it (`0` behaves as `1`).
    pub failures: u32,
    /// How long it stays open before one trial call is let through.
    pub cooldown: Duration,
}

impl Default for CircuitSettings {
    /// `{failures: 5, cooldown: 60 s}`.
    fn default() -> CircuitSettings {
        CircuitSettings {
            failures: 5,
            cooldown: Duration::from_secs(60),
        }
    }
}

/// A point in time as a breaker sees it: ordered, and moved forward by a duration.
pub trait Moment: Copy + Ord {
    /// `self + duration`, saturating at the latest representable moment.
    fn plus(self, duration: Duration) -> Self;
    /// The time from `self` until `later` (zero when `later` is not after `self`).
    fn until(self, later: Self) -> Duration;
}

impl Moment for std::time::Instant {
    fn plus(self, duration: Duration) -> Self {
        // `Instant` has no maximum: halve an overflowing duration until it fits.
        let mut duration = duration;
        loop {
            match self.checked_add(duration) {
                Some(later) => return later,
                None => duration /= 2,
            }
        }
    }

    fn until(self, later: Self) -> Duration {
        later.saturating_duration_since(self)
    }
}

impl Moment for DateTime<Utc> {
    fn plus(self, duration: Duration) -> Self {
        chrono::Duration::from_std(duration)
            .ok()
            .and_then(|d| self.checked_add_signed(d))
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    }

    fn until(self, later: Self) -> Duration {
        (later - self).to_std().unwrap_or(Duration::ZERO)
    }
}

/// Whether a call may go to the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission<T> {
    /// Closed: go.
    Go,
    /// The cooldown passed: this call is the trial.
    Trial,
    /// Open, or a trial is in flight: refuse the call without trying it, until `until`.
    Skip {
        /// When a call may be tried again.
        until: T,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State<T> {
    Closed {
        failures: u32,
    },
    Open {
        until: T,
    },
    /// One trial call is in flight since `since`.
    Trial {
        since: T,
    },
}

/// The breaker of one target. Starts closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breaker<T> {
    state: State<T>,
}

impl<T: Moment> Default for Breaker<T> {
    fn default() -> Self {
        Breaker::new()
    }
}

impl<T: Moment> Breaker<T> {
    /// A closed breaker.
    pub fn new() -> Breaker<T> {
        Breaker {
            state: State::Closed { failures: 0 },
        }
    }

    /// Asks whether a call may go through at `now`. After the cooldown the first call is the
    /// trial; a trial that has not reported within `trial_expiry` is taken as abandoned, and
    /// the next call becomes the trial.
    pub fn admit(&mut self, trial_expiry: Duration, now: T) -> Admission<T> {
        match self.state {
            State::Closed { .. } => Admission::Go,
            State::Open { until } if now < until => Admission::Skip { until },
            State::Trial { since } if now < since.plus(trial_expiry) => Admission::Skip {
                until: since.plus(trial_expiry),
            },
            State::Open { .. } | State::Trial { .. } => {
                self.state = State::Trial { since: now };
                Admission::Trial
            }
        }
    }

    /// A call succeeded: the breaker closes. Returns whether it was open or on trial.
    pub fn success(&mut self) -> bool {
        let was_open = !matches!(self.state, State::Closed { .. });
        self.state = State::Closed { failures: 0 };
        was_open
    }

    /// A call failed at `now` (the caller reports only failures that count). Returns the
    /// consecutive failures when this one opened the breaker: the threshold when it was closed,
    /// `1` for a failed trial. A call that started before the breaker opened is not counted
    /// again.
    pub fn failure(&mut self, settings: &CircuitSettings, now: T) -> Option<u32> {
        let until = now.plus(settings.cooldown);
        match self.state {
            State::Closed { failures } => {
                let failures = failures.saturating_add(1);
                if failures >= settings.failures.max(1) {
                    self.state = State::Open { until };
                    Some(failures)
                } else {
                    self.state = State::Closed { failures };
                    None
                }
            }
            State::Trial { .. } => {
                self.state = State::Open { until };
                Some(1)
            }
            State::Open { .. } => None,
        }
    }

    /// A trial ended without a verdict (cancelled, or an error that says nothing about the
    /// target's health): the next call may be the trial.
    pub fn release(&mut self, now: T) {
        if let State::Trial { .. } = self.state {
            self.state = State::Open { until: now };
        }
    }

    /// Until when it stays open, when it is open and still cooling down at `now`.
    pub fn open_until(&self, now: T) -> Option<T> {
        match self.state {
            State::Open { until } if now < until => Some(until),
            _ => None,
        }
    }

    /// Whether it refuses calls at `now`: open and cooling down, or a trial in flight.
    pub fn is_open(&self, now: T) -> bool {
        match self.state {
            State::Open { until } => now < until,
            State::Trial { .. } => true,
            State::Closed { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const SETTINGS: CircuitSettings = CircuitSettings {
        failures: 2,
        cooldown: Duration::from_secs(60),
    };

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default()
    }

    #[test]
    fn opens_skips_lets_one_trial_through_and_closes() {
        let mut breaker = Breaker::new();
        let t0 = t0();
        let expiry = SETTINGS.cooldown;
        assert_eq!(breaker.admit(expiry, t0), Admission::Go);
        assert_eq!(breaker.failure(&SETTINGS, t0), None);
        assert_eq!(breaker.failure(&SETTINGS, t0), Some(2));
        let reopen = t0 + chrono::Duration::seconds(60);
        assert_eq!(breaker.open_until(t0), Some(reopen));
        assert_eq!(breaker.admit(expiry, t0), Admission::Skip { until: reopen });
        // A call that started before it opened is not counted again.
        assert_eq!(breaker.failure(&SETTINGS, t0), None);

        let later = t0 + chrono::Duration::seconds(61);
        assert_eq!(breaker.admit(expiry, later), Admission::Trial);
        // While the trial is in flight, others skip.
        assert!(matches!(
            breaker.admit(expiry, later),
            Admission::Skip { .. }
        ));
        assert!(breaker.is_open(later));
        // The trial fails: open again at once.
        assert_eq!(breaker.failure(&SETTINGS, later), Some(1));
        assert!(breaker.is_open(later));

        let much_later = later + chrono::Duration::seconds(61);
        assert!(!breaker.is_open(much_later));
        assert_eq!(breaker.admit(expiry, much_later), Admission::Trial);
        assert!(breaker.success());
        assert_eq!(breaker.admit(expiry, much_later), Admission::Go);
        assert!(!breaker.success());
        // One failure after it closed does not open it.
        assert_eq!(breaker.failure(&SETTINGS, much_later), None);
        assert_eq!(breaker.admit(expiry, much_later), Admission::Go);
    }

    #[test]
    fn an_abandoned_trial_expires_and_a_released_one_is_retried_at_once() {
        let mut breaker = Breaker::new();
        let t0 = Instant::now();
        let expiry = Duration::from_secs(10);
        breaker.failure(&SETTINGS, t0);
        breaker.failure(&SETTINGS, t0);
        let after = t0 + Duration::from_secs(61);
        assert_eq!(breaker.admit(expiry, after), Admission::Trial);
        assert_eq!(
            breaker.admit(expiry, after + Duration::from_secs(5)),
            Admission::Skip {
                until: after + expiry
            }
        );
        assert_eq!(
            breaker.admit(expiry, after + Duration::from_secs(11)),
            Admission::Trial
        );
        breaker.release(after + Duration::from_secs(12));
        assert_eq!(breaker.open_until(after + Duration::from_secs(12)), None);
        assert_eq!(
            breaker.admit(expiry, after + Duration::from_secs(12)),
            Admission::Trial
        );
    }

    #[test]
    fn a_cooldown_too_long_for_the_clock_saturates() {
        let settings = CircuitSettings {
            failures: 1,
            cooldown: Duration::MAX,
        };
        let mut wall = Breaker::new();
        assert_eq!(wall.failure(&settings, t0()), Some(1));
        assert_eq!(wall.open_until(t0()), Some(DateTime::<Utc>::MAX_UTC));
        let mut mono = Breaker::new();
        let now = Instant::now();
        assert_eq!(mono.failure(&settings, now), Some(1));
        assert!(mono.open_until(now).is_some_and(|until| until > now));
        // `0` failures behaves as 1.
        let mut eager = Breaker::new();
        let zero = CircuitSettings {
            failures: 0,
            ..settings
        };
        assert_eq!(eager.failure(&zero, now), Some(1));
    }

    #[test]
    fn moments_measure_the_time_until_a_later_one() {
        let t0 = t0();
        assert_eq!(
            t0.until(t0 + chrono::Duration::seconds(3)),
            Duration::from_secs(3)
        );
        assert_eq!(
            (t0 + chrono::Duration::seconds(3)).until(t0),
            Duration::ZERO
        );
        let now = Instant::now();
        assert_eq!(
            now.until(now.plus(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        assert_eq!(now.plus(Duration::from_secs(2)).until(now), Duration::ZERO);
    }
}
