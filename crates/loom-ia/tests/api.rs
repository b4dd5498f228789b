//! The Rust API of the facade: a configuration built in Rust, tools registered in code, and
//! run, stream, events, state, result, cancel, resume.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures_util::StreamExt;
use loom_ia::{
    Loom, LoomError, RunOptions, RunStatus, StreamItem, ToolContext,
    config::{AgentSpec, Config, EventsBackend, LoomConfig, ModelSpec, Sdk, ToolRef},
    core::event::Payload,
};
use serde_json::json;

/// Adds two numbers (arithmetic is done by tools, never by the model).
#[loom_ia::tool]
fn add(a: f64, b: f64) -> String {
    format!("{}", a + b)
}

/// Waits the given number of milliseconds, then says so.
#[loom_ia::tool]
async fn wait(ms: u64, ctx: ToolContext) -> String {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    format!("waited in {}", ctx.call_id)
}

fn config(dir: &std::path::Path, script: serde_json::Value, backend: EventsBackend) -> Config {
    let mut model = ModelSpec::new("fake-1", Sdk::Fake, "FAKE");
    model.params.insert("script".into(), script);
    let mut agent = AgentSpec::new("calc", "fake-1");
    agent.main.system = "Tu calcules avec les outils.".into();
    agent.tools = vec![ToolRef::new("add"), ToolRef::new("wait")];
    let mut raw = LoomConfig {
        models: vec![model],
        agents: vec![agent],
        ..LoomConfig::default()
    };
    raw.storage.events.backend = backend;
    raw.storage.events.path = Some("journal".into());
    Config::new(raw, dir.to_path_buf()).unwrap()
}

fn loom(dir: &std::path::Path, script: serde_json::Value, backend: EventsBackend) -> Loom {
    let loom = Loom::new(config(dir, script, backend)).unwrap();
    loom.register("add", add_tool()).unwrap();
    loom.register("wait", wait_tool()).unwrap();
    loom
}

fn add_script() -> serde_json::Value {
    json!([
        {"text": "Je calcule.", "tool_calls": [{"name": "add", "arguments": {"a": 12, "b": 30}}]},
        {"text": "Résultat : {{ tool_result }}."}
    ])
}

/// The run `run_id` once it is journaled and has called a tool (a run started in a task of
/// its own, whose ref the test does not have yet).
async fn located_in_a_tool(loom: &Loom, run_id: &str) -> loom_ia::RunRef {
    let run = loom_testkit::wait::until(format!("run {run_id} to be journaled"), async || {
        loom.locate(run_id, None, None).await
    })
    .await;
    tool_called(loom, &run).await;
    run
}

/// Waits until `run` has called a tool (its `tool.called` is journaled).
async fn tool_called(loom: &Loom, run: &loom_ia::RunRef) {
    loom_testkit::wait::until(format!("run {} to call a tool", run.run_id), async || {
        loom.events(run)
            .await
            .unwrap()
            .iter()
            .any(|e| matches!(e.payload, Payload::ToolCalled(_)))
    })
    .await;
}

/// Waits until `run` is closed; its result.
async fn terminal(loom: &Loom, run: &loom_ia::RunRef) -> loom_ia::RunResult {
    loom_testkit::wait::until(format!("run {} to close", run.run_id), async || {
        let result = loom.result(run).await.unwrap();
        if result.status.is_terminal() {
            Ok(result)
        } else {
            Err(format!("status {:?}", result.status))
        }
    })
    .await
}

#[tokio::test]
async fn run_then_read_the_journal_back() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path(), add_script(), EventsBackend::Jsonl);
    let result = loom
        .run("calc", "12 + 30 ?", RunOptions::default())
        .await
        .unwrap();
    assert!(result.ok());
    assert_eq!(result.text, "Résultat : 42.");
    assert_eq!(result.iterations, 2);
    assert_eq!(result.session_id, result.run_id);
    assert!(
        dir.path()
            .join("journal/default")
            .join(format!("{}.jsonl", result.run_id))
            .exists()
    );

    let run = loom.locate(&result.run_id, None, None).await.unwrap();
    let events = loom.events(&run).await.unwrap();
    assert_eq!(events.len(), 17);
    let state = loom.state(&run).await.unwrap();
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(loom.result(&run).await.unwrap(), result);
    // A second Loom over the same files (another process) reads the same run.
    let other = loom_ia::Loom::new(config(dir.path(), add_script(), EventsBackend::Jsonl)).unwrap();
    assert_eq!(other.result(&run).await.unwrap().text, "Résultat : 42.");
    // Cancelling a closed run does nothing.
    assert!(!loom.cancel(&run, None).await.unwrap());
    // Resuming a closed run returns it as it is.
    assert_eq!(loom.resume(&run).await.unwrap(), result);
}

