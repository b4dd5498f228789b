//! Triggers (webhooks) and tenant quotas through the facade: a payload renders the message and
//! the session of a background run, a delivery id makes a redelivery find its first run, and
//! `quotas.runs_per_minute` refuses a run before anything is written.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use futures_util::StreamExt;
use loom_ia::{
    Loom, LoomError, RunOptions, RunRef, RunStatus,
    config::{
        AgentSpec, Config, EventsBackend, LoomConfig, ModelSpec, Quotas, Sdk, TenantSpec,
        TriggerSpec,
    },
    core::event::Payload,
};
use serde_json::json;

/// `support` echoes its message (the fake model without a script); `orders` renders its
/// message and session from the payload and reads its delivery id from a header; `ping` has
/// neither session nor header, nor has `pong`. Tenant `acme` may open 2 runs a minute.
fn loom(dir: &Path) -> Loom {
    let model = ModelSpec::new("fake-1", Sdk::Fake, "FAKE");
    let agent = AgentSpec::new("support", "fake-1");
    let mut orders = TriggerSpec::new(
        "orders",
        "support",
        "Order {{ payload.order.id }} from {{ payload.customer }} ({{ trigger }}, {{ delivery }})",
    );
    orders.session = Some("customer-{{ payload.customer }}".into());
    orders.delivery_header = Some("X-Delivery".into());
    let ping = TriggerSpec::new("ping", "support", "Ping {{ payload }}");
    let pong = TriggerSpec::new("pong", "support", "Pong");
    let mut acme = TenantSpec::new("acme");
    acme.quotas = Some(Quotas {
        runs_per_minute: Some(2),
    });
    let mut raw = LoomConfig {
        models: vec![model],
        agents: vec![agent],
        tenants: vec![TenantSpec::new("default"), acme],
        triggers: vec![orders, ping, pong],
        ..LoomConfig::default()
    };
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("journal".into());
    Loom::new(Config::new(raw, dir.to_path_buf()).unwrap()).unwrap()
}

/// Waits for the background run to close, through the journal, and returns its text.
async fn finished(loom: &Loom, run: &RunRef) -> String {
    let events: Vec<_> = loom.follow(run, 0).collect().await;
    assert!(events.iter().all(Result::is_ok));
    let result = loom.result(run).await.unwrap();
    assert_eq!(result.status, RunStatus::Completed);
    result.text
}

fn session_lines(dir: &Path, tenant: &str, session: &str) -> usize {
    let path = dir.join(format!("journal/{tenant}/{session}.jsonl"));
    std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
}

#[tokio::test]
async fn a_delivery_renders_its_run_and_a_redelivery_finds_it() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path());
    let payload = json!({"order": {"id": 42}, "customer": "martin"});
    let first = loom
        .trigger("orders", payload.clone(), Some("d-1".into()), None)
        .await
        .unwrap();
    assert_eq!(
        (
            first.trigger.as_str(),
            first.run_id.as_str(),
            first.session_id.as_str(),
            first.repeated
        ),
        ("orders", "d-1", "customer-martin", false)
    );
    let run = loom
        .locate("d-1", Some("customer-martin"), None)
        .await
        .unwrap();
    assert_eq!(
        finished(&loom, &run).await,
        "Echo: Order 42 from martin (orders, d-1)"
    );
    // The trigger is journaled on the run's opening, and is one of its facets.
    let events = loom.events(&run).await.unwrap();
    let Payload::RunStarted(started) = &events[0].payload else {
        panic!("first event: {:?}", events[0].event_type)
    };
    assert_eq!(started.trigger.as_deref(), Some("orders"));
    assert_eq!(events[0].facets["trigger"], "orders");

    // The same delivery again: its first run, nothing written.
    let lines = session_lines(dir.path(), "default", "customer-martin");
    let again = loom
        .trigger("orders", payload.clone(), Some("d-1".into()), None)
        .await
        .unwrap();
    assert!(again.repeated);
    assert_eq!(
        (again.run_id.as_str(), again.status),
        ("d-1", RunStatus::Completed)
    );
    assert_eq!(
        session_lines(dir.path(), "default", "customer-martin"),
        lines
    );

    // A new delivery of the same customer continues the session.
    let second = loom
        .trigger("orders", payload.clone(), Some("d-2".into()), None)
        .await
        .unwrap();
    assert_eq!(
        (second.session_id.as_str(), second.repeated),
        ("customer-martin", false)
    );
    let run = loom.locate("d-2", None, None).await.unwrap();
    finished(&loom, &run).await;

    // Without a delivery id every delivery opens a run, in its own session.
    let ping = loom.trigger("ping", json!(null), None, None).await.unwrap();
    assert_eq!(ping.session_id, ping.run_id);
    let run = loom.locate(&ping.run_id, None, None).await.unwrap();
    assert_eq!(finished(&loom, &run).await, "Echo: Ping None");
    let other = loom.trigger("ping", json!(null), None, None).await.unwrap();
    assert_ne!(other.run_id, ping.run_id);
    let run = loom.locate(&other.run_id, None, None).await.unwrap();
    finished(&loom, &run).await;
}

