//! `loom serve` on a RabbitMQ queue only accepts: a background run waits as a job (`loom queue
//! --json`) until `loom worker` drives it, a synchronous run is followed while a worker drives
//! it, and the worker stops on SIGTERM with exit code 0;
//! `loom validate` names the queue; `loom worker` without a queue is refused.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};

use common::{
    loom_bin,
    server::{Server, request},
};
use loom_testkit::{services, wait};
use serde_json::Value;

fn config(queue: &str) -> String {
    format!(
        "\
version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
        - text: Bonjour depuis un worker.
agents:
  - name: hello
    description: Says hello.
    main: {{model: fake-1}}
storage:
  events: {{backend: jsonl, path: data}}
  queue: {{backend: rabbitmq, url_env: LOOM_AMQP, name: {queue}}}
telemetry:
  logging: {{level: WARN}}
"
    )
}

/// `loom <args>` in `dir` with the broker's URL.
fn loom(dir: &std::path::Path, url: &str, args: &[&str]) -> std::process::Output {
    Command::new(loom_bin())
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .env("LOOM_AMQP", url)
        .args(["--config", "loom.yaml"])
        .args(args)
        .output()
        .unwrap()
}

fn depth(dir: &std::path::Path, url: &str) -> Value {
    let out = loom(dir, url, &["queue", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    status["depth"].clone()
}

#[test]
fn a_background_run_waits_as_a_job_until_a_worker_drives_it() {
    let Some(url) = services::rabbitmq("a_background_run_waits_as_a_job_until_a_worker_drives_it")
    else {
        return;
    };
    let queue = services::unique("loomcli");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("loom.yaml"), config(&queue)).unwrap();

    let validated = loom(dir.path(), &url, &["validate"]);
    let report = String::from_utf8_lossy(&validated.stdout);
    assert!(
        report.contains(&format!(
            "Queue      : rabbitmq (LOOM_AMQP), queues {queue}.jobs*"
        )),
        "{report}"
    );

    let server = Server::start_with(
        &loom_bin(),
        dir.path(),
        &["--config", "loom.yaml", "serve", "--port", "0"],
        &[("LOOM_AMQP", url.clone().into())],
    );
    let (status, body) = request(
        &server.address,
        "POST",
        "/v1/agents/hello/runs",
        r#"{"message": "Salut", "session_id": "s1", "background": true}"#,
    );
    assert_eq!(status, 202, "{body}");
    let run_id = serde_json::from_str::<Value>(&body).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Accepted, queued, and driven by nobody while no worker runs.
    wait::blocking_until("the job to be on the queue", || {
        depth(dir.path(), &url)["ready"] == 1
    });
    let (status, body) = request(
        &server.address,
        "GET",
        &format!("/v1/runs/{run_id}?session_id=s1"),
        "",
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["status"],
        "ready_for_model"
    );
    let (status, body) = request(&server.address, "GET", "/v1/readyz", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#"{"name":"queue","ok":true}"#), "{body}");

    let worker = Command::new(loom_bin())
        .current_dir(dir.path())
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .env("LOOM_AMQP", &url)
        .args(["--config", "loom.yaml", "worker", "--jobs", "2"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait::blocking_until("the worker to complete the run", || {
        let (_, body) = request(
            &server.address,
            "GET",
            &format!("/v1/runs/{run_id}?session_id=s1"),
            "",
        );
        serde_json::from_str::<Value>(&body).unwrap()["status"] == "completed"
    });
    wait::blocking_until("the job to be acknowledged", || {
        let depth = depth(dir.path(), &url);
        depth["ready"] == 0 && depth["dead"] == 0
    });
    // A synchronous run is a job too: the server follows it to its end and answers.
    let (status, body) = request(
        &server.address,
        "POST",
        "/v1/agents/hello/runs",
        r#"{"message": "Encore", "session_id": "s2"}"#,
    );
    assert_eq!(status, 201, "{body}");
    let result: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(result["status"], "completed", "{body}");
    assert_eq!(result["text"], "Bonjour depuis un worker.");
    let killed = Command::new("kill")
        .args(["-TERM", &worker.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = worker.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{log}");
    assert!(log.contains("2 job(s) at once"), "{log}");
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");

    // The queues of this test go with it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let queues = loom_rabbitmq::RabbitQueue::connect(
            &url,
            loom_rabbitmq::QueueOptions {
                prefix: queue.clone(),
                max_attempts: 5,
            },
        )
        .await
        .unwrap();
        queues.delete_queues().await.unwrap();
    });
}

#[test]
fn a_worker_without_a_queue_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("loom.yaml"),
        "version: 1\nstorage:\n  events: {backend: jsonl, path: data}\n",
    )
    .unwrap();
    let out = common::loom(dir.path(), &["worker"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(error.contains("storage.queue"), "{error}");
}

/// A session past `over_tokens` after a run a worker drove is compacted by a `compaction` job
/// (`compact:<session>`) that a worker runs: the journal gets the `_compaction` run, triggered
/// by that run, and `session.compacted`.
#[test]
fn a_compaction_job_is_run_by_a_worker() {
    let Some(url) = services::rabbitmq("a_compaction_job_is_run_by_a_worker") else {
        return;
    };
    let queue = services::unique("loomcompact");
    let dir = tempfile::tempdir().unwrap();
    let yaml = config(&queue)
        .replace(
            "agents:\n",
            "  - id: summarizer\n    sdk: fake\n    model: SUM\n    params:\n      script:\n        - text: Two greetings, DEV-2041.\nagents:\n",
        )
        + "sessions:\n  compaction: {model: summarizer, over_tokens: 30, keep_last: 1}\n";
    std::fs::write(dir.path().join("loom.yaml"), yaml).unwrap();
    let worker = Command::new(loom_bin())
        .current_dir(dir.path())
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .env("LOOM_AMQP", &url)
        .args(["--config", "loom.yaml", "worker", "--jobs", "2"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for (message, run_id) in [("Devis DEV-2041, bonjour.", "w1"), ("Encore.", "w2")] {
        let out = loom(
            dir.path(),
            &url,
            &[
                "run",
                "hello",
                message,
                "--session",
                "c",
                "--run-id",
                run_id,
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
    let path = dir.path().join("data/default/c.jsonl");
    let events = || -> Vec<Value> {
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    wait::blocking_until("the worker to compact the session", || {
        events().iter().any(|e| e["type"] == "session.compacted")
    });
    let events = events();
    let started = events
        .iter()
        .find(|e| e["type"] == "run.started" && e["payload"]["kind"] == "compaction")
        .unwrap();
    assert_eq!(started["payload"]["triggered_by"], "w2");
    assert_eq!(started["agent"], "_compaction");
    wait::blocking_until("the jobs to be acknowledged", || {
        let depth = depth(dir.path(), &url);
        depth["ready"] == 0 && depth["dead"] == 0
    });
    let killed = Command::new("kill")
        .args(["-TERM", &worker.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = worker.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The queues of this test go with it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let queues = loom_rabbitmq::RabbitQueue::connect(
            &url,
            loom_rabbitmq::QueueOptions {
                prefix: queue.clone(),
                max_attempts: 5,
            },
        )
        .await
        .unwrap();
        queues.delete_queues().await.unwrap();
    });
}
