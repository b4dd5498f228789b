//! The file model of session state: the keys an agent declares under `state:` ([`StateKey`]),
//! each filled by the caller (`run.started.state`) or from the results of named tools
//! ([`StateSource`]). Their rules are checked in `config/state.rs`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::JsonObject;

/// One key of an agent's session state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StateKey {
    /// The JSON Schema every value of the key follows (required).
    pub schema: JsonObject,
    /// What the key holds, for people and for the model's state hint.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// The tools whose successful results fill the key, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<StateSource>,
    /// A run is refused while the key has no value (given by the caller, or written before in
    /// the session). Not with `default`.
    #[serde(default)]
    pub required: bool,
    /// The key's value until one is written (must follow `schema` and the size limits of
    /// `sessions.state`). Not with `required`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
}

/// Where a key's value comes from after a successful call of `tool`: a JSON pointer into the
/// result's data (`path`), or a fixed `value`; exactly one of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StateSource {
    /// The tool, as the model sees it (a tool, role or sub-agent of the agent).
    #[schemars(length(min = 1))]
    pub tool: String,
    /// A JSON pointer (RFC 6901) into the result's structured data (`""`: the whole data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A fixed value written whenever the tool succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    /// What a pointer that finds nothing does: `refuse` (the write is refused, with its reason
    /// in the result's `state_refused`) or `ignore` (nothing is written).
    #[serde(default)]
    pub on_missing: OnMissing,
}

/// What a `path` that finds nothing in a result does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnMissing {
    /// The write is refused and the refusal recorded in `tool.completed.output.state_refused`.
    #[default]
    Refuse,
    /// Nothing is written.
    Ignore,
}
