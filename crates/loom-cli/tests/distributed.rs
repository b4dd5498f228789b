//! Distributed chaos, the CI size: background runs of the `chaos` example (its irreversible,
//! idempotent tool appends one line per idempotency key to `CHAOS_FILE`) accepted by one
//! `serve` that only publishes them to RabbitMQ, driven by three `worker`s on one PostgreSQL
//! journal (`examples/chaos/fleet.yaml`), while a worker picked at random is killed with SIGKILL
//! and started again, over and over. Every run must complete, with its tool's line written
//! exactly once: a killed worker's job is delivered again, its run's lease runs out, another
//! worker resumes the run from the journal, and the call already made is not made twice.
//!
//! Kills wait for progress (one more run closed since the last kill), never for a duration: a
//! slow machine changes where they land, not whether the test can pass.
//!
//! Needs PostgreSQL and RabbitMQ (`LOOM_TEST_POSTGRES`, `LOOM_TEST_RABBITMQ`): skipped without
//! them, failed under `LOOM_REQUIRE_SERVICES=1`. `bench/distributed-chaos.sh` is the long
//! version (500 runs and more).

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{
    server::{Server, request},
    *,
};
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use loom_testkit::{postgres::TestDb, services, wait};
use serde_json::Value;

/// Runs submitted.
const RUNS: usize = 40;
/// Workers driving them.
const WORKERS: usize = 3;
/// Kills, each after one more run closed.
const KILLS: usize = 10;

/// A small deterministic generator (xorshift) picking the victims; its seed is printed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

