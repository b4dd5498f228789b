//! Policies at the five points of the loop, and output contracts, end to end on the memory
//! journal: every decision but `continue` is journaled before its effect, and the effect is
//! what the reference's table says.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use loom_core::{
    Event, Message, RunState, RunStatus,
    event::Payload,
    model::{ModelChunk, ModelClient, ModelError, ModelRequest, StopReason, ToolChoice},
    policy::{
        Decision, DecisionKind, FnPolicy, Point, Policy, PolicyContext, PolicyError, Replacement,
        RequireTool, Subject,
    },
    ports::EventStore,
    tool::{FnTool, ToolOutput},
};
use loom_engine::{
    AgentRuntime, BeginRun, BoundPolicy, BoundTool, Engine, ModelBinding, PolicyOnError, RunRef,
    contract::{Contract, ContractSpec, OnFailure, RepairSettings, RepairTools},
};
use loom_journal::MemoryStore;
use loom_testkit::{ManualClock, RecordingModel, add_tool, scripted};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

fn agent(model: Arc<dyn ModelClient>, tools: Vec<FnTool>) -> AgentRuntime {
    let mut agent = AgentRuntime::new(
        "demo",
        "You are an assistant.",
        ModelBinding::new("FAKE", "fake-1", model),
    );
    agent.tools = tools
        .into_iter()
        .map(|t| BoundTool::declared(Arc::new(t)).unwrap())
        .collect();
    agent
}

fn hook(name: &str, policy: impl Policy + 'static) -> BoundPolicy {
    BoundPolicy::new(name, Arc::new(policy)).unwrap()
}

fn policy(
    point: Point,
    decisions: &[DecisionKind],
    decide: impl Fn(&Subject, &PolicyContext) -> Result<Decision, PolicyError> + Send + Sync + 'static,
) -> FnPolicy {
    FnPolicy::new(vec![point], decisions.to_vec(), decide)
}

async fn run(agent: &AgentRuntime, message: &str) -> (RunState, Vec<Event>, RunRef, Engine) {
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::new(store.clone(), Arc::new(ManualClock::new()));
    let run = engine
        .begin(
            agent,
            BeginRun {
                tenant_id: "default".into(),
                session_id: None,
                run_id: None,
                user_id: None,
                metadata: Map::new(),
                message: Message::user(message),
                budget: None,
                attachments: Vec::new(),
                judges: Default::default(),
                trigger: None,
                state: Default::default(),
            },
            &(),
        )
        .await
        .unwrap();
    let state = engine
        .drive(&run, agent, &(), &CancellationToken::new())
        .await
        .unwrap();
    let events = store
        .read(&run.tenant_id, &run.session_id, 0)
        .await
        .unwrap();
    (state, events, run, engine)
}

fn types(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.event_type.as_str()).collect()
}

fn decisions(events: &[Event]) -> Vec<(String, String, String)> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::PolicyDecided(p) => {
                Some((p.policy.clone(), p.point.clone(), p.decision.clone()))
            }
            _ => None,
        })
        .collect()
}

fn completed_outputs(events: &[Event]) -> Vec<ToolOutput> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ToolCompleted(p) => Some(p.output.clone()),
            _ => None,
        })
        .collect()
}

fn position(events: &[Event], event_type: &str) -> usize {
    events
        .iter()
        .position(|e| e.event_type == event_type)
        .unwrap_or_else(|| panic!("no {event_type} in {:?}", types(events)))
}

fn calc_script() -> Value {
    json!([
        {"text": "I compute.", "tool_calls": [{"name": "add", "arguments": {"a": 12, "b": 7}}]},
        {"text": "It makes {{ tool_result }}."}
    ])
}

/// A tool that echoes its arguments.
fn echo_tool() -> FnTool {
    FnTool::new(
        loom_core::tool::ToolSpec {
            name: "lookup".into(),
            description: "Looks a quote up.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"numero": {"type": "string"}},
                "required": ["numero"],
                "additionalProperties": false
            }),
            kind: loom_core::tool::ToolKind::Python,
            declarations: Default::default(),
        },
        |_, args| {
            Box::pin(async move { Ok(ToolOutput::text(format!("found {}", args["numero"]))) })
        },
    )
}

// ---------------------------------------------------------------------------------------------
// before_model

#[tokio::test]
async fn require_tool_forces_a_tool_call_until_one_was_made() {
    let model = Arc::new(RecordingModel::new(scripted("fake-1", calc_script())));
    let mut agent = agent(model.clone(), vec![add_tool()]);
    agent.policies = vec![hook(loom_core::policy::REQUIRE_TOOL, RequireTool)];
    let (state, events, ..) = run(&agent, "12 + 7?").await;
    assert_eq!(state.status, RunStatus::Completed);
    let choices: Vec<ToolChoice> = model.requests().iter().map(|r| r.tool_choice).collect();
    assert_eq!(choices, [ToolChoice::Required, ToolChoice::Auto]);
    assert_eq!(
        decisions(&events),
        [(
            "loom.require_tool".into(),
            "before_model".into(),
            "replace".into()
        )]
    );
    // Journaled inside the model step, before the answer.
    assert!(position(&events, "policy.decided") < position(&events, "model.responded"));
    assert_eq!(
        events[position(&events, "policy.decided")].status,
        loom_core::EventStatus::Ok
    );
}

