//! Tests of the run-state projection: the journal builder, payloads and readers they share.

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use serde_json::{Map, Value, json};

use super::*;
use crate::{
    content::{Block, BlockKind, Message, Role},
    event::{
        Effect, Envelope, MessageUser, ModelResponded, Outcome, RunCancelled, RunClaimed,
        RunCompleted, RunContext, RunFailed, RunStarted, RunTransitioned, StepCompleted,
        StepStarted, ToolCalled, ToolCompleted,
    },
    event::{Event, Payload},
    model::StopReason,
    tool::ToolKind,
    tool::ToolOutput,
    usage::Usage,
};

mod history;
mod lifecycle;
mod session_state;
mod turns;

const SESSION: &str = "sess-1";
const RUN: &str = "run-1";

const PLAIN_RUN: &str = "reference/journals/plain-run.jsonl";
const TERMINAL_ROLE: &str = "reference/journals/policies-terminal-role.jsonl";
const SESSION_TWO_RUNS: &str = "reference/journals/session-two-runs.jsonl";

// ---------------------------------------------------------------------------------------
// Builder: one session journal, events appended for the current run with increasing seq.
// ---------------------------------------------------------------------------------------

fn ts(seq: u64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap()
        + TimeDelta::seconds(i64::try_from(seq).unwrap())
}

struct Journal {
    run_id: String,
    step: u32,
    events: Vec<Event>,
}

impl Journal {
    fn new() -> Journal {
        Journal {
            run_id: RUN.to_owned(),
            step: 0,
            events: Vec::new(),
        }
    }

    /// The following events belong to `run_id` (same session, seq keeps increasing).
    fn switch_to(&mut self, run_id: &str) {
        self.run_id = run_id.to_owned();
        self.step = 0;
    }

    fn push(&mut self, payload: Payload) -> Event {
        let seq = self.events.len() as u64 + 1;
        let mut event = Event::new(
            Envelope {
                event_id: format!("{}-ev{seq}", self.run_id),
                ts: ts(seq),
                tenant_id: "default".into(),
                session_id: SESSION.into(),
                run_id: self.run_id.clone(),
                root_run_id: self.run_id.clone(),
                span_id: format!("span-{seq}"),
                parent_span_id: None,
                agent: Some("demo".into()),
                role: None,
            },
            payload,
        );
        event.seq = seq;
        self.events.push(event.clone());
        event
    }

    /// The current run's state after every event so far.
    fn state(&self) -> RunState {
        self.state_of(&self.run_id)
    }

    /// Any run's state after every event so far.
    fn state_of(&self, run_id: &str) -> RunState {
        RunState::fold(run_id, &self.events).expect("the journal folds")
    }

    /// Appends `payload` and returns the refusal the projection gives it.
    fn refused(&mut self, payload: Payload) -> (Event, ProjectionError) {
        let mut state = self.state();
        let event = self.push(payload);
        let error = state
            .apply(&event)
            .expect_err("the projection should refuse the event");
        (event, error)
    }

    /// `run.started`, the question, a claim.
    fn begin(&mut self, question: &str) {
        self.push(started());
        self.push(user(question));
        self.push(claimed("worker-1", 60));
    }

    fn step_started(&mut self, state: RunStatus, effect: Effect) {
        self.step += 1;
        self.push(step_started(self.step, state, effect));
    }

    fn step_completed(&mut self, duration_ms: f64) {
        self.push(step_completed(self.step, duration_ms));
    }

    /// A model step from `from`, then the transition the answer calls for.
    fn model_turn(&mut self, from: RunStatus, answer: Message, to: RunStatus) {
        let effect = if from == RunStatus::Finalizing {
            Effect::Finalize
        } else {
            Effect::ModelCall
        };
        self.step_started(from, effect);
        self.push(responded(answer));
        self.step_completed(10.0);
        self.push(transition(from, to));
    }

