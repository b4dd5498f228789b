//! Two instances on one PostgreSQL journal, as two processes of one service, hearing each
//! other through the event bus (`storage.bus`), on Redis (a channel of the test's own) and on
//! PostgreSQL (`LISTEN/NOTIFY` on the test's database): a follower on B gets the events of a
//! run A drives with its fallback period set to an hour, so without the bus it would wait and
//! the test would fail by timeout; and `cancel` on B of a run A drives closes it as cancelled,
//! by A's drive, with `by`.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures_util::StreamExt;
use loom_ia::{
    FollowOptions, Loom, RunOptions, RunRef, RunStatus,
    config::{
        AgentSpec, BusBackend, Config, EventsBackend, LoomConfig, MigrateMode, ModelSpec, Sdk,
        ToolRef,
    },
    core::{
        event::Payload,
        tool::{FnTool, ToolDeclarations, ToolKind, ToolOutput, ToolSpec},
    },
};
use loom_testkit::{postgres::TestDb, services, wait::PATIENCE};
use serde_json::json;
use tokio::sync::Semaphore;

/// Which bus the two instances share.
#[derive(Clone, Copy)]
enum Backend {
    Redis,
    Postgres,
}

/// A journal and bus shared by two instances, removed at the end.
struct Shared {
    _db: TestDb,
    dir: tempfile::TempDir,
    /// The Redis URL and the test's channel, for the Redis bus.
    redis: Option<(String, String)>,
}

/// The test's database and, for Redis, its server and a channel of its own; `None` when the
/// test is skipped.
fn shared(test: &str, backend: Backend) -> Option<Shared> {
    let redis = match backend {
        Backend::Redis => Some((services::redis(test)?, services::unique("loom:test:events"))),
        Backend::Postgres => None,
    };
    let db = TestDb::create(test)?;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bus.env"),
        format!("BUS_DSN={}\n", db.url()),
    )
    .unwrap();
    let shared = Shared {
        _db: db,
        dir,
        redis,
    };
    Some(shared)
}

/// One agent calling `gate` once: the tool answers when the test lets it.
fn config(dir: &Path, role: &str, backend: Backend) -> Config {
    let mut model = ModelSpec::new("fake-1", Sdk::Fake, "FAKE");
    model.params.insert(
        "script".into(),
        json!([
            {"text": "J'attends.", "tool_calls": [{"name": "gate", "arguments": {}}]},
            {"text": "Fini : {{ tool_result }}."}
        ]),
    );
    let mut agent = AgentSpec::new("patient", "fake-1");
    agent.tools = vec![ToolRef::new("gate")];
    let mut raw = LoomConfig {
        models: vec![model],
        agents: vec![agent],
        ..LoomConfig::default()
    };
    raw.env_file = Some("bus.env".into());
    raw.storage.events.backend = EventsBackend::Postgres;
    raw.storage.events.dsn_env = Some("BUS_DSN".into());
    raw.storage.events.role = role.to_owned();
    raw.storage.migrate = MigrateMode::Auto;
    // A cancellation that does not reach the driver would wait this long for it.
    raw.execution.shutdown_timeout = 3600.0;
    raw.storage.bus.backend = match backend {
        Backend::Postgres => BusBackend::Postgres,
        // The bus is given (on the test's channel) by `instance`.
        Backend::Redis => BusBackend::Memory,
    };
    Config::new(raw, dir.to_path_buf()).unwrap()
}

