//! Child runs seen through the facade: a session holding a root run and its sub-run (built
//! with the engine directly, to control each step) is listed, folded,
//! traced and reported; the root lists its child's pending approvals, decides them, and its
//! cancellation closes the child first; a sub-run is not resumed on its own.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use loom_core::{
    event::Payload,
    model::ModelClient,
    ports::EventStore,
    tool::{Approval, FnTool, SideEffects, ToolDeclarations, ToolKind, ToolOutput, ToolSpec},
};
use loom_engine::{AgentRuntime, BeginRun, BoundTool, Engine, ModelBinding, SubAgentRuntime};
use loom_ia::{
    Loom, LoomError, Message, RunRef, RunStatus, SpanKind, SystemClock,
    config::{AgentSpec, Config, LoomConfig, ModelSpec, Sdk},
};
use loom_journal::MemoryStore;
use loom_testkit::scripted;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

fn config(dir: &std::path::Path) -> Config {
    let mut model = ModelSpec::new("fake-1", Sdk::Fake, "FAKE");
    model
        .params
        .insert("script".into(), json!([{"text": "ok"}]));
    let raw = LoomConfig {
        models: vec![model],
        agents: vec![
            AgentSpec::new("boss", "fake-1"),
            AgentSpec::new("mailer", "fake-1"),
        ],
        ..LoomConfig::default()
    };
    Config::new(raw, dir.to_path_buf()).unwrap()
}

fn runtime(name: &str, model: Arc<dyn ModelClient>, tools: Vec<FnTool>) -> AgentRuntime {
    let mut agent = AgentRuntime::new(name, "", ModelBinding::new("FAKE", "fake-1", model));
    agent.tools = tools
        .into_iter()
        .map(|t| BoundTool::declared(Arc::new(t)).unwrap())
        .collect();
    agent
}

fn send_tool() -> FnTool {
    let spec = ToolSpec {
        name: "send".into(),
        description: "Sends an e-mail.".into(),
        input_schema: json!({"type": "object", "properties": {"to": {"type": "string"}}}),
        kind: ToolKind::Python,
        declarations: Default::default(),
    };
    FnTool::new(spec, |_, args: Value| {
        Box::pin(async move { Ok(ToolOutput::text(format!("sent to {}", args["to"]))) })
    })
    .with_declarations(ToolDeclarations {
        side_effects: SideEffects::Irreversible,
        approval: Approval::Always,
        ..Default::default()
    })
}

