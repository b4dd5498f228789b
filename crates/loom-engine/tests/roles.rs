//! Roles end to end on the memory journal: what a role receives, `$ref` between results,
//! terminal and vision roles, role contracts and failures, cost accounting, and the two views
//! of a tool result.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use loom_core::{
    Block, BlockKind, Event, Message, Role, RunState, RunStatus,
    event::Payload,
    model::{ModelClient, ModelRequest},
    ports::EventStore,
    tool::{FnTool, ToolDeclarations, ToolKind, ToolOutput, ToolSpec, Views},
};
use loom_engine::{
    AgentRuntime, BeginRun, BoundTool, ContextScope, Engine, ModelBinding, REFS_HINT, RoleContext,
    RoleRuntime, RunRef,
    contract::{Contract, ContractSpec, OnFailure, RepairSettings},
};
use loom_journal::{MemoryArtifacts, MemoryStore};
use loom_testkit::{ManualClock, RecordingModel, scripted};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

const SYSTEM: &str = "Tu es un assistant.";

fn binding(config_id: &str, model: Arc<dyn ModelClient>) -> ModelBinding {
    let mut binding = ModelBinding::new(config_id, config_id.to_lowercase(), model);
    binding.pricing.input = 1.0;
    binding.pricing.output = 2.0;
    binding
}

fn text_tool(name: &str, text: &str) -> FnTool {
    let text = text.to_owned();
    FnTool::new(
        ToolSpec {
            name: name.into(),
            description: format!("Answers {name}."),
            input_schema: json!({"type": "object"}),
            kind: ToolKind::Python,
            declarations: ToolDeclarations::default(),
        },
        move |_, _| {
            let text = text.clone();
            Box::pin(async move { Ok(ToolOutput::text(text)) })
        },
    )
}

fn output_tool(name: &str, output: ToolOutput) -> FnTool {
    FnTool::new(
        ToolSpec {
            name: name.into(),
            description: format!("Answers {name}."),
            input_schema: json!({"type": "object"}),
            kind: ToolKind::Python,
            declarations: ToolDeclarations::default(),
        },
        move |_, _| {
            let output = output.clone();
            Box::pin(async move { Ok(output) })
        },
    )
}

fn agent(model: Arc<dyn ModelClient>, tools: Vec<FnTool>, roles: Vec<RoleRuntime>) -> AgentRuntime {
    let mut agent = AgentRuntime::new("demo", SYSTEM, binding("MAIN", model));
    agent.tools = tools
        .into_iter()
        .map(|t| BoundTool::declared(Arc::new(t)).unwrap())
        .collect();
    agent.roles = roles;
    agent
}

fn role(name: &str, model: Arc<dyn ModelClient>) -> RoleRuntime {
    RoleRuntime::new(
        name,
        format!("The {name} role."),
        "You draft letters.",
        binding("ROLE", model),
    )
}

fn engine() -> (Engine, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    (
        Engine::new(store.clone(), Arc::new(ManualClock::new())),
        store,
    )
}

fn begin(message: Message) -> BeginRun {
    BeginRun {
        tenant_id: "default".into(),
        session_id: None,
        run_id: None,
        user_id: None,
        metadata: Map::new(),
        message,
        judges: Default::default(),
        budget: None,
        attachments: Vec::new(),
        trigger: None,
        state: Default::default(),
    }
}

async fn run(engine: &Engine, agent: &AgentRuntime, request: BeginRun) -> (RunRef, RunState) {
    let run = engine.begin(agent, request, &()).await.unwrap();
    let state = engine
        .drive(&run, agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    (run, state)
}

async fn events(store: &MemoryStore, run: &RunRef) -> Vec<Event> {
    store
        .read(&run.tenant_id, &run.session_id, 0)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.run_id == run.run_id)
        .collect()
}

fn types(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.event_type.as_str()).collect()
}

fn of_type<'e>(events: &'e [Event], kind: &str) -> Vec<&'e Event> {
    events.iter().filter(|e| e.event_type == kind).collect()
}

fn completed(events: &[Event], tool: &str) -> Vec<loom_core::event::ToolCompleted> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ToolCompleted(p) if p.tool_name == tool => Some(p.clone()),
            _ => None,
        })
        .collect()
}

/// Everything a model was sent, as JSON text.
fn sent(request: &ModelRequest) -> String {
    serde_json::to_string(request).unwrap()
}

/// The text of a request's only user message.
fn role_input(request: &ModelRequest) -> String {
    assert_eq!(request.messages[0].role, Role::User);
    request.messages[0].text()
}

fn offered(request: &ModelRequest) -> Vec<&str> {
    request.tools.iter().map(|t| t.name.as_str()).collect()
}

