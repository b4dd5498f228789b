//! Testing an agent with `cargo test`, spending nothing: scripted models built in Rust, tool
//! doubles that record their calls, and assertions on a run's journal.
//!
//! The model of a test is a scripted model: the configuration's own (`sdk: fake`, its replies in
//! `params.script`, see [`ScriptedModel`]), or one built in Rust with [`Script`] (texts, tool
//! calls, errors) and plugged in place of the model the agent's YAML names with
//! [`crate::Loom::register_model`], so no provider is ever asked; a tool is registered as a
//! [`ToolDouble`] instead of the real one, so a tool with side effects never runs; the run's
//! events ([`crate::Loom::query`] or the session's journal) are then checked with
//! [`assert_event_types`], [`assert_tool_called`] and [`assert_cost_below`], whose failures say
//! what differs.
//!
//! ```
//! use loom_ia::testing::{Script, assert_tool_called};
//! use loom_ia::{Loom, RunOptions};
//! use serde_json::json;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The agent's YAML names the model `main-model`; the test plugs a script in its place.
//! let dir = tempfile::tempdir()?;
//! let config = dir.path().join("loom.yaml");
//! std::fs::write(
//!     &config,
//!     "version: 1\nmodels:\n  - {id: main-model, sdk: fake, model: any}\n\
//!      agents:\n  - name: clock\n    main: {model: main-model}\n    \
//!      tools: [{tool: loom.current_datetime}]\n",
//! )?;
//! let loom = Loom::from_config(&config)?;
//! let script = Script::new()
//!     .tool_call("Let me look.", "current_datetime", json!({"timezone": "UTC"}))
//!     .text("It is {{ tool_result }}.");
//! loom.register_model("main-model", script.model("scripted")?)?;
//!
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! let result = runtime.block_on(loom.run("clock", "What time is it?", RunOptions::default()))?;
//! assert!(result.text.starts_with("It is "), "{}", result.text);
//! let events = runtime.block_on(loom.events(&result.run_ref("default")))?;
//! assert_tool_called(&events, "current_datetime", &json!({"timezone": "UTC"}));
//! # Ok(())
//! # }
//! ```
//!
//! ```
//! use loom_ia::testing::{ToolDouble, assert_tool_called};
//! use loom_ia::{Event, ToolOutput};
//! use serde_json::json;
//!
//! let send = ToolDouble::returning("send_reminder", ToolOutput::text("sent"));
//! // `loom.register("send_reminder", send.clone())` offers it to the agents that name it.
//! assert!(send.calls().is_empty());
//! let events: Vec<Event> = Vec::new();
//! assert!(std::panic::catch_unwind(|| {
//!     assert_tool_called(&events, "send_reminder", &json!({"number": "D-1"}))
//! })
//! .is_err());
//! ```

use std::sync::{Arc, Mutex};

use loom_core::{
    BoxFuture, Event, Payload,
    tool::{Tool, ToolContext, ToolDeclarations, ToolError, ToolKind, ToolOutput, ToolSpec},
};
use serde_json::Value;

/// The scripted fake model (`sdk: fake`): its replies are `params.script` (text, tool calls,
/// conditions: see `loom_models::FakeModel`), so a test's runs are deterministic and free.
pub use loom_models::FakeModel as ScriptedModel;

pub use loom_core::model::{ModelClient, ModelErrorKind};

/// The replies of a scripted model, built in Rust; [`Script::model`] makes the model, to plug
/// in place of a configured one with [`crate::Loom::register_model`].
///
/// Each call of the model answers with the reply whose index is the number of assistant
/// messages since the last real user message (as `sdk: fake` does): the first reply answers
/// the user's message, the second the results of the first reply's tool calls, and so on; a
/// run's guards' repair requests and engine notes do not count. A text may hold
/// `{{ tool_result }}`, replaced by the text of the last tool result.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Script {
    replies: Vec<Value>,
}

impl Script {
    /// No reply yet (a model of an empty script echoes the user's text).
    pub fn new() -> Script {
        Script::default()
    }

    /// A reply with `text` only: the model's final answer at that step.
    pub fn text(mut self, text: impl Into<String>) -> Script {
        self.replies
            .push(serde_json::json!({ "text": text.into() }));
        self
    }

    /// A reply with `text` calling the tool `name` with `arguments`.
    pub fn tool_call(self, text: impl Into<String>, name: &str, arguments: Value) -> Script {
        self.tool_calls(text, [(name, arguments)])
    }

