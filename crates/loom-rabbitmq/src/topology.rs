//! The queues of one prefix, how a job is routed among them, and their declaration.
//!
//! - `<prefix>.jobs`: a quorum queue; the broker counts the deliveries of each message
//!   (`x-delivery-count`) and dead-letters one returned `max_attempts` times
//!   (`x-delivery-limit = max_attempts - 1`) into `<prefix>.jobs.dead`, at least once
//!   (`x-dead-letter-strategy: at-least-once`, which needs `x-overflow: reject-publish`).
//! - `<prefix>.jobs.delayed.<2^k>s` for k in 0..[`BUCKETS`]: quorum queues whose messages all
//!   live `2^k` seconds (`x-message-ttl`), then are dead-lettered (at least once) into
//!   `<prefix>.jobs`. One TTL per queue means no message ever waits behind a longer one.
//! - `<prefix>.jobs.dead`: a durable classic queue, so that peeking (get, then requeue) keeps
//!   its order.

use chrono::{DateTime, Utc};
use lapin::{
    Channel,
    options::QueueDeclareOptions,
    types::{AMQPValue, FieldTable, LongString, ShortString},
};

use crate::error::RabbitError;

/// How many delay buckets there are: 1 s, 2 s, 4 s, … 2^15 s (about 9 hours). A longer delay
/// hops through the largest bucket as many times as needed.
pub(crate) const BUCKETS: u32 = 16;

/// The names of one prefix's queues.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    /// `<prefix>.jobs`.
    pub(crate) jobs: String,
    /// `<prefix>.jobs.dead`.
    pub(crate) dead: String,
    /// `<prefix>.jobs.delayed.<2^k>s`, by k.
    pub(crate) buckets: Vec<String>,
}

impl Names {
    /// The names under `prefix`, which must be 1–200 characters among ASCII letters, digits,
    /// `.`, `-` and `_`.
    pub(crate) fn new(prefix: &str) -> Result<Names, RabbitError> {
        if prefix.is_empty() || prefix.len() > 200 {
            return Err(RabbitError::Options(format!(
                "prefix {prefix:?} must be 1 to 200 characters long"
            )));
        }
        if let Some(bad) = prefix
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
        {
            return Err(RabbitError::Options(format!(
                "prefix {prefix:?} holds {bad:?}: use ASCII letters, digits, '.', '-' and '_'"
            )));
        }
        Ok(Names {
            jobs: format!("{prefix}.jobs"),
            dead: format!("{prefix}.jobs.dead"),
            buckets: (0..BUCKETS)
                .map(|k| format!("{prefix}.jobs.delayed.{}s", 1u64 << k))
                .collect(),
        })
    }

    /// Where a job not to be delivered before `not_before` goes at `now`: `<prefix>.jobs` when
    /// it is due, else the largest bucket not longer than what remains (the 1 s bucket under a
    /// second), so a job is never early and at most about a second late.
    pub(crate) fn route(&self, not_before: Option<DateTime<Utc>>, now: DateTime<Utc>) -> &str {
        let Some(at) = not_before else {
            return &self.jobs;
        };
        let remaining = (at - now).num_milliseconds();
        if remaining <= 0 {
            return &self.jobs;
        }
        let seconds = u64::try_from(remaining / 1000).unwrap_or(0);
        let k = if seconds == 0 {
            0
        } else {
            (63 - seconds.leading_zeros()).min(BUCKETS - 1)
        };
        self.buckets
            .get(k as usize)
            .map_or(self.jobs.as_str(), String::as_str)
    }

    /// Every queue of the prefix (jobs, buckets, dead).
    pub(crate) fn all(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.jobs.as_str())
            .chain(self.buckets.iter().map(String::as_str))
            .chain(std::iter::once(self.dead.as_str()))
    }
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

fn quorum(dead_letter_to: &str) -> FieldTable {
    let mut arguments = FieldTable::default();
    arguments
        .insert(ShortString::from("x-queue-type"), text("quorum"))
        .insert(ShortString::from("x-dead-letter-exchange"), text(""))
        .insert(
            ShortString::from("x-dead-letter-routing-key"),
            text(dead_letter_to),
        )
        .insert(
            ShortString::from("x-dead-letter-strategy"),
            text("at-least-once"),
        )
        .insert(ShortString::from("x-overflow"), text("reject-publish"));
    arguments
}

/// Declares the queues (idempotent: a queue that exists with the same arguments is left as
/// it is; one with other arguments is a refusal naming it).
pub(crate) async fn declare(
    channel: &Channel,
    names: &Names,
    max_attempts: u32,
) -> Result<(), RabbitError> {
    let durable = QueueDeclareOptions::durable();
    let what = |queue: &str| {
        format!(
            "declaring queue {queue} (a queue of that name with other arguments, such as another max_attempts, must be deleted first)"
        )
    };
    channel
        .queue_declare(names.dead.as_str().into(), durable, FieldTable::default())
        .await
        .map_err(|error| RabbitError::from_lapin(what(&names.dead), &error))?;
    let mut jobs = quorum(&names.dead);
    jobs.insert(
        ShortString::from("x-delivery-limit"),
        AMQPValue::LongLongInt(i64::from(max_attempts.saturating_sub(1))),
    );
    channel
        .queue_declare(names.jobs.as_str().into(), durable, jobs)
        .await
        .map_err(|error| RabbitError::from_lapin(what(&names.jobs), &error))?;
    for (k, bucket) in names.buckets.iter().enumerate() {
        let mut arguments = quorum(&names.jobs);
        arguments.insert(
            ShortString::from("x-message-ttl"),
            AMQPValue::LongLongInt(1000_i64 << k),
        );
        channel
            .queue_declare(bucket.as_str().into(), durable, arguments)
            .await
            .map_err(|error| RabbitError::from_lapin(what(bucket), &error))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use chrono::{Duration, TimeZone};

    use super::*;

    #[test]
    fn jobs_go_to_the_largest_bucket_not_longer_than_their_delay() {
        let names = Names::new("loom").unwrap();
        let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let at = |ms: i64| Some(now + Duration::milliseconds(ms));
        assert_eq!(names.route(None, now), "loom.jobs");
        assert_eq!(names.route(at(-5), now), "loom.jobs");
        assert_eq!(names.route(at(0), now), "loom.jobs");
        assert_eq!(names.route(at(300), now), "loom.jobs.delayed.1s");
        assert_eq!(names.route(at(1_999), now), "loom.jobs.delayed.1s");
        assert_eq!(names.route(at(2_000), now), "loom.jobs.delayed.2s");
        assert_eq!(names.route(at(7_000), now), "loom.jobs.delayed.4s");
        assert_eq!(names.route(at(86_400_000), now), "loom.jobs.delayed.32768s");
    }

    #[test]
    fn a_bad_prefix_is_named() {
        assert!(Names::new("").is_err());
        let error = Names::new("loom jobs").unwrap_err().to_string();
        assert!(
            error.contains("\"loom jobs\"") && error.contains("' '"),
            "{error}"
        );
        assert_eq!(Names::new("a").unwrap().all().count(), 2 + BUCKETS as usize);
    }
}
