//! Budgets and cost through the facade: tenant ceilings refuse a run before anything is written,
//! a caller's run budget is journaled and enforced, and usage reports cover a run, a session
//! and a tenant over a period.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use loom_ia::{
    Loom, LoomError, Period, RunOptions, TenantBudget,
    budget::Amount,
    config::{AgentSpec, Config, EventsBackend, LoomConfig, ModelSpec, Sdk, TenantSpec, ToolRef},
    core::event::{Payload, RunBudget},
};
use serde_json::json;

/// Adds two numbers (arithmetic is done by tools, never by the model).
#[loom_ia::tool]
fn add(a: f64, b: f64) -> String {
    format!("{}", a + b)
}

fn loom(dir: &Path) -> Loom {
    let mut model = ModelSpec::new("fake-1", Sdk::Fake, "FAKE");
    model.pricing.input = 3.0;
    model.pricing.output = 15.0;
    model.params.insert(
        "script".into(),
        json!([
            {"text": "Je calcule.", "tool_calls": [{"name": "add", "arguments": {"a": 12, "b": 30}}]},
            {"text": "Résultat : {{ tool_result }}."}
        ]),
    );
    let mut agent = AgentSpec::new("calc", "fake-1");
    agent.main.system = "Tu calcules avec les outils.".into();
    agent.tools = vec![ToolRef::new("add")];
    let mut raw = LoomConfig {
        models: vec![model],
        agents: vec![agent],
        // Two declared tenants: the world of tenants is closed once the list exists.
        tenants: vec![TenantSpec::new("default"), TenantSpec::new("acme")],
        ..LoomConfig::default()
    };
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("journal".into());
    let loom = Loom::new(Config::new(raw, dir.to_path_buf()).unwrap()).unwrap();
    loom.register("add", add_tool()).unwrap();
    loom
}

/// Every journal file under `dir/journal`, with its content, sorted.
fn journal_files(dir: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    let root = dir.join("journal");
    if !root.exists() {
        return files;
    }
    for tenant in std::fs::read_dir(&root).unwrap() {
        for file in std::fs::read_dir(tenant.unwrap().path()).unwrap() {
            let path = file.unwrap().path();
            if path.extension() != Some("jsonl".as_ref()) {
                continue;
            }
            files.push((
                path.display().to_string(),
                std::fs::read_to_string(&path).unwrap(),
            ));
        }
    }
    files.sort();
    files
}

fn in_session(session: &str) -> RunOptions {
    RunOptions {
        session_id: Some(session.into()),
        ..RunOptions::default()
    }
}

#[tokio::test]
async fn a_tenant_day_ceiling_refuses_the_next_run_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path()).with_tenant_budget(
        "default",
        TenantBudget {
            max_tokens_per_day: Some(100),
            ..TenantBudget::default()
        },
    );
    assert_eq!(
        loom.tenant_budget("default").unwrap().max_tokens_per_day,
        Some(100)
    );
    // Nothing spent yet: the first run goes through, and spends more than the ceiling.
    let first = loom
        .run("calc", "12 + 30 ?", in_session("s1"))
        .await
        .unwrap();
    assert!(first.ok());
    let spent = first.usage.total_tokens();
    assert!(spent >= 100);

    let before = journal_files(dir.path());
    let refused = loom
        .run("calc", "Encore ?", in_session("s1"))
        .await
        .unwrap_err();
    let LoomError::BudgetExhausted {
        tenant,
        period,
        spent: used,
        limit,
        retry_in,
    } = &refused
    else {
        panic!("{refused:?}")
    };
    assert_eq!(
        (tenant.as_str(), *period, *used, *limit),
        (
            "default",
            Period::Day,
            Amount::Tokens(spent),
            Amount::Tokens(100)
        )
    );
    assert!(retry_in.as_secs() <= 86_400);
    assert_eq!(
        refused.to_string(),
        format!(
            "tenant 'default': tenant budget reached for the day: {spent} tokens (limit 100 tokens)"
        )
    );
    assert!(refused.is_refusal());
    // A new session is refused too, and not created; `submit` is refused the same way.
    assert!(matches!(
        loom.run("calc", "Encore ?", in_session("s2")).await,
        Err(LoomError::BudgetExhausted { .. })
    ));
    assert!(matches!(
        loom.submit("calc", "Encore ?", RunOptions::default()).await,
        Err(LoomError::BudgetExhausted { .. })
    ));
    assert_eq!(
        journal_files(dir.path()),
        before,
        "a refused run writes nothing"
    );

    // Other tenants have their own ceilings (none here).
    let other = loom
        .run(
            "calc",
            "12 + 30 ?",
            RunOptions {
                tenant_id: Some("acme".into()),
                ..RunOptions::default()
            },
        )
        .await
        .unwrap();
    assert!(other.ok());
}

