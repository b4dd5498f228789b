//! What callers write in the journal, through the facade: every value bounded before it is
//! journaled (refused naming the field and the limit, nothing written), and runs found by the
//! journal's run index rather than by reading every session.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use loom_ia::{
    DEFAULT_TENANT, EventQuery, Loom, LoomError, Period, RunOptions, RunQuery, RunRef,
    TenantBudget,
    config::{AgentSpec, Config, EventsBackend, LoomConfig, ModelSpec, Sdk},
    core::{
        BoxFuture, Event,
        limits::{MAX_LABEL_BYTES, MAX_MESSAGE_BYTES, MAX_NOTE_BYTES},
        ports::{EventStore, SessionSummary, StoreError},
    },
};
use loom_journal::JsonlStore;
use serde_json::{Map, Value, json};

fn config(dir: &std::path::Path) -> Config {
    let mut raw = LoomConfig {
        models: vec![ModelSpec::new("fake", Sdk::Fake, "FAKE")],
        agents: vec![AgentSpec::new("echo", "fake")],
        ..LoomConfig::default()
    };
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("data".into());
    Config::new(raw, dir.to_path_buf()).unwrap()
}

/// An object nested `levels` deep (itself the first level).
fn nested(levels: usize) -> Map<String, Value> {
    let inner = (1..levels).fold(json!(1), |inner, _| json!({ "a": inner }));
    let mut object = Map::new();
    object.insert("a".into(), inner);
    object
}

fn refused<T: std::fmt::Debug>(result: Result<T, LoomError>, needle: &str) {
    match result {
        Err(error @ LoomError::Invalid(_)) => {
            assert!(error.is_refusal());
            assert!(
                error.to_string().contains(needle),
                "{error} should say {needle:?}"
            );
        }
        other => panic!("expected a refusal naming {needle:?}, got {other:?}"),
    }
}

/// Every value a caller passes to a run, a decision, a steering message or a cancellation is
/// bounded: over its bound it is refused naming the field and the limit, before anything is
/// written (the decisions are checked before the run is even looked up).
#[tokio::test]
async fn caller_values_over_their_bounds_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let loom = Loom::new(config(dir.path())).unwrap();
    let run = |options: RunOptions| {
        let loom = loom.clone();
        async move { loom.run("echo", "Bonjour", options).await }
    };
    refused(
        run(RunOptions {
            metadata: nested(65),
            ..RunOptions::default()
        })
        .await,
        "metadata is nested more than 64 levels deep",
    );
    let mut wide = Map::new();
    wide.insert("blob".into(), json!("x".repeat(70_000)));
    refused(
        run(RunOptions {
            metadata: wide,
            ..RunOptions::default()
        })
        .await,
        "metadata is 70011 bytes, more than the limit of 65536 bytes",
    );
    refused(
        run(RunOptions {
            user_id: Some("u".repeat(MAX_LABEL_BYTES + 1)),
            ..RunOptions::default()
        })
        .await,
        "user_id is 1025 bytes",
    );
    refused(
        loom.run(
            "echo",
            "x".repeat(MAX_MESSAGE_BYTES + 1),
            RunOptions::default(),
        )
        .await,
        "message is 1048577 bytes",
    );
    assert!(loom.sessions(None).await.unwrap().is_empty());

    let nobody = RunRef {
        tenant_id: "default".into(),
        session_id: "s".into(),
        run_id: "r".into(),
    };
    let deep = Value::Object(nested(65));
    refused(
        loom.approve(&nobody, Some("c"), "ops", None, Some(deep), true)
            .await,
        "arguments is nested more than 64 levels deep",
    );
    refused(
        loom.reject(
            &nobody,
            None,
            "ops",
            Some(&"r".repeat(MAX_NOTE_BYTES + 1)),
            true,
        )
        .await,
        "reason is 65537 bytes",
    );
    refused(
        loom.steer(&nobody, "x".repeat(MAX_MESSAGE_BYTES + 1)).await,
        "message is 1048577 bytes",
    );
    refused(
        loom.cancel(&nobody, Some("b".repeat(MAX_LABEL_BYTES + 1)))
            .await,
        "by is 1025 bytes",
    );

    // At the bounds, accepted and read back.
    let result = run(RunOptions {
        metadata: nested(64),
        ..RunOptions::default()
    })
    .await
    .unwrap();
    assert!(result.ok());
    let found = loom.locate(&result.run_id, None, None).await.unwrap();
    assert_eq!(loom.events(&found).await.unwrap().len(), 8);
}