#[tokio::test]
async fn a_stop_before_the_model_makes_the_run_finish_without_tools() {
    let model = scripted(
        "fake-1",
        json!([{"text": "I compute.", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}], "forced": "I stop here."}]),
    );
    let mut agent = agent(model, vec![add_tool()]);
    agent.policies = vec![hook(
        "quota",
        policy(Point::BeforeModel, &[DecisionKind::Stop], |_, ctx| {
            Ok(if ctx.iterations == 0 {
                Decision::Stop("no more calls today".into())
            } else {
                Decision::Continue
            })
        }),
    )];
    let (state, events, ..) = run(&agent, "1 + 2?").await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().as_deref(), Some("I stop here."));
    let transitions: Vec<(RunStatus, RunStatus)> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::RunTransitioned(t) => Some((t.from_state, t.to_state)),
            _ => None,
        })
        .collect();
    assert_eq!(
        transitions,
        [
            (RunStatus::ReadyForModel, RunStatus::Finalizing),
            (RunStatus::Finalizing, RunStatus::Completed)
        ]
    );
    assert_eq!(
        decisions(&events),
        [("quota".into(), "before_model".into(), "stop".into())]
    );
}

#[tokio::test]
async fn a_fail_before_the_model_fails_the_run_with_the_policy_named() {
    let mut agent = agent(scripted("fake-1", calc_script()), vec![add_tool()]);
    agent.policies = vec![hook(
        "closed",
        policy(Point::BeforeModel, &[DecisionKind::Fail], |_, _| {
            Ok(Decision::Fail("the shop is closed".into()))
        }),
    )];
    let (state, events, ..) = run(&agent, "hello").await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("policy.closed"));
    assert_eq!(state.error.as_deref(), Some("the shop is closed"));
    assert!(!types(&events).contains(&"model.responded"));
    let decided = &events[position(&events, "policy.decided")];
    assert_eq!(decided.status, loom_core::EventStatus::Error);
}

// ---------------------------------------------------------------------------------------------
// after_model

#[tokio::test]
async fn a_retry_after_the_model_closes_its_calls_and_asks_for_a_repair() {
    let model = Arc::new(RecordingModel::new(scripted(
        "fake-1",
        json!([
            {"text": "Sure.", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]},
            {"text": "Let me compute properly.", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]},
            {"text": "It makes {{ tool_result }}."}
        ]),
    )));
    let mut agent = agent(model.clone(), vec![add_tool()]);
    agent.policies = vec![hook(
        "no_sure",
        policy(Point::AfterModel, &[DecisionKind::Retry], |subject, _| {
            Ok(if subject.text().starts_with("Sure") {
                Decision::Retry {
                    feedback: "do not start with 'Sure'".into(),
                    tools: true,
                }
            } else {
                Decision::Continue
            })
        }),
    )];
    let (state, events, ..) = run(&agent, "1 + 2?").await;
    assert_eq!(state.status, RunStatus::Completed, "{:?}", types(&events));
    assert_eq!(state.output_text().as_deref(), Some("It makes 3."));
    let outputs = completed_outputs(&events);
    assert!(outputs[0].is_error);
    assert_eq!(
        outputs[0].visible_text(),
        "Not run: the answer was refused by the check no_sure."
    );
    let repair = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::MessageUser(m) if m.kind == "repair" => Some(m.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(repair.policy.as_deref(), Some("no_sure"));
    assert_eq!(
        repair.message.text(),
        "Answer refused by a check (no_sure): do not start with 'Sure'"
    );
    // The decision precedes the repair, which precedes the next model call.
    let repair_at = events
        .iter()
        .position(|e| matches!(&e.payload, Payload::MessageUser(m) if m.kind == "repair"))
        .unwrap();
    assert!(position(&events, "policy.decided") < repair_at);
    let second = &model.requests()[1];
    assert_eq!(
        second.messages.last().unwrap().text(),
        "Answer refused by a check (no_sure): do not start with 'Sure'"
    );
    // Only one add ran for real (the refused call never did).
    assert_eq!(
        types(&events)
            .iter()
            .filter(|t| **t == "tool.called")
            .count(),
        1
    );
}

