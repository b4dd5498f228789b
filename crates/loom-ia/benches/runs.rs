//! Throughput of complete runs through the [`loom_ia::Loom`] facade.
//!
//! Each iteration is one run of an agent shaped like the `devis` example, driven to completion:
//! the scripted fake model asks for one `prix_ttc` tool call, the tool answers, the model
//! answers with the tool's result. Every run is its own session (the default), so no journal
//! grows from one iteration to the next. Two journals are measured:
//!
//! - `memory`: the in-process store;
//! - `jsonl`: one file per session in a temporary directory; the appends that must be durable
//!   (`loom_core::event::must_sync`: the run's start and its end here, the tool being read-only)
//!   are synced with `fdatasync`, and the directory once per new session file.
//!
//! `memory_session` and `jsonl_session` time a run in a session that already holds 30 runs or
//! more (16 such sessions, taken in turn): what a conversation's next turn costs.
//!
//! ```text
//! cargo bench -p loom-ia --bench runs
//! LOOM_BENCH_CPU=2000 cargo bench -p loom-ia --bench runs   # also: CPU time per run (Linux)
//! ```
//!
//! Divan reports the time per run and, through the item counter, runs per second. With
//! `LOOM_BENCH_CPU=<n>`, `n` runs per journal are first timed in a plain loop and the process's
//! CPU time (user + system, every thread, from `/proc/self/stat`) is divided by `n`; the
//! journal writes of one run (appends, events) are counted too. Divan's table also gives the
//! heap allocations per run (count and bytes: its `AllocProfiler` is the global allocator, over
//! the system one). See `bench/README.md`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use divan::{Bencher, counter::ItemsCount};
use loom_ia::{
    Loom, RunOptions, RunStatus,
    core::{
        BoxFuture, Event,
        ports::{EventStore, SessionSummary, StoreError},
    },
};
use loom_journal::{JsonlStore, MemoryStore};
use tempfile::TempDir;
use tokio::runtime::Runtime;

/// Counts heap allocations for divan's table (over the system allocator).
#[global_allocator]
static ALLOC: divan::AllocProfiler = divan::AllocProfiler::system();

/// The user's request, as in the `devis` example.
const MESSAGE: &str = "Quel prix TTC pour un devis de 1 250 € HT en rénovation (TVA à 10 %) ?";

/// The configuration: the `devis` example with its agent inline; `{storage}` is replaced by
/// the journal under test.
const CONFIG: &str = r#"
version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    pricing: {input: 3.0, output: 15.0}
    params:
      script:
        - text: "Je calcule le prix TTC avec l'outil prix_ttc."
          tool_calls:
            - name: prix_ttc
              arguments: {montant_ht: 1250, taux_tva: 10}
        - text: "Pour ce devis de rénovation, le prix est de {{ tool_result }}."
agents:
  - name: devis
    description: Prépare les montants des devis (prix TTC à partir du HT et du taux de TVA).
    main:
      model: fake-1
      system: |
        Tu es l'assistant « {{ agent }} » d'une petite entreprise du bâtiment.
        Tu prépares les montants des devis. Tu ne fais jamais de calcul toi-même :
        tout montant vient de l'outil prix_ttc, et tu recopies son résultat tel quel.
    max_iterations: 5
    timeout: 60
    tools:
      - tool: prix_ttc
        side_effects: none
{storage}
telemetry:
  logging: {level: WARN}
"#;

/// Calcule le prix TTC d'un montant HT en euros pour un taux de TVA donné en pourcentage.
#[loom_ia::tool(side_effects = "none", inline)]
fn prix_ttc(montant_ht: f64, taux_tva: f64) -> String {
    let ht = (montant_ht * 100.0).round() as i64;
    let tva = (ht as f64 * taux_tva / 100.0).round() as i64;
    let ttc = ht + tva;
    format!("{},{:02} € TTC", ttc / 100, ttc % 100)
}

/// The journal a fixture runs on.
#[derive(Debug, Clone, Copy)]
enum Journal {
    Memory,
    Jsonl,
}

impl Journal {
    fn name(self) -> &'static str {
        match self {
            Journal::Memory => "memory",
            Journal::Jsonl => "jsonl",
        }
    }
}

/// A journal that counts the appends and events going through it.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn EventStore>,
    appends: AtomicUsize,
    events: AtomicUsize,
    /// While `Some`, the event types of each append, in order.
    batches: Mutex<Option<Vec<Vec<String>>>>,
}

impl Counting {
    fn new(inner: Arc<dyn EventStore>) -> Counting {
        Counting {
            inner,
            appends: AtomicUsize::new(0),
            events: AtomicUsize::new(0),
            batches: Mutex::new(None),
        }
    }
}

