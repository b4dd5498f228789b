//! `storage.limits` `backend: redis` through the facade, on a real Redis server
//! (`LOOM_TEST_REDIS`): two instances enforce one tenant quota, the tenant budget sums count
//! what the journal counts, and a Redis that cannot be reached refuses runs rather than letting
//! them through uncounted. Each test uses a tenant of its own and erases its keys.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use loom_ia::{
    Loom, LoomError, Period, RunOptions, TenantBudget,
    config::{
        AgentSpec, Config, EventsBackend, LimitsBackend, LoomConfig, ModelSpec, Quotas, Sdk,
        TenantSpec,
    },
};
use serde_json::json;

/// The keys a test's tenant leaves in Redis (`loom:quota:<tenant>`, `loom:budget:<tenant>:…`),
/// erased when dropped.
struct Tenant {
    url: String,
    id: String,
}

impl Tenant {
    fn new(test: &str) -> Option<Tenant> {
        let url = loom_testkit::services::redis(test)?;
        Some(Tenant {
            url,
            id: loom_testkit::services::unique("acme"),
        })
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        let Ok(mut conn) =
            redis::Client::open(self.url.as_str()).and_then(|client| client.get_connection())
        else {
            return;
        };
        for pattern in [
            format!("loom:quota:{}", self.id),
            format!("loom:budget:{}:*", self.id),
        ] {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(pattern)
                .query(&mut conn)
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: Result<i64, _> = redis::cmd("DEL").arg(keys).query(&mut conn);
            }
        }
    }
}

/// A priced scripted model answering once, an agent, the tenant `tenant` allowed 2 runs a
/// minute, limits in Redis at the URL `LOOM_TEST_REDIS` names, the journal in `dir`.
fn config(dir: &Path, tenant: &str) -> Config {
    let mut model = ModelSpec::new("fake-1", Sdk::Fake, "FAKE");
    model.pricing.input = 3.0;
    model.pricing.output = 15.0;
    model
        .params
        .insert("script".into(), json!([{"text": "Bonjour."}]));
    let mut acme = TenantSpec::new(tenant);
    acme.quotas = Some(Quotas {
        runs_per_minute: Some(2),
    });
    let mut raw = LoomConfig {
        models: vec![model],
        agents: vec![AgentSpec::new("support", "fake-1")],
        tenants: vec![TenantSpec::new("default"), acme],
        ..LoomConfig::default()
    };
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("journal".into());
    raw.storage.limits.backend = LimitsBackend::Redis;
    raw.storage.limits.url_env = Some(loom_testkit::services::REDIS.into());
    Config::new(raw, dir.to_path_buf()).unwrap()
}

fn of(tenant: &str, session: &str) -> RunOptions {
    RunOptions {
        tenant_id: Some(tenant.into()),
        session_id: Some(session.into()),
        ..RunOptions::default()
    }
}

#[tokio::test]
async fn two_instances_enforce_one_tenant_quota() {
    let Some(tenant) = Tenant::new("two_instances_enforce_one_tenant_quota") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let one = Loom::open(config(dir.path(), &tenant.id)).await.unwrap();
    let two = Loom::open(config(dir.path(), &tenant.id)).await.unwrap();
    one.run("support", "one", of(&tenant.id, "s1"))
        .await
        .unwrap();
    two.run("support", "two", of(&tenant.id, "s2"))
        .await
        .unwrap();
    // The third run of the minute, opened on either instance, is refused.
    for loom in [&one, &two] {
        let refused = loom
            .run("support", "three", of(&tenant.id, "s3"))
            .await
            .unwrap_err();
        match refused {
            LoomError::QuotaExceeded { limit, .. } => assert_eq!(limit, 2),
            other => panic!("{other:?}"),
        }
    }
    // Another tenant counts apart.
    one.run("support", "other", RunOptions::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn budget_sums_count_what_the_journal_counts() {
    let Some(tenant) = Tenant::new("budget_sums_count_what_the_journal_counts") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let budget = TenantBudget {
        max_tokens_per_day: Some(1_000_000),
        max_cost_per_month: Some(1_000.0),
        ..TenantBudget::default()
    };
    let loom = Loom::open(config(dir.path(), &tenant.id))
        .await
        .unwrap()
        .with_tenant_budget(tenant.id.clone(), budget);
    let now = chrono::Utc::now();
    let day = format!("budget:{}:day:{}", tenant.id, Period::Day.label(now));
    let month = format!("budget:{}:month:{}", tenant.id, Period::Month.label(now));
    let counters = loom.counters().clone();
    assert_eq!(counters.sum(&day).await.unwrap(), None);
    // The first check seeds both sums from the journal (empty); each run then adds its calls.
    loom.run("support", "one", of(&tenant.id, "s1"))
        .await
        .unwrap();
    assert!(counters.sum(&day).await.unwrap().is_some());
    loom.run("support", "two", of(&tenant.id, "s1"))
        .await
        .unwrap();
    let report = loom
        .tenant_report(&tenant.id, Period::Day, now)
        .await
        .unwrap();
    let journal = report.total;
    let tokens = journal.usage.total_tokens();
    assert!(tokens > 0 && journal.cost_usd > 0.0, "{journal:?}");
    for key in [&day, &month] {
        let sum = counters.sum(key).await.unwrap().unwrap();
        assert_eq!(sum.tokens, tokens, "{key}");
        assert!(
            (sum.cost_usd - journal.cost_usd).abs() < 1e-9,
            "{key}: {sum:?} vs {journal:?}"
        );
    }
}

#[tokio::test]
async fn an_unreachable_redis_refuses_runs() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on port 1 of this host.
    std::fs::write(
        dir.path().join(".env"),
        "LOOM_LIMITS_URL=redis://127.0.0.1:1\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("loom.yaml"),
        "version: 1\n\
         models:\n  - {id: fake-1, sdk: fake, model: FAKE}\n\
         agents:\n  - {name: support, main: {model: fake-1}}\n\
         tenants:\n  - {id: default, quotas: {runs_per_minute: 5}}\n\
         storage:\n  events: {backend: memory}\n  limits: {backend: redis, url_env: LOOM_LIMITS_URL}\n",
    )
    .unwrap();
    let loom = Loom::open_config(dir.path().join("loom.yaml"), None)
        .await
        .unwrap();
    let refused = loom
        .run("support", "hello", RunOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, LoomError::LimitsUnavailable { what, .. } if what.contains("quota of tenant 'default'")),
        "{refused:?}"
    );
    assert!(!refused.is_refusal() && !refused.is_internal());
    assert!(loom.sessions(Some("default")).await.unwrap().is_empty());
}