#[tokio::test]
async fn a_tenant_month_ceiling_in_dollars_counts_every_session() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path());
    let first = loom.run("calc", "1 ?", in_session("a")).await.unwrap();
    let second = loom.run("calc", "2 ?", in_session("b")).await.unwrap();
    let total = first.cost_usd + second.cost_usd;
    assert!(total > 0.0);
    // A ceiling just above what the first session spent: only both sessions reach it.
    let loom = loom.with_tenant_budget(
        "default",
        TenantBudget {
            max_cost_per_month: Some(first.cost_usd * 1.5),
            ..TenantBudget::default()
        },
    );
    let refused = loom.run("calc", "3 ?", in_session("c")).await.unwrap_err();
    let LoomError::BudgetExhausted { period, spent, .. } = refused else {
        panic!("{refused:?}")
    };
    assert_eq!(period, Period::Month);
    let Amount::Cost(spent) = spent else {
        panic!("{spent:?}")
    };
    assert!((spent - total).abs() < 1e-12);
}

#[tokio::test]
async fn a_caller_s_run_budget_is_journaled_and_stops_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path());
    let result = loom
        .run(
            "calc",
            "12 + 30 ?",
            RunOptions {
                budget: Some(RunBudget {
                    max_cost: None,
                    max_tokens: None,
                    max_calls: Some(1),
                }),
                ..RunOptions::default()
            },
        )
        .await
        .unwrap();
    assert!(result.ok());
    let run = loom.locate(&result.run_id, None, None).await.unwrap();
    let events = loom.events(&run).await.unwrap();
    let Payload::RunStarted(started) = &events[0].payload else {
        panic!()
    };
    assert_eq!(started.budget.as_ref().and_then(|b| b.max_calls), Some(1));
    let exceeded: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::BudgetExceeded(b) => Some(b.limit.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(exceeded, ["max_calls"]);
    // Stopped after the first call; the finalizing answer is the second and last.
    assert_eq!(result.iterations, 2);
}

#[tokio::test]
async fn session_and_tenant_reports_add_up_the_runs() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path());
    let first = loom.run("calc", "1 ?", in_session("s1")).await.unwrap();
    let second = loom.run("calc", "2 ?", in_session("s1")).await.unwrap();
    let elsewhere = loom.run("calc", "3 ?", in_session("s2")).await.unwrap();

    let session = loom.session_report("s1", None).await.unwrap();
    let runs: Vec<&str> = session
        .root_runs()
        .iter()
        .map(|r| r.run_id.as_str())
        .collect();
    assert_eq!(runs, [first.run_id.as_str(), second.run_id.as_str()]);
    assert_eq!(session.runs.len(), 2);
    assert_eq!(session.total.calls, 4);
    assert_eq!(
        session.total.usage.total_tokens(),
        first.usage.total_tokens() + second.usage.total_tokens()
    );
    assert!((session.total.cost_usd - (first.cost_usd + second.cost_usd)).abs() < 1e-12);
    assert_eq!(session.roles["main"].calls, 4);
    assert_eq!(session.models["fake-1 (FAKE)"].calls, 4);
    assert_eq!(session.agents.keys().collect::<Vec<_>>(), ["calc"]);
    assert!(matches!(
        loom.session_report("nope", None).await,
        Err(LoomError::UnknownSession(_))
    ));

    // The run report agrees with the run's own cost.
    let run = loom.locate(&first.run_id, Some("s1"), None).await.unwrap();
    let report = loom.report(&run).await.unwrap();
    assert!((report.total.cost_usd - first.cost_usd).abs() < 1e-12);
    assert_eq!(report.runs.keys().collect::<Vec<_>>(), [&first.run_id]);

    let now = chrono::Utc::now();
    let tenant = loom
        .tenant_report("default", Period::Day, now)
        .await
        .unwrap();
    assert_eq!(tenant.runs.len(), 3);
    let sessions: std::collections::BTreeSet<&str> = tenant
        .runs
        .values()
        .map(|r| r.session_id.as_str())
        .collect();
    assert_eq!(sessions.len(), 2);
    assert_eq!(tenant.agents["calc"].calls, 6);
    let spent = first.cost_usd + second.cost_usd + elsewhere.cost_usd;
    assert!((tenant.total.cost_usd - spent).abs() < 1e-12);
    let json = serde_json::to_value(&tenant).unwrap();
    assert_eq!(json["period"], "day");
    assert_eq!(json["total"]["calls"], 6);
    // Yesterday holds nothing.
    let yesterday = loom
        .tenant_report("default", Period::Day, now - chrono::TimeDelta::days(1))
        .await
        .unwrap();
    assert!(yesterday.runs.is_empty());
}