#[tokio::test]
async fn a_retry_beyond_max_attempts_fails_the_run() {
    let mut agent = agent(
        scripted(
            "fake-1",
            json!([{"text": "Sure."}, {"text": "Sure again."}]),
        ),
        vec![],
    );
    agent.policies = vec![hook(
        "no_sure",
        policy(Point::AfterModel, &[DecisionKind::Retry], |_, _| {
            Ok(Decision::Retry {
                feedback: "not like this".into(),
                tools: false,
            })
        }),
    )];
    let (state, events, ..) = run(&agent, "hi").await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("policy.no_sure"));
    assert!(
        state
            .error
            .as_deref()
            .unwrap()
            .contains("1 repair(s) asked without success; last diagnostic: not like this")
    );
    assert_eq!(
        decisions(&events),
        [
            ("no_sure".into(), "after_model".into(), "retry".into()),
            ("no_sure".into(), "after_model".into(), "fail".into())
        ]
    );
}

#[tokio::test]
async fn a_repair_without_tools_forbids_tool_calls_on_the_next_call() {
    let model = Arc::new(RecordingModel::new(scripted(
        "fake-1",
        json!([
            {"text": "Sure."},
            {"text": "Fine."}
        ]),
    )));
    let mut agent = agent(model.clone(), vec![add_tool()]);
    agent.policies = vec![hook(
        "no_sure",
        policy(Point::AfterModel, &[DecisionKind::Retry], |subject, _| {
            Ok(if subject.text() == "Sure." {
                Decision::Retry {
                    feedback: "rephrase".into(),
                    tools: false,
                }
            } else {
                Decision::Continue
            })
        }),
    )];
    let (state, ..) = run(&agent, "hi").await;
    assert_eq!(state.output_text().as_deref(), Some("Fine."));
    let choices: Vec<ToolChoice> = model.requests().iter().map(|r| r.tool_choice).collect();
    assert_eq!(choices, [ToolChoice::Auto, ToolChoice::None]);
}

#[tokio::test]
async fn a_stop_after_the_model_closes_the_calls_and_finalizes() {
    let model = scripted(
        "fake-1",
        json!([
            {"text": "I compute.", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]},
            {"text": "Done without computing."}
        ]),
    );
    let mut agent = agent(model, vec![add_tool()]);
    agent.policies = vec![hook(
        "enough",
        policy(Point::AfterModel, &[DecisionKind::Stop], |_, ctx| {
            Ok(if ctx.iterations == 1 {
                Decision::Stop("enough tools".into())
            } else {
                Decision::Continue
            })
        }),
    )];
    let (state, events, ..) = run(&agent, "1 + 2?").await;
    assert_eq!(state.status, RunStatus::Completed, "{:?}", types(&events));
    assert_eq!(
        state.output_text().as_deref(),
        Some("Done without computing.")
    );
    assert_eq!(
        completed_outputs(&events)[0].visible_text(),
        "Not run: the run was stopped (enough tools)."
    );
    assert!(!types(&events).contains(&"tool.called"));
}

// ---------------------------------------------------------------------------------------------
// before_tool

fn lookup_script(numero: &str) -> Value {
    json!([
        {"text": "Looking.", "tool_calls": [{"name": "lookup", "arguments": {"numero": numero}}]},
        {"text": "Result: {{ tool_result }}"}
    ])
}

