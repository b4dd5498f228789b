//! Durations as the journal and the user write them.

use std::time::Duration;

/// A duration in milliseconds read from the journal (a sum of `step.completed.duration_ms`),
/// whatever the journal holds: a negative or NaN value counts as nothing, a value too large for
/// a `Duration` (infinite included) as the longest one.
pub(crate) fn millis(ms: f64) -> Duration {
    if ms.is_nan() || ms <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(Duration::MAX)
}

/// Seconds as the user wrote them: `30`, `0.2`.
pub(crate) fn fmt_secs(duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs.fract() == 0.0 {
        format!("{secs:.0}")
    } else {
        format!("{secs}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_journaled_duration_is_a_duration() {
        assert_eq!(millis(1500.0), Duration::from_millis(1500));
        for nothing in [0.0, -0.0, -12.5, f64::NEG_INFINITY, f64::NAN] {
            assert_eq!(millis(nothing), Duration::ZERO, "{nothing}");
        }
        for huge in [f64::MAX, f64::INFINITY, 1e300, 2e22] {
            assert_eq!(millis(huge), Duration::MAX, "{huge}");
        }
    }
}
