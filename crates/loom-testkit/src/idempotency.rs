//! The idempotency conformance suite: scenarios every [`IdempotencyStore`] must pass, whatever
//! keeps the records (memory, SQLite, PostgreSQL, Redis).
//!
//! Each scenario is a `pub async fn` taking an [`Open`] factory: every call must return a
//! handle on the *same* records, as another process would have. Keys are business keys,
//! `<tenant>:<tool>:<key>` (the stores that check the tenant prefix accept them). A scenario
//! panics (through `assert!`) when the store misbehaves.
//!
//! [`idempotency_conformance!`](crate::idempotency_conformance) turns the suite into
//! `#[tokio::test]` functions for one kind of store:
//!
//! ```ignore
//! loom_testkit::idempotency_conformance!(memory, {
//!     let store: Arc<dyn IdempotencyStore> = Arc::new(MemoryIdempotency::new());
//!     ((), move || store.clone())
//! });
//! ```

// The scenarios are assertions: a failure must panic with the store's error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use loom_core::{
    ports::{IdempotencyScope, IdempotencyStore, Reservation},
    tool::ToolOutput,
};

/// A factory handing out handles on one store's records (see the module documentation).
pub type Open<'a> = &'a dyn Fn() -> Arc<dyn IdempotencyStore>;

/// Runs every scenario of the suite as a `#[tokio::test]` in a module `$name`.
///
/// `$setup` is evaluated once per test, inside the module (which sees the caller's imports
/// through `use super::*`), and must give `(guard, open)`: `guard` is kept alive for the test
/// (a temporary directory, a database, keys to erase) and `open` is a closure
/// `Fn() -> Arc<dyn IdempotencyStore>` handing out handles on the same records. The calling
/// crate needs `tokio` with its `macros` and `rt-multi-thread` features.
#[macro_export]
macro_rules! idempotency_conformance {
    ($name:ident, $setup:expr) => {
        $crate::idempotency_conformance!(@tests $name, $setup;
            one_of_six_racing_reservers_wins,
            the_holder_reserves_again_another_waits,
            a_completed_key_returns_its_result,
            a_released_key_is_free,
            only_the_holder_completes_or_releases,
            an_expired_reservation_is_free,
            deleting_a_session_erases_its_keys_only,
        );
    };
    (@tests $name:ident, $setup:expr; $($scenario:ident),* $(,)?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    let (_guard, open) = $setup;
                    $crate::idempotency::$scenario(&open).await;
                }
            )*
        }
    };
}

const TTL: Duration = Duration::from_secs(60);

fn scope<'a>(tenant_id: &'a str, session_id: &'a str) -> IdempotencyScope<'a> {
    IdempotencyScope {
        tenant_id,
        session_id,
    }
}

const S1: IdempotencyScope<'static> = IdempotencyScope {
    tenant_id: "t",
    session_id: "s1",
};

