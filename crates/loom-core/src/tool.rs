//! Tools: the port ([`Tool`]), their declarations, the context they receive and what they return.
//!
//! A tool is anything that implements [`Tool`]. Most users never implement it by hand: the
//! `#[tool]` attribute of the facade turns a plain function into an [`FnTool`].

use std::{fmt, sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{BoxFuture, content::Block};

/// What a tool call may change in the world.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum SideEffects {
    /// Reads only: safe to run again.
    #[default]
    None,
    /// Changes something that can be undone.
    Reversible,
    /// Changes something for good (an e-mail sent).
    Irreversible,
}

/// Whether a human must approve a call before it runs.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    /// Never asked.
    #[default]
    Never,
    /// Always asked.
    Always,
    /// A policy decides per call.
    Policy,
}

/// What to do on resume with a call that was interrupted mid-flight.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OnUnknown {
    /// Tell the model the outcome is unknown.
    #[default]
    Error,
    /// Ask a human before any new attempt.
    Pause,
}

/// The family a tool belongs to, as journaled in `tool.called.tool_kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// A tool written in the host language (Rust here; "python" in the reference journals).
    Python,
    /// A tool of an MCP server.
    Mcp,
    /// A role (a model called like a tool).
    Role,
    /// A sub-agent.
    Agent,
    /// A built-in tool.
    Builtin,
}

/// The declarations of a tool: set in code, overridable per agent in YAML.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolDeclarations {
    /// What a call may change.
    pub side_effects: SideEffects,
    /// Whether a human approves calls.
    pub approval: Approval,
    /// Whether running a call twice has the effect of running it once.
    pub idempotent: bool,
    /// What to do with an interrupted call.
    pub on_unknown: OnUnknown,
    /// Per-call timeout; the execution default applies when absent.
    pub timeout: Option<Duration>,
    /// Result size (characters) above which the result is moved out of the context.
    pub offload_over: Option<u64>,
    /// The business key computed from a call's arguments: two calls with the same key (in any
    /// run of the tenant) perform the action once; the second gets the recorded result.
    pub business_key: Option<BusinessKey>,
}

/// The function that computes a business key from a call's arguments (`None`: no key for
/// these arguments, the call runs normally).
pub type BusinessKeyFn = dyn Fn(&Value) -> Option<String> + Send + Sync;

/// A tool's business key: a function of the arguments. Two keys are equal when they are the
/// same function (or the same template).
#[derive(Clone)]
pub struct BusinessKey {
    function: Arc<BusinessKeyFn>,
    template: Option<String>,
}

impl BusinessKey {
    /// A business key computed by `function`.
    pub fn new(function: impl Fn(&Value) -> Option<String> + Send + Sync + 'static) -> BusinessKey {
        BusinessKey {
            function: Arc::new(function),
            template: None,
        }
    }

    /// A business key from a template over argument names: `"relance:{numero}"` replaces
    /// `{numero}` with the argument's string or number value; a missing argument (or one of
    /// another type) gives no key. `{{` and `}}` stand for literal braces.
    pub fn template(template: impl Into<String>) -> BusinessKey {
        let template = template.into();
        let owned = template.clone();
        BusinessKey {
            function: Arc::new(move |arguments| render_key(&owned, arguments)),
            template: Some(template),
        }
    }

    /// The key of these arguments, if any.
    pub fn key(&self, arguments: &Value) -> Option<String> {
        (self.function)(arguments)
    }

    /// The template it was made from, if any.
    pub fn template_text(&self) -> Option<&str> {
        self.template.as_deref()
    }
}

impl fmt::Debug for BusinessKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.template {
            Some(template) => write!(f, "BusinessKey({template:?})"),
            None => f.write_str("BusinessKey(<fn>)"),
        }
    }
}

impl PartialEq for BusinessKey {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.function, &other.function)
            || (self.template.is_some() && self.template == other.template)
    }
}

fn render_key(template: &str, arguments: &Value) -> Option<String> {
    let mut out = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                let mut name = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => name.push(c),
                        None => return None,
                    }
                }
                match arguments.get(name.trim())? {
                    Value::String(text) => out.push_str(text),
                    Value::Number(number) => out.push_str(&number.to_string()),
                    _ => return None,
                }
            }
            c => out.push(c),
        }
    }
    Some(out)
}