    /// A tool batch where every call runs and completes in the given order.
    fn tool_batch(&mut self, call_ids: &[&str], to: RunStatus) {
        self.step_started(RunStatus::AwaitingTools, Effect::ToolBatch);
        for call_id in call_ids {
            self.push(called(call_id));
            self.push(tool_completed(call_id, &format!("result of {call_id}")));
        }
        self.step_completed(5.0);
        self.push(transition(RunStatus::AwaitingTools, to));
    }

    /// The reference's plain run: one tool turn, then the final answer, completed.
    fn plain_run(&mut self, question: &str, call_id: &str, answer: &str) {
        self.begin(question);
        self.model_turn(
            RunStatus::ReadyForModel,
            asks("Je calcule.", &[call_id]),
            RunStatus::AwaitingTools,
        );
        self.tool_batch(&[call_id], RunStatus::ReadyForModel);
        self.model_turn(
            RunStatus::ReadyForModel,
            Message::assistant(answer),
            RunStatus::Completed,
        );
        self.push(run_completed(Some(Message::assistant(answer))));
    }
}

// Payloads ------------------------------------------------------------------------------

fn run_started(kind: &str, parent_run_id: Option<&str>, depth: u32) -> Payload {
    Payload::RunStarted(RunStarted {
        kind: kind.into(),
        context: RunContext {
            tenant_id: "default".into(),
            user_id: None,
            metadata: Map::new(),
        },
        parent_run_id: parent_run_id.map(str::to_owned),
        parent_call_id: None,
        depth,
        triggered_by: None,
        trigger: None,
        judges: "auto".into(),
        budget: None,
        state: Map::new(),
    })
}

fn started() -> Payload {
    run_started("normal", None, 0)
}

fn user(text: &str) -> Payload {
    Payload::MessageUser(MessageUser {
        message: Message::user(text),
        kind: "request".into(),
        policy: None,
        tools: true,
    })
}

fn claimed(worker_id: &str, lease_secs: i64) -> Payload {
    Payload::RunClaimed(RunClaimed {
        worker_id: worker_id.into(),
        lease_until: ts(0) + TimeDelta::seconds(lease_secs),
    })
}

fn step_started(step_no: u32, state: RunStatus, effect: Effect) -> Payload {
    Payload::StepStarted(StepStarted {
        step_no,
        state,
        effect,
    })
}

fn step_completed(step_no: u32, duration_ms: f64) -> Payload {
    Payload::StepCompleted(StepCompleted {
        step_no,
        duration_ms,
        events_emitted: 1,
        outcome: Outcome::Ok,
    })
}

fn usage(input_tokens: u64, output_tokens: u64) -> Usage {
    Usage {
        input_tokens,
        output_tokens,
        ..Usage::default()
    }
}

fn args(call_id: &str) -> Value {
    json!({ "call": call_id })
}

/// An assistant message with a text block and one `calculer` call per id, in that order.
fn asks(text: &str, call_ids: &[&str]) -> Message {
    let mut message = Message::assistant(text);
    for call_id in call_ids {
        message
            .blocks
            .push(Block::tool_call(*call_id, "calculer", args(call_id)));
    }
    message
}

fn model_response(message: Message, usage: Usage, cost_usd: f64) -> ModelResponded {
    let stop_reason = if message.tool_calls().next().is_some() {
        StopReason::ToolUse
    } else {
        StopReason::End
    };
    ModelResponded {
        model_id: "fake".into(),
        model: None,
        provider: "fake".into(),
        message,
        usage,
        cost_usd,
        stop_reason,
        latency_ms: 1.0,
        attempts: 1,
        request_hash: None,
        request_parts: Map::new(),
        call_id: None,
        judge: None,
    }
}

fn responded(message: Message) -> Payload {
    responded_with(message, usage(100, 10), 0.0)
}

fn responded_with(message: Message, usage: Usage, cost_usd: f64) -> Payload {
    Payload::ModelResponded(model_response(message, usage, cost_usd))
}

