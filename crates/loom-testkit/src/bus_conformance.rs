//! The event bus conformance suite: scenarios every [`EventBus`] must pass, whatever carries
//! the signals (a broadcast channel, Redis pub/sub, PostgreSQL `LISTEN/NOTIFY`).
//!
//! Each scenario is a `pub async fn` taking an [`OpenBus`] factory: every call must return an
//! *independent* bus instance on the same backend (its own connections), as another process
//! would have; an in-process bus hands out clones of one bus. A scenario panics when the bus
//! misbehaves, and gives up on a signal that does not come after [`crate::wait::PATIENCE`].
//!
//! [`bus_conformance!`](macro@crate::bus_conformance) turns the suite into `#[tokio::test]`
//! functions for one backend:
//!
//! ```ignore
//! loom_testkit::bus_conformance!(memory, {
//!     let bus = MemoryBus::new();
//!     ((), move || {
//!         let bus: Arc<dyn EventBus> = Arc::new(bus.clone());
//!         Box::pin(async move { bus }) as BoxFuture<'static, Arc<dyn EventBus>>
//!     })
//! });
//! ```

// The scenarios are assertions: a failure must panic with the bus's error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use futures_util::StreamExt;
use loom_core::{
    BoxFuture,
    bus::{EventBus, Notice, Signal, Signals},
};

use crate::wait::PATIENCE;

/// A factory handing out independent bus instances on one backend (see the module
/// documentation).
pub type OpenBus<'a> = &'a dyn Fn() -> BoxFuture<'static, Arc<dyn EventBus>>;

/// Runs every scenario of the suite as a `#[tokio::test]` in a module `$name`.
///
/// `$setup` is evaluated once per test, inside the module (which sees the caller's imports
/// through `use super::*`), and must give `(guard, open)`: `guard` is kept alive for the test
/// (a test database, say) and `open` is a closure `Fn() -> BoxFuture<'static, Arc<dyn
/// EventBus>>` building independent instances on the same backend. The calling crate needs
/// `tokio` with its `macros` and `rt-multi-thread` features.
#[macro_export]
macro_rules! bus_conformance {
    ($name:ident, $setup:expr) => {
        $crate::bus_conformance!(@tests $name, $setup;
            a_signal_reaches_every_subscriber_of_every_instance,
            nothing_published_before_a_subscription_is_received,
            cancel_signals_round_trip,
            ping_answers,
        );
    };
    (@tests $name:ident, $setup:expr; $($scenario:ident),* $(,)?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let (_guard, open) = $setup;
                    $crate::bus_conformance::$scenario(&open).await;
                }
            )*
        }
    };
}

/// An `Appended` notice of session `session`, seqs `first..=last`.
pub fn appended(session: &str, first: u64, last: u64) -> Signal {
    Signal::Appended(Notice {
        tenant_id: "acme".into(),
        session_id: session.into(),
        first_seq: first,
        last_seq: last,
    })
}

/// The next signal of `signals`, failing the test when it is an error, when the stream ends,
/// or when nothing comes within [`PATIENCE`].
pub async fn next_signal(signals: &mut Signals, what: &str) -> Signal {
    match tokio::time::timeout(PATIENCE, signals.next()).await {
        Ok(Some(Ok(signal))) => signal,
        Ok(Some(Err(error))) => panic!("{what}: the bus failed: {error}"),
        Ok(None) => panic!("{what}: the subscription ended"),
        Err(_) => panic!(
            "{what}: nothing received after {} s",
            PATIENCE.as_secs_f64()
        ),
    }
}

/// A signal published on one instance reaches every subscriber of both instances (two
/// subscribers on the publisher's, one on the other), in publication order.
pub async fn a_signal_reaches_every_subscriber_of_every_instance(open: OpenBus<'_>) {
    let (a, b) = (open().await, open().await);
    let mut on_a = a.subscribe().await.unwrap();
    let mut on_b = b.subscribe().await.unwrap();
    let mut also_on_b = b.subscribe().await.unwrap();
    let first = appended("s1", 1, 3);
    let second = appended("s2", 4, 4);
    a.publish(&first).await.unwrap();
    b.publish(&second).await.unwrap();
    for (signals, who) in [
        (&mut on_a, "a subscriber of the publisher's instance"),
        (&mut on_b, "a subscriber of the other instance"),
        (&mut also_on_b, "a second subscriber of the other instance"),
    ] {
        assert_eq!(next_signal(signals, who).await, first, "{who}");
        assert_eq!(next_signal(signals, who).await, second, "{who}");
    }
}

/// A subscriber receives only what is published after it subscribed: nothing is kept.
pub async fn nothing_published_before_a_subscription_is_received(open: OpenBus<'_>) {
    let (a, b) = (open().await, open().await);
    // A subscription made first sees both, so the first was delivered when the late one came.
    let mut early = b.subscribe().await.unwrap();
    let before = appended("s1", 1, 1);
    a.publish(&before).await.unwrap();
    assert_eq!(
        next_signal(&mut early, "the early subscriber").await,
        before
    );
    let mut late = b.subscribe().await.unwrap();
    let after = appended("s1", 2, 2);
    a.publish(&after).await.unwrap();
    assert_eq!(next_signal(&mut early, "the early subscriber").await, after);
    assert_eq!(
        next_signal(&mut late, "the late subscriber").await,
        after,
        "a signal published before the subscription was received"
    );
}

/// A cancellation reads back whole on the other instance, `by` included and absent.
pub async fn cancel_signals_round_trip(open: OpenBus<'_>) {
    let (a, b) = (open().await, open().await);
    let mut on_b = b.subscribe().await.unwrap();
    let by_someone = Signal::Cancel {
        tenant_id: "acme".into(),
        session_id: "s1".into(),
        run_id: "r1".into(),
        by: Some("ops@acme".into()),
    };
    let by_nobody = Signal::Cancel {
        tenant_id: "acme".into(),
        session_id: "s1".into(),
        run_id: "r2".into(),
        by: None,
    };
    a.publish(&by_someone).await.unwrap();
    a.publish(&by_nobody).await.unwrap();
    assert_eq!(next_signal(&mut on_b, "a cancellation").await, by_someone);
    assert_eq!(next_signal(&mut on_b, "a cancellation").await, by_nobody);
}

/// The readiness check answers on a reachable bus.
pub async fn ping_answers(open: OpenBus<'_>) {
    open().await.ping().await.unwrap();
}