    /// A reply with `text` calling each `(tool, arguments)` of `calls`, in one turn.
    pub fn tool_calls<'n>(
        mut self,
        text: impl Into<String>,
        calls: impl IntoIterator<Item = (&'n str, Value)>,
    ) -> Script {
        let calls: Vec<Value> = calls
            .into_iter()
            .map(|(name, arguments)| serde_json::json!({"name": name, "arguments": arguments}))
            .collect();
        self.replies
            .push(serde_json::json!({ "text": text.into(), "tool_calls": calls }));
        self
    }

    /// A reply that fails every attempt with an error of `kind` (so the engine's retries,
    /// fallbacks and failure paths can be tested).
    pub fn error(mut self, kind: ModelErrorKind) -> Script {
        self.replies.push(serde_json::json!({ "error": kind }));
        self
    }

    /// The script's replies as `params.script` of an `sdk: fake` model.
    pub fn to_params(&self) -> serde_json::Map<String, Value> {
        let mut params = serde_json::Map::new();
        params.insert("script".into(), Value::Array(self.replies.clone()));
        params
    }

    /// The scripted model (its provider model name `name`); refused
    /// ([`crate::LoomError::Invalid`]) when a reply is not one the model reads (tool calls'
    /// arguments that are not objects).
    pub fn model(&self, name: &str) -> Result<ScriptedModel, crate::LoomError> {
        for (r, reply) in self.replies.iter().enumerate() {
            let calls = reply.get("tool_calls").and_then(Value::as_array);
            for (c, call) in calls.into_iter().flatten().enumerate() {
                if !call.get("arguments").is_some_and(Value::is_object) {
                    return Err(crate::LoomError::Invalid(format!(
                        "script[{r}].tool_calls[{c}].arguments: a tool's arguments are a JSON \
                         object"
                    )));
                }
            }
        }
        let params = self.to_params();
        if self.replies.is_empty() {
            return Ok(ScriptedModel::echo(name));
        }
        ScriptedModel::from_params(name, &params)
            .map_err(|e| crate::LoomError::Invalid(format!("script{}: {}", e.path, e.message)))
    }
}

/// What a double answers a call with.
type Answer = dyn Fn(&Value) -> Result<ToolOutput, String> + Send + Sync;

/// A tool standing for a real one in tests: it answers every call with a fixed result or a
/// closure of the arguments, and records the arguments of each call. Clones share the record.
#[derive(Clone)]
pub struct ToolDouble {
    spec: ToolSpec,
    answer: Arc<Answer>,
    calls: Arc<Mutex<Vec<Value>>>,
}

impl std::fmt::Debug for ToolDouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolDouble")
            .field("name", &self.spec.name)
            .field("calls", &self.calls())
            .finish_non_exhaustive()
    }
}

impl ToolDouble {
    /// A double of `name` answering every call with `result`.
    pub fn returning(name: &str, result: ToolOutput) -> ToolDouble {
        ToolDouble::with(name, move |_| Ok(result.clone()))
    }