/// A journal that counts the sessions read.
#[derive(Debug)]
struct Counting {
    inner: JsonlStore,
    reads: AtomicUsize,
}

impl EventStore for Counting {
    fn append(
        &self,
        batch: Vec<Event>,
        expected_last_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Event>, StoreError>> {
        self.inner.append(batch, expected_last_seq)
    }

    fn read<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.read(tenant_id, session_id, after_seq)
    }

    fn last_seq<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.inner.last_seq(tenant_id, session_id)
    }

    fn sessions<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SessionSummary>, StoreError>> {
        self.inner.sessions(tenant_id)
    }

    fn delete<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.inner.delete(tenant_id, session_id)
    }

    fn find_run<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
        self.inner.find_run(tenant_id, run_id)
    }
}

/// Looking a run up without its session reads no session to learn that it does not exist, and
/// only its own session when it does.
#[tokio::test]
async fn a_run_is_located_without_reading_the_tenants_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Counting {
        inner: JsonlStore::new(dir.path().join("data")),
        reads: AtomicUsize::new(0),
    });
    let loom = Loom::with_store(config(dir.path()), store.clone()).unwrap();
    let mut runs = Vec::new();
    for session in ["a", "b", "c", "d"] {
        let options = RunOptions {
            session_id: Some(session.into()),
            ..RunOptions::default()
        };
        runs.push(loom.run("echo", "Bonjour", options).await.unwrap());
    }
    store.reads.store(0, Ordering::SeqCst);
    assert!(matches!(
        loom.locate("nobody", None, None).await,
        Err(LoomError::UnknownRun(_))
    ));
    assert_eq!(store.reads.load(Ordering::SeqCst), 0);
    let found = loom.locate(&runs[1].run_id, None, None).await.unwrap();
    assert_eq!(found.session_id, "b");
    assert_eq!(store.reads.load(Ordering::SeqCst), 1);
}

/// A session whose first line cannot be read (the outside probe's `run.started`, written before
/// the journal refused it) costs that session only: the tenant's run list, event search,
/// report, budget and sweep leave it out; what needs it says it is corrupted, naming the file
/// and the line, rather than that its run is unknown.
#[tokio::test]
async fn a_corrupted_session_is_left_out_of_the_tenants_reads() {
    let dir = tempfile::tempdir().unwrap();
    let loom = Loom::new(config(dir.path())).unwrap().with_tenant_budget(
        DEFAULT_TENANT,
        TenantBudget {
            max_tokens_per_day: Some(10_000_000),
            ..TenantBudget::default()
        },
    );
    let mut runs = Vec::new();
    for session in ["good", "bad"] {
        let options = RunOptions {
            session_id: Some(session.into()),
            ..RunOptions::default()
        };
        runs.push(loom.run("echo", "Bonjour", options).await.unwrap());
    }
    let path = dir.path().join("data/default/bad.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let deep = format!("\"metadata\":{}", Value::Object(nested(125)));
    std::fs::write(&path, text.replacen("\"metadata\":{}", &deep, 1)).unwrap();
    let corrupted = |error: LoomError| {
        let text = error.to_string();
        assert!(
            text.starts_with("journal corrupted at ") && text.contains("bad.jsonl:1: "),
            "{text}"
        );
    };

    let page = loom.runs(&RunQuery::default()).await.unwrap();
    assert_eq!(page.runs.len(), 1);
    assert_eq!(page.runs[0].run_id, runs[0].run_id);
    let events = loom.query(&EventQuery::default()).await.unwrap();
    assert_eq!(events.len(), 8);
    assert!(events.iter().all(|e| e.session_id == "good"));
    let report = loom
        .tenant_report(DEFAULT_TENANT, Period::Day, chrono::Utc::now())
        .await
        .unwrap();
    assert_eq!(report.runs.len(), 1, "{report:?}");
    assert_eq!(report.runs[&runs[0].run_id].session_id, "good");
    assert!(loom.recover_all().await.unwrap().is_empty());
    // The tenant has a budget: opening a run reads every session of the tenant.
    assert!(
        loom.run("echo", "Encore", RunOptions::default())
            .await
            .unwrap()
            .ok()
    );

    corrupted(loom.locate(&runs[1].run_id, None, None).await.unwrap_err());
    corrupted(loom.session("bad", None).await.unwrap_err());
    corrupted(
        loom.query(&EventQuery {
            session_id: Some("bad".into()),
            ..EventQuery::default()
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(
        loom.delete_session("bad", None)
            .await
            .unwrap()
            .events_deleted,
        8
    );
}
