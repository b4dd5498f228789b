//! How a command ends: the exit code and the line printed for an error, JSON on stdout.

use loom_ia::LoomError;

use crate::{FAILED, OK, REFUSED, output::outln};

pub(super) fn fail(error: &LoomError) -> u8 {
    eprintln!("{}", error_line(error));
    if error.is_refusal() { REFUSED } else { FAILED }
}

/// What `loom` prints for an error.
pub(super) fn error_line(error: &LoomError) -> String {
    match error {
        LoomError::Config(config) => format!("config error: {config}"),
        LoomError::BudgetExhausted { retry_in, .. } => format!(
            "error: {error} — retry in {}",
            loom_ia::budget::human_delay(*retry_in)
        ),
        LoomError::MissingKey { .. } => format!(
            "error: {error}\nhint: the tenant's key must be the one that sealed its journal \
             (storage.encryption.keys: the first seals, all open); a deleted key cannot be \
             recovered, and 'loom sessions delete' or 'loom retention' still erase the session"
        ),
        LoomError::Journal(loom_ia::core::ports::StoreError::Corrupted { .. }) => format!(
            "error: {error}\nhint: 'loom sessions export --valid-only <session>' exports what reads \
             back; 'loom sessions repair <session>' sets the unreadable line aside"
        ),
        other => format!("error: {other}"),
    }
}

/// Prints `value` as indented JSON on stdout.
pub(crate) fn print_json(value: &impl serde::Serialize) -> u8 {
    match serde_json::to_string_pretty(value) {
        Ok(text) => {
            outln!("{text}");
            OK
        }
        Err(error) => {
            eprintln!("error: {error}");
            FAILED
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use loom_ia::{Period, budget::Amount};

    use super::*;

    #[test]
    fn a_tenant_quota_says_when_to_retry_and_is_a_refusal() {
        let error = LoomError::QuotaExceeded {
            tenant: "acme".into(),
            limit: 30,
            retry_after: Duration::from_millis(41_200),
        };
        assert_eq!(
            error_line(&error),
            "error: tenant 'acme': 30 runs per minute exceeded, retry in 42 s"
        );
        assert_eq!(fail(&error), REFUSED);
    }

    #[test]
    fn an_exhausted_tenant_budget_says_when_to_retry() {
        let error = LoomError::BudgetExhausted {
            tenant: "dupont".into(),
            period: Period::Day,
            spent: Amount::Tokens(577),
            limit: Amount::Tokens(100),
            retry_in: Duration::from_secs(11 * 3600 + 57 * 60 + 12),
        };
        assert_eq!(
            error_line(&error),
            "error: tenant 'dupont': tenant budget reached for the day: 577 tokens (limit 100 tokens) — retry in 11 h 57 min"
        );
        assert_eq!(fail(&error), REFUSED);
    }
}