#[tokio::test]
async fn stream_interleaves_text_deltas_and_events() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path(), add_script(), EventsBackend::Memory);
    let items: Vec<StreamItem> = loom
        .stream("calc", "12 + 30 ?", RunOptions::default())
        .map(|item| item.unwrap())
        .collect()
        .await;
    let mut text = String::new();
    let mut types = Vec::new();
    for item in &items {
        match item {
            StreamItem::TextDelta { text: delta, .. } => text.push_str(delta),
            StreamItem::Event(event) => types.push(event.event_type.clone()),
            StreamItem::Finished(result) => assert_eq!(result.text, "Résultat : 42."),
        }
    }
    assert!(matches!(items.last(), Some(StreamItem::Finished(_))));
    assert_eq!(text, "Je calcule.Résultat : 42.");
    assert_eq!(types.len(), 17);
    assert_eq!(types[0], "run.started");
    // Deltas arrive before the model.responded event that journals them.
    let first_delta = items
        .iter()
        .position(|i| matches!(i, StreamItem::TextDelta { .. }))
        .unwrap();
    let first_answer = items
        .iter()
        .position(|i| matches!(i, StreamItem::Event(e) if e.event_type == "model.responded"))
        .unwrap();
    assert!(first_delta < first_answer);
}

#[tokio::test]
async fn cancel_reaches_a_running_run() {
    let dir = tempfile::tempdir().unwrap();
    let script =
        json!([{"tool_calls": [{"name": "wait", "arguments": {"ms": 10000}}]}, {"text": "fini"}]);
    let loom = loom(dir.path(), script, EventsBackend::Memory);
    let options = RunOptions {
        run_id: Some("long-1".into()),
        ..RunOptions::default()
    };
    let running = {
        let loom = loom.clone();
        tokio::spawn(async move { loom.run("calc", "attends", options).await })
    };
    // Wait until the tool is running, then cancel.
    let run = located_in_a_tool(&loom, "long-1").await;
    assert!(loom.cancel(&run, Some("alice".into())).await.unwrap());
    let result = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(result.status, RunStatus::Cancelled);
    let last = loom.events(&run).await.unwrap().pop().unwrap();
    let Payload::RunCancelled(cancelled) = &last.payload else {
        panic!("{last:?}")
    };
    assert_eq!(cancelled.by.as_deref(), Some("alice"));
}

/// A background run (`submit`, as `POST /runs` with `background`) cancelled while its tool
/// runs: the pilot of this process closes it, and its `run.cancelled` names who cancelled.
#[tokio::test]
async fn cancelling_a_background_run_records_who_cancelled_it() {
    let dir = tempfile::tempdir().unwrap();
    let script =
        json!([{"tool_calls": [{"name": "wait", "arguments": {"ms": 10000}}]}, {"text": "fini"}]);
    let loom = loom(dir.path(), script, EventsBackend::Jsonl);
    let run = loom
        .submit("calc", "attends", RunOptions::default())
        .await
        .unwrap();
    tool_called(&loom, &run).await;
    assert!(loom.cancel(&run, Some("alice".into())).await.unwrap());
    // `true` means journaled: the run's last event is already its `run.cancelled`.
    let events = loom.events(&run).await.unwrap();
    let Some(Payload::RunCancelled(cancelled)) = events.last().map(|e| e.payload.clone()) else {
        panic!("not closed when cancel returned: {:?}", events.last());
    };
    assert_eq!(
        (cancelled.reason.as_str(), cancelled.by.as_deref()),
        ("requested", Some("alice"))
    );
    assert_eq!(
        loom.result(&run).await.unwrap().status,
        RunStatus::Cancelled
    );
}