    /// A double of `name` answering each call with `answer(arguments)`; an `Err` is the error
    /// result the model reads.
    pub fn with(
        name: &str,
        answer: impl Fn(&Value) -> Result<ToolOutput, String> + Send + Sync + 'static,
    ) -> ToolDouble {
        ToolDouble {
            spec: ToolSpec {
                name: name.to_owned(),
                description: format!("Test double of {name}."),
                input_schema: serde_json::json!({"type": "object"}),
                kind: ToolKind::Python,
                declarations: ToolDeclarations::default(),
            },
            answer: Arc::new(answer),
            calls: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The arguments of every call so far, in order.
    pub fn calls(&self) -> Vec<Value> {
        self.calls
            .lock()
            .map(|calls| calls.clone())
            .unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }
}

impl Tool for ToolDouble {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(
        &self,
        _ctx: ToolContext,
        arguments: Value,
    ) -> BoxFuture<'_, Result<ToolOutput, ToolError>> {
        let outcome = (self.answer)(&arguments).map_err(ToolError::new);
        match self.calls.lock() {
            Ok(mut calls) => calls.push(arguments),
            Err(poisoned) => poisoned.into_inner().push(arguments),
        }
        Box::pin(std::future::ready(outcome))
    }
}

/// Asserts that `events` have exactly the types `expected`, in order; on failure, the panic
/// shows both sequences line by line, the first difference marked.
#[track_caller]
pub fn assert_event_types(events: &[Event], expected: &[&str]) {
    let got: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    if got == expected {
        return;
    }
    let mut diff = String::new();
    for index in 0..got.len().max(expected.len()) {
        let want = expected.get(index).copied().unwrap_or("(none)");
        let have = got.get(index).copied().unwrap_or("(none)");
        let mark = if want == have { " " } else { "≠" };
        diff.push_str(&format!(
            "{mark} {index:>3}  expected {want:<24} got {have}\n"
        ));
    }
    panic!("the event types differ:\n{diff}");
}

/// Whether `value` matches `pattern`: every field of an object pattern is in `value` and
/// matches (other fields of `value` are ignored), arrays match element by element, anything
/// else is equal.
pub fn matches(value: &Value, pattern: &Value) -> bool {
    match (value, pattern) {
        (Value::Object(value), Value::Object(pattern)) => pattern
            .iter()
            .all(|(key, want)| value.get(key).is_some_and(|have| matches(have, want))),
        (Value::Array(value), Value::Array(pattern)) => {
            value.len() == pattern.len() && value.iter().zip(pattern).all(|(v, p)| matches(v, p))
        }
        _ => value == pattern,
    }
}

/// Asserts that `events` hold a call of `tool` (`tool.called`) whose arguments [`matches()`]
/// `arguments`; on failure, the panic lists the calls of `tool` that were made.
#[track_caller]
pub fn assert_tool_called(events: &[Event], tool: &str, arguments: &Value) {
    let calls: Vec<&Value> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ToolCalled(call) if call.tool_name == tool => Some(&call.arguments),
            _ => None,
        })
        .collect();
    if calls.iter().any(|call| matches(call, arguments)) {
        return;
    }
    let made: Vec<String> = calls.iter().map(|c| c.to_string()).collect();
    panic!(
        "no call of {tool} with arguments matching {arguments}; its calls: {}",
        if made.is_empty() {
            "none".to_owned()
        } else {
            made.join(", ")
        }
    );
}

/// The cost in dollars of every model call of `events` (`model.responded`).
pub fn cost_usd(events: &[Event]) -> f64 {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ModelResponded(answer) => Some(answer.cost_usd),
            _ => None,
        })
        .sum()
}

/// Asserts that the model calls of `events` cost less than `ceiling` dollars.
#[track_caller]
pub fn assert_cost_below(events: &[Event], ceiling: f64) {
    let cost = cost_usd(events);
    assert!(
        cost < ceiling,
        "the model calls cost {cost:.6} $, not below {ceiling:.6} $"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pattern_matches_the_fields_it_names() {
        let value = json!({"numero": "D-1", "urgent": true, "lines": [1, 2]});
        assert!(matches(&value, &json!({"numero": "D-1"})));
        assert!(matches(&value, &json!({"lines": [1, 2]})));
        assert!(!matches(&value, &json!({"numero": "D-2"})));
        assert!(!matches(&value, &json!({"absent": 1})));
        assert!(!matches(&value, &json!({"lines": [1]})));
    }

    #[test]
    fn the_event_type_diff_marks_the_first_difference() {
        let Err(panic) = std::panic::catch_unwind(|| {
            assert_event_types(&[], &["run.started"]);
        }) else {
            panic!("an empty journal is not a run.started");
        };
        let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(message.contains("≠   0  expected run.started"), "{message}");
    }

    #[tokio::test]
    async fn a_double_records_its_calls_and_answers() {
        let double = ToolDouble::with("add", |args| {
            args.get("a")
                .and_then(Value::as_i64)
                .map(|a| ToolOutput::text(format!("{}", a + 1)))
                .ok_or_else(|| "no a".to_owned())
        });
        let ctx = || ToolContext {
            tenant_id: "t".into(),
            session_id: "s".into(),
            run_id: "r".into(),
            call_id: "c".into(),
            idempotency_key: "k".into(),
            traceparent: None,
        };
        let shared = double.clone();
        assert_eq!(
            double.call(ctx(), json!({"a": 1})).await.ok(),
            Some(ToolOutput::text("2"))
        );
        assert!(double.call(ctx(), json!({})).await.is_err());
        assert_eq!(shared.calls(), vec![json!({"a": 1}), json!({})]);
    }
}