#[tokio::test]
async fn a_deny_before_the_tool_gives_the_model_the_reason_and_runs_nothing() {
    let mut agent = agent(scripted("fake-1", lookup_script("42")), vec![echo_tool()]);
    agent.policies = vec![hook(
        "numero_devis",
        policy(Point::BeforeTool, &[DecisionKind::Deny], |subject, _| {
            let Subject::Call { arguments, .. } = subject else {
                return Ok(Decision::Continue);
            };
            Ok(if arguments["numero"].as_str().unwrap().starts_with("D-") {
                Decision::Continue
            } else {
                Decision::Deny("malformed quote number: '42' (expected D-YYYY-NNN)".into())
            })
        }),
    )];
    let (state, events, ..) = run(&agent, "find 42").await;
    assert_eq!(state.status, RunStatus::Completed);
    assert!(!types(&events).contains(&"tool.called"));
    let output = &completed_outputs(&events)[0];
    assert!(output.is_error);
    assert_eq!(
        output.visible_text(),
        "Call refused (numero_devis): malformed quote number: '42' (expected D-YYYY-NNN)"
    );
    let decided = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::PolicyDecided(p) => Some(p.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(decided.call_id.as_deref(), Some("fake_0_0"));
    assert!(position(&events, "policy.decided") < position(&events, "tool.completed"));
}

#[tokio::test]
async fn a_replace_before_the_tool_runs_it_with_the_new_arguments_and_keeps_the_models_in_the_journal()
 {
    let model = Arc::new(RecordingModel::new(scripted(
        "fake-1",
        lookup_script(" d-2026-042 "),
    )));
    let mut agent = agent(model.clone(), vec![echo_tool()]);
    agent.policies = vec![hook(
        "numero_devis",
        policy(Point::BeforeTool, &[DecisionKind::Replace], |subject, _| {
            let Subject::Call { arguments, .. } = subject else {
                return Ok(Decision::Continue);
            };
            let raw = arguments["numero"].as_str().unwrap();
            let clean = raw.trim().to_uppercase();
            Ok(if clean == raw {
                Decision::Continue
            } else {
                Decision::replace(
                    Replacement::Arguments(json!({"numero": clean})),
                    format!("'{raw}' → '{clean}'"),
                )
            })
        }),
    )];
    let (state, events, ..) = run(&agent, "find it").await;
    assert_eq!(
        state.output_text().as_deref(),
        Some("Result: found \"D-2026-042\"")
    );
    let called = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::ToolCalled(p) => Some(p.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(called.arguments, json!({"numero": " d-2026-042 "}));
    let decided = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::PolicyDecided(p) => Some(p.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(decided.arguments, Some(json!({"numero": "D-2026-042"})));
    // The model's next request shows the call as it ran.
    let second = &model.requests()[1];
    let shown = second
        .messages
        .iter()
        .flat_map(|m| m.tool_calls())
        .map(|(_, _, args)| args.clone())
        .next()
        .unwrap();
    assert_eq!(shown, json!({"numero": "D-2026-042"}));
}

#[tokio::test]
async fn a_pause_before_the_tool_asks_a_human_with_the_policy_named() {
    let mut agent = agent(
        scripted("fake-1", lookup_script("D-2026-042")),
        vec![echo_tool()],
    );
    agent.policies = vec![hook(
        "big_amounts",
        policy(Point::BeforeTool, &[DecisionKind::Pause], |_, _| {
            Ok(Decision::Pause("amount above 1,000 €".into()))
        }),
    )];
    let (state, events, ..) = run(&agent, "find it").await;
    assert_eq!(state.status, RunStatus::Paused);
    let requested = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::ApprovalRequested(p) => Some(p.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(requested.policy.as_deref(), Some("big_amounts"));
    assert_eq!(requested.reason, "amount above 1,000 €");
    assert!(!types(&events).contains(&"tool.called"));
}

#[tokio::test]
async fn a_fail_before_the_tool_fails_the_run() {
    let mut agent = agent(scripted("fake-1", lookup_script("D-1")), vec![echo_tool()]);
    agent.policies = vec![hook(
        "forbidden",
        policy(Point::BeforeTool, &[DecisionKind::Fail], |_, _| {
            Ok(Decision::Fail("lookups are forbidden".into()))
        }),
    )];
    let (state, events, ..) = run(&agent, "find it").await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("policy.forbidden"));
    assert!(!types(&events).contains(&"tool.called"));
    let step_end = events
        .iter()
        .rev()
        .find_map(|e| match &e.payload {
            Payload::StepCompleted(s) => Some(s.outcome),
            _ => None,
        })
        .unwrap();
    assert_eq!(step_end, loom_core::event::Outcome::Error);
}

// ---------------------------------------------------------------------------------------------
// after_tool

#[tokio::test]
async fn a_replace_after_the_tool_changes_what_the_model_sees() {
    let mut agent = agent(scripted("fake-1", calc_script()), vec![add_tool()]);
    agent.policies = vec![hook(
        "rounding",
        policy(Point::AfterTool, &[DecisionKind::Replace], |subject, _| {
            let Subject::Result { output, .. } = subject else {
                return Ok(Decision::Continue);
            };
            Ok(Decision::replace(
                Replacement::Output(ToolOutput::text(format!(
                    "{} (checked)",
                    output.visible_text()
                ))),
                "annotated",
            ))
        }),
    )];
    let (state, events, ..) = run(&agent, "12 + 7?").await;
    assert_eq!(
        state.output_text().as_deref(),
        Some("It makes 19 (checked).")
    );
    assert_eq!(completed_outputs(&events)[0].visible_text(), "19 (checked)");
    assert!(position(&events, "policy.decided") < position(&events, "tool.completed"));
}

#[tokio::test]
async fn a_retry_after_a_plain_tool_becomes_an_error_result() {
    let mut agent = agent(scripted("fake-1", calc_script()), vec![add_tool()]);
    agent.policies = vec![hook(
        "sanity",
        policy(Point::AfterTool, &[DecisionKind::Retry], |_, _| {
            Ok(Decision::Retry {
                feedback: "the total looks wrong".into(),
                tools: true,
            })
        }),
    )];
    let (_, events, ..) = run(&agent, "12 + 7?").await;
    let output = &completed_outputs(&events)[0];
    assert!(output.is_error);
    assert_eq!(
        output.visible_text(),
        "Result refused (sanity): the total looks wrong"
    );
}

#[tokio::test]
async fn a_fail_after_the_tool_fails_the_run_after_journaling_the_result() {
    let mut agent = agent(scripted("fake-1", calc_script()), vec![add_tool()]);
    agent.policies = vec![hook(
        "audit",
        policy(Point::AfterTool, &[DecisionKind::Fail], |_, _| {
            Ok(Decision::Fail("suspicious result".into()))
        }),
    )];
    let (state, events, ..) = run(&agent, "12 + 7?").await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("policy.audit"));
    assert!(position(&events, "policy.decided") < position(&events, "tool.completed"));
    assert!(position(&events, "tool.completed") < position(&events, "run.failed"));
}

// ---------------------------------------------------------------------------------------------
// on_output

#[tokio::test]
async fn a_replace_on_output_changes_the_final_answer() {
    let mut agent = agent(
        scripted("fake-1", json!([{"text": "Total: 1840 EUR"}])),
        vec![],
    );
    agent.policies = vec![hook(
        "signature",
        policy(Point::OnOutput, &[DecisionKind::Replace], |subject, _| {
            Ok(Decision::replace(
                Replacement::Message(Message::assistant(format!("{}\n-- Loom", subject.text()))),
                "signed",
            ))
        }),
    )];
    let (state, events, ..) = run(&agent, "total?").await;
    assert_eq!(
        state.output_text().as_deref(),
        Some("Total: 1840 EUR\n-- Loom")
    );
    let decided = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::PolicyDecided(p) => Some(p.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(decided.point, "on_output");
    assert!(decided.output.is_some());
}

#[tokio::test]
async fn a_retry_on_output_sends_the_answer_back_then_completes() {
    let mut agent = agent(
        scripted(
            "fake-1",
            json!([
                {"text": "1840"},
                {"text": "The total is 1840 EUR."}
            ]),
        ),
        vec![],
    );
    agent.policies = vec![hook(
        "sentence",
        policy(Point::OnOutput, &[DecisionKind::Retry], |subject, _| {
            Ok(if subject.text().ends_with('.') {
                Decision::Continue
            } else {
                Decision::Retry {
                    feedback: "answer with a sentence".into(),
                    tools: true,
                }
            })
        }),
    )];
    let (state, events, ..) = run(&agent, "total?").await;
    assert_eq!(
        state.output_text().as_deref(),
        Some("The total is 1840 EUR.")
    );
    assert_eq!(state.iterations, 2);
    assert_eq!(
        decisions(&events),
        [("sentence".into(), "on_output".into(), "retry".into())]
    );
}

// ---------------------------------------------------------------------------------------------
// Errors of policies

fn erring(point: Point) -> FnPolicy {
    policy(point, &[], |_, _| {
        Err(PolicyError("lookup table missing".into()))
    })
}

#[tokio::test]
async fn a_failing_policy_blocks_the_run_by_default() {
    let mut agent = agent(scripted("fake-1", json!([{"text": "Hi."}])), vec![]);
    agent.policies = vec![hook("broken", erring(Point::OnOutput))];
    let (state, events, ..) = run(&agent, "hi").await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("policy.broken"));
    assert_eq!(
        state.error.as_deref(),
        Some("policy broken failed: lookup table missing")
    );
    let decided = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::PolicyDecided(p) => Some(p.clone()),
            _ => None,
        })
        .unwrap();
    assert!(decided.error);
    assert_eq!(decided.decision, "fail");
}