#[tokio::test]
async fn a_role_receives_exactly_its_declared_context() {
    let (engine, store) = engine();
    let main = Arc::new(RecordingModel::new(scripted(
        "fake-main",
        json!([
            {"tool_calls": [{"name": "lookup"}, {"name": "secret"}]},
            {"text": "I draft.", "tool_calls": [{"name": "draft", "arguments": {"tone": "cordial"}}]},
            {"text": "Sent: {{ tool_result }}"}
        ]),
    )));
    let role_model = Arc::new(RecordingModel::new(scripted(
        "fake-role",
        json!([{"text": "Dear client, here is your quote."}]),
    )));
    let mut draft = role("draft", role_model.clone());
    draft.input_schema = json!({"type": "object", "properties": {"tone": {"type": "string"}}});
    draft.context = vec![
        RoleContext::UserInput,
        RoleContext::ToolResults {
            tools: vec!["lookup".into()],
            scope: ContextScope::Run,
        },
    ];
    let agent = agent(
        main.clone(),
        vec![
            text_tool("lookup", "LOOKUP-RESULT quote D-42"),
            text_tool("secret", "SECRET-RESULT"),
        ],
        vec![draft],
    );
    let (run, state) = run(
        &engine,
        &agent,
        begin(Message::user("Remind the client of quote D-42.")),
    )
    .await;
    assert_eq!(state.status, RunStatus::Completed);

    // The role's one request: its system prompt, one user message, no tools, no history.
    let requests = role_model.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.system, "You draft letters.");
    assert!(request.tools.is_empty());
    assert_eq!(request.messages.len(), 1);
    assert_eq!(
        role_input(request),
        "<user_input>\nRemind the client of quote D-42.\n</user_input>\n\n\
         <tool_results>\nlookup: LOOKUP-RESULT quote D-42\n</tool_results>\n\n\
         <arguments>\n{\"tone\":\"cordial\"}\n</arguments>"
    );
    let everything = sent(request);
    assert!(!everything.contains("SECRET-RESULT"), "{everything}");
    assert!(!everything.contains(SYSTEM), "{everything}");
    assert!(!everything.contains("I draft."), "{everything}");

    // The role reads lookup's results: the orchestrator is not offered it before one exists
    // (nor told about references then). Once lookup answered, it is offered the role as a
    // tool, with the refs hint, and sees numbered results.
    let main_requests = main.requests();
    assert_eq!(offered(&main_requests[0]), ["lookup", "secret"]);
    assert!(!main_requests[0].system.contains(REFS_HINT));
    assert_eq!(offered(&main_requests[1]), ["lookup", "secret", "draft"]);
    assert!(main_requests[1].system.ends_with(REFS_HINT));
    assert!(sent(&main_requests[2]).contains("[result:3]"));
    assert_eq!(
        state.output_text().as_deref(),
        Some("Sent: Dear client, here is your quote.")
    );

    // Journal: tool.called (role), the role's model.responded under the call's span, then
    // tool.completed with the role's text.
    let events = events(&store, &run).await;
    let called = of_type(&events, "tool.called")
        .into_iter()
        .find(|e| matches!(&e.payload, Payload::ToolCalled(p) if p.tool_name == "draft"))
        .unwrap();
    let Payload::ToolCalled(call) = &called.payload else {
        unreachable!()
    };
    assert_eq!(call.tool_kind, ToolKind::Role);
    let answered: Vec<&Event> = of_type(&events, "model.responded")
        .into_iter()
        .filter(|e| e.role.as_deref() == Some("draft"))
        .collect();
    assert_eq!(answered.len(), 1);
    let Payload::ModelResponded(role_answer) = &answered[0].payload else {
        unreachable!()
    };
    assert_eq!(role_answer.call_id.as_deref(), Some(call.call_id.as_str()));
    assert_eq!(
        answered[0].parent_span_id.as_deref(),
        Some(called.span_id.as_str())
    );
    assert_ne!(answered[0].span_id, called.span_id);
    let done = completed(&events, "draft");
    assert_eq!(
        done[0].output.visible_text(),
        "Dear client, here is your quote."
    );
    let position = |id: &str| events.iter().position(|e| e.event_id == id).unwrap();
    assert!(position(&called.event_id) < position(&answered[0].event_id));
    // A role's model calls are not orchestrator iterations.
    assert_eq!(state.iterations, 3);
    assert_eq!(state.model_calls, 4);
}

#[tokio::test]
async fn a_template_renders_arguments_and_context() {
    let (engine, _) = engine();
    let main = scripted(
        "fake-main",
        json!([
            {"tool_calls": [{"name": "lookup"}]},
            {"tool_calls": [{"name": "draft", "arguments": {"tone": "cordial"}}]},
            {"text": "done"}
        ]),
    );
    let role_model = Arc::new(RecordingModel::new(scripted(
        "fake-role",
        json!([{"text": "ok"}]),
    )));
    let mut draft = role("draft", role_model.clone());
    draft.context = vec![
        RoleContext::UserInput,
        RoleContext::ToolResults {
            tools: vec!["lookup".into()],
            scope: ContextScope::Run,
        },
    ];
    draft.input_template = Some(
        "Write to the client ({{ context.user_input }}) in a {{ args.tone }} tone, using: \
         {{ context.tool_results.lookup }}"
            .into(),
    );
    let agent = agent(main, vec![text_tool("lookup", "quote D-42")], vec![draft]);
    let (_, state) = run(&engine, &agent, begin(Message::user("Remind them."))).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(
        role_input(&role_model.requests()[0]),
        "Write to the client (Remind them.) in a cordial tone, using: quote D-42"
    );
}

#[tokio::test]
async fn caller_context_last_turns_and_session_results_come_from_the_session() {
    let (engine, _) = engine();
    let main = scripted(
        "fake-main",
        json!([
            {"text": "Looking.", "tool_calls": [{"name": "lookup"}], "with_text": "first"},
            {"text": "first answer", "with_text": "first"},
            {"text": "second answer", "with_text": "second"},
            {"tool_calls": [{"name": "draft"}], "with_text": "third"},
            {"text": "third answer", "with_text": "third"}
        ]),
    );
    let role_model = Arc::new(RecordingModel::new(scripted(
        "fake-role",
        json!([{"text": "ok"}]),
    )));
    let mut draft = role("draft", role_model.clone());
    draft.context = vec![
        RoleContext::CallerContext,
        RoleContext::LastTurns(1),
        RoleContext::ToolResults {
            tools: vec!["lookup".into()],
            scope: ContextScope::Session,
        },
    ];
    let agent = agent(
        main,
        vec![text_tool("lookup", "LOOKUP-RESULT")],
        vec![draft],
    );
    for (question, answer) in [
        ("first question", "first answer"),
        ("second question", "second answer"),
    ] {
        let mut request = begin(Message::user(question));
        request.session_id = Some("s1".into());
        let (_, state) = run(&engine, &agent, request).await;
        assert_eq!(state.output_text().as_deref(), Some(answer));
    }
    let mut third = begin(Message::user("third question"));
    third.session_id = Some("s1".into());
    third.metadata.insert("client".into(), json!("ACME"));
    let (_, state) = run(&engine, &agent, third).await;
    assert_eq!(state.output_text().as_deref(), Some("third answer"));
    // The caller's context of this run, the last earlier turn only, and a result of the first
    // run (the session's, not only this run's).
    assert_eq!(
        role_input(&role_model.requests()[0]),
        "<caller_context>\n{\"tenant_id\":\"default\",\"user_id\":null,\"metadata\":{\"client\":\"ACME\"}}\n</caller_context>\n\n\
         <last_turns>\nuser: second question\nassistant: second answer\n</last_turns>\n\n\
         <tool_results>\nlookup: LOOKUP-RESULT\n</tool_results>\n\n\
         <arguments>\n{}\n</arguments>"
    );
}