fn role_responded(call_id: &str, usage: Usage, cost_usd: f64) -> Payload {
    Payload::ModelResponded(ModelResponded {
        call_id: Some(call_id.into()),
        ..model_response(Message::assistant("role answer"), usage, cost_usd)
    })
}

fn judge_responded(judge: &str, usage: Usage, cost_usd: f64) -> Payload {
    Payload::ModelResponded(ModelResponded {
        judge: Some(judge.into()),
        ..model_response(Message::assistant("verdict"), usage, cost_usd)
    })
}

fn called(call_id: &str) -> Payload {
    Payload::ToolCalled(ToolCalled {
        call_id: call_id.into(),
        tool_name: "calculer".into(),
        tool_kind: ToolKind::Python,
        arguments: args(call_id),
        refs: Vec::new(),
        resumed: false,
        child_run_id: None,
        side_effects: None,
    })
}

fn tool_completed(call_id: &str, text: &str) -> Payload {
    tool_completed_with(call_id, ToolOutput::text(text), None, 0.0)
}

fn tool_completed_with(
    call_id: &str,
    output: ToolOutput,
    usage: Option<Usage>,
    cost_usd: f64,
) -> Payload {
    Payload::ToolCompleted(ToolCompleted {
        call_id: call_id.into(),
        tool_name: "calculer".into(),
        output,
        latency_ms: 0.5,
        size: 0,
        usage,
        cost_usd,
    })
}

fn transition(from_state: RunStatus, to_state: RunStatus) -> Payload {
    Payload::RunTransitioned(RunTransitioned {
        from_state,
        to_state,
        step_no: 0,
        cause_type: "test".into(),
        cause_event_id: None,
    })
}

fn run_completed(output: Option<Message>) -> Payload {
    run_completed_with_data(output, None)
}

fn run_completed_with_data(output: Option<Message>, data: Option<Value>) -> Payload {
    Payload::RunCompleted(RunCompleted {
        output,
        output_event_id: None,
        iterations: 0,
        usage: Usage::default(),
        cost_usd: 0.0,
        data,
        unverified: false,
        fallback: false,
    })
}

fn run_failed(error_type: &str, error: &str) -> Payload {
    Payload::RunFailed(RunFailed {
        error_type: error_type.into(),
        error: error.into(),
        iterations: 0,
        usage: Usage::default(),
        cost_usd: 0.0,
    })
}

fn run_cancelled() -> Payload {
    Payload::RunCancelled(RunCancelled {
        reason: "requested".into(),
        by: Some("alice".into()),
        iterations: 0,
        usage: Usage::default(),
        cost_usd: 0.0,
        withdrawn: Vec::new(),
    })
}

// Reading results -----------------------------------------------------------------------

/// The (call id, visible text) of each tool result of a message, in block order.
fn results(message: &Message) -> Vec<(String, String)> {
    message
        .blocks
        .iter()
        .filter_map(|b| match &b.kind {
            BlockKind::ToolResult { call_id, output } => {
                Some((call_id.clone(), output.visible_text()))
            }
            _ => None,
        })
        .collect()
}

fn result_ids(message: &Message) -> Vec<String> {
    results(message).into_iter().map(|(id, _)| id).collect()
}

fn call_ids(message: &Message) -> Vec<String> {
    message
        .tool_calls()
        .map(|(id, _, _)| id.to_owned())
        .collect()
}

fn roles(messages: &[Message]) -> Vec<Role> {
    messages.iter().map(|m| m.role).collect()
}

fn pending_ids(state: &RunState) -> Vec<&str> {
    state
        .pending_calls
        .iter()
        .map(|c| c.call_id.as_str())
        .collect()
}

/// The events of a reference journal of `../shared`; `None` (the test is skipped) on a
/// clone without it.
fn read_journal(path: &str) -> Option<Vec<Event>> {
    let text = loom_testkit::shared::text(path)?;
    let events = text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| Event::from_json(line).unwrap_or_else(|e| panic!("{path}:{}: {e}", n + 1)))
        .collect();
    Some(events)
}