/// The worker processes, killed when the test ends however it ends.
struct Workers {
    dir: PathBuf,
    env: Vec<(&'static str, PathBuf)>,
    children: Vec<Child>,
}

impl Workers {
    fn spawn(&self, index: usize) -> Child {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("worker-{index}.log")))
            .unwrap();
        Command::new(example_bin("chaos"))
            .current_dir(&self.dir)
            .env_remove("LOOM_PROFILE")
            .env_remove("LOOM_LOG")
            .envs(self.env.iter().map(|(k, v)| (*k, v)))
            .args([
                "--config",
                "loom.yaml",
                "--no-env-file",
                "worker",
                "--jobs",
                "4",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    /// SIGKILL to worker `index`, then a new one in its place.
    fn kill_and_restart(&mut self, index: usize) {
        let child = &mut self.children[index];
        child.kill().unwrap();
        child.wait().unwrap();
        self.children[index] = self.spawn(index);
    }

    /// What the workers wrote on stderr.
    fn logs(&self) -> String {
        (0..self.children.len())
            .map(|i| {
                let log = fs::read_to_string(self.dir.join(format!("worker-{i}.log")));
                format!("--- worker {i}\n{}", log.unwrap_or_default())
            })
            .collect()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A copy of examples/chaos whose `loom.yaml` is `fleet.yaml`, on the test's database role and
/// with queues of its own.
fn fleet_project(role: &str, queue: &str) -> tempfile::TempDir {
    let dir = copy_example("chaos");
    let fleet = fs::read_to_string(repo().join("examples/chaos/fleet.yaml")).unwrap();
    let (pg, mq) = ("dsn_env: LOOM_FLEET_PG,", "name: loom-fleet,");
    assert!(
        fleet.contains(pg) && fleet.contains(mq),
        "examples/chaos/fleet.yaml changed"
    );
    let yaml = fleet
        .replace(pg, &format!("{pg} role: {role},"))
        .replace(mq, &format!("name: {queue},"));
    fs::write(dir.path().join("loom.yaml"), yaml).unwrap();
    dir
}

/// The status of every run `GET /v1/runs` lists.
fn statuses(address: &str) -> BTreeMap<String, String> {
    let (status, body) = request(address, "GET", "/v1/runs?limit=200&sessions=200", "");
    assert_eq!(status, 200, "{body}");
    let page: Value = serde_json::from_str(&body).unwrap();
    page["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| {
            let id = run["run_id"].as_str().unwrap().to_owned();
            (id, run["status"].as_str().unwrap().to_owned())
        })
        .collect()
}

fn closed(statuses: &BTreeMap<String, String>) -> usize {
    statuses
        .values()
        .filter(|s| matches!(s.as_str(), "completed" | "failed" | "cancelled"))
        .count()
}

/// The lines of `CHAOS_FILE` by idempotency key.
fn effects(file: &Path) -> BTreeMap<String, usize> {
    let mut keys = BTreeMap::new();
    for line in fs::read_to_string(file).unwrap_or_default().lines() {
        let key = line.split(' ').next().unwrap_or_default().to_owned();
        *keys.entry(key).or_insert(0) += 1;
    }
    keys
}

#[test]
fn killed_workers_lose_no_run_and_repeat_no_effect() {
    let test = "distributed::killed_workers_lose_no_run_and_repeat_no_effect";
    let Some(amqp) = services::rabbitmq(test) else {
        return;
    };
    let Some(db) = TestDb::create(test) else {
        return;
    };
    let queue = services::unique("loom_dist");
    let dir = fleet_project(db.role(), &queue);
    // The queues of this test go with it, passed or failed (quorum queues left on a shared
    // broker weigh on every later test).
    let _queues = QueuesGone {
        url: amqp.clone(),
        prefix: queue.clone(),
    };
    let file = dir.path().join("effects.txt");
    let env = vec![
        ("LOOM_FLEET_PG", PathBuf::from(db.url())),
        ("LOOM_FLEET_AMQP", PathBuf::from(amqp)),
        ("CHAOS_FILE", file.clone()),
    ];
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    eprintln!("distributed: {RUNS} runs, {WORKERS} workers, {KILLS} kills, seed {seed}");
    let mut rng = Rng(seed);

    let server = Server::start_with(
        &example_bin("chaos"),
        dir.path(),
        &[
            "--config",
            "loom.yaml",
            "--no-env-file",
            "serve",
            "--port",
            "0",
        ],
        &env,
    );
    let mut workers = Workers {
        dir: dir.path().to_owned(),
        env,
        children: Vec::new(),
    };
    for index in 0..WORKERS {
        let child = workers.spawn(index);
        workers.children.push(child);
    }

    let submitted: Vec<String> = (0..RUNS).map(|i| format!("dist-{i}")).collect();
    for run in &submitted {
        let body = format!(r#"{{"message": "go", "background": true, "run_id": "{run}"}}"#);
        let (status, answer) = request(&server.address, "POST", "/v1/agents/chaos/runs", &body);
        assert_eq!(status, 202, "{run}: {answer}");
    }

    let mut seen = 0;
    for kill in 0..KILLS {
        // One more run closed since the last kill: the workers are at work.
        seen = wait::blocking_until(format!("progress before kill {kill}"), || {
            let now = closed(&statuses(&server.address));
            if now > seen || now == RUNS {
                Ok(now)
            } else {
                Err(format!("{now} of {RUNS} closed\n{}", workers.logs()))
            }
        });
        workers.kill_and_restart(rng.below(WORKERS));
    }
    let last = wait::blocking_until("every run closed", || {
        let runs = statuses(&server.address);
        if closed(&runs) == RUNS {
            Ok(runs)
        } else {
            Err(format!(
                "{} of {RUNS} closed: {runs:?}\n{}",
                closed(&runs),
                workers.logs()
            ))
        }
    });

    // No run lost, every one completed.
    for run in &submitted {
        assert_eq!(
            last.get(run).map(String::as_str),
            Some("completed"),
            "{run} (seed {seed})\n{}",
            workers.logs()
        );
    }
    // Every effect made, none twice.
    let effects = effects(&file);
    let repeated: Vec<_> = effects.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "effects made twice: {repeated:?} (seed {seed})"
    );
    assert_eq!(
        effects.len(),
        RUNS,
        "one line per run: {effects:?} (seed {seed})"
    );
    eprintln!(
        "distributed: {RUNS} runs completed, {KILLS} kills, 0 duplicates, 0 lost (seed {seed})"
    );
    drop(workers);
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
}

/// Deletes the queues of a prefix when dropped.
struct QueuesGone {
    url: String,
    prefix: String,
}

impl Drop for QueuesGone {
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async {
            let options = loom_rabbitmq::QueueOptions {
                prefix: self.prefix.clone(),
                max_attempts: 50,
            };
            if let Ok(queues) = loom_rabbitmq::RabbitQueue::connect(&self.url, options).await {
                let _ = queues.delete_queues().await;
            }
        });
    }
}
