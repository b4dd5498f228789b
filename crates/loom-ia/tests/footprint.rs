//! What an instance keeps in memory per finished run: its events in the memory journal, kept
//! compact, and nothing else once the run is closed and its followers are gone.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use futures_util::{StreamExt, future::join_all};
use loom_ia::{
    Loom, Residents, RunOptions, RunRef, RunResult, RunStatus,
    config::{AgentSpec, Config, LoomConfig, ModelSpec, Sdk, ToolRef},
};
use loom_journal::MemoryStore;
use serde_json::json;

/// Adds two numbers (arithmetic is done by tools, never by the model).
#[loom_ia::tool]
fn add(a: f64, b: f64) -> String {
    format!("{}", a + b)
}

/// The runs of the test: as many as the memory journal packs in several rounds.
const RUNS: usize = 600;
/// How many at once.
const AT_ONCE: usize = 4;
/// A run: its start and message, a claim, two model steps around one tool call, its close.
const EVENTS_PER_RUN: u64 = 17;
/// What one finished run may cost in the memory journal, on average with the runs still
/// unpacked: its 17 lines take about 15 KiB, compressed (LZ4) about 3.1 KiB (deflated, they
/// took 2.4 KiB; kept as decoded events, about 40 KiB).
const BYTES_PER_RUN: usize = 4 * 1024;

fn loom(store: Arc<MemoryStore>) -> Loom {
    let mut model = ModelSpec::new("fake-1", Sdk::Fake, "FAKE");
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
    let raw = LoomConfig {
        models: vec![model],
        agents: vec![agent],
        ..LoomConfig::default()
    };
    let config = Config::new(raw, std::env::temp_dir()).unwrap();
    let loom = Loom::with_store(config, store).unwrap();
    loom.register("add", add_tool()).unwrap();
    loom
}

/// Run `i`: followed to its end (a third), submitted in the background (a third), or run
/// synchronously; its result.
async fn one(loom: &Loom, i: usize) -> RunResult {
    let message = format!("Combien font 12 + 30 ? (demande {i})");
    match i % 3 {
        0 => {
            let run = loom
                .submit("calc", message, RunOptions::default())
                .await
                .unwrap();
            let followed: Vec<_> = loom.follow(&run, 0).collect().await;
            assert_eq!(followed.len() as u64, EVENTS_PER_RUN, "run {i}");
            loom.result(&run).await.unwrap()
        }
        1 => {
            let run = loom
                .submit("calc", message, RunOptions::default())
                .await
                .unwrap();
            loom_testkit::wait::until(format!("background run {i} to close"), async || {
                let result = loom.result(&run).await.unwrap();
                (result.status == RunStatus::Completed).then_some(result)
            })
            .await
        }
        _ => loom
            .run("calc", message, RunOptions::default())
            .await
            .unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_run_leaves_only_its_compact_events() {
    let store = Arc::new(MemoryStore::new());
    let loom = loom(store.clone());
    let mut runs = Vec::new();
    for wave in 0..RUNS / AT_ONCE {
        let results = join_all((0..AT_ONCE).map(|k| one(&loom, wave * AT_ONCE + k))).await;
        for result in results {
            assert_eq!(result.text, "Résultat : 42.");
            runs.push(RunRef {
                tenant_id: "default".into(),
                session_id: result.session_id,
                run_id: result.run_id,
            });
        }
    }
    // No run is driven any more and nobody follows: nothing is left about them beside the
    // journal (a background drive lets go of its run just after its last append).
    loom_testkit::wait::until("the instance to let go of its runs", async || {
        (loom.residents() == Residents::default()).then_some(())
    })
    .await;

    let footprint = store.footprint();
    assert_eq!(footprint.sessions, RUNS);
    assert_eq!(footprint.events, RUNS as u64 * EVENTS_PER_RUN);
    let bytes = footprint.line_bytes + footprint.packed_bytes + footprint.index_bytes;
    assert!(
        bytes <= RUNS * BYTES_PER_RUN,
        "{} bytes per finished run ({footprint:?})",
        bytes / RUNS
    );

    // The journal is still the truth: every run, packed long ago or not, reads back whole.
    for run in &runs {
        let result = loom.result(run).await.unwrap();
        assert_eq!(
            (result.status, result.text.as_str()),
            (RunStatus::Completed, "Résultat : 42.")
        );
        assert_eq!(loom.events(run).await.unwrap().len() as u64, EVENTS_PER_RUN);
    }

    // The lease sweep remembers one small record per session, nothing per event.
    let mut watch = loom.lease_watch();
    assert!(watch.sweep().await.unwrap().is_empty());
    assert_eq!(watch.remembered(), RUNS);
}