/// A caller that gives up a run it drives (its future dropped mid-tool, as a client that
/// disconnects) leaves the run driven nowhere: it is cancelled at once, not waited on.
#[tokio::test]
async fn a_dropped_drive_leaves_the_run_to_others() {
    let dir = tempfile::tempdir().unwrap();
    let script =
        json!([{"tool_calls": [{"name": "wait", "arguments": {"ms": 10000}}]}, {"text": "fini"}]);
    let loom = loom(dir.path(), script, EventsBackend::Jsonl);
    let driving = {
        let loom = loom.clone();
        tokio::spawn(async move {
            let options = RunOptions {
                run_id: Some("r-dropped".into()),
                ..RunOptions::default()
            };
            loom.run("calc", "attends", options).await
        })
    };
    let run = located_in_a_tool(&loom, "r-dropped").await;
    driving.abort();
    assert!(driving.await.unwrap_err().is_cancelled());
    let cancelled = tokio::time::timeout(
        Duration::from_secs(5),
        loom.cancel(&run, Some("alice".into())),
    )
    .await
    .expect("the run was still taken for driven")
    .unwrap();
    assert!(cancelled);
    let events = loom.events(&run).await.unwrap();
    let Some(Payload::RunCancelled(closing)) = events.last().map(|e| e.payload.clone()) else {
        panic!("not closed: {:?}", events.last());
    };
    assert_eq!(closing.by.as_deref(), Some("alice"));
}

/// Runs are told apart by tenant, session and id: cancelling a closed run `x` of one tenant
/// leaves alone the run `x` of another tenant that this instance drives.
#[tokio::test]
async fn cancelling_a_run_never_reaches_a_run_of_the_same_id_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let script = json!([
        {"with_text": "vite", "tool_calls": [{"name": "wait", "arguments": {"ms": 1}}]},
        {"with_text": "long", "tool_calls": [{"name": "wait", "arguments": {"ms": 400}}]},
        {"text": "fini"}
    ]);
    let mut raw = config(dir.path(), script, EventsBackend::Jsonl)
        .raw()
        .clone();
    raw.tenants = serde_json::from_value(json!([{"id": "acme"}, {"id": "globex"}])).unwrap();
    let loom = Loom::new(Config::new(raw, dir.path().to_path_buf()).unwrap()).unwrap();
    loom.register("add", add_tool()).unwrap();
    loom.register("wait", wait_tool()).unwrap();
    let options = |tenant: &str| RunOptions {
        run_id: Some("x".into()),
        tenant_id: Some(tenant.into()),
        ..RunOptions::default()
    };
    let closed = loom.run("calc", "vite", options("globex")).await.unwrap();
    assert_eq!(closed.status, RunStatus::Completed);
    let driven = loom.submit("calc", "long", options("acme")).await.unwrap();
    tool_called(&loom, &driven).await;
    let other = loom.locate("x", None, Some("globex")).await.unwrap();
    assert!(!loom.cancel(&other, Some("bob".into())).await.unwrap());
    let finished = terminal(&loom, &driven).await;
    assert_eq!(finished.status, RunStatus::Completed, "{finished:?}");
}

#[tokio::test]
async fn registration_and_unknown_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path(), add_script(), EventsBackend::Memory);
    assert!(matches!(
        loom.register("add", add_tool()),
        Err(LoomError::Registration(_))
    ));
    assert!(matches!(
        loom.register("plus", add_tool()),
        Err(LoomError::Registration(_))
    ));
    let err = loom
        .run("nope", "x", RunOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "unknown agent 'nope' (agents: calc)");
    assert!(err.is_refusal());
    let err = loom.locate("missing", None, None).await.unwrap_err();
    assert!(matches!(err, LoomError::UnknownRun(_)));
    let bad = RunOptions {
        session_id: Some("../etc".into()),
        ..RunOptions::default()
    };
    assert!(matches!(
        loom.run("calc", "x", bad).await,
        Err(LoomError::Invalid(_))
    ));
}

#[tokio::test]
async fn an_agent_naming_an_unregistered_tool_is_refused_at_its_location() {
    let dir = tempfile::tempdir().unwrap();
    let loom = Loom::new(config(dir.path(), add_script(), EventsBackend::Memory)).unwrap();
    loom.register("add", add_tool()).unwrap();
    let err = loom.validate().await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "loom.yaml agents[0].tools[1].tool: unknown tool 'wait' (registered tools: add)"
    );
    loom.register("wait", wait_tool()).unwrap();
    let validation = loom.validate().await.unwrap();
    assert_eq!(validation.agents[0].tools.len(), 2);
}