#[tokio::test]
async fn a_failing_policy_allowed_by_on_error_is_journaled_and_the_run_goes_on() {
    let mut agent = agent(scripted("fake-1", json!([{"text": "Hi."}])), vec![]);
    let mut bound = hook("broken", erring(Point::OnOutput));
    bound.on_error = PolicyOnError::Allow;
    agent.policies = vec![bound];
    let (state, events, ..) = run(&agent, "hi").await;
    assert_eq!(state.status, RunStatus::Completed);
    let decided = &events[position(&events, "policy.decided")];
    assert_eq!(decided.status, loom_core::EventStatus::Warning);
    let Payload::PolicyDecided(p) = &decided.payload else {
        unreachable!()
    };
    assert!(p.error);
    assert_eq!(p.decision, "continue");
}

#[tokio::test]
async fn a_policy_out_of_time_is_an_error() {
    struct Slow;
    impl Policy for Slow {
        fn points(&self) -> &[Point] {
            &[Point::OnOutput]
        }
        fn decisions(&self) -> &[DecisionKind] {
            &[DecisionKind::Continue]
        }
        fn decide<'a>(
            &'a self,
            _: &'a Subject,
            _: &'a PolicyContext,
        ) -> loom_core::BoxFuture<'a, Result<Decision, PolicyError>> {
            Box::pin(async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok(Decision::Continue)
            })
        }
    }
    let mut agent = agent(scripted("fake-1", json!([{"text": "Hi."}])), vec![]);
    let mut bound = hook("slow", Slow);
    bound.timeout = Some(Duration::from_millis(20));
    agent.policies = vec![bound];
    let (state, ..) = run(&agent, "hi").await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(
        state.error.as_deref(),
        Some("policy slow failed: no decision in 0.02 s")
    );
}