#[tokio::test]
async fn a_ref_gives_the_role_the_whole_result() {
    let (engine, store) = engine();
    let rows =
        json!({"rows": [{"id": 1, "label": "ROW-MARKER-1"}, {"id": 2, "label": "ROW-MARKER-2"}]});
    let main = Arc::new(RecordingModel::new(scripted(
        "fake-main",
        json!([
            {"tool_calls": [{"name": "fetch"}]},
            {"tool_calls": [{"name": "summarize", "arguments": {
                "data": {"$ref": "result:1"},
                "again": "{\"$ref\": \"result:1\"}"
            }}]},
            {"text": "done"}
        ]),
    )));
    let role_model = Arc::new(RecordingModel::new(scripted(
        "fake-role",
        json!([{"text": "2 rows"}]),
    )));
    let mut summarize = role("summarize", role_model.clone());
    summarize.input_schema = json!({
        "type": "object",
        "properties": {"data": {"type": "object"}, "again": {"type": "object"}},
        "required": ["data", "again"]
    });
    let agent = agent(
        main.clone(),
        vec![output_tool("fetch", ToolOutput::json(rows.clone()))],
        vec![summarize],
    );
    let (run, state) = run(&engine, &agent, begin(Message::user("Summarize the rows."))).await;
    assert_eq!(state.status, RunStatus::Completed);

    // The role received the result's data in place of each reference.
    let input = role_input(&role_model.requests()[0]);
    let arguments: Value = serde_json::from_str(
        input
            .strip_prefix("<arguments>\n")
            .and_then(|s| s.strip_suffix("\n</arguments>"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(arguments, json!({"data": rows, "again": rows}));

    // The journal keeps what the model wrote, and lists what was resolved.
    let events = events(&store, &run).await;
    let call = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::ToolCalled(p) if p.tool_name == "summarize" => Some(p.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(call.arguments["data"], json!({"$ref": "result:1"}));
    assert_eq!(
        call.refs,
        [
            json!({"ref": "result:1", "call_id": "fake_0_0", "path": "/data"}),
            json!({"ref": "result:1", "call_id": "fake_0_0", "path": "/again"}),
        ]
    );
    // The orchestrator's own conversation keeps the reference, not the data.
    let last = sent(&main.requests()[2]);
    assert!(last.contains("\"$ref\":\"result:1\""), "{last}");
}

#[tokio::test]
async fn a_ref_reads_an_offloaded_result_whole() {
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::new(store.clone(), Arc::new(ManualClock::new()))
        .with_artifacts(Arc::new(MemoryArtifacts::new()));
    let long: String = (0..3_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let main = scripted(
        "fake-main",
        json!([
            {"tool_calls": [{"name": "report"}]},
            {"tool_calls": [{"name": "summarize", "arguments": {"text": {"$ref": "result:1"}}}]},
            {"text": "done"}
        ]),
    );
    let role_model = Arc::new(RecordingModel::new(scripted(
        "fake-role",
        json!([{"text": "short"}]),
    )));
    let mut summarize = role("summarize", role_model.clone());
    summarize.input_schema =
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]});
    let mut agent = agent(main, vec![text_tool("report", &long)], vec![summarize]);
    agent.offload_over = Some(500);
    let (run, state) = run(
        &engine,
        &agent,
        begin(Message::user("Summarize the report.")),
    )
    .await;
    assert_eq!(state.status, RunStatus::Completed);
    let events = events(&store, &run).await;
    assert!(completed(&events, "report")[0].output.offloaded.is_some());
    // The role got the whole text, not the preview.
    let input = role_input(&role_model.requests()[0]);
    assert!(input.contains(&long));
    assert!(!input.contains("Result offloaded"));
}

#[tokio::test]
async fn an_unknown_or_future_ref_is_refused_before_the_call() {
    let (engine, store) = engine();
    let main = scripted(
        "fake-main",
        json!([
            {"tool_calls": [
                {"name": "lookup"},
                {"name": "draft", "arguments": {"data": {"$ref": "result:1"}}}
            ]},
            {"tool_calls": [{"name": "draft", "arguments": {"data": {"$ref": "result:9"}}}]},
            {"text": "gave up"}
        ]),
    );
    let role_model = Arc::new(RecordingModel::new(scripted(
        "fake-role",
        json!([{"text": "never"}]),
    )));
    let mut draft = role("draft", role_model.clone());
    draft.input_schema = json!({"type": "object", "properties": {"data": {}}});
    let agent = agent(main, vec![text_tool("lookup", "x")], vec![draft]);
    let (run, state) = run(&engine, &agent, begin(Message::user("Go."))).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert!(role_model.requests().is_empty());
    let events = events(&store, &run).await;
    // No tool.called for a refused call: only lookup's.
    assert_eq!(of_type(&events, "tool.called").len(), 1);
    let refused = completed(&events, "draft");
    assert_eq!(refused.len(), 2);
    assert!(refused.iter().all(|r| r.output.is_error));
    // In the same turn, result:1 did not exist yet.
    assert_eq!(
        refused[0].output.visible_text(),
        "Unknown reference: 'result:1' (no result can be referenced yet; only results obtained \
         before this turn)."
    );
    // Results 1 to 3: lookup, then the two refusals (results are numbered, errors included).
    assert_eq!(
        refused[1].output.visible_text(),
        "Unknown reference: 'result:9' (results that can be referenced: result:1 to result:2; \
         only results obtained before this turn)."
    );
}

#[tokio::test]
async fn a_terminal_role_alone_ends_the_run() {
    let (engine, store) = engine();
    let main = Arc::new(RecordingModel::new(scripted(
        "fake-main",
        json!([
            {"tool_calls": [{"name": "write_reply", "arguments": {}}]},
            {"text": "never asked"}
        ]),
    )));
    let role_model = scripted("fake-role", json!([{"text": "Dear client, FINAL-LETTER."}]));
    let mut write_reply = role("write_reply", role_model);
    write_reply.terminal = true;
    write_reply.context = vec![RoleContext::UserInput];
    let agent = agent(main.clone(), Vec::new(), vec![write_reply]);
    let (run, state) = run(&engine, &agent, begin(Message::user("Write the reply."))).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(
        state.output_text().as_deref(),
        Some("Dear client, FINAL-LETTER.")
    );
    assert_eq!(main.requests().len(), 1);

    let events = events(&store, &run).await;
    let tail: Vec<&str> = types(&events).into_iter().rev().take(6).rev().collect();
    assert_eq!(
        tail,
        [
            "tool.called",
            "model.responded",
            "tool.completed",
            "step.completed",
            "run.transitioned",
            "run.completed"
        ]
    );
    let tool_completed = of_type(&events, "tool.completed")[0];
    let Payload::RunTransitioned(transition) = &events[events.len() - 2].payload else {
        panic!("a transition closes the run")
    };
    assert_eq!(transition.from_state, RunStatus::AwaitingTools);
    assert_eq!(transition.to_state, RunStatus::Completed);
    assert_eq!(transition.cause_type, "tool.completed");
    assert_eq!(
        transition.cause_event_id.as_deref(),
        Some(tool_completed.event_id.as_str())
    );
    let Payload::RunCompleted(done) = &events[events.len() - 1].payload else {
        panic!("run.completed closes the run")
    };
    assert!(done.output.is_none());
    assert_eq!(
        done.output_event_id.as_deref(),
        Some(tool_completed.event_id.as_str())
    );
    // Folded again from the journal, the answer is the role's.
    let again = RunState::fold(&run.run_id, &events).unwrap();
    assert_eq!(
        again.output_text().as_deref(),
        Some("Dear client, FINAL-LETTER.")
    );
}

#[tokio::test]
async fn a_terminal_role_with_another_call_does_not_end_the_run() {
    let (engine, store) = engine();
    let main = scripted(
        "fake-main",
        json!([
            {"tool_calls": [{"name": "lookup"}, {"name": "write_reply"}]},
            {"text": "The orchestrator's final answer."}
        ]),
    );
    let mut write_reply = role(
        "write_reply",
        scripted("fake-role", json!([{"text": "letter"}])),
    );
    write_reply.terminal = true;
    write_reply.context = vec![RoleContext::UserInput];
    let agent = agent(main, vec![text_tool("lookup", "x")], vec![write_reply]);
    let (run, state) = run(&engine, &agent, begin(Message::user("Go."))).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(
        state.output_text().as_deref(),
        Some("The orchestrator's final answer.")
    );
    let events = events(&store, &run).await;
    let decisions: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::PolicyDecided(p) => Some(p.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(decisions.len(), 1);
    assert_eq!(decisions[0].policy, "loom.terminal");
    assert_eq!(decisions[0].point, "after_tool");
    assert_eq!(decisions[0].decision, "continue");
    assert_eq!(decisions[0].call_id.as_deref(), Some("fake_0_1"));
    let Payload::RunCompleted(done) = &events.last().unwrap().payload else {
        panic!("run.completed closes the run")
    };
    assert!(done.output.is_some());
    assert!(done.output_event_id.is_none());
}

#[tokio::test]
async fn a_vision_role_is_offered_only_with_an_image() {
    let (engine, _) = engine();
    let main = Arc::new(RecordingModel::new(scripted(
        "fake-main",
        json!([
            {"text": "No image to look at.", "without_tool": "describe"},
            {"tool_calls": [{"name": "describe"}], "with_tool": "describe"},
            {"text": "Seen: {{ tool_result }}", "with_tool": "describe"}
        ]),
    )));
    let role_model = Arc::new(RecordingModel::new(scripted(
        "fake-role",
        json!([{"text": "a red car"}]),
    )));
    let mut describe = role("describe", role_model.clone());
    describe.context = vec![RoleContext::Attachments];
    let agent = agent(main.clone(), Vec::new(), vec![describe]);

    let (_, state) = run(&engine, &agent, begin(Message::user("Hello."))).await;
    assert_eq!(state.output_text().as_deref(), Some("No image to look at."));
    assert!(offered(&main.requests()[0]).is_empty());
    assert!(role_model.requests().is_empty());

    let image = Block::new(BlockKind::Artifact {
        uri: "artifact://default/s/abc.png".into(),
        media_type: "image/png".into(),
        size: 42,
        name: Some("car.png".into()),
    });
    let message = Message {
        role: Role::User,
        blocks: vec![Block::text("What is on this picture?"), image.clone()],
    };
    let (_, state) = run(&engine, &agent, begin(message)).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(offered(&main.requests()[1]), ["describe"]);
    let request = &role_model.requests()[0];
    assert_eq!(request.messages.len(), 1);
    assert_eq!(
        request.messages[0].blocks,
        [
            Block::text(
                "<attachments>\n- car.png (image/png)\n</attachments>\n\n<arguments>\n{}\n</arguments>"
            ),
            image
        ]
    );
}

fn contract(spec: ContractSpec) -> Contract {
    Contract::new(spec).unwrap()
}

#[tokio::test]
async fn a_role_contract_failure_is_repaired_by_the_role_model() {
    let (engine, store) = engine();
    let main = scripted(
        "fake-main",
        json!([
            {"tool_calls": [{"name": "draft"}]},
            {"text": "Sent: {{ tool_result }}"}
        ]),
    );
    let role_model = Arc::new(RecordingModel::new(scripted(
        "fake-role",
        json!([
            {"text": "Hello, here is your quote."},
            {"text": "Hello, here is quote D-2026-042."}
        ]),
    )));
    let mut draft = role("draft", role_model.clone());
    draft.context = vec![RoleContext::UserInput];
    draft.output = Some(contract(ContractSpec {
        must_match: Some("D-\\d{4}-\\d{3}".into()),
        ..ContractSpec::default()
    }));
    let agent = agent(main, Vec::new(), vec![draft]);
    let (run, state) = run(&engine, &agent, begin(Message::user("Quote D-2026-042."))).await;
    assert_eq!(state.status, RunStatus::Completed);

    // The repair is the first exchange plus the repair request with the diagnostic (which a
    // scripted model does not count as a turn of the user: it answers with its next reply).
    let requests = role_model.requests();
    assert_eq!(requests.len(), 2);
    let roles: Vec<Role> = requests[1].messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::User, Role::Assistant, Role::User]);
    assert_eq!(requests[1].messages[0], requests[0].messages[0]);
    assert!(requests[1].messages[2].text().starts_with(
        "Answer refused by a check (loom.contract): The output does not meet its contract"
    ));

    let events = events(&store, &run).await;
    let role_events: Vec<&str> = events
        .iter()
        .skip_while(|e| e.event_type != "tool.called")
        .take(6)
        .map(|e| e.event_type.as_str())
        .collect();
    assert_eq!(
        role_events,
        [
            "tool.called",
            "model.responded",
            "guard.checked",
            "policy.decided",
            "model.responded",
            "guard.checked"
        ]
    );
    let checks: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::GuardChecked(p) => Some(p.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(checks[0].target, "role:draft");
    assert_eq!(checks[0].outcome, "failed");
    assert_eq!(checks[0].resolution.as_deref(), Some("retry"));
    assert_eq!(checks[0].call_id.as_deref(), Some("fake_0_0"));
    assert_eq!(checks[1].outcome, "passed");
    assert_eq!(checks[1].attempt, Some(2));
    let Some(Payload::PolicyDecided(retry)) = events
        .iter()
        .find(|e| e.event_type == "policy.decided")
        .map(|e| &e.payload)
    else {
        panic!("a retry is decided")
    };
    assert_eq!(
        (
            retry.policy.as_str(),
            retry.decision.as_str(),
            retry.call_id.as_deref(),
            retry.attempt
        ),
        ("loom.contract", "retry", Some("fake_0_0"), Some(1))
    );
    assert_eq!(
        completed(&events, "draft")[0].output.visible_text(),
        "Hello, here is quote D-2026-042."
    );
    // The orchestrator was not repaired: its run had no repair message.
    assert!(
        !events
            .iter()
            .any(|e| matches!(&e.payload, Payload::MessageUser(m) if m.kind == "repair"))
    );
}

#[tokio::test]
async fn a_role_contract_exhausted_applies_on_failure() {
    let cases = [
        (
            OnFailure::Fail,
            true,
            false,
            "refused by its output contract (a rule of the configuration, not a failure)",
        ),
        (OnFailure::Unverified, false, true, "no reference"),
        (OnFailure::Fallback, false, false, "Please call us."),
    ];
    for (on_failure, is_error, unverified, text) in cases {
        let (engine, store) = engine();
        let main = scripted(
            "fake-main",
            json!([{"tool_calls": [{"name": "draft"}]}, {"text": "done"}]),
        );
        let mut draft = role(
            "draft",
            scripted("fake-role", json!([{"text": "no reference"}])),
        );
        draft.context = vec![RoleContext::UserInput];
        draft.output = Some(contract(ContractSpec {
            must_match: Some("D-\\d+".into()),
            repair: RepairSettings {
                max_attempts: 0,
                ..RepairSettings::default()
            },
            on_failure,
            fallback_message: Some("Please call us.".into()),
            ..ContractSpec::default()
        }));
        let agent = agent(main, Vec::new(), vec![draft]);
        let (run, state) = run(&engine, &agent, begin(Message::user("Go."))).await;
        assert_eq!(state.status, RunStatus::Completed, "{on_failure:?}");
        let events = events(&store, &run).await;
        let result = &completed(&events, "draft")[0].output;
        assert_eq!(result.is_error, is_error, "{on_failure:?}");
        assert_eq!(result.unverified, unverified, "{on_failure:?}");
        assert!(
            result.visible_text().contains(text),
            "{on_failure:?}: {}",
            result.visible_text()
        );
        assert_eq!(result.fallback, on_failure == OnFailure::Fallback);
    }
}

#[tokio::test]
async fn a_role_model_failure_or_empty_answer_is_an_error_result() {
    for (script, expected) in [
        (
            json!([{"error": "auth"}]),
            "The role draft failed: scripted auth error",
        ),
        (
            json!([{"text": ""}]),
            "The role draft gave an empty answer.",
        ),
    ] {
        let (engine, store) = engine();
        let main = scripted(
            "fake-main",
            json!([{"tool_calls": [{"name": "draft"}]}, {"text": "Sorry: {{ tool_result }}"}]),
        );
        let mut draft = role("draft", scripted("fake-role", script));
        draft.context = vec![RoleContext::UserInput];
        let agent = agent(main, Vec::new(), vec![draft]);
        let (run, state) = run(&engine, &agent, begin(Message::user("Go."))).await;
        // The run goes on: the orchestrator reads the error.
        assert_eq!(state.status, RunStatus::Completed);
        assert_eq!(state.output_text(), Some(format!("Sorry: {expected}")));
        let events = events(&store, &run).await;
        let result = &completed(&events, "draft")[0];
        assert!(result.output.is_error);
        assert_eq!(result.output.visible_text(), expected);
    }
}

#[tokio::test]
async fn a_roles_cost_is_counted_once() {
    let (engine, store) = engine();
    let main = scripted(
        "fake-main",
        json!([{"tool_calls": [{"name": "draft"}]}, {"text": "done"}]),
    );
    let mut draft = role(
        "draft",
        scripted("fake-role", json!([{"text": "a letter of some length"}])),
    );
    draft.context = vec![RoleContext::UserInput];
    draft.main.pricing.input = 10.0;
    let agent = agent(main, Vec::new(), vec![draft]);
    let (run, state) = run(&engine, &agent, begin(Message::user("Go."))).await;
    let events = events(&store, &run).await;
    let responded: Vec<(Option<String>, f64)> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ModelResponded(p) => Some((e.role.clone(), p.cost_usd)),
            _ => None,
        })
        .collect();
    let role_cost: f64 = responded
        .iter()
        .filter(|(role, _)| role.as_deref() == Some("draft"))
        .map(|(_, cost)| cost)
        .sum();
    assert!(role_cost > 0.0);
    // tool.completed restates the role's cost...
    assert_eq!(completed(&events, "draft")[0].cost_usd, role_cost);
    // ...and the run counts every model call once.
    let total: f64 = responded.iter().map(|(_, cost)| cost).sum();
    assert_eq!(state.cost_usd, total);
    let Payload::RunCompleted(done) = &events.last().unwrap().payload else {
        panic!("run.completed closes the run")
    };
    assert_eq!(done.cost_usd, total);
    assert_eq!(
        RunState::fold(&run.run_id, &events).unwrap().cost_usd,
        total
    );
}