#[tokio::test]
async fn cancel_all_stops_running_runs_and_a_run_is_driven_once() {
    let dir = tempfile::tempdir().unwrap();
    let script =
        json!([{"tool_calls": [{"name": "wait", "arguments": {"ms": 10000}}]}, {"text": "fini"}]);
    let loom = loom(dir.path(), script, EventsBackend::Memory);
    let options = RunOptions {
        run_id: Some("long-2".into()),
        ..RunOptions::default()
    };
    let running = {
        let loom = loom.clone();
        tokio::spawn(async move { loom.run("calc", "attends", options).await })
    };
    let run = located_in_a_tool(&loom, "long-2").await;
    // The same process does not drive a run twice.
    assert!(matches!(
        loom.resume(&run).await,
        Err(LoomError::Conflict(_))
    ));
    loom.cancel_all();
    let result = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(result.status, RunStatus::Cancelled);
}

#[tokio::test]
async fn submit_returns_at_once_and_steering_joins_before_the_next_model_call() {
    let dir = tempfile::tempdir().unwrap();
    let script = json!([
        {"text": "J'attends.", "tool_calls": [{"name": "wait", "arguments": {"ms": 300}}], "without_text": "urgent"},
        {"text": "Compris : {{ tool_result }}", "with_text": "urgent"}
    ]);
    let loom = loom(dir.path(), script, EventsBackend::Jsonl);
    let run = loom
        .submit(
            "calc",
            "attends",
            RunOptions {
                run_id: Some("sub-1".into()),
                ..RunOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(run.run_id, "sub-1");
    // Journaled before submit returned.
    assert!(!loom.events(&run).await.unwrap().is_empty());
    // Steer while the tool runs: the message waits for the tool's result.
    tool_called(&loom, &run).await;
    loom.steer(&run, "C'est urgent, réponds.").await.unwrap();
    let result = terminal(&loom, &run).await;
    assert_eq!(result.status, RunStatus::Completed);
    assert!(result.text.starts_with("Compris : "), "{}", result.text);
    // The conversation kept the call and its result together, the steering message after.
    let state = loom.state(&run).await.unwrap();
    let roles: Vec<_> = state.messages.iter().map(|m| m.role).collect();
    use loom_ia::core::Role;
    assert_eq!(
        roles,
        [
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::User,
            Role::Assistant
        ]
    );
    assert_eq!(state.messages[3].text(), "C'est urgent, réponds.");
}

#[tokio::test]
async fn recover_drives_runs_left_unfinished() {
    let dir = tempfile::tempdir().unwrap();
    let first = loom(dir.path(), add_script(), EventsBackend::Jsonl);
    let done = first
        .run(
            "calc",
            "12 + 30 ?",
            RunOptions {
                run_id: Some("rec-1".into()),
                ..RunOptions::default()
            },
        )
        .await
        .unwrap();
    assert!(done.ok());
    // Leave the run as a crash after its first model answer would have (no lease left).
    let path = dir.path().join("journal/default/rec-1.jsonl");
    let kept: Vec<String> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .take(6)
        .map(|l| {
            let mut event: serde_json::Value = serde_json::from_str(l).unwrap();
            if event["type"] == "run.claimed" {
                // The crashed worker's lease has run out.
                event["payload"]["lease_until"] = event["ts"].clone();
            }
            event.to_string()
        })
        .collect();
    std::fs::write(&path, kept.join("\n") + "\n").unwrap();
    // A new process starts and recovers.
    let second = loom(dir.path(), add_script(), EventsBackend::Jsonl);
    let requeued = second.recover(None).await.unwrap();
    assert_eq!(
        requeued
            .iter()
            .map(|r| r.run_id.as_str())
            .collect::<Vec<_>>(),
        ["rec-1"]
    );
    let run = requeued[0].clone();
    let result = terminal(&second, &run).await;
    assert_eq!(result.text, "Résultat : 42.");
    // Nothing left to recover.
    assert!(second.recover(None).await.unwrap().is_empty());
}

/// A 1×1 PNG.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0xf0,
    0x1f, 0x00, 0x05, 0x00, 0x01, 0xff, 0x89, 0x99, 0x3d, 0x1d, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
    0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

#[tokio::test]
async fn attachments_are_read_stored_beside_the_journal_and_erased_with_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path(), json!([{"text": "Vu."}]), EventsBackend::Jsonl);
    // The content says PNG, whatever the extension says.
    fs_write(dir.path(), "voiture.jpg", PNG);
    let attachment = loom
        .read_attachment(&dir.path().join("voiture.jpg"))
        .unwrap();
    assert_eq!(attachment.name, "voiture.jpg");
    assert_eq!(attachment.media_type, "image/png");
    assert_eq!(attachment.bytes, PNG);

    let result = loom
        .run(
            "calc",
            "Et ça ?",
            RunOptions {
                session_id: Some("s1".into()),
                attachments: vec![attachment],
                ..RunOptions::default()
            },
        )
        .await
        .unwrap();
    assert!(result.ok());
    let run = loom.locate(&result.run_id, Some("s1"), None).await.unwrap();
    let events = loom.events(&run).await.unwrap();
    let Payload::ArtifactStored(stored) = &events[1].payload else {
        panic!("artifact.stored follows run.started")
    };
    assert_eq!(stored.origin, "attachment");
    // The artifact is read back for its own tenant only.
    assert_eq!(
        loom.artifact("default", &stored.uri)
            .await
            .unwrap()
            .as_deref(),
        Some(PNG)
    );
    assert_eq!(loom.artifact("acme", &stored.uri).await.unwrap(), None);
    assert_eq!(loom.artifact("def", &stored.uri).await.unwrap(), None);
    assert_eq!(loom.artifact("default", "loom://x").await.unwrap(), None);
    let folder = dir.path().join("journal/.artifacts/default/s1");
    assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 1);

    loom.delete_session("s1", None).await.unwrap();
    assert!(
        !folder.exists() || std::fs::read_dir(&folder).unwrap().count() == 0,
        "the attachment is erased with the session"
    );

    // Unknown content with an unknown extension is refused, naming the file.
    fs_write(dir.path(), "notes.xyz", b"plain words");
    let Err(LoomError::Invalid(message)) = loom.read_attachment(&dir.path().join("notes.xyz"))
    else {
        panic!("refused")
    };
    assert!(
        message.starts_with("attachment 'notes.xyz': unsupported type"),
        "{message}"
    );
}