impl Counting {
    fn count<E: std::borrow::Borrow<Event>>(&self, batch: &[E]) {
        self.appends.fetch_add(1, Ordering::Relaxed);
        self.events.fetch_add(batch.len(), Ordering::Relaxed);
        if let Some(batches) = self.batches.lock().unwrap().as_mut() {
            batches.push(
                batch
                    .iter()
                    .map(|e| e.borrow().event_type.clone())
                    .collect(),
            );
        }
    }
}

impl EventStore for Counting {
    fn append(
        &self,
        batch: Vec<Event>,
        expected_last_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Event>, StoreError>> {
        self.count(&batch);
        self.inner.append(batch, expected_last_seq)
    }

    fn append_shared<'a>(
        &'a self,
        batch: &'a [Arc<Event>],
        expected_last_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Arc<Event>>, StoreError>> {
        self.count(batch);
        self.inner.append_shared(batch, expected_last_seq)
    }

    fn read_shared<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Arc<Event>>, StoreError>> {
        self.inner.read_shared(tenant_id, session_id, after_seq)
    }

    fn last_of_type_shared<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        event_type: &'a str,
        before_seq: u64,
    ) -> BoxFuture<'a, Result<Option<Arc<Event>>, StoreError>> {
        self.inner
            .last_of_type_shared(tenant_id, session_id, event_type, before_seq)
    }

    fn read<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
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

    // The reads a store answers from its indexes, forwarded as `loom_ia`'s own wrappers do (the
    // trait's defaults read the whole session, which no production path does).
    fn run_start<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        self.inner.run_start(tenant_id, session_id, run_id)
    }

    fn last_of_type<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        event_type: &'a str,
        before_seq: u64,
    ) -> BoxFuture<'a, Result<Option<Event>, StoreError>> {
        self.inner
            .last_of_type(tenant_id, session_id, event_type, before_seq)
    }
}

/// A runtime, a Loom with `prix_ttc` registered and the directory holding its files.
struct Fixture {
    runtime: Runtime,
    loom: Loom,
    counting: Arc<Counting>,
    /// The event types of each append of the first (checked) run.
    first_run_batches: Vec<Vec<String>>,
    dir: TempDir,
}

impl Fixture {
    fn new(journal: Journal) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let storage = match journal {
            Journal::Memory => "storage:\n  events: {backend: memory}",
            Journal::Jsonl => "storage:\n  events: {backend: jsonl, path: data}",
        };
        let text = CONFIG.replace("{storage}", storage);
        let config = loom_ia::config::from_yaml_str(&text, dir.path(), None, &|_| None).unwrap();
        let store: Arc<dyn EventStore> = match journal {
            Journal::Memory => Arc::new(MemoryStore::new()),
            Journal::Jsonl => Arc::new(JsonlStore::new(config.events_path().unwrap())),
        };
        let counting = Arc::new(Counting::new(store));
        let loom = Loom::with_store(config, counting.clone()).unwrap();
        loom.register("prix_ttc", prix_ttc_tool()).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // Resolves (and caches) the agent, so that no iteration pays for it.
        runtime.block_on(loom.validate()).unwrap();
        let mut fixture = Fixture {
            runtime,
            loom,
            counting,
            first_run_batches: Vec::new(),
            dir,
        };
        fixture.first_run_batches = fixture.check(journal);
        fixture
    }

    /// One complete run.
    fn run(&self) -> loom_ia::RunResult {
        self.runtime
            .block_on(self.loom.run("devis", MESSAGE, RunOptions::default()))
            .unwrap()
    }

    /// A first run, checked: it completes with the tool's amount, and on JSONL it is a file.
    /// Returns the event types of each of its appends.
    fn check(&self, journal: Journal) -> Vec<Vec<String>> {
        *self.counting.batches.lock().unwrap() = Some(Vec::new());
        let result = self.run();
        assert_eq!(result.status, RunStatus::Completed, "{result:?}");
        assert!(result.text.contains("1375,00 € TTC"), "{}", result.text);
        if let Journal::Jsonl = journal {
            let file = self
                .dir
                .path()
                .join("data/default")
                .join(format!("{}.jsonl", result.session_id));
            assert!(file.is_file(), "no journal at {}", file.display());
        }
        self.counting
            .batches
            .lock()
            .unwrap()
            .take()
            .unwrap_or_default()
    }

    /// `(appends, events)` counted so far.
    fn writes(&self) -> (usize, usize) {
        (
            self.counting.appends.load(Ordering::Relaxed),
            self.counting.events.load(Ordering::Relaxed),
        )
    }
}