#[tokio::test]
async fn deliveries_that_cannot_open_a_run_are_refused_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path());
    let invalid = |outcome: Result<loom_ia::Triggered, LoomError>| match outcome {
        Err(LoomError::Invalid(message)) => message,
        other => panic!("expected a refusal, got {other:?}"),
    };

    let unknown = loom.trigger("nope", json!({}), None, None).await;
    let Err(error @ LoomError::UnknownTrigger { .. }) = unknown else {
        panic!("{unknown:?}")
    };
    assert_eq!(
        error.to_string(),
        "unknown trigger 'nope' (triggers: orders, ping, pong)"
    );
    assert!(error.is_refusal());

    // A field missing from the payload: the template is strict.
    let message = invalid(
        loom.trigger("orders", json!({"customer": "martin"}), None, None)
            .await,
    );
    assert!(
        message.starts_with("trigger 'orders': triggers[0].message: cannot render the template: "),
        "{message}"
    );
    // A session that is not a usable id.
    let message = invalid(
        loom.trigger(
            "orders",
            json!({"order": {"id": 1}, "customer": "a b"}),
            None,
            None,
        )
        .await,
    );
    assert_eq!(
        message,
        "trigger 'orders': the session rendered from the payload, 'customer-a b', is not usable \
         (expected [A-Za-z0-9][A-Za-z0-9._-]{0,127})"
    );
    let message = invalid(
        loom.trigger("ping", json!(1), Some("../x".into()), None)
            .await,
    );
    assert_eq!(
        message,
        "trigger 'ping': delivery id '../x' is not usable as a run id (expected \
         [A-Za-z0-9][A-Za-z0-9._-]{0,127})"
    );
    assert!(!dir.path().join("journal").exists(), "nothing written");

    // A delivery id names one run: not one of another session...
    let martin = json!({"order": {"id": 1}, "customer": "martin"});
    let first = loom
        .trigger("orders", martin, Some("d-9".into()), None)
        .await
        .unwrap();
    let run = loom
        .locate(&first.run_id, Some(&first.session_id), None)
        .await
        .unwrap();
    finished(&loom, &run).await;
    let dupont = json!({"order": {"id": 2}, "customer": "dupont"});
    let message = invalid(
        loom.trigger("orders", dupont, Some("d-9".into()), None)
            .await,
    );
    assert_eq!(
        message,
        "trigger 'orders': delivery 'd-9' is already the run id of another session \
         (customer-martin): a delivery id names one run"
    );
    assert_eq!(session_lines(dir.path(), "default", "customer-dupont"), 0);
    // ... nor one that no trigger opened, nor one of another trigger.
    let result = loom
        .run(
            "support",
            "Bonjour",
            RunOptions {
                run_id: Some("r-1".into()),
                ..RunOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(result.status, RunStatus::Completed);
    let message = invalid(
        loom.trigger("ping", json!(1), Some("r-1".into()), None)
            .await,
    );
    assert_eq!(
        message,
        "trigger 'ping': delivery 'r-1' is already the run id of a run no trigger opened"
    );
    let pinged = loom
        .trigger("ping", json!(1), Some("p-1".into()), None)
        .await
        .unwrap();
    let run = loom.locate(&pinged.run_id, None, None).await.unwrap();
    finished(&loom, &run).await;
    let message = invalid(
        loom.trigger("pong", json!(1), Some("p-1".into()), None)
            .await,
    );
    assert_eq!(
        message,
        "trigger 'pong': delivery 'p-1' is already the run id of a run opened by the trigger 'ping'"
    );
}

#[tokio::test]
async fn a_tenant_quota_refuses_runs_over_its_minute_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path());
    let acme = |session: &str| RunOptions {
        tenant_id: Some("acme".into()),
        session_id: Some(session.into()),
        ..RunOptions::default()
    };
    // A run that could not be opened gives its slot back.
    let bad = RunOptions {
        run_id: Some("../r".into()),
        ..acme("s0")
    };
    assert!(matches!(
        loom.run("support", "x", bad).await,
        Err(LoomError::Invalid(_))
    ));
    loom.run("support", "one", acme("s1")).await.unwrap();
    // A delivery counts like any run; its redelivery opens nothing and counts nothing.
    let first = loom
        .trigger("ping", json!(2), Some("d-1".into()), Some("acme"))
        .await
        .unwrap();
    let run = loom
        .locate(&first.run_id, None, Some("acme"))
        .await
        .unwrap();
    finished(&loom, &run).await;
    let again = loom
        .trigger("ping", json!(2), Some("d-1".into()), Some("acme"))
        .await
        .unwrap();
    assert!(again.repeated);

    let refused = loom.run("support", "three", acme("s3")).await.unwrap_err();
    let LoomError::QuotaExceeded {
        tenant,
        limit,
        retry_after,
    } = &refused
    else {
        panic!("{refused:?}")
    };
    assert_eq!((tenant.as_str(), *limit), ("acme", 2));
    assert!(retry_after.as_secs() <= 60, "{retry_after:?}");
    let message = refused.to_string();
    assert!(
        message.starts_with("tenant 'acme': 2 runs per minute exceeded, retry in "),
        "{message}"
    );
    assert!(message.ends_with(" s"), "{message}");
    assert!(refused.is_refusal());
    assert_eq!(session_lines(dir.path(), "acme", "s3"), 0);
    let submitted = loom.submit("support", "four", acme("s4")).await;
    assert!(matches!(submitted, Err(LoomError::QuotaExceeded { .. })));
    let triggered = loom.trigger("ping", json!(5), None, Some("acme")).await;
    assert!(matches!(triggered, Err(LoomError::QuotaExceeded { .. })));
    // Another tenant counts apart.
    let other = loom
        .run("support", "free", RunOptions::default())
        .await
        .unwrap();
    assert_eq!(other.status, RunStatus::Completed);
}