fn fs_write(dir: &std::path::Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).unwrap();
}

#[tokio::test]
async fn follow_replays_a_run_from_a_seq_and_ends_after_its_terminal_event() {
    use futures_util::StreamExt;

    let dir = tempfile::tempdir().unwrap();
    let loom = follow_loom(dir.path());
    let result = loom
        .run("echo", "Salut", loom_ia::RunOptions::default())
        .await
        .unwrap();
    let run = loom.locate(&result.run_id, None, None).await.unwrap();
    let journal: Vec<u64> = loom
        .events(&run)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();

    let all: Vec<u64> = loom.follow(&run, 0).map(|e| e.unwrap().seq).collect().await;
    assert_eq!(all, journal);
    let tail: Vec<u64> = loom
        .follow(&run, journal[1])
        .map(|e| e.unwrap().seq)
        .collect()
        .await;
    assert_eq!(tail, journal[2..].to_vec());
    let after_end: Vec<_> = loom.follow(&run, *journal.last().unwrap()).collect().await;
    assert!(after_end.is_empty());

    let unknown = loom_ia::RunRef {
        run_id: "nope".into(),
        ..run.clone()
    };
    let errors: Vec<_> = loom.follow(&unknown, 0).collect().await;
    assert!(matches!(
        errors.as_slice(),
        [Err(loom_ia::LoomError::UnknownRun(id))] if id == "nope"
    ));
}

fn follow_loom(dir: &std::path::Path) -> loom_ia::Loom {
    use loom_ia::config::{AgentSpec, Config, LoomConfig, ModelSpec, Sdk};
    let raw = LoomConfig {
        models: vec![ModelSpec::new("fake-1", Sdk::Fake, "FAKE")],
        agents: vec![AgentSpec::new("echo", "fake-1")],
        ..LoomConfig::default()
    };
    loom_ia::Loom::new(Config::new(raw, dir.to_path_buf()).unwrap()).unwrap()
}