#[tokio::test]
async fn the_full_view_is_journaled_but_never_sent_to_a_model() {
    let store = Arc::new(MemoryStore::new());
    let artifacts = Arc::new(MemoryArtifacts::new());
    let engine =
        Engine::new(store.clone(), Arc::new(ManualClock::new())).with_artifacts(artifacts.clone());
    let invoices = Views {
        model: "3 invoices, 1 240 EUR in total",
        full: json!({"invoices": [{"id": "FULL-ONLY-MARKER", "amount": 1240}]}),
    };
    let long_compact: String = "x".repeat(600);
    let main = Arc::new(RecordingModel::new(scripted(
        "fake-main",
        json!([
            {"tool_calls": [{"name": "invoices"}, {"name": "archive"}]},
            {"tool_calls": [{"name": "draft"}]},
            {"text": "done"}
        ]),
    )));
    let role_model = Arc::new(RecordingModel::new(scripted(
        "fake-role",
        json!([{"text": "ok"}]),
    )));
    let mut draft = role("draft", role_model.clone());
    draft.context = vec![RoleContext::ToolResults {
        tools: vec!["invoices".into(), "archive".into()],
        scope: ContextScope::Run,
    }];
    let mut agent = agent(
        main.clone(),
        vec![
            output_tool(
                "invoices",
                loom_core::tool::IntoToolOutput::into_tool_output(invoices),
            ),
            output_tool(
                "archive",
                ToolOutput::views(long_compact, json!({"archive": "FULL-ONLY-ARCHIVE"})),
            ),
        ],
        vec![draft],
    );
    agent.offload_over = Some(500);
    let (run, state) = run(&engine, &agent, begin(Message::user("Sum the invoices."))).await;
    assert_eq!(state.status, RunStatus::Completed);

    for request in main.requests().iter().chain(role_model.requests().iter()) {
        let everything = sent(request);
        assert!(!everything.contains("FULL-ONLY"), "{everything}");
    }
    assert!(sent(&main.requests()[1]).contains("3 invoices, 1 240 EUR in total"));
    assert!(role_input(&role_model.requests()[0]).contains("3 invoices, 1 240 EUR in total"));

    let events = events(&store, &run).await;
    let journaled = &completed(&events, "invoices")[0].output;
    assert_eq!(
        journaled.full,
        Some(json!({"invoices": [{"id": "FULL-ONLY-MARKER", "amount": 1240}]}))
    );
    assert!(
        serde_json::to_string(&events)
            .unwrap()
            .contains("FULL-ONLY-MARKER")
    );
    // An offloaded result keeps its full view for interfaces; the artifact holds the model's
    // view only.
    let archived = &completed(&events, "archive")[0].output;
    let uri = archived.offloaded.clone().unwrap();
    assert_eq!(archived.full, Some(json!({"archive": "FULL-ONLY-ARCHIVE"})));
    let stored = loom_core::ports::ArtifactStore::get(artifacts.as_ref(), &uri)
        .await
        .unwrap()
        .unwrap();
    assert!(!String::from_utf8_lossy(&stored).contains("FULL-ONLY"));
}

