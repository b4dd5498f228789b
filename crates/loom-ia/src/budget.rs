//! Tenant budgets: ceilings on what a tenant spends over UTC calendar days and months, checked
//! before a run is opened, so a refused run writes nothing.
//!
//! What a tenant spent in a window is what its root runs that *started* in the window spent
//! (tokens and dollars, sub-agents included), folded from the journals of its sessions.

use std::{fmt, str::FromStr, time::Duration};

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use loom_engine::budget::{RunSpent, Spent};
use serde::{Deserialize, Serialize};

/// A tenant's ceilings (`budgets.tenant`); `None`: no ceiling.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TenantBudget {
    /// Dollars per UTC day.
    pub max_cost_per_day: Option<f64>,
    /// Tokens per UTC day.
    pub max_tokens_per_day: Option<u64>,
    /// Dollars per UTC calendar month.
    pub max_cost_per_month: Option<f64>,
    /// Tokens per UTC calendar month.
    pub max_tokens_per_month: Option<u64>,
}

impl TenantBudget {
    /// Whether no ceiling is set.
    pub fn is_empty(&self) -> bool {
        self.max_cost_per_day.is_none()
            && self.max_tokens_per_day.is_none()
            && self.max_cost_per_month.is_none()
            && self.max_tokens_per_month.is_none()
    }

    fn limits_month(&self) -> bool {
        self.max_cost_per_month.is_some() || self.max_tokens_per_month.is_some()
    }
}

/// A UTC calendar window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    /// A UTC day, from midnight.
    Day,
    /// A UTC calendar month, from the first at midnight.
    Month,
}

impl Period {
    /// `day` or `month`.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
        }
    }

    /// The window holding `at`: its first instant, and the first instant after it.
    pub fn window(self, at: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
        let date = at.date_naive();
        let (first, next) = match self {
            Period::Day => (date, date.succ_opt().unwrap_or(date)),
            Period::Month => {
                let first = date.with_day(1).unwrap_or(date);
                let next = if date.month() == 12 {
                    NaiveDate::from_ymd_opt(date.year() + 1, 1, 1)
                } else {
                    NaiveDate::from_ymd_opt(date.year(), date.month() + 1, 1)
                };
                (first, next.unwrap_or(first))
            }
        };
        let midnight =
            |day: NaiveDate| Utc.from_utc_datetime(&day.and_time(chrono::NaiveTime::MIN));
        (midnight(first), midnight(next))
    }

    /// How the window containing `from` is named: `2026-11-29` or `2026-11`.
    pub fn label(self, from: DateTime<Utc>) -> String {
        match self {
            Period::Day => from.format("%Y-%m-%d").to_string(),
            Period::Month => from.format("%Y-%m").to_string(),
        }
    }
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Period {
    type Err = String;

    fn from_str(text: &str) -> Result<Period, String> {
        match text {
            "day" => Ok(Period::Day),
            "month" => Ok(Period::Month),
            other => Err(format!("unknown period '{other}' (day or month)")),
        }
    }
}

/// An amount of a budget: dollars or tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Amount {
    /// Dollars.
    Cost(f64),
    /// Tokens.
    Tokens(u64),
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Amount::Cost(dollars) => write!(f, "{dollars:.5} $"),
            Amount::Tokens(1) => f.write_str("1 token"),
            Amount::Tokens(n) => write!(f, "{n} tokens"),
        }
    }
}

/// A ceiling a tenant reached.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Exhausted {
    pub(crate) period: Period,
    pub(crate) spent: Amount,
    pub(crate) limit: Amount,
    pub(crate) retry_in: Duration,
}

/// Where a tenant-budget check starts reading: the month when a monthly ceiling is set, else
/// the day.
pub(crate) fn scan_from(budget: &TenantBudget, now: DateTime<Utc>) -> DateTime<Utc> {
    let period = if budget.limits_month() {
        Period::Month
    } else {
        Period::Day
    };
    period.window(now).0
}

/// The first ceiling `runs` (root runs of the tenant, at least those started since
/// [`scan_from`]) reach at `now`: monthly ones first (waiting for the next day would not
/// help), dollars before tokens.
#[cfg(test)]
pub(crate) fn exhausted(
    budget: &TenantBudget,
    runs: &[RunSpent],
    now: DateTime<Utc>,
) -> Option<Exhausted> {
    reached(budget, now, |period| spent_in(runs, period, now))
}

/// What `runs` spent in the `period` window holding `now`, counted by the runs' start.
pub(crate) fn spent_in(runs: &[RunSpent], period: Period, now: DateTime<Utc>) -> Spent {
    let (from, to) = period.window(now);
    runs.iter()
        .filter(|r| r.started_at >= from && r.started_at < to)
        .fold(Spent::default(), |sum, r| sum.plus(r.spent))
}

/// The periods `budget` sets a ceiling over.
pub(crate) fn periods(budget: &TenantBudget) -> Vec<Period> {
    let mut periods = Vec::new();
    if budget.limits_month() {
        periods.push(Period::Month);
    }
    if budget.max_cost_per_day.is_some() || budget.max_tokens_per_day.is_some() {
        periods.push(Period::Day);
    }
    periods
}