/// Everything the engine and the model need to know about a tool.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Name offered to the model (`^[A-Za-z0-9_-]{1,64}$`).
    pub name: String,
    /// Description offered to the model.
    pub description: String,
    /// JSON Schema of the arguments (`type: object`).
    pub input_schema: Value,
    /// The tool family.
    pub kind: ToolKind,
    /// Declarations.
    pub declarations: ToolDeclarations,
}

/// What a tool receives besides its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolContext {
    /// Tenant of the run.
    pub tenant_id: String,
    /// Session of the run.
    pub session_id: String,
    /// The run.
    pub run_id: String,
    /// The call id, as written by the model.
    pub call_id: String,
    /// Technical idempotency key: `sha256("<run_id>:<call_id>")`, stable across resumes.
    pub idempotency_key: String,
    /// The W3C `traceparent` of the call's span when traces are exported
    /// (`telemetry.exporters`), for the tool to pass on (MCP servers receive it in `_meta`);
    /// `None` otherwise.
    pub traceparent: Option<String>,
}

/// The result of a tool call, as journaled in `tool.completed.output`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ToolOutput {
    /// Content shown to the model.
    #[serde(default)]
    pub blocks: Vec<Block>,
    /// Structured data, when the tool returned a value.
    #[serde(default)]
    pub data: Option<Value>,
    /// Whether this is an error the model should read.
    #[serde(default)]
    pub is_error: bool,
    /// Artifact URIs produced.
    #[serde(default)]
    pub artifacts: Vec<String>,
    /// URI of the full content when it was moved out of the context.
    #[serde(default)]
    pub offloaded: Option<String>,
    /// Whether a contract could not verify it.
    #[serde(default)]
    pub unverified: bool,
    /// Whether it was replaced by a fallback message.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fallback: bool,
    /// Session-state writes proposed by the tool.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub state: Map<String, Value>,
    /// Session-state writes refused, with their reason.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub state_refused: Map<String, Value>,
    /// The full payload for interfaces (the second view of a result): journaled in
    /// `tool.completed` and streamed to clients with the event, but **never sent to a model**.
    /// The engine removes it from every model request; [`ToolOutput::visible_text`], offload
    /// previews and `$ref` resolution ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full: Option<Value>,
}

impl ToolOutput {
    /// A text result.
    pub fn text(text: impl Into<String>) -> ToolOutput {
        ToolOutput {
            blocks: vec![Block::text(text)],
            ..ToolOutput::default()
        }
    }

    /// A structured result: a JSON block and `data`.
    pub fn json(data: Value) -> ToolOutput {
        ToolOutput {
            blocks: vec![Block::json(data.clone())],
            data: Some(data),
            ..ToolOutput::default()
        }
    }

    /// An error result the model can read and act on.
    pub fn error(message: impl Into<String>) -> ToolOutput {
        ToolOutput {
            blocks: vec![Block::text(message)],
            is_error: true,
            ..ToolOutput::default()
        }
    }

    /// The two views of a result in one call: `model` is what the model reads (text, JSON,
    /// any [`IntoToolOutput`]), `full` the complete payload kept for interfaces only.
    pub fn views(model: impl IntoToolOutput, full: Value) -> ToolOutput {
        model.into_tool_output().with_full(full)
    }

    /// Sets the full payload for interfaces (builder style); see [`ToolOutput::full`].
    pub fn with_full(mut self, full: Value) -> ToolOutput {
        self.full = Some(full);
        self
    }

    /// The text shown to the model: text blocks, then JSON blocks rendered compactly.
    pub fn visible_text(&self) -> String {
        let mut parts = Vec::new();
        for block in &self.blocks {
            match &block.kind {
                crate::BlockKind::Text { text } => parts.push(text.clone()),
                crate::BlockKind::Json { data } => parts.push(data.to_string()),
                crate::BlockKind::Artifact { uri, .. } => parts.push(uri.clone()),
                _ => {}
            }
        }
        parts.join("\n")
    }
}

/// An error a tool returns for the model to read.
///
/// Its message goes back to the model as an `is_error` result: write it so the model can act
/// ("unknown customer 'X'; known customers: A, B"), not as a stack trace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    /// The model-facing message.
    pub message: String,
    /// The name of the rule that refused the call, when the error is a refusal by a rule of the
    /// tool (the built-in tools' `rules`), so callers classify it without reading the message.
    pub rule: Option<&'static str>,
}