/// What a journal line says, for comparing sequences: type, envelope role, tool kind, policy
/// decision, transition.
fn shape(event: &Event) -> String {
    let detail = match &event.payload {
        Payload::ToolCalled(p) => format!("{:?}", p.tool_kind).to_lowercase(),
        Payload::PolicyDecided(p) => format!("{} {} {}", p.policy, p.point, p.decision),
        Payload::RunTransitioned(p) => format!("{}>{} {}", p.from_state, p.to_state, p.cause_type),
        _ => String::new(),
    };
    format!(
        "{} {} {detail}",
        event.event_type,
        event.role.as_deref().unwrap_or("-")
    )
    .trim_end()
    .to_owned()
}

/// In `../shared` (the test is skipped on a clone without it).
const REFERENCE_TERMINAL_ROLE: &str = "reference/journals/policies-terminal-role.jsonl";

#[tokio::test]
async fn a_terminal_role_refused_on_output_goes_back_to_the_orchestrator_as_in_the_reference() {
    let Some(reference) = loom_testkit::shared::text(REFERENCE_TERMINAL_ROLE) else {
        return;
    };
    let (engine, store) = engine();
    let main = scripted(
        "fake-main",
        json!([
            {"tool_calls": [{"name": "rediger_relance", "arguments": {"ton": "cordial"}}]},
            {"tool_calls": [{"name": "rediger_relance",
                             "arguments": {"ton": "cordial", "consignes": "Cite D-2026-042"}}]}
        ]),
    );
    let role_model = scripted(
        "fake-role",
        json!([
            {"text": "Bonjour Madame Martin, 1 840 €.", "without_text": "Cite"},
            {"text": "Objet : devis D-2026-042. Bonjour Madame Martin.", "with_text": "Cite"}
        ]),
    );
    let mut relance = role("rediger_relance", role_model);
    relance.terminal = true;
    relance.input_schema = json!({"type": "object", "properties": {
        "ton": {"type": "string"}, "consignes": {"type": "string"}
    }});
    let policy = loom_core::policy::FnPolicy::new(
        [loom_core::policy::Point::OnOutput],
        [loom_core::policy::DecisionKind::Retry],
        |subject, _| {
            let loom_core::policy::Subject::Output(message) = subject else {
                return Ok(loom_core::policy::Decision::Continue);
            };
            if message.text().contains("D-2026-042") {
                Ok(loom_core::policy::Decision::Continue)
            } else {
                Ok(loom_core::policy::Decision::Retry {
                    feedback: "cite the quote number; call rediger_relance again".into(),
                    tools: true,
                })
            }
        },
    );
    let mut agent = agent(main, Vec::new(), vec![relance]);
    agent.policies =
        vec![loom_engine::BoundPolicy::new("cite_le_devis", Arc::new(policy)).unwrap()];
    let (run, state) = run(&engine, &agent, begin(Message::user("Relance le client."))).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(
        state.output_text().as_deref(),
        Some("Objet : devis D-2026-042. Bonjour Madame Martin.")
    );

    // From the first role call to the end, the journal has the reference's shape.
    let ours: Vec<String> = events(&store, &run)
        .await
        .iter()
        .skip_while(
            |e| !matches!(&e.payload, Payload::ToolCalled(p) if p.tool_kind == ToolKind::Role),
        )
        .filter(|e| e.event_type != "run.claimed")
        .map(shape)
        .collect();
    let reference: Vec<String> = reference
        .lines()
        .map(|line| Event::from_json(line).unwrap())
        .skip_while(
            |e| !matches!(&e.payload, Payload::ToolCalled(p) if p.tool_kind == ToolKind::Role),
        )
        .map(|e| shape(&e))
        .collect();
    assert_eq!(ours, reference);
}

