//! Waiting, in a test, for something that another task, thread or process does: poll until it
//! holds, or fail after a deadline with a message that says what was awaited and what was last
//! seen. A polling loop written by hand hangs when the awaited thing never happens; these fail.
//!
//! What a poll returns says whether the wait is over ([`Ready`]): `true`, `Some(value)` or
//! `Ok(value)`; `false`, `None` or `Err(last seen)` mean "not yet" (an `Err` is quoted in the
//! failure).
//!
//! ```no_run
//! # async fn demo(done: &std::sync::atomic::AtomicBool) {
//! use std::sync::atomic::Ordering;
//! loom_testkit::wait::until("the worker to finish", async || done.load(Ordering::SeqCst)).await;
//! # }
//! ```
//!
//! The deadline is [`PATIENCE`]: long, because a machine running many test binaries at once is
//! slow, and only ever reached when something is broken. Nothing here asserts how long a thing
//! took.

use std::{
    fmt,
    time::{Duration, Instant},
};

/// How long a wait lasts before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(90);

/// The pause between two polls of an async wait.
const ASYNC_EVERY: Duration = Duration::from_millis(10);

/// The pause between two polls of a blocking wait.
const BLOCKING_EVERY: Duration = Duration::from_millis(20);

/// What a poll returns: ready with a value, or not yet (with what was seen, if anything).
pub trait Ready {
    /// What the wait gives back once ready.
    type Value;

    /// `Ok(value)` when ready; `Err(what was seen)` otherwise.
    fn ready(self) -> Result<Self::Value, Option<String>>;
}

impl Ready for bool {
    type Value = ();

    fn ready(self) -> Result<(), Option<String>> {
        if self { Ok(()) } else { Err(None) }
    }
}

impl<T> Ready for Option<T> {
    type Value = T;

    fn ready(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: fmt::Display> Ready for Result<T, E> {
    type Value = T;

    fn ready(self) -> Result<T, Option<String>> {
        self.map_err(|seen| Some(seen.to_string()))
    }
}

/// A wait that ran out: what was awaited, for how long, and the last thing seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedOut {
    /// What the test waited for.
    pub what: String,
    /// How long it waited.
    pub after: Duration,
    /// What the last poll reported, when it said anything.
    pub last: Option<String>,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gave up waiting for {} after {} s",
            self.what,
            self.after.as_secs_f64()
        )?;
        if let Some(last) = &self.last {
            write!(f, "; last seen: {last}")?;
        }
        Ok(())
    }
}

impl std::error::Error for TimedOut {}

/// Polls `poll` until it is ready, at most `limit`; the value, or what timed out.
pub async fn poll_within<R: Ready>(
    what: impl fmt::Display,
    limit: Duration,
    mut poll: impl AsyncFnMut() -> R,
) -> Result<R::Value, TimedOut> {
    let deadline = Instant::now() + limit;
    loop {
        let last = match poll().await.ready() {
            Ok(value) => return Ok(value),
            Err(last) => last,
        };
        if Instant::now() >= deadline {
            return Err(TimedOut {
                what: what.to_string(),
                after: limit,
                last,
            });
        }
        tokio::time::sleep(ASYNC_EVERY).await;
    }
}

/// Polls `poll` until it is ready; fails the test after [`PATIENCE`], naming `what`.
pub async fn until<R: Ready>(what: impl fmt::Display, poll: impl AsyncFnMut() -> R) -> R::Value {
    match poll_within(what, PATIENCE, poll).await {
        Ok(value) => value,
        Err(timed_out) => panic!("{timed_out}"),
    }
}

/// Polls `poll` on this thread until it is ready, at most `limit`; the value, or what timed
/// out. For tests without a runtime (child processes, servers on threads).
pub fn blocking_poll_within<R: Ready>(
    what: impl fmt::Display,
    limit: Duration,
    mut poll: impl FnMut() -> R,
) -> Result<R::Value, TimedOut> {
    let deadline = Instant::now() + limit;
    loop {
        let last = match poll().ready() {
            Ok(value) => return Ok(value),
            Err(last) => last,
        };
        if Instant::now() >= deadline {
            return Err(TimedOut {
                what: what.to_string(),
                after: limit,
                last,
            });
        }
        std::thread::sleep(BLOCKING_EVERY);
    }
}

/// Polls `poll` on this thread until it is ready; fails the test after [`PATIENCE`], naming
/// `what`.
pub fn blocking_until<R: Ready>(what: impl fmt::Display, poll: impl FnMut() -> R) -> R::Value {
    match blocking_poll_within(what, PATIENCE, poll) {
        Ok(value) => value,
        Err(timed_out) => panic!("{timed_out}"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn a_wait_gives_the_value_once_ready() {
        let polls = AtomicUsize::new(0);
        let value = until("the third poll", async || {
            (polls.fetch_add(1, Ordering::SeqCst) == 2).then_some("ready")
        })
        .await;
        assert_eq!(value, "ready");
        assert_eq!(polls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_wait_that_never_ends_fails_naming_what_it_awaited() {
        let timed_out = poll_within(
            "the answer",
            Duration::from_millis(30),
            async || -> Result<(), String> { Err("status 404".to_owned()) },
        )
        .await
        .unwrap_err();
        assert_eq!(timed_out.what, "the answer");
        assert_eq!(
            timed_out.to_string(),
            "gave up waiting for the answer after 0.03 s; last seen: status 404"
        );
    }

    #[test]
    fn a_blocking_wait_fails_or_gives_the_value() {
        let timed_out =
            blocking_poll_within("a file", Duration::from_millis(30), || false).unwrap_err();
        assert_eq!(
            timed_out.to_string(),
            "gave up waiting for a file after 0.03 s"
        );
        let mut polls = 0;
        blocking_until("the second poll", || {
            polls += 1;
            polls == 2
        });
        assert_eq!(polls, 2);
    }
}