/// A session where the boss waits for its mailer, paused on `send`.
async fn waiting_tree(store: Arc<MemoryStore>) -> (RunRef, String) {
    let mailer = runtime(
        "mailer",
        scripted(
            "fake-1",
            json!([
                {"tool_calls": [{"name": "send", "arguments": {"to": "bob"}}]},
                {"text": "Courriel : {{ tool_result }}"}
            ]),
        ),
        vec![send_tool()],
    );
    let mut boss = runtime(
        "boss",
        scripted(
            "fake-1",
            json!([
                {"tool_calls": [{"name": "mailer", "arguments": {"message": "Préviens Bob."}}]},
                {"text": "Fait : {{ tool_result }}"}
            ]),
        ),
        Vec::new(),
    );
    boss.subagents.push(SubAgentRuntime::new(
        "mailer",
        "Sends e-mails.",
        Arc::new(mailer),
    ));
    let engine = Engine::new(store.clone(), Arc::new(SystemClock));
    let run = engine
        .begin(
            &boss,
            BeginRun {
                tenant_id: "default".into(),
                session_id: Some("tree".into()),
                run_id: Some("root".into()),
                user_id: None,
                metadata: Map::new(),
                message: Message::user("Préviens Bob."),
                judges: Default::default(),
                budget: None,
                attachments: Vec::new(),
                trigger: None,
                state: Default::default(),
            },
            &(),
        )
        .await
        .unwrap();
    let state = engine
        .drive(&run, &boss, &(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(state.status, RunStatus::WaitingChild);
    let events = store.read("default", "tree", 0).await.unwrap();
    let child = events
        .iter()
        .find(|e| matches!(&e.payload, Payload::RunStarted(s) if s.parent_run_id.is_some()))
        .map(|e| e.run_id.clone())
        .unwrap();
    (run, child)
}

#[tokio::test]
async fn a_session_with_a_child_run_is_listed_folded_and_decided_from_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let (root, child) = waiting_tree(store.clone()).await;
    let loom = Loom::with_store(config(dir.path()), store.clone()).unwrap();

    // Listing and folding the session's runs, the child included.
    let runs = loom.session_runs("tree", None).await.unwrap();
    let listed: Vec<(&str, RunStatus)> =
        runs.iter().map(|r| (r.run_id.as_str(), r.status)).collect();
    assert_eq!(
        listed,
        [
            ("root", RunStatus::WaitingChild),
            (child.as_str(), RunStatus::Paused)
        ]
    );
    assert_eq!(runs[1].parent_run_id.as_deref(), Some("root"));
    let located = loom.locate(&child, None, None).await.unwrap();
    assert_eq!(located.session_id, "tree");
    let child_trace = loom.trace(&located).await.unwrap();
    assert_eq!(child_trace.trace_id, "root");
    assert!(child_trace.spans.iter().any(|s| s.kind == SpanKind::Step));
    // The root's trace holds the child's spans, under the call that opened it.
    let trace = loom.trace(&root).await.unwrap();
    let child_run = trace
        .spans
        .iter()
        .find(|s| s.kind == SpanKind::Run && s.run_id == child)
        .unwrap();
    let call = trace
        .spans
        .iter()
        .find(|s| Some(&s.span_id) == child_run.parent_span_id.as_ref())
        .unwrap();
    assert_eq!(
        (call.kind, call.text("loom.tool_kind"), call.run_id.as_str()),
        (SpanKind::Tool, Some("agent"), "root")
    );
    // The root's report covers its child's call, run by run.
    let report = loom.report(&root).await.unwrap();
    assert_eq!(report.total.calls, 2);
    assert_eq!(report.runs.len(), 2);
    assert_eq!(report.runs[&child].parent_run_id.as_deref(), Some("root"));
    assert_eq!(report.runs["root"].with_sub_runs.calls, 2);

    // The root shows its child's request; the child's own result shows it too.
    let result = loom.result(&root).await.unwrap();
    assert_eq!(result.status, RunStatus::WaitingChild);
    assert_eq!(result.pending_approvals.len(), 1);
    assert_eq!(result.pending_approvals[0].tool_name, "send");
    assert_eq!(result.pending_approvals[0].run_id, child);
    assert_eq!(
        loom.result(&located).await.unwrap().pending_approvals.len(),
        1
    );

    // A sub-run is driven by its root, never on its own.
    let refused = loom.resume(&located).await.unwrap_err();
    assert!(matches!(refused, LoomError::Refused(_)), "{refused}");
    assert!(refused.to_string().contains("resume its root run root"));

    // Approved through the root's id (journaled only): the grant is the child's.
    let call_id = result.pending_approvals[0].call_id.clone();
    let decided = loom
        .approve(&root, None, "alice", Some("ok"), None, true)
        .await
        .unwrap();
    assert_eq!(decided.calls, [call_id]);
    assert!(decided.result.pending_approvals.is_empty());
    let events = store.read("default", "tree", 0).await.unwrap();
    let granted = events.last().unwrap();
    assert_eq!(
        (granted.event_type.as_str(), granted.run_id.as_str()),
        ("approval.granted", child.as_str())
    );
    assert_eq!(granted.root_run_id, "root");
}

#[tokio::test]
async fn cancelling_the_root_through_the_facade_closes_its_child_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let (root, child) = waiting_tree(store.clone()).await;
    let loom = Loom::with_store(config(dir.path()), store.clone()).unwrap();
    assert!(loom.cancel(&root, Some("ops".into())).await.unwrap());
    let runs = loom.session_runs("tree", None).await.unwrap();
    assert!(
        runs.iter()
            .all(|r| r.finished && r.status == RunStatus::Cancelled)
    );
    let events = store.read("default", "tree", 0).await.unwrap();
    let closings: Vec<(&str, String)> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::RunCancelled(c) => Some((e.run_id.as_str(), c.reason.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        closings,
        [
            (child.as_str(), "parent".to_owned()),
            ("root", "requested".to_owned())
        ]
    );
    let result = loom.result(&root).await.unwrap();
    assert!(result.pending_approvals.is_empty());
    assert!(!loom.cancel(&root, None).await.unwrap(), "already closed");
}

#[tokio::test]
async fn a_waiting_tree_is_seen_whole_through_session_query_and_follow() {
    use futures_util::StreamExt;
    use loom_ia::{EventQuery, FollowOptions, Redact, RunQuery};

    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let (root, child) = waiting_tree(store.clone()).await;
    let loom = Loom::with_store(config(dir.path()), store.clone()).unwrap();
    let journal = store.read("default", "tree", 0).await.unwrap();

    // The session: both runs, the child's request, nobody left driving nothing.
    let info = loom.session("tree", None).await.unwrap();
    let runs: Vec<(&str, RunStatus, bool)> = info
        .runs
        .iter()
        .map(|r| (r.run_id.as_str(), r.status, r.unpiloted))
        .collect();
    assert_eq!(
        runs,
        [
            ("root", RunStatus::WaitingChild, false),
            (child.as_str(), RunStatus::Paused, false)
        ]
    );
    assert_eq!(info.last_seq, journal.len() as u64);
    assert_eq!(info.pending_approvals.len(), 1);
    assert_eq!(info.pending_approvals[0].run_id, child);
    let masked = info.redacted();
    assert_eq!(
        masked["redacted"],
        json!([
            "pending_approvals[0].arguments",
            "pending_approvals[0].reason"
        ])
    );
    assert!(matches!(
        loom.session("nope", None).await,
        Err(LoomError::UnknownSession(_))
    ));

    // The agents of the tree, from the root and from the child.
    let agents = loom.tree_agents(&root).await.unwrap();
    assert_eq!(agents.into_iter().collect::<Vec<_>>(), ["boss", "mailer"]);
    let located = loom.locate(&child, Some("tree"), None).await.unwrap();
    let agents = loom.tree_agents(&located).await.unwrap();
    assert_eq!(agents.into_iter().collect::<Vec<_>>(), ["mailer"]);

    // Runs, most recent first; events of one agent.
    let page = loom.runs(&RunQuery::default()).await.unwrap();
    let listed: Vec<&str> = page.runs.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(listed, [child.as_str(), "root"]);
    let mailer = loom
        .query(&EventQuery {
            agent: Some("mailer".into()),
            limit: 10_000,
            ..EventQuery::default()
        })
        .await
        .unwrap();
    let expected: Vec<u64> = journal
        .iter()
        .filter(|e| e.agent.as_deref() == Some("mailer"))
        .map(|e| e.seq)
        .collect();
    assert_eq!(mailer.iter().map(|e| e.seq).collect::<Vec<_>>(), expected);
    let refused = loom
        .query(&EventQuery {
            limit: 0,
            ..EventQuery::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "limit: must be between 1 and 10000 (got 0)"
    );

    // Following the root (which stays open, waiting): its events and its child's, or its own.
    let tree: Vec<u64> = loom
        .follow(&root, 0)
        .take(journal.len())
        .map(|e| e.unwrap().seq)
        .collect()
        .await;
    assert_eq!(tree, journal.iter().map(|e| e.seq).collect::<Vec<_>>());
    let own_count = journal.iter().filter(|e| e.run_id == "root").count();
    let own: Vec<String> = loom
        .follow_with(
            &root,
            FollowOptions {
                after_seq: 0,
                subruns: false,
                ..FollowOptions::default()
            },
        )
        .take(own_count)
        .map(|e| e.unwrap().run_id)
        .collect()
        .await;
    assert!(own.iter().all(|r| r == "root"), "{own:?}");
    // Resuming after the child's first event yields the rest of the tree only.
    let first_child = journal.iter().find(|e| e.run_id == child).unwrap().seq;
    let rest: Vec<u64> = loom
        .follow(&root, first_child)
        .take(journal.len() - first_child as usize)
        .map(|e| e.unwrap().seq)
        .collect()
        .await;
    assert_eq!(
        rest,
        journal
            .iter()
            .map(|e| e.seq)
            .filter(|s| *s > first_child)
            .collect::<Vec<_>>()
    );
}
