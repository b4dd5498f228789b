//! Background runs through a job queue (`Loom::with_queue`, here the in-process `MemoryQueue`;
//! RabbitMQ in `crates/loom-rabbitmq` and through the `loom` binary): a submitted run is a job
//! that `Loom::work` drives in another instance; a worker that dies leaves its job to another,
//! which takes the run over once its lease expires; a paused run's decision queues its resume;
//! a job that keeps failing ends in the dead-letter list.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::Path, sync::Arc, time::Duration};

use loom_ia::{
    Loom, RunOptions, RunStatus, ToolContext, WorkOptions,
    config::{AgentSpec, Config, EventsBackend, LoomConfig, ModelSpec, Sdk, ToolRef},
    core::{
        event::Payload,
        queue::{Job, JobKind, JobQueue},
    },
};
use loom_journal::MemoryQueue;
use serde_json::json;

/// Waits the given number of milliseconds, then says so.
#[loom_ia::tool(side_effects = "none")]
async fn wait(ms: u64, ctx: ToolContext) -> String {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    format!("waited in {}", ctx.call_id)
}

/// Sends a quote (a human approves every call).
#[loom_ia::tool(side_effects = "irreversible", approval = "always")]
fn envoyer(client: String) -> String {
    format!("devis envoyé à {client}")
}

/// Two agents on a JSONL journal and a one-second lease: `patient` waits `ms`, `devis` needs an
/// approval.
fn loom(dir: &Path, queue: &Arc<MemoryQueue>, ms: u64) -> Loom {
    let mut patient = ModelSpec::new("fake-wait", Sdk::Fake, "FAKE");
    patient.params.insert(
        "script".into(),
        json!([
            {"text": "J'attends.", "tool_calls": [{"name": "wait", "arguments": {"ms": ms}}]},
            {"text": "Fini : {{ tool_result }}."}
        ]),
    );
    let mut devis = ModelSpec::new("fake-devis", Sdk::Fake, "FAKE");
    devis.params.insert(
        "script".into(),
        json!([
            {"text": "J'envoie.", "tool_calls": [{"name": "envoyer", "arguments": {"client": "Martin"}}]},
            {"text": "Résultat : {{ tool_result }}"}
        ]),
    );
    let mut waiting = AgentSpec::new("patient", "fake-wait");
    waiting.tools = vec![ToolRef::new("wait")];
    let mut approving = AgentSpec::new("devis", "fake-devis");
    approving.tools = vec![ToolRef::new("envoyer")];
    let mut raw = LoomConfig {
        models: vec![patient, devis],
        agents: vec![waiting, approving],
        ..LoomConfig::default()
    };
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("journal".into());
    raw.execution.lease = 1.0;
    let loom = Loom::new(Config::new(raw, dir.to_path_buf()).unwrap())
        .unwrap()
        .with_queue(queue.clone());
    loom.register("wait", wait_tool()).unwrap();
    loom.register("envoyer", envoyer_tool()).unwrap();
    loom
}

/// Starts a worker on `loom` in the background.
fn start_worker(loom: &Loom) -> tokio::task::JoinHandle<()> {
    let worker = loom.clone();
    tokio::spawn(async move { worker.work(WorkOptions { jobs: 4 }).await.unwrap() })
}

async fn status(loom: &Loom, run_id: &str) -> RunStatus {
    let run = loom.locate(run_id, None, None).await.unwrap();
    loom.state(&run).await.unwrap().status
}

#[tokio::test]
async fn a_submitted_run_is_a_job_that_a_worker_drives() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Arc::new(MemoryQueue::new(5));
    let accepting = loom(dir.path(), &queue, 10);
    let run = accepting
        .submit("patient", "Attends.", RunOptions::default())
        .await
        .unwrap();
    // Accepted and queued: nobody drives it in the accepting process.
    assert_eq!(queue.depth().await.unwrap().ready, 1);
    let events = accepting.events(&run).await.unwrap();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.payload, Payload::RunClaimed(_)))
    );

    let worker = loom(dir.path(), &queue, 10);
    let working = start_worker(&worker);
    loom_testkit::wait::until("the worker to complete the run", async || {
        status(&accepting, &run.run_id).await == RunStatus::Completed
    })
    .await;
    loom_testkit::wait::until("the job to be acknowledged", async || {
        let depth = queue.depth().await.unwrap();
        depth.ready == 0 && depth.delayed == 0 && depth.dead == 0
    })
    .await;
    worker.stop(Duration::from_secs(5)).await;
    working.await.unwrap();
}

#[tokio::test]
async fn a_dead_worker_leaves_its_job_to_another_which_takes_the_run_over() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Arc::new(MemoryQueue::new(5));
    let accepting = loom(dir.path(), &queue, 1500);
    let run = accepting
        .submit("patient", "Attends.", RunOptions::default())
        .await
        .unwrap();

    // Worker A, on a runtime of its own, dies in the tool (no lease handed back, its delivery
    // dropped unacknowledged, as a killed process's connection would).
    {
        let dir = dir.path().to_owned();
        let queue = queue.clone();
        let run = run.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let a = loom(&dir, &queue, 1500);
                let working = a.clone();
                tokio::spawn(async move { working.work(WorkOptions { jobs: 1 }).await });
                loom_testkit::wait::until("worker A to call the tool", async || {
                    a.events(&run)
                        .await
                        .unwrap()
                        .iter()
                        .any(|e| matches!(e.payload, Payload::ToolCalled(_)))
                })
                .await;
            });
            runtime.shutdown_background();
        })
        .join()
        .unwrap();
    }

    // Worker B gets the job again (a second attempt), finds the run claimed until A's lease
    // ends, and takes it over then.
    let b = loom(dir.path(), &queue, 1500);
    let working = start_worker(&b);
    loom_testkit::wait::until("worker B to complete the run", async || {
        status(&accepting, &run.run_id).await == RunStatus::Completed
    })
    .await;
    let events = b.events(&run).await.unwrap();
    let claims: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::RunClaimed(claim) => Some(claim.worker_id.clone()),
            _ => None,
        })
        .collect();
    assert!(claims.contains(&b.worker_id().to_owned()), "{claims:?}");
    assert_ne!(claims.first().map(String::as_str), Some(b.worker_id()));
    b.stop(Duration::from_secs(5)).await;
    working.await.unwrap();
    assert_eq!(queue.depth().await.unwrap().dead, 0);
}