/// Six handles race for one key: exactly one gets it, the others find it held.
pub async fn one_of_six_racing_reservers_wins(open: Open<'_>) {
    let tasks: Vec<_> = (0..6)
        .map(|n| {
            let store = open();
            tokio::spawn(async move {
                store
                    .reserve("t:tool:race", &format!("h{n}"), S1, TTL)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut reserved = 0;
    for task in tasks {
        match task.await.unwrap() {
            Reservation::Reserved => reserved += 1,
            Reservation::Held => {}
            other => panic!("a racing reserver got {other:?}"),
        }
    }
    assert_eq!(reserved, 1, "exactly one of six racing reservers wins");
}

/// The holder may reserve its key again (a resumed run); another holder finds it held.
pub async fn the_holder_reserves_again_another_waits(open: Open<'_>) {
    let (one, two) = (open(), open());
    let key = "t:relancer:D-1";
    assert_eq!(
        one.reserve(key, "a", S1, TTL).await.unwrap(),
        Reservation::Reserved
    );
    assert_eq!(
        one.reserve(key, "a", S1, TTL).await.unwrap(),
        Reservation::Reserved
    );
    assert_eq!(
        two.reserve(key, "b", S1, TTL).await.unwrap(),
        Reservation::Held
    );
}

/// A completed key answers its recorded result to everyone, for good: releasing it does
/// nothing.
pub async fn a_completed_key_returns_its_result(open: Open<'_>) {
    let (one, two) = (open(), open());
    let key = "t:relancer:D-2";
    let output = ToolOutput::text("relance envoyée");
    assert_eq!(
        one.reserve(key, "a", S1, TTL).await.unwrap(),
        Reservation::Reserved
    );
    one.complete(key, "a", &output).await.unwrap();
    let completed = Reservation::Completed(Box::new(output));
    assert_eq!(two.reserve(key, "b", S1, TTL).await.unwrap(), completed);
    assert_eq!(one.reserve(key, "a", S1, TTL).await.unwrap(), completed);
    one.release(key, "a").await.unwrap();
    assert_eq!(two.reserve(key, "c", S1, TTL).await.unwrap(), completed);
}

/// A failed action gives its key back: the next holder gets it.
pub async fn a_released_key_is_free(open: Open<'_>) {
    let (one, two) = (open(), open());
    let key = "t:relancer:D-3";
    assert_eq!(
        one.reserve(key, "a", S1, TTL).await.unwrap(),
        Reservation::Reserved
    );
    assert_eq!(
        two.reserve(key, "b", S1, TTL).await.unwrap(),
        Reservation::Held
    );
    one.release(key, "a").await.unwrap();
    assert_eq!(
        two.reserve(key, "b", S1, TTL).await.unwrap(),
        Reservation::Reserved
    );
}

/// Another holder can neither complete nor release a key it does not hold.
pub async fn only_the_holder_completes_or_releases(open: Open<'_>) {
    let (one, two) = (open(), open());
    let key = "t:relancer:D-4";
    assert_eq!(
        one.reserve(key, "a", S1, TTL).await.unwrap(),
        Reservation::Reserved
    );
    two.complete(key, "b", &ToolOutput::text("not mine"))
        .await
        .unwrap();
    two.release(key, "b").await.unwrap();
    assert_eq!(
        two.reserve(key, "c", S1, TTL).await.unwrap(),
        Reservation::Held
    );
    let output = ToolOutput::text("mine");
    one.complete(key, "a", &output).await.unwrap();
    assert_eq!(
        two.reserve(key, "c", S1, TTL).await.unwrap(),
        Reservation::Completed(Box::new(output))
    );
}

/// A reservation whose time ran out is free again, for any holder.
pub async fn an_expired_reservation_is_free(open: Open<'_>) {
    let (one, two) = (open(), open());
    let key = "t:relancer:D-5";
    assert_eq!(
        one.reserve(key, "x", S1, Duration::ZERO).await.unwrap(),
        Reservation::Reserved
    );
    assert_eq!(
        two.reserve(key, "y", S1, TTL).await.unwrap(),
        Reservation::Reserved
    );
    assert_eq!(
        one.reserve(key, "x", S1, TTL).await.unwrap(),
        Reservation::Held
    );
}

/// Erasing a session erases the keys it reserved, completed or not, and nothing else: not
/// another session's, not another tenant's session of the same name.
pub async fn deleting_a_session_erases_its_keys_only(open: Open<'_>) {
    let store = open();
    let output = ToolOutput::text("sent");
    store.reserve("t:x:done", "a", S1, TTL).await.unwrap();
    store.complete("t:x:done", "a", &output).await.unwrap();
    store.reserve("t:x:running", "b", S1, TTL).await.unwrap();
    store
        .reserve("t:x:kept", "c", scope("t", "s2"), TTL)
        .await
        .unwrap();
    store
        .reserve("u:x:other", "d", scope("u", "s1"), TTL)
        .await
        .unwrap();
    assert_eq!(store.delete_session("t", "s1").await.unwrap(), 2);
    assert_eq!(store.delete_session("t", "s1").await.unwrap(), 0);
    let other = open();
    assert_eq!(
        other
            .reserve("t:x:done", "e", scope("t", "s3"), TTL)
            .await
            .unwrap(),
        Reservation::Reserved
    );
    assert_eq!(
        other.reserve("t:x:running", "e", S1, TTL).await.unwrap(),
        Reservation::Reserved
    );
    assert_eq!(
        other
            .reserve("t:x:kept", "e", scope("t", "s2"), TTL)
            .await
            .unwrap(),
        Reservation::Held
    );
    assert_eq!(
        other
            .reserve("u:x:other", "e", scope("u", "s1"), TTL)
            .await
            .unwrap(),
        Reservation::Held
    );
    // The keys `e` took belong to their new sessions now.
    assert_eq!(store.delete_session("t", "s3").await.unwrap(), 1);
    assert_eq!(store.delete_session("t", "s1").await.unwrap(), 1);
    assert_eq!(store.delete_session("t", "s2").await.unwrap(), 1);
    assert_eq!(store.delete_session("u", "s1").await.unwrap(), 1);
}
