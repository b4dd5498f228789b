//! Session state through the run loop, on the memory journal and the scripted fake model: keys
//! filled from a tool's result, refusals recorded beside it, the orchestrator shown the state
//! (never journaled), the caller's state checked before anything is written.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use loom_core::{
    Message, RunStatus,
    event::Payload,
    model::ModelClient,
    ports::EventStore,
    tool::{FnTool, ToolDeclarations, ToolKind, ToolOutput, ToolSpec},
};
use loom_engine::{
    AgentRuntime, BeginRun, BoundTool, Engine, EngineError, ModelBinding, RunRef, STATE_HINT,
    StateFrom, StateKeySpec, StateSpec, StateValue, StateView,
};
use loom_journal::MemoryStore;
use loom_testkit::{ManualClock, RecordingModel, scripted};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

/// `lookup`: a customer record as structured data.
fn lookup() -> FnTool {
    FnTool::new(
        ToolSpec {
            name: "lookup".into(),
            description: "Finds a customer.".into(),
            input_schema: json!({"type": "object", "properties": {}}),
            kind: ToolKind::Python,
            declarations: ToolDeclarations::default(),
        },
        |_, _| {
            Box::pin(async {
                Ok(ToolOutput::json(
                    json!({"client": {"id": "C-42", "name": "Martin"}}),
                ))
            })
        },
    )
}

fn from(tool: &str, path: &str, refuse_missing: bool) -> StateFrom {
    StateFrom {
        tool: tool.into(),
        value: StateValue::Path(path.into()),
        refuse_missing,
    }
}

/// `client` from `lookup` at `/client/id`, `lang` with a default, `ref` from a pointer that
/// finds nothing (refused), `vip` from a pointer that finds nothing (ignored).
fn state_spec() -> StateSpec {
    let string = json!({"type": "string"});
    let mut client = StateKeySpec::new("client", &string).unwrap();
    client.from = vec![from("lookup", "/client/id", true)];
    let mut lang = StateKeySpec::new("lang", &string).unwrap();
    lang.default = Some(json!("fr"));
    let mut reference = StateKeySpec::new("ref", &string).unwrap();
    reference.from = vec![from("lookup", "/order/ref", true)];
    let mut vip = StateKeySpec::new("vip", &json!({"type": "boolean"})).unwrap();
    vip.from = vec![from("lookup", "/client/vip", false)];
    StateSpec {
        keys: vec![client, lang, reference, vip],
        view: StateView::All,
        ..StateSpec::default()
    }
}

fn agent(model: Arc<dyn ModelClient>) -> AgentRuntime {
    let main = ModelBinding::new("FAKE", "fake-1", model);
    let mut agent = AgentRuntime::new("demo", "Tu es un assistant.", main);
    agent.tools = vec![BoundTool::declared(Arc::new(lookup())).unwrap()];
    agent.state = state_spec();
    agent
}

fn begin(session: &str, state: Map<String, Value>) -> BeginRun {
    BeginRun {
        tenant_id: "default".into(),
        session_id: Some(session.into()),
        run_id: None,
        user_id: None,
        metadata: Map::new(),
        message: Message::user("Qui est le client ?"),
        judges: Default::default(),
        budget: None,
        attachments: Vec::new(),
        trigger: None,
        state,
    }
}

fn script() -> Value {
    json!([
        {"text": "Je cherche.", "tool_calls": [{"name": "lookup", "arguments": {}}]},
        {"text": "C'est Martin."},
        {"text": "Toujours Martin."}
    ])
}

