//! Session state as the engine runs it ([`StateSpec`]): the keys an agent declares, how a
//! value is checked (declared key, schema, size limits), the caller's values checked before a
//! run is opened, the writes a successful tool result makes (`from`: a JSON pointer into its
//! data or a fixed value), and what the orchestrator is shown (`main.context`).
//!
//! The state itself is the journal's: [`loom_core::state::SessionState`] folds it. A write is
//! accepted or refused here, before it is journaled: accepted values go in the result's
//! `output.state`, refusals in `output.state_refused` with their reason.

use std::{borrow::Borrow, collections::BTreeMap, fmt, sync::Arc};

use loom_core::{Message, model::session_state_message, state::SessionState, tool::ToolOutput};
use serde_json::{Map, Value};

use crate::error::EngineError;

/// The tag of the message that shows the orchestrator the session state.
pub const STATE_TAG: &str = "session_state";

/// The system hint of an orchestrator shown the session state (`main.context`).
pub const STATE_HINT: &str = "The last user message, between <session_state> tags, holds the \
session's state as JSON: facts kept across the conversation by the application. It is \
current; prefer it to older values in the conversation.";

/// What a `from` source reads from a successful result.
#[derive(Debug, Clone, PartialEq)]
pub enum StateValue {
    /// A JSON pointer (RFC 6901) into the result's data (`""`: the whole data).
    Path(String),
    /// A fixed value.
    Fixed(Value),
}

/// One `from` source of a key.
#[derive(Debug, Clone, PartialEq)]
pub struct StateFrom {
    /// The tool, as the model sees it.
    pub tool: String,
    /// What it reads.
    pub value: StateValue,
    /// Whether a pointer that finds nothing is a refusal (`true`) or ignored.
    pub refuse_missing: bool,
}

/// One declared key.
#[derive(Clone)]
pub struct StateKeySpec {
    /// The key.
    pub name: String,
    /// What it holds (for people).
    pub description: String,
    /// Its JSON Schema, compiled.
    validator: Arc<loom_schema::Validator>,
    /// Its sources.
    pub from: Vec<StateFrom>,
    /// A run is refused while it has no value.
    pub required: bool,
    /// Its value until one is written.
    pub default: Option<Value>,
}

impl fmt::Debug for StateKeySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateKeySpec")
            .field("name", &self.name)
            .field("from", &self.from)
            .field("required", &self.required)
            .field("default", &self.default)
            .finish_non_exhaustive()
    }
}

impl StateKeySpec {
    /// A key following `schema`, without sources, optional, without default.
    ///
    /// # Errors
    /// The schema does not compile ([`EngineError::Invalid`]).
    pub fn new(name: impl Into<String>, schema: &Value) -> Result<StateKeySpec, EngineError> {
        let name = name.into();
        let validator = loom_schema::compile(schema).map_err(|e| {
            EngineError::Invalid(format!("state key '{name}': invalid JSON Schema: {e}"))
        })?;
        Ok(StateKeySpec {
            name,
            description: String::new(),
            validator: Arc::new(validator),
            from: Vec::new(),
            required: false,
            default: None,
        })
    }
}

/// Which keys the orchestrator is shown (`main.context`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StateView {
    /// None: no state message.
    #[default]
    Hidden,
    /// Every key.
    All,
    /// These keys.
    Keys(Vec<String>),
}

/// An agent's session state: its keys, limits and what the orchestrator sees.
#[derive(Debug, Clone)]
pub struct StateSpec {
    /// The declared keys, sorted by name.
    pub keys: Vec<StateKeySpec>,
    /// Bytes of one value's compact JSON at most.
    pub max_value_bytes: u64,
    /// Bytes of the whole state's compact JSON at most.
    pub max_total_bytes: u64,
    /// What every orchestrator call is shown.
    pub view: StateView,
}

impl Default for StateSpec {
    /// No keys, the reference's limits (1 KiB a value, 4 KiB in all), nothing shown.
    fn default() -> Self {
        StateSpec {
            keys: Vec::new(),
            max_value_bytes: 1024,
            max_total_bytes: 4096,
            view: StateView::Hidden,
        }
    }
}

/// Bytes of `value`'s compact JSON.
fn json_bytes(value: &Value) -> u64 {
    u64::try_from(value.to_string().len()).unwrap_or(u64::MAX)
}