#[tokio::test]
async fn an_undeclared_decision_is_an_error_of_the_policy() {
    let mut agent = agent(scripted("fake-1", json!([{"text": "Hi."}])), vec![]);
    // Declares only `continue`, answers `retry`.
    agent.policies = vec![hook(
        "sneaky",
        policy(Point::OnOutput, &[], |_, _| {
            Ok(Decision::Retry {
                feedback: "again".into(),
                tools: true,
            })
        }),
    )];
    let (state, ..) = run(&agent, "hi").await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(
        state.error.as_deref(),
        Some("policy sneaky failed: it returned 'retry', which it does not declare")
    );
}

#[test]
fn a_decision_not_allowed_at_its_point_is_refused_when_hooked() {
    let deny_after_model = policy(Point::AfterModel, &[DecisionKind::Deny], |_, _| {
        Ok(Decision::Continue)
    });
    let error = BoundPolicy::new("p", Arc::new(deny_after_model)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "policy 'p' may decide 'deny', which is not allowed at after_model"
    );
    let error = BoundPolicy::on("r", Arc::new(RequireTool), vec![Point::AfterTool]).unwrap_err();
    assert_eq!(
        error.to_string(),
        "policy 'r' does not apply to after_tool (declared points: before_model)"
    );
}

// ---------------------------------------------------------------------------------------------
// Output contracts

fn contract(spec: ContractSpec) -> Contract {
    Contract::new(spec).unwrap()
}

fn total_schema() -> ContractSpec {
    ContractSpec {
        schema: Some(json!({
            "type": "object",
            "properties": {"total": {"type": "integer"}},
            "required": ["total"]
        })),
        ..ContractSpec::default()
    }
}

#[tokio::test]
async fn a_contract_failing_then_repaired_gives_the_validated_data() {
    let model = Arc::new(RecordingModel::new(scripted(
        "fake-1",
        json!([
            {"text": "The total is ten."},
            {"text": "```json\n{\"total\": 10}\n```"}
        ]),
    )));
    let mut agent = agent(model.clone(), vec![add_tool()]);
    agent.output = Some(contract(total_schema()));
    let (state, events, ..) = run(&agent, "total?").await;
    assert_eq!(state.status, RunStatus::Completed, "{:?}", types(&events));
    assert_eq!(state.output_data, Some(json!({"total": 10})));
    assert_eq!(state.output_text().as_deref(), Some("{\"total\": 10}"));
    let guards: Vec<(String, Option<String>, bool)> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::GuardChecked(g) => {
                Some((g.outcome.clone(), g.resolution.clone(), g.normalized))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        guards,
        [
            ("failed".into(), Some("retry".into()), false),
            ("passed".into(), None, true)
        ]
    );
    assert_eq!(
        decisions(&events),
        [
            ("loom.contract".into(), "on_output".into(), "retry".into()),
            ("loom.contract".into(), "on_output".into(), "replace".into())
        ]
    );
    // The repair went without tools (repair.tools: auto) and told the model what to fix.
    let second = &model.requests()[1];
    assert_eq!(second.tool_choice, ToolChoice::None);
    let diagnostic = second.messages.last().unwrap().text();
    assert!(diagnostic.starts_with("Answer refused by a check (loom.contract): "));
    assert!(diagnostic.contains("Expected JSON Schema"));
}

async fn failing_contract(on_failure: OnFailure) -> (RunState, Vec<Event>) {
    let mut agent = agent(
        scripted(
            "fake-1",
            json!([
                {"text": "ten"},
                {"text": "still ten"}
            ]),
        ),
        vec![],
    );
    agent.output = Some(contract(ContractSpec {
        on_failure,
        fallback_message: Some("Sorry, I cannot answer reliably.".into()),
        repair: RepairSettings {
            max_attempts: 1,
            tools: RepairTools::Auto,
        },
        ..total_schema()
    }));
    let (state, events, ..) = run(&agent, "total?").await;
    (state, events)
}

#[tokio::test]
async fn a_contract_still_failing_after_its_repairs_fails_the_run() {
    let (state, events) = failing_contract(OnFailure::Fail).await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("guard.contract"));
    assert!(
        state
            .error
            .as_deref()
            .unwrap()
            .starts_with("the final answer does not meet its contract: ")
    );
    let last_guard = events
        .iter()
        .rev()
        .find(|e| e.event_type == "guard.checked")
        .unwrap();
    assert_eq!(last_guard.status, loom_core::EventStatus::Error);
}

#[tokio::test]
async fn a_contract_failing_with_unverified_completes_flagged() {
    let (state, events) = failing_contract(OnFailure::Unverified).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().as_deref(), Some("still ten"));
    let completed = events.last().unwrap();
    assert_eq!(completed.status, loom_core::EventStatus::Warning);
    assert_eq!(completed.facets.get("unverified"), Some(&json!(true)));
}

