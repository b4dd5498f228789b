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
//! SQLite are measured. See `bench/README.md`.
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
#[loom_ia::tool(side_effects = "none")]
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

/// `(sequential runs/s, concurrent runs/s)` of `runs` runs each.
async fn measure(loom: &Loom, tenant: &str, runs: usize) -> (f64, f64) {
    let first = loom.run("devis", MESSAGE, options(tenant)).await.unwrap();
    assert_eq!(first.status, RunStatus::Completed, "{first:?}");
    assert!(first.text.contains("1375,00 € TTC"), "{}", first.text);
    let started = Instant::now();
    for _ in 0..runs {
        loom.run("devis", MESSAGE, options(tenant)).await.unwrap();
    }
    let sequential = runs as f64 / started.elapsed().as_secs_f64();
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
    (sequential, concurrent)
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
        let (sequential, concurrent) = measure(&jsonl, tenant, runs).await;
        println!("  jsonl     sequential {sequential:>7.1}   concurrent {concurrent:>7.1}");
        let sqlite = loom(
            "storage:\n  events: {backend: sqlite, path: data/loom.db}",
            dir.path(),
        )
        .await;
        let (sequential, concurrent) = measure(&sqlite, tenant, runs).await;
        println!("  sqlite    sequential {sequential:>7.1}   concurrent {concurrent:>7.1}");
        match std::env::var("LOOM_BENCH_POSTGRES") {
            Ok(set) if !set.is_empty() => {
                let postgres = loom(
                    "storage:\n  migrate: auto\n  events: {backend: postgres, \
                     dsn_env: LOOM_BENCH_POSTGRES, role: loom_bench, pool: {max_size: 20}}",
                    dir.path(),
                )
                .await;
                let (sequential, concurrent) = measure(&postgres, tenant, runs).await;
                println!("  postgres  sequential {sequential:>7.1}   concurrent {concurrent:>7.1}");
            }
            _ => println!("  postgres  skipped: LOOM_BENCH_POSTGRES is not set"),
        }
    });
}