/// The first ceiling reached at `now`, given what was spent in the window of each period
/// (`spent`): monthly ones first, dollars before tokens.
pub(crate) fn reached(
    budget: &TenantBudget,
    now: DateTime<Utc>,
    spent: impl Fn(Period) -> Spent,
) -> Option<Exhausted> {
    let checks = [
        (Period::Month, budget.max_cost_per_month, None),
        (Period::Month, None, budget.max_tokens_per_month),
        (Period::Day, budget.max_cost_per_day, None),
        (Period::Day, None, budget.max_tokens_per_day),
    ];
    for (period, cost, tokens) in checks {
        let (_, to) = period.window(now);
        if cost.is_none() && tokens.is_none() {
            continue;
        }
        let spent = spent(period);
        let reached = match (cost, tokens) {
            (Some(limit), _) if spent.cost_usd >= limit => {
                Some((Amount::Cost(spent.cost_usd), Amount::Cost(limit)))
            }
            (_, Some(limit)) if spent.tokens >= limit => {
                Some((Amount::Tokens(spent.tokens), Amount::Tokens(limit)))
            }
            _ => None,
        };
        if let Some((spent, limit)) = reached {
            return Some(Exhausted {
                period,
                spent,
                limit,
                retry_in: (to - now).to_std().unwrap_or_default(),
            });
        }
    }
    None
}

/// A delay as people read it: `11 h 57 min`, `3 d 4 h`, `12 min`, `40 s`.
pub fn human_delay(delay: Duration) -> String {
    let secs = delay.as_secs();
    let (days, hours, minutes) = (secs / 86_400, secs % 86_400 / 3600, secs % 3600 / 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{} s", secs.max(1)),
        (0, 0, m) => format!("{m} min"),
        (0, h, m) => format!("{h} h {m} min"),
        (d, h, _) => format!("{d} d {h} h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().to_utc()
    }

    fn spent(run_id: &str, started: &str, tokens: u64, cost_usd: f64) -> RunSpent {
        RunSpent {
            run_id: run_id.into(),
            started_at: at(started),
            spent: Spent {
                tokens,
                cost_usd,
                calls: 1,
            },
        }
    }

    #[test]
    fn windows_are_utc_calendar_days_and_months() {
        let now = at("2026-12-31T23:59:59Z");
        assert_eq!(
            Period::Day.window(now),
            (at("2026-12-31T00:00:00Z"), at("2027-01-01T00:00:00Z"))
        );
        assert_eq!(
            Period::Month.window(at("2026-02-14T08:00:00+05:00")),
            (at("2026-02-01T00:00:00Z"), at("2026-03-01T00:00:00Z"))
        );
        assert_eq!(Period::Month.label(at("2026-02-01T00:00:00Z")), "2026-02");
        assert_eq!("month".parse::<Period>(), Ok(Period::Month));
        assert!("week".parse::<Period>().is_err());
    }

    #[test]
    fn a_day_ceiling_counts_the_runs_started_that_day() {
        let budget = TenantBudget {
            max_tokens_per_day: Some(100),
            ..TenantBudget::default()
        };
        let now = at("2026-11-29T12:03:00Z");
        let runs = [
            spent("yesterday", "2026-11-28T23:00:00Z", 5000, 0.5),
            spent("a", "2026-11-29T08:00:00Z", 60, 0.001),
        ];
        assert_eq!(exhausted(&budget, &runs, now), None);
        let runs = [
            runs[0].clone(),
            runs[1].clone(),
            spent("b", "2026-11-29T09:00:00Z", 517, 0.002),
        ];
        let hit = exhausted(&budget, &runs, now).unwrap();
        assert_eq!(hit.period, Period::Day);
        assert_eq!(hit.spent, Amount::Tokens(577));
        assert_eq!(hit.limit, Amount::Tokens(100));
        assert_eq!(human_delay(hit.retry_in), "11 h 57 min");
    }

    #[test]
    fn a_month_ceiling_wins_over_a_day_ceiling() {
        let budget = TenantBudget {
            max_cost_per_day: Some(0.01),
            max_cost_per_month: Some(0.02),
            ..TenantBudget::default()
        };
        let now = at("2026-11-29T12:00:00Z");
        let runs = [
            spent("early", "2026-11-02T08:00:00Z", 10, 0.015),
            spent("today", "2026-11-29T08:00:00Z", 10, 0.011),
        ];
        let hit = exhausted(&budget, &runs, now).unwrap();
        assert_eq!(hit.period, Period::Month);
        assert_eq!(hit.limit, Amount::Cost(0.02));
        assert_eq!(human_delay(hit.retry_in), "1 d 12 h");
        assert_eq!(scan_from(&budget, now), at("2026-11-01T00:00:00Z"));
        assert_eq!(Amount::Cost(0.026).to_string(), "0.02600 $");
    }
}