#[tokio::test]
async fn a_contract_failing_with_fallback_answers_the_fallback_message() {
    let (state, events) = failing_contract(OnFailure::Fallback).await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(
        state.output_text().as_deref(),
        Some("Sorry, I cannot answer reliably.")
    );
    let completed = events.last().unwrap();
    assert_eq!(completed.facets.get("fallback"), Some(&json!(true)));
}

#[tokio::test]
async fn a_tool_result_breaking_its_contract_reaches_the_model_as_an_error() {
    let tool = {
        let declarations = Default::default();
        BoundTool::new(Arc::new(add_tool()), declarations, "Adds.".into())
            .unwrap()
            .with_contract(contract(ContractSpec {
                max_chars: Some(1),
                ..ContractSpec::default()
            }))
    };
    let mut agent = agent(scripted("fake-1", calc_script()), vec![]);
    agent.tools = vec![tool];
    let (state, events, ..) = run(&agent, "12 + 7?").await;
    assert_eq!(state.status, RunStatus::Completed);
    let output = &completed_outputs(&events)[0];
    assert!(output.is_error);
    assert!(
        output
            .visible_text()
            .starts_with("The result of add was refused by its output contract (a rule of the configuration, not a failure): ")
    );
    let guard = events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::GuardChecked(g) => Some(g.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(guard.target, "tool:add");
    assert_eq!(guard.call_id.as_deref(), Some("fake_0_0"));
    // A tool is never repaired: a single call ran.
    assert_eq!(
        types(&events)
            .iter()
            .filter(|t| **t == "tool.called")
            .count(),
        1
    );
}

/// A model that names every call `c1`, as a provider may across turns: "Sure." with a call,
/// then "Computing." with a call, then the sum.
#[derive(Debug)]
struct SameCallId;

impl ModelClient for SameCallId {
    fn provider(&self) -> &str {
        "test"
    }

    fn stream(
        &self,
        request: &ModelRequest,
    ) -> loom_core::BoxStream<'static, Result<ModelChunk, ModelError>> {
        let turn = request
            .messages
            .iter()
            .filter(|m| m.role == loom_core::Role::Assistant)
            .count();
        let mut chunks = Vec::new();
        let (text, call) = match turn {
            0 => ("Sure.", true),
            1 => ("Computing.", true),
            _ => ("It makes 3.", false),
        };
        chunks.push(Ok(ModelChunk::TextDelta(text.into())));
        if call {
            chunks.push(Ok(ModelChunk::ToolCallStarted {
                index: 0,
                call_id: "c1".into(),
                name: "add".into(),
            }));
            chunks.push(Ok(ModelChunk::ToolArgsDelta {
                index: 0,
                json_fragment: r#"{"a": 1, "b": 2}"#.into(),
            }));
            chunks.push(Ok(ModelChunk::ToolCallEnded { index: 0 }));
        }
        chunks.push(Ok(ModelChunk::Stopped {
            reason: if call {
                StopReason::ToolUse
            } else {
                StopReason::End
            },
            model_id: "same-id".into(),
        }));
        Box::pin(futures_util::stream::iter(chunks))
    }
}

#[tokio::test]
async fn a_call_id_the_model_reuses_in_the_run_is_renamed() {
    // After a repair the model's second call reuses `c1`, which already names the refused call.
    let mut agent = agent(Arc::new(SameCallId), vec![add_tool()]);
    agent.policies = vec![hook(
        "no_sure",
        policy(Point::AfterModel, &[DecisionKind::Retry], |subject, _| {
            Ok(if subject.text().starts_with("Sure") {
                Decision::Retry {
                    feedback: "no".into(),
                    tools: true,
                }
            } else {
                Decision::Continue
            })
        }),
    )];
    let (state, events, ..) = run(&agent, "1 + 2?").await;
    assert_eq!(state.status, RunStatus::Completed);
    let ids: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ToolCompleted(p) => Some(p.call_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, ["c1", "c1_2"]);
}