impl ToolError {
    /// A tool error with this message.
    pub fn new(message: impl Into<String>) -> ToolError {
        ToolError {
            message: message.into(),
            rule: None,
        }
    }

    /// A refusal by the tool's rule `rule`, with this message.
    pub fn refused(rule: &'static str, message: impl Into<String>) -> ToolError {
        ToolError {
            message: message.into(),
            rule: Some(rule),
        }
    }

    /// A tool error from anything displayable (the `#[tool]` attribute uses it for typed errors).
    pub fn from_display(error: impl fmt::Display) -> ToolError {
        ToolError::new(error.to_string())
    }
}

/// The tool port. Object-safe: the engine holds `Arc<dyn Tool>`.
pub trait Tool: Send + Sync + fmt::Debug {
    /// What the tool is.
    fn spec(&self) -> &ToolSpec;

    /// Runs one call. `arguments` were validated against the spec's schema.
    fn call(
        &self,
        ctx: ToolContext,
        arguments: Value,
    ) -> BoxFuture<'_, Result<ToolOutput, ToolError>>;
}

/// The function behind an [`FnTool`].
pub type ToolFn =
    dyn Fn(ToolContext, Value) -> BoxFuture<'static, Result<ToolOutput, ToolError>> + Send + Sync;

/// A tool made of a spec and a function; what `#[tool]` produces.
#[derive(Clone)]
pub struct FnTool {
    spec: ToolSpec,
    function: Arc<ToolFn>,
}

impl fmt::Debug for FnTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnTool")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl FnTool {
    /// A tool from its spec and function.
    pub fn new(
        spec: ToolSpec,
        function: impl Fn(ToolContext, Value) -> BoxFuture<'static, Result<ToolOutput, ToolError>>
        + Send
        + Sync
        + 'static,
    ) -> FnTool {
        FnTool {
            spec,
            function: Arc::new(function),
        }
    }

    /// Replaces the declarations (builder style).
    pub fn with_declarations(mut self, declarations: ToolDeclarations) -> FnTool {
        self.spec.declarations = declarations;
        self
    }

    /// Mutable access to the declarations.
    pub fn declarations_mut(&mut self) -> &mut ToolDeclarations {
        &mut self.spec.declarations
    }

    /// Declares a business key computed from the arguments (builder style).
    pub fn with_business_key(
        mut self,
        key: impl Fn(&Value) -> Option<String> + Send + Sync + 'static,
    ) -> FnTool {
        self.spec.declarations.business_key = Some(BusinessKey::new(key));
        self
    }

    /// Renames the tool.
    pub fn named(mut self, name: impl Into<String>) -> FnTool {
        self.spec.name = name.into();
        self
    }
}

impl Tool for FnTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(
        &self,
        ctx: ToolContext,
        arguments: Value,
    ) -> BoxFuture<'_, Result<ToolOutput, ToolError>> {
        (self.function)(ctx, arguments)
    }
}

/// Turns what a tool function returns into a [`ToolOutput`].
pub trait IntoToolOutput {
    /// The conversion.
    fn into_tool_output(self) -> ToolOutput;
}

impl IntoToolOutput for ToolOutput {
    fn into_tool_output(self) -> ToolOutput {
        self
    }
}

impl IntoToolOutput for String {
    fn into_tool_output(self) -> ToolOutput {
        ToolOutput::text(self)
    }
}

impl IntoToolOutput for &str {
    fn into_tool_output(self) -> ToolOutput {
        ToolOutput::text(self)
    }
}

impl IntoToolOutput for () {
    fn into_tool_output(self) -> ToolOutput {
        ToolOutput::default()
    }
}

/// A serializable value returned as a structured result (JSON block and `data`).
#[derive(Debug, Clone, PartialEq)]
pub struct Json<T>(pub T);

impl<T: Serialize> IntoToolOutput for Json<T> {
    fn into_tool_output(self) -> ToolOutput {
        match serde_json::to_value(&self.0) {
            Ok(value) => ToolOutput::json(value),
            Err(error) => ToolOutput::error(format!(
                "the tool's result could not be serialized: {error}"
            )),
        }
    }
}

