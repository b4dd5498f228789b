//! Runs per second on the durable journals, JSONL, SQLite and PostgreSQL, through
//! [`loom_ia::Loom`]: sequential (one run after another, one task) and concurrent (100 runs at
//! once on a multi-thread runtime, each its own session), for the same `devis`-shaped run as
//! `benches/runs.rs` (one tool call, 17 events in 12 appends).
//!
//! ```text
//! createdb -h 127.0.0.1 -U postgres loom_bench
//! LOOM_BENCH_POSTGRES=postgres://postgres@127.0.0.1:5432/loom_bench \
//!     cargo bench -p loom-ia --features sqlite,postgres --bench durable
//! LOOM_BENCH_RUNS=500 …                          # runs per measure (default 300)
//! ```
//!
//! The PostgreSQL database is migrated by Loom (`storage.migrate: auto`, role `loom_bench`);
//! every run is a new session of the tenant `default`. Without `LOOM_BENCH_POSTGRES` only JSONL and
//! SQLite are measured. On Linux each measure also prints the cache flushes the disks completed
//! per run (`/proc/diskstats`, whole disks): what the syncs asked for cost the device, shared
//! between concurrent runs when the filesystem or the database commits them together. See
//! `bench/README.md`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use loom_ia::{Loom, RunOptions, RunStatus};

/// The user's request, as in the `devis` example.
const MESSAGE: &str = "Quel prix TTC pour un devis de 1 250 € HT en rénovation (TVA à 10 %) ?";

/// Runs at once in the concurrent measure.
const CONCURRENCY: usize = 100;

const CONFIG: &str = r#"
version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
        - text: "Je calcule le prix TTC avec l'outil prix_ttc."
          tool_calls:
            - name: prix_ttc
              arguments: {montant_ht: 1250, taux_tva: 10}
        - text: "Pour ce devis de rénovation, le prix est de {{ tool_result }}."
agents:
  - name: devis
    description: Prépare les montants des devis.
    main:
      model: fake-1
      system: Tu prépares les montants des devis.
    max_iterations: 5
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

/// A Loom on `storage` (the DSN, for PostgreSQL, is read from the environment).
async fn loom(storage: &str, dir: &std::path::Path) -> Loom {
    let text = CONFIG.replace("{storage}", storage);
    let config = loom_ia::config::from_yaml_str(&text, dir, None, &|_| None).unwrap();
    let loom = Loom::open(config).await.unwrap();
    loom.register("prix_ttc", prix_ttc_tool()).unwrap();
    loom.validate().await.unwrap();
    loom
}

fn options(tenant: &str) -> RunOptions {
    RunOptions {
        tenant_id: Some(tenant.to_owned()),
        ..RunOptions::default()
    }
}

/// The cache flushes the machine's whole disks have completed (`/proc/diskstats`, field 16 of
/// each disk listed in `/sys/block` but loop and RAM devices), when the kernel says.
fn disk_flushes() -> Option<u64> {
    let stats = std::fs::read_to_string("/proc/diskstats").ok()?;
    let disks: Vec<String> = std::fs::read_dir("/sys/block")
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| !["loop", "ram", "zram"].iter().any(|p| name.starts_with(p)))
        .collect();
    let mut total = None;
    for line in stats.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() >= 19 && disks.iter().any(|disk| disk == fields[2]) {
            *total.get_or_insert(0) += fields[18].parse::<u64>().ok()?;
        }
    }
    total
}

/// Disk flushes per run between two readings, as text.
fn per_run(before: Option<u64>, after: Option<u64>, runs: usize) -> String {
    match (before, after) {
        (Some(before), Some(after)) => {
            format!("{:.2}", after.saturating_sub(before) as f64 / runs as f64)
        }
        _ => "n/a".into(),
    }
}

/// One measure: runs per second and disk flushes per run, one run after another and 100 at
/// once.
struct Measure {
    sequential: f64,
    concurrent: f64,
    sequential_flushes: String,
    concurrent_flushes: String,
}

impl std::fmt::Display for Measure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sequential {:>7.1}   concurrent {:>7.1}   disk flushes/run {} / {}",
            self.sequential, self.concurrent, self.sequential_flushes, self.concurrent_flushes
        )
    }
}

/// Runs per second and disk flushes per run of `runs` runs, sequential then concurrent.
async fn measure(loom: &Loom, tenant: &str, runs: usize) -> Measure {
    let first = loom.run("devis", MESSAGE, options(tenant)).await.unwrap();
    assert_eq!(first.status, RunStatus::Completed, "{first:?}");
    assert!(first.text.contains("1375,00 € TTC"), "{}", first.text);
    let flushes = disk_flushes();
    let started = Instant::now();
    for _ in 0..runs {
        loom.run("devis", MESSAGE, options(tenant)).await.unwrap();
    }
    let sequential = runs as f64 / started.elapsed().as_secs_f64();
    let between = disk_flushes();
    let sequential_flushes = per_run(flushes, between, runs);
    let started = Instant::now();
    let mut done = 0;
    while done < runs {
        let wave: Vec<_> = (0..CONCURRENCY.min(runs - done))
            .map(|_| {
                let loom = loom.clone();
                let tenant = tenant.to_owned();
                tokio::spawn(async move { loom.run("devis", MESSAGE, options(&tenant)).await })
            })
            .collect();
        for task in wave {
            let result = task.await.unwrap().unwrap();
            assert_eq!(result.status, RunStatus::Completed);
            done += 1;
        }
    }
    let concurrent = runs as f64 / started.elapsed().as_secs_f64();
    Measure {
        sequential,
        concurrent,
        sequential_flushes,
        concurrent_flushes: per_run(between, disk_flushes(), runs),
    }
}

fn main() {
    let runs: usize = std::env::var("LOOM_BENCH_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(300);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tenant = "default";
    println!("runs/s, {runs} runs per measure (concurrent: waves of {CONCURRENCY})");
    runtime.block_on(async {
        let jsonl = loom(
            "storage:\n  events: {backend: jsonl, path: data/journal}",
            dir.path(),
        )
        .await;
        println!("  jsonl     {}", measure(&jsonl, tenant, runs).await);
        let sqlite = loom(
            "storage:\n  events: {backend: sqlite, path: data/loom.db}",
            dir.path(),
        )
        .await;
        println!("  sqlite    {}", measure(&sqlite, tenant, runs).await);
        match std::env::var("LOOM_BENCH_POSTGRES") {
            Ok(set) if !set.is_empty() => {
                let postgres = loom(
                    "storage:\n  migrate: auto\n  events: {backend: postgres, \
                     dsn_env: LOOM_BENCH_POSTGRES, role: loom_bench, pool: {max_size: 20}}",
                    dir.path(),
                )
                .await;
                println!("  postgres  {}", measure(&postgres, tenant, runs).await);
            }
            _ => println!("  postgres  skipped: LOOM_BENCH_POSTGRES is not set"),
        }
    });
}