fn bench_runs(bencher: Bencher<'_, '_>, journal: Journal) {
    let fixture = Fixture::new(journal);
    bencher
        .counter(ItemsCount::new(1usize))
        .bench_local(|| fixture.run());
}

/// One run on the in-process journal.
#[divan::bench(sample_count = 2000)]
fn memory(bencher: Bencher<'_, '_>) {
    bench_runs(bencher, Journal::Memory);
}

/// One run on the JSONL journal (a temporary directory; 12 appends, 2 of them synced).
#[divan::bench(sample_count = 500)]
fn jsonl(bencher: Bencher<'_, '_>) {
    bench_runs(bencher, Journal::Jsonl);
}

/// Sessions a run of the `*_session` benches goes to, in turn.
const SESSIONS: usize = 16;

/// Runs each of those sessions holds before the bench starts.
const EARLIER_RUNS: usize = 30;

impl Fixture {
    /// One complete run in session `session` (`s<n>`).
    fn run_in(&self, session: usize) -> loom_ia::RunResult {
        let options = RunOptions {
            session_id: Some(format!("s{session}")),
            ..RunOptions::default()
        };
        self.runtime
            .block_on(self.loom.run("devis", MESSAGE, options))
            .unwrap()
    }

    /// The fixture, its [`SESSIONS`] sessions each grown to [`EARLIER_RUNS`] runs.
    fn with_sessions(journal: Journal) -> Fixture {
        let fixture = Fixture::new(journal);
        for _ in 0..EARLIER_RUNS {
            for session in 0..SESSIONS {
                fixture.run_in(session);
            }
        }
        fixture
    }
}

/// One run in a session that holds earlier runs (30 and more, 17 events each, a snapshot every
/// 50 events): the run reads its window (the last snapshot and what follows) several times and
/// is sent the session's history. The sessions are taken in turn, so each grows by one run per
/// 16 iterations.
fn bench_session_runs(bencher: Bencher<'_, '_>, journal: Journal) {
    let fixture = Fixture::with_sessions(journal);
    let next = AtomicUsize::new(0);
    bencher.counter(ItemsCount::new(1usize)).bench_local(|| {
        let session = next.fetch_add(1, Ordering::Relaxed) % SESSIONS;
        fixture.run_in(session)
    });
}

/// One run in a session of the in-process journal that holds earlier runs.
#[divan::bench(sample_count = 320)]
fn memory_session(bencher: Bencher<'_, '_>) {
    bench_session_runs(bencher, Journal::Memory);
}

/// One run in a session of the JSONL journal that holds earlier runs.
#[divan::bench(sample_count = 160)]
fn jsonl_session(bencher: Bencher<'_, '_>) {
    bench_session_runs(bencher, Journal::Jsonl);
}

/// CPU time (user + system, all threads) of this process so far, from `/proc/self/stat`.
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start at field 3 (`state`).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // `USER_HZ`, 100 on every Linux configuration in use.
    Some(Duration::from_secs_f64((utime + stime) as f64 / 100.0))
}

/// Times `runs` runs per journal in a plain loop and prints wall and CPU time per run.
fn cpu_report(runs: usize) {
    println!("CPU time per run ({runs} runs per journal, after one warm-up run)");
    for journal in [Journal::Memory, Journal::Jsonl] {
        let fixture = Fixture::new(journal);
        if let Journal::Memory = journal {
            println!("  appends of one run:");
            for (i, batch) in fixture.first_run_batches.iter().enumerate() {
                println!("    {:>2}. {}", i + 1, batch.join(" + "));
            }
        }
        let (appends_before, events_before) = fixture.writes();
        let cpu_before = cpu_time();
        let started = Instant::now();
        for _ in 0..runs {
            fixture.run();
        }
        let wall = started.elapsed();
        let cpu = cpu_time()
            .zip(cpu_before)
            .map(|(after, before)| after.saturating_sub(before));
        let (appends, events) = fixture.writes();
        let per_run = |total: usize, before: usize| (total - before) as f64 / runs as f64;
        println!(
            "  {:<6}  wall {:>8.1} µs/run ({:>6.0} runs/s)  cpu {}  appends/run {:.1}  events/run {:.1}",
            journal.name(),
            wall.as_secs_f64() * 1e6 / runs as f64,
            runs as f64 / wall.as_secs_f64(),
            cpu.map_or("n/a".to_owned(), |cpu| format!(
                "{:>8.1} µs/run ({:.0} % of wall)",
                cpu.as_secs_f64() * 1e6 / runs as f64,
                100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
            )),
            per_run(appends, appends_before),
            per_run(events, events_before),
        );
    }
    println!();
}

fn main() {
    if let Some(runs) = std::env::var("LOOM_BENCH_CPU")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        cpu_report(runs);
    }
    divan::main();
}
