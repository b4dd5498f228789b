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
//! first 100 events), and an event search that matches nothing (every session read); then
//! `GET /runs/{id}` without its session (`Loom::locate`) for a run that does not exist and for
//! one that does, through the journal's run index and, for comparison, by reading the sessions
//! (`EventStore::find_run`'s default, what a lookup did before the index).
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
    EventQuery, Loom, LoomError, RunOptions, RunQuery,
    core::{
        BoxFuture, Event,
        ports::{EventStore, SessionSummary, StoreError},
    },
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

    // Lookups of a run without its session: the first one brings the index up to date.
    let _ = loom.locate("warm-up", None, None).await;
    let (unknown, known) = locate(&loom, sessions, rounds).await;
    println!("  GET /runs/{{id}} unknown, index  {}", ms(unknown));
    println!("  GET /runs/{{id}} known, index    {}", ms(known));
    let config = loom_ia::config::from_yaml_str(CONFIG, dir.path(), None, &|_| None).unwrap();
    let scanning = Loom::with_store(config, Arc::new(Scanning(store))).unwrap();
    let (unknown, known) = locate(&scanning, sessions, rounds).await;
    println!("  GET /runs/{{id}} unknown, scan   {}", ms(unknown));
    println!("  GET /runs/{{id}} known, scan     {}", ms(known));
}

/// A journal without its run index: `find_run` is the port's default, which reads the sessions.
#[derive(Debug)]
struct Scanning(Arc<dyn EventStore>);

impl EventStore for Scanning {
    fn append(
        &self,
        batch: Vec<Event>,
        expected_last_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Event>, StoreError>> {
        self.0.append(batch, expected_last_seq)
    }

    fn read<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        self.0.read(tenant_id, session_id, after_seq)
    }

    fn last_seq<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.0.last_seq(tenant_id, session_id)
    }

    fn sessions<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SessionSummary>, StoreError>> {
        self.0.sessions(tenant_id)
    }

    fn delete<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.0.delete(tenant_id, session_id)
    }
}

/// `GET /runs/{id}` without `session_id`: the median lookup of an unknown run and of a run in
/// the middle of the journal.
async fn locate(loom: &Loom, sessions: usize, rounds: usize) -> (Duration, Duration) {
    let (mut unknown, mut known) = (Vec::new(), Vec::new());
    let middle = format!("s{:06}", sessions / 2);
    for _ in 0..rounds {
        let t = Instant::now();
        assert!(matches!(
            loom.locate("nobody", None, None).await,
            Err(LoomError::UnknownRun(_))
        ));
        unknown.push(t.elapsed());
        let t = Instant::now();
        assert_eq!(
            loom.locate(&middle, None, None).await.unwrap().session_id,
            middle
        );
        known.push(t.elapsed());
    }
    (median(unknown), median(known))
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
