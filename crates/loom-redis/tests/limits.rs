//! The shared counters and the idempotency keys on a real Redis server (`LOOM_TEST_REDIS`):
//! each test keeps its keys under a prefix of its own and erases them when it ends.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use loom_core::{
    counters::{CounterError, Counters, Slot, Sum, Taken},
    ports::{IdempotencyScope, IdempotencyStore, StoreError},
    tool::ToolOutput,
};
use loom_redis::{RedisCounters, RedisIdempotency};

/// The keys of one test: erased when dropped.
struct Keys {
    url: String,
    prefix: String,
}

impl Keys {
    fn new(test: &str) -> Option<Keys> {
        let url = loom_testkit::services::redis(test)?;
        let prefix = format!("{}:", loom_testkit::services::unique("loom_limits"));
        Some(Keys { url, prefix })
    }

    fn counters(&self) -> RedisCounters {
        RedisCounters::with_prefix(&self.url, &self.prefix).unwrap()
    }

    fn idempotency(&self) -> RedisIdempotency {
        RedisIdempotency::with_prefix(&self.url, &self.prefix).unwrap()
    }

    /// The keys left under the prefix.
    fn left(&self) -> Vec<String> {
        let mut conn = redis::Client::open(self.url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query(&mut conn)
            .unwrap()
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        let Ok(mut conn) =
            redis::Client::open(self.url.as_str()).and_then(|client| client.get_connection())
        else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query(&mut conn)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: Result<i64, _> = redis::cmd("DEL").arg(keys).query(&mut conn);
        }
    }
}

// A fresh `RedisIdempotency` (its own connection) for every handle, as another process would
// have.
loom_testkit::idempotency_conformance!(idempotency, {
    let Some(keys) = Keys::new("idempotency_conformance") else {
        return;
    };
    let (url, prefix) = (keys.url.clone(), keys.prefix.clone());
    (keys, move || {
        Arc::new(RedisIdempotency::with_prefix(&url, &prefix).unwrap()) as Arc<dyn IdempotencyStore>
    })
});

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn two_handles_share_one_sliding_window() {
    let Some(keys) = Keys::new("two_handles_share_one_sliding_window") else {
        return;
    };
    let (one, two) = (keys.counters(), keys.counters());
    let Taken::Slot(first) = one.take("quota:acme", 2, MINUTE).await.unwrap() else {
        panic!("the first slot is free");
    };
    assert_eq!(first.key, "quota:acme");
    assert!(matches!(
        two.take("quota:acme", 2, MINUTE).await.unwrap(),
        Taken::Slot(_)
    ));
    // Full for both handles: the oldest slot frees within the window.
    for counters in [&one, &two] {
        match counters.take("quota:acme", 2, MINUTE).await.unwrap() {
            Taken::Full { retry_after } => {
                assert!(
                    retry_after > Duration::ZERO && retry_after <= MINUTE,
                    "{retry_after:?}"
                );
            }
            other => panic!("a full window took {other:?}"),
        }
    }
    // Another counter counts apart; a slot given back is free again.
    assert!(matches!(
        one.take("quota:beta", 2, MINUTE).await.unwrap(),
        Taken::Slot(_)
    ));
    two.give_back(&first).await.unwrap();
    assert!(matches!(
        one.take("quota:acme", 2, MINUTE).await.unwrap(),
        Taken::Slot(_)
    ));
    // A limit of 0 never lets anything in.
    assert!(matches!(
        one.take("quota:none", 0, MINUTE).await.unwrap(),
        Taken::Full { .. }
    ));
    // Giving back a slot that is gone does nothing.
    one.give_back(&Slot {
        key: "quota:acme".into(),
        member: "gone".into(),
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_window_forgets_its_slots_after_it() {
    let Some(keys) = Keys::new("a_window_forgets_its_slots_after_it") else {
        return;
    };
    let counters = keys.counters();
    let short = Duration::from_millis(50);
    assert!(matches!(
        counters.take("rate:k", 1, short).await.unwrap(),
        Taken::Slot(_)
    ));
    // Once the slot left its window (and the set expired with it), the window is free again.
    loom_testkit::wait::until("the window to free", async || {
        matches!(counters.take("rate:k", 1, short).await, Ok(Taken::Slot(_)))
    })
    .await;
}

#[tokio::test]
async fn sums_are_seeded_once_then_added_to() {
    let Some(keys) = Keys::new("sums_are_seeded_once_then_added_to") else {
        return;
    };
    let (one, two) = (keys.counters(), keys.counters());
    let key = "budget:acme:day:2026-11-29";
    assert_eq!(one.sum(key).await.unwrap(), None);
    // Adding to a sum not seeded yet does nothing: the seed will count it.
    let amount = Sum {
        cost_usd: 0.25,
        tokens: 100,
    };
    assert!(!one.add(key, amount).await.unwrap());
    assert_eq!(one.sum(key).await.unwrap(), None);
    let seeded = Sum {
        cost_usd: 1.5,
        tokens: 1000,
    };
    assert_eq!(one.seed(key, seeded, MINUTE).await.unwrap(), seeded);
    // A second seed leaves the first as it is, and says what is held.
    let late = Sum {
        cost_usd: 9.0,
        tokens: 9,
    };
    assert_eq!(two.seed(key, late, MINUTE).await.unwrap(), seeded);
    assert!(two.add(key, amount).await.unwrap());
    assert!(one.add(key, amount).await.unwrap());
    let held = one.sum(key).await.unwrap().unwrap();
    assert!((held.cost_usd - 2.0).abs() < 1e-9, "{held:?}");
    assert_eq!(held.tokens, 1200);
    // Not a number: refused, naming the key.
    assert!(matches!(
        one.add(key, Sum { cost_usd: f64::NAN, tokens: 0 }).await,
        Err(CounterError::Refused(message)) if message.contains(key)
    ));
    one.ping().await.unwrap();
    assert_eq!(keys.left().len(), 1);
}

#[tokio::test]
async fn a_closed_port_is_unavailable() {
    // Nothing listens on port 1: every operation says the counters are unavailable.
    let counters = RedisCounters::with_prefix("redis://127.0.0.1:1", "loom_closed:").unwrap();
    assert!(matches!(
        counters.take("quota:acme", 2, MINUTE).await,
        Err(CounterError::Unavailable(_))
    ));
    assert!(matches!(
        counters.ping().await,
        Err(CounterError::Unavailable(_))
    ));
    let idempotency = RedisIdempotency::with_prefix("redis://127.0.0.1:1", "loom_closed:").unwrap();
    let scope = IdempotencyScope {
        tenant_id: "t",
        session_id: "s",
    };
    assert!(matches!(
        idempotency.reserve("t:x:k", "a", scope, MINUTE).await,
        Err(StoreError::Io { .. })
    ));
    assert!(RedisCounters::new("http://nope").is_err());
}

#[tokio::test]
async fn a_key_of_another_tenant_is_refused() {
    let Some(keys) = Keys::new("a_key_of_another_tenant_is_refused") else {
        return;
    };
    let store = keys.idempotency();
    let scope = IdempotencyScope {
        tenant_id: "default",
        session_id: "s1",
    };
    for (key, says) in [
        ("acme:t:k", "belongs to tenant acme"),
        ("bare", "does not start with its tenant"),
    ] {
        match store.reserve(key, "a", scope, MINUTE).await {
            Err(StoreError::Invalid(message)) => assert!(message.contains(says), "{message}"),
            other => panic!("{key}: {other:?}"),
        }
    }
    assert!(matches!(
        store.complete("bare", "a", &ToolOutput::text("x")).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(keys.left().is_empty());
}