impl IntoToolOutput for Value {
    fn into_tool_output(self) -> ToolOutput {
        ToolOutput::json(self)
    }
}

/// A result with two views: `model`, what the model reads, and `full`, the complete payload
/// for interfaces (journaled, streamed, never sent to a model). A `#[tool]` function may return
/// it: `Views { model: "3 invoices, 1 240 EUR in total", full: invoices }`.
#[derive(Debug, Clone, PartialEq)]
pub struct Views<M, F> {
    /// The compact view given to the model.
    pub model: M,
    /// The full payload for interfaces.
    pub full: F,
}

impl<M: IntoToolOutput, F: Serialize> IntoToolOutput for Views<M, F> {
    fn into_tool_output(self) -> ToolOutput {
        match serde_json::to_value(&self.full) {
            Ok(full) => ToolOutput::views(self.model, full),
            Err(error) => ToolOutput::error(format!(
                "the tool's full result could not be serialized: {error}"
            )),
        }
    }
}

/// The JSON Schema of an argument type, cleaned for models: no `$schema`, no `title`.
pub fn schema_for<T: schemars::JsonSchema>() -> Value {
    let schema = schemars::SchemaGenerator::new(schemars::generate::SchemaSettings::draft2020_12())
        .into_root_schema_for::<T>();
    let mut value = schema.to_value();
    if let Value::Object(map) = &mut value {
        map.remove("$schema");
        map.remove("title");
        map.remove("description");
    }
    value
}

/// The description carried by an argument type's doc comment, if any.
pub fn schema_description<T: schemars::JsonSchema>() -> Option<String> {
    let schema = schemars::SchemaGenerator::default().into_root_schema_for::<T>();
    schema
        .get("description")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_serializes_in_journal_order() {
        let json = serde_json::to_string(&ToolOutput::text("87")).unwrap();
        assert_eq!(
            json,
            r#"{"blocks":[{"cache_breakpoint":false,"provider_meta":{},"type":"text","text":"87"}],"data":null,"is_error":false,"artifacts":[],"offloaded":null,"unverified":false}"#
        );
        // The reference journal records this output's size as 164 bytes.
        assert_eq!(json.len(), 164);
    }

    #[test]
    fn the_full_view_is_journaled_but_not_visible() {
        let output = Views {
            model: "2 lines",
            full: serde_json::json!({"lines": ["FULL-ONLY-1", "FULL-ONLY-2"]}),
        }
        .into_tool_output();
        assert_eq!(output.visible_text(), "2 lines");
        let json = serde_json::to_string(&output).unwrap();
        assert!(json.ends_with(r#""full":{"lines":["FULL-ONLY-1","FULL-ONLY-2"]}}"#));
        let back: ToolOutput = serde_json::from_str(&json).unwrap();
        assert_eq!(back, output);
        // Without a full view, the field is left out (the journal stays as the reference's).
        assert!(
            !serde_json::to_string(&ToolOutput::text("x"))
                .unwrap()
                .contains("full")
        );
        let same = ToolOutput::views(
            ToolOutput::json(serde_json::json!({"n": 2})),
            serde_json::json!([1, 2]),
        );
        assert_eq!(same.data, Some(serde_json::json!({"n": 2})));
        assert_eq!(same.full, Some(serde_json::json!([1, 2])));
    }

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    /// Some arguments.
    struct Args {
        /// An amount.
        amount: f64,
    }

    #[test]
    fn business_key_templates() {
        let key = BusinessKey::template("relance:{numero}/{n}{{x}}");
        let args = serde_json::json!({"numero": "D-1", "n": 3});
        assert_eq!(key.key(&args).as_deref(), Some("relance:D-1/3{x}"));
        assert_eq!(key.key(&serde_json::json!({"numero": "D-1"})), None);
        assert_eq!(key, BusinessKey::template("relance:{numero}/{n}{{x}}"));
        assert_eq!(
            format!("{key:?}"),
            r#"BusinessKey("relance:{numero}/{n}{{x}}")"#
        );
    }

    #[test]
    fn schemas_are_clean() {
        let schema = schema_for::<Args>();
        assert_eq!(schema["type"], "object");
        assert!(schema.get("title").is_none());
        assert_eq!(
            schema_description::<Args>().as_deref(),
            Some("Some arguments.")
        );
    }
}
