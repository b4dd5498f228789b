//! The Redis bus through the `EventBus` port: the shared bus conformance suite on the test
//! server (`LOOM_TEST_REDIS`), each test on a channel of its own, every instance with its own
//! connections as another process would have; then an unreadable message, skipped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use loom_core::{BoxFuture, bus::EventBus};
use loom_redis::RedisBus;
use loom_testkit::{
    bus_conformance::{appended, next_signal},
    services,
};

/// The instances of one test: each a new `RedisBus` on the test's own channel.
fn opener(url: String, channel: String) -> impl Fn() -> BoxFuture<'static, Arc<dyn EventBus>> {
    move || {
        let bus = RedisBus::new(&url)
            .unwrap()
            .with_channel(channel.clone())
            .unwrap();
        let bus: Arc<dyn EventBus> = Arc::new(bus);
        Box::pin(async move { bus })
    }
}

mod conformance {
    use super::*;

    /// Skips (returns early) when the server is not given.
    macro_rules! setup {
        () => {{
            let Some(url) = services::redis(module_path!()) else {
                return;
            };
            ((), opener(url, services::unique("loom:test:events")))
        }};
    }

    loom_testkit::bus_conformance!(redis, setup!());
}

#[tokio::test]
async fn an_unreadable_message_is_skipped() {
    let Some(url) = services::redis("an_unreadable_message_is_skipped") else {
        return;
    };
    let channel = services::unique("loom:test:events");
    let bus = RedisBus::new(&url).unwrap().with_channel(&channel).unwrap();
    let mut signals = bus.subscribe().await.unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("PUBLISH")
        .arg(&channel)
        .arg("{not a signal")
        .query_async::<i64>(&mut raw)
        .await
        .unwrap();
    let signal = appended("s1", 1, 2);
    bus.publish(&signal).await.unwrap();
    assert_eq!(
        next_signal(&mut signals, "the readable signal").await,
        signal
    );
}

#[test]
fn a_bad_url_is_refused_without_repeating_it() {
    let error = RedisBus::new("redis://user:hunter2@[::1").unwrap_err();
    assert!(!error.to_string().contains("hunter2"), "{error}");
    assert!(
        RedisBus::new("redis://127.0.0.1:6379")
            .unwrap()
            .with_channel("")
            .is_err()
    );
}
