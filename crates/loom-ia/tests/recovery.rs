//! Runs abandoned by a crashed process, taken over by the processes sharing its journal:
//! `Loom::watch_leases` on two instances at once resumes the run once its lease expires, and
//! when two sweeps find it at the same moment and both try to drive it, only one does
//! (JSONL here; SQLite too with the `sqlite` feature).

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::Path, time::Duration};

use loom_ia::{
    Loom, RunOptions, RunStatus, ToolContext,
    config::{AgentSpec, Config, EventsBackend, LoomConfig, ModelSpec, Sdk, ToolRef},
    core::event::Payload,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Waits the given number of milliseconds, then says so.
#[loom_ia::tool(side_effects = "none")]
async fn wait(ms: u64, ctx: ToolContext) -> String {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    format!("waited in {}", ctx.call_id)
}

/// One agent calling `wait` once, on a one-second lease.
fn leased_loom(dir: &Path, backend: EventsBackend, path: &str) -> Loom {
    let mut model = ModelSpec::new("fake-1", Sdk::Fake, "FAKE");
    model.params.insert(
        "script".into(),
        json!([
            {"text": "J'attends.", "tool_calls": [{"name": "wait", "arguments": {"ms": 1500}}]},
            {"text": "Fini : {{ tool_result }}."}
        ]),
    );
    let mut agent = AgentSpec::new("patient", "fake-1");
    agent.tools = vec![ToolRef::new("wait")];
    let mut raw = LoomConfig {
        models: vec![model],
        agents: vec![agent],
        ..LoomConfig::default()
    };
    raw.storage.events.backend = backend;
    raw.storage.events.path = Some(path.into());
    raw.execution.lease = 1.0;
    let loom = Loom::new(Config::new(raw, dir.to_path_buf()).unwrap()).unwrap();
    loom.register("wait", wait_tool()).unwrap();
    loom
}

/// Process A, on a runtime of its own: it opens a run in the background and is dropped, as a
/// `kill -9` would leave it, while the tool runs (no lease handed back). Its worker id, and the
/// end of the last lease it wrote, as it read its journal just before it was dropped.
fn crash_in_the_tool(
    dir: &Path,
    backend: EventsBackend,
    path: &str,
) -> (String, chrono::DateTime<chrono::Utc>) {
    let dir = dir.to_owned();
    let path = path.to_owned();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let worker = runtime.block_on(async {
            let loom = leased_loom(&dir, backend, &path);
            let run = loom
                .submit(
                    "patient",
                    "Attends.",
                    RunOptions {
                        run_id: Some("abandoned".into()),
                        ..RunOptions::default()
                    },
                )
                .await
                .unwrap();
            loom_testkit::wait::until("the abandoned run to call its tool", async || {
                loom.events(&run)
                    .await
                    .unwrap()
                    .iter()
                    .any(|e| matches!(e.payload, Payload::ToolCalled(_)))
            })
            .await;
            let lease_until = loom
                .events(&run)
                .await
                .unwrap()
                .iter()
                .filter_map(|e| match &e.payload {
                    Payload::RunClaimed(claim) => Some(claim.lease_until),
                    _ => None,
                })
                .next_back()
                .unwrap();
            (loom.worker_id().to_owned(), lease_until)
        });
        runtime.shutdown_background();
        worker
    })
    .join()
    .unwrap()
}

/// How B and C look for the abandoned run.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Takeover {
    /// Both run `watch_leases`, started before A crashes.
    Watch,
    /// Once A's lease has expired, both sweep at the same moment: usually both find the run and
    /// both try to drive it.
    Race,
}