#[tokio::test]
async fn a_role_out_of_its_own_time_is_an_error_result() {
    let (engine, store) = engine();
    let main = scripted(
        "fake-main",
        json!([{"tool_calls": [{"name": "draft"}]}, {"text": "Late: {{ tool_result }}"}]),
    );
    let hanging = Arc::new(loom_testkit::HangingModel::default());
    let mut draft = role("draft", hanging.clone());
    draft.context = vec![RoleContext::UserInput];
    draft.timeout = Some(std::time::Duration::from_millis(50));
    let agent = agent(main, Vec::new(), vec![draft]);
    let (run, state) = run(&engine, &agent, begin(Message::user("Go."))).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(
        state.output_text().as_deref(),
        Some("Late: Timed out: the role draft gave no answer in 0.05 s.")
    );
    assert_eq!(hanging.calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(
        completed(&events(&store, &run).await, "draft")[0]
            .output
            .is_error
    );
}

#[tokio::test]
async fn a_role_interrupted_by_a_crash_is_run_again_on_resume() {
    let (engine, store) = engine();
    let main = scripted(
        "fake-main",
        json!([{"tool_calls": [{"name": "draft"}]}, {"text": "Sent: {{ tool_result }}"}]),
    );
    let role_model = Arc::new(RecordingModel::new(scripted(
        "fake-role",
        json!([{"text": "a letter"}]),
    )));
    let mut draft = role("draft", role_model.clone());
    draft.context = vec![RoleContext::UserInput];
    let agent = agent(main, Vec::new(), vec![draft]);
    let (run, _) = run(&engine, &agent, begin(Message::user("Go."))).await;

    // The journal as a kill after the role's model answered would have left it.
    let all = events(&store, &run).await;
    let cut = all
        .iter()
        .position(|e| e.role.as_deref() == Some("draft"))
        .unwrap()
        + 1;
    let crashed = Arc::new(MemoryStore::new());
    for event in &all[..cut] {
        let mut fresh = event.clone();
        fresh.seq = 0;
        crashed.append(vec![fresh], event.seq - 1).await.unwrap();
    }
    let later = Arc::new(ManualClock::new());
    later.advance(std::time::Duration::from_secs(120));
    let engine = Engine::new(crashed.clone(), later);
    let state = engine
        .drive(&run, &agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().as_deref(), Some("Sent: a letter"));
    assert_eq!(role_model.requests().len(), 2);
    let events = events(&crashed, &run).await;
    let resumed: Vec<bool> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ToolCalled(p) => Some(p.resumed),
            _ => None,
        })
        .collect();
    assert_eq!(resumed, [false, true]);
    // Both role answers are counted: each was a real model call.
    let role_calls = events
        .iter()
        .filter(|e| e.role.as_deref() == Some("draft"))
        .count();
    assert_eq!(role_calls, 2);
    assert_eq!(state.model_calls, 4);
}

