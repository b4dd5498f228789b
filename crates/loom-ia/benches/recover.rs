//! Cost of the sweep for abandoned runs ([`loom_ia::Loom::lease_watch`]) on a journal with many
//! sessions, against reading every session each time ([`loom_ia::Loom::recover_all`], what a
//! server does at start).
//!
//! The journal holds `LOOM_BENCH_SESSIONS` sessions (default 2000), each a copy of one
//! completed run of a tool-less agent (8 events). For each journal (JSONL, and SQLite with the
//! `sqlite` feature) it prints the median of `LOOM_BENCH_ROUNDS` (default 5) timings of:
//!
//! - `list`: the session list alone (`EventStore::sessions`), which every sweep asks for;
//! - `full`: `recover_all`, reading every session;
//! - `steady`: a sweep of a `LeaseWatch` that has already swept, nothing changed since;
//! - `1% new`: the same, after 1 % more sessions were written (those are read);
//!
//! and the queries of the REST read routes on the same journal: `GET /runs` (`Loom::runs`,
//! defaults: the 50 most recent sessions read), `GET /events` (`Loom::query`, defaults: the
//! first 100 events), and an event search that matches nothing (every session read).
//!
//! ```text
//! cargo bench -p loom-ia --features sqlite --bench recover
//! LOOM_BENCH_SESSIONS=10000 cargo bench -p loom-ia --features sqlite --bench recover
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use loom_ia::{
    EventQuery, Loom, RunOptions, RunQuery,
    core::ports::EventStore,
    query::{DEFAULT_EVENTS, DEFAULT_RUNS},
};
use loom_journal::{JsonlStore, MemoryStore};

const CONFIG: &str = r#"
version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
        - text: "Bonjour."
agents:
  - name: hello
    main: {model: fake-1}
telemetry:
  logging: {level: ERROR}
"#;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:9.2} ms", d.as_secs_f64() * 1000.0)
}

/// The events of one completed run, to copy into each session.
async fn template() -> Vec<loom_ia::Event> {
    let dir = tempfile::tempdir().unwrap();
    let config = loom_ia::config::from_yaml_str(CONFIG, dir.path(), None, &|_| None).unwrap();
    let loom = Loom::with_store(config, Arc::new(MemoryStore::new())).unwrap();
    let result = loom
        .run("hello", "Salut", RunOptions::default())
        .await
        .unwrap();
    let run = loom.locate(&result.run_id, None, None).await.unwrap();
    loom.events(&run).await.unwrap()
}

/// Writes sessions `from..to`, one append each.
async fn fill(store: &dyn EventStore, template: &[loom_ia::Event], from: usize, to: usize) {
    for i in from..to {
        let id = format!("s{i:06}");
        let batch: Vec<loom_ia::Event> = template
            .iter()
            .map(|event| {
                let mut event = event.clone();
                event.session_id.clone_from(&id);
                event.run_id.clone_from(&id);
                event.root_run_id.clone_from(&id);
                event.event_id = format!("{}-{i}", event.event_id);
                event.seq = 0;
                event
            })
            .collect();
        store.append(batch, 0).await.unwrap();
    }
}

async fn measure(name: &str, store: Arc<dyn EventStore>, sessions: usize, rounds: usize) {
    let dir = tempfile::tempdir().unwrap();
    let template = template().await;
    let started = Instant::now();
    fill(store.as_ref(), &template, 0, sessions).await;
    println!(
        "{name}: {sessions} sessions of {} events written in {:.1} s",
        template.len(),
        started.elapsed().as_secs_f64()
    );
    let config = loom_ia::config::from_yaml_str(CONFIG, dir.path(), None, &|_| None).unwrap();
    let loom = Loom::with_store(config, store.clone()).unwrap();

    let mut list = Vec::new();
    let mut full = Vec::new();
    let mut steady = Vec::new();
    let mut grown = Vec::new();
    let mut next = sessions;
    for _ in 0..rounds {
        let t = Instant::now();
        assert_eq!(store.sessions("default").await.unwrap().len(), next);
        list.push(t.elapsed());

        let t = Instant::now();
        assert!(loom.recover_all().await.unwrap().is_empty());
        full.push(t.elapsed());

        let mut watch = loom.lease_watch();
        watch.sweep().await.unwrap();
        let t = Instant::now();
        assert!(watch.sweep().await.unwrap().is_empty());
        steady.push(t.elapsed());

        let more = (sessions / 100).max(1);
        fill(store.as_ref(), &template, next, next + more).await;
        next += more;
        let t = Instant::now();
        assert!(watch.sweep().await.unwrap().is_empty());
        grown.push(t.elapsed());
    }
    println!("  list     {}", ms(median(list)));
    println!("  full     {}", ms(median(full)));
    println!("  steady   {}", ms(median(steady)));
    println!("  1% new   {}", ms(median(grown)));

    // The read routes on the same journal: `GET /v1/runs` (defaults), `GET /v1/events`
    // (defaults: the first 100 events), and an event search that matches nothing (every
    // session is read).
    let (mut page, mut first, mut none) = (Vec::new(), Vec::new(), Vec::new());
    let tenant = Some("default".to_owned());
    for _ in 0..rounds {
        let t = Instant::now();
        let runs = loom
            .runs(&RunQuery {
                tenant_id: tenant.clone(),
                ..RunQuery::default()
            })
            .await
            .unwrap();
        page.push(t.elapsed());
        assert_eq!(runs.runs.len(), DEFAULT_RUNS);

        let t = Instant::now();
        let found = loom
            .query(&EventQuery {
                tenant_id: tenant.clone(),
                ..EventQuery::default()
            })
            .await
            .unwrap();
        first.push(t.elapsed());
        assert_eq!(found.len(), DEFAULT_EVENTS);

        let t = Instant::now();
        let found = loom
            .query(&EventQuery {
                tenant_id: tenant.clone(),
                types: vec!["run.failed".into()],
                ..EventQuery::default()
            })
            .await
            .unwrap();
        none.push(t.elapsed());
        assert!(found.is_empty());
    }
    println!("  GET /runs              {}", ms(median(page)));
    println!("  GET /events            {}", ms(median(first)));
    println!("  GET /events (no match) {}", ms(median(none)));
}

fn main() {
    let sessions = env("LOOM_BENCH_SESSIONS", 2000);
    let rounds = env("LOOM_BENCH_ROUNDS", 5).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        measure(
            "jsonl",
            Arc::new(JsonlStore::new(dir.path().join("data"))),
            sessions,
            rounds,
        )
        .await;
        #[cfg(feature = "sqlite")]
        {
            let store = loom_sqlite::SqliteStore::open(dir.path().join("loom.db")).unwrap();
            measure("sqlite", Arc::new(store), sessions, rounds).await;
        }
    });
}