/// Sets its flag when dropped: the tool call it sits in was given up.
struct Dropped(Arc<AtomicBool>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A tool that answers once the test adds a permit to `gate`; `dropped` is set when a call is
/// given up before.
fn gate_tool(gate: Arc<Semaphore>, dropped: Arc<AtomicBool>) -> FnTool {
    let spec = ToolSpec {
        name: "gate".into(),
        description: "Waits for the test.".into(),
        input_schema: json!({"type": "object"}),
        kind: ToolKind::Python,
        declarations: ToolDeclarations::default(),
    };
    FnTool::new(spec, move |_, _| {
        let gate = gate.clone();
        let guard = Dropped(dropped.clone());
        Box::pin(async move {
            let _permit = gate.acquire().await;
            std::mem::forget(guard);
            Ok(ToolOutput::text("ouvert"))
        })
    })
}

/// One instance (a process) on the shared journal and bus, with the gate tool.
async fn instance(
    shared: &Shared,
    role: &str,
    backend: Backend,
    gate: Arc<Semaphore>,
    dropped: Arc<AtomicBool>,
) -> Loom {
    let config = config(shared.dir.path(), role, backend);
    let loom = match &shared.redis {
        Some((url, channel)) => {
            let bus = loom_redis::RedisBus::new(url)
                .unwrap()
                .with_channel(channel.clone())
                .unwrap();
            Loom::open_with_bus(config, Arc::new(bus)).await.unwrap()
        }
        None => Loom::open(config).await.unwrap(),
    };
    loom.register("gate", gate_tool(gate, dropped)).unwrap();
    loom
}

/// Opens the run on A, in the background, and waits until its tool runs.
async fn run_waiting_in_its_tool(a: &Loom) -> RunRef {
    let run = a
        .submit("patient", "Attends.", RunOptions::default())
        .await
        .unwrap();
    loom_testkit::wait::until("the run to call its tool", async || {
        a.events(&run)
            .await
            .unwrap()
            .iter()
            .any(|e| matches!(e.payload, Payload::ToolCalled(_)))
    })
    .await;
    run
}

async fn a_follower_hears_the_other_instance(test: &str, backend: Backend) {
    let Some(shared) = shared(test, backend) else {
        return;
    };
    let role = shared._db.role().to_owned();
    let gate = Arc::new(Semaphore::new(0));
    let unused = Arc::new(AtomicBool::new(false));
    let a = instance(&shared, &role, backend, gate.clone(), unused.clone()).await;
    let b = instance(&shared, &role, backend, Arc::new(Semaphore::new(0)), unused).await;
    let run = run_waiting_in_its_tool(&a).await;
    let options = FollowOptions {
        fallback: Duration::from_secs(3600),
        ..FollowOptions::default()
    };
    let mut followed = b.follow_with(&run, options);
    let mut seen = Vec::new();
    let collected = tokio::time::timeout(PATIENCE, async {
        while let Some(event) = followed.next().await {
            let event = event.unwrap();
            if matches!(event.payload, Payload::ToolCalled(_)) {
                // B has read what was written before; the rest it hears of through the bus.
                gate.add_permits(1);
            }
            seen.push(event);
        }
    })
    .await;
    let types: Vec<&str> = seen.iter().map(|e| e.event_type.as_str()).collect();
    assert!(
        collected.is_ok(),
        "the follower on B missed A's writes (no notice within {} s): {types:?}",
        PATIENCE.as_secs()
    );
    assert_eq!(types.last(), Some(&"run.completed"), "{types:?}");
    assert_eq!(seen, a.events(&run).await.unwrap(), "every event, in order");
}

async fn a_cancel_on_one_instance_stops_the_other_s_drive(test: &str, backend: Backend) {
    let Some(shared) = shared(test, backend) else {
        return;
    };
    let role = shared._db.role().to_owned();
    let dropped = Arc::new(AtomicBool::new(false));
    let never = Arc::new(Semaphore::new(0));
    let a = instance(&shared, &role, backend, never.clone(), dropped.clone()).await;
    let b = instance(
        &shared,
        &role,
        backend,
        never,
        Arc::new(AtomicBool::new(false)),
    )
    .await;
    let run = run_waiting_in_its_tool(&a).await;
    // Without the bus, B would wait its (hour-long) shutdown timeout for A to close the run.
    let cancelled = tokio::time::timeout(PATIENCE, b.cancel(&run, Some("ops@acme".into())))
        .await
        .expect("the driver closed the run")
        .unwrap();
    assert!(cancelled, "the run closed as cancelled");
    let state = b.state(&run).await.unwrap();
    assert_eq!(state.status, RunStatus::Cancelled);
    let events = b.events(&run).await.unwrap();
    let closing = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::RunCancelled(c) => Some(c.clone()),
            _ => None,
        })
        .expect("a run.cancelled");
    assert_eq!(closing.by.as_deref(), Some("ops@acme"));
    // A's drive gave its tool call up: a cancellation written behind its back would leave
    // the call waiting for its gate, which never opens.
    loom_testkit::wait::until("A's drive to give its tool call up", async || {
        dropped.load(Ordering::SeqCst)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_bus_a_follower_hears_the_other_instance() {
    a_follower_hears_the_other_instance(
        "redis_bus_a_follower_hears_the_other_instance",
        Backend::Redis,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_bus_a_follower_hears_the_other_instance() {
    a_follower_hears_the_other_instance(
        "postgres_bus_a_follower_hears_the_other_instance",
        Backend::Postgres,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_bus_a_cancel_reaches_the_driver() {
    a_cancel_on_one_instance_stops_the_other_s_drive(
        "redis_bus_a_cancel_reaches_the_driver",
        Backend::Redis,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_bus_a_cancel_reaches_the_driver() {
    a_cancel_on_one_instance_stops_the_other_s_drive(
        "postgres_bus_a_cancel_reaches_the_driver",
        Backend::Postgres,
    )
    .await;
}