// ---------------------------------------------------------------------------------------------
// A role's judge

/// A judge `draft` of the role `draft` on `model`, one blocking criterion `exact`.
fn role_judge(model: Arc<dyn ModelClient>) -> loom_engine::JudgeRuntime {
    loom_engine::JudgeRuntime::new(
        "draft",
        binding("JUDGE", model),
        vec![loom_engine::Criterion::new("exact", "The amount is 1375.")],
    )
    .unwrap()
}

/// An orchestrator that asks the role `draft` for `{"client": "Martin"}`, then concludes.
fn asks_a_draft() -> Arc<dyn ModelClient> {
    scripted(
        "fake-main",
        json!([
            {"tool_calls": [{"name": "draft", "arguments": {"client": "Martin"}}]},
            {"text": "Done: {{ tool_result }}"}
        ]),
    )
}

#[tokio::test]
async fn a_role_judge_reads_the_calls_arguments_and_the_answer() {
    let (engine, store) = engine();
    let judge_model = Arc::new(RecordingModel::new(scripted(
        "judge-1",
        json!([{"tool_calls": [{"name": "verdict", "arguments": {"criteria": [
            {"name": "exact", "score": 1.0, "reason": "1375"}
        ]}}]}]),
    )));
    let mut draft = role(
        "draft",
        scripted("fake-role", json!([{"text": "Total: 1375."}])),
    );
    draft.input_schema = json!({"type": "object", "properties": {"client": {"type": "string"}}});
    draft.judges = vec![role_judge(judge_model.clone())];
    let agent = agent(asks_a_draft(), Vec::new(), vec![draft]);
    let (run, state) = run(&engine, &agent, begin(Message::user("Draft it."))).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().as_deref(), Some("Done: Total: 1375."));

    let request = &judge_model.requests()[0];
    assert_eq!(request.system, loom_engine::JUDGE_SYSTEM);
    assert_eq!(request.tool_choice, loom_core::model::ToolChoice::Required);
    assert_eq!(request.messages.len(), 1);
    assert_eq!(
        request.messages[0].text(),
        "<criteria>\nexact: The amount is 1375.\n</criteria>\n<arguments>\n{\"client\":\"Martin\"}\n\
         </arguments>\n<output>\nTotal: 1375.\n</output>"
    );
    // The judge's cost counts once in the run, and is restated by the call's result.
    let events = events(&store, &run).await;
    let costs: f64 = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ModelResponded(p) if p.call_id.is_some() => Some(p.cost_usd),
            _ => None,
        })
        .sum();
    let completed = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::ToolCompleted(p) => Some(p.cost_usd),
            _ => None,
        })
        .unwrap();
    assert!(
        costs > 0.0 && (completed - costs).abs() < 1e-12,
        "{completed} vs {costs}"
    );
    assert_eq!(state.model_calls, 4);
    assert_eq!(state.iterations, 2);
}