async fn drive(engine: &Engine, agent: &AgentRuntime, run: &RunRef) {
    let state = engine
        .drive(run, agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(state.status, RunStatus::Completed);
}

#[tokio::test]
async fn a_result_fills_the_state_and_the_orchestrator_is_shown_it() {
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::new(store.clone(), Arc::new(ManualClock::new()));
    let model = Arc::new(RecordingModel::new(scripted("fake-1", script())));
    let agent = agent(model.clone());
    let run = engine
        .begin(&agent, begin("s1", Map::new()), &())
        .await
        .unwrap();
    drive(&engine, &agent, &run).await;

    let events = store.read("default", "s1", 0).await.unwrap();
    let completed = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::ToolCompleted(c) => Some(c.output.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(Value::Object(completed.state), json!({"client": "C-42"}));
    assert_eq!(
        Value::Object(completed.state_refused),
        json!({"ref": "ref: the result of lookup has no value at /order/ref"}),
        "a missing pointer with on_missing: ignore (vip) is neither written nor refused"
    );

    // Every call ends with the state, as it is at that call; the system prompt says why.
    let requests = model.requests();
    let last = |i: usize| requests[i].messages.last().unwrap().text();
    assert_eq!(last(0), "<session_state>{\"lang\":\"fr\"}</session_state>");
    assert_eq!(
        last(1),
        "<session_state>{\"client\":\"C-42\",\"lang\":\"fr\"}</session_state>"
    );
    assert!(requests[0].system.ends_with(STATE_HINT));
    // Never journaled.
    let journaled = serde_json::to_string(&events).unwrap();
    assert!(!journaled.contains("<session_state>"));

    // The next run of the session starts from it, and the caller's value overrides a default.
    let mut given = Map::new();
    given.insert("lang".into(), json!("de"));
    let second = engine.begin(&agent, begin("s1", given), &()).await.unwrap();
    let started = store.read("default", "s1", 0).await.unwrap();
    let opened = started
        .iter()
        .rev()
        .find_map(|e| match &e.payload {
            Payload::RunStarted(s) => Some(s.state.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(Value::Object(opened), json!({"lang": "de"}));
    drive(&engine, &agent, &second).await;
    let requests = model.requests();
    assert_eq!(
        requests[2].messages.last().unwrap().text(),
        "<session_state>{\"client\":\"C-42\",\"lang\":\"de\"}</session_state>"
    );
    let session = agent
        .state
        .fold(&store.read("default", "s1", 0).await.unwrap());
    assert_eq!(
        Value::Object(session.values()),
        json!({"client": "C-42", "lang": "de"})
    );
}

#[tokio::test]
async fn a_refused_state_writes_nothing() {
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::new(store.clone(), Arc::new(ManualClock::new()));
    let mut agent = agent(scripted("fake-1", script()));
    let cases = [
        (json!({"lang": 5}), "lang: does not follow its schema"),
        (
            json!({"colour": "blue"}),
            "colour: not a state key of the agent",
        ),
    ];
    for (given, expected) in cases {
        let given = given.as_object().unwrap().clone();
        let refused = engine.begin(&agent, begin("s2", given), &()).await;
        match refused {
            Err(EngineError::StateRefused(reason)) => {
                assert!(reason.starts_with(expected), "{reason}");
            }
            other => panic!("expected a state refusal, got {other:?}"),
        }
    }
    // A required key without value.
    agent.state.keys[0].required = true;
    let refused = engine.begin(&agent, begin("s2", Map::new()), &()).await;
    assert!(
        matches!(&refused, Err(EngineError::StateRefused(r)) if r.starts_with("client: a required key without value")),
        "{refused:?}"
    );
    assert!(store.read("default", "s2", 0).await.unwrap().is_empty());
}

/// A sub-agent's tool fills the session's state in its child run; the parent's next call is
/// shown it (the parent's pilot reads the child's events when its next write meets them).
#[tokio::test]
async fn a_sub_agents_write_reaches_the_parents_next_call() {
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::new(store.clone(), Arc::new(ManualClock::new()));
    let mut helper = agent(scripted(
        "fake-2",
        json!([
            {"text": "Je cherche.", "tool_calls": [{"name": "lookup", "arguments": {}}]},
            {"text": "Trouvé."}
        ]),
    ));
    helper.name = "helper".into();
    helper.state.view = StateView::Hidden;
    let model = Arc::new(RecordingModel::new(scripted(
        "fake-1",
        json!([
            {"text": "Je délègue.", "tool_calls": [{"name": "helper", "arguments": {"message": "Cherche le client."}}]},
            {"text": "C'est fait."}
        ]),
    )));
    let mut boss = agent(model.clone());
    boss.tools.clear();
    boss.subagents = vec![loom_engine::SubAgentRuntime::new(
        "helper",
        "Finds the customer.",
        Arc::new(helper),
    )];
    let run = engine
        .begin(&boss, begin("s3", Map::new()), &())
        .await
        .unwrap();
    drive(&engine, &boss, &run).await;
    let requests = model.requests();
    assert_eq!(
        requests[0].messages.last().unwrap().text(),
        "<session_state>{\"lang\":\"fr\"}</session_state>"
    );
    assert_eq!(
        requests[1].messages.last().unwrap().text(),
        "<session_state>{\"client\":\"C-42\",\"lang\":\"fr\"}</session_state>"
    );
}

#[tokio::test]
async fn the_state_is_carried_by_session_snapshots() {
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::new(store.clone(), Arc::new(ManualClock::new())).with_snapshots(Some(1));
    let model = Arc::new(RecordingModel::new(scripted("fake-1", script())));
    let agent = agent(model.clone());
    for _ in 0..3 {
        let run = engine
            .begin(&agent, begin("s1", Map::new()), &())
            .await
            .unwrap();
        drive(&engine, &agent, &run).await;
    }
    let whole = store.read("default", "s1", 0).await.unwrap();
    let latest = engine.read_latest("default", "s1").await.unwrap();
    // The window starts after a snapshot that holds the state written before it...
    assert!(latest.len() < whole.len());
    let base = loom_core::event::SessionSnapshot::base_of(&latest).unwrap();
    assert!(base.state.as_ref().unwrap().get("client").is_some());
    // ...and folds to the state of the whole journal.
    let from_window = agent.state.fold_window(&latest);
    assert_eq!(from_window.values(), agent.state.fold(&whole).values());
    assert!(from_window.get("client").is_some());
}