impl StateSpec {
    /// The declared key `name`.
    pub fn key(&self, name: &str) -> Option<&StateKeySpec> {
        self.keys.iter().find(|k| k.name == name)
    }

    /// The declared defaults.
    pub fn defaults(&self) -> Vec<(String, Value)> {
        self.keys
            .iter()
            .filter_map(|k| k.default.clone().map(|v| (k.name.clone(), v)))
            .collect()
    }

    /// The session state of `events` (a session's, in seq order) over the declared defaults.
    /// An agent that declares no key reads nothing of the session: its state stays empty (no
    /// value can be written to it, nothing shows it).
    pub fn fold<'e>(&self, events: impl IntoIterator<Item = &'e loom_core::Event>) -> SessionState {
        if self.keys.is_empty() {
            return SessionState::default();
        }
        SessionState::fold(events, self.defaults())
    }

    /// The session state of a window of a session's events (in seq order): the state of the
    /// snapshot the window starts from ([`SessionSnapshot::base_of`]), then the events, over
    /// the declared defaults. Equal to [`StateSpec::fold`] of the whole session.
    ///
    /// [`SessionSnapshot::base_of`]: loom_core::event::SessionSnapshot::base_of
    pub fn fold_window<E: Borrow<loom_core::Event>>(&self, events: &[E]) -> SessionState {
        if self.keys.is_empty() {
            return SessionState::default();
        }
        let mut state = loom_core::event::SessionSnapshot::base_of(events)
            .and_then(|s| s.state.clone())
            .unwrap_or_default()
            .with_defaults(self.defaults());
        for event in events {
            state.apply(event.borrow());
        }
        state
    }

    /// Why `value` cannot be the value of `key`: undeclared, off its schema, or too large.
    pub fn check_value(&self, key: &str, value: &Value) -> Result<(), String> {
        let Some(spec) = self.key(key) else {
            let declared: Vec<&str> = self.keys.iter().map(|k| k.name.as_str()).collect();
            return Err(format!(
                "{key}: not a state key of the agent (keys: {})",
                if declared.is_empty() {
                    "none".to_owned()
                } else {
                    declared.join(", ")
                }
            ));
        };
        if let Some(problem) = spec.validator.iter_errors(value).next() {
            let path = problem.instance_path().to_string();
            let path = if path.is_empty() {
                "(root)".into()
            } else {
                path
            };
            return Err(format!(
                "{key}: does not follow its schema — {path}: {}",
                problem.masked()
            ));
        }
        let bytes = json_bytes(value);
        if bytes > self.max_value_bytes {
            return Err(format!(
                "{key}: {bytes} bytes of JSON, more than sessions.state.max_value_bytes ({})",
                self.max_value_bytes
            ));
        }
        Ok(())
    }

    /// Why `values` written over `current` would make the state too large.
    fn check_total(
        &self,
        current: &SessionState,
        values: &Map<String, Value>,
    ) -> Result<(), String> {
        let mut all = current.values();
        all.extend(values.clone());
        let bytes = json_bytes(&Value::Object(all));
        if bytes > self.max_total_bytes {
            return Err(format!(
                "the state would be {bytes} bytes of JSON, more than \
                 sessions.state.max_total_bytes ({})",
                self.max_total_bytes
            ));
        }
        Ok(())
    }

    /// Checks the caller's `given` values for a root run over the session's `current` state:
    /// each declared and valid, the whole within the limits, and every required key with a
    /// value. Nothing is journaled when this refuses ([`EngineError::StateRefused`]).
    pub fn check_given(
        &self,
        current: &SessionState,
        given: &Map<String, Value>,
    ) -> Result<(), EngineError> {
        let refused = |reason: String| EngineError::StateRefused(reason);
        for (key, value) in given {
            self.check_value(key, value).map_err(refused)?;
        }
        if !given.is_empty() {
            self.check_total(current, given).map_err(refused)?;
        }
        for key in self.keys.iter().filter(|k| k.required) {
            if !given.contains_key(&key.name) && !current.has(&key.name) {
                return Err(refused(format!(
                    "{}: a required key without value (give it with the run's state)",
                    key.name
                )));
            }
        }
        Ok(())
    }

    /// The state writes of a result of `tool` over the session's `current` state: the values
    /// the tool proposed itself (`output.state`) and those of the keys filled from it, each
    /// checked; accepted ones stay in `output.state`, refused ones move to
    /// `output.state_refused` with their reason. An error result writes nothing.
    pub fn fill(&self, tool: &str, output: &mut ToolOutput, current: &SessionState) {
        if output.is_error {
            output.state = Map::new();
            return;
        }
        let mut proposed: Vec<(String, Result<Value, String>)> = std::mem::take(&mut output.state)
            .into_iter()
            .map(|(k, v)| (k, Ok(v)))
            .collect();
        for key in &self.keys {
            for from in key.from.iter().filter(|f| f.tool == tool) {
                let found = match &from.value {
                    StateValue::Fixed(value) => Some(value.clone()),
                    StateValue::Path(path) => output
                        .data
                        .as_ref()
                        .and_then(|data| data.pointer(path))
                        .cloned(),
                };
                match found {
                    Some(value) => proposed.push((key.name.clone(), Ok(value))),
                    None if from.refuse_missing => {
                        let StateValue::Path(path) = &from.value else {
                            continue;
                        };
                        proposed.push((
                            key.name.clone(),
                            Err(format!(
                                "{}: the result of {tool} has no value at {}",
                                key.name,
                                if path.is_empty() { "its root" } else { path }
                            )),
                        ));
                    }
                    None => {}
                }
            }
        }
        let mut accepted = Map::new();
        let mut refused = Map::new();
        for (key, value) in proposed {
            let checked = value.and_then(|v| self.check_value(&key, &v).map(|()| v));
            match checked {
                Ok(value) => {
                    refused.remove(&key);
                    accepted.insert(key, value);
                }
                Err(reason) => {
                    accepted.remove(&key);
                    refused.insert(key, Value::String(reason));
                }
            }
        }
        if !accepted.is_empty()
            && let Err(reason) = self.check_total(current, &accepted)
        {
            for key in std::mem::take(&mut accepted).keys() {
                refused.insert(key.clone(), Value::String(format!("{key}: {reason}")));
            }
        }
        output.state = accepted;
        output.state_refused.extend(refused);
    }

    /// The keys the orchestrator is shown of `state`, or `None` when it is shown nothing.
    fn shown(&self, state: &SessionState) -> Option<BTreeMap<String, Value>> {
        let values = state.values();
        match &self.view {
            StateView::Hidden => None,
            StateView::All => Some(values.into_iter().collect()),
            StateView::Keys(keys) => Some(
                values
                    .into_iter()
                    .filter(|(k, _)| keys.contains(k))
                    .collect(),
            ),
        }
    }

    /// The last user message of every orchestrator call (`main.context`): the state as
    /// compact JSON sorted by key, between `<session_state>` tags; never journaled.
    pub fn message(&self, state: &SessionState) -> Option<Message> {
        let shown = self.shown(state)?;
        let json = serde_json::to_string(&shown).unwrap_or_else(|_| "{}".into());
        Some(Message::user(session_state_message(&json)))
    }

    /// The system prompt of an orchestrator shown the state: `system`, then [`STATE_HINT`].
    pub fn system(&self, system: &str) -> String {
        match self.view {
            StateView::Hidden => system.to_owned(),
            _ if system.is_empty() => STATE_HINT.to_owned(),
            _ => format!("{system}\n\n{STATE_HINT}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec() -> StateSpec {
        let mut client = StateKeySpec::new("client", &json!({"type": "string"})).unwrap();
        client.from = vec![StateFrom {
            tool: "lookup".into(),
            value: StateValue::Path("/client/id".into()),
            refuse_missing: true,
        }];
        client.required = true;
        let mut lang = StateKeySpec::new("lang", &json!({"type": "string"})).unwrap();
        lang.default = Some(json!("fr"));
        lang.from = vec![StateFrom {
            tool: "lookup".into(),
            value: StateValue::Path("/lang".into()),
            refuse_missing: false,
        }];
        let mut seen = StateKeySpec::new("seen", &json!({"type": "boolean"})).unwrap();
        seen.from = vec![StateFrom {
            tool: "lookup".into(),
            value: StateValue::Fixed(json!(true)),
            refuse_missing: true,
        }];
        StateSpec {
            keys: vec![client, lang, seen],
            max_value_bytes: 32,
            max_total_bytes: 80,
            view: StateView::All,
        }
    }

    fn result(data: Value) -> ToolOutput {
        ToolOutput::json(data)
    }

    #[test]
    fn a_pointer_and_a_fixed_value_fill_their_keys() {
        let spec = spec();
        let mut output = result(json!({"client": {"id": "C-7"}, "lang": "de"}));
        spec.fill("lookup", &mut output, &spec.fold([]));
        assert_eq!(
            Value::Object(output.state),
            json!({"client": "C-7", "lang": "de", "seen": true})
        );
        assert!(output.state_refused.is_empty());
        // Another tool fills nothing.
        let mut other = result(json!({"client": {"id": "C-8"}}));
        spec.fill("other", &mut other, &spec.fold([]));
        assert!(other.state.is_empty());
    }

    #[test]
    fn a_missing_pointer_is_refused_or_ignored_as_declared() {
        let spec = spec();
        let mut output = result(json!({"name": "Martin"}));
        spec.fill("lookup", &mut output, &spec.fold([]));
        assert_eq!(Value::Object(output.state), json!({"seen": true}));
        assert_eq!(
            Value::Object(output.state_refused),
            json!({"client": "client: the result of lookup has no value at /client/id"}),
            "lang (on_missing: ignore) is neither written nor refused"
        );
    }

    #[test]
    fn a_value_off_its_schema_or_too_large_is_refused_with_its_reason() {
        let spec = spec();
        let mut output =
            result(json!({"client": {"id": 12}, "lang": "a language name that is far too long"}));
        spec.fill("lookup", &mut output, &spec.fold([]));
        assert_eq!(
            Value::Object(output.state_refused),
            json!({
                "client": "client: does not follow its schema — (root): value is not of type \"string\"",
                "lang": "lang: 38 bytes of JSON, more than sessions.state.max_value_bytes (32)",
            })
        );
        assert_eq!(Value::Object(output.state), json!({"seen": true}));
    }

    #[test]
    fn writes_that_would_overflow_the_whole_state_are_refused() {
        let mut spec = spec();
        spec.max_total_bytes = 30;
        let mut output = result(json!({"client": {"id": "C-0000000001"}}));
        spec.fill("lookup", &mut output, &spec.fold([]));
        assert!(output.state.is_empty(), "{:?}", output.state);
        assert_eq!(
            output.state_refused["client"],
            json!(
                "client: the state would be 49 bytes of JSON, more than sessions.state.max_total_bytes (30)"
            )
        );
    }

    #[test]
    fn an_error_result_writes_nothing_and_undeclared_proposals_are_refused() {
        let spec = spec();
        let mut failed = ToolOutput::error("boom");
        failed.state.insert("client".into(), json!("C-1"));
        spec.fill("lookup", &mut failed, &spec.fold([]));
        assert!(failed.state.is_empty() && failed.state_refused.is_empty());
        let mut proposed = ToolOutput::text("ok");
        proposed.state.insert("colour".into(), json!("blue"));
        spec.fill("other", &mut proposed, &spec.fold([]));
        assert_eq!(
            proposed.state_refused["colour"],
            json!("colour: not a state key of the agent (keys: client, lang, seen)")
        );
    }

    #[test]
    fn the_callers_state_is_checked_and_required_keys_need_a_value() {
        let spec = spec();
        let empty = spec.fold([]);
        let refused = spec.check_given(&empty, &Map::new()).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "state refused: client: a required key without value (give it with the run's state)"
        );
        let mut given = Map::new();
        given.insert("client".into(), json!(7));
        let refused = spec.check_given(&empty, &given).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "state refused: client: does not follow its schema — (root): value is not of type \"string\""
        );
        given.insert("client".into(), json!("C-1"));
        spec.check_given(&empty, &given).unwrap();
    }

    #[test]
    fn the_orchestrator_sees_compact_sorted_json_and_a_hint() {
        let mut spec = spec();
        let state = spec.fold([]);
        let message = spec.message(&state).unwrap();
        assert_eq!(
            message.text(),
            "<session_state>{\"lang\":\"fr\"}</session_state>"
        );
        assert!(spec.system("Be brief.").ends_with(STATE_HINT));
        spec.view = StateView::Keys(vec!["client".into()]);
        assert_eq!(
            spec.message(&state).unwrap().text(),
            "<session_state>{}</session_state>"
        );
        spec.view = StateView::Hidden;
        assert!(spec.message(&state).is_none());
        assert_eq!(spec.system("Be brief."), "Be brief.");
    }
}