/// A run whose role `draft` has a judge whose model fails for good, under `on_error`.
async fn with_a_broken_judge(on_error: loom_engine::PolicyOnError) -> (RunState, Vec<Event>) {
    let mut draft = role(
        "draft",
        scripted("fake-role", json!([{"text": "Total: 1375."}])),
    );
    let mut judge = role_judge(scripted("judge-1", json!([{"error": "auth"}])));
    judge.on_error = on_error;
    draft.judges = vec![judge];
    let (engine, store) = engine();
    let agent = agent(asks_a_draft(), Vec::new(), vec![draft]);
    let (run, state) = run(&engine, &agent, begin(Message::user("Draft it."))).await;
    (state, events(&store, &run).await)
}

#[tokio::test]
async fn a_role_judge_that_errs_fails_the_run_unless_allowed() {
    // on_error: block (the default): the call's result is journaled, then the run fails.
    let (state, events) = with_a_broken_judge(loom_engine::PolicyOnError::Block).await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("guard.judge"));
    assert!(
        state
            .error
            .as_deref()
            .unwrap()
            .starts_with("judge draft failed: model.auth: "),
        "{:?}",
        state.error
    );
    let tail: Vec<&str> = events[events.len() - 6..]
        .iter()
        .map(|e| e.event_type.as_str())
        .collect();
    assert_eq!(
        tail,
        [
            "guard.checked",
            "policy.decided",
            "tool.completed",
            "step.completed",
            "run.transitioned",
            "run.failed"
        ]
    );

    // on_error: allow: the answer goes through, with a `skipped` trace naming the error.
    let (state, events) = with_a_broken_judge(loom_engine::PolicyOnError::Allow).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().as_deref(), Some("Done: Total: 1375."));
    let checked = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::GuardChecked(g) => Some(g.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        (checked.outcome.as_str(), checked.target.as_str()),
        ("skipped", "role:draft")
    );
    assert!(
        checked
            .reason
            .as_deref()
            .unwrap()
            .starts_with("judge_error: model.auth: ")
    );
}