#[tokio::test]
async fn a_decision_queues_the_resume_of_a_paused_run() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Arc::new(MemoryQueue::new(5));
    let accepting = loom(dir.path(), &queue, 10);
    let worker = loom(dir.path(), &queue, 10);
    let working = start_worker(&worker);
    let run = accepting
        .submit("devis", "Envoie le devis.", RunOptions::default())
        .await
        .unwrap();
    loom_testkit::wait::until("the worker to pause the run", async || {
        status(&accepting, &run.run_id).await == RunStatus::Paused
    })
    .await;
    // Paused: its job is done (acknowledged), nothing waits in the queue.
    loom_testkit::wait::until("the job to be acknowledged", async || {
        queue.depth().await.unwrap().ready == 0
    })
    .await;
    let decided = accepting
        .approve(&run, None, "denis", None, None, false)
        .await
        .unwrap();
    // With a queue the worker drives the run on, and the decision follows it to its end.
    assert_eq!(decided.calls.len(), 1);
    assert_eq!(decided.result.status, RunStatus::Completed);
    assert_eq!(decided.result.text, "Résultat : devis envoyé à Martin");
    worker.stop(Duration::from_secs(5)).await;
    working.await.unwrap();
}

#[tokio::test]
async fn a_run_asked_and_awaited_is_driven_by_a_worker_and_followed_here() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Arc::new(MemoryQueue::new(5));
    let asking = loom(dir.path(), &queue, 10);
    let worker = loom(dir.path(), &queue, 10);
    let working = start_worker(&worker);
    // `run` waits for the worker: completed, and the claim is the worker's.
    let done = asking
        .run("patient", "Attends.", RunOptions::default())
        .await
        .unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    let run = asking.locate(&done.run_id, None, None).await.unwrap();
    let claims: Vec<String> = asking
        .events(&run)
        .await
        .unwrap()
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::RunClaimed(claim) => Some(claim.worker_id.clone()),
            _ => None,
        })
        .collect();
    assert!(!claims.is_empty());
    assert!(claims.iter().all(|w| w == worker.worker_id()), "{claims:?}");
    // A run that pauses: `run` returns it paused, with what waits for a decision.
    let paused = asking
        .run("devis", "Envoie le devis.", RunOptions::default())
        .await
        .unwrap();
    assert_eq!(paused.status, RunStatus::Paused);
    assert_eq!(paused.pending_approvals.len(), 1);
    worker.stop(Duration::from_secs(5)).await;
    working.await.unwrap();
}

#[tokio::test]
async fn a_job_that_keeps_failing_ends_in_the_dead_letter_list() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Arc::new(MemoryQueue::new(2));
    let worker = loom(dir.path(), &queue, 10);
    queue
        .enqueue(&Job::for_run(JobKind::Run, "default", "s-none", "r-none"))
        .await
        .unwrap();
    let working = start_worker(&worker);
    loom_testkit::wait::until("the job to be dead-lettered", async || {
        queue.depth().await.unwrap().dead == 1
    })
    .await;
    let dead = queue.dead(10).await.unwrap();
    assert_eq!(dead[0].attempts, 2);
    assert_eq!(dead[0].job.as_ref().unwrap().run_id, "r-none");
    assert!(dead[0].reason.contains("r-none"), "{}", dead[0].reason);
    worker.stop(Duration::from_secs(5)).await;
    working.await.unwrap();
}

#[tokio::test]
async fn a_worker_without_a_queue_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut raw = LoomConfig::default();
    raw.storage.events.backend = EventsBackend::Memory;
    let plain = Loom::new(Config::new(raw, dir.path().to_path_buf()).unwrap()).unwrap();
    let error = plain
        .work(WorkOptions { jobs: 1 })
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("storage.queue"), "{error}");
}

#[tokio::test]
async fn readiness_names_the_queue_that_does_not_answer() {
    let dir = tempfile::tempdir().unwrap();
    let mut raw = LoomConfig::default();
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("journal".into());
    raw.storage.queue.backend = loom_ia::config::QueueBackend::Rabbitmq;
    raw.storage.queue.url_env = Some("LOOM_TEST_QUEUE_URL_NEVER_SET".into());
    let unready = Loom::new(Config::new(raw, dir.path().to_path_buf()).unwrap()).unwrap();
    let readiness = unready.readiness().await;
    assert!(!readiness.ready);
    let checks: Vec<(&str, bool)> = readiness
        .checks
        .iter()
        .map(|c| (c.name.as_str(), c.ok))
        .collect();
    assert_eq!(checks, [("journal", true), ("queue", false)]);
    // With the queue given, the same instance is ready.
    let queue = Arc::new(MemoryQueue::new(3));
    let ready = loom(dir.path(), &queue, 10).readiness().await;
    assert!(ready.ready, "{ready:?}");
}