#[tokio::test]
async fn a_panicking_policy_is_an_error_of_the_policy_not_of_the_run() {
    let mut agent = agent(scripted("fake-1", json!([{"text": "Hi."}])), vec![]);
    agent.policies = vec![hook(
        "fragile",
        policy(Point::OnOutput, &[], |_, _| {
            panic!("lookup table corrupted")
        }),
    )];
    let (state, ..) = run(&agent, "hi").await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(
        state.error.as_deref(),
        Some("policy fragile failed: it stopped abnormally: lookup table corrupted")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_synchronous_policy_is_cut_by_its_timeout() {
    let mut agent = agent(scripted("fake-1", json!([{"text": "Hi."}])), vec![]);
    let mut bound = hook(
        "sluggish",
        policy(Point::OnOutput, &[], |_, _| {
            std::thread::sleep(Duration::from_millis(1500));
            Ok(Decision::Continue)
        }),
    );
    bound.timeout = Some(Duration::from_millis(50));
    agent.policies = vec![bound];
    let (state, ..) = run(&agent, "hi").await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(
        state.error.as_deref(),
        Some("policy sluggish failed: no decision in 0.05 s")
    );
}

#[tokio::test]
async fn a_replacement_of_the_wrong_shape_is_an_error_of_the_policy() {
    let mut agent = agent(scripted("fake-1", json!([{"text": "Hi."}])), vec![]);
    agent.policies = vec![hook(
        "sloppy",
        policy(Point::OnOutput, &[DecisionKind::Replace], |_, _| {
            Ok(Decision::replace(
                Replacement::Message(Message::user("not an answer")),
                "oops",
            ))
        }),
    )];
    let (state, events, ..) = run(&agent, "hi").await;
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(
        state.error.as_deref(),
        Some("policy sloppy failed: a replacement answer must be an assistant message")
    );
    // The bad value never reached the journal.
    assert!(
        decisions(&events)
            .iter()
            .all(|(_, _, decision)| decision != "replace")
    );
}

#[tokio::test]
async fn a_stop_after_a_final_answer_keeps_it() {
    let model = Arc::new(RecordingModel::new(scripted(
        "fake-1",
        json!([{"text": "The total is 19."}]),
    )));
    let mut agent = agent(model.clone(), vec![add_tool()]);
    agent.policies = vec![hook(
        "enough",
        policy(Point::AfterModel, &[DecisionKind::Stop], |_, _| {
            Ok(Decision::Stop("enough".into()))
        }),
    )];
    let (state, ..) = run(&agent, "12 + 7?").await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output_text().as_deref(), Some("The total is 19."));
    // No extra generation to finalize an answer that was already final.
    assert_eq!(model.requests().len(), 1);
}

#[tokio::test]
async fn time_spent_in_decisions_counts_in_the_run_timeout() {
    struct Slow;
    impl Policy for Slow {
        fn points(&self) -> &[Point] {
            &[Point::AfterModel]
        }
        fn decisions(&self) -> &[DecisionKind] {
            &[DecisionKind::Continue]
        }
        fn decide<'a>(
            &'a self,
            _: &'a Subject,
            _: &'a PolicyContext,
        ) -> loom_core::BoxFuture<'a, Result<Decision, PolicyError>> {
            Box::pin(async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(Decision::Continue)
            })
        }
    }
    let mut agent = agent(scripted("fake-1", calc_script()), vec![add_tool()]);
    agent.timeout = Some(Duration::from_millis(250));
    agent.policies = vec![hook("slow", Slow)];
    let (state, events, ..) = run(&agent, "12 + 7?").await;
    // The review of the first answer took longer than the whole run may: the tool batch
    // never starts.
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error_type.as_deref(), Some("timeout"));
    assert!(!types(&events).contains(&"tool.called"));
}

/// The output contract's schema goes with the request (`output_schema`) only when the call
/// cannot use tools, as the reference does: not while tools are offered with `auto`, but on the
/// finalizing call (`tool_choice: none`) and on a call of an agent without tools.
#[tokio::test]
async fn the_contract_schema_is_sent_only_when_the_call_cannot_use_tools() {
    let model = Arc::new(RecordingModel::new(scripted(
        "fake-1",
        json!([
            {"tool_calls": [{"name": "add", "arguments": {"a": 4, "b": 6}}]},
            {"text": "{\"total\": 10}"}
        ]),
    )));
    let mut with_tools = agent(model.clone(), vec![add_tool()]);
    with_tools.output = Some(contract(total_schema()));
    with_tools.max_iterations = 1;
    let (state, _, _, _) = run(&with_tools, "4 + 6 ?").await;
    assert_eq!(state.status, RunStatus::Completed);
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].tool_choice, ToolChoice::Auto);
    assert_eq!(requests[0].output_schema, None);
    assert_eq!(requests[1].tool_choice, ToolChoice::None);
    assert_eq!(
        requests[1].output_schema.as_ref(),
        total_schema().schema.as_ref()
    );

    let model = Arc::new(RecordingModel::new(scripted(
        "fake-1",
        json!([{"text": "{\"total\": 10}"}]),
    )));
    let mut without_tools = agent(model.clone(), Vec::new());
    without_tools.output = Some(contract(total_schema()));
    let (state, _, _, _) = run(&without_tools, "4 + 6 ?").await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(
        model.requests()[0].output_schema.as_ref(),
        total_schema().schema.as_ref()
    );

    // No contract schema, nothing sent.
    let model = Arc::new(RecordingModel::new(scripted(
        "fake-1",
        json!([{"text": "dix"}]),
    )));
    let (state, _, _, _) = run(&agent(model.clone(), Vec::new()), "4 + 6 ?").await;
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(model.requests()[0].output_schema, None);
}