async fn abandoned_run_is_resumed_once(backend: EventsBackend, path: &str, takeover: Takeover) {
    let dir = tempfile::tempdir().unwrap();
    let b = leased_loom(dir.path(), backend, path);
    let c = leased_loom(dir.path(), backend, path);
    let stop = CancellationToken::new();
    let watchers: Vec<_> = if takeover == Takeover::Watch {
        [b.clone(), c.clone()]
            .into_iter()
            .map(|loom| {
                let stop = stop.clone();
                tokio::spawn(async move { loom.watch_leases(stop.cancelled_owned()).await })
            })
            .collect()
    } else {
        Vec::new()
    };
    let (a, lease_until) = crash_in_the_tool(dir.path(), backend, path);
    if takeover == Takeover::Race {
        // Until A's last lease has run out: 1 s after its claim, and 1.1 s after the crash is
        // always past it; 3 s once renewed (three renewal periods of at least 1 s, as the
        // reference does).
        let left = (lease_until - chrono::Utc::now())
            .to_std()
            .unwrap_or_default();
        let wait = (left + Duration::from_millis(100)).max(Duration::from_millis(1100));
        tokio::time::sleep(wait).await;
        let (mut by_b, mut by_c) = (b.lease_watch(), c.lease_watch());
        let (found_b, found_c) = tokio::join!(by_b.sweep(), by_c.sweep());
        let (found_b, found_c) = (found_b.unwrap(), found_c.unwrap());
        // Usually both find the run and both drivers race for its claim; when one sweep reads
        // the session after the other's driver claimed it, that sweep rightly finds nothing.
        // Either way the run must be driven by one of them only (checked below).
        assert!(
            found_b.len() <= 1 && found_c.len() <= 1,
            "{found_b:?} {found_c:?}"
        );
        assert!(
            found_b.len() + found_c.len() >= 1,
            "neither sweep found the abandoned run"
        );
    }
    let run = b.locate("abandoned", None, None).await.unwrap();
    let result =
        loom_testkit::wait::until("the abandoned run to be resumed and close", async || {
            let result = b.result(&run).await.unwrap();
            if result.status.is_terminal() {
                Ok(result)
            } else {
                Err(format!("{result:?}"))
            }
        })
        .await;
    stop.cancel();
    for watcher in watchers {
        tokio::time::timeout(Duration::from_secs(10), watcher)
            .await
            .expect("the watch ends when told to stop")
            .unwrap();
    }
    assert_eq!(result.status, RunStatus::Completed, "{result:?}");
    assert!(result.text.starts_with("Fini : waited in"), "{result:?}");

    // One driver at a time: A's claims, then those of one other worker only.
    let events = b.events(&run).await.unwrap();
    let mut drivers: Vec<&str> = Vec::new();
    for event in &events {
        if let Payload::RunClaimed(claim) = &event.payload
            && drivers.last() != Some(&claim.worker_id.as_str())
        {
            drivers.push(&claim.worker_id);
        }
    }
    assert_eq!(drivers.len(), 2, "{drivers:?}");
    assert_eq!(drivers[0], a);
    assert!(
        drivers[1] == b.worker_id() || drivers[1] == c.worker_id(),
        "{drivers:?}"
    );
    // A's call had no result: the one driver ran it again, once.
    let called = events
        .iter()
        .filter(|e| matches!(e.payload, Payload::ToolCalled(_)))
        .count();
    let completed = events
        .iter()
        .filter(|e| matches!(e.payload, Payload::ToolCompleted(_)))
        .count();
    assert_eq!((called, completed), (2, 1));
    // Nothing is left for a later sweep.
    assert!(b.recover_all().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_watchers_resume_a_run_abandoned_in_a_jsonl_journal_once() {
    abandoned_run_is_resumed_once(EventsBackend::Jsonl, "journal", Takeover::Watch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sweeps_racing_for_a_run_of_a_jsonl_journal_drive_it_once() {
    abandoned_run_is_resumed_once(EventsBackend::Jsonl, "journal", Takeover::Race).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_watchers_resume_a_run_abandoned_in_a_sqlite_journal_once() {
    abandoned_run_is_resumed_once(EventsBackend::Sqlite, "journal.db", Takeover::Watch).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sweeps_racing_for_a_run_of_a_sqlite_journal_drive_it_once() {
    abandoned_run_is_resumed_once(EventsBackend::Sqlite, "journal.db", Takeover::Race).await;
}

#[test]
fn the_sweep_period_is_half_the_lease_within_bounds() {
    use loom_ia::sweep_period;
    assert_eq!(
        sweep_period(Duration::from_secs(60)),
        Duration::from_secs(30)
    );
    assert_eq!(
        sweep_period(Duration::from_secs(10)),
        Duration::from_secs(5)
    );
    assert_eq!(
        sweep_period(Duration::from_millis(300)),
        loom_ia::MIN_SWEEP_PERIOD
    );
    assert_eq!(
        sweep_period(Duration::from_secs(3600)),
        loom_ia::MAX_SWEEP_PERIOD
    );
}
